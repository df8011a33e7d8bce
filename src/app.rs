//! The entry point: [`App::builder`] configures an application, [`App::run`]
//! runs it until [`ShutdownHandle::shutdown`] is called or it fails.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::assignment::AssignmentStrategy;
use crate::config::{AppConfig, ProcessingDecision, ProcessingGuarantee, StoreDefinition};
use crate::error::Result;
use crate::restore::RestoreListener;
use crate::record::Record;
use crate::context::ProcessorContext;
use crate::processor::Processor;
use crate::runtime::{Closure, PerTask};
use crate::shutdown::ShutdownHandle;
use crate::time::InvalidTimestamp;
use crate::timers::TIME_STORE;

/// [`AppBuilder::peer_timeout`]'s default.
const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// A configured kstate application: a consumer-group member that owns the
/// stores of the input partitions it is assigned.
///
/// ```no_run
/// use kstate::{App, StoreDefinition};
/// use kstate::codec::{U64Be, Utf8};
///
/// let app = App::builder()
///     .application_id("word-counts")
///     .bootstrap_servers("127.0.0.1:9092")
///     .input_topic("words")
///     .state_dir("/var/lib/word-counts")
///     .store(StoreDefinition::new("counts"))
///     .build()?;
/// let stop = app.shutdown_handle();
/// # stop.shutdown();
/// app.run(|ctx, record| {
///     let Some(word) = record.value_str() else { return Ok(()) };
///     let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
///     let n = counts.get(&word.to_string())?.unwrap_or(0);
///     counts.put(&word.to_string(), &(n + 1))
/// })?;
/// # Ok::<(), kstate::Error>(())
/// ```
pub struct App {
    pub(crate) config: Arc<AppConfig>,
    pub(crate) shutdown: ShutdownHandle,
}

impl App {
    /// Starts configuring an application.
    pub fn builder() -> AppBuilder {
        AppBuilder::default()
    }

    /// A handle for interactive queries: reads of this instance's stores
    /// from any thread, and where the other instances serve theirs. Take it
    /// before [`App::run`]; it answers while the application runs (before:
    /// [`QueryError::NotStarted`](crate::QueryError::NotStarted), after:
    /// [`QueryError::ShuttingDown`](crate::QueryError::ShuttingDown)).
    pub fn queries(&self) -> crate::Queries {
        crate::Queries::new(self.config.clone(), self.shutdown.clone())
    }

    /// A handle that asks the running application for a snapshot of every
    /// active store partition now (see [`AppBuilder::snapshots`]).
    pub fn snapshot_handle(&self) -> crate::SnapshotHandle {
        self.config.snapshot_handle.clone()
    }

    /// A handle that stops [`App::run`] cleanly from any thread.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Joins the group and processes records until shut down; blocks the
    /// calling thread. `processor` sees every input record after the stores
    /// of its partition are restored. On return every store was committed
    /// (or, on error, left at its last checkpoint) and closed.
    /// One closure serves every task; it has no timer, punctuation or
    /// final-result callbacks (see [`App::run_processor`]): a store that
    /// emits final results is an [`Error::Config`](crate::Error::Config) here.
    pub fn run<F, E>(self, processor: F) -> Result<()>
    where
        F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.config.check_closure()?;
        crate::runtime::run(self.config, self.shutdown, Closure::new(processor))
    }

    /// [`App::run`] with a [`Processor`] per task: `factory(partition)`
    /// builds one each time a task starts running here (after its stores
    /// are restored), its [`init`](Processor::init) runs before its first
    /// record, and it is dropped when the task closes. It gets the timer and
    /// punctuation callbacks.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use kstate::{App, Processor, ProcessorContext, ProcessorError, Record, TimeDomain, Timer};
    ///
    /// /// Emits each key's last value one minute (stream time) after it was last seen.
    /// struct Debounce;
    /// impl Processor for Debounce {
    ///     fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError> {
    ///         let (Some(key), Some(value), Some(ts)) = (record.key, record.value, ctx.timestamp()) else { return Ok(()) };
    ///         let last = ctx.store("last")?;
    ///         last.put(key, value)?;
    ///         ctx.register_timer(TimeDomain::StreamTime, key, ts + 60_000)?;
    ///         Ok(())
    ///     }
    ///     fn on_timer(&mut self, ctx: &mut ProcessorContext<'_>, timer: &Timer) -> Result<(), ProcessorError> {
    ///         // (a later record re-registered its own timer; a real debouncer checks the time)
    ///         if let Some(v) = ctx.store("last")?.get(&timer.key)? {
    ///             ctx.send(kstate::Output::to("debounced").key(&timer.key).value(&v))?;
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let app = App::builder()
    ///     .application_id("debounce")
    ///     .bootstrap_servers("127.0.0.1:9092")
    ///     .input_topic("events")
    ///     .state_dir("/var/lib/debounce")
    ///     .store(kstate::StoreDefinition::new("last"))
    ///     .timers(true)
    ///     .build()?;
    /// app.run_processor(|_partition| Debounce)?;
    /// # Ok::<(), kstate::Error>(())
    /// ```
    pub fn run_processor<P, F>(self, factory: F) -> Result<()>
    where
        P: Processor + Send,
        F: FnMut(i32) -> P,
    {
        crate::runtime::run(self.config, self.shutdown, PerTask::new(factory))
    }

    /// [`App::run`] on a blocking thread of the current tokio runtime.
    pub async fn run_async<F, E>(self, processor: F) -> Result<()>
    where
        F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let handle = self.shutdown.clone();
        on_blocking_thread(handle, move || self.run(processor)).await
    }

    /// [`App::run_processor`] on a blocking thread of the current tokio
    /// runtime, for applications that already have one (an HTTP server
    /// beside the processing, say). Dropping the future shuts the
    /// application down.
    ///
    /// ```no_run
    /// # use kstate::{App, Processor, ProcessorContext, ProcessorError, Record};
    /// # struct Count;
    /// # impl Processor for Count {
    /// #     fn process(&mut self, _: &mut ProcessorContext<'_>, _: &Record<'_>) -> Result<(), ProcessorError> { Ok(()) }
    /// # }
    /// # async fn serve(app: App) -> kstate::Result<()> {
    /// app.shutdown_handle().stop_on_signals();
    /// let queries = app.queries();
    /// tokio::spawn(async move { /* answer HTTP requests with queries.get_async(...) */ drop(queries) });
    /// app.run_processor_async(|_partition| Count).await
    /// # }
    /// ```
    pub async fn run_processor_async<P, F>(self, factory: F) -> Result<()>
    where
        P: Processor + Send,
        F: FnMut(i32) -> P + Send + 'static,
    {
        let handle = self.shutdown.clone();
        on_blocking_thread(handle, move || self.run_processor(factory)).await
    }
}

