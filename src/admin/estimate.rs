//! `estimate-restore`: how much a restart would replay, and how long it
//! would take.

use std::collections::BTreeSet;
use std::path::Path;

use rdkafka::consumer::Consumer;
use serde::Serialize;

use super::{app_dir, partitions_of, stores_of, AdminError, Kafka, ReadOnly, Result};
use crate::restore::{full_restore_reason, ChangelogState};

/// The restore rate assumed when none is given and none was measured on
/// the state directory (records per second).
pub const DEFAULT_RESTORE_RATE: f64 = 100_000.0;
/// Records read per partition to estimate the tail's bytes.
const SAMPLE_RECORDS: u64 = 1000;

/// What else to estimate beyond the local store directories.
#[derive(Debug, Clone, Default)]
pub struct EstimateOptions {
    /// Stores to include even without a local directory.
    pub stores: Vec<String>,
    /// The partitions to estimate; empty: every partition of each store's
    /// changelog (those without local state from the changelog's start).
    pub partitions: Vec<i32>,
    /// Records per second; `None`: the rate measured on this state
    /// directory, else [`DEFAULT_RESTORE_RATE`].
    pub rate: Option<f64>,
    /// Also price seeding from the application's snapshots (where a store
    /// partition would otherwise restore from the changelog's start).
    pub snapshots: Option<super::SnapshotStore>,
    /// Download bytes per second for that price; `None`: [`DEFAULT_DOWNLOAD_RATE`].
    pub download_rate: Option<f64>,
}

/// The download rate assumed for snapshots when none is given (bytes per second).
pub const DEFAULT_DOWNLOAD_RATE: f64 = 100e6;

/// The other path of a store partition that would restore from the
/// changelog's start: seeding from its newest usable snapshot, then the
/// changelog past it.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotPath {
    /// The snapshot.
    pub snapshot_id: String,
    /// Its checkpoint.
    pub checkpoint: i64,
    /// Bytes to download.
    pub bytes: u64,
    /// Changelog records to replay after it.
    pub tail_records: u64,
    /// `bytes / download rate + tail_records / rate`.
    pub estimated_seconds: f64,
    /// Newer snapshots passed over, with the reason.
    pub skipped: Vec<String>,
}

/// Where the rate of an estimate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateSource {
    /// Given by the caller.
    Given,
    /// The last restore of at least 10,000 records on this state directory.
    Measured,
    /// [`DEFAULT_RESTORE_RATE`].
    Assumed,
}

/// One store partition's restore.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionEstimate {
    /// The store.
    pub store: String,
    /// The partition.
    pub partition: i32,
    /// Whether local state exists (else the restore starts at the changelog's start).
    pub local: bool,
    /// The local checkpoint, if any.
    pub checkpoint: Option<i64>,
    /// The first offset the restore would replay.
    pub from_offset: i64,
    /// The changelog's end offset.
    pub end_offset: i64,
    /// Records to replay (`end - from`; counts aborted records and
    /// transaction markers of an exactly-once changelog too).
    pub records: u64,
    /// Key + value bytes to replay: the average of a sample of up to 1000
    /// records of the tail times `records` (an estimate).
    pub estimated_bytes: u64,
    /// Records sampled for the byte estimate.
    pub sampled_records: u64,
    /// Why the restore starts at the changelog's start, when it does
    /// although local state exists.
    pub note: Option<String>,
    /// With [`EstimateOptions::snapshots`], for a restore from the start:
    /// the path through the newest usable snapshot, if there is one.
    pub snapshot: Option<SnapshotPath>,
    /// The local state's size on each backend, when it is readable.
    pub sizes: Option<LocalSizes>,
}

/// A store partition's local state, and what it costs on either backend.
#[derive(Debug, Clone, Serialize)]
pub struct LocalSizes {
    /// `rocksdb` or `in_memory` ([`StoreDefinition::in_memory`](crate::StoreDefinition::in_memory)).
    pub backend: &'static str,
    /// Keys (RocksDB: its estimate).
    pub keys: u64,
    /// Key and value bytes (RocksDB: an estimate from above).
    pub data_bytes: u64,
    /// What an in-memory store holds for it: `data_bytes` plus
    /// [`IN_MEMORY_ENTRY_OVERHEAD`] per key.
    pub in_memory_bytes: u64,
    /// RocksDB's SST files and memtables (in memory: 0).
    pub rocksdb_bytes: u64,
}

