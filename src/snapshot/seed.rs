//! Seeding a store partition that has no local state from the newest usable
//! snapshot: its files downloaded in parallel and verified, then opened as
//! the store's database; the restore replays only the changelog past the
//! snapshot's checkpoint (architecture.md §10).

use std::path::Path as FsPath;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};

use super::gc::manifests;
use super::manifest::{RemoteSnapshot, FORMAT_VERSION};
use super::remote::{RemoteError, RemoteResult, Sum};
use super::upload::Uploaded;
use super::Snapshots;
use crate::restore::checkpoint::ChangelogState;
use crate::store::{Seeded, SnapshotSeed};

impl Snapshots {
    /// Seeds `db_dir` (absent, or holding state the changelog cannot
    /// continue, replaced only once a snapshot is in) from the newest snapshot of the
    /// store partition that the changelog as it is now can continue. Every
    /// snapshot passed over is named with the reason in the result; none
    /// usable leaves `db_dir` as it was (a full replay follows).
    pub(crate) async fn seed(
        &self,
        (store, partition, in_memory): (&str, i32, bool),
        db_dir: &FsPath,
        changelog: &ChangelogState,
        schema_version: u32,
    ) -> Seeded {
        let mut seeded = Seeded::default();
        let dir = self.dir_of(store, partition);
        let all = match manifests(&self.remote, &dir).await {
            Ok(all) => all,
            Err(e) => {
                seeded.skipped.push(format!(
                    "snapshots of {store}/{partition} could not be listed: {e}"
                ));
                return seeded;
            }
        };
        let mut usable: Vec<RemoteSnapshot> = Vec::new();
        let now = crate::store::engine::now_ms();
        for (path, m) in all {
            let m = match m {
                Ok(m) => m,
                Err(why) => {
                    seeded
                        .skipped
                        .push(format!("{path}: unreadable manifest: {why}"));
                    continue;
                }
            };
            let why = if m.format_version > FORMAT_VERSION {
                Some(format!(
                    "format version {} is newer than this kstate's {FORMAT_VERSION}",
                    m.format_version
                ))
            } else if m.schema_version != schema_version {
                Some(format!(
                    "its schema version is {}, this code's {schema_version} (the restore rebuilds the store from the changelog)",
                    m.schema_version
                ))
            } else if m.files.iter().any(|f| f.name == crate::store::engine::HEAP_FILE) != in_memory {
                Some(format!(
                    "it is of {}, this store is {}",
                    if in_memory { "a RocksDB store" } else { "an in-memory store" },
                    if in_memory { "in memory" } else { "on RocksDB" }
                ))
            } else if m.application_id != self.app || m.store != store || m.partition != partition {
                Some(format!(
                    "it belongs to {}/{}/{}",
                    m.application_id, m.store, m.partition
                ))
            } else {
                m.unusable_for(changelog, now)
            };
            match why {
                Some(why) => seeded.skipped.push(format!(
                    "snapshot {} (checkpoint {}): {why}",
                    m.id, m.checkpoint
                )),
                None => usable.push(m),
            }
        }
        // The newest state first.
        usable.sort_by_key(|m| std::cmp::Reverse((m.checkpoint, m.created_at_ms)));
        for m in usable {
            let started = Instant::now();
            match self.download_into(&m, db_dir).await {
                Ok(identity) => {
                    let uploaded = Uploaded {
                        identity,
                        uid: super::manifest::new_id(),
                        files: m
                            .files
                            .iter()
                            .filter(|f| f.name.ends_with(".sst"))
                            .map(|f| (f.name.clone(), f.clone()))
                            .collect(),
                    };
                    self.remember_uploaded(store, partition, uploaded, db_dir.parent().unwrap_or(db_dir));
                    seeded.seed = Some(SnapshotSeed {
                        snapshot_id: m.id.clone(),
                        checkpoint: m.checkpoint,
                        created_at_ms: m.created_at_ms,
                        bytes: m.bytes(),
                        files: m.files.len(),
                        download: started.elapsed(),
                    });
                    return seeded;
                }
                Err(e) => seeded.skipped.push(format!(
                    "snapshot {} (checkpoint {}): {e}",
                    m.id, m.checkpoint
                )),
            }
        }
        seeded
    }

    /// Downloads a snapshot's files into a fresh directory beside `db_dir`,
    /// verifies them, gives the database an id of its own, and moves
    /// it into place. Returns that identity.
    pub(crate) async fn download_into(&self, m: &RemoteSnapshot, db_dir: &FsPath) -> RemoteResult<String> {
        let tmp = db_dir.with_extension("seeding");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| RemoteError::io(&tmp, e))?;
        let dir = self.dir_of(&m.store, m.partition);
        let result: RemoteResult<String> = async {
            futures::stream::iter(m.files.iter().map(|f| {
                let from = super::remote::object_at(&dir, &f.object);
                let to = tmp.join(&f.name);
                async move {
                    self.remote
                        .download(
                            &from,
                            &to,
                            Sum {
                                size: f.size,
                                crc32: f.crc32,
                            },
                            &self.limiter,
                        )
                        .await
                }
            }))
            .buffer_unordered(self.config.parallel_transfers.max(1))
            .try_collect::<Vec<()>>()
            .await?;
            // A database of its own: files it writes later must not take
            // names the snapshot's origin uses (upload.rs names files by
            // the uploading database).
            let identity = super::manifest::new_id();
            let id_path = tmp.join(super::upload::DATABASE_ID_FILE);
            std::fs::write(&id_path, &identity).map_err(|e| RemoteError::io(&id_path, e))?;
            // The files and their names on disk before the database is used.
            std::fs::File::open(&tmp).and_then(|d| d.sync_all()).map_err(|e| RemoteError::io(&tmp, e))?;
            if db_dir.exists() {
                // Local state the changelog cannot continue (seed_dir decided).
                std::fs::remove_dir_all(db_dir).map_err(|e| RemoteError::io(db_dir, e))?;
            }
            std::fs::rename(&tmp, db_dir).map_err(|e| RemoteError::io(db_dir, e))?;
            if let Some(parent) = db_dir.parent() {
                std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|e| RemoteError::io(parent, e))?;
            }
            Ok(identity)
        }
        .await;
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }
}
