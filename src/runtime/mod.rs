//! The processing loop: owns the group consumer, the changelog producer and
//! the restore thread; feeds records to the processor and commits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use crate::shutdown::ShutdownHandle;
use crate::assignment::AssignmentEvent;
use crate::kafka::{self, ChangelogProducer, ChangelogSpec};
use crate::context::ProcessorContext;
use crate::kafka::consumer_batch::{pending_events, serve_consumer_queue, PolledBatch, QueueHandle, POLL_BATCH};
use crate::config::{AppConfig, ProcessingDecision, ProcessingGuarantee};
use crate::store::engine::EngineResources;
use crate::error::{Error, Result};
use crate::kafka::fetch_wake::{self, FetchWaker};
use crate::group::Brokers;
use crate::group::{GroupEvent, GroupSettings, Membership};
use crate::group::Committer;
use crate::record::{Headers, Record, TimestampType};
use crate::restore::{NoopListener, Restorer};
use crate::task::{TaskManager, TaskState};

/// The task manager, shared with the membership thread (which reads the
/// checkpoints of open stores for its subscription).
struct Shared {
    tasks: Mutex<TaskManager>,
}

/// How long an idle loop pass waits for records.
const IDLE_WAIT: Duration = Duration::from_millis(10);
/// Records processed between checks of the commit deadline and shutdown
/// inside a polled batch (a clock read per record would cost ~2% at 1M/s).
const DEADLINE_CHECK_EVERY: usize = 32;
/// How long a clean shutdown waits for LeaveGroup.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Installs the fetch waker in the task manager and takes it out again
/// when dropped, also while unwinding: the waker thread ends once the last
/// waker is gone (the scope waits for it).
struct WakerInstalled<'s>(&'s Shared);

impl<'s> WakerInstalled<'s> {
    fn install(shared: &'s Shared, waker: FetchWaker) -> Self {
        shared.tasks.lock().expect("task lock").fetch_waker = Some(waker);
        WakerInstalled(shared)
    }
}

impl Drop for WakerInstalled<'_> {
    fn drop(&mut self) {
        self.0.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).fetch_waker = None;
    }
}

/// The processing consumer's context. The consumer only ever `assign`s
/// (kstate's own membership decides what it reads), so librdkafka runs no
/// rebalance callbacks.
struct RuntimeContext;

impl ClientContext for RuntimeContext {}
impl ConsumerContext for RuntimeContext {}

/// Input partitions of `tasks`: partition `p` of every input topic.
fn input_partitions_of(topics: &[String], tasks: impl IntoIterator<Item = i32> + Clone) -> Vec<(String, i32)> {
    topics.iter().flat_map(|t| tasks.clone().into_iter().map(move |p| (t.clone(), p))).collect()
}

