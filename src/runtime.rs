//! The processing loop: owns the group consumer, the changelog producer and
//! the restore thread; feeds records to the processor and commits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use crate::app::ShutdownHandle;
use crate::assignment::AssignmentEvent;
use crate::changelog::{self, ChangelogProducer, ChangelogSpec};
use crate::codec::Codec;
use crate::consumer_batch::{pending_events, serve_consumer_queue, PolledBatch, QueueHandle, POLL_BATCH};
use crate::config::{AppConfig, ProcessingDecision};
use crate::engine::EngineResources;
use crate::error::{Error, Result};
use crate::fetch_wake::{self, FetchWaker};
use crate::restore::{NoopListener, Restorer};
use crate::store::{KeyValueStore, TypedStore};
use crate::task::{Task, TaskManager, TaskState};

/// One input record, as handed to the processor.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Input topic.
    pub topic: &'a str,
    /// Input partition (the task's partition).
    pub partition: i32,
    /// Offset in the input partition.
    pub offset: i64,
    /// Record timestamp in milliseconds since the epoch, if any.
    pub timestamp: Option<i64>,
    /// Record key.
    pub key: Option<&'a [u8]>,
    /// Record value (`None` for a tombstone).
    pub value: Option<&'a [u8]>,
}

impl<'a> Record<'a> {
    /// The value as UTF-8, if it is valid UTF-8.
    pub fn value_str(&self) -> Option<&'a str> {
        self.value.and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The key as UTF-8, if it is valid UTF-8.
    pub fn key_str(&self) -> Option<&'a str> {
        self.key.and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// What the processor can reach while handling a record: the stores of the
/// record's partition.
pub struct ProcessorContext<'t> {
    task: &'t mut Task,
    store_index: &'t HashMap<String, usize>,
}

impl<'t> ProcessorContext<'t> {
    /// The partition being processed.
    pub fn partition(&self) -> i32 {
        self.task.partition
    }

    /// The byte store named `name` for this partition.
    pub fn store(&mut self, name: &str) -> Result<&mut KeyValueStore> {
        let i = *self.store_index.get(name).ok_or_else(|| Error::UnknownStore(name.to_string()))?;
        Ok(&mut self.task.stores[i])
    }

    /// The store named `name` with key codec `K` and value codec `V`.
    pub fn typed_store<K: Codec, V: Codec>(&mut self, name: &str) -> Result<TypedStore<'_, K, V>> {
        Ok(TypedStore::new(self.store(name)?))
    }
}

/// Shared between the loop and the rebalance callbacks (which run inside `poll`).
struct Shared {
    tasks: Mutex<TaskManager>,
    fatal: Mutex<Option<Error>>,
    /// Where assigned partitions' records go (read in batches by the loop);
    /// taken out before the consumer is dropped.
    records: Mutex<Option<Arc<QueueHandle>>>,
}

/// How long an idle loop pass waits for records.
const IDLE_WAIT: Duration = Duration::from_millis(10);
/// Records processed between checks of the commit deadline and shutdown
/// inside a polled batch (a clock read per record would cost ~2% at 1M/s).
const DEADLINE_CHECK_EVERY: usize = 32;

/// Installs the runtime's handles in the task manager (the fetch waker and
/// the offset-commit queue) and takes them out again when dropped, also
/// while unwinding: the waker thread ends once the last waker is gone (the
/// scope waits for it), and the queue must not outlive the consumer.
struct TaskHandlesInstalled<'s>(&'s Shared);

impl<'s> TaskHandlesInstalled<'s> {
    fn install(shared: &'s Shared, waker: FetchWaker, commit_queue: Arc<QueueHandle>) -> Self {
        let mut tasks = shared.tasks.lock().expect("task lock");
        tasks.fetch_waker = Some(waker);
        tasks.commit_queue = Some(commit_queue);
        TaskHandlesInstalled(shared)
    }
}

impl Drop for TaskHandlesInstalled<'_> {
    fn drop(&mut self) {
        let mut tasks = self.0.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        tasks.fetch_waker = None;
        tasks.commit_queue = None;
    }
}

/// Keeps the record queue in `Shared` (for the rebalance callback) and takes
/// it out again when dropped, so it never outlives the consumer.
struct RecordQueueGuard<'s>(&'s Shared);

