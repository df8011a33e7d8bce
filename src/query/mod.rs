//! Interactive queries: reads of the stores from outside the processor.
//!
//! [`Queries`] (from [`App::queries`](crate::App::queries)) reads the
//! committed state of the store partitions held by this instance, from any
//! thread, and says where the others are served. A read goes to the
//! partition that owns the key (the query partitioner, murmur2 by default),
//! takes the partition's read lock for one RocksDB snapshot read and lets
//! go: the processing thread never waits for it, and a store that closes
//! waits at most for the reads in progress (architecture.md §8).
//!
//! What an answer means: the value of the committed state (what the
//! changelog acknowledged and RocksDB holds, never the uncommitted writes
//! of the processor, never half a commit) at the position it carries.

mod types;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::codec::Codec;
use crate::config::AppConfig;
use crate::shutdown::ShutdownHandle;
use std::ops::Bound;

use crate::store::engine::{Checkpoint, Engine, SnapshotRead};
use crate::store::segments::Segments;
use crate::store::windowed;
use crate::windows::{Session, Shape};
use crate::store::published::{Role, RunState, SlotRead};

pub use types::{
    Answer, CopyRole, InstanceInfo, KeyMetadata, LocalLag, Position, QueryError, QueryOptions, ScanAnswer, DEFAULT_QUERY_WAIT,
};

type QResult<T> = std::result::Result<T, QueryError>;
/// Typed entries of one partition.
type Entries<K, V> = Answer<Vec<(<K as Codec>::Item, <V as Codec>::Item)>>;
/// Values by time or session, typed.
type Timed<T, V> = Answer<Vec<(T, <V as Codec>::Item)>>;
// (Public signatures spell these out: rustdoc shows a private alias unexplained.)
/// Raw entries of one partition, and whether more matched than the limit.
type RawEntries = Answer<(Vec<(Vec<u8>, Vec<u8>)>, bool)>;

/// How long a waiting read sleeps between attempts.
const RETRY_EVERY: Duration = Duration::from_millis(2);
/// The most entries a scan returns per partition and call: a scan holds
/// the partition's read lock (which a closing store waits for) while it runs.
pub const MAX_SCAN_LIMIT: usize = 10_000;
/// The longest wait a freshness bound may ask for.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// Reads this instance's stores from any thread, and finds the instances
/// serving the others. Cheap to clone, `Send + Sync`. Reads take
/// microseconds and never wait for the processing thread; only a read with
/// a freshness bound waits (up to its [`QueryOptions::wait`]): from async
/// code, use the `_async` variants, which wait without blocking a worker.
///
/// ```no_run
/// use kstate::codec::{U64Be, Utf8};
/// use kstate::{App, QueryError, QueryOptions};
/// # fn f(app: &App) -> Result<(), QueryError> {
/// let queries = app.queries();
/// // (app.run(...) on another thread)
/// match queries.get::<Utf8, U64Be>("counts", &"kafka".to_string(), &QueryOptions::new()) {
///     Ok(answer) => println!("{:?} at {:?}", answer.value, answer.position),
///     Err(QueryError::NotHosted { active: Some(host), .. }) => println!("ask {host}"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Queries {
    config: Arc<AppConfig>,
    shutdown: ShutdownHandle,
}

impl std::fmt::Debug for Queries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queries").field("application_id", &self.config.application_id).finish()
    }
}

/// The kinds of stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    KeyValue,
    Window,
    Session,
}

/// A failed attempt: give up now, or retry until the deadline.
enum Attempt {
    Final(QueryError),
    Retry(QueryError),
}

impl Queries {
    pub(crate) fn new(config: Arc<AppConfig>, shutdown: ShutdownHandle) -> Queries {
        Queries { config, shutdown }
    }

    /// The value of `key` in store `store`: `None` if absent (or expired).
    pub fn get<K: Codec, V: Codec>(&self, store: &str, key: &K::Item, options: &QueryOptions) -> Result<Answer<Option<V::Item>>, QueryError> {
        let (partition, encoded) = self.locate::<K>(store, key, Kind::KeyValue)?;
        self.wait_blocking(options, || self.get_once::<V>(store, partition, &encoded, options))
    }

