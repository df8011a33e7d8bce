//! The test driver: an application's processor run on records fed by the
//! test, with its stores, timers and outputs in memory, no Kafka broker and
//! no disk (Kafka Streams' `TopologyTestDriver`).
//!
//! It runs the runtime's own parts, not a model of them: the callbacks of
//! `runtime/callbacks.rs` (timestamps, stream time, timers, punctuations,
//! the processing exception handler), real [`KeyValueStore`]s over RocksDB
//! in its in-memory environment (TTL, windows and sessions, schema
//! versions), [`TaskTime`] with its time store, and each store's commit
//! (seal, changelog records, the RocksDB batch with its checkpoint). What
//! it replaces is Kafka: input records come from [`TestDriver::input`], and
//! changelog records and outputs go to topics in memory (`kafka/memory.rs`).
//! Its wall clock moves only when the test moves it.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the driver: tasks, input, commits, crashes, reads |
//! | `processors.rs` | one processor per task (or one closure), built when needed |

mod processors;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};

use crate::app::AppBuilder;
use crate::codec::Codec;
use crate::config::{AppConfig, ProcessingGuarantee};
use crate::context::ProcessorContext;
use crate::error::{Error, Result};
use crate::global::{GlobalStore, GlobalTables};
use crate::kafka::{ChangelogSink, MemoryTopics, OutputSink};
use crate::output::{Output, SentRecord};
use crate::processor::{Processor, ProcessorError};
use crate::record::{Headers, Record, TimestampType};
use crate::runtime::callbacks::{Callbacks, Handled, TaskFault, TaskParts};
use crate::store::engine::EngineResources;
use crate::store::{KeyValueStore, StoreOpenArgs};
use crate::task::merge::{order_of, Held, TaskQueues};
use crate::time::set_thread_clock;
use crate::timers::TaskTime;

use processors::Processors;

/// The largest record a changelog takes in the driver: a broker's default
/// `message.max.bytes`.
const MAX_RECORD_BYTES: usize = 1_048_588;

/// Configures a [`TestDriver`]: how many partitions the input topics have
/// and where its wall clock starts; then the processor.
pub struct TestDriverBuilder {
    app: AppBuilder,
    partitions: i32,
    wall_clock: Option<i64>,
}

impl TestDriverBuilder {
    /// The input topics' partition count, one task each (default 1).
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// The driver's wall clock at start, in milliseconds since the epoch
    /// (default: the system clock now).
    pub fn wall_clock(mut self, ms: i64) -> Self {
        self.wall_clock = Some(ms);
        self
    }

    /// A driver running a [`Processor`] per task, as
    /// [`App::run_processor`](crate::App::run_processor) does:
    /// `factory(partition)` builds one when the task starts (and again
    /// after [`TestDriver::crash_and_restart`]).
    pub fn processor<P, F>(self, mut factory: F) -> Result<TestDriver>
    where
        P: Processor + 'static,
        F: FnMut(i32) -> P + 'static,
    {
        self.start(Processors::per_task(Box::new(move |p| Box::new(factory(p)) as Box<dyn Processor>)))
    }

    /// A driver running one closure for every task, as
    /// [`App::run`](crate::App::run) does (no timer or punctuation callbacks).
    pub fn closure<F, E>(self, processor: F) -> Result<TestDriver>
    where
        F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E> + 'static,
        E: Into<ProcessorError> + 'static,
    {
        self.start(Processors::closure(Box::new(crate::runtime::Closure::new(processor))))
    }

