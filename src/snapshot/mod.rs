//! Incremental snapshots of store partitions in object storage, and
//! seeding stores from them (architecture.md §10).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`SnapshotConfig`]; the [`Snapshots`] service (its I/O runtime, bandwidth limit, what each database uploaded); the `kstate-snapshots` thread |
//! | `remote.rs` | the object store from the URL, the key layout, checksummed and paced transfers |
//! | `manifest.rs` | [`RemoteSnapshot`] and the pending marker of an upload |
//! | `upload.rs` | one snapshot: checkpoint, upload of new files, manifest |
//! | `seed.rs` | a store with no local state seeded from the newest usable snapshot |
//! | `gc.rs` | retention: old manifests and unreferenced files deleted |
//! | `savepoint.rs` | savepoints: each task's consistent cut, on request |

pub(crate) mod gc;
pub(crate) mod manifest;
pub(crate) mod remote;
pub(crate) mod savepoint;
mod seed;
pub(crate) mod upload;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use gc::GcReport;
pub use manifest::{RemoteSnapshot, RemoteSnapshotFile};
use remote::{Limiter, Remote};
use upload::{LocalCheckpoint, Source, Uploaded};

use crate::store::published::{Published, Role};

/// How long a pending marker protects an upload's files from garbage
/// collection; an upload that takes half of it writes no manifest.
pub(crate) const PENDING_STALE: Duration = Duration::from_secs(3600);

/// Snapshots of an application's stores in object storage
/// ([`AppBuilder::snapshots`](crate::AppBuilder::snapshots)).
///
/// ```
/// use std::time::Duration;
/// let snapshots = kstate::SnapshotConfig::new("s3://my-bucket/kstate")
///     .option("aws_endpoint", "http://127.0.0.1:9000")
///     .interval(Duration::from_secs(600))
///     .retain(3);
/// ```
#[derive(Clone)]
pub struct SnapshotConfig {
    pub(crate) url: String,
    pub(crate) options: Vec<(String, String)>,
    pub(crate) interval: Duration,
    pub(crate) retain: usize,
    pub(crate) parallel_transfers: usize,
    pub(crate) bytes_per_second: Option<u64>,
    pub(crate) seed: bool,
}

impl std::fmt::Debug for SnapshotConfig {
    /// Option values that may be credentials (keys naming a secret, key,
    /// token or password) are not shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let options = redacted(&self.options);
        f.debug_struct("SnapshotConfig")
            .field("url", &self.url)
            .field("options", &options)
            .field("interval", &self.interval)
            .field("retain", &self.retain)
            .field("parallel_transfers", &self.parallel_transfers)
            .field("bytes_per_second", &self.bytes_per_second)
            .field("seed", &self.seed)
            .finish()
    }
}

pub(crate) use crate::store::objects::redacted;

impl SnapshotConfig {
    /// Snapshots to `url`: `s3://bucket/prefix` (S3, and S3-compatible
    /// servers such as MinIO, Ceph or R2 with the `aws_endpoint` option),
    /// `gs://bucket/prefix`, `az://container/prefix`, or
    /// `file:///absolute/dir` (a local or mounted directory). Credentials
    /// come from the environment as for each cloud's own tools
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    /// `AWS_ENDPOINT`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`,
    /// ...) or from [`option`](Self::option). `s3://` needs kstate's `s3`
    /// Cargo feature, `gs://` `gcs`, `az://` `azure` (without it, `build`
    /// returns [`Error::Config`](crate::Error::Config) naming it);
    /// `file://` needs none.
    pub fn new(url: impl Into<String>) -> Self {
        SnapshotConfig {
            url: url.into(),
            options: Vec::new(),
            interval: Duration::from_secs(600),
            retain: 3,
            parallel_transfers: 4,
            bytes_per_second: None,
            seed: true,
        }
    }