    /// [`Queries::get`] for async code: a wait for a freshness bound sleeps
    /// on the tokio timer instead of the thread.
    pub async fn get_async<K: Codec, V: Codec>(&self, store: &str, key: &K::Item, options: &QueryOptions) -> Result<Answer<Option<V::Item>>, QueryError> {
        let (partition, encoded) = self.locate::<K>(store, key, Kind::KeyValue)?;
        self.wait_async(options, || self.get_once::<V>(store, partition, &encoded, options)).await
    }

    /// Entries with `from <= key < to` (encoded key bytes) of every store
    /// partition served here, at most `limit` (and at most
    /// [`MAX_SCAN_LIMIT`] per partition), in key order. Partitions not
    /// served here are listed in [`ScanAnswer::skipped`]. A position bound
    /// (`at_least`) applies to its own partition; `after_input` is ignored
    /// (it names no partition): use [`Queries::partition_range`]. It never
    /// waits (a partition short of its bound is skipped).
    pub fn range<K: Codec, V: Codec>(&self, store: &str, from: &K::Item, to: &K::Item, limit: usize, options: &QueryOptions) -> Result<ScanAnswer<K::Item, V::Item>, QueryError> {
        let (from, to) = (self.encode::<K>(store, from)?, self.encode::<K>(store, to)?);
        self.scan_all::<K, V>(store, &from, Some(&to), limit, options)
    }

    /// [`Queries::range`] for async code (it never waits: the same call,
    /// for symmetry with the reads that do).
    pub async fn range_async<K: Codec, V: Codec>(
        &self,
        store: &str,
        from: &K::Item,
        to: &K::Item,
        limit: usize,
        options: &QueryOptions,
    ) -> Result<ScanAnswer<K::Item, V::Item>, QueryError> {
        self.range::<K, V>(store, from, to, limit, options)
    }

    /// Entries whose encoded key starts with `prefix`, of every store
    /// partition served here (see [`Queries::range`]).
    pub fn prefix<K: Codec, V: Codec>(&self, store: &str, prefix: &[u8], limit: usize, options: &QueryOptions) -> Result<ScanAnswer<K::Item, V::Item>, QueryError> {
        let end = crate::store::prefix_successor(prefix);
        self.scan_all::<K, V>(store, prefix, end.as_deref(), limit, options)
    }

    /// [`Queries::prefix`] for async code (it never waits either).
    pub async fn prefix_async<K: Codec, V: Codec>(&self, store: &str, prefix: &[u8], limit: usize, options: &QueryOptions) -> Result<ScanAnswer<K::Item, V::Item>, QueryError> {
        self.prefix::<K, V>(store, prefix, limit, options)
    }

    /// [`Queries::range`] of one partition (the request a server forwards
    /// to the partition's active host).
    #[allow(clippy::type_complexity)] // (key, value) entries, as the scans
    pub fn partition_range<K: Codec, V: Codec>(
        &self,
        store: &str,
        partition: i32,
        from: &K::Item,
        to: &K::Item,
        limit: usize,
        options: &QueryOptions,
    ) -> Result<Answer<Vec<(K::Item, V::Item)>>, QueryError> {
        let (from, to) = self.partition_scan::<K>(store, partition, Some((from, to)))?;
        let answer = self.wait_blocking(options, || self.scan_once(store, partition, &from, to.as_deref(), limit, options))?;
        decode_answer::<K, V>(store, answer).map(|(a, _)| a)
    }

    /// [`Queries::partition_range`] for async code.
    #[allow(clippy::type_complexity)]
    pub async fn partition_range_async<K: Codec, V: Codec>(
        &self,
        store: &str,
        partition: i32,
        from: &K::Item,
        to: &K::Item,
        limit: usize,
        options: &QueryOptions,
    ) -> Result<Answer<Vec<(K::Item, V::Item)>>, QueryError> {
        let (from, to) = self.partition_scan::<K>(store, partition, Some((from, to)))?;
        let answer = self.wait_async(options, || self.scan_once(store, partition, &from, to.as_deref(), limit, options)).await?;
        decode_answer::<K, V>(store, answer).map(|(a, _)| a)
    }