    fn start(self, processors: Processors) -> Result<TestDriver> {
        let config = self.app.test_config()?;
        if !processors.callbacks() {
            config.check_closure()?;
        }
        // What queries and the partitioner check read as the input partition count.
        config.published.set_partitions(self.partitions);
        if self.partitions < 1 {
            return Err(Error::Config(format!("a test driver needs at least 1 partition, not {}", self.partitions)));
        }
        let resources =
            EngineResources::in_memory(config.block_cache_bytes.min(8 << 20), config.write_buffer_bytes.min(4 << 20))?.with_read_cache(config.read_cache_bytes);
        let store_index = config.user_stores().iter().enumerate().map(|(i, s)| (s.name().to_string(), i)).collect();
        let topics = Arc::new(MemoryTopics::new(config.processing_guarantee == ProcessingGuarantee::ExactlyOnce));
        let clock = self.wall_clock.unwrap_or_else(crate::time::wall_clock_ms);
        let mut globals = GlobalTables::default();
        for (name, topic) in &config.global_tables {
            let dir = crate::global::table_dir(&config.state_dir, &config.application_id, name);
            globals.tables.insert(name.clone(), Arc::new(GlobalStore::open(name, topic, dir, &resources, Duration::ZERO)?));
        }
        let mut driver = TestDriver {
            globals,
            outputs: OutputSink::Memory(topics.clone()),
            topics,
            config: Arc::new(config),
            store_index,
            resources,
            tasks: BTreeMap::new(),
            processors,
            partitions: self.partitions,
            clock,
            last_commit: clock,
            inputs: HashMap::new(),
            arrivals: Vec::new(),
            keyless: 0,
            stopped: None,
        };
        for partition in 0..self.partitions {
            let task = driver.open_task(partition)?;
            driver.tasks.insert(partition, task);
        }
        driver.guarded(TestDriver::serve)?;
        Ok(driver)
    }
}

/// One input record as the driver keeps it (to replay it after a crash).
struct Input {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    timestamp: Option<i64>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// One task (input partition) of the driver.
struct DriverTask {
    partition: i32,
    /// Its stores in definition order (the time store last).
    stores: Vec<KeyValueStore>,
    time: TaskTime,
    span: tracing::Span,
    /// Per input topic, the next offset to process.
    processed: HashMap<String, i64>,
    /// Per input topic, the next offset as of the last commit: where
    /// processing restarts after a crash.
    committed: HashMap<String, i64>,
    /// Several input topics: records held for their turn.
    held: Option<TaskQueues>,
}

impl DriverTask {
    fn parts(&mut self) -> TaskParts<'_> {
        TaskParts { partition: self.partition, stores: &mut self.stores, time: &mut self.time, span: &self.span }
    }
}

/// Runs an application's processor without Kafka, in milliseconds: feed
/// it input records, move its wall clock, read its outputs, stores and
/// changelogs. The way to unit-test processors.
///
/// It takes the application's own [`AppBuilder`] (bootstrap servers and
/// state dir may be left out) and behaves as [`App::run`](crate::App::run)
/// would with one instance holding every partition:
///
/// - **Records** are processed as they are fed, each by its partition's
///   task: timestamp extractor and invalid-timestamp policy, stream time,
///   the stream-time timers a record makes due before it, the punctuations
///   after it, the processing exception handler.
/// - **The wall clock** is the driver's: it moves only with
///   [`advance_wall_clock`](Self::advance_wall_clock), which runs the
///   wall-clock timers and punctuations that became due (one jump: a
///   punctuation whose interval passed several times runs once, as after
///   a pause). Processors, wall-clock TTLs and the wall-clock timestamp
///   extractor all read it.
/// - **Commits** happen as the runtime's: once `commit_interval` of the
///   wall clock has passed since the last one (checked after each record
///   and each advance), at `max_uncommitted_bytes`, and on
///   [`commit`](Self::commit). A commit writes each store's changelog
///   records (the latest write of each key), persists stream time and
///   timers, and runs a full TTL sweep.
/// - **Outputs** under at-least-once are visible as soon as they are sent;
///   under exactly-once only once their commit is ([`outputs`](Self::outputs)
///   shows what a `read_committed` consumer would read).
/// - **Crashes**: [`crash_and_restart`](Self::crash_and_restart) drops
///   everything not committed and reprocesses the input after the last
///   committed offsets, with new processors.
///
/// ```
/// use kstate::codec::{U64Be, Utf8};
/// use kstate::{App, Output, StoreDefinition, TestDriver};
///
/// let app = App::builder().input_topic("words").store(StoreDefinition::new("counts"));
/// let mut driver = TestDriver::builder(app).closure(|ctx, record| {
///     let word = record.value_str().unwrap_or_default().to_string();
///     let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
///     let n = counts.get(&word)?.unwrap_or(0) + 1;
///     counts.put(&word, &n)?;
///     ctx.send(Output::to("counts").key(word.as_bytes()).value(n.to_string().as_bytes()))
/// })?;
/// driver.input("words", b"k", b"apple", 1)?;
/// driver.input("words", b"k", b"apple", 2)?;
/// assert_eq!(driver.store_entries::<Utf8, U64Be>("counts")?, vec![("apple".to_string(), 2)]);
/// assert_eq!(driver.outputs("counts").last().and_then(|r| r.value_str()).as_deref(), Some("2"));
/// # Ok::<(), kstate::Error>(())
/// ```
pub struct TestDriver {
    config: Arc<AppConfig>,
    store_index: HashMap<String, usize>,
    /// RocksDB's in-memory environment and cache, shared by every store.
    resources: EngineResources,
    /// Changelogs and outputs.
    topics: Arc<MemoryTopics>,
    /// The global tables, in memory, filled by [`global_input`](Self::global_input).
    globals: GlobalTables,
    outputs: OutputSink,
    tasks: BTreeMap<i32, DriverTask>,
    processors: Processors,
    partitions: i32,
    /// The wall clock (ms since the epoch).
    clock: i64,
    /// The wall clock at the last commit.
    last_commit: i64,
    /// Every input record, per (topic, partition), at its offset.
    inputs: HashMap<(String, i32), Vec<Input>>,
    /// Every input record in the order it came: (topic, partition, offset).
    arrivals: Vec<(String, i32, i64)>,
    /// Records without key or partition fed so far (spread round-robin).
    keyless: i64,
    /// Why the driver stopped, as `run` would have.
    stopped: Option<String>,
}

