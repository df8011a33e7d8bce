//! A store partition kept in object storage: one SlateDB database (an LSM
//! tree whose files live in an object store) per (store, partition), under
//! `<url path>/<application id>/<store>/<partition>/` (docs/architecture.md §22).
//!
//! - **The changelog stays the log.** SlateDB's own write-ahead log is
//!   off: a commit's data and checkpoint go into the memtable in one
//!   atomic batch, and a memtable reaches object storage as one table file
//!   whose manifest update lands whole or not at all. The durable state is
//!   therefore always a prefix of the changelog, with its checkpoint;
//!   opening a store replays the changelog past it (the tail only).
//! - **One writer.** Opening a database raises its writer epoch in the
//!   manifest: every earlier writer is fenced. A fenced writer's memtable
//!   never lands (its manifest update fails), and its next write or flush
//!   fails with [`RemoteFailure::Fenced`].
//! - **A cache, bounded.** Blocks, indexes and filters read from object
//!   storage are kept in one in-memory cache shared by every remote store
//!   partition of the instance (`RemoteStateConfig::cache_bytes`).
//! - **Standbys read, never write.** A standby task's store partition
//!   opens a reader ([`RemoteDb::open_follower`]): it follows the
//!   changelog as any standby does, but instead of writing, it reads the
//!   keys the changelog changes through the instance's caches, so that
//!   they are warm when the task is promoted (then it opens a writer, as
//!   any new owner). It keeps its followed checkpoint in memory.
//! - **Data and meta keys share one key space**, told apart by a first
//!   byte: [`DATA`] for the store's keys, [`META`] for the checkpoint and
//!   the other bookkeeping RocksDB keeps in its meta column family.
//!
//! SlateDB is asynchronous; the engine is not. Every call runs on this
//! instance's remote runtime (a small tokio runtime of its own) and the
//! calling thread waits for it, up to `RemoteStateConfig::timeout`: an
//! object store that stays away that long turns into
//! [`RemoteFailure::Unavailable`] (the task fails and is re-opened, as any
//! store fault).

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::ObjectStore;
use slatedb::config::{FlushOptions, FlushType, Settings};
use slatedb::db_cache::moka::{MokaCache, MokaCacheOptions};
use slatedb::db_cache::DbCache;
use slatedb::{Db, DbIterator, DbReader, DbSnapshot, ErrorKind};

/// A point-in-time view of a remote database.
pub(crate) type Snapshot = DbSnapshot;

/// A key range with owned bounds.
type KeyRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);


use super::counted::{Counted, CountedCache};
use super::Durable;
use crate::error::{Error, RemoteFailure, Result};

/// First byte of a store's own keys.
pub(crate) const DATA: u8 = b'd';
/// First byte of a meta key (checkpoint, topic id, schema, segments).
pub(crate) const META: u8 = b'm';

/// A call to object storage waiting this long is logged as a pause.
const PAUSE_LOGGED_AFTER: Duration = Duration::from_secs(5);

/// Keys a prefetch reads at once.
const PREFETCH_PARALLEL: usize = 32;

/// Reads a follower has in flight at most to warm the caches; the keys of
/// a changelog batch past it are not read (warming is best effort).
const WARM_IN_FLIGHT: usize = 4096;

/// Entries a scan fetches per round trip to the remote runtime.
const SCAN_CHUNK: usize = 512;

/// What every remote store partition of one instance shares: the object
/// store, the runtime its calls run on, the block cache and the settings.
pub(crate) struct RemoteState {
    /// `Some` until dropped.
    runtime: Option<tokio::runtime::Runtime>,
    store: Arc<dyn ObjectStore>,
    /// `<url path>/<application id>`.
    root: StorePath,
    url: String,
    cache: Arc<dyn DbCache>,
    flush_interval: Duration,
    timeout: Duration,
    memtable_bytes: usize,
    /// `<state_dir>/<application_id>/.remote-cache`, and each store
    /// partition's bound there (0: no disk cache).
    disk_cache: (std::path::PathBuf, u64),
}

impl std::fmt::Debug for RemoteState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteState").field("url", &self.url).field("root", &self.root).finish()
    }
}

/// The settings [`RemoteState::start`] takes (from `RemoteStateConfig`).
pub(crate) struct RemoteSettings<'a> {
    pub(crate) url: &'a str,
    pub(crate) options: &'a [(String, String)],
    pub(crate) application_id: &'a str,
    pub(crate) cache_bytes: usize,
    pub(crate) flush_interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) memtable_bytes: usize,
    /// Where each store partition keeps table files on local disk, and how
    /// many bytes at most (0: none).
    pub(crate) disk_cache: (std::path::PathBuf, u64),
    /// Added before every request (benchmarks; zero otherwise).
    pub(crate) simulated_latency: Duration,
}