    /// A setting of the object store's builder, by its configuration key
    /// (`aws_endpoint`, `aws_allow_http`, `aws_region`,
    /// `aws_access_key_id`, `google_service_account`, ...); it wins over the
    /// environment. An unknown key is an `Error::Config` from `build`.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((key.into(), value.into()));
        self
    }

    /// How often each active store partition whose state changed is
    /// snapshotted (default 10 minutes; at least 1 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Snapshots kept per store partition, newest first (default 3; at least 1).
    pub fn retain(mut self, n: usize) -> Self {
        self.retain = n;
        self
    }

    /// Files transferred at once (default 4).
    pub fn parallel_transfers(mut self, n: usize) -> Self {
        self.parallel_transfers = n;
        self
    }

    /// A limit on the bytes per second all uploads and downloads of this
    /// instance move together (default: none).
    pub fn max_bytes_per_second(mut self, bytes: u64) -> Self {
        self.bytes_per_second = Some(bytes);
        self
    }

    /// Whether a store partition with no local state is seeded from the
    /// newest usable snapshot before its restore (default true).
    pub fn seed_stores(mut self, enabled: bool) -> Self {
        self.seed = enabled;
        self
    }

    /// Checks the settings and that the URL names a store this build can
    /// open (no request is made).
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        if self.interval < Duration::from_secs(1) {
            return Err(format!(
                "snapshot interval {:?} is below 1 s",
                self.interval
            ));
        }
        if self.retain == 0 {
            return Err("snapshots retain must be at least 1".into());
        }
        if self.parallel_transfers == 0 {
            return Err("snapshot parallel_transfers must be at least 1".into());
        }
        if self.bytes_per_second == Some(0) {
            return Err("snapshot max_bytes_per_second must be above 0".into());
        }
        Remote::open(&self.url, &self.options).map(|_| ())
    }
}

/// Metric names (the table in `crate::metrics`).
mod names {
    pub(super) use crate::metrics::{
        SNAPSHOTS as TAKEN, SNAPSHOT_AGE as AGE, SNAPSHOT_DELTA_BYTES as DELTA_BYTES, SNAPSHOT_FILES as FILES,
        SNAPSHOT_FULL_BYTES as FULL_BYTES, SNAPSHOT_SECONDS as SECONDS, SNAPSHOT_SEEDS as SEEDS, SNAPSHOT_SEED_RATE as SEED_BYTES_PER_SEC,
    };
}

/// The snapshot service of one running application (shared by the opener
/// threads that seed and the `kstate-snapshots` thread that uploads).
pub(crate) struct Snapshots {
    pub(crate) remote: Remote,
    pub(crate) config: SnapshotConfig,
    pub(crate) app: String,
    pub(crate) limiter: Limiter,
    rt: Option<tokio::runtime::Runtime>,
    /// What each local database uploaded, by (store, partition).
    uploaded: Mutex<HashMap<(String, i32), Uploaded>>,
    /// Each store partition's last snapshot and attempt here.
    last: Mutex<HashMap<(String, i32), Due>>,
    /// Set to ask for a round now; `stop` ends the thread.
    wake: Arc<(Mutex<Wake>, Condvar)>,
}

/// When a store partition was last snapshotted and tried, here.
#[derive(Debug, Clone, Copy, Default)]
struct Due {
    /// The checkpoint of its last snapshot.
    checkpoint: Option<i64>,
    /// The last attempt (a snapshot, nothing changed, or a failure).
    attempted: Option<Instant>,
    /// The last complete snapshot.
    snapshotted: Option<Instant>,
}

#[derive(Default)]
struct Wake {
    now: bool,
    stop: bool,
}

impl Drop for Snapshots {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A handle that asks the running application for a snapshot of every
/// active store partition now ([`App::snapshot_handle`](crate::App::snapshot_handle)).
#[derive(Clone, Default)]
pub struct SnapshotHandle {
    wake: Arc<(Mutex<Wake>, Condvar)>,
}

impl SnapshotHandle {
    /// Asks for a snapshot round now (it does nothing without
    /// [`AppBuilder::snapshots`](crate::AppBuilder::snapshots)).
    pub fn snapshot_now(&self) {
        let (lock, cv) = &*self.wake;
        lock.lock().unwrap_or_else(|p| p.into_inner()).now = true;
        cv.notify_all();
    }
}

impl std::fmt::Debug for SnapshotHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotHandle")
    }
}