impl TestDriver {
    /// Starts configuring a driver for the application `app` configures.
    pub fn builder(app: AppBuilder) -> TestDriverBuilder {
        TestDriverBuilder { app, partitions: 1, wall_clock: None }
    }

    fn open_task(&self, partition: i32) -> Result<DriverTask> {
        let config = &self.config;
        let mut stores = Vec::with_capacity(config.stores.len());
        for def in &config.stores {
            stores.push(KeyValueStore::open(StoreOpenArgs {
                name: def.name(),
                partition,
                dir: config.store_dir(def.name(), partition),
                changelog_topic: def.changelog_topic(&config.application_id),
                max_record_bytes: MAX_RECORD_BYTES,
                producer: ChangelogSink::Memory(self.topics.clone()),
                resources: &self.resources,
                lock_timeout: Duration::ZERO,
                tombstone_retention: None,
                ttl: def.time_to_live(),
                segments: def.segmented(),
                live_tail_retention: None,
                published: None,
                seed: None,
                schema: def.schema(),
                final_results: def.emits_final_results(),
                backend: def.backend(), // (remote stores run as RocksDB here: `test_config`)
            })?);
            if def.source_topic.is_some() {
                let exactly_once = config.processing_guarantee == crate::config::ProcessingGuarantee::ExactlyOnce;
                stores.last_mut().expect("pushed").make_source_table(exactly_once, def.table_values.clone().map(|(c, on_bad)| (c, on_bad == crate::config::ProcessingDecision::Continue)))?;
            }
        }
        let mut time = TaskTime::new(partition);
        time.load(config.time_store_index().map(|i| &stores[i]))?;
        for store in &mut stores {
            store.follow_stream_clock(time.clock());
        }
        Ok(DriverTask {
            partition,
            stores,
            time,
            span: crate::task::task_span(&config.application_id, partition),
            processed: HashMap::new(),
            committed: HashMap::new(),
            held: None,
        })
    }

    fn check_running(&self) -> Result<()> {
        match &self.stopped {
            Some(why) => Err(Error::InvalidUse(format!("the test driver stopped ({why}); crash_and_restart() starts it again"))),
            None => Ok(()),
        }
    }

    /// Runs `step`; an error stops the driver, as it would end `run`.
    fn guarded<T>(&mut self, step: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.check_running()?;
        set_thread_clock(Some(self.clock));
        let result = step(self);
        if let Err(e) = &result {
            self.stopped = Some(format!("an earlier call failed, as App::run would have: {e}"));
        }
        result
    }

    /// Feeds one record to input topic `topic`, with a key, a value and a
    /// timestamp, to the partition the application's
    /// [`Partitioner`](crate::Partitioner) gives its key (murmur2 by
    /// default, as the Java producer's), and processes it.
    pub fn input(&mut self, topic: &str, key: &[u8], value: &[u8], timestamp: i64) -> Result<()> {
        self.send(Output::to(topic).key(key).value(value).timestamp(timestamp))
    }

