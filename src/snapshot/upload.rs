//! Taking one snapshot of one store partition: a RocksDB checkpoint (hard
//! links) at its committed state, the SST files the snapshot store does not
//! have yet uploaded in parallel, then the manifest (architecture.md §10).

use std::collections::{HashMap, HashSet};
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;

use super::gc::manifests;
use super::manifest::{new_id, Pending, RemoteSnapshot, RemoteSnapshotFile, FORMAT_VERSION};
use super::remote::{RemoteError, RemoteResult, Sum};
use super::{Snapshots, PENDING_STALE};
use crate::store::engine::Checkpoint;
use crate::store::engine::{now_ms, ReadOnlyDb};

/// A file in a database's directory naming that database for snapshots: a
/// fresh id for each database kstate creates or seeds, gone with the
/// directory when a store is wiped. (RocksDB's own `IDENTITY` does not do:
/// it comes back from the MANIFEST, so a copy seeded from a snapshot would
/// share its origin's.)
pub(crate) const DATABASE_ID_FILE: &str = "kstate-snapshot-id";

/// The database's id (see [`DATABASE_ID_FILE`]), made if it has none;
/// empty if it cannot be written (nothing is then reused).
pub(crate) fn database_id(db_dir: &FsPath) -> String {
    let path = db_dir.join(DATABASE_ID_FILE);
    if let Ok(id) = std::fs::read_to_string(&path) {
        if !id.trim().is_empty() {
            return id.trim().to_string();
        }
    }
    let id = super::manifest::new_id();
    match crate::store::state_dir::write_atomically(&path, id.as_bytes()) {
        Ok(()) => id,
        Err(_) => String::new(),
    }
}

/// The file beside a store partition's database that keeps its
/// [`Uploaded`] across restarts (`<store>/<partition>/kstate.snapshot-files`).
pub(crate) const UPLOADED_FILE: &str = "kstate.snapshot-files";

/// The SST files of one local database already in the snapshot store, so
/// the next snapshot uploads only new ones, also after a restart. Valid
/// for the database with its id (a wiped or seeded store is a new database).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Uploaded {
    /// The database's id ([`DATABASE_ID_FILE`]).
    pub(crate) identity: String,
    /// The name prefix of files this process uploads for it.
    pub(crate) uid: String,
    /// SST files by local name.
    pub(crate) files: HashMap<String, RemoteSnapshotFile>,
}

impl Uploaded {
    /// The record kept beside a database, if it is for the database with
    /// `identity`.
    pub(crate) fn load(partition_dir: &FsPath, identity: &str) -> Option<Uploaded> {
        let bytes = std::fs::read(partition_dir.join(UPLOADED_FILE)).ok()?;
        let u: Uploaded = serde_json::from_slice(&bytes).ok()?;
        (!identity.is_empty() && u.identity == identity).then_some(u)
    }

    /// Keeps the record beside the database (best effort: a directory being
    /// removed is no error, the next snapshot uploads a little more).
    pub(crate) fn save(&self, partition_dir: &FsPath) {
        if !partition_dir.is_dir() {
            return;
        }
        if let Ok(json) = serde_json::to_vec(self) {
            if let Err(e) = crate::store::state_dir::write_atomically(&partition_dir.join(UPLOADED_FILE), &json) {
                tracing::debug!(dir = %partition_dir.display(), error = %e, "could not keep the record of uploaded snapshot files");
            }
        }
    }
}

/// What one snapshot took.
#[derive(Debug, Clone)]
pub(crate) struct Taken {
    pub(crate) manifest: RemoteSnapshot,
    /// Bytes uploaded (the delta).
    pub(crate) uploaded_bytes: u64,
    pub(crate) uploaded_files: usize,
    pub(crate) took: Duration,
}

/// A local checkpoint directory, removed when dropped.
pub(crate) struct LocalCheckpoint(pub(crate) PathBuf);