impl RemoteState {
    /// Opens the object store the URL names and checks that it answers
    /// (one LIST under the application's folder): a URL, bucket or
    /// credentials that do not work fail here, before anything runs.
    pub(crate) fn start(s: RemoteSettings<'_>) -> Result<Arc<RemoteState>> {
        let (opened, url_path) = crate::store::objects::open_url("remote state", s.url, s.options).map_err(Error::Config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kstate-remote")
            .enable_all()
            .build()
            .map_err(|e| Error::io("kstate-remote runtime", e))?;
        let mut inner = opened;
        if !s.simulated_latency.is_zero() {
            let l = s.simulated_latency;
            let config = object_store::throttle::ThrottleConfig {
                wait_get_per_call: l,
                wait_put_per_call: l,
                wait_list_per_call: l,
                wait_list_with_delimiter_per_call: l,
                wait_delete_per_call: l,
                ..Default::default()
            };
            inner = Arc::new(object_store::throttle::ThrottledStore::new(inner, config));
        }
        let store: Arc<dyn ObjectStore> = Arc::new(Counted::new(inner));
        let root = url_path.join(s.application_id);
        let state = RemoteState {
            runtime: Some(runtime),
            store,
            root,
            url: s.url.to_string(),
            cache: Arc::new(CountedCache::new(Arc::new(MokaCache::new_with_opts(MokaCacheOptions {
                max_capacity: s.cache_bytes as u64,
                ..Default::default()
            })))),
            flush_interval: s.flush_interval,
            timeout: s.timeout,
            memtable_bytes: s.memtable_bytes,
            disk_cache: s.disk_cache,
        };
        let (store, root) = (state.store.clone(), state.root.clone());
        state
            .run(async move {
                use futures::StreamExt;
                let mut listing = store.list(Some(&root));
                match listing.next().await {
                    Some(Err(e)) => Err(e),
                    _ => Ok(()),
                }
            })
            .map_err(|()| Error::RemoteStore {
                store: String::new(),
                partition: -1,
                kind: RemoteFailure::Unavailable,
                detail: format!("remote state `{}` did not answer a listing within the timeout ({:?})", s.url, s.timeout),
            })?
            .map_err(|e| Error::RemoteStore {
                store: String::new(),
                partition: -1,
                kind: classify_object_store(&e),
                detail: format!("remote state `{}` refused a listing: {e}", s.url),
            })?;
        tracing::info!(url = %s.url, "remote state reachable");
        Ok(Arc::new(state))
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives as long as the state")
    }

    /// How long a committing remote store goes without a memtable flush.
    pub(crate) fn flush_interval(&self) -> Duration {
        self.flush_interval
    }

    /// Runs `fut` on the remote runtime and waits for it, at most
    /// `timeout` (`Err(())`: it took longer, and was dropped).
    /// A call that waits longer than [`PAUSE_LOGGED_AFTER`] is logged
    /// (once) and counted in `kstate_remote_waiting`, until it ends.
    fn run<T: Send + 'static>(&self, fut: impl std::future::Future<Output = T> + Send + 'static) -> std::result::Result<T, ()> {
        let timeout = self.timeout;
        let url = self.url.clone();
        let handle = self.runtime().spawn(async move {
            let fut = std::pin::pin!(fut);
            let mut fut = fut;
            if let Ok(v) = tokio::time::timeout(PAUSE_LOGGED_AFTER.min(timeout), &mut fut).await {
                return Ok(v);
            }
            tracing::warn!(url = %url, timeout = ?timeout, "remote state: object storage has not answered for {PAUSE_LOGGED_AFTER:?}; processing waits for it");
            let waiting = metrics::gauge!(crate::metrics::REMOTE_WAITING);
            waiting.increment(1.0);
            let started = Instant::now();
            let done = tokio::time::timeout(timeout.saturating_sub(PAUSE_LOGGED_AFTER), fut).await;
            waiting.decrement(1.0);
            match &done {
                Ok(_) => tracing::info!(url = %url, waited = ?(started.elapsed() + PAUSE_LOGGED_AFTER), "remote state: object storage answered again"),
                Err(_) => tracing::error!(url = %url, ?timeout, "remote state: object storage did not answer within the timeout; the call fails"),
            }
            done.map_err(|_| ())
        });
        match futures::executor::block_on(handle) {
            Ok(done) => done,
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }

    /// [`RemoteState::run`], but first polled once on the calling thread
    /// (inside the runtime's context): a read the memtable or the cache
    /// answers is done without the hop to the runtime and back, the common
    /// case after a prefetch. A future that is not ready goes on on the
    /// runtime, from where it stands.
    fn run_quick<T: Send + 'static>(&self, fut: impl std::future::Future<Output = T> + Send + 'static) -> std::result::Result<T, ()> {
        let mut fut = Box::pin(fut);
        {
            let _context = self.runtime().enter();
            let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
            if let std::task::Poll::Ready(v) = std::future::Future::poll(fut.as_mut(), &mut cx) {
                return Ok(v);
            }
        }
        self.run(fut)
    }