    /// Feeds one record described as an [`Output`] (topic, key, value,
    /// timestamp, headers, partition) and processes it. Without a
    /// partition it goes where the partitioner puts its key; without a key
    /// either, partitions take turns. Records it makes the processor send
    /// to a repartition topic are fed back the same way. Without a timestamp the record has
    /// none (`Record::timestamp` is `None`).
    pub fn send(&mut self, record: Output<'_>) -> Result<()> {
        if !self.config.input_topics.iter().any(|t| t == record.topic) {
            return Err(Error::InvalidUse(format!(
                "`{}` is not an input topic of the application (AppBuilder::input_topic): {:?}",
                record.topic, self.config.input_topics
            )));
        }
        let partition = match (record.partition, record.key) {
            (Some(p), _) if (0..self.partitions).contains(&p) => p,
            (Some(p), _) => {
                return Err(Error::InvalidUse(format!("partition {p} of `{}` does not exist: the driver has {}", record.topic, self.partitions)))
            }
            (None, Some(key)) => self.config.partitioner.checked(key, self.partitions).map_err(Error::InvalidUse)?,
            (None, None) => {
                self.keyless += 1;
                ((self.keyless - 1) % i64::from(self.partitions)) as i32
            }
        };
        let input = Input {
            key: record.key.map(<[u8]>::to_vec),
            value: record.value.map(<[u8]>::to_vec),
            timestamp: record.timestamp,
            headers: record.headers.iter().map(|(n, v)| (n.to_string(), v.map(<[u8]>::to_vec))).collect(),
        };
        self.guarded(|d| {
            d.take(record.topic, partition, input)?;
            d.feed_repartitions()
        })
    }

    /// Appends `input` to partition `partition` of `topic` and processes it.
    fn take(&mut self, topic: &str, partition: i32, input: Input) -> Result<()> {
        let log = self.inputs.entry((topic.to_string(), partition)).or_default();
        let offset = log.len() as i64;
        log.push(input);
        self.arrivals.push((topic.to_string(), partition, offset));
        self.process(topic, partition, offset)?;
        self.serve()?;
        self.maybe_commit()
    }

    /// Records the processors sent to repartition topics, once visible
    /// (at once; under exactly-once once committed), are input records of
    /// the partition they were sent to, as a consumer of the topic would
    /// get them; what they send in turn is fed too.
    fn feed_repartitions(&mut self) -> Result<()> {
        let topics: Vec<String> = self.config.repartitions.iter().map(|r| r.topic.clone()).collect();
        // A processor that re-keys every re-keyed record again never stops.
        for _ in 0..1_000 {
            let mut fed = false;
            for topic in &topics {
                for sent in self.topics.take_outputs(topic) {
                    fed = true;
                    let partition = sent.partition.unwrap_or(0);
                    let input = Input { key: sent.key, value: sent.value, timestamp: sent.timestamp, headers: sent.headers };
                    self.take(topic, partition, input)?;
                }
            }
            if !fed {
                return Ok(());
            }
        }
        Err(Error::InvalidUse("records were re-keyed through repartition topics 1,000 times in a row: a processor that re-keys what it gets from a repartition topic again never stops".into()))
    }

    /// Takes in input record `offset` of `topic` / `partition`: processes
    /// it, or with several input topics holds it for its turn and
    /// processes the held records whose turn has come (`task/merge.rs`).
    fn process(&mut self, topic: &str, partition: i32, offset: i64) -> Result<()> {
        // (Out of `self` meanwhile: the record borrows it.)
        let inputs = std::mem::take(&mut self.inputs);
        let result = self.take_in(&inputs[&(topic.to_string(), partition)][offset as usize], topic, partition, offset);
        self.inputs = inputs;
        result
    }