    /// [`Queries::prefix`] of one partition.
    #[allow(clippy::type_complexity)]
    pub fn partition_prefix<K: Codec, V: Codec>(
        &self,
        store: &str,
        partition: i32,
        prefix: &[u8],
        limit: usize,
        options: &QueryOptions,
    ) -> Result<Answer<Vec<(K::Item, V::Item)>>, QueryError> {
        self.partition_scan::<K>(store, partition, None)?;
        let end = crate::store::prefix_successor(prefix);
        let answer = self.wait_blocking(options, || self.scan_once(store, partition, prefix, end.as_deref(), limit, options))?;
        decode_answer::<K, V>(store, answer).map(|(a, _)| a)
    }

    /// [`Queries::partition_prefix`] for async code.
    #[allow(clippy::type_complexity)]
    pub async fn partition_prefix_async<K: Codec, V: Codec>(
        &self,
        store: &str,
        partition: i32,
        prefix: &[u8],
        limit: usize,
        options: &QueryOptions,
    ) -> Result<Answer<Vec<(K::Item, V::Item)>>, QueryError> {
        self.partition_scan::<K>(store, partition, None)?;
        let end = crate::store::prefix_successor(prefix);
        let answer = self.wait_async(options, || self.scan_once(store, partition, prefix, end.as_deref(), limit, options)).await?;
        decode_answer::<K, V>(store, answer).map(|(a, _)| a)
    }

    /// Checks a one-partition scan of a key-value store; its bounds encoded.
    fn partition_scan<K: Codec>(&self, store: &str, partition: i32, bounds: Option<(&K::Item, &K::Item)>) -> QResult<(Vec<u8>, Option<Vec<u8>>)> {
        self.check_store(store, Kind::KeyValue)?;
        let encoded = match bounds {
            Some((from, to)) => (self.encode::<K>(store, from)?, Some(self.encode::<K>(store, to)?)),
            None => (Vec::new(), None),
        };
        self.check_partition(partition)?;
        Ok(encoded)
    }

    /// `key`'s windows starting in `[from, to]` in window store `store`,
    /// oldest first (expired windows are not returned), with the position
    /// they were read at.
    #[allow(clippy::type_complexity)] // (start, value), as the store's own fetch
    pub fn window_fetch<K: Codec, V: Codec>(
        &self,
        store: &str,
        key: &K::Item,
        from: i64,
        to: i64,
        options: &QueryOptions,
    ) -> Result<Answer<Vec<(i64, V::Item)>>, QueryError> {
        let read = self.segmented::<K>(store, key, Kind::Window)?;
        let answer = self.wait_blocking(options, || read.attempt(self, options, |s, encoded, scan| windowed::window_entries(s, encoded, from, to, scan)))?;
        decode_values::<V, _>(store, answer)
    }

    /// [`Queries::window_fetch`] for async code.
    #[allow(clippy::type_complexity)]
    pub async fn window_fetch_async<K: Codec, V: Codec>(
        &self,
        store: &str,
        key: &K::Item,
        from: i64,
        to: i64,
        options: &QueryOptions,
    ) -> Result<Answer<Vec<(i64, V::Item)>>, QueryError> {
        let read = self.segmented::<K>(store, key, Kind::Window)?;
        let answer = self.wait_async(options, || read.attempt(self, options, |s, encoded, scan| windowed::window_entries(s, encoded, from, to, scan))).await?;
        decode_values::<V, _>(store, answer)
    }

    /// `key`'s live sessions in session store `store`, by end, with the
    /// position they were read at.
    #[allow(clippy::type_complexity)]
    pub fn session_fetch<K: Codec, V: Codec>(&self, store: &str, key: &K::Item, options: &QueryOptions) -> Result<Answer<Vec<(Session, V::Item)>>, QueryError> {
        let read = self.segmented::<K>(store, key, Kind::Session)?;
        let answer = self.wait_blocking(options, || read.attempt(self, options, all_sessions))?;
        decode_values::<V, _>(store, answer)
    }

