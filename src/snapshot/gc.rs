//! Retention: the newest manifests of a store partition are kept, older
//! ones deleted, then every file that no kept manifest and no upload in
//! progress names (architecture.md §10, "garbage collection").
//!
//! Why it never deletes a file an upload in progress relies on: an upload
//! first writes its pending marker (naming every object it may reference),
//! then re-reads the manifests it reuses files from, and reuses only files a
//! manifest still names. Collection deletes old manifests first and only
//! then reads the remaining manifests and the pending markers. If the
//! upload's marker was written before that read, its files are kept; if
//! after, the manifests were already gone when the upload re-read them, so
//! it uploads those files again instead of reusing them.

use std::collections::HashSet;

use object_store::path::Path;
use serde::Serialize;

use super::manifest::{Pending, RemoteSnapshot};
use super::remote::{Remote, RemoteError, RemoteResult};
use super::PENDING_STALE;

/// What one collection of a store partition did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct GcReport {
    /// Manifests kept.
    pub manifests_kept: usize,
    /// Manifests deleted (older than the newest `retain`).
    pub manifests_deleted: usize,
    /// Files deleted (named by no kept manifest and no upload in progress).
    pub files_deleted: usize,
    /// Bytes of the files deleted.
    pub bytes_deleted: u64,
    /// Stale pending markers deleted (an upload that died).
    pub pending_deleted: usize,
}

/// Every manifest of a store partition, oldest first, with its object path;
/// `Err` for one that cannot be read or parsed.
pub(crate) async fn manifests(
    remote: &Remote,
    dir: &Path,
) -> RemoteResult<Vec<(Path, Result<RemoteSnapshot, String>)>> {
    let mut listed = remote.list(&dir.clone().join("manifests")).await?;
    listed.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    let mut out = Vec::with_capacity(listed.len());
    for meta in listed {
        let parsed = match remote.get_bytes(&meta.location).await {
            Ok(bytes) => serde_json::from_slice::<RemoteSnapshot>(&bytes)
                .map_err(|e| format!("{}: {e}", meta.location)),
            // Deleted since listed (another collection): not there.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        out.push((meta.location, parsed));
    }
    Ok(out)
}

/// Collects one store partition's folder: keeps the newest `retain`
/// manifests (and those `protected` names, e.g. savepoints), deletes older
/// manifests, stale pending markers and unreferenced files.
pub(crate) async fn collect(
    remote: &Remote,
    dir: &Path,
    retain: usize,
    protected: &HashSet<String>,
    now_ms: i64,
) -> RemoteResult<GcReport> {
    let mut report = GcReport::default();
    let all = manifests(remote, dir).await?;
    let keep_from = all.len().saturating_sub(retain.max(1));
    for (i, (path, parsed)) in all.iter().enumerate() {
        let id = parsed.as_ref().map(|m| m.id.clone()).unwrap_or_default();
        if i < keep_from && !protected.contains(&id) {
            remote.delete(path).await?;
            report.manifests_deleted += 1;
        }
    }
    // Only now what is still referenced (see the module docs for the order).
    let mut referenced: HashSet<String> = HashSet::new();
    for (path, parsed) in manifests(remote, dir).await? {
        match parsed {
            Ok(m) => referenced.extend(m.files.into_iter().map(|f| f.object)),
            Err(why) => {
                // Its files are unknown: delete no file at all.
                tracing::warn!(manifest = %path, reason = %why, "snapshot manifest unreadable; no snapshot files are deleted");
                return Ok(report);
            }
        }
        report.manifests_kept += 1;
    }
    for meta in remote.list(&dir.clone().join("pending")).await? {
        let pending = match remote.get_bytes(&meta.location).await {
            Ok(bytes) => serde_json::from_slice::<Pending>(&bytes).ok(),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        match pending {
            Some(p) if now_ms - p.written_at_ms < PENDING_STALE.as_millis() as i64 => {
                referenced.extend(p.objects)
            }
            Some(_) => {
                remote.delete(&meta.location).await?;
                report.pending_deleted += 1;
            }
            None => {
                // A marker being written or damaged: keep everything young.
                let age = now_ms - meta.last_modified.timestamp_millis();
                if age < PENDING_STALE.as_millis() as i64 {
                    return Ok(report);
                }
                remote.delete(&meta.location).await?;
                report.pending_deleted += 1;
            }
        }
    }
    let prefix = format!("{dir}/");
    for meta in remote.list(&dir.clone().join("files")).await? {
        let relative = meta
            .location
            .as_ref()
            .strip_prefix(&prefix)
            .unwrap_or(meta.location.as_ref())
            .to_string();
        if !referenced.contains(&relative) {
            match remote.delete(&meta.location).await {
                Ok(()) => {
                    report.files_deleted += 1;
                    report.bytes_deleted += meta.size;
                }
                Err(RemoteError::Store(e)) => return Err(RemoteError::Store(e)),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(report)
}