    fn take_in(&mut self, input: &Input, topic: &str, partition: i32, offset: i64) -> Result<()> {
        let owned = (!input.headers.is_empty()).then(|| {
            input.headers.iter().fold(OwnedHeaders::new_with_capacity(input.headers.len()), |h, (key, value)| {
                h.insert(Header { key, value: value.as_deref() })
            })
        });
        let record = Record {
            topic,
            partition,
            offset,
            timestamp: input.timestamp,
            timestamp_type: if input.timestamp.is_some() { TimestampType::CreateTime } else { TimestampType::NotAvailable },
            key: input.key.as_deref(),
            value: input.value.as_deref(),
            headers: owned.as_ref().map_or(Headers::empty(), Headers::of_owned),
        };
        if self.config.input_topics.len() < 2 {
            return self.process_record(&record);
        }
        let index = self.config.input_topics.iter().position(|t| t == topic).expect("an input topic");
        let task = self.tasks.get_mut(&partition).expect("every partition has a task");
        let order = order_of(&self.config, &record, task.time.stream_time());
        task.held.get_or_insert_with(|| TaskQueues::new(&self.config, partition)).push(Held::of(&record, index, order));
        self.drain()
    }

    /// Several input topics: processes each task's held records whose turn
    /// has come (every record the driver got is fetched: no input is known
    /// to hold more, so an empty one is waited for `max_task_idle` of the
    /// driver's clock).
    fn drain(&mut self) -> Result<()> {
        let config = self.config.clone();
        let idle = i64::try_from(config.max_task_idle.as_millis()).unwrap_or(i64::MAX);
        for partition in 0..self.partitions {
            loop {
                let task = self.tasks.get_mut(&partition).expect("every partition has a task");
                let clock = self.clock;
                let Some(held) = task.held.as_mut().and_then(|h| h.next(&mut || clock, idle, &mut |_, _| Some(false))) else { break };
                self.process_record(&held.record(&config.input_topics, partition))?;
            }
        }
        Ok(())
    }

