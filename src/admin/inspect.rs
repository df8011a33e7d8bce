//! `inspect`: what is in a state directory.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{dir_bytes, partitions_of, stores_of, subdirs, AdminError, ReadOnly, Result};
use crate::restore::RestoreRate;

/// Everything under one state directory.
#[derive(Debug, Clone, Serialize)]
pub struct InspectReport {
    /// The state directory.
    pub state_dir: PathBuf,
    /// One entry per application directory, by name.
    pub applications: Vec<ApplicationReport>,
}

/// One application's local state.
#[derive(Debug, Clone, Serialize)]
pub struct ApplicationReport {
    /// The application id (its directory's name).
    pub application_id: String,
    /// The instance's process id (`kstate.process-id`), if written.
    pub process_id: Option<String>,
    /// The rate of the last restore of at least 10,000 records on this
    /// state directory, if any.
    pub restore_rate: Option<RestoreRateReport>,
    /// Every store partition, by store then partition.
    pub partitions: Vec<StorePartitionReport>,
}

/// A restore rate measured on this state directory.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RestoreRateReport {
    /// Records that restore replayed.
    pub records: u64,
    /// Key + value bytes it replayed.
    pub bytes: u64,
    /// Its wall time in seconds.
    pub seconds: f64,
    /// `records / seconds`.
    pub records_per_sec: f64,
    /// When it finished (ms since the epoch).
    pub measured_at_ms: i64,
}

impl RestoreRateReport {
    pub(crate) fn load(app_dir: &Path) -> Option<RestoreRateReport> {
        let r = RestoreRate::load(app_dir)?;
        Some(RestoreRateReport {
            records: r.records,
            bytes: r.bytes,
            seconds: r.seconds,
            records_per_sec: r.records_per_sec(),
            measured_at_ms: r.at_ms,
        })
    }
}

/// One store partition's local state.
#[derive(Debug, Clone, Serialize)]
pub struct StorePartitionReport {
    /// The store.
    pub store: String,
    /// The partition.
    pub partition: i32,
    /// Its directory.
    pub path: PathBuf,
    /// Whether a live instance holds its lock (has the store open).
    pub locked: bool,
    /// The changelog offset the data reflects, as of the last flush
    /// (`None`: nothing committed, or unreadable: see `problem`).
    pub checkpoint: Option<i64>,
    /// The checkpoint in `kstate.checkpoint`, written at a clean close
    /// (absent while open or after a crash).
    pub checkpoint_hint: Option<i64>,
    /// The changelog topic id recorded by the last restore.
    pub changelog_topic_id: Option<String>,
    /// Every changelog record past the checkpoint was appended at or after
    /// this time (ms since the epoch; what the restore compares with the
    /// changelog's tombstone retention).
    pub appended_after_ms: Option<i64>,
    /// Keys (RocksDB's estimate).
    pub keys: u64,
    /// Key + value bytes (from above: overwritten entries count until compacted).
    pub logical_bytes: u64,
    /// SST files plus memtables.
    pub physical_bytes: u64,
    /// Bytes RocksDB estimates compaction still has to rewrite.
    pub pending_compaction_bytes: u64,
    /// Every file under the directory.
    pub disk_bytes: u64,
    /// Seconds since the newest SST file was written (the last flush), if any.
    pub last_flush_age_secs: Option<f64>,
    /// The time store (`kstate-time`) only: the task's stream time and
    /// its pending timers.
    pub timers: Option<crate::timers::TimersSummary>,
    /// A window or session store only: its layout and time.
    pub segments: Option<SegmentsReport>,
    /// Why the database could not be read, if it could not.
    pub problem: Option<String>,
}

/// A window or session store partition's bookkeeping.
#[derive(Debug, Clone, Serialize)]
pub struct SegmentsReport {
    /// `window` or `session`.
    pub kind: String,
    /// Segment length in ms (`max(retention / 2, 60 s)`).
    pub segment_interval_ms: i64,
    /// The store's retention in ms.
    pub retention_ms: i64,
    /// The latest window start (session end) written, as of the last flush.
    pub time: i64,
}

/// Reports every application, store and partition under `state_dir`.
/// Works while applications run (nothing is written; each store's lock is
/// only tried for an instant, to report whether it is live).
pub fn inspect(state_dir: &Path) -> Result<InspectReport> {
    if !state_dir.is_dir() {
        return Err(AdminError::StateDirMissing(state_dir.to_path_buf()));
    }
    let mut applications = Vec::new();
    for app in subdirs(state_dir) {
        let app_dir = state_dir.join(&app);
        let mut partitions = Vec::new();
        for store in stores_of(&app_dir) {
            for p in partitions_of(&app_dir.join(&store)) {
                partitions.push(store_partition(&app_dir.join(&store).join(p.to_string()), &store, p));
            }
        }
        applications.push(ApplicationReport {
            process_id: std::fs::read_to_string(app_dir.join(crate::runtime::PROCESS_ID_FILE)).ok().map(|s| s.trim().to_string()),
            restore_rate: RestoreRateReport::load(&app_dir),
            application_id: app,
            partitions,
        });
    }
    Ok(InspectReport { state_dir: state_dir.to_path_buf(), applications })
}

fn store_partition(dir: &Path, store: &str, partition: i32) -> StorePartitionReport {
    let mut r = StorePartitionReport {
        store: store.to_string(),
        partition,
        path: dir.to_path_buf(),
        locked: false,
        checkpoint: None,
        checkpoint_hint: crate::store::engine::read_checkpoint_hint(dir),
        changelog_topic_id: None,
        appended_after_ms: None,
        keys: 0,
        logical_bytes: 0,
        physical_bytes: 0,
        pending_compaction_bytes: 0,
        disk_bytes: dir_bytes(dir),
        last_flush_age_secs: newest_sst_age(&dir.join("db")),
        timers: None,
        segments: None,
        problem: None,
    };
    match crate::store::lock::is_held(dir) {
        Ok(locked) => r.locked = locked,
        Err(e) => r.problem = Some(e.to_string()),
    }
    let read = ReadOnly::open(dir).and_then(|ro| {
        let local = ro.local_checkpoint(dir)?;
        (r.checkpoint, r.changelog_topic_id, r.appended_after_ms) = (local.checkpoint, local.topic_id, local.appended_after_ms);
        let stats = ro.db.data_stats();
        r.keys = stats.keys;
        r.logical_bytes = stats.logical_bytes;
        r.physical_bytes = stats.physical_bytes;
        r.pending_compaction_bytes = stats.pending_compaction_bytes;
        r.segments = ro.db.segments()?.map(|s| SegmentsReport {
            kind: if s.layout == b'w' { "window" } else { "session" }.to_string(),
            segment_interval_ms: s.interval,
            retention_ms: s.retention,
            time: s.time,
        });
        if store == crate::timers::TIME_STORE {
            r.timers = Some(crate::timers::TimersSummary::of(|| ro.db.iter())?);
        }
        Ok(())
    });
    if let Err(e) = read {
        r.problem = Some(e.to_string());
    }
    r
}

/// Seconds since the newest `*.sst` file in `db_dir` was modified.
fn newest_sst_age(db_dir: &Path) -> Option<f64> {
    let newest = std::fs::read_dir(db_dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sst"))
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()?;
    Some(std::time::SystemTime::now().duration_since(newest).unwrap_or_default().as_secs_f64())
}