/// Runs `run` on a blocking thread of the current tokio runtime; if the
/// future is dropped, shuts the application down instead of leaking it.
async fn on_blocking_thread(handle: ShutdownHandle, run: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    let mut task = tokio::task::spawn_blocking(run);
    let guard = ShutdownOnDrop(handle);
    let result = (&mut task).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    std::mem::forget(guard);
    result
}

struct ShutdownOnDrop(ShutdownHandle);
impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

/// Builds an [`App`]; [`AppBuilder::build`] checks the configuration.
pub struct AppBuilder {
    config: AppConfig,
}

impl Default for AppBuilder {
    fn default() -> Self {
        AppBuilder {
            config: AppConfig {
                application_id: String::new(),
                bootstrap_servers: String::new(),
                input_topics: Vec::new(),
                state_dir: PathBuf::new(),
                stores: Vec::new(),
                commit_interval: Duration::from_millis(100),
                max_task_idle: Duration::ZERO,
                num_stream_threads: 1,
                global_tables: Vec::new(),
                repartitions: Vec::new(),
                has_tables: false,
                repartition_purge_interval: Duration::from_secs(30),
                max_uncommitted_bytes: 64 << 20,
                startup_timeout: Duration::from_secs(30),
                commit_timeout: Duration::from_secs(60),
                lock_timeout: Duration::from_secs(30),
                task_timeout: Duration::from_secs(300),
                changelog_replication_factor: None,
                block_cache_bytes: 64 << 20,
                read_cache_bytes: crate::store::recent::DEFAULT_BYTES,
                write_buffer_bytes: 16 << 20,
                max_state_memory: None,
                in_memory_save_interval: Duration::from_secs(60),
                rocksdb_statistics: false,
                kafka_overrides: Vec::new(),
                assignment: AssignmentStrategy::Auto,
                restore_listener: None,
                processing_exception_handler: None,
                num_standby_replicas: 0,
                acceptable_recovery_lag: 10_000,
                max_warmup_replicas: 2,
                probing_rebalance_interval: Duration::from_secs(600),
                state_cleanup_delay: Duration::from_secs(600),
                application_server: None,
                peer_address: None,
                peer_timeout: DEFAULT_PEER_TIMEOUT,
                peer_secret: None,
                peer_previous_secret: None,
                peer_plaintext: false,
                client_tags: Default::default(),
                processing_guarantee: ProcessingGuarantee::AtLeastOnce,
                transaction_timeout: Duration::from_secs(10),
                timers: false,
                timestamp_extractor: None,
                invalid_timestamp: InvalidTimestamp::Fail,
                published: Default::default(),
                partitioner: Default::default(),
                snapshots: None,
                remote_state: None,
                snapshot_handle: Default::default(),
            },
        }
    }
}

