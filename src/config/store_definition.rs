//! [`StoreDefinition`]: what each store is (its kind, windows, TTL,
//! backend, schema version and changelog settings).

use std::sync::Arc;
use std::time::Duration;

use super::ProcessingDecision;
use crate::store::StoreBackend;
use crate::time::TimeDomain;
use crate::windows::{SessionWindows, Shape, Windows};

/// Defines one state store: its name and extra settings for its changelog topic.
///
/// ```
/// let counts = kstate::StoreDefinition::new("counts")
///     .changelog_config("min.compaction.lag.ms", "60000");
/// assert_eq!(counts.name(), "counts");
/// ```
#[derive(Debug, Clone)]
pub struct StoreDefinition {
    pub(super) name: String,
    pub(super) changelog_configs: Vec<(String, String)>,
    pub(super) ttl: Option<(Duration, TimeDomain)>,
    pub(super) ttl_cleanup_interval: Duration,
    /// A window or session store's windows.
    pub(super) shape: Option<Shape>,
    pub(super) retention: Option<Duration>,
    pub(super) additional_retention: Duration,
    pub(super) live_tail: bool,
    pub(super) schema: crate::store::schema::Schema,
    /// Calls `Processor::on_window_close` once per closed window.
    pub(super) final_results: bool,
    /// A source table's topic (`AppBuilder::table`): its changelog.
    pub(crate) source_topic: Option<String>,
    /// A table's value check (`table_values`) and what a value it
    /// refuses does.
    pub(crate) table_values: Option<(crate::store::table::ValueCheck, ProcessingDecision)>,
    pub(super) backend: StoreBackend,
}

/// Kafka Streams' `windowstore.changelog.additional.retention.ms` default.
const ADDITIONAL_RETENTION: Duration = Duration::from_secs(24 * 3600);

impl StoreDefinition {
    /// A store named `name` (letters, digits, `.`, `_`, `-`).
    pub fn new(name: impl Into<String>) -> Self {
        StoreDefinition {
            name: name.into(),
            changelog_configs: Vec::new(),
            ttl: None,
            ttl_cleanup_interval: Duration::from_secs(600),
            shape: None,
            retention: None,
            additional_retention: ADDITIONAL_RETENTION,
            live_tail: true,
            schema: Default::default(),
            final_results: false,
            source_topic: None,
            table_values: None,
            backend: StoreBackend::RocksDb,
        }
    }

    /// Holds the store's data in memory (an ordered map per partition)
    /// instead of RocksDB: same handles, changelog, restore, standbys and
    /// guarantees; faster reads and writes; its bytes count against
    /// `max_state_memory`. A clean stop saves each partition to a file a
    /// restart loads, replaying only the changelog past it (README
    /// "In-memory stores").
    pub fn in_memory(mut self) -> Self {
        self.backend = StoreBackend::InMemory;
        self
    }

    /// Whether the store is held in memory ([`in_memory`](Self::in_memory)).
    pub fn is_in_memory(&self) -> bool {
        self.backend == StoreBackend::InMemory
    }

    /// Keeps the store's data in object storage instead of on the
    /// instance: each partition is a database under
    /// [`AppBuilder::remote_state`](crate::AppBuilder::remote_state)'s URL,
    /// with a bounded cache in memory. A partition that moves to another
    /// instance (a lost disk, a scale-out) opens there in about the time of
    /// one open plus the changelog written since its last flush, whatever
    /// its size: no restore, no warmup. Same handles, changelog and
    /// guarantees; reads that miss the cache wait for object storage.
    /// Needs the `remote` Cargo feature. Every store of the application
    /// must then be remote, and snapshots are refused; a standby keeps a
    /// reader that warms its instance's caches, not a copy (README "Remote
    /// stores" says why).
    pub fn remote(mut self) -> Self {
        self.backend = StoreBackend::Remote;
        self
    }

    /// Whether the store lives in object storage ([`remote`](Self::remote)).
    pub fn is_remote(&self) -> bool {
        self.backend == StoreBackend::Remote
    }