    /// [`Queries::session_fetch`] for async code.
    #[allow(clippy::type_complexity)]
    pub async fn session_fetch_async<K: Codec, V: Codec>(
        &self,
        store: &str,
        key: &K::Item,
        options: &QueryOptions,
    ) -> Result<Answer<Vec<(Session, V::Item)>>, QueryError> {
        let read = self.segmented::<K>(store, key, Kind::Session)?;
        let answer = self.wait_async(options, || read.attempt(self, options, all_sessions)).await?;
        decode_values::<V, _>(store, answer)
    }

    /// A window or session read of `key`, checked and located.
    fn segmented<K: Codec>(&self, store: &str, key: &K::Item, kind: Kind) -> QResult<SegmentedRead> {
        let Some((shape, retention)) = self.check_store(store, kind)? else { unreachable!("window and session stores are segmented") };
        let (partition, encoded) = self.locate::<K>(store, key, kind)?;
        Ok(SegmentedRead { store: store.to_string(), shape, retention, partition, encoded })
    }

    /// The partition of `key` (encoded by `K`) among the input partitions,
    /// by the application's [`Partitioner`](crate::Partitioner). Known once
    /// the application started, and still while it shuts down.
    pub fn partition_of<K: Codec>(&self, store: &str, key: &K::Item) -> Result<i32, QueryError> {
        self.kind_of(store)?;
        let encoded = self.encode::<K>(store, key)?;
        self.partition_of_encoded(&encoded)
    }

    fn partition_of_encoded(&self, encoded: &[u8]) -> QResult<i32> {
        let n = self.config.published.partitions();
        if n <= 0 {
            return Err(if self.shutdown.is_shutdown() { QueryError::ShuttingDown } else { QueryError::NotStarted });
        }
        self.config.partitioner.checked(encoded, n).map_err(|detail| QueryError::InvalidPosition { detail })
    }

    /// Where `key`'s partition is served: its active instance and standby
    /// instances, from the group's last assignment (their
    /// `application_server`s; instances without one are not listed).
    pub fn metadata_for_key<K: Codec>(&self, store: &str, key: &K::Item) -> Result<KeyMetadata, QueryError> {
        let (partition, _) = self.locate::<K>(store, key, self.kind_of(store)?)?;
        Ok(self.metadata_for_partition(partition))
    }

    /// [`Queries::metadata_for_key`] for a partition.
    pub fn metadata_for_partition(&self, partition: i32) -> KeyMetadata {
        let hosts = self.config.published.hosts();
        KeyMetadata {
            partition,
            active: hosts.hosts.iter().find(|h| h.active.contains(&partition)).map(|h| h.endpoint.clone()),
            standbys: hosts.hosts.iter().filter(|h| h.standby.contains(&partition)).map(|h| h.endpoint.clone()).collect(),
        }
    }

    /// The active host of a partition, if known.
    pub fn active_host(&self, partition: i32) -> Option<String> {
        self.metadata_for_partition(partition).active
    }

    /// Every instance with an `application_server`, with its partitions,
    /// from the group's last assignment (refreshed on every rebalance).
    pub fn instances(&self) -> Result<Vec<InstanceInfo>, QueryError> {
        self.check_running()?;
        let stores: Vec<String> = self.config.user_stores().iter().map(|s| s.name().to_string()).collect();
        Ok(self
            .config
            .published
            .hosts()
            .hosts
            .iter()
            .map(|h| InstanceInfo {
                endpoint: h.endpoint.clone(),
                active: h.active.iter().copied().collect(),
                standby: h.standby.iter().copied().collect(),
                stores: stores.clone(),
            })
            .collect())
    }

    /// This instance's `application_server`, if set.
    pub fn this_endpoint(&self) -> Option<&str> {
        self.config.application_server.as_deref()
    }

    /// Every store partition held here with its position and lag.
    pub fn local_lags(&self) -> Vec<LocalLag> {
        let mut out = Vec::new();
        for def in self.config.user_stores() {
            for (partition, slot) in self.config.published.slots_of(def.name()) {
                let Some(copy) = copy_role(slot.role()) else { continue };
                let Some(Ok(read)) = slot.read(|engine, _| Ok(((), engine.checkpoint()?))) else { continue };
                let end = (copy != CopyRole::Active && read.end >= 0).then_some(read.end);
                out.push(LocalLag {
                    store: def.name().to_string(),
                    partition,
                    copy,
                    position: read.checkpoint,
                    end_offset: end,
                    lag: if copy == CopyRole::Active { Some(0) } else { lag_of(&read) },
                });
            }
        }
        out
    }