/// Bytes an in-memory store spends per entry beyond its key and value.
pub const IN_MEMORY_ENTRY_OVERHEAD: u64 = crate::store::engine::HEAP_ENTRY_OVERHEAD as u64;

/// The outcome of [`estimate_restore()`].
#[derive(Debug, Clone, Serialize)]
pub struct RestoreEstimate {
    /// The application.
    pub application_id: String,
    /// Records per second used.
    pub rate_records_per_sec: f64,
    /// Where the rate comes from.
    pub rate_source: RateSource,
    /// Per store partition.
    pub partitions: Vec<PartitionEstimate>,
    /// Records to replay in all.
    pub total_records: u64,
    /// Estimated bytes to replay in all.
    pub total_estimated_bytes: u64,
    /// `total_records / rate` (the restore thread replays every store
    /// partition of an instance, so the rate is for all of them together).
    pub estimated_seconds: f64,
    /// With [`EstimateOptions::snapshots`]: the download rate used (bytes per second).
    pub download_rate_bytes_per_sec: Option<f64>,
    /// With [`EstimateOptions::snapshots`]: the time when every store
    /// partition with a usable snapshot is seeded from it instead (downloads
    /// at the download rate, the rest replayed at `rate`).
    pub estimated_seconds_with_snapshots: Option<f64>,
}

/// Estimates what a restart of `app` on this state directory would replay:
/// per store partition the changelog records past the local checkpoint
/// (all of them without local state), their bytes from a sample, and the
/// time at the given, measured or assumed rate. Works while the
/// application runs (its stores' last flushes are what a crash would
/// restart from).
pub fn estimate_restore(state_dir: &Path, app: &str, kafka: &Kafka, options: &EstimateOptions) -> Result<RestoreEstimate> {
    if let Some(rate) = options.rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(AdminError::Admin(format!("the restore rate must be a positive number of records per second, not {rate}")));
        }
    }
    let app_dir = app_dir(state_dir, app)?;
    let (rate, rate_source) = match options.rate {
        Some(r) => (r, RateSource::Given),
        None => match crate::restore::RestoreRate::load(&app_dir) {
            Some(m) => (m.records_per_sec(), RateSource::Measured),
            None => (DEFAULT_RESTORE_RATE, RateSource::Assumed),
        },
    };
    let download_rate = options.download_rate.unwrap_or(DEFAULT_DOWNLOAD_RATE);
    if !(download_rate.is_finite() && download_rate > 0.0) {
        return Err(AdminError::Admin(format!("the download rate must be a positive number of bytes per second, not {download_rate}")));
    }
    let stores: BTreeSet<String> = stores_of(&app_dir).into_iter().chain(options.stores.iter().cloned()).collect();
    let snapshots: Vec<super::PartitionSnapshots> = match &options.snapshots {
        Some(at) => super::list_snapshots(at, app, None)?,
        None => Vec::new(),
    };
    let consumer = kafka.consumer()?;
    let mut partitions = Vec::new();
    for store in &stores {
        let topic = super::changelog_topic_of(&app_dir, app, store);
        let Some(count) = kafka.partitions(&consumer, &topic)? else {
            return Err(AdminError::Changelog { topic, detail: format!("topic does not exist (store `{store}`)") });
        };
        // What the restore compares local state with (unknown: not compared, as the restore does).
        let topic_id = crate::kafka::topic_id::describe(consumer.client().native_ptr(), &topic, kafka.timeout).ok();
        let tombstone_retention = kafka.tombstone_retention(&topic);
        let wanted: Vec<i32> = if options.partitions.is_empty() { (0..count).collect() } else { options.partitions.clone() };
        let local = partitions_of(&app_dir.join(store));
        for p in wanted {
            if p >= count || p < 0 {
                return Err(AdminError::Changelog { topic, detail: format!("has {count} partitions, no partition {p}") });
            }
            let dir = app_dir.join(store).join(p.to_string());
            let is_local = local.contains(&p) && dir.join("db").is_dir();
            let mut note = None;
            let mut sizes = None;
            let local_state = if is_local {
                let read = |db: ReadOnly| {
                    let stats = db.db.data_stats();
                    let backend = if db.db.is_in_memory() { "in_memory" } else { "rocksdb" };
                    sizes = Some(LocalSizes {
                        backend,
                        keys: stats.keys,
                        data_bytes: stats.logical_bytes,
                        in_memory_bytes: stats.logical_bytes + stats.keys * IN_MEMORY_ENTRY_OVERHEAD,
                        rocksdb_bytes: if db.db.is_in_memory() { 0 } else { stats.physical_bytes },
                    });
                    db.local_checkpoint(&dir)
                };
                match ReadOnly::open(&dir).and_then(read) {
                    Ok(state) => Some(state),
                    Err(e) => {
                        // As kstate's own open would: unreadable local state is restored in full.
                        note = Some(format!("local store unreadable ({e}): full restore"));
                        None
                    }
                }
            } else {
                None
            };
            let checkpoint = local_state.as_ref().and_then(|l| l.checkpoint);
            let (low, high) = kafka.watermarks(&consumer, &topic, p)?;
            let changelog = ChangelogState { low, high, topic_id: topic_id.clone(), tombstone_retention };
            // The checks a restore makes before it replays only the tail.
            let reason = local_state.as_ref().and_then(|l| full_restore_reason(l, &changelog, crate::store::engine::now_ms()));
            let from = match (reason, checkpoint) {
                (Some((why, _)), _) => {
                    note = Some(format!("{why}: full restore"));
                    low
                }
                (None, Some(c)) => c + 1,
                (None, None) => low,
            };
            let records = (high - from).max(0) as u64;
            let (mut sampled, mut sample_bytes) = (0u64, 0u64);
            let sample_end = from + records.min(SAMPLE_RECORDS) as i64;
            kafka.read(&consumer, &topic, p, from, sample_end, |_, k, v| {
                sampled += 1;
                sample_bytes += (k.len() + v.map_or(0, <[u8]>::len)) as u64;
                sampled < SAMPLE_RECORDS
            })?;
            let estimated_bytes = if sampled == 0 { 0 } else { (sample_bytes as f64 / sampled as f64 * records as f64) as u64 };
            // The seeding path, for a restore from the start (as kstate seeds only an empty store).
            let snapshot = (options.snapshots.is_some() && from == low && records > 0)
                .then(|| snapshot_path(&snapshots, store, p, &changelog, (rate, download_rate)))
                .flatten();
            partitions.push(PartitionEstimate {
                store: store.clone(),
                partition: p,
                local: is_local,
                checkpoint,
                from_offset: from,
                end_offset: high,
                records,
                estimated_bytes,
                sampled_records: sampled,
                note,
                snapshot,
                sizes,
            });
        }
    }
    let total_records = partitions.iter().map(|p| p.records).sum::<u64>();
    let with_snapshots = options.snapshots.as_ref().map(|_| {
        partitions
            .iter()
            .map(|p| match &p.snapshot {
                Some(s) => s.bytes as f64 / download_rate + s.tail_records as f64 / rate,
                None => p.records as f64 / rate,
            })
            .sum::<f64>()
    });
    Ok(RestoreEstimate {
        download_rate_bytes_per_sec: options.snapshots.as_ref().map(|_| download_rate),
        estimated_seconds_with_snapshots: with_snapshots,
        application_id: app.to_string(),
        rate_records_per_sec: rate,
        rate_source,
        total_estimated_bytes: partitions.iter().map(|p| p.estimated_bytes).sum(),
        total_records,
        estimated_seconds: total_records as f64 / rate,
        partitions,
    })
}

