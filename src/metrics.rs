//! Metric names and handles, published through the [`metrics`] facade.
//!
//! kstate records; your application picks the exporter (Prometheus, StatsD,
//! ...) by installing a `metrics` recorder (`examples/prometheus.rs`, and a
//! Grafana dashboard over these names in `dashboards/`). Every store metric
//! carries the labels `store` and `partition`; a task is an input
//! partition, so per-task series carry `partition`, and skew across tasks
//! is the spread of a series over that label. RocksDB figures are refreshed
//! every 10 s.
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `kstate_store_logical_bytes` | gauge | key + value bytes of an active store partition, from RocksDB's table properties plus its memtables (an estimate from above: overwritten and deleted entries count until compaction drops them; 0 once the task closed here) |
//! | `kstate_store_physical_bytes` | gauge | SST files + memtables of an active store partition, or the memory of an in-memory one (0 once the task closed here) |
//! | `kstate_rocksdb_write_stalls_total` | counter | times RocksDB entered a write stall condition, delaying or stopping writes (`rocksdb.cf-write-stall-stats` total delays + stops) |
//! | `kstate_rocksdb_write_stall_micros_total` | counter | microseconds writes spent stalled (RocksDB ticker `rocksdb.stall.micros`; 0 unless `AppBuilder::rocksdb_statistics(true)`) |
//! | `kstate_rocksdb_block_cache_hits_total` | counter | block-cache hits of the store partition's reads; hit rate = hits / (hits + misses) (0 unless `AppBuilder::rocksdb_statistics(true)`) |
//! | `kstate_rocksdb_block_cache_misses_total` | counter | block-cache misses (0 unless `AppBuilder::rocksdb_statistics(true)`) |
//! | `kstate_state_dir_used_bytes` | gauge | bytes of every file under `state_dir/<application_id>` (no store labels) |
//! | `kstate_state_dir_free_bytes` | gauge | bytes available to this process on the file system holding the state dir (no store labels) |
//! | `kstate_records_processed_total` | counter | input records handed to the processor, label `partition` only (per task) |
//! | `kstate_input_lag_records` | gauge | records of an input partition past the next record to process (against librdkafka's last seen end offset), labels `topic`, `partition` (per task; reported while the task runs, 0 once it moved away) |
//! | `kstate_restore_remaining_bytes` | gauge | bytes left to restore, estimated: remaining records × average key + value size restored so far |
//! | `kstate_standby_lag_bytes` | gauge | bytes a standby is behind, estimated: lag in records × its average record size |
//! | `kstate_store_puts_total` | counter | puts |
//! | `kstate_store_deletes_total` | counter | deletes |
//! | `kstate_ttl_expired_total` | counter | expired entries the TTL sweep deleted (each a changelog tombstone) |
//! | `kstate_repartition_purges_total` | counter | `DeleteRecords` of a repartition topic partition (label `topic`) up to the offset the group committed |
//! | `kstate_input_partition_mismatches_total` | counter | keyed input records (label `topic`) in another partition than `AppBuilder::partitioner` predicts: interactive queries look for their keys on the wrong instance |
//! | `kstate_window_final_results_total` | counter | windows and sessions of a store that emits final results handed to `Processor::on_window_close` |
//! | `kstate_window_late_records_total` | counter | writes a window or session store dropped because their window had closed (end + grace passed in stream time) or expired (past retention); once per window (a record late for three hopping windows counts three) |
//! | `kstate_window_segments` | gauge | live segments of a window or session store partition (updated at each commit) |
//! | `kstate_window_segments_dropped_total` | counter | expired segments of a window or session store dropped (each one RocksDB range deletion) |
//! | `kstate_window_oldest_live_ms` | gauge | the oldest window start (session end) a window or session store still returns: its time minus the retention (updated at each commit) |
//! | `kstate_store_gets_total` | counter | point reads |
//! | `kstate_store_overlay_bytes` | gauge | uncommitted writes held in memory |
//! | `kstate_store_read_cache_hits_total` | counter | point reads answered by the read cache (values of landed commits kept in memory) instead of RocksDB |
//! | `kstate_store_read_cache_bytes` | gauge | bytes the store partition's read cache holds (all together at most `AppBuilder::read_cache_bytes`) |
//! | `kstate_restore_records_total` | counter | changelog records restored |
//! | `kstate_restore_bytes_total` | counter | key + value bytes restored |
//! | `kstate_restore_remaining_records` | gauge | records left to restore (offset distance) |
//! | `kstate_restore_records_per_sec` | gauge | rate of the last finished restore |
//! | `kstate_restore_full_total` | counter | full restores, label `reason` |
//! | `kstate_standby_records_total` | counter | changelog records a standby applied |
//! | `kstate_standby_lag_records` | gauge | records a standby is behind its changelog's end (offset distance) |
//! | `kstate_rebalances_total` | counter | assignments this instance applied (no store labels) |
//! | `kstate_changelog_truncated_partitions` | gauge | at startup: partitions of a changelog whose start offset is above 0 (records deleted from a compacted changelog), label `topic` only |
//! | `kstate_probing_rebalances_total` | counter | rebalances this instance started to move tasks whose warmups caught up, label `reason` (`warmups_caught_up`, `interval`; no store labels) |
//! | `kstate_task_move_seconds` | histogram | from a task's first warmup here to it running here (no store labels) |
//! | `kstate_warmup_lag_records` | gauge | records a warmup task is behind its changelogs' ends, summed over its stores, label `partition` only (0 once it is no warmup here) |
//! | `kstate_rebalance_seconds` | histogram | from the membership starting a rebalance round to the assignment applied (no store labels) |
//! | `kstate_group_generation` | gauge | the group generation of the current assignment (no store labels) |
//! | `kstate_tasks` | gauge | tasks on this instance, label `role` (`active`, `standby`; no store labels) |
//! | `kstate_commit_seconds` | histogram | duration of a commit (no store labels) |
//! | `kstate_transactions_aborted_total` | counter | exactly-once: transactions aborted (a failed commit, a fenced producer, lost tasks; no store labels) |
//! | `kstate_offset_commit_failures_total` | counter | offset commits refused or failed, label `kind` (`group_changed`, `retriable`, `fatal`) |
//! | `kstate_task_reinitialisations_total` | counter | tasks closed and restored after a fault of their own, label `partition` |
//! | `kstate_skipped_records_total` | counter | records skipped by the processing-exception handler or for an invalid timestamp, labels `topic`, `partition` |
//! | `kstate_stream_time_ms` | gauge | a task's stream time (largest record timestamp processed), updated at each commit, label `partition` only |
//! | `kstate_timers_pending` | gauge | a task's pending timers at its last commit, labels `partition`, `domain` (an estimate from above: a timer registered again while its page of time is not in memory counts twice, a deletion there counts when the page is read) |
//! | `kstate_timers_fired_total` | counter | timers fired, labels `partition`, `domain` (`stream_time`, `wall_clock`) |
//! | `kstate_timer_lateness_seconds` | histogram | how long after its time a timer fired, on its own clock, labels `partition`, `domain` |
//! | `kstate_punctuations_total` | counter | punctuations run, labels `partition`, `domain` |
//! | `kstate_punctuation_seconds` | histogram | how long a punctuation ran, labels `partition`, `domain` |
//! | `kstate_input_held_records` | gauge | with several input topics: records a task holds for their turn in the timestamp-ordered merge, label `partition` only |
//! | `kstate_input_enforced_total` | counter | with several input topics: records a task processed while one of its inputs had nothing fetched, after waiting for it (`max_task_idle`, or up to 1 s while the broker held more of it), label `partition` only |
//! | `kstate_global_table_records_total` | counter | records of a global table's topic written to its local copy (bootstrap and following), label `table` only |
//! | `kstate_global_table_lag_records` | gauge | records of a global table's topic not yet in its local copy, summed over its partitions (against librdkafka's last seen end offsets; updated at each write), label `table` only |
//! | `kstate_peers` | gauge | other instances this one watches (members of its generation with a `peer_address`; no store labels) |
//! | `kstate_peers_dropped_total` | counter | peers this instance made the group drop, label `reason` (`closed`: the process is gone; `timeout`: silent for `peer_timeout`) |
//! | `kstate_peer_failover_seconds` | histogram | from dropping a peer to this instance's next assignment |
//! | `kstate_peer_lease_lapses_total` | counter | times this instance stopped writing because a peer's lease ran out (a peer frozen or cut off, or this instance itself) |
//! | `kstate_peer_rejected_total` | counter | connections the peer listener refused, label `reason` (`bad_proof`: a wrong proof of the shared secret; `unauthenticated`: a message before the handshake, or none in time; `garbage`: not a message or a line too long; `too_many_connections`: its source address holds 16 not yet authenticated, or all addresses 128; `wrong_group`: a peer of another application; `bad_seal`: a message on an established link whose seal does not hold) |
//! | `kstate_peer_previous_secret_links` | gauge | open peer links authenticated with `peer_previous_secret` (a rotation under way; 0 on every instance once it is rolled out) |
//! | `kstate_snapshots_total` | counter | snapshots of store partitions, label `result` (`ok`, `failed`; no store labels) |
//! | `kstate_snapshot_seconds` | histogram | how long a snapshot took: checkpoint, upload of new files, manifest (no store labels) |
//! | `kstate_snapshot_delta_bytes` | gauge | bytes the last snapshot of a store partition uploaded (files the snapshot store did not have) |
//! | `kstate_snapshot_full_bytes` | gauge | bytes of all files of the last snapshot of a store partition |
//! | `kstate_snapshot_files` | gauge | files of the last snapshot of a store partition |
//! | `kstate_snapshot_age_seconds` | gauge | time since the last complete snapshot of a store partition taken here (updated every second) |
//! | `kstate_snapshot_seeds_total` | counter | store partitions without local state that looked for a snapshot, label `result` (`seeded`, `skipped`: none usable, reasons logged; `none`: there was none; no store labels) |
//! | `kstate_snapshot_seed_bytes_per_sec` | gauge | download rate of the last seeding of a store partition from a snapshot: the recovery bandwidth |
//! | `kstate_remote_requests_total` | counter | requests remote stores sent to object storage, label `kind` (`GET`, `PUT`, `LIST`, `DELETE`, `HEAD`, `COPY`; a multipart upload counts a PUT per part and one to complete; no store labels): what object storage bills |
//! | `kstate_remote_bytes_total` | counter | bytes remote stores moved to and from object storage, label `direction` (`up`, `down`; no store labels) |
//! | `kstate_remote_open_seconds` | histogram | how long opening a remote store partition's database took (fencing earlier writers, reading its manifest), label `store` only |
//! | `kstate_remote_waiting` | gauge | calls of remote stores waiting for object storage for more than 5 s (an outage: processing pauses, logged as it starts and ends; a call fails after `RemoteStateConfig::timeout`) |
//! | `kstate_remote_standby_reads_total` | counter | reads a standby of remote stores made through the instance's caches to warm them (the keys its changelog changed; label `store`) |
//! | `kstate_remote_cache_hits_total` | counter | block, index and filter reads of remote stores answered by the instance's remote cache, no store labels (with `kstate_remote_cache_misses_total`: the hit rate) |
//! | `kstate_remote_cache_misses_total` | counter | the same reads that went to object storage |
//! | `kstate_rocksdb_estimate_num_keys` | gauge | RocksDB `rocksdb.estimate-num-keys` |
//! | `kstate_rocksdb_live_sst_bytes` | gauge | RocksDB `rocksdb.live-sst-files-size` |
//! | `kstate_rocksdb_pending_compaction_bytes` | gauge | RocksDB `rocksdb.estimate-pending-compaction-bytes` |
//! | `kstate_rocksdb_block_cache_bytes` | gauge | RocksDB `rocksdb.block-cache-usage` (shared cache) |
//! | `kstate_in_memory_bytes` | gauge | bytes of every in-memory store partition of the instance (keys, values, per-entry overhead; no store labels); `kstate_store_physical_bytes` gives each partition's |