    /// The local disk cache of one store partition: the table files it
    /// writes and those it reads, up to its bound (none if that is 0).
    fn disk_cache_options(&self, store: &str, partition: i32) -> slatedb::config::ObjectStoreCacheOptions {
        let (root, bytes) = &self.disk_cache;
        if *bytes == 0 {
            return Default::default();
        }
        slatedb::config::ObjectStoreCacheOptions {
            root_folder: Some(root.join(store).join(partition.to_string())),
            max_cache_size_bytes: Some(usize::try_from(*bytes).unwrap_or(usize::MAX)),
            // Parts small enough that a block read does not fetch megabytes.
            part_size_bytes: 64 << 10,
            cache_on_flush: true,
            cache_on_compaction: true,
            scan_interval: Some(Duration::from_secs(60)),
            ..Default::default()
        }
    }

    /// The folder of one store partition's database.
    pub(crate) fn db_path(&self, store: &str, partition: i32) -> StorePath {
        self.root.clone().join(store).join(partition.to_string())
    }
}

impl Drop for RemoteState {
    /// Without waiting for tasks still running (a background flush of a
    /// closed store): dropping a runtime that waits would block, and is
    /// refused on an async thread.
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The id of a store partition's entries in the shared memory cache: the
/// same for its writer and a standby's reader on this instance, and for a
/// writer opened again, so that what one read stays warm for the next.
fn cache_id(store: &str, partition: i32) -> u64 {
    // FNV-1a: stable across runs and builds.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in store.bytes().chain([0]).chain(partition.to_be_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Which failure an object store error is.
fn classify_object_store(e: &object_store::Error) -> RemoteFailure {
    match e {
        object_store::Error::NotFound { .. } => RemoteFailure::Corrupt,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => RemoteFailure::Refused,
        _ => RemoteFailure::Unavailable,
    }
}

/// How a store partition's database is open.
#[derive(Clone)]
enum Handle {
    /// The owner's: reads and writes (every earlier writer fenced).
    Writer(Arc<Db>),
    /// A standby's: reads what the owner flushed, writes nothing.
    Reader(Arc<DbReader>),
}

impl Handle {
    async fn get(&self, key: Vec<u8>) -> std::result::Result<Option<Bytes>, slatedb::Error> {
        match self {
            Handle::Writer(db) => db.get(key).await,
            Handle::Reader(db) => db.get(key).await,
        }
    }

    async fn scan(&self, range: KeyRange) -> std::result::Result<DbIterator, slatedb::Error> {
        match self {
            Handle::Writer(db) => db.scan(range).await,
            Handle::Reader(db) => db.scan(range).await,
        }
    }

    fn writer(&self) -> Option<&Arc<Db>> {
        match self {
            Handle::Writer(db) => Some(db),
            Handle::Reader(_) => None,
        }
    }
}

/// What a follower (a standby's reader) followed of the changelog: the
/// meta keys it would have written (its checkpoint among them), held in
/// memory in front of what the reader sees.
#[derive(Default)]
struct Followed {
    meta: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Wiped before a full replay: the reader's meta keys no longer count.
    wiped: bool,
}

/// One store partition's remote database: open for writing (an active
/// task) or for reading (a standby task, [`RemoteDb::open_follower`]).
pub(crate) struct RemoteDb {
    db: Handle,
    state: Arc<RemoteState>,
    store: String,
    partition: i32,
    closed: std::sync::atomic::AtomicBool,
    /// A follower's: `Some`.
    followed: Option<std::sync::Mutex<Followed>>,
    /// A follower's reads in flight to warm the caches.
    warming: Arc<std::sync::atomic::AtomicUsize>,
    /// A follower's reads made to warm the caches.
    warmed: std::sync::atomic::AtomicU64,
}

impl RemoteDb {
    /// Opens (or creates) the database of `store`'s `partition`, fencing
    /// any earlier writer.
    pub(crate) fn open(state: &Arc<RemoteState>, store: &str, partition: i32) -> Result<RemoteDb> {
        let started = Instant::now();
        let path = state.db_path(store, partition);
        let settings = Settings {
            // The changelog is the log. (SlateDB's `flush_interval` paces
            // its WAL only; memtables are flushed when full, and by time
            // through `Engine::commit_bounded`'s `flush_opt`.)
            wal_enabled: false,
            l0_sst_size_bytes: state.memtable_bytes,
            // Writes wait (then time out) past this much not yet in object storage.
            max_unflushed_bytes: state.memtable_bytes.saturating_mul(4),
            manifest_poll_interval: Duration::from_secs(5),
            object_store_max_retries: None,
            object_store_cache_options: state.disk_cache_options(store, partition),
            ..Settings::default()
        };
        let builder = Db::builder(path.clone(), state.store.clone())
            .with_settings(settings)
            .with_db_cache(state.cache.clone(), cache_id(store, partition));
        let opened = state.run(builder.build());
        let db = remote_result(opened, store, partition, "open")?;
        let opened_in = started.elapsed();
        metrics::histogram!(crate::metrics::REMOTE_OPEN_SECONDS, "store" => store.to_string()).record(opened_in.as_secs_f64());
        tracing::info!(store, partition, path = %path, seconds = opened_in.as_secs_f64(), "remote store opened (earlier writers fenced)");
        Ok(RemoteDb::with(Handle::Writer(Arc::new(db)), state, store, partition))
    }

    /// Opens the database of `store`'s `partition` for a standby task: a
    /// reader of what the owner flushed (the owner is not fenced, nothing
    /// is written to object storage), sharing the instance's memory cache
    /// and the partition's disk cache with the writer this instance opens
    /// if the task is promoted here. A database that does not exist yet
    /// (its owner has not opened it) fails the open; the standby is
    /// opened again after a pause, as any standby whose open failed.
    pub(crate) fn open_follower(state: &Arc<RemoteState>, store: &str, partition: i32) -> Result<RemoteDb> {
        let started = Instant::now();
        let path = state.db_path(store, partition);
        let options = slatedb::config::DbReaderOptions {
            manifest_poll_interval: Duration::from_secs(1),
            skip_wal_replay: true,
            object_store_cache_options: state.disk_cache_options(store, partition),
            ..Default::default()
        };
        let builder = DbReader::builder(path.clone(), state.store.clone())
            .with_options(options)
            // No checkpoint of its own in the manifest: the owner's
            // manifest is never written by a standby. (A read of a table
            // the owner's compaction just deleted fails; warming skips it.)
            .with_reader_mode(slatedb::DbReaderMode::FollowLatest)
            .with_db_cache(state.cache.clone(), cache_id(store, partition));
        let opened = state.run(builder.build());
        let reader = remote_result(opened, store, partition, "open for a standby")?;
        tracing::info!(store, partition, path = %path, seconds = started.elapsed().as_secs_f64(), "remote store opened for a standby (a reader: nothing written, no writer fenced)");
        Ok(RemoteDb::with(Handle::Reader(Arc::new(reader)), state, store, partition))
    }

    /// A database handle as this store partition's (a reader is a follower).
    fn with(db: Handle, state: &Arc<RemoteState>, store: &str, partition: i32) -> RemoteDb {
        let followed = matches!(db, Handle::Reader(_)).then(Default::default);
        RemoteDb {
            db,
            state: state.clone(),
            store: store.to_string(),
            partition,
            closed: Default::default(),
            followed,
            warming: Default::default(),
            warmed: Default::default(),
        }
    }

    /// Whether this is a standby's reader.
    pub(crate) fn is_follower(&self) -> bool {
        self.followed.is_some()
    }

    fn followed(&self) -> Option<std::sync::MutexGuard<'_, Followed>> {
        self.followed.as_ref().map(|f| f.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// A follower's "write": meta keys are kept in memory, data keys are
    /// read in the background (at most [`WARM_IN_FLIGHT`] at once), which
    /// brings the blocks that hold them into the caches.
    fn follow(&self, writes: Vec<(Vec<u8>, Option<Vec<u8>>)>) {
        let mut keys = Vec::new();
        if let Some(mut followed) = self.followed() {
            for (key, value) in writes {
                match key.first() {
                    Some(&META) => {
                        followed.meta.insert(key[1..].to_vec(), value);
                    }
                    _ => keys.push(key),
                }
            }
        }
        let room = WARM_IN_FLIGHT.saturating_sub(self.warming.load(Ordering::Relaxed));
        keys.truncate(room);
        if keys.is_empty() {
            return;
        }
        self.warming.fetch_add(keys.len(), Ordering::Relaxed);
        self.warmed.fetch_add(keys.len() as u64, Ordering::Relaxed);
        metrics::counter!(crate::metrics::REMOTE_STANDBY_READS, "store" => self.store.clone()).increment(keys.len() as u64);
        let (db, warming) = (self.db.clone(), self.warming.clone());
        self.state.runtime().spawn(async move {
            for key in keys {
                let _ = db.get(key).await;
                warming.fetch_sub(1, Ordering::Relaxed);
            }
        });
    }

    fn result<T>(&self, r: std::result::Result<std::result::Result<T, slatedb::Error>, ()>, what: &str) -> Result<T> {
        remote_result(r, &self.store, self.partition, what)
    }

    /// One key's value (`prefix`: [`DATA`] or [`META`]).
    pub(crate) fn get(&self, prefix: u8, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if prefix == META {
            if let Some(followed) = self.followed() {
                match followed.meta.get(key) {
                    Some(v) => return Ok(v.clone()),
                    None if followed.wiped => return Ok(None),
                    None => {}
                }
            }
        }
        let db = self.db.clone();
        let key = prefixed(prefix, key);
        let got = self.state.run_quick(async move { db.get(key).await });
        Ok(self.result(got, "read")?.map(|v| v.to_vec()))
    }

    /// Reads `keys` (data keys) ahead of their use and returns what each
    /// holds (`None`: absent). Up to [`PREFETCH_PARALLEL`] reads are
    /// started on the calling thread (polled once: the memtable or a cache
    /// answers most at once); those still waiting go on on the runtime
    /// with the keys not yet started, at most [`PREFETCH_PARALLEL`] in
    /// flight, so a poll batch's cold reads cost about one object-store
    /// latency per [`PREFETCH_PARALLEL`] keys instead of one per key.
    /// (Every started read stays polled: one left waiting behind the bound
    /// could hold what another needs.) A key whose read failed is left
    /// out: the read that follows meets the error.
    pub(crate) fn prefetch(&self, keys: Vec<Vec<u8>>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        use futures::StreamExt;
        type Read = std::pin::Pin<Box<dyn std::future::Future<Output = (Vec<u8>, std::result::Result<Option<Bytes>, slatedb::Error>)> + Send>>;
        let read = |db: &Handle, key: Vec<u8>| -> Read {
            let db = db.clone();
            Box::pin(async move {
                let got = db.get(prefixed(DATA, &key)).await;
                (key, got)
            })
        };
        let (n, started) = (keys.len(), Instant::now());
        let mut out = Vec::with_capacity(keys.len());
        let mut waiting: Vec<Read> = Vec::new();
        let mut keys = keys.into_iter();
        {
            let _context = self.state.runtime().enter();
            let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
            while waiting.len() < PREFETCH_PARALLEL {
                let Some(key) = keys.next() else { break };
                let mut r = read(&self.db, key);
                match std::future::Future::poll(r.as_mut(), &mut cx) {
                    std::task::Poll::Ready((key, Ok(v))) => out.push((key, v.map(|v| v.to_vec()))),
                    std::task::Poll::Ready((_, Err(_))) => {}
                    std::task::Poll::Pending => waiting.push(r),
                }
            }
        }
        let rest: Vec<Vec<u8>> = keys.collect();
        let waited = waiting.len() + rest.len();
        if waited > 0 {
            let db = self.db.clone();
            let fetched = self.state.run(async move {
                let mut running: futures::stream::FuturesUnordered<Read> = waiting.into_iter().collect();
                let mut rest = rest.into_iter();
                let mut got = Vec::new();
                loop {
                    while running.len() < PREFETCH_PARALLEL {
                        let Some(key) = rest.next() else { break };
                        running.push(read(&db, key));
                    }
                    match running.next().await {
                        Some((key, Ok(v))) => got.push((key, v.map(|v| v.to_vec()))),
                        Some((_, Err(_))) => {}
                        None => break,
                    }
                }
                got
            });
            out.extend(fetched.unwrap_or_default());
        }
        tracing::trace!(store = %self.store, partition = self.partition, keys = n, waited, took = ?started.elapsed(), "remote store: read ahead");
        out
    }

    /// Applies one commit's writes atomically: `puts` (`None`: a delete)
    /// of prefixed keys, after deleting every data key in `ranges`.
    pub(crate) fn write(&self, ranges: &[(Vec<u8>, Vec<u8>)], writes: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        let Some(db) = self.db.writer().cloned() else {
            self.follow(writes);
            return Ok(());
        };
        // SlateDB's batch keeps one write per key, the last one given.
        let mut batch = slatedb::WriteBatch::new();
        for (from, to) in ranges {
            // SlateDB has no range deletion: the keys are read and deleted.
            for entry in self.scan(None, DATA, Bound::Included(from), Bound::Excluded(to)) {
                batch.delete(prefixed(DATA, &entry?.0));
            }
        }
        if ranges.is_empty() && writes.is_empty() {
            return Ok(());
        }
        for (key, value) in writes {
            match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            }
        }
        let written = self.state.run(async move { db.write(batch).await.map(|_| ()) });
        self.result(written, "write")
    }

    /// Deletes every key of the database (a full restore follows), in
    /// batches; the epoch, and so the fencing, stays.
    pub(crate) fn wipe(&self) -> Result<()> {
        if let Some(mut followed) = self.followed() {
            *followed = Followed { wiped: true, ..Default::default() };
            return Ok(());
        }
        let Some(db) = self.db.writer().cloned() else { return Ok(()) };
        for prefix in [DATA, META] {
            loop {
                let keys = self.scan_prefix(prefix, 10_000)?;
                if keys.is_empty() {
                    break;
                }
                let mut batch = slatedb::WriteBatch::new();
                for key in keys {
                    batch.delete(key);
                }
                let db = db.clone();
                let written = self.state.run(async move { db.write(batch).await.map(|_| ()) });
                self.result(written, "wipe")?;
            }
        }
        self.flush(true)
    }

    /// Up to `n` whole keys (prefix included) under `prefix`.
    fn scan_prefix(&self, prefix: u8, n: usize) -> Result<Vec<Bytes>> {
        let db = self.db.clone();
        let range = (Bound::Included(vec![prefix]), Bound::Excluded(vec![prefix + 1]));
        let read = self.state.run(async move {
            let mut it = db.scan(range).await?;
            let mut out = Vec::new();
            while out.len() < n {
                match it.next().await? {
                    Some(kv) => out.push(kv.key),
                    None => break,
                }
            }
            Ok(out)
        });
        self.result(read, "scan")
    }

    /// A point-in-time view: reads of one committed state.
    pub(crate) fn snapshot(&self) -> Result<Arc<DbSnapshot>> {
        let Some(db) = self.db.writer() else {
            return Err(Error::RemoteStore {
                store: self.store.clone(),
                partition: self.partition,
                kind: RemoteFailure::Unavailable,
                detail: "a standby's reader of a remote store serves no reads of committed state".into(),
            });
        };
        db.snapshot().map_err(|e| map_error(e, &self.store, self.partition, "snapshot"))
    }

    /// Reads from `snapshot` (or the database) with this database's runtime.
    pub(crate) fn snapshot_get(&self, snapshot: &Arc<DbSnapshot>, prefix: u8, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let snapshot = snapshot.clone();
        let key = prefixed(prefix, key);
        let got = self.state.run_quick(async move { snapshot.get(key).await });
        Ok(self.result(got, "read")?.map(|v| v.to_vec()))
    }

    /// Meta entries from `from` on, in key order (without their first byte).
    pub(crate) fn scan_meta(&self, from: &[u8]) -> RemoteScan {
        self.scan(None, META, Bound::Included(from), Bound::Unbounded)
    }

    /// Entries of key space `space` ([`DATA`] or [`META`]) within the
    /// bounds in key order, without their first byte, fetched in chunks
    /// (of `snapshot`, if given).
    pub(crate) fn scan(&self, snapshot: Option<Arc<DbSnapshot>>, space: u8, start: Bound<&[u8]>, end: Bound<&[u8]>) -> RemoteScan {
        let range = space_range(space, start, end);
        RemoteScan {
            state: self.state.clone(),
            db: self.db.clone(),
            snapshot,
            store: self.store.clone(),
            partition: self.partition,
            range: Some(range),
            iter: None,
            buffered: std::collections::VecDeque::new(),
            done: false,
        }
    }

    /// Writes the memtable to object storage (`wait`: until it landed;
    /// else in the background, its failure logged).
    pub(crate) fn flush(&self, wait: bool) -> Result<()> {
        let Some(db) = self.db.writer().cloned() else { return Ok(()) };
        let fut = async move { db.flush_with_options(FlushOptions { flush_type: FlushType::MemTable }).await };
        if wait {
            let flushed = self.state.run(fut);
            return self.result(flushed, "flush");
        }
        let (store, partition) = (self.store.clone(), self.partition);
        self.state.runtime().spawn(async move {
            if let Err(e) = fut.await {
                tracing::warn!(store, partition, error = %e, "remote store: background flush failed; a restart replays the changelog from the last landed flush");
            }
        });
        Ok(())
    }

    /// Flushes and closes the database (once).
    pub(crate) fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if self.is_follower() {
            tracing::info!(store = %self.store, partition = self.partition, warm_reads = self.warmed.load(Ordering::Relaxed),
                "remote store reader of a standby closed");
        }
        let db = self.db.clone();
        let closed = self.state.run(async move {
            match db {
                Handle::Writer(db) => db.close().await,
                Handle::Reader(db) => db.close().await,
            }
        });
        self.result(closed, "close")
    }
}

/// A chunked scan of a remote database, as a blocking iterator.
pub(crate) struct RemoteScan {
    state: Arc<RemoteState>,
    db: Handle,
    snapshot: Option<Arc<DbSnapshot>>,
    store: String,
    partition: i32,
    range: Option<KeyRange>,
    iter: Option<DbIterator>,
    buffered: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    done: bool,
}

impl RemoteScan {
    fn fill(&mut self) -> Result<()> {
        let (db, snapshot, range, iter) = (self.db.clone(), self.snapshot.clone(), self.range.take(), self.iter.take());
        let fetched = self.state.run(async move {
            let mut it = match (iter, range) {
                (Some(it), _) => it,
                (None, Some(range)) => match snapshot {
                    Some(s) => s.scan(range).await?,
                    None => db.scan(range).await?,
                },
                (None, None) => unreachable!("a scan has its range or its iterator"),
            };
            let mut out = Vec::with_capacity(SCAN_CHUNK);
            let mut done = false;
            while out.len() < SCAN_CHUNK {
                match it.next().await? {
                    Some(kv) => out.push((kv.key[1..].to_vec(), kv.value.to_vec())),
                    None => {
                        done = true;
                        break;
                    }
                }
            }
            Ok::<_, slatedb::Error>((it, out, done))
        });
        let (it, out, done) = remote_result(fetched, &self.store, self.partition, "scan")?;
        self.iter = Some(it);
        self.buffered.extend(out);
        self.done = done;
        Ok(())
    }
}

impl Iterator for RemoteScan {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buffered.is_empty() && !self.done {
            if let Err(e) = self.fill() {
                self.done = true;
                return Some(Err(e));
            }
        }
        self.buffered.pop_front().map(Ok)
    }
}

