//! What a snapshot is, as stored: the manifest that makes it complete, and
//! the marker of an upload in progress (architecture.md §10).

use serde::{Deserialize, Serialize};

/// The manifest format this code writes and reads; a manifest of a newer
/// format is skipped (logged), never half-understood.
pub const FORMAT_VERSION: u32 = 1;

/// One complete snapshot of one store partition: a RocksDB checkpoint at a
/// committed changelog offset. It exists only once every file it names was
/// uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSnapshot {
    /// `FORMAT_VERSION` of the writer.
    pub format_version: u32,
    /// The snapshot's id (unique; also in the manifest's object name).
    pub id: String,
    /// The application.
    pub application_id: String,
    /// The store.
    pub store: String,
    /// The store (and changelog) partition.
    pub partition: i32,
    /// The changelog topic.
    pub changelog_topic: String,
    /// The changelog's topic id when the state was written, if recorded:
    /// a snapshot of a recreated changelog's state is never used.
    pub changelog_topic_id: Option<String>,
    /// The offset of the last changelog record the snapshot reflects.
    pub checkpoint: i64,
    /// No changelog record past `checkpoint` was appended before this (ms
    /// since the epoch), if recorded: the tombstone-retention check.
    pub appended_after_ms: Option<i64>,
    /// The store's kind and layout (`key_value`, `window`, `session`, with
    /// TTL and segment settings), as the store definition said.
    pub definition: String,
    /// The store's schema version (1 until schema versions exist).
    pub schema_version: u32,
    /// When the checkpoint was taken (ms since the epoch).
    pub created_at_ms: i64,
    /// The kstate version that took it.
    pub kstate_version: String,
    /// The database's files.
    pub files: Vec<RemoteSnapshotFile>,
    /// The savepoint this snapshot belongs to, if any: retention never
    /// deletes it (`kstate savepoint delete` does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub savepoint: Option<String>,
}

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSnapshotFile {
    /// Its name in the database directory (`000123.sst`, `MANIFEST-000005`, ...).
    pub name: String,
    /// Its object, relative to the store partition's folder (`files/...`).
    pub object: String,
    /// Bytes.
    pub size: u64,
    /// CRC-32 (IEEE) of its bytes.
    pub crc32: u32,
}

impl RemoteSnapshot {
    /// Bytes of all its files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Why the changelog as it is now cannot continue this snapshot (the
    /// checks a restore makes of local state), if it cannot: seeding and
    /// `estimate-restore` pass such a snapshot over.
    pub(crate) fn unusable_for(&self, changelog: &crate::restore::ChangelogState, now_ms: i64) -> Option<String> {
        let local = crate::restore::LocalCheckpoint {
            checkpoint: Some(self.checkpoint),
            topic_id: self.changelog_topic_id.clone(),
            appended_after_ms: self.appended_after_ms,
        };
        crate::restore::full_restore_reason(&local, changelog, now_ms).map(|(why, _)| why)
    }

    /// The manifest's object name in `manifests/`: sorts by creation time.
    pub(crate) fn object_name(&self) -> String {
        format!("{:013}-{}.json", self.created_at_ms.max(0), self.id)
    }
}

/// An upload in progress: every object its manifest may name. Garbage
/// collection keeps them while the marker is younger than
/// [`super::PENDING_STALE`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Pending {
    /// When the marker was (last) written, ms since the epoch.
    pub(crate) written_at_ms: i64,
    /// Objects, relative to the store partition's folder.
    pub(crate) objects: Vec<String>,
}

/// A fresh id: hex of the time and of a hash seeded by the process's
/// random state (unique enough for object names; no `rand` dependency).
pub(crate) fn new_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_differ_and_names_sort_by_time() {
        let a = new_id();
        let b = new_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        let m = |t: i64| RemoteSnapshot {
            format_version: FORMAT_VERSION,
            id: "x".into(),
            application_id: "a".into(),
            store: "s".into(),
            partition: 0,
            changelog_topic: "t".into(),
            changelog_topic_id: None,
            checkpoint: 0,
            appended_after_ms: None,
            definition: "key_value".into(),
            schema_version: 1,
            created_at_ms: t,
            kstate_version: "0".into(),
            files: vec![],
            savepoint: None,
        };
        assert!(m(999).object_name() < m(1000).object_name());
        assert!(m(1_700_000_000_000).object_name() < m(10_000_000_000_000 - 1).object_name());
    }
}