    /// Where the store's partitions keep their data.
    pub(crate) fn backend(&self) -> StoreBackend {
        self.backend
    }

    /// The test driver's copy: a remote store runs as one of its local stores.
    pub(crate) fn local_for_driver(&mut self) {
        if self.backend == StoreBackend::Remote {
            self.backend = StoreBackend::RocksDb;
        }
    }

    /// For a table ([`AppBuilder::table`](crate::AppBuilder::table)): its
    /// values must decode with `V` (e.g. `codec::Json<Price>`); a record
    /// whose value does not is a bad record, in processing and in a
    /// restore alike. `on_bad`: [`ProcessingDecision::Fail`] stops `run`
    /// (or the task's restore) with [`Error::BadRecord`](crate::Error::BadRecord);
    /// [`ProcessingDecision::Continue`] skips it (the key keeps its value,
    /// the processor does not hear of it; logged and counted in
    /// `kstate_skipped_records_total`). Without it a table holds its
    /// topic's bytes as they are.
    pub fn table_values<V: crate::codec::Codec>(mut self, on_bad: ProcessingDecision) -> Self {
        let check = crate::store::table::ValueCheck(std::sync::Arc::new(|v: &[u8]| V::decode(v).map(|_| ()).map_err(|e| e.to_string())));
        self.table_values = Some((check, on_bad));
        self
    }

    /// The topic this store's changes go to and its restore reads: a
    /// source table's own topic ([`AppBuilder::table`](crate::AppBuilder::table)),
    /// else `<application_id>-<store>-changelog`.
    pub(crate) fn changelog_topic(&self, application_id: &str) -> String {
        match &self.source_topic {
            Some(topic) => topic.clone(),
            None => crate::kafka::changelog_topic(application_id, &self.name),
        }
    }

    /// The topic a source table reads (`None`: a store of the processor's).
    pub fn source_topic(&self) -> Option<&str> {
        self.source_topic.as_deref()
    }

    /// The version of the value format this code writes (default 1;
    /// architecture.md §11). Changelog records of a version other than 1
    /// carry it in a `kstate.schema` header, snapshots and local state
    /// record it. Data of another version is never read as this one's:
    /// local state of another version is rebuilt from the changelog, whose
    /// records of another version go through [`upgrade`](Self::upgrade),
    /// or, without one, fail the task with
    /// [`Error::SchemaVersion`](crate::Error::SchemaVersion) (unless a
    /// later record of the same key replaces them, as a savepoint restore
    /// writes). Raise it when a deploy changes the value format.
    pub fn schema_version(mut self, version: u32) -> Self {
        self.schema.version = version;
        self
    }

    /// Converts values of another schema version (older, or newer when
    /// rolling back) while the store is rebuilt from its changelog:
    /// `upgrade(from_version, key, value)` returns the value in this
    /// code's format, or an error that fails the task. A TTL store's
    /// write time is kept; `value` is the user's bytes only.
    ///
    /// ```
    /// let counts = kstate::StoreDefinition::new("counts").schema_version(2).upgrade(|from, _key, value| match from {
    ///     1 => Ok(u64::from(u32::from_be_bytes(value.try_into().map_err(|_| "not 4 bytes")?)).to_be_bytes().to_vec()),
    ///     v => Err(format!("no conversion from version {v}")),
    /// });
    /// ```
    pub fn upgrade(mut self, upgrade: impl Fn(u32, &[u8], &[u8]) -> std::result::Result<Vec<u8>, String> + Send + Sync + 'static) -> Self {
        self.schema.upgrade = Some(Arc::new(upgrade));
        self
    }

    /// The store's schema version.
    pub fn version(&self) -> u32 {
        self.schema.version
    }

    /// The schema as stores and restores apply it.
    pub(crate) fn schema(&self) -> crate::store::schema::Schema {
        let value_skip = if self.ttl.is_some() { crate::store::ttl::STAMP } else { 0 };
        crate::store::schema::Schema { value_skip, ..self.schema.clone() }
    }