use metrics::{counter, gauge, Counter, Gauge};

/// Snapshots taken (label `result`).
pub const SNAPSHOTS: &str = "kstate_snapshots_total";
/// Duration of a snapshot.
pub const SNAPSHOT_SECONDS: &str = "kstate_snapshot_seconds";
/// Bytes the last snapshot uploaded.
pub const SNAPSHOT_DELTA_BYTES: &str = "kstate_snapshot_delta_bytes";
/// Bytes of the last snapshot's files.
pub const SNAPSHOT_FULL_BYTES: &str = "kstate_snapshot_full_bytes";
/// Files of the last snapshot.
pub const SNAPSHOT_FILES: &str = "kstate_snapshot_files";
/// Age of the last complete snapshot.
pub const SNAPSHOT_AGE: &str = "kstate_snapshot_age_seconds";
/// Seedings from snapshots (label `result`).
pub const SNAPSHOT_SEEDS: &str = "kstate_snapshot_seeds_total";
/// Download rate of the last seeding.
pub const SNAPSHOT_SEED_RATE: &str = "kstate_snapshot_seed_bytes_per_sec";

/// Requests remote stores sent to object storage (label `kind`).
pub const REMOTE_REQUESTS: &str = "kstate_remote_requests_total";
/// Bytes remote stores moved (label `direction`).
pub const REMOTE_BYTES: &str = "kstate_remote_bytes_total";
/// Time to open a remote store partition.
pub const REMOTE_OPEN_SECONDS: &str = "kstate_remote_open_seconds";
/// Calls to object storage waiting for it (an outage: processing pauses).
pub const REMOTE_WAITING: &str = "kstate_remote_waiting";
/// Remote cache hits.
pub const REMOTE_CACHE_HITS: &str = "kstate_remote_cache_hits_total";
/// Remote cache misses.
pub const REMOTE_CACHE_MISSES: &str = "kstate_remote_cache_misses_total";
/// Reads standbys of remote stores made to warm the caches (label `store`).
pub const REMOTE_STANDBY_READS: &str = "kstate_remote_standby_reads_total";