/// One store partition to snapshot, as the runtime describes it.
#[derive(Clone)]
pub(crate) struct StoreInfo {
    pub(crate) name: String,
    pub(crate) schema_version: u32,
    pub(crate) definition: String,
    pub(crate) changelog_topic: String,
}

impl Snapshots {
    /// Opens the service (no request made yet).
    pub(crate) fn new(
        config: SnapshotConfig,
        app: &str,
        handle: &SnapshotHandle,
    ) -> std::result::Result<Snapshots, String> {
        let remote = Remote::open(&config.url, &config.options)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kstate-snapshot-io")
            .enable_all()
            .build()
            .map_err(|e| format!("snapshot I/O runtime: {e}"))?;
        Ok(Snapshots {
            remote,
            limiter: Limiter::new(config.bytes_per_second),
            config,
            app: app.to_string(),
            rt: Some(rt),
            uploaded: Mutex::default(),
            last: Mutex::default(),
            wake: handle.wake.clone(),
        })
    }

    /// Runs a future on the service's I/O runtime from a plain thread.
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.as_ref().expect("snapshot runtime").block_on(f)
    }

    /// [`Snapshots::block_on`], given up (`None`) as soon as the thread is
    /// asked to stop: a shutdown never waits for an upload.
    fn block_on_unless_stopped<F: std::future::Future>(&self, f: F) -> Option<F::Output> {
        let wake = self.wake.clone();
        self.block_on(async move {
            let stopped = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if wake.0.lock().unwrap_or_else(|p| p.into_inner()).stop {
                        break;
                    }
                }
            };
            tokio::select! {
                out = f => Some(out),
                () = stopped => None,
            }
        })
    }

    /// Keeps what a database uploaded, in memory and beside the database
    /// in `partition_dir`.
    pub(crate) fn remember_uploaded(&self, store: &str, partition: i32, uploaded: Uploaded, partition_dir: &Path) {
        uploaded.save(partition_dir);
        self.uploaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((store.to_string(), partition), uploaded);
    }

    /// Seeds a store partition's database directory if it has none (see
    /// [`Snapshots::seed`]); logs what it did.
    pub(crate) fn seed_dir(
        &self,
        (store, partition, schema_version, in_memory): (&str, i32, u32, bool),
        db_dir: &Path,
        changelog: impl FnOnce() -> std::result::Result<
            crate::restore::checkpoint::ChangelogState,
            String,
        >,
    ) -> crate::store::Seeded {
        if !self.config.seed {
            return crate::store::Seeded::default();
        }
        // Local state that exists is kept unless the changelog cannot
        // continue it (the restore's own checks); then a usable snapshot
        // replaces it, else the restore wipes it for a full replay.
        let local = if db_dir.join("CURRENT").is_file() || db_dir.join(crate::store::engine::HEAP_FILE).is_file() {
            match upload::read_meta(db_dir) {
                Ok(Some(meta)) => Some(crate::restore::LocalCheckpoint {
                    checkpoint: Some(meta.checkpoint),
                    topic_id: meta.topic_id,
                    appended_after_ms: meta.appended_after_ms,
                }),
                // Nothing committed, or unreadable: the open and the restore decide.
                Ok(None) | Err(_) => return crate::store::Seeded::default(),
            }
        } else {
            None
        };
        if local.is_none() && db_dir.exists() {
            // A directory without a database (a creation cut short): nothing to keep.
            if let Err(e) = std::fs::remove_dir_all(db_dir) {
                tracing::warn!(store, partition, error = %e, "cannot clear an empty database directory; no snapshot used");
                return crate::store::Seeded::default();
            }
        }
        let changelog = match changelog() {
            Ok(c) => c,
            Err(why) => {
                tracing::warn!(store, partition, reason = %why, "the changelog could not be described; no snapshot used, a full restore follows");
                metrics::counter!(names::SEEDS, "result" => "skipped").increment(1);
                return crate::store::Seeded {
                    seed: None,
                    skipped: vec![format!("the changelog could not be described: {why}")],
                };
            }
        };
        if let Some(local) = &local {
            match crate::restore::full_restore_reason(local, &changelog, crate::store::engine::now_ms()) {
                None => return crate::store::Seeded::default(),
                Some((why, _)) => tracing::info!(store, partition, reason = %why,
                    "local state cannot be continued from the changelog; looking for a snapshot to replace it"),
            }
        }
        let Some(seeded) = self.block_on_unless_stopped(self.seed((store, partition, in_memory), db_dir, &changelog, schema_version)) else {
            return crate::store::Seeded { seed: None, skipped: vec!["the application is stopping".into()] };
        };
        for why in &seeded.skipped {
            tracing::warn!(store, partition, reason = %why, "snapshot not used");
        }
        match &seeded.seed {
            Some(s) => {
                let rate = s.bytes as f64 / s.download.as_secs_f64().max(1e-6);
                tracing::info!(store, partition, snapshot = %s.snapshot_id, checkpoint = s.checkpoint, bytes = s.bytes,
                    files = s.files, took = ?s.download, "store seeded from a snapshot; the restore replays the changelog past its checkpoint");
                metrics::counter!(names::SEEDS, "result" => "seeded").increment(1);
                metrics::gauge!(names::SEED_BYTES_PER_SEC, "store" => store.to_string(), "partition" => partition.to_string()).set(rate);
            }
            None => {
                metrics::counter!(names::SEEDS, "result" => if seeded.skipped.is_empty() { "none" } else { "skipped" }).increment(1);
            }
        }
        seeded
    }

    /// Snapshots every active store partition whose checkpoint moved since
    /// its last snapshot and whose interval passed (all of them when
    /// `now`). Returns how many were taken.
    pub(crate) fn round(
        &self,
        stores: &[StoreInfo],
        published: &Published,
        scratch_root: &Path,
        now: bool,
    ) -> usize {
        let mut taken = 0;
        for store in stores {
            for (partition, slot) in published.slots_of(&store.name) {
                if self.wake.0.lock().unwrap_or_else(|p| p.into_inner()).stop {
                    return taken;
                }
                if slot.role() != Role::Active {
                    continue;
                }
                let key = (store.name.clone(), partition);
                let due = self.last.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied().unwrap_or_default();
                // Every interval, whatever the last attempt gave (a failure
                // is retried at the next interval, not in a loop).
                if !now && due.attempted.is_some_and(|at| at.elapsed() < self.config.interval) {
                    continue;
                }
                let result = self.snapshot_one(store, partition, &slot, scratch_root, due.checkpoint);
                let mut next = Due { attempted: Some(Instant::now()), ..due };
                match result {
                    Ok(Some(checkpoint)) => {
                        taken += 1;
                        next.checkpoint = Some(checkpoint);
                        next.snapshotted = Some(Instant::now());
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(store = %store.name, partition, error = %e, "snapshot failed; the next interval tries again");
                        metrics::counter!(names::TAKEN, "result" => "failed").increment(1);
                    }
                }
                self.last.lock().unwrap_or_else(|p| p.into_inner()).insert(key, next);
            }
        }
        taken
    }

    /// Takes and uploads one snapshot; `Ok(None)` when nothing changed
    /// since `last_checkpoint` or the store is not open here.
    fn snapshot_one(
        &self,
        store: &StoreInfo,
        partition: i32,
        slot: &crate::store::published::Slot,
        scratch_root: &Path,
        last_checkpoint: Option<i64>,
    ) -> std::result::Result<Option<i64>, String> {
        let scratch = self.scratch(scratch_root, &store.name, partition);
        let Some(taken) = Self::checkpoint(slot, &scratch, last_checkpoint)? else { return Ok(None) };
        Ok(self.upload_checkpoint(store, partition, &scratch, taken, None)?.map(|t| t.manifest.checkpoint))
    }

    /// A fresh scratch directory name for a checkpoint of a store partition.
    fn scratch(&self, scratch_root: &Path, store: &str, partition: i32) -> LocalCheckpoint {
        LocalCheckpoint(scratch_root.join(store).join(format!("{partition}.snapshot-{}", manifest::new_id())))
    }

    /// Takes a RocksDB checkpoint of the published store into `scratch`:
    /// its database id and partition directory; `None` when the store is
    /// not open here or its checkpoint is still `last_checkpoint`.
    fn checkpoint(
        slot: &crate::store::published::Slot,
        scratch: &LocalCheckpoint,
        last_checkpoint: Option<i64>,
    ) -> std::result::Result<Option<(String, PathBuf)>, String> {
        // Only the checkpoint call holds the store (like a read; a closing
        // store waits for it on its closing thread, see Slot::retire).
        let taken = slot.with_engine(|engine| -> crate::error::Result<Option<(String, PathBuf)>> {
            if let (crate::store::engine::Checkpoint::At(c), Some(last)) =
                (engine.checkpoint()?, last_checkpoint)
            {
                if c == last {
                    return Ok(None);
                }
            }
            let identity = upload::database_id(engine.path());
            if let Some(parent) = scratch.0.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| crate::error::Error::io("snapshot scratch dir", e))?;
            }
            engine.create_checkpoint(&scratch.0)?;
            let partition_dir = engine.path().parent().map(Path::to_path_buf).unwrap_or_default();
            Ok(Some((identity, partition_dir)))
        });
        match taken {
            None => Ok(None),
            Some(Err(e)) => Err(format!("checkpoint: {e}")),
            Some(Ok(taken)) => Ok(taken),
        }
    }

    /// Uploads a checkpoint taken by [`Snapshots::checkpoint`] (as part of
    /// `savepoint`, if given), then collects old snapshots; `None` when
    /// the checkpoint holds nothing committed.
    fn upload_checkpoint(
        &self,
        store: &StoreInfo,
        partition: i32,
        scratch: &LocalCheckpoint,
        (identity, partition_dir): (String, PathBuf),
        savepoint: Option<&str>,
    ) -> std::result::Result<Option<upload::Taken>, String> {
        let Some(meta) =
            upload::read_meta(&scratch.0).map_err(|e| format!("reading the checkpoint: {e}"))?
        else {
            return Ok(None);
        };
        let checkpoint = meta.checkpoint;
        let key = (store.name.clone(), partition);
        let known = self
            .uploaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let uploaded = match known.filter(|u| !identity.is_empty() && u.identity == identity) {
            Some(u) => u,
            None => Uploaded::load(&partition_dir, &identity).unwrap_or_else(|| Uploaded {
                identity: identity.clone(),
                uid: manifest::new_id(),
                files: HashMap::new(),
            }),
        };
        let src = Source {
            store: &store.name,
            partition,
            definition: store.definition.clone(),
            changelog_topic: store.changelog_topic.clone(),
            dir: &scratch.0,
            meta,
            uploaded,
            schema_version: store.schema_version,
            savepoint: savepoint.map(str::to_string),
        };
        let Some(result) = self.block_on_unless_stopped(self.upload(src)) else {
            return Err("stopped while uploading".into());
        };
        let (taken, uploaded) = result.map_err(|e| e.to_string())?;
        self.remember_uploaded(&store.name, partition, uploaded, &partition_dir);
        let labels = [
            ("store", store.name.clone()),
            ("partition", partition.to_string()),
        ];
        metrics::counter!(names::TAKEN, "result" => "ok").increment(1);
        metrics::histogram!(names::SECONDS).record(taken.took.as_secs_f64());
        metrics::gauge!(names::DELTA_BYTES, &labels).set(taken.uploaded_bytes as f64);
        metrics::gauge!(names::FULL_BYTES, &labels).set(taken.manifest.bytes() as f64);
        metrics::gauge!(names::FILES, &labels).set(taken.manifest.files.len() as f64);
        metrics::gauge!(names::AGE, &labels).set(0.0);
        tracing::info!(store = %store.name, partition, snapshot = %taken.manifest.id, checkpoint, savepoint,
            uploaded_bytes = taken.uploaded_bytes, uploaded_files = taken.uploaded_files,
            full_bytes = taken.manifest.bytes(), files = taken.manifest.files.len(), took = ?taken.took, "snapshot taken");
        let dir = self.dir_of(&store.name, partition);
        match self.block_on_unless_stopped(gc::collect(
            &self.remote,
            &dir,
            self.config.retain,
            &HashSet::new(),
            crate::store::engine::now_ms(),
        )) {
            None => {}
            Some(Ok(r)) if r.files_deleted + r.manifests_deleted > 0 => {
                tracing::debug!(store = %store.name, partition, manifests = r.manifests_deleted, files = r.files_deleted, "old snapshots deleted")
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(store = %store.name, partition, error = %e, "deleting old snapshots failed; the next snapshot tries again")
            }
        }
        Ok(Some(taken))
    }

    /// Lists the application's folder once, so that a wrong URL, bucket or
    /// credentials show in the log at startup, not only at the first snapshot.
    fn check_reachable(&self) {
        let dir = self.remote.app_dir(&self.app);
        let listed = self.block_on_unless_stopped(async {
            tokio::time::timeout(Duration::from_secs(30), self.remote.list(&dir)).await
        });
        match listed {
            None => {}
            Some(Ok(Ok(objects))) => {
                tracing::info!(url = %self.remote.url, objects = objects.len(), "snapshot store reachable")
            }
            Some(Ok(Err(e))) => tracing::error!(url = %self.remote.url, error = %e,
                "snapshot store unusable (URL, bucket, credentials?); processing goes on without snapshots, and stores without local state restore in full"),
            Some(Err(_)) => {
                tracing::error!(url = %self.remote.url, "snapshot store did not answer within 30 s; processing goes on, snapshots are retried")
            }
        }
    }

    /// Updates the age gauge of every store partition snapshotted here.
    fn report_ages(&self, published: &Published) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.retain(|(store, partition), due| {
            let gauge = metrics::gauge!(names::AGE, "store" => store.clone(), "partition" => partition.to_string());
            // A partition no longer active here: its new owner reports it.
            if published.find(store, *partition).is_none_or(|slot| slot.role() != Role::Active) {
                gauge.set(0.0);
                return false;
            }
            if let Some(at) = due.snapshotted {
                gauge.set(at.elapsed().as_secs_f64());
            }
            true
        });
    }
}