impl Drop for LocalCheckpoint {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The files of a checkpoint directory (name, size), sorted.
pub(crate) fn files_of(dir: &FsPath) -> std::io::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_file() {
            if let Some(name) = e.file_name().to_str() {
                out.push((name.to_string(), e.metadata()?.len()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The committed state a checkpoint directory holds.
pub(crate) struct CheckpointMeta {
    pub(crate) checkpoint: i64,
    pub(crate) topic_id: Option<String>,
    pub(crate) appended_after_ms: Option<i64>,
}

/// Reads the checkpoint, topic id and age bound of a checkpoint directory
/// (`None`: nothing committed yet).
pub(crate) fn read_meta(dir: &FsPath) -> crate::error::Result<Option<CheckpointMeta>> {
    let db = ReadOnlyDb::open_read_only(dir)?;
    let checkpoint = match db.checkpoint()? {
        Checkpoint::At(c) => c,
        Checkpoint::None => return Ok(None),
        Checkpoint::Corrupt(why) => {
            return Err(crate::error::Error::Restore {
                topic: String::new(),
                partition: -1,
                detail: why,
            })
        }
    };
    Ok(Some(CheckpointMeta {
        checkpoint,
        topic_id: db.changelog_topic_id()?,
        appended_after_ms: db.appended_after_ms()?,
    }))
}

/// A store partition to snapshot.
pub(crate) struct Source<'a> {
    pub(crate) store: &'a str,
    pub(crate) partition: i32,
    pub(crate) definition: String,
    pub(crate) changelog_topic: String,
    /// The checkpoint directory just taken.
    pub(crate) dir: &'a FsPath,
    pub(crate) meta: CheckpointMeta,
    /// What this database uploaded before (identity matched by the caller).
    pub(crate) uploaded: Uploaded,
    /// The savepoint the snapshot is part of, if any.
    pub(crate) savepoint: Option<String>,
    /// The store's schema version (its commits record it too).
    pub(crate) schema_version: u32,
}

impl Snapshots {
    /// Uploads a checkpoint directory as a snapshot; returns it and the new
    /// record of uploaded files.
    pub(crate) async fn upload(&self, src: Source<'_>) -> RemoteResult<(Taken, Uploaded)> {
        let started = Instant::now();
        let dir = self
            .remote
            .partition_dir(&self.app, src.store, src.partition);
        let id = new_id();
        let created_at_ms = now_ms();
        let local = files_of(src.dir).map_err(|e| RemoteError::io(src.dir, e))?;
        let mut uploaded = src.uploaded;
        // Each file: reused (already uploaded, same size) or to upload.
        let mut plan: Vec<(String, u64, Option<RemoteSnapshotFile>)> = Vec::new();
        for (name, size) in &local {
            let reuse = uploaded
                .files
                .get(name)
                .filter(|f| f.size == *size)
                .cloned();
            plan.push((name.clone(), *size, reuse));
        }
        let object_for = |name: &str| -> String {
            if name.ends_with(".sst") {
                format!("files/{}-{name}", uploaded.uid)
            } else {
                format!("files/{id}-{name}")
            }
        };
        let pending_path = dir.clone().join("pending").join(format!("{id}.json"));
        let mut pending = Pending {
            written_at_ms: now_ms(),
            objects: plan
                .iter()
                .map(|(name, _, reuse)| {
                    reuse
                        .as_ref()
                        .map_or_else(|| object_for(name), |f| f.object.clone())
                })
                .collect(),
        };
        self.remote
            .put_bytes(
                &pending_path,
                serde_json::to_vec(&pending).map_err(|e| RemoteError::Format(e.to_string()))?,
            )
            .await?;
        // The marker protects the files for PENDING_STALE from its last
        // write: it is written again every sixth of that while the upload
        // runs, and no manifest is written unless it is fresh.
        let marker_written = std::sync::atomic::AtomicI64::new(pending.written_at_ms);
        let refresh = async {
            loop {
                tokio::time::sleep(PENDING_STALE / 6).await;
                pending.written_at_ms = now_ms();
                if let Ok(json) = serde_json::to_vec(&pending) {
                    if self.remote.put_bytes(&pending_path, json).await.is_ok() {
                        marker_written.store(pending.written_at_ms, std::sync::atomic::Ordering::Release);
                    }
                }
            }
        };
        let work = async {
            // Reuse only what a manifest still names (garbage collection's order, gc.rs).
            let mut named: HashSet<String> = HashSet::new();
            for (_, m) in manifests(&self.remote, &dir).await? {
                if let Ok(m) = m {
                    named.extend(m.files.into_iter().map(|f| f.object));
                }
            }
            let mut files = Vec::with_capacity(plan.len());
            let mut to_upload = Vec::new();
            for (name, size, reuse) in plan {
                match reuse.filter(|f| named.contains(&f.object)) {
                    Some(f) => files.push(f),
                    None => to_upload.push((name, size)),
                }
            }
            let uploaded_files = to_upload.len();
            let new: Vec<RemoteSnapshotFile> = futures::stream::iter(to_upload.into_iter().map(|(name, _)| {
                let object = object_for(&name);
                let local = src.dir.join(&name);
                let to = super::remote::object_at(&dir, &object);
                async move {
                    let Sum { size, crc32 } = self.remote.upload(&local, &to, &self.limiter).await?;
                    Ok::<_, RemoteError>(RemoteSnapshotFile { name, object, size, crc32 })
                }
            }))
            .buffer_unordered(self.config.parallel_transfers.max(1))
            .try_collect()
            .await?;
            let uploaded_bytes = new.iter().map(|f| f.size).sum();
            // Reused files still there (a second collector at the same time
            // may have deleted one, gc.rs): those are uploaded again, under
            // the same name (same database, same file number: same bytes).
            let mut gone = Vec::new();
            for f in &files {
                match self.remote.store.head(&super::remote::object_at(&dir, &f.object)).await {
                    Ok(_) => {}
                    Err(object_store::Error::NotFound { .. }) => gone.push(f.clone()),
                    Err(e) => return Err(e.into()),
                }
            }
            for f in gone {
                tracing::warn!(object = %f.object, "a snapshot file this upload reuses is gone; uploading it again");
                let sum = self.remote.upload(&src.dir.join(&f.name), &super::remote::object_at(&dir, &f.object), &self.limiter).await?;
                if sum != (Sum { size: f.size, crc32: f.crc32 }) {
                    return Err(RemoteError::Verify(format!("{}: the local file differs from the one uploaded before", f.name)));
                }
            }
            files.extend(new);
            files.sort_by(|a, b| a.name.cmp(&b.name));
            let marker_age = now_ms() - marker_written.load(std::sync::atomic::Ordering::Acquire);
            if marker_age > (PENDING_STALE / 2).as_millis() as i64 {
                return Err(RemoteError::Verify(format!(
                    "the pending marker was last written {marker_age} ms ago (the process was paused, or the snapshot store \
                     refused it): its files may have been collected meanwhile; no manifest written"
                )));
            }
            let manifest = RemoteSnapshot {
                format_version: FORMAT_VERSION,
                id: id.clone(),
                application_id: self.app.clone(),
                store: src.store.to_string(),
                partition: src.partition,
                changelog_topic: src.changelog_topic.clone(),
                changelog_topic_id: src.meta.topic_id.clone(),
                checkpoint: src.meta.checkpoint,
                appended_after_ms: src.meta.appended_after_ms,
                definition: src.definition.clone(),
                schema_version: src.schema_version,
                created_at_ms,
                kstate_version: env!("CARGO_PKG_VERSION").to_string(),
                files,
                savepoint: src.savepoint.clone(),
            };
            let path = dir.clone().join("manifests").join(manifest.object_name());
            self.remote
                .put_bytes(&path, serde_json::to_vec_pretty(&manifest).map_err(|e| RemoteError::Format(e.to_string()))?)
                .await?;
            Ok((manifest, uploaded_bytes, uploaded_files))
        };
        let result = tokio::select! {
            r = work => r,
            _ = refresh => unreachable!("the refresh loop never ends"),
        };
        // The manifest (if any) now protects its files.
        let _ = self.remote.delete(&pending_path).await;
        let (manifest, uploaded_bytes, uploaded_files) = result?;
        uploaded.files = manifest
            .files
            .iter()
            .filter(|f| f.name.ends_with(".sst"))
            .map(|f| (f.name.clone(), f.clone()))
            .collect();
        Ok((
            Taken {
                manifest,
                uploaded_bytes,
                uploaded_files,
                took: started.elapsed(),
            },
            uploaded,
        ))
    }

    /// The store partition's folder in the snapshot store.
    pub(crate) fn dir_of(&self, store: &str, partition: i32) -> Path {
        self.remote.partition_dir(&self.app, store, partition)
    }
}