/// The durable state of a store partition's database under `url` (entries
/// in key order, checkpoint), read through a reader of the newest
/// manifest: no writer is fenced.
pub(crate) fn read_durable(
    url: &str,
    options: &[(String, String)],
    timeout: Duration,
    (app, store, partition): (&str, &str, i32),
) -> Result<Durable> {
    let (os, root) = crate::store::objects::open_url("remote state", url, options).map_err(Error::Config)?;
    let path = root.join(app).join(store).join(partition.to_string());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| Error::io("runtime", e))?;
    let read = runtime.block_on(async move { tokio::time::timeout(timeout, async move {
        let reader = slatedb::DbReader::open(path, os, slatedb::DbReaderMode::FollowLatest, Default::default()).await?;
        let mut it = reader.scan((Bound::Included(vec![DATA]), Bound::Excluded(vec![DATA + 1]))).await?;
        let mut entries = Vec::new();
        while let Some(kv) = it.next().await? {
            entries.push((kv.key[1..].to_vec(), kv.value.to_vec()));
        }
        let checkpoint = reader.get(prefixed(META, super::CHECKPOINT_KEY)).await?;
        let segments = reader.get(prefixed(META, super::SEGMENTS_KEY)).await?;
        reader.close().await?;
        Ok::<_, slatedb::Error>((entries, checkpoint, segments))
    }).await });
    let (entries, checkpoint, segments) = remote_result(read.map_err(|_| ()), store, partition, "read")?;
    let checkpoint = checkpoint.and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok()).map(i64::from_be_bytes);
    Ok(Durable { entries, checkpoint, segments: super::decode_segments(segments.map(|v| v.to_vec())) })
}

