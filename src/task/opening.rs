//! Opening tasks: newly assigned partitions get their stores opened off the
//! processing thread, handed to the restore thread, and resumed once restored.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::group::Brokers;
use crate::restore::{RestoreJob, RestoreOutcome};
use crate::store::{KeyValueStore, StoreBackend, StoreOpenArgs};

use super::manager::resume_now;
use super::standby::{STANDBY_RETRY_AFTER, Standby};
use super::{task_span, Task, TaskManager, TaskState};

/// Tasks whose stores open at the same time (each on a thread of its own;
/// a large assignment opens in waves instead of thousands of threads and
/// file handles at once).
pub(super) const MAX_OPENING: usize = 8;

/// The opener threads: stores they opened come back through the channel.
pub(super) struct Openers {
    pub(super) tx: Sender<Opened>,
    pub(super) rx: Receiver<Opened>,
    /// Opener threads running.
    pub(super) running: usize,
    pub(super) next_incarnation: u64,
    pub(super) max_record_bytes: usize,
    /// Each changelog topic's retention settings.
    pub(super) changelogs: Arc<HashMap<String, crate::kafka::ChangelogInfo>>,
    /// kstate's own broker connections: exactly-once waits for stable
    /// committed offsets through them.
    pub(super) brokers: Brokers,
    /// Seeds stores with no local state from snapshots, if configured.
    pub(super) snapshots: Option<Arc<crate::snapshot::Snapshots>>,
}

impl Openers {
    pub(super) fn new(
        max_record_bytes: usize,
        changelogs: HashMap<String, crate::kafka::ChangelogInfo>,
        brokers: Brokers,
        snapshots: Option<Arc<crate::snapshot::Snapshots>>,
    ) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let changelogs = Arc::new(changelogs);
        Openers { tx, rx, running: 0, next_incarnation: 0, max_record_bytes, changelogs, brokers, snapshots }
    }
}

/// The stores of one task incarnation, opened by an opener thread.
pub(super) struct Opened {
    pub(super) partition: i32,
    pub(super) incarnation: u64,
    pub(super) stores: Result<Vec<KeyValueStore>>,
    /// Exactly-once, an active task: its committed input offsets, read
    /// stable before the restore (where its restored state stands).
    pub(super) stable: Option<crate::group::StableOffsets>,
}

