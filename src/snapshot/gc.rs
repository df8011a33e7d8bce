//! Retention: the newest manifests of a store partition are kept, older
//! ones deleted, then every file that no kept manifest and no upload in
//! progress names (architecture.md §10, "garbage collection").
//!
//! Why it never deletes a file an upload in progress relies on, with one
//! collector at a time. Collection (1) deletes old manifests, (2) lists the
//! files, (3) reads the pending markers, (4) reads the manifests, and
//! deletes the files of (2) that (3) and (4) do not name. An upload (a)
//! writes its marker, naming every object it may reference, (b) re-reads
//! the manifests and reuses only files one names, (c) uploads the others,
//! (d) checks that the reused ones still exist, (e) writes its manifest,
//! (f) deletes its marker.
//! - A file the upload adds: if (2) lists it, it was written after (a), so
//!   at (3) the marker is there, or already gone at (f) after (e) wrote the
//!   manifest that (4) then reads.
//! - A file the upload reuses: if (a) came before (3), the marker names it.
//!   If after, (b) came after (1), so the manifest (b) found was not
//!   deleted by this collection and (4) reads it.
//!
//! Two collectors at once (the application's after a snapshot and `kstate
//! snapshots gc`, or two owners of a partition for a moment) can, in a
//! narrow window, delete a reused file between one's (1) and the other's
//! (4); step (d) then uploads it again, and a file that goes missing later
//! is caught when a store is seeded (size and CRC-32 of every file), which
//! falls back to the previous snapshot.

use std::collections::HashSet;

use object_store::path::Path;
use serde::Serialize;

use super::manifest::{Pending, RemoteSnapshot};
use super::remote::{Remote, RemoteResult};
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
/// manifests (and those `protected` names, and every savepoint's, which
/// do not count), deletes older manifests, stale pending markers and
/// unreferenced files.
pub(crate) async fn collect(
    remote: &Remote,
    dir: &Path,
    retain: usize,
    protected: &HashSet<String>,
    now_ms: i64,
) -> RemoteResult<GcReport> {
    let mut report = GcReport::default();
    let mut all = manifests(remote, dir).await?;
    all.retain(|(_, parsed)| parsed.as_ref().map_or(true, |m| m.savepoint.is_none()));
    let keep_from = all.len().saturating_sub(retain.max(1));
    for (i, (path, parsed)) in all.iter().enumerate() {
        let id = parsed.as_ref().map(|m| m.id.clone()).unwrap_or_default();
        if i < keep_from && !protected.contains(&id) {
            remote.delete(path).await?;
            report.manifests_deleted += 1;
        }
    }
    // Then the files there are now, then what still references them (the
    // order matters, see the module docs): a file uploaded after this list
    // is not a candidate, and a file listed here was uploaded after its
    // upload's marker was written, so the marker or the manifest that
    // replaced it is read below.
    let prefix = format!("{dir}/");
    let candidates = remote.list(&dir.clone().join("files")).await?;
    let mut referenced: HashSet<String> = HashSet::new();
    for meta in remote.list(&dir.clone().join("pending")).await? {
        let pending = match remote.get_bytes(&meta.location).await {
            Ok(bytes) => serde_json::from_slice::<Pending>(&bytes).ok(),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        match pending {
            Some(p) if now_ms - p.written_at_ms < PENDING_STALE.as_millis() as i64 => referenced.extend(p.objects),
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
    for meta in candidates {
        let relative = meta.location.as_ref().strip_prefix(&prefix).unwrap_or(meta.location.as_ref()).to_string();
        if !referenced.contains(&relative) {
            remote.delete(&meta.location).await?;
            report.files_deleted += 1;
            report.bytes_deleted += meta.size;
        }
    }
    Ok(report)
}