/// Expired entries deleted counter name.
pub const TTL_EXPIRED: &str = "kstate_ttl_expired_total";
/// Records dropped by a window or session store: their window had closed.
pub const WINDOW_LATE_RECORDS: &str = "kstate_window_late_records_total";
/// Successful purges of a repartition topic partition (label `topic`).
pub const REPARTITION_PURGES: &str = "kstate_repartition_purges_total";
/// Keyed input records in another partition than the partitioner predicts (label `topic`).
pub const INPUT_PARTITION_MISMATCHES: &str = "kstate_input_partition_mismatches_total";
/// Final results of a window or session store (`on_window_close` calls).
pub const WINDOW_FINAL_RESULTS: &str = "kstate_window_final_results_total";
/// Live segments of a window or session store partition.
pub const WINDOW_SEGMENTS: &str = "kstate_window_segments";
/// Expired segments dropped.
pub const WINDOW_SEGMENTS_DROPPED: &str = "kstate_window_segments_dropped_total";
/// The oldest window start (session end) still returned.
pub const WINDOW_OLDEST_LIVE: &str = "kstate_window_oldest_live_ms";
/// Stream time gauge name.
pub const STREAM_TIME: &str = "kstate_stream_time_ms";
/// Pending timers gauge name.
pub const TIMERS_PENDING: &str = "kstate_timers_pending";
/// Timers fired counter name.
pub const TIMERS_FIRED: &str = "kstate_timers_fired_total";
/// Timer lateness histogram name.
pub const TIMER_LATENESS: &str = "kstate_timer_lateness_seconds";
/// Punctuations run counter name.
pub const PUNCTUATIONS: &str = "kstate_punctuations_total";
/// Punctuation duration histogram name.
pub const PUNCTUATION_SECONDS: &str = "kstate_punctuation_seconds";
/// Puts counter name.
pub const STORE_PUTS: &str = "kstate_store_puts_total";
/// Deletes counter name.
pub const STORE_DELETES: &str = "kstate_store_deletes_total";
/// Gets counter name.
pub const STORE_GETS: &str = "kstate_store_gets_total";
/// Overlay size gauge name.
pub const STORE_OVERLAY_BYTES: &str = "kstate_store_overlay_bytes";
/// Read cache hits counter name.
pub const STORE_READ_CACHE_HITS: &str = "kstate_store_read_cache_hits_total";
/// Read cache size gauge name.
pub const STORE_READ_CACHE_BYTES: &str = "kstate_store_read_cache_bytes";
/// Restored records counter name.
pub const RESTORE_RECORDS: &str = "kstate_restore_records_total";
/// Restored bytes counter name.
pub const RESTORE_BYTES: &str = "kstate_restore_bytes_total";
/// Remaining restore records gauge name.
pub const RESTORE_REMAINING: &str = "kstate_restore_remaining_records";
/// Restore rate gauge name.
pub const RESTORE_RATE: &str = "kstate_restore_records_per_sec";
/// Full restore counter name.
pub const RESTORE_FULL: &str = "kstate_restore_full_total";
/// Standby applied records counter name.
pub const STANDBY_RECORDS: &str = "kstate_standby_records_total";
/// Standby lag gauge name.
pub const STANDBY_LAG: &str = "kstate_standby_lag_records";
/// Applied assignments counter name.
pub const REBALANCES: &str = "kstate_rebalances_total";
/// See the table above.
pub const CHANGELOG_TRUNCATED: &str = "kstate_changelog_truncated_partitions";
/// See the table above.
pub const PROBING_REBALANCES: &str = "kstate_probing_rebalances_total";
/// See the table above.
pub const TASK_MOVE_SECONDS: &str = "kstate_task_move_seconds";
/// See the table above.
pub const WARMUP_LAG: &str = "kstate_warmup_lag_records";
/// Rebalance duration histogram name.
pub const REBALANCE_SECONDS: &str = "kstate_rebalance_seconds";
/// Group generation gauge name.
pub const GROUP_GENERATION: &str = "kstate_group_generation";
/// Tasks by role gauge name.
pub const TASKS: &str = "kstate_tasks";
/// Commit latency histogram name.
pub const COMMIT_SECONDS: &str = "kstate_commit_seconds";
/// Exactly-once: transactions aborted.
pub const TRANSACTIONS_ABORTED: &str = "kstate_transactions_aborted_total";
/// Failed offset commits counter name.
pub const OFFSET_COMMIT_FAILURES: &str = "kstate_offset_commit_failures_total";
/// Task re-initialisations counter name.
pub const TASK_REINITIALISATIONS: &str = "kstate_task_reinitialisations_total";
/// Skipped records counter name.
pub const SKIPPED_RECORDS: &str = "kstate_skipped_records_total";
/// Records held for the timestamp-ordered merge gauge name (label `partition`).
pub const INPUT_HELD: &str = "kstate_input_held_records";
/// Records processed with an input empty after the wait counter name (label `partition`).
pub const INPUT_ENFORCED: &str = "kstate_input_enforced_total";
/// Global table records written counter name (label `table`).
pub const GLOBAL_TABLE_RECORDS: &str = "kstate_global_table_records_total";
/// Global table lag gauge name (label `table`).
pub const GLOBAL_TABLE_LAG: &str = "kstate_global_table_lag_records";
/// RocksDB estimated keys gauge name.
pub const ROCKSDB_KEYS: &str = "kstate_rocksdb_estimate_num_keys";
/// RocksDB live SST bytes gauge name.
pub const ROCKSDB_LIVE_SST: &str = "kstate_rocksdb_live_sst_bytes";
/// RocksDB pending compaction bytes gauge name.
pub const ROCKSDB_PENDING_COMPACTION: &str = "kstate_rocksdb_pending_compaction_bytes";
/// Bytes of every in-memory store partition of the instance.
pub const IN_MEMORY_BYTES: &str = "kstate_in_memory_bytes";
/// RocksDB block cache usage gauge name.
pub const ROCKSDB_BLOCK_CACHE: &str = "kstate_rocksdb_block_cache_bytes";