    /// Whether the application answers at all. While it shuts down, the
    /// copies still open here answer (their committed state is the latest
    /// until another instance takes the partition over, which waits for
    /// this one's final commit); those already closed answer
    /// [`QueryError::ShuttingDown`] (see `read_once`).
    fn check_running(&self) -> QResult<()> {
        match self.config.published.state() {
            RunState::NotStarted if self.shutdown.is_shutdown() => Err(QueryError::ShuttingDown),
            RunState::NotStarted => Err(QueryError::NotStarted),
            RunState::Stopped => Err(QueryError::ShuttingDown),
            RunState::Running => Ok(()),
        }
    }

    /// What kind of user store `store` is.
    fn kind_of(&self, store: &str) -> QResult<Kind> {
        match self.config.user_stores().iter().find(|s| s.name() == store).map(|d| d.segmented()) {
            None => Err(QueryError::UnknownStore { store: store.to_string() }),
            Some(None) => Ok(Kind::KeyValue),
            Some(Some((Shape::Window(_), _))) => Ok(Kind::Window),
            Some(Some((Shape::Session(_), _))) => Ok(Kind::Session),
        }
    }

    /// A user store of the kind the query reads; a window or session
    /// store's shape and retention.
    fn check_store(&self, store: &str, kind: Kind) -> QResult<Option<(Shape, Duration)>> {
        let Some(def) = self.config.user_stores().iter().find(|s| s.name() == store) else {
            return Err(QueryError::UnknownStore { store: store.to_string() });
        };
        let segmented = def.segmented();
        let is = self.kind_of(store)?;
        let detail = match is {
            Kind::KeyValue => "read it with get, range or prefix",
            Kind::Window => "read it with window_fetch",
            Kind::Session => "read it with session_fetch",
        };
        if is != kind {
            let name = match is {
                Kind::KeyValue => "key-value",
                Kind::Window => "window",
                Kind::Session => "session",
            };
            return Err(QueryError::WrongStoreKind { store: store.to_string(), kind: name, detail });
        }
        Ok(segmented)
    }

    fn check_partition(&self, partition: i32) -> QResult<()> {
        self.check_running()?;
        let n = self.config.published.partitions();
        if partition < 0 || partition >= n {
            return Err(QueryError::InvalidPosition { detail: format!("partition {partition} is not one of the {n} input partitions") });
        }
        Ok(())
    }

    fn encode<K: Codec>(&self, store: &str, key: &K::Item) -> QResult<Vec<u8>> {
        K::encode(key).map_err(|source| QueryError::Codec { store: store.to_string(), source: Box::new(source) })
    }

    /// The key's partition and encoded bytes.
    fn locate<K: Codec>(&self, store: &str, key: &K::Item, kind: Kind) -> QResult<(i32, Vec<u8>)> {
        self.check_store(store, kind)?;
        let encoded = self.encode::<K>(store, key)?;
        self.check_running()?;
        Ok((self.partition_of_encoded(&encoded)?, encoded))
    }

    fn get_once<V: Codec>(&self, store: &str, partition: i32, key: &[u8], options: &QueryOptions) -> std::result::Result<Answer<Option<V::Item>>, Attempt> {
        let answer = self.read_once(store, partition, options, |engine, live| {
            let (stored, checkpoint) = engine.committed(|view| view.get(key))?;
            Ok((stored.and_then(|s| live(&s)), checkpoint))
        })?;
        let value = answer.value.as_deref().map(V::decode).transpose().map_err(|source| Attempt::Final(QueryError::Codec { store: store.to_string(), source: Box::new(source) }))?;
        Ok(Answer { value, position: answer.position, copy: answer.copy, lag: answer.lag })
    }