fn tpl_of(tps: &[(String, i32)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in tps {
        tpl.add_partition(t, *p);
    }
    tpl
}

/// Applies what the membership reports: a new generation's tasks (revoked
/// ones committed under it and closed, new ones assigned paused until
/// restored), or the loss of every active task (closed without commit).
/// Every event is acknowledged once applied: the membership rejoins only
/// after that.
fn apply_group_events(
    membership: &Membership,
    consumer: &BaseConsumer<RuntimeContext>,
    records: &QueueHandle,
    tasks: &mut TaskManager,
    topics: &[String],
) -> Result<()> {
    loop {
        let event = match membership.events.try_recv() {
            Ok(event) => event,
            Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(()),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                return Err(Error::GroupMembership {
                    group: String::new(),
                    detail: "the group membership thread stopped unexpectedly".into(),
                })
            }
        };
        match event {
            GroupEvent::Assigned { generation, active, standby, since } => {
                let owned = tasks.partitions();
                tasks.generation = Some(generation.clone());
                // Exactly-once: a commit caught by this rebalance completes
                // under the new generation, before anything is revoked.
                let parked = tasks.complete_parked(consumer);
                tasks.set_standby_target(standby.clone());
                let revoked: Vec<i32> = owned.difference(&active).copied().collect();
                let new: Vec<i32> = active.difference(&owned).copied().collect();
                tracing::info!(generation = generation.id, active = ?active, standby = ?standby, revoked = ?revoked, new = ?new,
                    "applying the group's assignment");
                if !revoked.is_empty() {
                    let tps = input_partitions_of(topics, revoked);
                    let committed = tasks.on_event(consumer, AssignmentEvent::Revoked(tps.clone()));
                    if let Err(e) = consumer.incremental_unassign(&tpl_of(&tps)) {
                        tracing::warn!(error = %e, "unassigning revoked partitions failed");
                    }
                    committed?;
                }
                if !new.is_empty() {
                    let tps = input_partitions_of(topics, new);
                    // Before the assignment takes effect, so no record of
                    // these partitions reaches the consumer queue first.
                    for (topic, p) in &tps {
                        if !records.forward_partition(consumer, topic, *p) {
                            tracing::warn!(%topic, partition = p, "cannot forward the partition to the record queue; reading it one record at a time");
                        }
                    }
                    let tpl = tpl_of(&tps);
                    consumer.incremental_assign(&tpl)?;
                    // No record of a new partition may be processed before
                    // its restore ends: paused until it runs.
                    consumer.pause(&tpl)?;
                    tasks.on_event(consumer, AssignmentEvent::Assigned(tps))?;
                }
                membership.applied();
                parked?;
                metrics::counter!(crate::metrics::REBALANCES).increment(1);
                metrics::histogram!(crate::metrics::REBALANCE_SECONDS).record(since.elapsed().as_secs_f64());
                metrics::gauge!(crate::metrics::GROUP_GENERATION).set(generation.id as f64);
                metrics::gauge!(crate::metrics::TASKS, "role" => "active").set(active.len() as f64);
                metrics::gauge!(crate::metrics::TASKS, "role" => "standby").set(standby.len() as f64);
            }
            GroupEvent::Lost { reason } => {
                let tps = input_partitions_of(topics, tasks.partitions());
                tracing::warn!(%reason, partitions = ?tps, "tasks lost; closing them without commit");
                tasks.generation = None;
                let closed = tasks.on_event(consumer, AssignmentEvent::Lost(tps.clone()));
                if let Err(e) = consumer.incremental_unassign(&tpl_of(&tps)) {
                    tracing::warn!(error = %e, "unassigning lost partitions failed");
                }
                membership.applied();
                closed?;
            }
            GroupEvent::Failed(e) => return Err(e),
        }
    }
}

/// A process id that survives restarts, kept in the application's state
/// directory (Kafka Streams keeps one there too): the group tells an
/// instance that restarted apart from a new one.
/// The file under `<state_dir>/<application_id>` that holds this instance's process id.
pub(crate) const PROCESS_ID_FILE: &str = "kstate.process-id";

fn process_id(config: &AppConfig) -> Result<String> {
    let dir = config.state_dir.join(&config.application_id);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
    let path = dir.join(PROCESS_ID_FILE);
    if let Ok(id) = std::fs::read_to_string(&path) {
        let id = id.trim();
        if !id.is_empty() {
            return Ok(id.to_string());
        }
    }
    let mut raw = [0u8; 16];
    openssl::rand::rand_bytes(&mut raw).map_err(|e| Error::Config(format!("no random bytes for a process id: {e}")))?;
    let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, &id).map_err(|e| Error::io(path.display().to_string(), e))?;
    Ok(id)
}