/// See the table above.
pub const STORE_LOGICAL_BYTES: &str = "kstate_store_logical_bytes";
/// See the table above.
pub const STORE_PHYSICAL_BYTES: &str = "kstate_store_physical_bytes";
/// See the table above.
pub const ROCKSDB_WRITE_STALLS: &str = "kstate_rocksdb_write_stalls_total";
/// See the table above.
pub const ROCKSDB_WRITE_STALL_MICROS: &str = "kstate_rocksdb_write_stall_micros_total";
/// See the table above.
pub const ROCKSDB_BLOCK_CACHE_HITS: &str = "kstate_rocksdb_block_cache_hits_total";
/// See the table above.
pub const ROCKSDB_BLOCK_CACHE_MISSES: &str = "kstate_rocksdb_block_cache_misses_total";
/// See the table above.
pub const STATE_DIR_USED_BYTES: &str = "kstate_state_dir_used_bytes";
/// See the table above.
pub const STATE_DIR_FREE_BYTES: &str = "kstate_state_dir_free_bytes";
/// See the table above.
pub const RECORDS_PROCESSED: &str = "kstate_records_processed_total";
/// See the table above.
pub const INPUT_LAG: &str = "kstate_input_lag_records";
/// See the table above.
pub const RESTORE_REMAINING_BYTES: &str = "kstate_restore_remaining_bytes";
/// See the table above.
pub const STANDBY_LAG_BYTES: &str = "kstate_standby_lag_bytes";
/// See the table above.
pub const PEERS: &str = "kstate_peers";
/// See the table above.
pub const PEERS_DROPPED: &str = "kstate_peers_dropped_total";
/// See the table above.
pub const PEER_FAILOVER_SECONDS: &str = "kstate_peer_failover_seconds";
/// See the table above.
pub const PEER_LEASE_LAPSES: &str = "kstate_peer_lease_lapses_total";
/// See the table above.
pub const PEER_REJECTED: &str = "kstate_peer_rejected_total";
/// Open peer links authenticated with `peer_previous_secret` (0 on every instance: a rotation's rollout is complete).
pub const PEER_PREVIOUS_SECRET_LINKS: &str = "kstate_peer_previous_secret_links";