impl<'s> RecordQueueGuard<'s> {
    fn install(shared: &'s Shared, queue: Arc<QueueHandle>) -> Self {
        *shared.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(queue);
        RecordQueueGuard(shared)
    }
}

impl Drop for RecordQueueGuard<'_> {
    fn drop(&mut self) {
        self.0.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    }
}

struct RuntimeContext {
    shared: Arc<Shared>,
    /// Whether the group uses the cooperative protocol (incremental
    /// assign/unassign) rather than eager `assign`.
    cooperative: bool,
}

impl ClientContext for RuntimeContext {}

fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect()
}

impl RuntimeContext {
    /// librdkafka pauses every assigned partition while a rebalance callback
    /// runs and resumes them when it (incrementally) assigns or unassigns,
    /// without waking its broker threads (`rd_kafka_toppar_pause_resume`
    /// only flips a flag): the partitions a member keeps got no records for
    /// up to 1 s after each cooperative round (measured 0.60 s). A
    /// watermark query per partition wakes their fetchers (see
    /// [`crate::fetch_wake`]).
    fn wake_kept_partitions(&self, consumer: &BaseConsumer<Self>, new: Option<&TopicPartitionList>) {
        let Ok(current) = consumer.assignment() else { return };
        let mut kept = TopicPartitionList::new();
        for e in current.elements() {
            if new.is_none_or(|n| n.find_partition(e.topic(), e.partition()).is_none()) {
                kept.add_partition(e.topic(), e.partition());
            }
        }
        if kept.count() == 0 {
            return;
        }
        let tasks = self.shared.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(waker) = &tasks.fetch_waker {
            waker.wake(&kept);
        }
    }
}

impl ConsumerContext for RuntimeContext {
    /// rust-rdkafka's default asks librdkafka for the rebalance protocol on
    /// every rebalance. That call, like `assign`, waits forever once the
    /// group has terminated during the consumer's close (librdkafka#4041,
    /// rust-rdkafka#509; seen here as a test hanging in `BaseConsumer`'s
    /// drop on a stale rebalance event). kstate knows its protocol from its
    /// configuration, and ignores rebalance events once the consumer closed.
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let rk = consumer.client().native_ptr();
        // SAFETY: a live consumer handle (we are inside its poll).
        if unsafe { rdkafka::bindings::rd_kafka_consumer_closed(rk) } == 1 {
            tracing::debug!(error = ?err, "rebalance event after the consumer closed; ignored");
            return;
        }
        let assign = err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        let rebalance = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(tpl),
            other => Rebalance::Error(KafkaError::Rebalance(other.into())),
        };
        self.pre_rebalance(consumer, &rebalance);
        // Anything but an assignment (revocations and errors) gives up the
        // partitions, as rust-rdkafka's default does.
        let failure = assign_or_unassign(rk, tpl, assign, self.cooperative);
        if let Some(e) = failure {
            tracing::error!(error = %e, assign, "applying a rebalance failed");
        }
        // Newly assigned partitions stay paused until their restore ends.
        self.wake_kept_partitions(consumer, if assign { Some(&*tpl) } else { None });
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // Before the assignment takes effect, so no record of these
            // partitions reaches the consumer queue first.
            let records = self.shared.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(q) = records.as_ref() {
                for (topic, p) in partitions(tpl) {
                    if !q.forward_partition(consumer, &topic, p) {
                        tracing::warn!(%topic, partition = p, "cannot forward the partition to the record queue; reading it one record at a time");
                    }
                }
            }
        }
        if let Rebalance::Revoke(tpl) = rebalance {
            let tps = partitions(tpl);
            let event = if consumer.assignment_lost() {
                tracing::warn!(partitions = ?tps, "assignment lost; closing tasks without commit");
                AssignmentEvent::Lost(tps)
            } else {
                tracing::info!(partitions = ?tps, "partitions revoked; committing and closing");
                AssignmentEvent::Revoked(tps)
            };
            // A poisoned lock means the processor panicked mid-record: its
            // writes are uncommitted, so close without committing.
            let (mut tasks, event) = match self.shared.tasks.lock() {
                Ok(t) => (t, event),
                Err(poisoned) => (poisoned.into_inner(), AssignmentEvent::Lost(partitions(tpl))),
            };
            if let Err(e) = tasks.on_event(consumer, event) {
                tracing::error!(error = %e, "commit on revoke failed");
                self.shared.fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(e);
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                // No record of a new partition may be processed before its
                // restore ends: pause at once, resume when it runs.
                if let Err(e) = consumer.pause(tpl) {
                    tracing::error!(error = %e, "pausing newly assigned partitions failed");
                }
                let tps = partitions(tpl);
                tracing::info!(partitions = ?tps, "partitions assigned");
                let mut tasks = self.shared.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let _ = tasks.on_event(consumer, AssignmentEvent::Assigned(tps));
            }
            Rebalance::Error(e) => tracing::error!(error = %e, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }
}