/// The newest snapshot of a store partition that the changelog as it is
/// now can continue (the checks seeding makes), priced.
fn snapshot_path(
    all: &[super::PartitionSnapshots],
    store: &str,
    partition: i32,
    changelog: &ChangelogState,
    (rate, download_rate): (f64, f64),
) -> Option<SnapshotPath> {
    let found = all.iter().find(|s| s.store == store && s.partition == partition)?;
    let mut newest_first: Vec<&crate::snapshot::RemoteSnapshot> = found.snapshots.iter().collect();
    newest_first.sort_by_key(|s| std::cmp::Reverse((s.checkpoint, s.created_at_ms)));
    let mut skipped = Vec::new();
    for s in newest_first {
        if let Some(why) = s.unusable_for(changelog, crate::store::engine::now_ms()) {
            skipped.push(format!("snapshot {}: {why}", s.id));
            continue;
        }
        let tail_records = (changelog.high - s.checkpoint - 1).max(0) as u64;
        let bytes = s.bytes();
        return Some(SnapshotPath {
            snapshot_id: s.id.clone(),
            checkpoint: s.checkpoint,
            bytes,
            tail_records,
            estimated_seconds: bytes as f64 / download_rate + tail_records as f64 / rate,
            skipped,
        });
    }
    None
}