    /// Raw entries of one partition, up to `limit` (and whether more matched).
    fn scan_once(&self, store: &str, partition: i32, from: &[u8], to: Option<&[u8]>, limit: usize, options: &QueryOptions) -> std::result::Result<RawEntries, Attempt> {
        let limit = limit.min(MAX_SCAN_LIMIT);
        // Expired entries (TTL) are skipped but read: bounded too.
        let mut examined_budget = limit.saturating_mul(4).saturating_add(1024);
        self.read_once(store, partition, options, |engine, live| {
            let mut out = Vec::new();
            let mut more = false;
            let end = to.map_or(Bound::Unbounded, Bound::Excluded);
            let ((), checkpoint) = engine.committed(|view| view.scan(Bound::Included(from), end, |k, v| {
                if out.len() == limit || examined_budget == 0 {
                    more = true;
                    return false;
                }
                examined_budget -= 1;
                if let Some(v) = live(v) {
                    out.push((k.to_vec(), v));
                }
                true
            }))?;
            Ok(((out, more), checkpoint))
        })
    }

    fn scan_all<K: Codec, V: Codec>(&self, store: &str, from: &[u8], to: Option<&[u8]>, limit: usize, options: &QueryOptions) -> QResult<ScanAnswer<K::Item, V::Item>> {
        self.check_store(store, Kind::KeyValue)?;
        self.check_running()?;
        let mut raw = Vec::new();
        let (mut read, mut skipped, mut truncated) = (Vec::new(), Vec::new(), false);
        for partition in 0..self.config.published.partitions() {
            // A position bound names one partition; the others read as they are.
            let mut own = options.clone();
            if own.at_least.as_ref().is_some_and(|p| p.partition != partition) {
                own.at_least = None;
            }
            own.after_input = None;
            match self.scan_once(store, partition, from, to, limit, &own) {
                Ok(answer) => {
                    let (entries, more) = answer.value;
                    truncated |= more;
                    raw.extend(entries);
                    read.push(Answer { value: (), position: answer.position, copy: answer.copy, lag: answer.lag });
                }
                Err(Attempt::Final(e) | Attempt::Retry(e)) => skipped.push((partition, e)),
            }
        }
        raw.sort_by(|a, b| a.0.cmp(&b.0));
        if raw.len() > limit {
            raw.truncate(limit);
            truncated = true;
        }
        let codec = |source| QueryError::Codec { store: store.to_string(), source: Box::new(source) };
        let entries = raw.into_iter().map(|(k, v)| Ok((K::decode(&k).map_err(codec)?, V::decode(&v).map_err(codec)?))).collect::<QResult<_>>()?;
        Ok(ScanAnswer { entries, read, skipped, truncated })
    }