impl TaskManager {
    /// Takes in newly assigned partitions and tasks due to be re-opened,
    /// and has their stores opened off the processing thread (see
    /// [`TaskManager::collect_opened`]).
    pub(crate) fn open_pending<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        self.collect_opened(consumer)?;
        let mut resume = Vec::new();
        for (topic, p) in std::mem::take(&mut self.pending) {
            if let Some(task) = self.tasks.get_mut(&p) {
                // Another input topic of a task that exists: it was paused on
                // assignment; resume it at once if the task already runs.
                if task.state == TaskState::Running {
                    if let Some(offset) = task.rewind.remove(&topic) {
                        consumer.seek(&topic, p, Offset::Offset(offset), Duration::from_secs(10))?;
                    }
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition(&topic, p);
                    resume.push(tpl);
                }
                task.topics.insert(topic);
                continue;
            }
            let incarnation = self.incarnation();
            let span = task_span(&self.config.application_id, p);
            let mut task = Task::new(p, BTreeSet::from([topic]), HashMap::new(), incarnation, Instant::now(), span);
            let promoted = self.promote_standby(&mut task);
            self.tasks.insert(p, task);
            if let Some(stores) = promoted {
                self.start_opening(p, incarnation, Some(stores))?;
            }
        }
        let now = Instant::now();
        let free = MAX_OPENING.saturating_sub(self.openers.running);
        let due: Vec<(i32, u64)> = self
            .tasks
            .values_mut()
            .filter(|t| t.state == TaskState::Opening && t.open_at.is_some_and(|at| at <= now))
            .take(free)
            .map(|t| {
                t.open_at = None;
                (t.partition, t.incarnation)
            })
            .collect();
        for (p, incarnation) in due {
            self.start_opening(p, incarnation, None)?;
        }
        for tpl in resume {
            resume_now(consumer, &tpl, self.fetch_waker.as_ref())?;
        }
        Ok(())
    }

    /// Opens a task's stores on a thread of its own: waiting for a
    /// directory lock still held by a previous owner, or a slow RocksDB
    /// open, never stalls the partitions this member is processing.
    /// `stores` already open (a promoted standby) are passed through.
    /// Exactly-once: the thread then waits until the task's committed
    /// input offsets are stable (no previous owner's transaction still
    /// open), so that its restore sees everything committed with them.
    pub(super) fn start_opening(&mut self, partition: i32, incarnation: u64, stores: Option<Vec<KeyValueStore>>) -> Result<()> {
        // A table's restore ends at the committed offset of its topic,
        // under at-least-once too.
        let stable = ((self.exactly_once() || self.config.has_tables) && self.tasks.contains_key(&partition)).then(|| {
            (self.openers.brokers.clone(), self.config.input_topics.iter().map(|t| (t.clone(), partition)).collect::<Vec<_>>())
        });
        let config = self.config.clone();
        let producer = self.producer.clone();
        let resources = self.resources.clone();
        let changelogs = self.openers.changelogs.clone();
        let max_record_bytes = self.openers.max_record_bytes;
        let done = self.openers.tx.clone();
        let snapshots = self.openers.snapshots.clone();
        let span = self.tasks.get(&partition).map_or_else(|| self.standby_span(partition), |t| t.span.clone());
        let standby = !self.tasks.contains_key(&partition);
        std::thread::Builder::new()
            .name(format!("kstate-open-{partition}"))
            .spawn(move || {
                let _in_task = span.enter();
                type OpenedStores = (Vec<KeyValueStore>, Option<crate::group::StableOffsets>);
                let open_all = move || -> Result<OpenedStores> {
                    let wait_stable = |stores: Vec<KeyValueStore>| -> Result<OpenedStores> {
                        let Some((brokers, input)) = &stable else { return Ok((stores, None)) };
                        let waited = Instant::now();
                        let offsets = crate::group::fetch_stable(brokers, &config.application_id, input, config.task_timeout)?;
                        if waited.elapsed() >= Duration::from_secs(1) {
                            tracing::info!(partition, waited = ?waited.elapsed(), "committed offsets stable; restoring");
                        }
                        Ok((stores, Some(offsets)))
                    };
                    if let Some(stores) = stores {
                        return wait_stable(stores);
                    }
                    let mut stores = Vec::with_capacity(config.stores.len());
                    for def in &config.stores {
                        let changelog_topic = def.changelog_topic(&config.application_id);
                        let info = changelogs.get(&changelog_topic);
                        let seed_topic = changelog_topic.clone();
                        let seed = |db_dir: &std::path::Path| match &snapshots {
                            Some(s) => s.seed_dir((def.name(), partition, def.version(), def.is_in_memory()), db_dir, || {
                                let (low, high, topic_id) = producer.describe_changelog(&seed_topic, partition, config.startup_timeout)?;
                                Ok(crate::restore::checkpoint::ChangelogState {
                                    low,
                                    high,
                                    topic_id,
                                    tombstone_retention: info.and_then(|i| i.tombstone_retention),
                                })
                            }),
                            None => Default::default(),
                        };
                        stores.push(KeyValueStore::open(StoreOpenArgs {
                            name: def.name(),
                            partition,
                            dir: config.store_dir(def.name(), partition),
                            tombstone_retention: changelogs.get(&changelog_topic).and_then(|i| i.tombstone_retention),
                            live_tail_retention: live_tail_retention(def, changelogs.get(&changelog_topic)),
                            changelog_topic,
                            max_record_bytes,
                            producer: crate::kafka::ChangelogSink::Producer(producer.clone()),
                            resources: &resources,
                            lock_timeout: config.lock_timeout,
                            ttl: def.time_to_live(),
                            segments: def.segmented(),
                            published: Some(config.published.clone()),
                            seed: Some(&seed),
                            schema: def.schema(),
                            final_results: def.emits_final_results(),
                            backend: match def.backend() {
                                StoreBackend::Remote if standby => StoreBackend::RemoteFollower,
                                b => b,
                            },
                        })?);
                        if def.source_topic.is_some() {
                            let exactly_once = config.processing_guarantee == crate::config::ProcessingGuarantee::ExactlyOnce;
                            stores.last_mut().expect("pushed").make_source_table(exactly_once, def.table_values.clone().map(|(c, on_bad)| (c, on_bad == crate::config::ProcessingDecision::Continue)))?;
                        }
                    }
                    wait_stable(stores)
                };
                // A reply on every path, so the opener count stays right.
                let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(open_all)).unwrap_or_else(|_| {
                    Err(Error::Restore {
                        topic: String::new(),
                        partition,
                        detail: "opening the task's stores panicked".into(),
                    })
                });
                let (stores, stable) = match opened {
                    Ok((stores, stable)) => (Ok(stores), stable),
                    Err(e) => (Err(e), None),
                };
                // The receiver is gone once the runtime stopped: the stores close here.
                let _ = done.send(Opened { partition, incarnation, stores, stable });
            })
            .map_err(|e| Error::io("kstate-open thread", e))?;
        self.openers.running += 1;
        Ok(())
    }

    /// Hands tasks whose stores were opened to the restore thread.
    pub(super) fn collect_opened<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        while let Ok(Opened { partition, incarnation, stores, stable }) = self.openers.rx.try_recv() {
            self.openers.running -= 1;
            if let Some(Standby::Opening { incarnation: wanted, .. }) = self.standbys.tasks.get(&partition) {
                if *wanted == incarnation {
                    let span = self.standby_span(partition);
                    let _in_standby = span.enter();
                    match stores {
                        Ok(stores) => {
                            tracing::info!(partition, "standby task opened; following its changelogs");
                            self.restorer.submit(RestoreJob { partition, stores, standby: true, span: span.clone() });
                            self.standbys.tasks.insert(partition, Standby::Following);
                        }
                        Err(e) => {
                            tracing::warn!(partition, error = %e, retry_in = ?STANDBY_RETRY_AFTER, "opening a standby task failed");
                            let incarnation = self.incarnation();
                            let open_at = Some(Instant::now() + STANDBY_RETRY_AFTER);
                            self.standbys.tasks.insert(partition, Standby::Opening { incarnation, open_at });
                        }
                    }
                    continue;
                }
            }
            let Some(task) = self.tasks.get_mut(&partition) else {
                // Dropped while opening.
                if let Ok(stores) = stores {
                    self.closer.close(stores);
                }
                continue;
            };
            if task.incarnation != incarnation || task.state != TaskState::Opening {
                // An earlier incarnation's stores.
                if let Ok(stores) = stores {
                    self.closer.close(stores);
                }
                continue;
            }
            let span = task.span.clone();
            let _in_task = span.enter();
            match stores {
                Ok(stores) => {
                    // Exactly-once: the restored state stands exactly at the
                    // committed offsets; a re-initialised task restarts
                    // there, whatever this member remembered (a commit
                    // whose outcome it never learned). A new task needs no
                    // seek: the consumer fetches the same offsets, stable
                    // (read_committed), and seeking a partition whose
                    // offset fetch is under way fails (`__STATE`).
                    let exactly_once = self.config.processing_guarantee == crate::config::ProcessingGuarantee::ExactlyOnce;
                    let mut stores = stores;
                    table_restore_ends(&mut stores, &self.config, task, stable.as_ref(), exactly_once);
                    for ((topic, _), offset) in stable.into_iter().flatten().filter(|_| exactly_once) {
                        if let (Some(o), true) = (offset, task.topics.contains(&topic)) {
                            if let Some(r) = task.rewind.get_mut(&topic) {
                                *r = o;
                            }
                            task.restart_from.insert(topic, o);
                        }
                    }
                    task.state = TaskState::Restoring;
                    tracing::info!(partition, "task assigned; restoring its stores");
                    self.restorer.submit(RestoreJob { partition, stores, standby: false, span: span.clone() });
                }
                Err(e) => self.reinitialise(consumer, partition, e)?,
            }
        }
        Ok(())
    }

    /// Moves restored tasks to running and resumes their input.
    pub(crate) fn collect_restored<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        loop {
            let outcome = match self.restorer.outcomes.try_recv() {
                Ok(o) => o,
                Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(()),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    return Err(Error::Restore {
                        topic: String::new(),
                        partition: -1,
                        detail: "the restore thread stopped unexpectedly".into(),
                    })
                }
            };
            let job = match outcome {
                RestoreOutcome::Done(job) => job,
                // Past the memory bound, a standby ends `run` too (README "In-memory stores").
                RestoreOutcome::Failed(job, e @ Error::StateMemory { .. }) if job.standby => {
                    self.closer.close(job.stores);
                    return Err(e);
                }
                RestoreOutcome::Failed(job, e) if job.standby => {
                    let _in_standby = job.span.clone().entered();
                    let partition = job.partition;
                    self.closer.close(job.stores);
                    if self.standbys.tasks.get(&partition) == Some(&Standby::Following) {
                        tracing::warn!(partition, error = %e, retry_in = ?STANDBY_RETRY_AFTER,
                            "a standby task failed; reopening it after a pause");
                        let incarnation = self.incarnation();
                        let open_at = Some(Instant::now() + STANDBY_RETRY_AFTER);
                        self.standbys.tasks.insert(partition, Standby::Opening { incarnation, open_at });
                    }
                    continue;
                }
                RestoreOutcome::Failed(job, e) => {
                    let _in_task = job.span.clone().entered();
                    let partition = job.partition;
                    self.closer.close(job.stores);
                    if self.tasks.get(&partition).is_some_and(|t| t.state == TaskState::Restoring) {
                        self.reinitialise(consumer, partition, e)?;
                    } else {
                        tracing::warn!(partition, error = %e, "restore of a revoked task failed; ignored");
                    }
                    continue;
                }
            };
            if !self.tasks.get(&job.partition).is_some_and(|t| t.state == TaskState::Restoring) {
                self.closer.close(job.stores); // revoked meanwhile
                continue;
            }
            let task = self.tasks.get_mut(&job.partition).expect("checked");
            let _in_task = job.span.enter();
            task.stores = job.stores;
            let time_store = self.config.time_store_index().map(|i| &task.stores[i]);
            if let Err(e) = task.time.load(time_store) {
                let partition = task.partition;
                self.reinitialise(consumer, partition, e)?;
                continue;
            }
            for store in &mut task.stores {
                store.follow_stream_clock(task.time.clock());
                store.publish(crate::store::published::Role::Active);
            }
            task.state = TaskState::Running;
            for topic in &task.topics {
                if let Some(offset) = task.rewind.remove(topic) {
                    tracing::debug!(%topic, offset, "reading again the records set aside while the task did not run");
                    consumer.seek(topic, task.partition, Offset::Offset(offset), Duration::from_secs(10))?;
                }
            }
            resume_now(consumer, &task.input(), self.fetch_waker.as_ref())?;
            tracing::info!(partition = task.partition, "task running");
        }
    }
}