/// Applies a rebalance to the consumer: (incremental) assign of `tpl`, or
/// unassign. Returns librdkafka's error, if any.
fn assign_or_unassign(
    rk: *mut rdkafka::bindings::rd_kafka_t,
    tpl: &TopicPartitionList,
    assign: bool,
    cooperative: bool,
) -> Option<String> {
    use rdkafka::bindings as rdsys;
    // SAFETY: `rk` is the live consumer handle of the rebalance callback and
    // `tpl` the event's list; a returned error object is destroyed here.
    unsafe {
        if cooperative {
            let error = if assign {
                rdsys::rd_kafka_incremental_assign(rk, tpl.ptr())
            } else {
                rdsys::rd_kafka_incremental_unassign(rk, tpl.ptr())
            };
            if error.is_null() {
                return None;
            }
            let text = std::ffi::CStr::from_ptr(rdsys::rd_kafka_error_string(error)).to_string_lossy().into_owned();
            rdsys::rd_kafka_error_destroy(error);
            Some(text)
        } else {
            let err = rdsys::rd_kafka_assign(rk, if assign { tpl.ptr() } else { std::ptr::null_mut() });
            (err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| RDKafkaErrorCode::from(err).to_string())
        }
    }
}

fn client_config(config: &AppConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers);
    for (k, v) in &config.kafka_overrides {
        c.set(k, v);
    }
    c
}

/// Checks that the brokers answer and returns the input partition count.
fn input_partitions(admin: &AdminClient<DefaultClientContext>, config: &AppConfig) -> Result<i32> {
    let md = admin.inner().fetch_metadata(None, config.startup_timeout).map_err(|e| Error::BrokerUnreachable {
        bootstrap: config.bootstrap_servers.clone(),
        timeout: config.startup_timeout,
        detail: e.to_string(),
    })?;
    let mut count = None;
    for topic in &config.input_topics {
        let n = match md.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => t.partitions().len() as i32,
            _ => return Err(Error::MissingInputTopic(topic.clone())),
        };
        match count {
            None => count = Some((topic, n)),
            Some((first, m)) if m != n => {
                return Err(Error::Config(format!(
                    "input topics must be co-partitioned: `{first}` has {m} partitions, `{topic}` has {n}"
                )))
            }
            _ => {}
        }
    }
    Ok(count.map(|c| c.1).unwrap_or(0))
}