/// `key` behind its first byte.
pub(crate) fn prefixed(prefix: u8, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 1);
    out.push(prefix);
    out.extend_from_slice(key);
    out
}

/// Bounds of keys of `space` as bounds of the prefixed keys.
fn space_range(space: u8, start: Bound<&[u8]>, end: Bound<&[u8]>) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let start = match start {
        Bound::Included(s) => Bound::Included(prefixed(space, s)),
        Bound::Excluded(s) => Bound::Excluded(prefixed(space, s)),
        Bound::Unbounded => Bound::Included(vec![space]),
    };
    let end = match end {
        Bound::Included(e) => Bound::Included(prefixed(space, e)),
        Bound::Excluded(e) => Bound::Excluded(prefixed(space, e)),
        Bound::Unbounded => Bound::Excluded(vec![space + 1]),
    };
    (start, end)
}

fn remote_result<T>(r: std::result::Result<std::result::Result<T, slatedb::Error>, ()>, store: &str, partition: i32, what: &str) -> Result<T> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(map_error(e, store, partition, what)),
        Err(()) => Err(Error::RemoteStore {
            store: store.to_string(),
            partition,
            kind: RemoteFailure::Unavailable,
            detail: format!("{what} did not finish within the remote state timeout (object store unreachable?)"),
        }),
    }
}