/// The tasks whose state is on this instance's disk, with the sum of
/// their stores' checkpoints (+1 each) as of their last clean close, read
/// from the checkpoint hints beside the databases (opening every RocksDB
/// instance would take long); 0 for a store without a hint.
fn local_tasks(config: &AppConfig, partitions: i32) -> std::collections::BTreeMap<i32, i64> {
    let mut found = std::collections::BTreeMap::new();
    for store in &config.stores {
        for p in 0..partitions {
            let dir = config.store_dir(store.name(), p);
            if dir.is_dir() {
                let next = crate::store::engine::read_checkpoint_hint(&dir).map_or(0, |c| c + 1);
                *found.entry(p).or_insert(0) += next;
            }
        }
    }
    found
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
    let security = crate::group::Security::from_kafka_config(&config.kafka_overrides)?;
    let client_id = format!("{}-kstate", config.application_id);
    let connect_timeout = config.startup_timeout.min(Duration::from_secs(10));
    Brokers::new(&config.bootstrap_servers, security.clone(), client_id.clone(), connect_timeout)
        .reach(config.startup_timeout)?;
    let admin: AdminClient<DefaultClientContext> = base.create()?;
    let partitions = input_partitions(&admin, &config)?;
    let specs: Vec<ChangelogSpec> = config
        .stores
        .iter()
        .map(|s| ChangelogSpec {
            topic: kafka::changelog_topic(&config.application_id, s.name()),
            partitions,
            replication: config.changelog_replication_factor,
            extra_configs: s.changelog_configs().to_vec(),
        })
        .collect();
    let infos = kafka::ensure_topics(&admin, &specs, config.startup_timeout)?;
    drop(admin);
    // One producer serves every changelog, so its batches must fit the
    // smallest max.message.bytes; that is also the per-record limit.
    let max_message_bytes = infos.values().map(|i| i.max_message_bytes).min().unwrap_or(1_000_000);
    let process_id = process_id(&config)?;
    let new_producer: Box<dyn Fn() -> Result<ChangelogProducer> + Send> = {
        let (base, config) = (base.clone(), config.clone());
        let transactional_id = format!("{}-{process_id}", config.application_id);
        Box::new(move || match config.processing_guarantee {
            ProcessingGuarantee::AtLeastOnce => ChangelogProducer::new(base.clone(), max_message_bytes, config.commit_timeout),
            ProcessingGuarantee::ExactlyOnce => ChangelogProducer::transactional(
                base.clone(),
                max_message_bytes,
                config.commit_timeout,
                transactional_id.clone(),
                config.transaction_timeout,
                config.startup_timeout,
            ),
        })
    };
    // Exactly-once: initialising the producer aborts what a previous
    // incarnation of this instance left open, before anything restores.
    let producer = Arc::new(new_producer()?);

    let mut restore_config = base.clone();
    restore_config.set("group.id", format!("{}-kstate-restore", config.application_id));
    let listener = config.restore_listener.clone().unwrap_or_else(|| Arc::new(NoopListener));
    let restorer = Restorer::start(restore_config, listener, config.startup_timeout)?;

    let resources = match config.max_state_memory {
        Some(total) => EngineResources::bounded(total, config.write_buffer_bytes),
        None => EngineResources::new(config.block_cache_bytes, config.write_buffer_bytes),
    };
    let mut task_manager = TaskManager::new(
        config.clone(),
        producer,
        resources,
        max_message_bytes,
        infos.iter().filter_map(|(topic, i)| Some((topic.clone(), i.tombstone_retention?))).collect(),
        restorer,
    );
    let brokers = Brokers::new(&config.bootstrap_servers, security, client_id, connect_timeout);
    warn_truncated_changelogs(&brokers, &specs, partitions);
    task_manager.committer = Some(Committer::start(brokers.clone(), config.application_id.clone())?);
    task_manager.brokers = Some(brokers.clone());
    task_manager.new_producer = Some(new_producer);
    let shared = Arc::new(Shared { tasks: Mutex::new(task_manager) });

    let mut consumer_config = base.clone();
    for key in crate::config::MEMBERSHIP_KEYS {
        consumer_config.remove(key);
    }
    consumer_config
        .set("group.id", &config.application_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    crate::kafka::client::set_default(&mut consumer_config, "auto.offset.reset", "earliest");
    if config.processing_guarantee == ProcessingGuarantee::ExactlyOnce {
        // Committed offsets read stable (a previous owner's open transaction
        // ends first) and no aborted input records.
        consumer_config.set("isolation.level", "read_committed");
    }
    // As for restores: librdkafka otherwise pauses fetching for up to 1 s
    // whenever 100k messages per partition are queued, starving a busy loop,
    // and with no pause at all its fetch thread spins on a full queue (2M
    // records: 6.4 s of fetch thread CPU instead of 1.7 s, 190k -> 281k
    // records/s). librdkafka's default queue depth (queued.min.messages
    // 100k per partition) is kept: since commits no longer stall the
    // processing thread, a 10x deeper queue only cost memory.
    crate::kafka::client::set_default(&mut consumer_config, "fetch.queue.backoff.ms", crate::restore::FETCH_QUEUE_BACKOFF_MS);
    // A partition resumed while a fetch is in flight joins the next fetch,
    // which a broker holds back up to fetch.wait.max.ms when the partitions
    // already fetched have no new data. librdkafka's 500 ms delayed every
    // task whose restore ended after another task started running. An idle
    // consumer sends a few more fetches (10/s).
    crate::kafka::client::set_default(&mut consumer_config, "fetch.wait.max.ms", "100");
    let consumer: BaseConsumer<RuntimeContext> = consumer_config.create_with_context(RuntimeContext)?;

    let timeouts = config.group_timeouts()?;
    let settings = GroupSettings {
        group: config.application_id.clone(),
        topics: config.input_topics.clone(),
        tasks: partitions,
        session_timeout: timeouts.session,
        heartbeat_interval: timeouts.heartbeat,
        rebalance_timeout: timeouts.rebalance,
        instance_id: timeouts.instance_id,
        num_standby_replicas: config.num_standby_replicas,
        acceptable_recovery_lag: config.acceptable_recovery_lag,
        max_warmup_replicas: config.max_warmup_replicas,
        probing_rebalance_interval: config.probing_rebalance_interval,
        changelog_topics: config.stores.iter().map(|s| crate::kafka::changelog_topic(&config.application_id, s.name())).collect(),
        process_id,
        endpoint: config.application_server.clone(),
        client_tags: config.client_tags.clone(),
        give_up_after: config.task_timeout,
    };
    let local = {
        let (config, shared) = (config.clone(), shared.clone());
        // Copies on disk (checkpoint hints), then the standbys' checkpoints
        // (read without the task lock), then the running actives'. The
        // processing thread may hold the task lock for a while (a batch, a
        // closing commit): wait briefly, else use the actives last seen
        // whose directories are still here, rather than delay the JoinGroup.
        let standbys = shared.tasks.lock().expect("task lock").standby_offsets();
        let mut last_actives = std::collections::BTreeMap::new();
        Box::new(move || {
            let mut found = local_tasks(&config, partitions);
            let deadline = Instant::now() + Duration::from_millis(200);
            loop {
                match shared.tasks.try_lock() {
                    Ok(tasks) => {
                        last_actives = tasks.active_offsets();
                        break;
                    }
                    Err(std::sync::TryLockError::Poisoned(p)) => {
                        last_actives = p.into_inner().active_offsets();
                        break;
                    }
                    Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(std::sync::TryLockError::WouldBlock) => {
                        last_actives.retain(|p, _| found.contains_key(p));
                        break;
                    }
                }
            }
            found.extend(standbys.sums());
            found.extend(last_actives.iter().map(|(p, o)| (*p, *o)));
            found
        })
    };
    let membership = Membership::start(brokers, settings, local)?;
    shared.tasks.lock().expect("task lock").session = Some(membership.session.clone());

    let (waker, wake_requests) = FetchWaker::new();
    let result = std::thread::scope(|scope| -> Result<()> {
        std::thread::Builder::new()
            .name("kstate-fetch-wake".into())
            .spawn_scoped(scope, || fetch_wake::run(&consumer, wake_requests))
            .map_err(|e| Error::io("kstate-fetch-wake thread", e))?;
        // SAFETY: `records` is declared after the consumer and dropped
        // before it on every path.
        let records = unsafe { QueueHandle::new(&consumer) };
        // Removed again on every path out of this scope.
        let _installed = WakerInstalled::install(&shared, waker);
        tracing::info!(application_id = %config.application_id, topics = ?config.input_topics, partitions, "kstate started");

        let store_index: HashMap<String, usize> =
            config.stores.iter().enumerate().map(|(i, s)| (s.name().to_string(), i)).collect();
        let parts = LoopParts {
            config: &config,
            shutdown: &shutdown,
            consumer: &consumer,
            records: &records,
            membership: &membership,
            shared: &shared,
            store_index: &store_index,
        };
        let result = process_loop(parts, &mut processor);

        let mut tasks = shared.tasks.lock().expect("task lock");
        // Events that arrived meanwhile first: tasks lost must not be
        // committed (nor their changelogs written) by the final commit.
        let result = result.and_then(|()| apply_group_events(&membership, &consumer, &records, &mut tasks, &config.input_topics));
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
        if let Ok(assigned) = consumer.assignment() {
            let _ = consumer.incremental_unassign(&assigned);
        }
        result
    });
    membership.leave(LEAVE_TIMEOUT);
    drop(consumer);
    tracing::info!(application_id = %config.application_id, ok = result.is_ok(), "kstate stopped");
    result
}

/// What the processing loop works with.
struct LoopParts<'a> {
    config: &'a AppConfig,
    shutdown: &'a ShutdownHandle,
    consumer: &'a BaseConsumer<RuntimeContext>,
    records: &'a QueueHandle,
    membership: &'a Membership,
    shared: &'a Shared,
    store_index: &'a HashMap<String, usize>,
}