impl AppBuilder {
    /// The application id: consumer group id and changelog topic prefix. Required.
    pub fn application_id(mut self, id: impl Into<String>) -> Self {
        self.config.application_id = id.into();
        self
    }

    /// Kafka bootstrap servers, e.g. `127.0.0.1:9092`. Required.
    pub fn bootstrap_servers(mut self, servers: impl Into<String>) -> Self {
        self.config.bootstrap_servers = servers.into();
        self
    }

    /// Adds an input topic. Several topics must have equal partition counts
    /// (co-partitioned): task `p` owns partition `p` of each, and gets their
    /// records merged in timestamp order (see [`max_task_idle`](Self::max_task_idle));
    /// unequal counts are [`Error::NotCoPartitioned`](crate::Error::NotCoPartitioned)
    /// (naming each topic and its count) from `run`.
    pub fn input_topic(mut self, topic: impl Into<String>) -> Self {
        self.config.input_topics.push(topic.into());
        self
    }

    /// Adds a global table `name` filled from every partition of `topic`
    /// on every instance (reference data for joins): `run` reads it up to
    /// the topic's end before it joins the group, then follows the topic
    /// while it runs; processors read it with
    /// [`ProcessorContext::global_table`](crate::ProcessorContext::global_table).
    /// Each record's key is a key of the table, its value the key's value
    /// (a tombstone deletes it; a record without key is ignored). Its
    /// local copy lives in `state_dir/<application_id>/<name>/global`. A
    /// topic that does not exist is
    /// [`Error::MissingGlobalTableTopic`](crate::Error::MissingGlobalTableTopic)
    /// from `run`.
    pub fn global_table(mut self, name: impl Into<String>, topic: impl Into<String>) -> Self {
        self.config.global_tables.push((name.into(), topic.into()));
        self
    }

    /// With several input topics, each task processes the record with the
    /// lowest timestamp (as the timestamp extractor reads it) among the
    /// heads of its input partitions, once each of them has a record
    /// fetched; an input partition with none is waited for while the
    /// broker is known to hold more of it (its last fetched high
    /// watermark), for at most 1 s, else for `max_task_idle` (default 0:
    /// not at all), before the task goes on with the others (Kafka
    /// Streams' `max.task.idle.ms`, KIP-695). A larger value keeps the
    /// merge in order across an input that is produced to late, at the cost
    /// of that much latency when it is idle. No effect with one input topic.
    pub fn max_task_idle(mut self, idle: Duration) -> Self {
        self.config.max_task_idle = idle;
        self
    }

    /// Threads that process records (default 1), like Kafka Streams'
    /// `num.stream.threads`, with one consumer and one producer for all of
    /// them: the poll thread fetches a batch of records, hands each task's
    /// records to one thread, the threads process their tasks in parallel,
    /// and commits, rebalances and standbys are served between batches as
    /// with one thread (docs/architecture.md §15 states where tasks run).
    /// A task's records are processed in order by one thread at a time;
    /// its [`Processor`] may run on another thread in the next batch, so it
    /// must be `Send`. Needs [`App::run_processor`] (one processor per
    /// task): [`App::run`]'s single closure cannot be shared and fails with
    /// [`Error::Config`](crate::Error::Config). 0 is a configuration error.
    pub fn num_stream_threads(mut self, threads: usize) -> Self {
        self.config.num_stream_threads = threads;
        self
    }