    /// One attempt at reading a partition under `options`.
    #[allow(clippy::type_complexity)]
    fn read_once<T>(
        &self,
        store: &str,
        partition: i32,
        options: &QueryOptions,
        read: impl FnOnce(&Engine, &dyn Fn(&[u8]) -> Option<Vec<u8>>) -> crate::Result<(T, Checkpoint)>,
    ) -> std::result::Result<Answer<T>, Attempt> {
        let name = || store.to_string();
        self.check_running().map_err(Attempt::Final)?;
        if let Some(p) = &options.at_least {
            if p.store != store || p.partition != partition {
                return Err(Attempt::Final(QueryError::InvalidPosition {
                    detail: format!("a position of store `{}` partition {} bounds a read of store `{store}` partition {partition}", p.store, p.partition),
                }));
            }
        }
        let input_topic = match &options.after_input {
            None => None,
            Some((topic, offset)) => Some((self.input_topic(topic.as_deref()).map_err(Attempt::Final)?, *offset)),
        };
        // Shutting down, a copy no longer here is another instance's to
        // serve soon: say so (the group's metadata may still name this one).
        let not_hosted = || match self.shutdown.is_shutdown() {
            true => QueryError::ShuttingDown,
            false => QueryError::NotHosted { store: name(), partition, active: self.active_host(partition) },
        };
        let Some(slot) = self.config.published.find(store, partition) else { return Err(Attempt::Retry(not_hosted())) };
        let role = slot.role();
        if role != Role::Active && options.max_lag.is_none() {
            return Err(Attempt::Retry(match role {
                Role::Restoring => QueryError::Restoring { store: name(), partition, lag: None },
                _ => not_hosted(),
            }));
        }
        // Read before the snapshot: a lower bound of what it reflects (a
        // copy opened since restored at least the changelog records these
        // offsets' writes were acknowledged in).
        let reflected = input_topic.as_ref().and_then(|(topic, _)| slot.input_reflected(topic));
        let result: SlotRead<T> = match slot.read(read) {
            // Withdrawn while it bulk loads (or, for an instant, while it
            // starts following its task's stream time).
            None => match slot.role() {
                Role::Restoring | Role::Active => return Err(Attempt::Retry(QueryError::Restoring { store: name(), partition, lag: None })),
                Role::Standby => {
                    let max_lag = options.max_lag.unwrap_or(0);
                    return Err(Attempt::Retry(QueryError::TooStale { store: name(), partition, copy: CopyRole::Standby, lag: None, max_lag }));
                }
                Role::Gone => return Err(Attempt::Retry(not_hosted())),
            },
            Some(Err(source)) => return Err(Attempt::Final(QueryError::Storage { store: name(), partition, source: Box::new(source) })),
            Some(Ok(r)) => r,
        };
        let Some(copy) = copy_role(result.role) else { return Err(Attempt::Retry(not_hosted())) };
        let lag = if copy == CopyRole::Active { Some(0) } else { lag_of(&result) };
        if copy != CopyRole::Active {
            let max_lag = options.max_lag.unwrap_or(0);
            if lag.is_none_or(|l| l > max_lag) {
                return Err(Attempt::Retry(match copy {
                    CopyRole::Restoring => QueryError::Restoring { store: name(), partition, lag },
                    _ => QueryError::TooStale { store: name(), partition, copy, lag, max_lag },
                }));
            }
        }
        let not_yet = |wanted: String| Attempt::Retry(QueryError::NotYet { store: name(), partition, position: result.checkpoint, wanted });
        if let Some(p) = &options.at_least {
            if result.checkpoint < p.offset {
                return Err(not_yet(format!("changelog offset {:?}", p.offset)));
            }
        }
        if let Some((topic, offset)) = &input_topic {
            // Only the active copy knows which input its state reflects.
            if copy != CopyRole::Active || reflected.is_none_or(|next| next <= *offset) {
                return Err(not_yet(format!("input offset {offset} of `{topic}`")));
            }
        }
        Ok(Answer {
            value: result.value,
            position: Position { store: name(), partition, offset: result.checkpoint },
            copy,
            lag: lag.unwrap_or(0),
        })
    }

    fn input_topic(&self, topic: Option<&str>) -> QResult<String> {
        // The declared inputs: a repartition topic's offsets say nothing of
        // what a client wrote (its state is another task's).
        let topics: Vec<&String> = self.config.input_topics.iter().filter(|t| !self.config.is_repartition_topic(t)).collect();
        match topic {
            Some(t) if topics.iter().any(|i| *i == t) => Ok(t.to_string()),
            Some(t) => Err(QueryError::InvalidPosition { detail: format!("`{t}` is not an input topic of the application ({topics:?})") }),
            None if topics.len() == 1 => Ok(topics[0].clone()),
            None => Err(QueryError::InvalidPosition { detail: format!("the application has several input topics ({topics:?}): use after_input_of") }),
        }
    }

    fn deadline(options: &QueryOptions) -> Option<Instant> {
        let bounded = options.at_least.is_some() || options.after_input.is_some();
        bounded.then(|| Instant::now() + options.wait.unwrap_or(DEFAULT_QUERY_WAIT).min(MAX_WAIT))
    }

    fn wait_blocking<T>(&self, options: &QueryOptions, mut attempt: impl FnMut() -> std::result::Result<T, Attempt>) -> QResult<T> {
        let deadline = Self::deadline(options);
        loop {
            if let Some(answer) = outcome(attempt(), deadline) {
                return answer;
            }
            std::thread::sleep(RETRY_EVERY);
        }
    }

