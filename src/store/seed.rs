//! What seeding a store partition from a snapshot did (the seeding itself:
//! `crate::snapshot`, through [`super::StoreOpenArgs::seed`]).

use std::time::Duration;

/// A store partition seeded from a snapshot before its restore
/// ([`RestoreStart::snapshot`](crate::RestoreStart::snapshot)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSeed {
    /// The snapshot's id.
    pub snapshot_id: String,
    /// Its changelog checkpoint: the restore replays past it.
    pub checkpoint: i64,
    /// When it was taken (ms since the epoch).
    pub created_at_ms: i64,
    /// Bytes downloaded.
    pub bytes: u64,
    /// Files downloaded.
    pub files: usize,
    /// How long the download took.
    pub download: Duration,
}

/// What seeding a store partition did.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seeded {
    pub(crate) seed: Option<SnapshotSeed>,
    /// Each snapshot passed over, with the reason.
    pub(crate) skipped: Vec<String>,
}
