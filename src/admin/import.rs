//! `import-snapshot`: puts a snapshot ([`super::snapshot()`]) in place as
//! a store partition's local state.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::{dir_bytes, valid_name, AdminError, ReadOnly, Result, SnapshotManifest, SNAPSHOT_MANIFEST};
use crate::store::lock::DirLock;

/// The outcome of [`import_snapshot()`].
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    /// The store partition directory written.
    pub path: PathBuf,
    /// The snapshot's description.
    pub manifest: SnapshotManifest,
    /// Whether local data was replaced (`force`).
    pub replaced_existing: bool,
    /// Files hard-linked from the snapshot.
    pub linked_files: u64,
    /// Files copied.
    pub copied_files: u64,
    /// Bytes of the imported database.
    pub bytes: u64,
}

/// Imports the snapshot in `snapshot_dir` as the local state of its store
/// partition (same application, store and partition) under `state_dir`.
/// Refuses while a live instance holds the store
/// partition, and over local data unless `force`. The database is copied
/// (SST files hard-linked where possible) to `db.importing`, checked to
/// open with the snapshot's checkpoint, then renamed into place, and the
/// checkpoint hint is written. On its next start kstate replays the
/// changelog past the checkpoint only, after its usual checks (offsets,
/// topic id, tombstone age); a snapshot that fails them is wiped and the
/// store restored in full.
pub fn import_snapshot(state_dir: &Path, snapshot_dir: &Path, force: bool) -> Result<ImportReport> {
    if !state_dir.is_dir() {
        return Err(AdminError::StateDirMissing(state_dir.to_path_buf()));
    }
    let manifest_path = snapshot_dir.join(SNAPSHOT_MANIFEST);
    let mismatch = |detail: String| AdminError::SnapshotMismatch { path: snapshot_dir.to_path_buf(), detail };
    let text = std::fs::read(&manifest_path).map_err(|e| mismatch(format!("cannot read {SNAPSHOT_MANIFEST}: {e}")))?;
    let manifest: SnapshotManifest =
        serde_json::from_slice(&text).map_err(|e| mismatch(format!("{SNAPSHOT_MANIFEST} is not a kstate snapshot description: {e}")))?;
    if !valid_name(&manifest.application_id) || !valid_name(&manifest.store) || manifest.partition < 0 {
        return Err(mismatch(format!("{SNAPSHOT_MANIFEST} names no valid application, store and partition")));
    }
    let source_db = snapshot_dir.join("db");
    if !source_db.join("CURRENT").is_file() && !source_db.join(crate::store::engine::HEAP_FILE).is_file() {
        return Err(mismatch("has no RocksDB database and no in-memory store file in db/".into()));
    }
    let dir = state_dir.join(&manifest.application_id).join(&manifest.store).join(manifest.partition.to_string());
    let _lock = DirLock::acquire(&dir, Duration::ZERO)?;
    let db = dir.join("db");
    let replaced_existing = db.exists();
    if replaced_existing && !force {
        let has_data = match ReadOnly::open(&dir) {
            Ok(ro) => !matches!(ro.db.checkpoint(), Ok(crate::store::engine::Checkpoint::None)) || ro.db.iter().next().is_some(),
            Err(_) => true,
        };
        if has_data {
            return Err(AdminError::TargetNotEmpty {
                path: db,
                detail: "holds local state; import with force to replace it".into(),
            });
        }
    }

    let importing = dir.join("db.importing");
    crate::store::engine::Engine::wipe(&importing)?;
    let (linked, copied) = copy_db(&source_db, &importing)?;
    // On disk before it takes the store's place: a crash after the rename
    // must not leave a database with files still in the page cache only.
    sync_files(&importing)?;
    // The copy must be the snapshot: same checkpoint (and topic id).
    let check = (|| {
        let ro = ReadOnly::open_db(&importing)?;
        let checkpoint = ro.checkpoint(&importing)?;
        if checkpoint != manifest.checkpoint {
            return Err(mismatch(format!(
                "its database's checkpoint is {checkpoint:?}, its description says {:?}",
                manifest.checkpoint
            )));
        }
        let id = ro.db.changelog_topic_id()?;
        if let (Some(expected), Some(found)) = (&manifest.changelog_topic_id, &id) {
            if expected != found {
                return Err(mismatch(format!("its database's changelog topic id is {found}, its description says {expected}")));
            }
        }
        Ok(())
    })();
    if let Err(e) = check {
        let _ = std::fs::remove_dir_all(&importing);
        return Err(e);
    }
    crate::store::engine::remove_checkpoint_hint(&dir)?;
    // The record of what the replaced database uploaded to the snapshot
    // store is not this database's.
    let _ = std::fs::remove_file(dir.join(crate::snapshot::upload::UPLOADED_FILE));
    crate::store::engine::Engine::wipe(&db)?;
    std::fs::rename(&importing, &db).map_err(|e| AdminError::io(&importing, e))?;
    sync_path(&dir)?;
    if let Some(c) = manifest.checkpoint {
        crate::store::engine::write_checkpoint_hint(&dir, c).map_err(|e| AdminError::io(dir.join(crate::store::engine::CHECKPOINT_HINT), e))?;
    }
    Ok(ImportReport { bytes: dir_bytes(&db), path: dir, manifest, replaced_existing, linked_files: linked, copied_files: copied })
}

/// Flushes every file in `dir`, then `dir` itself, to disk.
fn sync_files(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| AdminError::io(dir, e))? {
        let path = entry.map_err(|e| AdminError::io(dir, e))?.path();
        if path.is_file() {
            sync_path(&path)?;
        }
    }
    sync_path(dir)
}

/// `fsync` of one file or directory.
fn sync_path(path: &Path) -> Result<()> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).map_err(|e| AdminError::io(path, e))
}

/// Copies a RocksDB directory: table and blob files (never modified once
/// written) as hard links where the file system allows, the rest
/// (MANIFEST, CURRENT, OPTIONS, logs) as copies.
fn copy_db(from: &Path, to: &Path) -> Result<(u64, u64)> {
    std::fs::create_dir_all(to).map_err(|e| AdminError::io(to, e))?;
    let (mut linked, mut copied) = (0, 0);
    for entry in std::fs::read_dir(from).map_err(|e| AdminError::io(from, e))? {
        let entry = entry.map_err(|e| AdminError::io(from, e))?;
        let src = entry.path();
        if !entry.file_type().map_err(|e| AdminError::io(&src, e))?.is_file() {
            continue;
        }
        let dst = to.join(entry.file_name());
        let immutable = src.extension().is_some_and(|x| x == "sst" || x == "blob");
        if immutable && std::fs::hard_link(&src, &dst).is_ok() {
            linked += 1;
            continue;
        }
        std::fs::copy(&src, &dst).map_err(|e| AdminError::io(&src, e))?;
        copied += 1;
    }
    Ok((linked, copied))
}