/// Handles for one store partition, resolved once so the hot path only
/// touches atomics.
#[derive(Clone)]
pub(crate) struct StoreMetrics {
    pub(crate) puts: Counter,
    pub(crate) deletes: Counter,
    pub(crate) gets: Counter,
    pub(crate) overlay_bytes: Gauge,
    pub(crate) read_cache_hits: Counter,
    pub(crate) read_cache_bytes: Gauge,
    pub(crate) restore_records: Counter,
    pub(crate) restore_bytes: Counter,
    pub(crate) restore_remaining: Gauge,
    pub(crate) restore_rate: Gauge,
    pub(crate) standby_records: Counter,
    pub(crate) standby_lag: Gauge,
    pub(crate) rocksdb_keys: Gauge,
    pub(crate) rocksdb_live_sst: Gauge,
    pub(crate) rocksdb_pending_compaction: Gauge,
    pub(crate) rocksdb_block_cache: Gauge,
    pub(crate) logical_bytes: Gauge,
    pub(crate) physical_bytes: Gauge,
    pub(crate) write_stalls: Counter,
    pub(crate) write_stall_micros: Counter,
    pub(crate) block_cache_hits: Counter,
    pub(crate) block_cache_misses: Counter,
    pub(crate) restore_remaining_bytes: Gauge,
    pub(crate) standby_lag_bytes: Gauge,
    pub(crate) expired: Counter,
    pub(crate) late_records: Counter,
    pub(crate) final_results: Counter,
    pub(crate) segments: Gauge,
    pub(crate) segments_dropped: Counter,
    pub(crate) oldest_live: Gauge,
    store: String,
    partition: String,
}