pub(crate) fn run<F, E>(config: Arc<AppConfig>, shutdown: ShutdownHandle, mut processor: F) -> Result<()>
where
    F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let base = client_config(&config);
    // TLS and SASL failures are typed errors at once, not a startup timeout.
    let security = crate::group::security::Security::from_kafka_config(&config.kafka_overrides)?;
    let client_id = format!("{}-kstate", config.application_id);
    let connect_timeout = config.startup_timeout.min(Duration::from_secs(10));
    crate::group::coordinator::Brokers::new(&config.bootstrap_servers, security, client_id, connect_timeout)
        .reach(config.startup_timeout)?;
    let admin: AdminClient<DefaultClientContext> = base.create()?;
    let partitions = input_partitions(&admin, &config)?;
    let specs: Vec<ChangelogSpec> = config
        .stores
        .iter()
        .map(|s| ChangelogSpec {
            topic: changelog::changelog_topic(&config.application_id, s.name()),
            partitions,
            replication: config.changelog_replication_factor,
            extra_configs: s.changelog_configs().to_vec(),
        })
        .collect();
    let infos = changelog::ensure_topics(&admin, &specs, config.startup_timeout)?;
    drop(admin);
    // One producer serves every changelog, so its batches must fit the
    // smallest max.message.bytes; that is also the per-record limit.
    let max_message_bytes = infos.values().map(|i| i.max_message_bytes).min().unwrap_or(1_000_000);
    let producer = Arc::new(ChangelogProducer::new(base.clone(), max_message_bytes, config.commit_timeout)?);

    let mut restore_config = base.clone();
    restore_config.set("group.id", format!("{}-kstate-restore", config.application_id));
    let listener = config.restore_listener.clone().unwrap_or_else(|| Arc::new(NoopListener));
    let restorer = Restorer::start(restore_config, listener, config.startup_timeout)?;

    let resources = EngineResources::new(config.block_cache_bytes, config.write_buffer_bytes);
    let shared = Arc::new(Shared {
        tasks: Mutex::new(TaskManager::new(
            config.clone(),
            producer,
            resources,
            max_message_bytes,
            infos.iter().filter_map(|(topic, i)| Some((topic.clone(), i.tombstone_retention?))).collect(),
            restorer,
        )),
        fatal: Mutex::new(None),
        records: Mutex::new(None),
    });

    let strategy = config.assignment.librdkafka_name(config.input_topics.len());
    let cooperative = strategy == "cooperative-sticky";
    let mut consumer_config = base.clone();
    consumer_config
        .set("group.id", &config.application_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("partition.assignment.strategy", strategy);
    crate::config::set_default(&mut consumer_config, "auto.offset.reset", "earliest");
    // As for restores: librdkafka otherwise pauses fetching for up to 1 s
    // whenever 100k messages per partition are queued, starving a busy loop,
    // and with no pause at all its fetch thread spins on a full queue (2M
    // records: 6.4 s of fetch thread CPU instead of 1.7 s, 190k -> 281k
    // records/s). librdkafka's default queue depth (queued.min.messages
    // 100k per partition) is kept: since commits no longer stall the
    // processing thread, a 10x deeper queue only cost memory (2M-record
    // write benchmark: 612 -> 381 MiB peak RSS, 843k -> 924k records/s).
    crate::config::set_default(&mut consumer_config, "fetch.queue.backoff.ms", crate::restore::FETCH_QUEUE_BACKOFF_MS);
    // A partition resumed while a fetch is in flight joins the next fetch,
    // which a broker holds back up to fetch.wait.max.ms when the partitions
    // already fetched have no new data. librdkafka's 500 ms delayed every
    // task whose restore ended after another task started running (restore
    // demo after a crash: caught up 0.87 s after start; with 100 ms, see
    // CHANGELOG). An idle consumer sends a few more fetches (10/s).
    crate::config::set_default(&mut consumer_config, "fetch.wait.max.ms", "100");
    let consumer: BaseConsumer<RuntimeContext> =
        consumer_config.create_with_context(RuntimeContext { shared: shared.clone(), cooperative })?;
    let (waker, wake_requests) = FetchWaker::new();
    let result = std::thread::scope(|scope| -> Result<()> {
        std::thread::Builder::new()
            .name("kstate-fetch-wake".into())
            .spawn_scoped(scope, || fetch_wake::run(&consumer, wake_requests))
            .map_err(|e| Error::io("kstate-fetch-wake thread", e))?;
        // SAFETY: `records`, `commit_queue` and the guards' copies are
        // declared after the consumer, so all are dropped before it on every path.
        let records = Arc::new(unsafe { QueueHandle::new(&consumer) });
        let _records_in_shared = RecordQueueGuard::install(&shared, records.clone());
        let commit_queue = Arc::new(unsafe { QueueHandle::new(&consumer) });
        // Removed again on every path out of this scope.
        let _installed = TaskHandlesInstalled::install(&shared, waker, commit_queue);
        let topics: Vec<&str> = config.input_topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        tracing::info!(application_id = %config.application_id, topics = ?topics, partitions, "kstate started");

        let store_index: HashMap<String, usize> =
            config.stores.iter().enumerate().map(|(i, s)| (s.name().to_string(), i)).collect();
        let result = process_loop(&config, &shutdown, &consumer, &records, &shared, &store_index, &mut processor);

        let mut tasks = shared.tasks.lock().expect("task lock");
        let result = match result {
            Ok(()) => {
                let r = tasks.commit_closing(&consumer, None);
                if r.is_err() {
                    tasks.discard_all();
                }
                r
            }
            Err(e) => {
                tasks.discard_all();
                Err(e)
            }
        };
        tasks.close_all();
        drop(tasks);
        consumer.unsubscribe();
        // Serve the revoke callback of the unsubscribe before the consumer closes.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && consumer.assignment().map(|a| a.count() > 0).unwrap_or(false) {
            let _ = consumer.poll(Duration::from_millis(50));
        }
        result
    });
    drop(consumer);
    tracing::info!(application_id = %config.application_id, ok = result.is_ok(), "kstate stopped");
    result
}