    /// A window store: a value per (key, window start) over `windows`
    /// (read and written through
    /// [`ProcessorContext::window_store`](crate::ProcessorContext::window_store)).
    /// Time is split into segments of `max(retention / 2, 60 s)`; a
    /// segment is dropped whole once it is past retention, and the
    /// changelog (`cleanup.policy=compact,delete`, `retention.ms` =
    /// retention + [`changelog_additional_retention`](Self::changelog_additional_retention))
    /// forgets expired windows too. Turns on durable stream time
    /// ([`AppBuilder::timers`](crate::AppBuilder::timers)): windows close on it.
    pub fn window(name: impl Into<String>, windows: Windows) -> Self {
        StoreDefinition { shape: Some(Shape::Window(windows)), ..StoreDefinition::new(name) }
    }

    /// A session store: a value per (key, session) of `sessions` (through
    /// [`ProcessorContext::session_store`](crate::ProcessorContext::session_store));
    /// segments, retention and changelog as for [`window`](Self::window),
    /// filed by session end.
    pub fn session(name: impl Into<String>, sessions: SessionWindows) -> Self {
        StoreDefinition { shape: Some(Shape::Session(sessions)), ..StoreDefinition::new(name) }
    }

    /// A window or session store that emits final results: once per
    /// window (session) that closes with a value, the runtime calls
    /// [`Processor::on_window_close`](crate::Processor::on_window_close)
    /// with the key, the window and the final value (Kafka Streams'
    /// `suppress(untilWindowCloses)` and on-window-close emit strategy).
    /// Durable like any state: each window's closing is a stream-time
    /// timer of kstate's own in the time store, registered by the write
    /// that creates the window, removed in the commit of the callback's
    /// writes and outputs (one transaction under exactly-once). Late records
    /// never reopen a window. Needs [`App::run_processor`](crate::App::run_processor);
    /// on a key-value store it is an [`Error::Config`] at `build`.
    /// A window's closing time is fixed when it is first written in a task:
    /// windows open while the window size or grace changes close at the
    /// old time. Windows already open when this is turned on for an
    /// existing store get a closing when they are next written; turning it
    /// off drops the pending closings (logged).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kstate::{StoreDefinition, Windows};
    /// let per_minute = StoreDefinition::window("views-per-minute", Windows::tumbling(Duration::from_secs(60)))
    ///     .emit_final_results();
    /// assert!(per_minute.emits_final_results());
    /// ```
    pub fn emit_final_results(mut self) -> Self {
        self.final_results = true;
        self
    }

    /// Whether the store emits final results ([`emit_final_results`](Self::emit_final_results)).
    pub fn emits_final_results(&self) -> bool {
        self.final_results
    }

    /// How long a window or session store keeps windows, in stream time
    /// (default: window size + grace, as Kafka Streams; session gap +
    /// grace + 1 ms). A window whose start (a session whose end) is at or
    /// before the store's latest one minus the retention is expired: never
    /// returned, dropped with its segment, skipped by restores. At least
    /// size + grace (gap + grace + 1 ms), checked when the application is built;
    /// longer retention lets processors read closed windows.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// How much longer than the retention a window or session store's
    /// changelog keeps records (default one day, as Kafka Streams'
    /// `windowstore.changelog.additional.retention.ms`). The broker deletes
    /// by wall-clock age while windows expire in stream time: this margin
    /// covers stream time falling behind the wall clock (idle inputs,
    /// lagging consumers) by up to its length.
    pub fn changelog_additional_retention(mut self, extra: Duration) -> Self {
        self.additional_retention = extra;
        self
    }