    /// Hands `record` to its task's processor.
    fn process_record(&mut self, record: &Record<'_>) -> Result<()> {
        let callbacks = Callbacks { config: &self.config, store_index: &self.store_index, globals: Some(&self.globals) };
        let task = self.tasks.get_mut(&record.partition).expect("every partition has a task");
        let with_callbacks = self.processors.callbacks();
        let (processor, fresh) = self.processors.get(record.partition);
        let flags = (fresh, with_callbacks);
        let Handled { processed, fault } = callbacks.record(&mut task.parts(), &self.outputs, record, processor, flags)?;
        if processed {
            task.processed.insert(record.topic.to_string(), record.offset + 1);
        }
        match fault {
            // (The runtime re-initialises the task; a read of a store in
            // memory failing is no case a driver test needs.)
            Some(TaskFault(_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// A loop pass: processors built and initialised, due wall-clock (and
    /// left-over stream-time) timers and punctuations run.
    fn serve(&mut self) -> Result<()> {
        let callbacks = Callbacks { config: &self.config, store_index: &self.store_index, globals: Some(&self.globals) };
        let with_callbacks = self.processors.callbacks();
        for task in self.tasks.values_mut() {
            let (processor, fresh) = self.processors.get(task.partition);
            let flags = (fresh, with_callbacks);
            if let Some(TaskFault(_, e)) = callbacks.serve(&mut task.parts(), &self.outputs, processor, flags, self.clock)? {
                return Err(e);
            }
        }
        Ok(())
    }

    fn maybe_commit(&mut self) -> Result<()> {
        let interval = i64::try_from(self.config.commit_interval.as_millis()).unwrap_or(i64::MAX);
        let bytes: usize = self.tasks.values().flat_map(|t| &t.stores).map(KeyValueStore::uncommitted_bytes).sum();
        if self.clock.saturating_sub(self.last_commit) >= interval || bytes >= self.config.max_uncommitted_bytes {
            self.commit_now()?;
        }
        Ok(())
    }

    /// Commits now: every task's writes, stream time and timers go to its
    /// stores' changelogs and RocksDB, input offsets are committed, and
    /// (exactly-once) the outputs sent since the last commit become visible.
    pub fn commit(&mut self) -> Result<()> {
        self.guarded(|d| {
            d.commit_now()?;
            // Under exactly-once the repartition records just committed
            // reach their tasks now.
            d.feed_repartitions()
        })
    }

    fn commit_now(&mut self) -> Result<()> {
        let time_store = self.config.time_store_index();
        for task in self.tasks.values_mut() {
            for store in task.stores.iter_mut().filter(|s| s.has_ttl()) {
                store.sweep_expired(usize::MAX)?;
            }
            task.time.persist(time_store.map(|i| &mut task.stores[i]))?;
            for store in &mut task.stores {
                if let Some(mut sealed) = store.seal()? {
                    sealed.send_and_build()?;
                    sealed.write()?;
                }
                store.commit_landed();
            }
            task.committed.clone_from(&task.processed);
        }
        self.topics.commit_outputs();
        self.last_commit = self.clock;
        Ok(())
    }

    /// Writes a record of a global table's topic into the table (`None`
    /// value: a tombstone), as its follower would: visible to processors
    /// from the next record on.
    pub fn global_input(&mut self, topic: &str, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        let Some((name, _)) = self.config.global_tables.iter().find(|(_, t)| t == topic) else {
            return Err(Error::InvalidUse(format!("`{topic}` is not the topic of a global table (AppBuilder::global_table)")));
        };
        let store = self.globals.tables.get(name).expect("opened with the driver");
        store.apply(&[(key.to_vec(), value.map(<[u8]>::to_vec))], &BTreeMap::new(), 1)
    }

    /// Moves the wall clock forward by `by`, then runs what became due:
    /// wall-clock timers and punctuations, and a commit if the commit
    /// interval passed.
    pub fn advance_wall_clock(&mut self, by: Duration) -> Result<()> {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.clock = self.clock.saturating_add(by);
        self.guarded(|d| {
            d.drain()?;
            d.serve()?;
            d.maybe_commit()?;
            d.feed_repartitions()
        })
    }

    /// The driver's wall clock, in milliseconds since the epoch.
    pub fn wall_clock(&self) -> i64 {
        self.clock
    }

    /// A crash and a restart, as a `SIGKILL` between two commits and the
    /// instance started again: processors are dropped without
    /// [`close`](Processor::close), writes since the last commit are lost
    /// (and, under exactly-once, the outputs sent since; under
    /// at-least-once they stay sent), stream time and timers come back as
    /// committed, new processors are built and initialised, and every input
    /// record after the last committed offsets is processed again, in the
    /// order it first came. Also starts a driver stopped by an error again.
    /// (A closure given to [`TestDriverBuilder::closure`] is kept, with
    /// whatever it captured: only processors are built anew.)
    pub fn crash_and_restart(&mut self) -> Result<()> {
        self.stopped = None;
        self.guarded(|d| {
            d.processors.drop_all();
            d.topics.abort_outputs();
            let time_store = d.config.time_store_index();
            for task in d.tasks.values_mut() {
                for store in &mut task.stores {
                    store.discard_uncommitted();
                }
                task.time = TaskTime::new(task.partition);
                task.time.load(time_store.map(|i| &task.stores[i]))?;
                for store in &mut task.stores {
                    store.follow_stream_clock(task.time.clock());
                }
                task.processed.clone_from(&task.committed);
                task.held = None; // (after the committed offsets: processed again below)
            }
            d.last_commit = d.clock;
            d.serve()?;
            let tasks = &d.tasks;
            let again: Vec<(String, i32, i64)> = d
                .arrivals
                .iter()
                .filter(|(topic, partition, offset)| *offset >= tasks[partition].committed.get(topic).copied().unwrap_or(0))
                .cloned()
                .collect();
            for (topic, partition, offset) in again {
                d.process(&topic, partition, offset)?;
                d.serve()?;
                d.maybe_commit()?;
            }
            d.feed_repartitions()
        })
    }

    /// Closes every task as a clean shutdown does: each processor's
    /// [`close`](Processor::close), then a final commit. Outputs, stores
    /// and changelogs stay readable; feeding records or moving the clock
    /// afterwards is an error.
    pub fn close(&mut self) -> Result<()> {
        let closed = self.guarded(|d| {
            let callbacks = Callbacks { config: &d.config, store_index: &d.store_index, globals: Some(&d.globals) };
            let flag = d.processors.callbacks();
            for task in d.tasks.values_mut() {
                if let Some(mut processor) = d.processors.take(task.partition) {
                    callbacks.close(&mut task.parts(), &d.outputs, processor.as_mut(), flag);
                }
            }
            d.commit_now()
        });
        self.stopped.get_or_insert_with(|| "it was closed".into());
        closed
    }

    /// The output records sent to `topic` that a `read_committed` consumer
    /// would read, in the order sent (under exactly-once: those of commits
    /// only).
    pub fn outputs(&self, topic: &str) -> Vec<SentRecord> {
        self.topics.outputs().into_iter().filter(|r| r.topic == topic).collect()
    }

    /// Like [`outputs`](Self::outputs), but takes them out: the next call
    /// shows only outputs sent after this one.
    pub fn take_outputs(&mut self, topic: &str) -> Vec<SentRecord> {
        self.topics.take_outputs(topic)
    }

    /// The records of store `store`'s changelog for `partition`, from
    /// offset 0: each commit's latest write of each key (a delete is a
    /// tombstone, a TTL store's values carry their write time in front).
    pub fn changelog(&self, store: &str, partition: i32) -> Result<Vec<SentRecord>> {
        self.task(partition)?;
        let Some(def) = self.config.stores.iter().find(|s| s.name() == store) else {
            return Err(Error::UnknownStore(store.to_string()));
        };
        // (A table's changelog is its topic, which the application never writes.)
        Ok(self.topics.changelog(&def.changelog_topic(&self.config.application_id), partition))
    }

    fn task(&self, partition: i32) -> Result<&DriverTask> {
        self.tasks
            .get(&partition)
            .ok_or_else(|| Error::InvalidUse(format!("partition {partition} does not exist: the driver has {}", self.partitions)))
    }

    /// The byte store `store` of `partition`, as its processor sees it
    /// (uncommitted writes included; on this thread, a wall-clock TTL
    /// reads the driver's clock until the driver is dropped).
    pub fn store(&self, store: &str, partition: i32) -> Result<&KeyValueStore> {
        set_thread_clock(Some(self.clock)); // (its reads of a wall-clock TTL see the driver's clock)
        let task = self.task(partition)?;
        let i = *self.store_index.get(store).ok_or_else(|| Error::UnknownStore(store.to_string()))?;
        Ok(&task.stores[i])
    }

    /// Every entry of key-value store `store` over all partitions, decoded
    /// with `K` and `V`, in partition then key order: what the processor's
    /// scans would see, committed or not. Entries of a TTL store that have
    /// expired are left out, as the store's reads leave them out (a
    /// wall-clock TTL on the driver's clock, [`advance_wall_clock`](Self::advance_wall_clock);
    /// a stream-time TTL on the partition's stream time), whether or not
    /// the sweep deleted them yet. A window or session store's entries are
    /// its internal keys: read those with [`with_context`](Self::with_context).
    pub fn store_entries<K: Codec, V: Codec>(&self, store: &str) -> Result<Vec<(K::Item, V::Item)>> {
        set_thread_clock(Some(self.clock)); // (a wall-clock TTL reads it)
        let mut entries = Vec::new();
        for partition in 0..self.partitions {
            for entry in self.store(store, partition)?.all() {
                let (k, v) = entry?;
                entries.push((K::decode(&k)?, V::decode(&v)?));
            }
        }
        Ok(entries)
    }

    /// Runs `f` with the context `partition`'s processor gets (its stores,
    /// typed, window and session handles, its stream time): for reads the
    /// other methods do not offer. What `f` writes or sends counts as if
    /// the processor had.
    pub fn with_context<T>(&mut self, partition: i32, f: impl FnOnce(&mut ProcessorContext<'_>) -> Result<T>) -> Result<T> {
        self.check_running()?;
        self.task(partition)?;
        set_thread_clock(Some(self.clock));
        let task = self.tasks.get_mut(&partition).expect("checked");
        let mut ctx = ProcessorContext::new(crate::context::ContextParts {
            partition,
            stores: &mut task.stores,
            store_index: &self.store_index,
            outputs: &self.outputs,
            timestamp: None,
            time: &mut task.time,
            time_store: self.config.time_store_index(),
            callbacks: self.processors.callbacks(),
            globals: Some(&self.globals),
            config: &self.config,
            headers: crate::record::Headers::empty(),
        });
        f(&mut ctx)
    }
}

impl Drop for TestDriver {
    fn drop(&mut self) {
        set_thread_clock(None);
    }
}
