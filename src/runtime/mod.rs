//! The runtime: `run` wires the clients, the restore thread, the task
//! manager and the group membership together, runs the processing loop on
//! its thread scope, and commits and closes at the end.
//!
//! Files:
//! - `callbacks.rs`: the processor's callbacks for one task (records,
//!   timers, punctuations, `init`, `close`), shared with the test driver;
//! - `dispatch.rs`: the task manager's tasks handed to their processors;
//! - `merge.rs`: several input topics merged in timestamp order per task;
//! - `startup.rs`: what `run` needs before it starts (process id, local
//!   tasks, client config, input partitions, truncated changelog check);
//! - `poll_loop.rs`: the processing loop, record by record, with commits;
//! - `queues.rs`: one record queue per processing thread, tasks placed on them;
//! - `threads.rs`: the batches of several threads' queues processed in parallel;
//! - `events.rs`: where an assignment (or its loss) is applied to the task
//!   manager and the consumer;
//! - `disk_gauges.rs`: the thread that measures the state dir.

pub(crate) mod callbacks;
mod disk_gauges;
mod dispatch;
mod events;
pub(crate) mod merge;
mod poll_loop;
mod queues;
mod startup;
mod threads;

pub(crate) use dispatch::{Closure, PerTask, ProcessorSet};
pub(crate) use startup::PROCESS_ID_FILE;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::ClientContext;

use crate::store::published::{Published, RunState};
use crate::shutdown::ShutdownHandle;
use crate::kafka::{self, ChangelogProducer, ChangelogSpec};
use crate::config::{AppConfig, ProcessingGuarantee};
use crate::store::engine::EngineResources;
use crate::error::{Error, Result};
use crate::kafka::fetch_wake::{self, FetchWaker};
use crate::group::Brokers;
use crate::group::{GroupSettings, Membership};
use crate::group::Committer;
use crate::restore::{NoopListener, Restorer};
use crate::task::{TaskManager, TaskManagerParts};

use events::apply_group_events;
use poll_loop::{process_loop, LoopParts};
use crate::snapshot::{SnapshotThread, Snapshots};
use startup::{snapshot_info, client_config, input_partitions, local_tasks, peer_listener, process_id, warn_truncated_changelogs};

/// The task manager, shared with the membership thread (which reads the
/// checkpoints of open stores for its subscription).
struct Shared {
    tasks: Mutex<TaskManager>,
}

/// How long a clean shutdown waits for LeaveGroup.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Installs the fetch waker in the task manager and takes it out again
/// when dropped, also while unwinding: the waker thread ends once the last
/// waker is gone (the scope waits for it).
struct WakerInstalled<'s>(&'s Shared);

impl<'s> WakerInstalled<'s> {
    fn install(shared: &'s Shared, waker: FetchWaker) -> Self {
        shared.tasks.lock().expect("task lock").set_fetch_waker(Some(waker));
        WakerInstalled(shared)
    }
}

impl Drop for WakerInstalled<'_> {
    fn drop(&mut self) {
        self.0.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).set_fetch_waker(None);
    }
}

/// Sets its flag when dropped (the global tables' followers stop).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// The processing consumer's context. The consumer only ever `assign`s
/// (kstate's own membership decides what it reads), so librdkafka runs no
/// rebalance callbacks.
struct RuntimeContext;

impl ClientContext for RuntimeContext {}
impl ConsumerContext for RuntimeContext {}