/// The retention a window or session store's records may have been
/// written under, which a restore from its live tail must assume
/// (`restore/live_tail.rs`): the store's own, or a longer one it had
/// before, which the changelog's `retention.ms` (created as retention +
/// additional retention, never lowered by kstate) still shows. `None`: no
/// live tail (a key-value store, or a changelog kept forever, which
/// bounds nothing).
fn live_tail_retention(def: &crate::config::StoreDefinition, changelog: Option<&crate::kafka::ChangelogInfo>) -> Option<i64> {
    if !def.live_tail_enabled() {
        return None;
    }
    crate::restore::live_tail::written_under(def.changelog_retention_ms()?, changelog?.retention_ms?)
}

/// Each table store's restore end: where the task processes the table's
/// topic from. Exactly-once, the committed offset read stable; at least
/// once, where a re-initialised task restarts (an offset commit in flight
/// included), else the committed offset; nothing committed: 0 (the task
/// reads the topic from its start as input).
fn table_restore_ends(
    stores: &mut [KeyValueStore],
    config: &crate::config::AppConfig,
    task: &Task,
    stable: Option<&crate::group::StableOffsets>,
    exactly_once: bool,
) {
    for (def, store) in config.stores.iter().zip(stores.iter_mut()) {
        let Some(topic) = &def.source_topic else { continue };
        let committed = stable.and_then(|s| s.get(&(topic.clone(), task.partition))).copied().flatten();
        let end = match exactly_once {
            true => committed,
            false => task.rewind.get(topic).copied().or(committed),
        };
        if let Some(source) = store.source_mut() {
            source.restore_end = Some(end.unwrap_or(0));
        }
    }
}