    async fn wait_async<T>(&self, options: &QueryOptions, mut attempt: impl FnMut() -> std::result::Result<T, Attempt>) -> QResult<T> {
        let deadline = Self::deadline(options);
        loop {
            if let Some(answer) = outcome(attempt(), deadline) {
                return answer;
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }
}

/// What an attempt comes to: an answer or error to return, or `None`:
/// a bound not reached yet, to try again before the deadline.
fn outcome<T>(result: std::result::Result<T, Attempt>, deadline: Option<Instant>) -> Option<QResult<T>> {
    match result {
        Ok(v) => Some(Ok(v)),
        Err(Attempt::Retry(QueryError::NotYet { .. })) if deadline.is_some_and(|d| Instant::now() < d) => None,
        Err(Attempt::Final(e) | Attempt::Retry(e)) => Some(Err(e)),
    }
}

/// A walk over a key's entries (encoded) in a window or session store
/// under the segments of one snapshot.
type Walk<'w> = &'w mut dyn FnMut(&[u8], &[u8], &mut dyn FnMut(&[u8], &[u8])) -> crate::Result<()>;

/// A window or session read, checked and located: what each attempt reads.
struct SegmentedRead {
    store: String,
    shape: Shape,
    retention: Duration,
    partition: i32,
    encoded: Vec<u8>,
}

impl SegmentedRead {
    /// One attempt: `walk` reads the key's entries under the segments
    /// recorded in one snapshot.
    #[allow(clippy::type_complexity)]
    fn attempt<T>(
        &self,
        queries: &Queries,
        options: &QueryOptions,
        walk: impl Fn(&Segments, &[u8], Walk<'_>) -> crate::Result<Vec<(T, Vec<u8>)>>,
    ) -> std::result::Result<Answer<Vec<(T, Vec<u8>)>>, Attempt> {
        queries.read_once(&self.store, self.partition, options, |engine, _| {
            engine.committed(|view| {
                let s = windowed::committed_segments(view, self.shape, self.retention)?;
                walk(&s, &self.encoded, &mut |lo, hi, sink| snapshot_scan(view, lo, hi, sink))
            })
        })
    }
}

/// Every live session of a key.
fn all_sessions(s: &Segments, key: &[u8], scan: Walk<'_>) -> crate::Result<Vec<(Session, Vec<u8>)>> {
    windowed::session_entries(s, key, i64::MIN, i64::MAX, scan)
}

fn copy_role(role: Role) -> Option<CopyRole> {
    match role {
        Role::Active => Some(CopyRole::Active),
        Role::Standby => Some(CopyRole::Standby),
        Role::Restoring => Some(CopyRole::Restoring),
        Role::Gone => None,
    }
}

/// Offsets between what a copy reflects and the changelog's end: past its
/// checkpoint (the last record written), or past the transaction markers
/// and aborted records after it once the restore consumer stepped over
/// them, so a caught-up copy lags 0 under exactly-once too.
fn lag_of<T>(read: &SlotRead<T>) -> Option<u64> {
    let next = read.checkpoint.map_or(0, |c| c + 1).max(read.reflected);
    (read.end >= 0).then(|| (read.end - next).max(0) as u64)
}

/// Entries between two keys (both included) of a snapshot, into a sink.
fn snapshot_scan(view: &SnapshotRead<'_>, lo: &[u8], hi: &[u8], sink: &mut dyn FnMut(&[u8], &[u8])) -> crate::Result<()> {
    view.scan(Bound::Included(lo), Bound::Included(hi), |k, v| {
        sink(k, v);
        true
    })
}

/// Decodes the values of (time or session, value) entries.
fn decode_values<V: Codec, T>(store: &str, answer: Answer<Vec<(T, Vec<u8>)>>) -> QResult<Timed<T, V>> {
    let codec = |source| QueryError::Codec { store: store.to_string(), source: Box::new(source) };
    let value = answer.value.into_iter().map(|(t, v)| Ok((t, V::decode(&v).map_err(codec)?))).collect::<QResult<_>>()?;
    Ok(Answer { value, position: answer.position, copy: answer.copy, lag: answer.lag })
}

fn decode_answer<K: Codec, V: Codec>(store: &str, answer: RawEntries) -> QResult<(Entries<K, V>, bool)> {
    let codec = |source| QueryError::Codec { store: store.to_string(), source: Box::new(source) };
    let (raw, more) = answer.value;
    let value = raw.into_iter().map(|(k, v)| Ok((K::decode(&k).map_err(codec)?, V::decode(&v).map_err(codec)?))).collect::<QResult<_>>()?;
    Ok((Answer { value, position: answer.position, copy: answer.copy, lag: answer.lag }, more))
}