/// The `kstate-snapshots` thread: a round every second checks which store
/// partitions are due; [`SnapshotHandle::snapshot_now`] runs one at once.
/// Stopped (and joined) when dropped.
pub(crate) struct SnapshotThread {
    wake: Arc<(Mutex<Wake>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SnapshotThread {
    pub(crate) fn start(
        service: Arc<Snapshots>,
        stores: Vec<StoreInfo>,
        published: Arc<Published>,
        scratch_root: PathBuf,
        mut cuts: savepoint::CutContext,
    ) -> crate::error::Result<SnapshotThread> {
        let wake = service.wake.clone();
        {
            let mut w = wake.0.lock().unwrap_or_else(|p| p.into_inner());
            w.stop = false;
        }
        // Leftovers of a process that died mid-snapshot.
        for store in &stores {
            for name in crate::store::state_dir::subdirs(&scratch_root.join(&store.name)) {
                if name.contains(".snapshot-") {
                    let _ = std::fs::remove_dir_all(scratch_root.join(&store.name).join(name));
                }
            }
        }
        let w = wake.clone();
        let thread = std::thread::Builder::new()
            .name("kstate-snapshots".into())
            .spawn(move || {
                service.check_reachable();
                loop {
                    let now = {
                        let (lock, cv) = &*w;
                        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
                        if !g.stop && !g.now {
                            g = cv
                                .wait_timeout(g, Duration::from_secs(1))
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                        if g.stop {
                            return;
                        }
                        std::mem::take(&mut g.now)
                    };
                    service.round(&stores, &published, &scratch_root, now);
                    service.savepoint_round(&stores, &published, &scratch_root, &mut cuts);
                    service.report_ages(&published);
                }
            })
            .map_err(|e| crate::error::Error::io("kstate-snapshots thread", e))?;
        Ok(SnapshotThread {
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for SnapshotThread {
    fn drop(&mut self) {
        let (lock, cv) = &*self.wake;
        lock.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