fn process_loop<F, E>(
    config: &AppConfig,
    shutdown: &ShutdownHandle,
    consumer: &BaseConsumer<RuntimeContext>,
    records: &QueueHandle,
    shared: &Shared,
    store_index: &HashMap<String, usize>,
    processor: &mut F,
) -> Result<()>
where
    F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut polled = PolledBatch::new(records, POLL_BATCH);
    let mut consumer_errors = ErrorLog::default();
    let mut last_commit = Instant::now();
    while !shutdown.is_shutdown() {
        {
            let mut tasks = shared.tasks.lock().expect("task lock");
            tasks.open_pending(consumer)?;
            tasks.collect_restored(consumer)?;
            tasks.poll_inflight(consumer)?;
            tasks.poll_offset_commit()?;
        }
        // The consumer queue: rebalance callbacks, errors and logs (served
        // by rust-rdkafka, one per call), and records of partitions that
        // could not be forwarded to the record queue.
        serve_consumer_queue(consumer, |event| {
            // Rebalance callbacks run inside poll and report failures (e.g.
            // the commit on revoke) here: stop before committing anything else.
            if let Some(e) = shared.fatal.lock().expect("fatal lock").take() {
                return Err(e);
            }
            match event {
                Some(Ok(msg)) => {
                    let record = Record {
                        topic: msg.topic(),
                        partition: msg.partition(),
                        offset: msg.offset(),
                        timestamp: msg.timestamp().to_millis(),
                        key: msg.key(),
                        value: msg.payload(),
                    };
                    process_one(&mut shared.tasks.lock().expect("task lock"), config, store_index, &record, processor)?;
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                // librdkafka's fatal errors leave the consumer unusable (e.g.
                // another instance joined with the same group.instance.id).
                Some(Err(e @ KafkaError::MessageConsumptionFatal(_))) => {
                    tracing::error!(error = %e, "fatal consumer error; stopping");
                    return Err(e.into());
                }
                Some(Err(e)) => consumer_errors.warn(&e),
            }
            Ok(())
        })?;
        // At the bound on uncommitted writes, with a commit still being
        // written (brokers slow or away): take no records until it lands,
        // but keep serving the group (rebalances, heartbeats, max.poll.interval).
        if shared.tasks.lock().expect("task lock").backpressure() {
            std::thread::sleep(IDLE_WAIT);
            continue;
        }
        // The record queue, in batches. Waiting here delays events, task
        // openings and restored tasks: only briefly, and not at all when
        // an event is already waiting.
        let wait = if pending_events(consumer) > 0 { Duration::ZERO } else { IDLE_WAIT };
        if polled.poll(wait) > 0 {
            let mut tasks = shared.tasks.lock().expect("task lock");
            let mut seek_back = Vec::new();
            for (i, msg) in polled.iter().enumerate() {
                // A batch of a slow processor can take seconds: keep to the
                // commit interval and stop promptly on shutdown inside it
                // (records not processed are not committed).
                if i > 0 && i % DEADLINE_CHECK_EVERY == 0 {
                    if shutdown.is_shutdown() {
                        break;
                    }
                    if last_commit.elapsed() >= config.commit_interval && tasks.commit_pipelined(consumer)? {
                        last_commit = Instant::now();
                    }
                }
                let (partition, offset) = (msg.partition(), msg.offset());
                let Ok(topic) = std::str::from_utf8(msg.topic()) else { continue }; // names are ASCII
                if let Some(e) = msg.error() {
                    consumer_errors.warn_at(&e, topic, partition, offset);
                    // A batch poll moves the position past an error too, but
                    // its offset is the next record not yet delivered: seek
                    // back so no record is skipped.
                    if offset >= 0 {
                        seek_back.push((topic.to_string(), partition, offset));
                    }
                    continue;
                }
                if !seek_back.is_empty() {
                    // Delivered after all: no need to seek back for it.
                    seek_back.retain(|(t, p, o)| !(*p == partition && t == topic && offset >= *o));
                }
                let record = Record {
                    topic,
                    partition,
                    offset,
                    timestamp: msg.timestamp(),
                    key: msg.key(),
                    value: msg.payload(),
                };
                process_one(&mut tasks, config, store_index, &record, processor)?;
            }
            for (topic, partition, offset) in seek_back {
                if let Err(e) = consumer.seek(&topic, partition, Offset::Offset(offset), Duration::from_secs(10)) {
                    tracing::warn!(error = %e, %topic, partition, offset, "seeking back after a consumer error failed");
                }
            }
            if tasks.uncommitted_bytes() >= config.max_uncommitted_bytes && tasks.commit_pipelined(consumer)? {
                last_commit = Instant::now();
            }
        }
        if last_commit.elapsed() >= config.commit_interval && shared.tasks.lock().expect("task lock").commit_pipelined(consumer)? {
            last_commit = Instant::now();
        }
    }
    Ok(())
}