fn process_loop<F, E>(parts: LoopParts<'_>, processor: &mut F) -> Result<()>
where
    F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let LoopParts { config, shutdown, consumer, records, membership, shared, store_index } = parts;
    let mut polled = PolledBatch::new(records, POLL_BATCH);
    let mut consumer_errors = ErrorLog::default();
    let mut last_commit = Instant::now();
    let _disk = DiskGauges::start(config.state_dir.join(&config.application_id));
    while !shutdown.is_shutdown() {
        membership.polled();
        {
            let mut tasks = shared.tasks.lock().expect("task lock");
            apply_group_events(membership, consumer, records, &mut tasks, &config.input_topics)?;
            tasks.open_pending(consumer)?;
            tasks.update_standbys()?;
            tasks.clean_state_dirs();
            tasks.collect_restored(consumer)?;
            tasks.poll_inflight(consumer)?;
            tasks.poll_offset_commit()?;
            tasks.refresh_metrics(consumer);
        }
        // The consumer queue: errors and logs (served by rust-rdkafka, one
        // per call), and records of partitions that could not be forwarded
        // to the record queue.
        // Records not processed in this pass (see the parked check below).
        let mut not_processed = Vec::new();
        serve_consumer_queue(consumer, |event| {
            match event {
                Some(Ok(msg)) => {
                    let mut tasks = shared.tasks.lock().expect("task lock");
                    if tasks.is_parked() {
                        // Exactly-once: a commit waits for the group's new
                        // generation; read this record again later.
                        not_processed.push((msg.topic().to_string(), msg.partition(), msg.offset()));
                        return Ok(());
                    }
                    let timestamp_type = match msg.timestamp() {
                        rdkafka::Timestamp::CreateTime(_) => TimestampType::CreateTime,
                        rdkafka::Timestamp::LogAppendTime(_) => TimestampType::LogAppendTime,
                        rdkafka::Timestamp::NotAvailable => TimestampType::NotAvailable,
                    };
                    let record = Record {
                        topic: msg.topic(),
                        partition: msg.partition(),
                        offset: msg.offset(),
                        timestamp: msg.timestamp().to_millis(),
                        timestamp_type,
                        key: msg.key(),
                        value: msg.payload(),
                        // SAFETY: the message outlives the record (this closure).
                        headers: unsafe { Headers::of_message(msg.ptr()) },
                    };
                    process_one(&mut tasks, config, store_index, &record, processor)?;
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                // librdkafka's fatal errors leave the consumer unusable.
                Some(Err(e @ KafkaError::MessageConsumptionFatal(_))) => {
                    tracing::error!(error = %e, "fatal consumer error; stopping");
                    return Err(Error::from(e));
                }
                Some(Err(e)) => consumer_errors.warn(&e),
            }
            Ok(())
        })?;
        seek_back_to(consumer, not_processed);
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
                    membership.polled();
                    if last_commit.elapsed() >= config.commit_interval && tasks.commit_pipelined(consumer)? {
                        last_commit = Instant::now();
                    }
                    if tasks.is_parked() {
                        // Exactly-once: a commit waits for the group's new
                        // generation; the rest of the batch must not add
                        // outputs to its transaction. Read it again later.
                        seek_back.extend(polled.iter().skip(i).filter_map(|m| {
                            Some((std::str::from_utf8(m.topic()).ok()?.to_string(), m.partition(), m.offset()))
                        }));
                        break;
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
                    timestamp_type: msg.timestamp_type(),
                    key: msg.key(),
                    value: msg.payload(),
                    headers: msg.headers(),
                };
                process_one(&mut tasks, config, store_index, &record, processor)?;
            }
            seek_back_to(consumer, seek_back);
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

/// Seeks each partition among `records` (topic, partition, offset) back to
/// the lowest of its offsets, so that no record that was not processed is
/// skipped. Negative offsets (none known) are ignored.
fn seek_back_to(consumer: &BaseConsumer<RuntimeContext>, records: Vec<(String, i32, i64)>) {
    let mut lowest: HashMap<(String, i32), i64> = HashMap::new();
    for (topic, partition, offset) in records.into_iter().filter(|r| r.2 >= 0) {
        let o = lowest.entry((topic, partition)).or_insert(offset);
        *o = (*o).min(offset);
    }
    for ((topic, partition), offset) in lowest {
        if let Err(e) = consumer.seek(&topic, partition, Offset::Offset(offset), Duration::from_secs(10)) {
            tracing::warn!(error = %e, %topic, partition, offset, "seeking back to records not processed failed");
        }
    }
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

/// `kstate_state_dir_used_bytes` and `kstate_state_dir_free_bytes`, every
/// 10 s, on a thread of their own (walking a large state dir takes time the
/// processing thread should not spend); it ends when this is dropped.
struct DiskGauges {
    _stop: std::sync::mpsc::Sender<()>,
}

impl DiskGauges {
    const EVERY: Duration = Duration::from_secs(10);

    fn start(dir: PathBuf) -> DiskGauges {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new().name("kstate-disk".into()).spawn(move || loop {
            metrics::gauge!(crate::metrics::STATE_DIR_USED_BYTES).set(crate::store::state_dir::dir_bytes(&dir) as f64);
            if let Some(free) = crate::store::state_dir::free_bytes(&dir) {
                metrics::gauge!(crate::metrics::STATE_DIR_FREE_BYTES).set(free as f64);
            }
            if stopped.recv_timeout(Self::EVERY) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                return;
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the state dir size thread; kstate_state_dir_* stay unset");
        }
        DiskGauges { _stop: stop }
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
    let outputs = &tasks.outputs;
    let Some(task) = tasks.tasks.get_mut(&partition) else {
        return Ok(()); // revoked while the record was in flight
    };
    if task.state != TaskState::Running || !task.topics.contains(topic) {
        // Fetched before the pause took effect: replay it once the task runs.
        let r = task.rewind.entry(topic.to_string()).or_insert(offset);
        *r = (*r).min(offset);
        return Ok(());
    }
    let mut ctx = ProcessorContext::new(task, store_index, outputs, record.timestamp);
    if let Err(e) = processor(&mut ctx, record) {
        let source: Box<dyn std::error::Error + Send + Sync> = e.into();
        // kstate's own output failure, passed on by the processor's `?`: the
        // typed error, whatever a handler would say (skipping the record
        // would not bring the output back).
        let source = match source.downcast::<Error>() {
            Ok(e) if matches!(*e, Error::OutputDelivery { .. }) => return Err(*e),
            Ok(e) => e as Box<dyn std::error::Error + Send + Sync>,
            Err(source) => source,
        };
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
    task.processed.increment(1);
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

/// Warns about changelogs whose records were deleted from the start
/// (DeleteRecords, or a `delete` retention once set): compaction never moves
/// a compacted topic's start offset, so a start above 0 means a fresh
/// restore misses keys that a store restored earlier still holds. Counted in
/// `kstate_changelog_truncated_partitions{topic}`. Best effort: a failed
/// check is logged and startup goes on.
fn warn_truncated_changelogs(brokers: &Brokers, specs: &[ChangelogSpec], partitions: i32) {
    let topics: Vec<String> = specs.iter().map(|s| s.topic.clone()).collect();
    let all: Vec<i32> = (0..partitions).collect();
    match crate::group::start_offsets(brokers, &topics, &all) {
        Ok(starts) => {
            for topic in &topics {
                let truncated: Vec<(i32, i64)> =
                    starts.iter().filter(|((t, _), o)| t == topic && **o > 0).map(|((_, p), o)| (*p, *o)).collect();
                metrics::gauge!(crate::metrics::CHANGELOG_TRUNCATED, "topic" => topic.clone()).set(truncated.len() as f64);
                if !truncated.is_empty() {
                    tracing::warn!(%topic, partitions_and_start_offsets = ?truncated,
                        "the changelog lost records from its start (DeleteRecords or a retention policy): a fresh restore \
                         of these partitions misses keys written before those offsets, which stores restored earlier still hold");
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not check the changelogs' start offsets"),
    }
}
