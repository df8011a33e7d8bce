//! `wipe`: deletes one task's local state.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::{app_dir, dir_bytes, partitions_of, stores_of, AdminError, Result};
use crate::store::lock::DirLock;

/// One store partition directory deleted.
#[derive(Debug, Clone, Serialize)]
pub struct WipedStore {
    /// The store.
    pub store: String,
    /// The directory deleted.
    pub path: PathBuf,
    /// Bytes of its files.
    pub bytes: u64,
}

/// The outcome of [`wipe()`].
#[derive(Debug, Clone, Serialize)]
pub struct WipeReport {
    /// The application.
    pub application_id: String,
    /// The task's partition.
    pub partition: i32,
    /// What was deleted.
    pub deleted: Vec<WipedStore>,
    /// Bytes deleted in all.
    pub total_bytes: u64,
}

/// Deletes the local state of task `partition` of `app`: every store's
/// partition directory, or only `store`'s. Takes every lock first (without
/// waiting) and deletes nothing if a live instance holds any of them;
/// holds them while deleting. The next owner of the task restores it from
/// its changelogs.
pub fn wipe(state_dir: &Path, app: &str, partition: i32, store: Option<&str>) -> Result<WipeReport> {
    let app_dir = app_dir(state_dir, app)?;
    let stores: Vec<String> = match store {
        Some(s) => vec![super::store_partition_dir(state_dir, app, s, partition).map(|_| s.to_string())?],
        None => {
            let found: Vec<String> =
                stores_of(&app_dir).into_iter().filter(|s| partitions_of(&app_dir.join(s)).contains(&partition)).collect();
            if found.is_empty() {
                return Err(AdminError::StateNotFound {
                    what: format!("local state of partition {partition} of application `{app}`"),
                    path: app_dir.join("*").join(partition.to_string()),
                    available: stores_of(&app_dir)
                        .iter()
                        .flat_map(|s| partitions_of(&app_dir.join(s)).into_iter().map(move |p| format!("{s}/{p}")))
                        .collect(),
                });
            }
            found
        }
    };
    let dirs: Vec<(String, PathBuf)> = stores.into_iter().map(|s| {
        let dir = app_dir.join(&s).join(partition.to_string());
        (s, dir)
    }).collect();
    let mut locks = Vec::new();
    for (_, dir) in &dirs {
        locks.push(DirLock::acquire(dir, Duration::ZERO)?);
    }
    let mut deleted = Vec::new();
    for (store, dir) in dirs {
        let bytes = dir_bytes(&dir);
        std::fs::remove_dir_all(&dir).map_err(|e| AdminError::io(&dir, e))?;
        deleted.push(WipedStore { store, path: dir, bytes });
    }
    drop(locks);
    Ok(WipeReport {
        application_id: app.to_string(),
        partition,
        total_bytes: deleted.iter().map(|d| d.bytes).sum(),
        deleted,
    })
}