/// SlateDB's error as kstate's, by kind.
fn map_error(e: slatedb::Error, store: &str, partition: i32, what: &str) -> Error {
    let kind = match e.kind() {
        ErrorKind::Closed(slatedb::CloseReason::Fenced) => RemoteFailure::Fenced,
        ErrorKind::Unavailable => RemoteFailure::Unavailable,
        ErrorKind::Data => RemoteFailure::Corrupt,
        _ => RemoteFailure::Other,
    };
    let detail = match kind {
        RemoteFailure::Fenced => format!("{what}: another instance opened this store partition for writing since (this writer is fenced; nothing more of it lands): {e}"),
        _ => format!("{what}: {e}"),
    };
    Error::RemoteStore { store: store.to_string(), partition, kind, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(dir: &std::path::Path) -> Arc<RemoteState> {
        RemoteState::start(RemoteSettings {
            url: &format!("file://{}", dir.display()),
            options: &[],
            application_id: "app",
            cache_bytes: 8 << 20,
            flush_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(20),
            memtable_bytes: 4 << 20,
            disk_cache: (dir.join("disk-cache"), 16 << 20),
            simulated_latency: Duration::ZERO,
        })
        .unwrap()
    }

    fn put(k: &str, v: &str) -> (Vec<u8>, Option<Vec<u8>>) {
        (prefixed(DATA, k.as_bytes()), Some(v.as_bytes().to_vec()))
    }

    fn data(db: &RemoteDb) -> Vec<(String, String)> {
        db.scan(None, DATA, Bound::Unbounded, Bound::Unbounded)
            .map(|e| e.map(|(k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap())).unwrap())
            .collect()
    }

    #[test]
    fn a_new_writer_fences_the_old_one_which_lands_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let state = state(dir.path());
        let a = RemoteDb::open(&state, "s", 0).unwrap();
        a.write(&[], vec![put("k1", "1"), (prefixed(META, b"cp"), Some(vec![1]))]).unwrap();
        a.flush(true).unwrap();
        // Written, not flushed: the durable state stays at k1.
        a.write(&[], vec![put("k2", "2"), (prefixed(META, b"cp"), Some(vec![2]))]).unwrap();

        let b = RemoteDb::open(&state, "s", 0).unwrap();
        assert_eq!(data(&b), vec![("k1".into(), "1".into())], "the new writer sees the durable prefix only");
        assert_eq!(b.get(META, b"cp").unwrap(), Some(vec![1]), "with its checkpoint");

        // The zombie's next write or flush fails, typed, and lands nothing.
        let zombie = a.write(&[], vec![put("k3", "3")]).and_then(|()| a.flush(true));
        match zombie {
            Err(Error::RemoteStore { kind: RemoteFailure::Fenced, store, partition, .. }) => assert_eq!((store.as_str(), partition), ("s", 0)),
            other => panic!("expected a fenced error, got {other:?}"),
        }
        b.flush(true).unwrap();
        let c = RemoteDb::open(&state, "s", 0).unwrap();
        assert_eq!(data(&c), vec![("k1".into(), "1".into())], "nothing of the zombie landed");
        drop(b);
        c.close().unwrap();
    }

    #[test]
    fn writes_ranges_scans_snapshots_and_wipes() {
        let dir = tempfile::tempdir().unwrap();
        let state = state(dir.path());
        let db = RemoteDb::open(&state, "s", 3).unwrap();
        db.write(&[], (0..1500).map(|i| put(&format!("k{i:04}"), &i.to_string())).collect()).unwrap();
        let snapshot = db.snapshot().unwrap();
        // Range deletion (keys read and deleted), a put inside the range
        // given as a delete by the caller, and the last write of a key wins.
        db.write(&[(b"k0100".to_vec(), b"k1000".to_vec())], vec![put("k0000", "x"), put("k0000", "y"), (prefixed(DATA, b"k1499"), None)]).unwrap();
        let now = data(&db);
        assert_eq!(now.len(), 1500 - 900 - 1);
        assert_eq!(now[0], ("k0000".into(), "y".into()));
        assert_eq!(now[100], ("k1000".into(), "1000".into()));
        assert_eq!(db.get(DATA, b"k0500").unwrap(), None);
        // The snapshot still reads the state before.
        assert_eq!(db.snapshot_get(&snapshot, DATA, b"k0500").unwrap(), Some(b"500".to_vec()));
        assert_eq!(db.scan(Some(snapshot), DATA, Bound::Excluded(b"k0000"), Bound::Included(b"k0002")).count(), 2);
        db.wipe().unwrap();
        assert!(data(&db).is_empty());
        assert_eq!(db.get(META, b"cp").unwrap(), None);
        db.close().unwrap();
    }

    #[test]
    fn an_unreachable_object_store_is_a_typed_error_at_start() {
        let err = RemoteState::start(RemoteSettings {
            url: "file:///proc/kstate-no-such-dir",
            options: &[],
            application_id: "app",
            cache_bytes: 8 << 20,
            flush_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            memtable_bytes: 4 << 20,
            disk_cache: (std::path::PathBuf::new(), 0),
            simulated_latency: Duration::ZERO,
        })
        .unwrap_err();
        assert!(matches!(err, Error::Config(_) | Error::RemoteStore { .. }), "{err:?}");
    }
}