pub(crate) fn run<S: ProcessorSet>(config: Arc<AppConfig>, shutdown: ShutdownHandle, mut processors: S) -> Result<()> {
    // Queries answer `ShuttingDown` once `run` returns, on every path.
    struct Stopped<'a>(&'a Published);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0.set_state(RunState::Stopped);
            self.0.set_hosts(Default::default());
        }
    }
    let _stopped = Stopped(&config.published);
    if config.num_stream_threads > 1 && processors.split(&[]).is_none() {
        return Err(Error::Config(format!(
            "num_stream_threads is {}, but App::run's one closure serves every task and cannot run on several threads; use App::run_processor (one processor per task)",
            config.num_stream_threads
        )));
    }
    let base = client_config(&config);
    // TLS and SASL failures are typed errors at once, not a startup timeout.
    let security = crate::group::Security::from_kafka_config(&config.kafka_overrides)?;
    let client_id = format!("{}-kstate", config.application_id);
    let connect_timeout = config.startup_timeout.min(Duration::from_secs(10));
    Brokers::new(&config.bootstrap_servers, security.clone(), client_id.clone(), connect_timeout)
        .reach(config.startup_timeout)?;
    let admin: AdminClient<DefaultClientContext> = base.create()?;
    let partitions = input_partitions(&admin, &config)?;
    let repartition_topics: Vec<String> = config.repartitions.iter().map(|r| r.topic.clone()).collect();
    kafka::ensure_repartition_topics(&admin, &repartition_topics, partitions, config.changelog_replication_factor, config.startup_timeout)?;
    config.published.set_partitions(partitions);
    // A table's topic is its changelog: never created nor configured.
    let specs: Vec<ChangelogSpec> = config
        .stores
        .iter()
        .filter(|s| s.source_topic.is_none())
        .map(|s| ChangelogSpec {
            topic: kafka::changelog_topic(&config.application_id, s.name()),
            partitions,
            replication: config.changelog_replication_factor,
            extra_configs: s.changelog_configs().to_vec(),
            retention_ms: s.changelog_retention_ms(),
        })
        .collect();
    let mut infos = kafka::ensure_topics(&admin, &specs, config.startup_timeout, crate::store::engine::FLUSH_AT_LEAST_EVERY)?;
    let table_topics: Vec<String> = config.stores.iter().filter_map(|s| s.source_topic.clone()).collect();
    let table_infos = kafka::check_table_topics(&admin, &table_topics, config.startup_timeout)?;
    drop(admin);
    // One producer serves every changelog, so its batches must fit the
    // smallest max.message.bytes; that is also the per-record limit.
    // (It never sends to a table's topic.)
    let max_message_bytes = infos.values().map(|i| i.max_message_bytes).min().unwrap_or(1_000_000);
    infos.extend(table_infos);
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
    let resources = match config.max_state_memory {
        Some(total) => {
            crate::store::memory::return_freed_memory();
            EngineResources::bounded(total, config.write_buffer_bytes)
        }
        None => EngineResources::new(config.block_cache_bytes, config.write_buffer_bytes),
    }
    .with_statistics(config.rocksdb_statistics)
    .with_read_cache(config.read_cache_bytes)
    .with_heap_save_every(config.in_memory_save_interval)
    .with_remote(start_remote_state(&config)?);
    // Global tables are current before this instance joins the group (a
    // task's first record may join with them).
    let (globals, followers) = crate::global::bootstrap(&config, &base, &resources, &*listener)?;
    let brokers = Brokers::new(&config.bootstrap_servers, security, client_id, connect_timeout);
    // Standbys of a table apply its topic up to the committed offset only.
    let committed: Option<crate::restore::CommittedOffsets> = config.has_tables.then(|| {
        let (brokers, group) = (brokers.clone(), config.application_id.clone());
        Arc::new(move |topic: &str, partition: i32| {
            let wanted = [(topic.to_string(), partition)];
            crate::group::fetch_committed(&brokers, &group, &wanted, Duration::from_secs(2), false).ok()?.into_values().next().flatten()
        }) as crate::restore::CommittedOffsets
    });
    let restorer = Restorer::start(restore_config, listener, config.startup_timeout, committed)?;

    warn_truncated_changelogs(&brokers, &specs, partitions);
    let snapshots = match &config.snapshots {
        Some(s) => Some(Arc::new(Snapshots::new(s.clone(), &config.application_id, &config.snapshot_handle).map_err(Error::Config)?)),
        None => None,
    };
    let task_manager = TaskManager::new(TaskManagerParts {
        config: config.clone(),
        producer,
        new_producer,
        resources,
        max_record_bytes: max_message_bytes,
        changelogs: infos,
        restorer,
        committer: Committer::start(brokers.clone(), config.application_id.clone())?,
        brokers: brokers.clone(),
        snapshots: snapshots.clone(),
        purger: kafka::Purger::start(&base, &repartition_topics, config.repartition_purge_interval, config.startup_timeout)?,
    });
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
    // A table's restore reads its topic `read_committed` (as every
    // changelog): processing must not apply aborted records it never would.
    if config.processing_guarantee == ProcessingGuarantee::ExactlyOnce || config.has_tables {
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
        // Remote stores: every instance is as good a place for a task
        // as its last owner (it opens the same databases), so no move
        // waits for a warmup.
        acceptable_recovery_lag: if config.remote_stores() { u64::MAX } else { config.acceptable_recovery_lag },
        max_warmup_replicas: config.max_warmup_replicas,
        probing_rebalance_interval: config.probing_rebalance_interval,
        changelog_topics: config.stores.iter().map(|s| s.changelog_topic(&config.application_id)).collect(),
        table_topics: config.stores.iter().filter_map(|s| s.source_topic().map(str::to_string)).collect(),
        process_id,
        endpoint: config.application_server.clone(),
        peer: peer_listener(&config)?,
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
    shared.tasks.lock().expect("task lock").attach_session(membership.session.clone());

    let mut snapshot_thread = match snapshots {
        Some(service) => Some(SnapshotThread::start(
            service,
            config.stores.iter().map(snapshot_info(&config.application_id)).collect(),
            config.published.clone(),
            config.state_dir.join(&config.application_id),
            crate::snapshot::savepoint::CutContext::new(config.input_topics.clone(), {
                let mut c = base.clone();
                c.set("group.id", &config.application_id);
                c
            }),
        )?),
        None => None,
    };
    let (waker, wake_requests) = FetchWaker::new();
    let following = AtomicBool::new(false);
    let result = std::thread::scope(|scope| -> Result<()> {
        std::thread::Builder::new()
            .name("kstate-fetch-wake".into())
            .spawn_scoped(scope, || fetch_wake::run(&consumer, wake_requests))
            .map_err(|e| Error::io("kstate-fetch-wake thread", e))?;
        // SAFETY: `records` is declared after the consumer and dropped
        // before it on every path.
        let records = unsafe { queues::RecordQueues::new(&consumer, config.num_stream_threads) };
        // Removed again on every path out of this scope.
        let _installed = WakerInstalled::install(&shared, waker);
        // The global tables' followers stop when this scope ends, on every path.
        let _stop_following = StopOnDrop(&following);
        for follower in followers {
            let stop = &following;
            std::thread::Builder::new()
                .name("kstate-global".into())
                .spawn_scoped(scope, move || follower.follow(stop))
                .map_err(|e| Error::io("kstate-global thread", e))?;
        }
        tracing::info!(application_id = %config.application_id, topics = ?config.input_topics, partitions, "kstate started");

        let store_index: HashMap<String, usize> =
            config.user_stores().iter().enumerate().map(|(i, s)| (s.name().to_string(), i)).collect();
        let parts = LoopParts {
            config: &config,
            shutdown: &shutdown,
            consumer: &consumer,
            records: &records,
            membership: &membership,
            shared: &shared,
            store_index: &store_index,
            globals: &globals,
        };
        let result = process_loop(parts, &mut processors);
        // No snapshot is taken of stores about to close.
        drop(snapshot_thread.take());

        let mut tasks = shared.tasks.lock().expect("task lock");
        // Events that arrived meanwhile first: tasks lost must not be
        // committed (nor their changelogs written) by the final commit.
        let callbacks = callbacks::Callbacks { config: &config, store_index: &store_index, globals: Some(&globals) };
        let dispatch = dispatch::Dispatch { callbacks, consumer: &consumer };
        let result = result.and_then(|()| {
            apply_group_events(&membership, &consumer, &records, &mut tasks, &config, &mut |t, revoked| {
                dispatch.close_tasks(t, &mut processors, Some(revoked))
            })
        });
        let result = match result {
            Ok(()) => {
                dispatch.close_tasks(&mut tasks, &mut processors, None);
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

/// The remote stores' object store, runtime and cache, if the application
/// has remote stores: a URL or credentials that do not work fail here.
#[cfg(feature = "remote")]
fn start_remote_state(config: &AppConfig) -> Result<Option<Arc<crate::store::engine::remote::RemoteState>>> {
    let Some(remote) = config.remote_state.as_ref().filter(|_| config.remote_stores()) else { return Ok(None) };
    let state = crate::store::engine::remote::RemoteState::start(crate::store::engine::remote::RemoteSettings {
        url: &remote.url,
        options: &remote.options,
        application_id: &config.application_id,
        cache_bytes: remote.cache_bytes,
        flush_interval: remote.flush_interval,
        timeout: remote.timeout,
        memtable_bytes: remote.memtable_bytes,
        disk_cache: (config.state_dir.join(&config.application_id).join(".remote-cache"), remote.disk_cache_bytes),
        simulated_latency: remote.simulated_latency,
    })?;
    Ok(Some(state))
}

/// Without the `remote` feature the configuration refused remote stores.
#[cfg(not(feature = "remote"))]
fn start_remote_state(_config: &AppConfig) -> Result<Option<Arc<crate::store::engine::remote::RemoteState>>> {
    Ok(None)
}