    /// Root of local state: stores live under `state_dir/<application_id>/<store>/<partition>/`. Required.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.state_dir = dir.into();
        self
    }

    /// Adds a store; every task gets its own partition of it.
    pub fn store(mut self, store: StoreDefinition) -> Self {
        self.config.stores.push(store);
        self
    }

    /// How often writes are committed (default 100 ms).
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.config.commit_interval = interval;
        self
    }

    /// Uncommitted bytes over all stores that force an early commit (default
    /// 64 MiB). They include a commit in flight, whose changelog records
    /// (copied by the producer until acknowledged) and RocksDB batch are
    /// copies too, so peak memory for writes is about three times this.
    pub fn max_uncommitted_bytes(mut self, bytes: usize) -> Self {
        self.config.max_uncommitted_bytes = bytes;
        self
    }

    /// How long startup waits for the brokers and topic metadata (default 30 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.config.startup_timeout = timeout;
        self
    }

    /// How long a commit waits for changelog acknowledgements before it
    /// warns that they are late (default 60 s); it keeps waiting up to
    /// [`task_timeout`](Self::task_timeout) in all.
    pub fn commit_timeout(mut self, timeout: Duration) -> Self {
        self.config.commit_timeout = timeout;
        self
    }

    /// How long kstate rides out an unavailable group coordinator or broker
    /// before `run` fails with [`Error::RetriesExhausted`](crate::Error::RetriesExhausted)
    /// or [`Error::CommitTimeout`](crate::Error::CommitTimeout) (default 5
    /// minutes, Kafka Streams' `task.timeout.ms`). Meanwhile offset commits
    /// are retried with backoff, a commit waits for late changelog
    /// acknowledgements, and processing goes on up to
    /// [`max_uncommitted_bytes`](Self::max_uncommitted_bytes).
    pub fn task_timeout(mut self, timeout: Duration) -> Self {
        self.config.task_timeout = timeout;
        self
    }

    /// What to do when the processor returns an error for a record. Without
    /// a handler (the default) `run` stops with
    /// [`Error::Processor`](crate::Error::Processor). The handler sees the
    /// record and the error and returns [`ProcessingDecision::Continue`] to
    /// skip the record (logged, counted in `kstate_skipped_records_total`)
    /// or [`ProcessingDecision::Fail`] to stop.
    ///
    /// ```
    /// use kstate::{App, ProcessingDecision};
    /// let builder = App::builder().processing_exception_handler(|record, error| {
    ///     eprintln!("skipping {}[{}]@{}: {error}", record.topic, record.partition, record.offset);
    ///     ProcessingDecision::Continue
    /// });
    /// ```
    pub fn processing_exception_handler<H>(mut self, handler: H) -> Self
    where
        H: Fn(&Record<'_>, &(dyn std::error::Error + Send + Sync + 'static)) -> ProcessingDecision + Send + Sync + 'static,
    {
        self.config.processing_exception_handler = Some(Arc::new(handler));
        self
    }

    /// How long opening a store retries a directory locked by another process (default 30 s).
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.config.lock_timeout = timeout;
        self
    }

    /// Replication factor of created changelog topics (default: the broker's default).
    pub fn changelog_replication_factor(mut self, factor: i32) -> Self {
        self.config.changelog_replication_factor = Some(factor);
        self
    }

    /// Size of the RocksDB block cache shared by all stores (default 64 MiB).
    pub fn block_cache_bytes(mut self, bytes: usize) -> Self {
        self.config.block_cache_bytes = bytes;
        self
    }

    /// Bytes all store partitions' read caches hold together (default 16
    /// MiB; 0 turns the cache off). A key-value store keeps the writes of
    /// its landed commits in memory, so that reading a key back soon after
    /// (an aggregate's next update) does not ask RocksDB; Kafka Streams'
    /// `statestore.cache.max.bytes` plays this part. Window, session and
    /// in-memory stores do not use it. A commit that does not fit empties
    /// its own store partition's cache first. Not bounded by
    /// `max_state_memory` (it comes on top, like uncommitted writes).
    pub fn read_cache_bytes(mut self, bytes: usize) -> Self {
        self.config.read_cache_bytes = bytes;
        self
    }

    /// RocksDB memtable size per store partition (default 16 MiB).
    pub fn write_buffer_bytes(mut self, bytes: usize) -> Self {
        self.config.write_buffer_bytes = bytes;
        self
    }

    /// Whether each store partition's RocksDB keeps statistics, for the
    /// metrics `kstate_rocksdb_block_cache_hits_total`,
    /// `kstate_rocksdb_block_cache_misses_total` and
    /// `kstate_rocksdb_write_stall_micros_total` (default off: they stay 0).
    /// RocksDB allocates them per CPU, at least 8 copies of about 70 KiB
    /// per store partition: about 140 MiB for 256 store partitions on a
    /// small machine, more with more CPUs. Write stalls are counted either way.
    pub fn rocksdb_statistics(mut self, on: bool) -> Self {
        self.config.rocksdb_statistics = on;
        self
    }

    /// One memory bound for all of this instance's RocksDB stores (Kafka
    /// Streams users know it as the bounded-memory `RocksDBConfigSetter`,
    /// KAFKA-8215): a block cache of `bytes` shared by every store partition,
    /// index and filter blocks included, to which every memtable is charged
    /// too. Memtables may use half of it: past that kstate flushes the
    /// largest ones and takes no records until the flushes freed memory (it
    /// keeps serving the group meanwhile). Replaces `block_cache_bytes`; each
    /// memtable is at most a quarter of it. Without it (the default) each
    /// store partition's memtables come on top of the cache, so memory grows
    /// with the number of partitions. Not bounded by it: uncommitted writes
    /// (`max_uncommitted_bytes`), the Kafka clients' buffers, and what
    /// RocksDB keeps per open file. At least 16 MiB.
    pub fn max_state_memory(mut self, bytes: usize) -> Self {
        self.config.max_state_memory = Some(bytes);
        self
    }

    /// How often an in-memory store partition that commits saves its file
    /// in the background (default 60 s), so that a crash replays at most
    /// about that much of its changelog; a clean stop always saves it. The
    /// save reads the store under a read lock: its commits wait meanwhile.
    pub fn in_memory_save_interval(mut self, every: Duration) -> Self {
        self.config.in_memory_save_interval = every;
        self
    }

    /// A librdkafka setting for every client (e.g. `security.protocol`);
    /// the security settings apply to kstate's own group connections too,
    /// and the group settings (`session.timeout.ms`,
    /// `heartbeat.interval.ms`, `max.poll.interval.ms`,
    /// `group.instance.id`) are read by kstate's membership (librdkafka's
    /// consumers never see them). `group.id`,
    /// `bootstrap.servers`, `enable.auto.commit`, `enable.idempotence`,
    /// `transactional.id` and `transaction.timeout.ms` are kstate's own
    /// ([`build`](Self::build) refuses them). Settings given here win over
    /// the defaults kstate picks for its clients: the processing
    /// consumer's `auto.offset.reset=earliest`, `fetch.wait.max.ms=100` and
    /// `fetch.queue.backoff.ms=10`; the restore consumer's
    /// `fetch.queue.backoff.ms=10`, `fetch.wait.max.ms=10`,
    /// `queued.min.messages=500000`, `queued.max.messages.kbytes=16384` and
    /// `max.partition.fetch.bytes=8388608`; the producer's `linger.ms=5`,
    /// `batch.size=1000000`, `queue.buffering.max.messages=1000000` and
    /// `partitioner=murmur2_random`.
    pub fn kafka_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.kafka_overrides.push((key.into(), value.into()));
        self
    }

    /// At-least-once (the default) or exactly-once processing; see
    /// [`ProcessingGuarantee`]. Under exactly-once every commit is a Kafka
    /// transaction of kstate's producer, whose `transactional.id` is
    /// `<application_id>-<process id>` (the process id kept in the state
    /// directory, so a restarted instance fences its previous incarnation).
    pub fn processing_guarantee(mut self, guarantee: ProcessingGuarantee) -> Self {
        self.config.processing_guarantee = guarantee;
        self
    }

    /// Exactly-once only: how long a transaction may stay open before the
    /// brokers abort it (`transaction.timeout.ms`, default 10 s as in Kafka
    /// Streams). It bounds how long a crashed or frozen instance's
    /// unfinished commit holds back `read_committed` readers of its
    /// changelogs and outputs: the next owner of its tasks waits up to this
    /// long before it restores them. Longer than `commit_interval`, at most
    /// the brokers' `transaction.max.timeout.ms` (15 min by default).
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.config.transaction_timeout = timeout;
        self
    }

    /// Ignored: kstate assigns tasks with its own state-aware assignor
    /// (partition `p` of every input topic always stays together).
    #[deprecated(note = "kstate assigns tasks itself; the strategy is ignored")]
    pub fn assignment_strategy(mut self, strategy: AssignmentStrategy) -> Self {
        self.config.assignment = strategy;
        self
    }

    /// Standby replicas per task (default 0; Kafka Streams'
    /// `num.standby.replicas`): other instances keep a copy of each store
    /// partition up to date from its changelog, so a failover replays only
    /// their lag instead of the whole changelog.
    pub fn num_standby_replicas(mut self, replicas: usize) -> Self {
        self.config.num_standby_replicas = replicas;
        self
    }

    /// How far behind its changelog (in records) an instance's copy of a
    /// task may be and still count as caught up (default 10,000, Kafka
    /// Streams' `acceptable.recovery.lag`). A task moves only to an instance
    /// within this lag; a balanced assignment that would put it on one
    /// further behind keeps it where it is and warms the target up first
    /// (a warmup replica), so scaling out never stops a partition for a
    /// long restore.
    pub fn acceptable_recovery_lag(mut self, records: u64) -> Self {
        self.config.acceptable_recovery_lag = records;
        self
    }

    /// At most this many warmup replicas at a time across the application
    /// (default 2, Kafka Streams' `max.warmup.replicas`; at least 1). More
    /// warmups move tasks faster at the cost of more changelog reads.
    pub fn max_warmup_replicas(mut self, replicas: usize) -> Self {
        self.config.max_warmup_replicas = replicas;
        self
    }

    /// While warmup replicas exist, the group rebalances at least this often
    /// to move the tasks whose warmups caught up (default 10 minutes, Kafka
    /// Streams' `probing.rebalance.interval.ms`). An instance whose warmups
    /// all caught up asks for that rebalance at once, so this is a bound,
    /// not the usual wait. A balanced group never rebalances for this.
    pub fn probing_rebalance_interval(mut self, interval: Duration) -> Self {
        self.config.probing_rebalance_interval = interval;
        self
    }

    /// How long the local state of a task that is neither active nor
    /// standby here is kept before it is deleted (default 10 minutes,
    /// Kafka Streams' `state.cleanup.delay.ms`). Until then it still
    /// counts as a copy when the group places tasks.
    pub fn state_cleanup_delay(mut self, delay: Duration) -> Self {
        self.config.state_cleanup_delay = delay;
        self
    }

    /// This instance's `host:port` (Kafka Streams' `application.server`),
    /// published in its group metadata: interactive queries' metadata
    /// ([`Queries::active_host`](crate::Queries::active_host)) name it.
    pub fn application_server(mut self, host_port: impl Into<String>) -> Self {
        self.config.application_server = Some(host_port.into());
        self
    }

    /// Turns on failure detection among the instances: this instance
    /// listens on `host:port` (port 0: any free port) and publishes it to
    /// the group; the instances keep links to each other and one that
    /// finds another's process gone, or silent for
    /// [`peer_timeout`](AppBuilder::peer_timeout), makes the group drop it
    /// at once instead of at its session timeout, so its tasks move to
    /// their standbys within about a second. The host must be an address
    /// the other instances can reach. Unset: failures are detected by the
    /// session timeout only. See the README's "Failure detection".
    pub fn peer_address(mut self, host_port: impl Into<String>) -> Self {
        self.config.peer_address = Some(host_port.into());
        self
    }

    /// The secret the peer links authenticate with (at least 16 bytes, the
    /// same on every instance of the application): before any message of
    /// a link counts, both ends prove they hold it by a challenge-response
    /// (HMAC-SHA256 over both ends' nonces, incarnations and the group;
    /// the secret never crosses the wire). A connection that fails is
    /// closed and counted in `kstate_peer_rejected_total`. The links are
    /// authenticated, not encrypted: what crosses them is liveness and the
    /// group's member ids and addresses. `peer_address` needs this,
    /// [`peer_secret_file`](Self::peer_secret_file) or
    /// [`peer_plaintext`](Self::peer_plaintext).
    pub fn peer_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.config.peer_secret = Some(Ok(std::sync::Arc::from(secret.as_ref())));
        self
    }

    /// [`peer_secret`](Self::peer_secret) read from a file (its bytes,
    /// without one trailing line end), e.g. a mounted secret. A missing or
    /// unreadable file is `Error::Config` at `build`.
    pub fn peer_secret_file(mut self, path: impl AsRef<std::path::Path>) -> Self {
        self.config.peer_secret = Some(read_secret_file(path.as_ref()));
        self
    }

    /// The secret [`peer_secret`](Self::peer_secret) replaces, accepted
    /// as well while a rotation rolls through the instances: give every
    /// instance in turn the new secret as `peer_secret` and the old one
    /// here (instances still on the old secret alone keep watching it and
    /// it them), then, once all run the new one, drop this in a second
    /// rollout. At least 16 bytes, not the same as `peer_secret`; without
    /// `peer_secret` it is `Error::Config` at `build`. See the runbook's
    /// "Rotating the peer secret".
    pub fn peer_previous_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.config.peer_previous_secret = Some(Ok(std::sync::Arc::from(secret.as_ref())));
        self
    }

    /// [`peer_previous_secret`](Self::peer_previous_secret) read from a
    /// file, as [`peer_secret_file`](Self::peer_secret_file).
    pub fn peer_previous_secret_file(mut self, path: impl AsRef<std::path::Path>) -> Self {
        self.config.peer_previous_secret = Some(read_secret_file(path.as_ref()));
        self
    }

    /// Runs the peer links without authentication (a warning at start):
    /// anything that reaches the port can then say `Bye` for an instance
    /// (which stops others from watching it) or learn the group's members.
    /// Only for networks where nothing else can reach the port.
    pub fn peer_plaintext(mut self) -> Self {
        self.config.peer_plaintext = true;
        self
    }

    /// How long a peer may be silent before it is dropped (default 2 s;
    /// at least 100 ms, below `session.timeout.ms`). An instance writes
    /// only while its peers' leases hold, so a frozen instance stops
    /// writing before it is dropped; doubled for a peer dropped for
    /// silence again within ten minutes (a flapping link).
    pub fn peer_timeout(mut self, timeout: Duration) -> Self {
        self.config.peer_timeout = timeout;
        self
    }

    /// A client tag (e.g. `zone` = `eu-1a`): standbys of a task go to
    /// instances whose tags differ from its active's where possible
    /// (Kafka Streams' `client.tag.*`, KIP-708).
    pub fn client_tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.client_tags.insert(key.into(), value.into());
        self
    }

    /// Observes restores (start, batches, end).
    pub fn restore_listener(mut self, listener: impl RestoreListener) -> Self {
        self.config.restore_listener = Some(Arc::new(listener));
        self
    }

    /// Keeps each task's stream time and per-key timers durable (default
    /// off): they live in an internal store, `kstate-time`, written in the
    /// task's commits, changelogged (topic
    /// `<application_id>-kstate-time-changelog`), restored, and followed by
    /// standbys like any store, so a restart or a failover neither loses
    /// nor fires early any timer. Needed by
    /// [`ProcessorContext::register_timer`]; without it stream time starts
    /// again from the first record processed after a task starts.
    pub fn timers(mut self, enabled: bool) -> Self {
        self.config.timers = enabled;
        self
    }

    /// Reads each record's timestamp (default: the record's own, as Kafka
    /// Streams' `FailOnInvalidTimestamp`), e.g. an event time inside the
    /// value. It gets the record and the task's stream time so far; a
    /// negative result is invalid (see [`on_invalid_timestamp`](Self::on_invalid_timestamp)).
    /// Stream time, stream-time timers and punctuations, and the default
    /// timestamp of output records follow what it returns.
    ///
    /// ```
    /// let builder = kstate::App::builder().timestamp_extractor(|record, _stream_time| {
    ///     // Event time in the first 8 bytes of the value; -1 (invalid) if missing.
    ///     record.value.and_then(|v| v.get(..8)).map_or(-1, |b| i64::from_be_bytes(b.try_into().unwrap()))
    /// });
    /// ```
    pub fn timestamp_extractor<F>(mut self, extractor: F) -> Self
    where
        F: Fn(&Record<'_>, Option<i64>) -> i64 + Send + Sync + 'static,
    {
        self.config.timestamp_extractor = Some(Arc::new(extractor));
        self
    }

    /// Stamps each record with the wall clock when it is processed
    /// (processing time; Kafka Streams' `WallclockTimestampExtractor`)
    /// instead of its own timestamp.
    pub fn wall_clock_timestamps(self) -> Self {
        self.timestamp_extractor(|_, _| crate::time::wall_clock_ms())
    }

    /// What happens to a record whose timestamp is invalid (default
    /// [`InvalidTimestamp::Fail`]).
    pub fn on_invalid_timestamp(mut self, policy: InvalidTimestamp) -> Self {
        self.config.invalid_timestamp = policy;
        self
    }

    /// Reads the compacted topic `topic` into the key-value store `store`,
    /// one store partition per input partition (a source table, Kafka
    /// Streams' `builder.table` with its source-topic changelog): the topic
    /// is the store's changelog, so no `-changelog` topic is created and a
    /// restore or a new instance replays the topic itself, up to the
    /// application's committed offset of it. The topic is an input of the
    /// tasks (it must have the inputs' partition count) and each record
    /// updates the store before the processor hears of it through
    /// [`Processor::on_table_update`](crate::Processor::on_table_update)
    /// (`App::run`'s closure gets the record); a record without a value
    /// (a tombstone) deletes its key, one without a key is skipped. The
    /// processor reads the store by name and cannot write it
    /// ([`Error::InvalidUse`](crate::Error::InvalidUse)). A topic whose
    /// `cleanup.policy` is `delete` only is refused at start
    /// ([`Error::TableTopic`](crate::Error::TableTopic)). See the README's
    /// "Tables".
    pub fn table(mut self, topic: impl Into<String>, store: StoreDefinition) -> Self {
        let mut store = store;
        store.source_topic = Some(topic.into());
        self.config.stores.push(store);
        self
    }

    /// Declares a repartition topic, `<application_id>-<name>-repartition`,
    /// for re-keying: the processor sends a record to it with
    /// [`ProcessorContext::repartition`](crate::ProcessorContext::repartition)
    /// under a new key, and gets it back as an input record of the task
    /// that owns that key (`record.topic` is the repartition topic, see
    /// [`repartition_topic`](crate::repartition_topic)). kstate creates it
    /// at start like a changelog (one partition per input partition,
    /// `cleanup.policy=delete`, `retention.ms=-1`), refuses an existing one
    /// with another partition count or a compacted one, sends to it in the
    /// commit of the record that caused it (the same transaction under
    /// exactly-once) and deletes its records below the committed offsets
    /// every [`repartition_purge_interval`](Self::repartition_purge_interval),
    /// so it does not grow. The name: letters, digits, `.`, `_`, `-`.
    pub fn repartition(mut self, name: impl Into<String>) -> Self {
        self.config.repartitions.push(crate::config::Repartition { name: name.into(), topic: String::new() });
        self
    }

    /// How often records of the repartition topics that every consumer
    /// has committed past are deleted (`DeleteRecords`; default 30 s, as
    /// Kafka Streams' `repartition.purge.interval.ms`). At least 100 ms.
    pub fn repartition_purge_interval(mut self, interval: Duration) -> Self {
        self.config.repartition_purge_interval = interval;
        self
    }

    /// The partitioner the producers of the input topics use (default
    /// [`Partitioner::Murmur2`](crate::Partitioner::Murmur2), the Java
    /// clients' default; librdkafka-based producers, Rust's among them,
    /// default to [`Partitioner::Crc32`](crate::Partitioner::Crc32)
    /// unless configured with `partitioner=murmur2_random`).
    /// [`Queries`](crate::Queries) find a store key's partition with it
    /// (the key's bytes as its codec encodes them: stores keyed like their
    /// input), the test driver places keyed inputs with it, and every keyed
    /// input record is checked against it: one in another partition is
    /// counted in `kstate_input_partition_mismatches_total{topic}` and
    /// logged (once a minute per topic) with the setting to change.
    pub fn partitioner(mut self, partitioner: crate::Partitioner) -> Self {
        self.config.partitioner = partitioner;
        self
    }

    /// [`AppBuilder::partitioner`] with a function of your own
    /// (`Partitioner::custom(f)`); kept for applications written before
    /// `partitioner`.
    pub fn query_partitioner<F>(self, partitioner: F) -> Self
    where
        F: Fn(&[u8], i32) -> i32 + Send + Sync + 'static,
    {
        self.partitioner(crate::Partitioner::custom(partitioner))
    }

    /// Snapshots of the stores in object storage: each active store
    /// partition is snapshotted incrementally every
    /// [`interval`](crate::SnapshotConfig::interval) (only SST files the
    /// snapshot store does not have are uploaded), and a store partition
    /// with no local state (a new instance, a lost disk) is seeded from the
    /// newest usable snapshot, so its restore replays only the changelog
    /// past the snapshot. Snapshot failures are logged and retried; they
    /// never stop processing. See the README's "Snapshots".
    pub fn snapshots(mut self, config: crate::SnapshotConfig) -> Self {
        self.config.snapshots = Some(config);
        self
    }

    /// Where [remote stores](crate::StoreDefinition::remote) live (README "Remote stores").
    pub fn remote_state(mut self, config: crate::RemoteStateConfig) -> Self {
        self.config.remote_state = Some(config);
        self
    }

    /// Checks the configuration; fails with [`Error::Config`](crate::Error::Config).
    pub fn build(self) -> Result<App> {
        Ok(App { config: Arc::new(self.finish()?), shutdown: ShutdownHandle::default() })
    }

    /// The configuration a [`TestDriver`](crate::TestDriver) runs with:
    /// what is needed only to reach Kafka or a disk (bootstrap servers, a
    /// state dir) may be left out, and an application id defaults to
    /// `test`; the rest is checked as [`build`](Self::build) checks it.
    pub(crate) fn test_config(mut self) -> Result<AppConfig> {
        let c = &mut self.config;
        if c.application_id.is_empty() {
            c.application_id = "test".into();
        }
        if c.bootstrap_servers.trim().is_empty() {
            c.bootstrap_servers = "(test driver)".into();
        }
        if c.state_dir.as_os_str().is_empty() {
            c.state_dir = PathBuf::from("/kstate-test-driver");
        }
        c.run_remote_stores_locally();
        self.finish()
    }

    fn finish(mut self) -> Result<AppConfig> {
        self.config.validate()?;
        if self.config.repartition_purge_interval < Duration::from_millis(100) {
            return Err(crate::Error::Config(format!(
                "repartition_purge_interval must be at least 100 ms, not {:?}",
                self.config.repartition_purge_interval
            )));
        }
        // A repartition topic is an input of the tasks too (after the
        // declared inputs, so that those come first in every list).
        let app = self.config.application_id.clone();
        for r in &mut self.config.repartitions {
            r.topic = crate::config::repartition_topic(&app, &r.name);
            if !self.config.input_topics.contains(&r.topic) {
                self.config.input_topics.push(r.topic.clone());
            }
        }
        // A source table's topic too (after them).
        let tables: Vec<String> = self.config.stores.iter().filter_map(|s| s.source_topic.clone()).collect();
        self.config.has_tables = !tables.is_empty();
        for topic in tables {
            if !self.config.input_topics.contains(&topic) {
                self.config.input_topics.push(topic);
            }
        }
        // A stream-time TTL needs stream time to survive restarts, or
        // expired entries would show again until the clock caught up.
        // Windows close on stream time, which must survive restarts too.
        if self.config.stores.iter().any(|s| {
            matches!(s.time_to_live(), Some((_, crate::time::TimeDomain::StreamTime))) || s.segmented().is_some()
        }) {
            self.config.timers = true;
        }
        if self.config.timers {
            self.config.stores.push(if self.config.remote_stores() { StoreDefinition::new(TIME_STORE).remote() } else { StoreDefinition::new(TIME_STORE) });
        }
        Ok(self.config)
    }
}

/// A secret file's bytes, without one trailing line end (an editor's, not
/// more), or why it cannot be read.
fn read_secret_file(path: &std::path::Path) -> std::result::Result<std::sync::Arc<[u8]>, String> {
    match std::fs::read(path) {
        Ok(mut bytes) => {
            if bytes.ends_with(b"\n") {
                bytes.pop();
                if bytes.ends_with(b"\r") {
                    bytes.pop();
                }
            }
            Ok(std::sync::Arc::from(bytes))
        }
        Err(e) => Err(format!("cannot read `{}`: {e}", path.display())),
    }
}