    /// Whether a restore of this window or session store into an empty
    /// local store may start at the changelog's live tail, past records
    /// that are sure to be expired (default true; architecture.md §7).
    /// Turn it off for a changelog that another writer interleaved
    /// records into (`Error::ChangelogDiverged` was seen), or whose
    /// `retention.ms` was lowered by hand after the store's retention was
    /// shortened, until those records aged out of the changelog.
    pub fn restore_from_live_tail(mut self, enabled: bool) -> Self {
        self.live_tail = enabled;
        self
    }

    pub(crate) fn live_tail_enabled(&self) -> bool {
        self.live_tail
    }

    /// A window store's windows.
    pub fn windows(&self) -> Option<Windows> {
        match self.shape {
            Some(Shape::Window(w)) => Some(w),
            _ => None,
        }
    }

    /// A session store's session windows.
    pub fn session_windows(&self) -> Option<SessionWindows> {
        match self.shape {
            Some(Shape::Session(s)) => Some(s),
            _ => None,
        }
    }

    /// A window or session store's retention (the default if none was set).
    pub fn retention_period(&self) -> Option<Duration> {
        let shape = self.shape?;
        Some(self.retention.unwrap_or(Duration::from_millis(shape.min_retention_ms().max(0) as u64)))
    }

    /// A window or session store's shape and retention.
    pub(crate) fn segmented(&self) -> Option<(Shape, Duration)> {
        Some((self.shape?, self.retention_period()?))
    }

    /// What the changelog's `retention.ms` must be at least, and what
    /// kstate creates it with (`None`: a key-value store, compacted only).
    pub(crate) fn changelog_retention_ms(&self) -> Option<(i64, i64)> {
        let retention = i64::try_from(self.retention_period()?.as_millis()).unwrap_or(i64::MAX);
        let extra = i64::try_from(self.additional_retention.as_millis()).unwrap_or(i64::MAX);
        Some((retention, retention.saturating_add(extra)))
    }

    /// Gives every entry a time to live since its last write, on
    /// `domain`'s clock: the task's stream time, or the wall clock. An
    /// expired entry is never returned by `get`, range or prefix scans,
    /// from the moment it expires; a sweep deletes it, which sends its
    /// tombstone to the changelog within
    /// [`ttl_cleanup_interval`](Self::ttl_cleanup_interval) (so no restore
    /// or standby brings it back), and RocksDB's compaction drops it.
    /// Each value is stored with its write time in front (8 bytes, in
    /// RocksDB and in the changelog): adding or removing a TTL changes the
    /// store's format (use a new store name); changing the duration is
    /// safe and applies to existing entries at once. Nothing detects a
    /// TTL added to a store that holds values written without one (they
    /// would be misread). A stream-time TTL keeps the task's stream time
    /// durable (it turns [`AppBuilder::timers`](crate::AppBuilder::timers)
    /// on), and a write to such a store before the task's first record
    /// ever fails with [`Error::InvalidUse`](crate::Error::InvalidUse):
    /// it would have no time to expire from.
    pub fn ttl(mut self, ttl: Duration, domain: TimeDomain) -> Self {
        self.ttl = Some((ttl, domain));
        self
    }

    /// How long a full TTL sweep of a store partition may take (default
    /// 10 minutes): expired entries are tombstoned in the changelog at
    /// most this long after they expired (plus a commit interval), at the
    /// cost of reading every entry once per interval (in steps, each
    /// second, on the processing thread).
    pub fn ttl_cleanup_interval(mut self, interval: Duration) -> Self {
        self.ttl_cleanup_interval = interval;
        self
    }

    /// The store's time to live, if it has one.
    pub fn time_to_live(&self) -> Option<(Duration, TimeDomain)> {
        self.ttl
    }

    pub(crate) fn cleanup_interval(&self) -> Duration {
        self.ttl_cleanup_interval
    }

    /// Adds a topic config used when kstate creates the changelog topic
    /// (e.g. `max.message.bytes`, `segment.ms`). `cleanup.policy` is always `compact`.
    pub fn changelog_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.changelog_configs.push((key.into(), value.into()));
        self
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn changelog_configs(&self) -> &[(String, String)] {
        &self.changelog_configs
    }
}