impl StoreMetrics {
    pub(crate) fn new(store: &str, partition: i32) -> Self {
        let s = store.to_string();
        let p = partition.to_string();
        let labels = [("store", s.clone()), ("partition", p.clone())];
        StoreMetrics {
            puts: counter!(STORE_PUTS, &labels),
            deletes: counter!(STORE_DELETES, &labels),
            expired: counter!(TTL_EXPIRED, &labels),
            late_records: counter!(WINDOW_LATE_RECORDS, &labels),
            final_results: counter!(WINDOW_FINAL_RESULTS, &labels),
            segments: gauge!(WINDOW_SEGMENTS, &labels),
            segments_dropped: counter!(WINDOW_SEGMENTS_DROPPED, &labels),
            oldest_live: gauge!(WINDOW_OLDEST_LIVE, &labels),
            gets: counter!(STORE_GETS, &labels),
            overlay_bytes: gauge!(STORE_OVERLAY_BYTES, &labels),
            read_cache_hits: counter!(STORE_READ_CACHE_HITS, &labels),
            read_cache_bytes: gauge!(STORE_READ_CACHE_BYTES, &labels),
            restore_records: counter!(RESTORE_RECORDS, &labels),
            restore_bytes: counter!(RESTORE_BYTES, &labels),
            restore_remaining: gauge!(RESTORE_REMAINING, &labels),
            restore_rate: gauge!(RESTORE_RATE, &labels),
            standby_records: counter!(STANDBY_RECORDS, &labels),
            standby_lag: gauge!(STANDBY_LAG, &labels),
            rocksdb_keys: gauge!(ROCKSDB_KEYS, &labels),
            rocksdb_live_sst: gauge!(ROCKSDB_LIVE_SST, &labels),
            rocksdb_pending_compaction: gauge!(ROCKSDB_PENDING_COMPACTION, &labels),
            rocksdb_block_cache: gauge!(ROCKSDB_BLOCK_CACHE, &labels),
            logical_bytes: gauge!(STORE_LOGICAL_BYTES, &labels),
            physical_bytes: gauge!(STORE_PHYSICAL_BYTES, &labels),
            write_stalls: counter!(ROCKSDB_WRITE_STALLS, &labels),
            write_stall_micros: counter!(ROCKSDB_WRITE_STALL_MICROS, &labels),
            block_cache_hits: counter!(ROCKSDB_BLOCK_CACHE_HITS, &labels),
            block_cache_misses: counter!(ROCKSDB_BLOCK_CACHE_MISSES, &labels),
            restore_remaining_bytes: gauge!(RESTORE_REMAINING_BYTES, &labels),
            standby_lag_bytes: gauge!(STANDBY_LAG_BYTES, &labels),
            store: s,
            partition: p,
        }
    }

    /// Zeroes the size gauges (the store is no longer an active task here).
    pub(crate) fn clear_sizes(&self) {
        for g in [&self.logical_bytes, &self.physical_bytes, &self.rocksdb_keys, &self.rocksdb_live_sst, &self.rocksdb_pending_compaction] {
            g.set(0.0);
        }
    }

    /// Zeroes the restore and standby lag gauges (no restore or standby of
    /// this store partition runs here any more).
    pub(crate) fn clear_lags(&self) {
        for g in [&self.restore_remaining, &self.restore_remaining_bytes, &self.standby_lag, &self.standby_lag_bytes] {
            g.set(0.0);
        }
    }

    /// Counts a full restore and why it happened.
    pub(crate) fn full_restore(&self, reason: &'static str) {
        counter!(RESTORE_FULL, "store" => self.store.clone(), "partition" => self.partition.clone(), "reason" => reason)
            .increment(1);
    }
}