/// Logs consumer errors without flooding: while brokers are down librdkafka
/// reports the same error for every connection and partition many times a
/// second. Each distinct message is logged once per [`ERROR_LOG_EVERY`],
/// with the number of repeats held back.
#[derive(Default)]
struct ErrorLog {
    seen: HashMap<String, (Instant, u64)>,
}

const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

impl ErrorLog {
    fn due(&mut self, text: String) -> Option<(String, u64)> {
        let now = Instant::now();
        match self.seen.get_mut(&text) {
            Some((last, repeats)) if now - *last < ERROR_LOG_EVERY => {
                *repeats += 1;
                None
            }
            Some((last, repeats)) => {
                *last = now;
                Some((text, std::mem::take(repeats)))
            }
            None => {
                if self.seen.len() > 1000 {
                    self.seen.clear();
                }
                self.seen.insert(text.clone(), (now, 0));
                Some((text, 0))
            }
        }
    }

    fn warn(&mut self, error: &KafkaError) {
        if let Some((error, repeated)) = self.due(error.to_string()) {
            tracing::warn!(%error, repeated, "consumer error");
        }
    }

    fn warn_at(&mut self, error: &impl std::fmt::Display, topic: &str, partition: i32, offset: i64) {
        if let Some((error, repeated)) = self.due(format!("{error} ({topic} [{partition}])")) {
            tracing::warn!(%error, topic, partition, offset, repeated, "consumer error");
        }
    }
}

fn process_one<F, E>(
    tasks: &mut TaskManager,
    config: &AppConfig,
    store_index: &HashMap<String, usize>,
    record: &Record<'_>,
    processor: &mut F,
) -> Result<()>
where
    F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (topic, partition, offset) = (record.topic, record.partition, record.offset);
    let Some(task) = tasks.tasks.get_mut(&partition) else {
        return Ok(()); // revoked while the record was in flight
    };
    if task.state != TaskState::Running || !task.topics.contains(topic) {
        // Fetched before the pause took effect: replay it once the task runs.
        let r = task.rewind.entry(topic.to_string()).or_insert(offset);
        *r = (*r).min(offset);
        return Ok(());
    }
    let mut ctx = ProcessorContext { task, store_index };
    if let Err(e) = processor(&mut ctx, record) {
        let source: Box<dyn std::error::Error + Send + Sync> = e.into();
        let decision = match &config.processing_exception_handler {
            Some(handler) => handler(record, &*source),
            None => ProcessingDecision::Fail,
        };
        if decision != ProcessingDecision::Continue {
            return Err(Error::Processor { topic: topic.to_string(), partition, offset, source });
        }
        tracing::warn!(topic, partition, offset, error = %source, "processor failed; the handler skips the record");
        metrics::counter!(crate::metrics::SKIPPED_RECORDS, "topic" => topic.to_string(), "partition" => partition.to_string())
            .increment(1);
    }
    // No String allocation per record: the topic's entry exists after its first record.
    match task.offsets.get_mut(topic) {
        Some(next) => *next = offset + 1,
        None => {
            task.offsets.insert(topic.to_string(), offset + 1);
            // Where a re-initialised task restarts if nothing was committed yet.
            if !task.restart_from.contains_key(topic) {
                task.restart_from.insert(topic.to_string(), offset);
            }
        }
    }
    Ok(())
}
