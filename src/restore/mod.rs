//! Restoration: replaying changelog partitions into their stores.
//!
//! One restore thread owns one assign-only consumer and restores every
//! store partition handed to it at once (the broker fetches them in
//! parallel). Per store partition it:
//!
//! 1. reads the changelog's watermarks `[low, high)`;
//! 2. checks the local checkpoint `c` (`checkpoint.rs`): valid if
//!    `low - 1 <= c <= high - 1`, the changelog's topic id is the one the
//!    store recorded, and the state is younger than the changelog's
//!    `delete.retention.ms`; otherwise (changelog truncated, deleted and
//!    recreated, tombstones possibly gone) or if the local store was
//!    unreadable, it wipes the store and restores from `low`, logging why
//!    and counting `kstate_restore_full_total`;
//! 3. replays `[c + 1, high)` into RocksDB in large WAL-less batches, each
//!    with its checkpoint, then flushes before handing the store back.
//!
//! A restore is complete when the consumer's position reaches `high`, so
//! compaction gaps and transaction markers do not stall it.
//!
//! Standby tasks use the same thread and consumer: a standby job begins
//! like a restore (the same checkpoint checks) but never completes. It keeps
//! following its changelog partitions, writing each batch with its
//! checkpoint in one atomic RocksDB batch, until it is cancelled (promoted
//! to active: the restore that follows replays only its lag; or dropped).
//!
//! - `checkpoint.rs`: whether a local checkpoint is usable against the changelog;
//! - `live_tail.rs`: where a window or session store's restore from empty may start;
//! - `rate.rs`: the measured restore rate (saved for `estimate-restore`);
//! - `restorer.rs`: the handle the task manager holds (jobs, outcomes, standby checkpoints);
//! - `restore_loop.rs`: the restore thread (begin, write, finish, standby following);
//! - `batch.rs`: the sorted batch written to RocksDB.

pub(crate) mod batch;
pub(crate) mod checkpoint;
pub(crate) mod file_builder;
pub(crate) mod live_tail;
pub(crate) mod rate;
pub(crate) mod restore_loop;
pub(crate) mod restorer;

use std::time::Duration;

pub(crate) use checkpoint::{full_restore_reason, ChangelogState, LocalCheckpoint};
pub(crate) use rate::RestoreRate;
pub(crate) use restore_loop::{cached_high, CommittedOffsets};
pub(crate) use restorer::{RestoreJob, RestoreOutcome, Restorer, StandbyOffsets, FETCH_QUEUE_BACKOFF_MS};

/// A restore of one store partition is starting.
#[derive(Debug, Clone)]
pub struct RestoreStart {
    /// Store name.
    pub store: String,
    /// Partition.
    pub partition: i32,
    /// Changelog topic.
    pub changelog_topic: String,
    /// First changelog offset to replay.
    pub start_offset: i64,
    /// The changelog's end offset when the restore started (exclusive).
    pub end_offset: i64,
    /// Set when local state was discarded for a full restore, saying why.
    pub full_restore_reason: Option<String>,
    /// The snapshot the store was seeded from before this restore, if any
    /// (the restore then replays only the changelog past its checkpoint).
    pub snapshot: Option<crate::store::SnapshotSeed>,
    /// Snapshots that were passed over for this store partition, each with
    /// the reason (unusable for the changelog as it is now, a file missing
    /// or corrupt, the snapshot store unreachable).
    pub snapshots_skipped: Vec<String>,
}

/// A batch of records was written to a store during restore.
#[derive(Debug, Clone)]
pub struct RestoreBatch {
    /// Store name.
    pub store: String,
    /// Partition.
    pub partition: i32,
    /// Offset of the last record in the batch.
    pub batch_end_offset: i64,
    /// Records in the batch.
    pub records: u64,
}

/// A restore of one store partition finished.
#[derive(Debug, Clone)]
pub struct RestoreEnd {
    /// Store name.
    pub store: String,
    /// Partition.
    pub partition: i32,
    /// Records replayed.
    pub records: u64,
    /// Key + value bytes replayed.
    pub bytes: u64,
    /// Wall time from start to end.
    pub duration: Duration,
    /// Batches written as table files and ingested into RocksDB (a large
    /// restore's fast path; the others went through its memtable).
    pub table_files: u64,
}

/// Observes restores, like Kafka Streams' `StateRestoreListener`.
///
/// Callbacks run on the restore thread: keep them short.
pub trait RestoreListener: Send + Sync + 'static {
    /// A store partition starts restoring.
    fn on_restore_start(&self, _event: &RestoreStart) {}
    /// A batch was written.
    fn on_batch_restored(&self, _event: &RestoreBatch) {}
    /// A store partition finished restoring (also called with zero records
    /// when nothing had to be replayed).
    fn on_restore_end(&self, _event: &RestoreEnd) {}
}

/// A listener that does nothing.
pub(crate) struct NoopListener;
impl RestoreListener for NoopListener {}
