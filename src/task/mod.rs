//! Tasks: the unit of ownership. Task `p` owns input partition `p` of every
//! input topic and partition `p` of every store.
//!
//! The [`TaskManager`] turns assignment events into task lifecycles:
//! assigned → stores opened → restoring (input paused) → running (input
//! resumed) → revoked (committed and closed) or lost (closed without commit).
//!
//! Standby tasks keep a copy of other members' stores: opened the same
//! way, then followed by the restore thread until they are promoted (the
//! stores go straight to a restore of the lag), dropped (closed), or their
//! follow fails (reopened after a pause). A revoked task that stays here as
//! a standby keeps its stores open.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::assignment::AssignmentEvent;
use crate::kafka::{ChangelogProducer, DeliveryTracker};
use crate::kafka::OutputSink;
use crate::config::AppConfig;
use crate::store::engine::EngineResources;
use crate::kafka::fetch_wake::FetchWaker;
use crate::error::{Error, Result};
use crate::group::{CommitFailure, RetryRun};
use crate::group::{Generation, SessionClock};
use crate::group::Brokers;
use crate::group::{CommitError, Committer};
use crate::restore::{RestoreJob, RestoreOutcome, Restorer};
use crate::store::{KeyValueStore, SealedCommit, StoreOpenArgs};

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// Its stores are being opened off the processing thread (a directory
    /// lock may still be held by a previous owner); its input is paused.
    Opening,
    /// Its stores are with the restore thread; its input is paused.
    Restoring,
    /// Processing records.
    Running,
}

/// One partition's stores and input progress.
pub(crate) struct Task {
    pub(crate) partition: i32,
    pub(crate) state: TaskState,
    /// Input topics of this partition currently assigned to us.
    pub(crate) topics: BTreeSet<String>,
    /// The partition's stores, in definition order (empty while restoring).
    pub(crate) stores: Vec<KeyValueStore>,
    /// Next offset to commit per input topic (processed but uncommitted).
    pub(crate) offsets: HashMap<String, i64>,
    /// First offset of records that arrived before the task ran and were
    /// dropped; the consumer seeks back here when the task starts running.
    pub(crate) rewind: HashMap<String, i64>,
    /// Per input topic, where processing restarts if the task is
    /// re-initialised: the last committed offset, or the first record
    /// processed since the task started.
    pub(crate) restart_from: HashMap<String, i64>,
    /// Tells this incarnation's store opening apart from an earlier one's.
    incarnation: u64,
    /// Input records handed to the processor (`kstate_records_processed_total`).
    pub(crate) processed: metrics::Counter,
    /// When to start opening the stores (`None` once started).
    open_at: Option<Instant>,
}

impl Task {
    fn new(
        partition: i32,
        topics: BTreeSet<String>,
        rewind: HashMap<String, i64>,
        incarnation: u64,
        open_at: Instant,
    ) -> Task {
        Task {
            partition,
            state: TaskState::Opening,
            topics,
            stores: Vec::new(),
            offsets: HashMap::new(),
            restart_from: rewind.clone(),
            rewind,
            incarnation,
            processed: metrics::counter!(crate::metrics::RECORDS_PROCESSED, "partition" => partition.to_string()),
            open_at: Some(open_at),
        }
    }

    fn input(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for topic in &self.topics {
            tpl.add_partition(topic, self.partition);
        }
        tpl
    }
}

/// A standby task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standby {
    /// Its stores are being opened (or will be, from `open_at`).
    Opening { incarnation: u64, open_at: Option<Instant> },
    /// The restore thread follows its changelogs.
    Following,
}

/// How often task directories are checked for cleanup (at most).
const CLEANUP_EVERY: Duration = Duration::from_secs(30);

/// How long a standby whose follow failed waits before it is reopened.
const STANDBY_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Owns every task of this member.
pub(crate) struct TaskManager {
    /// Standby tasks by partition.
    standbys: BTreeMap<i32, Standby>,
    /// The standby tasks the current assignment gives this member.
    standby_target: BTreeSet<i32>,
    /// Task directories on disk that are neither active nor standby here,
    /// and since when (deleted after `state_cleanup_delay`).
    unowned_dirs: BTreeMap<i32, Instant>,
    last_cleanup: Instant,
    pub(crate) tasks: BTreeMap<i32, Task>,
    config: Arc<AppConfig>,
    producer: Arc<ChangelogProducer>,
    /// Output records (the processor's `send`): kstate's producer and their deliveries.
    pub(crate) outputs: OutputSink,
    resources: EngineResources,
    /// When memtables were last flushed to stay within `max_state_memory`.
    last_relief: Instant,
    max_record_bytes: usize,
    /// Each changelog's `delete.retention.ms`.
    tombstone_retention: Arc<HashMap<String, Duration>>,
    restorer: Restorer,
    pending: Vec<(String, i32)>,
    last_engine_metrics: Instant,
    inflight: Option<InFlightCommit>,
    /// Landed writes no store reads any more, freed by the next commit's
    /// writer thread rather than the processing thread.
    retired: Vec<Arc<crate::store::overlay::Overlay>>,
    /// Wakes the fetcher of resumed partitions (set by the runtime).
    pub(crate) fetch_waker: Option<FetchWaker>,
    /// Stores opened off the processing thread come back here.
    opened_tx: Sender<Opened>,
    opened_rx: Receiver<Opened>,
    /// Opener threads running.
    opening: usize,
    /// Threads closing stores (joined by `close_all`).
    closing: Vec<std::thread::JoinHandle<()>>,
    next_incarnation: u64,
    /// Offset commits failing in a row (group changes, coordinator away).
    offset_commits: RetryRun,
    /// The asynchronous offset commit awaiting its result, if any.
    offsets_in_flight: Option<TopicPartitionList>,
    /// Commits input offsets under the group generation (set by the runtime).
    pub(crate) committer: Option<Committer>,
    /// The generation of the current assignment: offsets are committed
    /// under it, so a member the group has fenced cannot commit.
    pub(crate) generation: Option<Arc<Generation>>,
    /// Whether the coordinator still counts this member in (set by the
    /// runtime): past a session without confirmation nothing is written.
    pub(crate) session: Option<SessionClock>,
    /// Failures in a row per task, for the re-initialisation limit.
    failures: HashMap<i32, TaskFailures>,
    /// kstate's own broker connections (set by the runtime): exactly-once
    /// waits for stable committed offsets through them.
    pub(crate) brokers: Option<Brokers>,
    /// Exactly-once: makes a new transactional producer (same
    /// `transactional.id`) after the current one was fenced.
    pub(crate) new_producer: Option<Box<dyn Fn() -> Result<ChangelogProducer> + Send>>,
    /// Exactly-once: producers fenced since the last committed transaction.
    fenced_in_a_row: u32,
    /// Exactly-once: a commit whose records were all acknowledged when the
    /// group moved to a new generation; its transaction stays open until
    /// the runtime applies that generation ([`TaskManager::complete_parked`]).
    /// No records are taken meanwhile.
    parked: Option<ParkedCommit>,
}

/// See [`TaskManager::parked`].
struct ParkedCommit {
    info: CommitInfo,
    items: Vec<SealedCommit>,
}

/// Exactly-once: a producer fenced this many times without a committed
/// transaction in between ends `run` (another process with the same
/// `transactional.id`, i.e. the same state directory, is running).
const MAX_FENCED_IN_A_ROW: u32 = 3;

/// Tasks whose stores open at the same time (each on a thread of its own;
/// a large assignment opens in waves instead of thousands of threads and
/// file handles at once).
const MAX_OPENING: usize = 8;
/// A task that failed this many times in a row, over at least
/// `task_timeout`, ends `run`.
const MAX_TASK_FAILURES: u32 = 5;
/// A task that ran this long since its last failure starts a new count.
const TASK_FAILURES_FORGOTTEN_AFTER: Duration = Duration::from_secs(300);

#[derive(Default)]
struct TaskFailures {
    count: u32,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// The stores of one task incarnation, opened by an opener thread.
struct Opened {
    partition: i32,
    incarnation: u64,
    stores: Result<Vec<KeyValueStore>>,
    /// Exactly-once, an active task: its committed input offsets, read
    /// stable before the restore (where its restored state stands).
    stable: Option<crate::group::StableOffsets>,
}

/// One commit after its seal (see `seal_running`), apart from the sealed
/// writes themselves.
struct CommitInfo {
    started: Instant,
    offsets: TopicPartitionList,
    /// Tasks whose stores hold sealed writes.
    partitions: Vec<i32>,
}

/// Tasks whose part of a commit failed (a diverged changelog, a RocksDB
/// error), with the first error of each: they are re-initialised, the
/// others' writes landed.
type FailedTasks = BTreeMap<i32, Error>;

/// What happens to a landed commit's input offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offsets {
    /// Commit them; a retriable failure hands them back to their tasks.
    Commit,
    /// Commit them once for tasks that are closing; a failure other than a
    /// fatal one is logged (the next owner reprocesses from the last
    /// committed offset).
    CommitClosing,
    /// Hand them back to the tasks that remain (a lost assignment).
    HandBack,
}

/// A pipelined commit whose changelog sends and RocksDB writes run on a
/// background thread while processing goes on. DESIGN.md §1's order holds
/// there: its changelog records are acknowledged before RocksDB is written,
/// and its input offsets are committed only after every store's write has
/// landed.
struct InFlightCommit {
    writer: std::thread::JoinHandle<Result<FailedTasks>>,
    info: CommitInfo,
    /// Exactly-once: its transaction (with the input offsets) committed
    /// already; only its RocksDB writes are in flight.
    transactional: bool,
}

impl TaskManager {
    pub(crate) fn new(
        config: Arc<AppConfig>,
        producer: Arc<ChangelogProducer>,
        resources: EngineResources,
        max_record_bytes: usize,
        tombstone_retention: HashMap<String, Duration>,
        restorer: Restorer,
    ) -> Self {
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        TaskManager {
            standbys: BTreeMap::new(),
            standby_target: BTreeSet::new(),
            unowned_dirs: BTreeMap::new(),
            last_cleanup: Instant::now(),
            tasks: BTreeMap::new(),
            config,
            outputs: OutputSink::new(producer.clone()),
            producer,
            resources,
            max_record_bytes,
            tombstone_retention: Arc::new(tombstone_retention),
            restorer,
            pending: Vec::new(),
            last_engine_metrics: Instant::now(),
            last_relief: Instant::now(),
            inflight: None,
            retired: Vec::new(),
            fetch_waker: None,
            opened_tx,
            opened_rx,
            opening: 0,
            closing: Vec::new(),
            next_incarnation: 0,
            offset_commits: RetryRun::default(),
            offsets_in_flight: None,
            committer: None,
            generation: None,
            session: None,
            failures: HashMap::new(),
            brokers: None,
            new_producer: None,
            fenced_in_a_row: 0,
            parked: None,
        }
    }

    /// Whether commits are transactions (exactly-once).
    fn exactly_once(&self) -> bool {
        self.producer.transactions().is_some()
    }

    /// Applies an assignment event. Revocations commit and close at once (the
    /// caller is inside the rebalance, before ownership moves); new
    /// partitions are opened by [`TaskManager::open_pending`].
    pub(crate) fn on_event<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, event: AssignmentEvent) -> Result<()> {
        match event {
            AssignmentEvent::Assigned(tps) => {
                self.pending.extend(tps);
                Ok(())
            }
            AssignmentEvent::Revoked(tps) => self.revoke(consumer, tps, false),
            AssignmentEvent::Lost(tps) => self.revoke(consumer, tps, true),
        }
    }

    fn revoke<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, tps: Vec<(String, i32)>, lost: bool) -> Result<()> {
        self.pending.retain(|tp| !tps.contains(tp));
        let closing: Vec<i32> = self
            .tasks
            .values()
            .filter(|t| !t.topics.is_empty() && t.topics.iter().all(|topic| tps.iter().any(|(x, p)| x == topic && *p == t.partition)))
            .map(|t| t.partition)
            .collect();
        // Close the tasks even if their commit fails: the partitions are
        // leaving this member either way, and nothing may commit them later.
        // A revoked task commits while it still owns its topics, so offsets
        // handed back on the way (a commit in flight, a backoff) go into its
        // closing commit. A lost assignment may not commit offsets, but the
        // RocksDB writes in flight must land before their stores close.
        let committed = if lost {
            self.forget_topics(&tps);
            // Exactly-once: outputs of the lost tasks are in the open transaction.
            self.abort_open_transaction();
            self.land_inflight(consumer, Offsets::HandBack)
        } else if closing.is_empty() {
            Ok(())
        } else {
            self.commit_closing(consumer, Some(&closing))
        };
        self.forget_topics(&tps);
        // One closing thread for all of them; a task that stays here as a
        // standby keeps its stores open and follows its changelogs.
        let mut stores = Vec::new();
        for p in closing {
            let Some(task) = self.tasks.remove(&p) else { continue };
            let closed = self.close_task(task, lost);
            if !lost && self.standby_target.contains(&p) && !self.standbys.contains_key(&p) && !closed.is_empty() {
                tracing::info!(partition = p, "active task demoted to standby; its stores stay open");
                self.restorer.submit(RestoreJob { partition: p, stores: closed, standby: true });
                self.standbys.insert(p, Standby::Following);
            } else {
                stores.extend(closed);
            }
        }
        self.close_in_background(stores);
        committed
    }

    /// These input partitions are no longer this member's: their tasks
    /// forget them (a later re-assignment starts from the committed offset).
    fn forget_topics(&mut self, tps: &[(String, i32)]) {
        for (topic, p) in tps {
            if let Some(task) = self.tasks.get_mut(p) {
                task.topics.remove(topic);
                task.rewind.remove(topic);
                task.restart_from.remove(topic);
                task.offsets.remove(topic);
            }
            // Another member reports it from now on.
            metrics::gauge!(crate::metrics::INPUT_LAG, "topic" => topic.clone(), "partition" => p.to_string()).set(0.0);
        }
    }

    /// Closes a task without committing: its uncommitted writes are dropped,
    /// its stores stay at their checkpoints.
    /// Returns its stores, for [`TaskManager::close_in_background`].
    fn close_task(&mut self, mut task: Task, lost: bool) -> Vec<KeyValueStore> {
        let mut stores = std::mem::take(&mut task.stores);
        if task.state == TaskState::Restoring {
            // Partially restored stores are consistent at their checkpoint.
            stores.extend(self.restorer.cancel(task.partition).map(|job| job.stores).unwrap_or_default());
        }
        for s in &mut stores {
            s.discard_uncommitted();
            // Sizes describe this instance's active stores: its next owner
            // reports them from now on (a standby here reports its lag).
            s.metrics.clear_sizes();
        }
        tracing::info!(partition = task.partition, lost, "task closed");
        stores
    }

    /// Closes stores on a thread of their own: closing flushes RocksDB's
    /// memtables (up to `write_buffer_bytes` each), which must not stall the
    /// partitions this member keeps (a revoke runs inside the rebalance, on
    /// the processing thread). A store's directory lock is released once
    /// it is closed; whoever opens it next waits for that on its own thread.
    fn close_in_background(&mut self, stores: Vec<KeyValueStore>) {
        if stores.is_empty() {
            return;
        }
        self.closing.retain(|h| !h.is_finished());
        let spawned = std::thread::Builder::new().name("kstate-close".into()).spawn(move || drop(stores));
        match spawned {
            Ok(handle) => self.closing.push(handle),
            // The stores went with the failed closure: they closed here.
            Err(e) => tracing::warn!(error = %e, "no thread to close stores on; closed them in place"),
        }
    }

    fn incarnation(&mut self) -> u64 {
        self.next_incarnation += 1;
        self.next_incarnation
    }

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
            let mut task = Task::new(p, BTreeSet::from([topic]), HashMap::new(), incarnation, Instant::now());
            // A standby promoted in place: its stores are open and nearly
            // up to date, so the restore replays only its lag.
            let mut promoted = None;
            if self.standbys.remove(&p) == Some(Standby::Following) {
                if let Some(job) = self.restorer.cancel(p) {
                    tracing::info!(partition = p, "standby promoted to active; restoring only its lag");
                    task.open_at = None;
                    if self.exactly_once() {
                        // Its restore waits for stable offsets, as an opened task's does.
                        promoted = Some(job.stores);
                    } else {
                        task.state = TaskState::Restoring;
                        self.restorer.submit(RestoreJob { partition: p, stores: job.stores, standby: false });
                    }
                }
            }
            self.tasks.insert(p, task);
            if let Some(stores) = promoted {
                self.start_opening(p, incarnation, Some(stores))?;
            }
        }
        let now = Instant::now();
        let free = MAX_OPENING.saturating_sub(self.opening);
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
    fn start_opening(&mut self, partition: i32, incarnation: u64, stores: Option<Vec<KeyValueStore>>) -> Result<()> {
        let stable = match (&self.brokers, self.exactly_once() && self.tasks.contains_key(&partition)) {
            (Some(brokers), true) => Some((
                brokers.clone(),
                self.config.input_topics.iter().map(|t| (t.clone(), partition)).collect::<Vec<_>>(),
            )),
            _ => None,
        };
        let config = self.config.clone();
        let producer = self.producer.clone();
        let resources = self.resources.clone();
        let retention = self.tombstone_retention.clone();
        let max_record_bytes = self.max_record_bytes;
        let done = self.opened_tx.clone();
        std::thread::Builder::new()
            .name(format!("kstate-open-{partition}"))
            .spawn(move || {
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
                        let changelog_topic = crate::kafka::changelog_topic(&config.application_id, def.name());
                        stores.push(KeyValueStore::open(StoreOpenArgs {
                            name: def.name(),
                            partition,
                            dir: config.store_dir(def.name(), partition),
                            tombstone_retention: retention.get(&changelog_topic).copied(),
                            changelog_topic,
                            max_record_bytes,
                            producer: producer.clone(),
                            resources: &resources,
                            lock_timeout: config.lock_timeout,
                        })?);
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
        self.opening += 1;
        Ok(())
    }

    /// Hands tasks whose stores were opened to the restore thread.
    fn collect_opened<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        while let Ok(Opened { partition, incarnation, stores, stable }) = self.opened_rx.try_recv() {
            self.opening -= 1;
            if let Some(Standby::Opening { incarnation: wanted, .. }) = self.standbys.get(&partition) {
                if *wanted == incarnation {
                    match stores {
                        Ok(stores) => {
                            tracing::info!(partition, "standby task opened; following its changelogs");
                            self.restorer.submit(RestoreJob { partition, stores, standby: true });
                            self.standbys.insert(partition, Standby::Following);
                        }
                        Err(e) => {
                            tracing::warn!(partition, error = %e, retry_in = ?STANDBY_RETRY_AFTER, "opening a standby task failed");
                            let incarnation = self.incarnation();
                            let open_at = Some(Instant::now() + STANDBY_RETRY_AFTER);
                            self.standbys.insert(partition, Standby::Opening { incarnation, open_at });
                        }
                    }
                    continue;
                }
            }
            let Some(task) = self.tasks.get_mut(&partition) else {
                // Dropped while opening.
                if let Ok(stores) = stores {
                    self.close_in_background(stores);
                }
                continue;
            };
            if task.incarnation != incarnation || task.state != TaskState::Opening {
                // An earlier incarnation's stores.
                if let Ok(stores) = stores {
                    self.close_in_background(stores);
                }
                continue;
            }
            match stores {
                Ok(stores) => {
                    // Exactly-once: the restored state stands exactly at the
                    // committed offsets; a re-initialised task restarts
                    // there, whatever this member remembered (a commit
                    // whose outcome it never learned). A new task needs no
                    // seek: the consumer fetches the same offsets, stable
                    // (read_committed), and seeking a partition whose
                    // offset fetch is under way fails (`__STATE`).
                    for ((topic, _), offset) in stable.into_iter().flatten() {
                        if let (Some(o), true) = (offset, task.topics.contains(&topic)) {
                            if let Some(r) = task.rewind.get_mut(&topic) {
                                *r = o;
                            }
                            task.restart_from.insert(topic, o);
                        }
                    }
                    task.state = TaskState::Restoring;
                    tracing::info!(partition, "task assigned; restoring its stores");
                    self.restorer.submit(RestoreJob { partition, stores, standby: false });
                }
                Err(e) => self.reinitialise(consumer, partition, e)?,
            }
        }
        Ok(())
    }

    /// Re-initialises a task after a fault confined to it (a changelog with
    /// another writer's records, a failed restore, a RocksDB or open error):
    /// closes it without committing, then re-opens its stores, which
    /// restore from their checkpoints (a diverged or invalid one restores
    /// in full), and processing restarts at its last committed offset. The
    /// other tasks go on. After [`MAX_TASK_FAILURES`] in a row, failing for
    /// at least `task_timeout`, it fails with [`Error::TaskFailed`].
    ///
    /// Exactly-once: a running task may have sent outputs into the open
    /// transaction, beside every other running task's: the transaction is
    /// aborted and every running task re-initialised.
    fn reinitialise<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, partition: i32, cause: Error) -> Result<()> {
        let running = self.tasks.get(&partition).is_some_and(|t| t.state == TaskState::Running);
        if running && self.producer.in_transaction() {
            return self.abort_and_reinitialise(consumer, &cause, false);
        }
        self.reinitialise_one(consumer, partition, cause)
    }

    /// Exactly-once: the open transaction must not commit (it failed, or a
    /// task in it did): aborts it, so nothing sent since the last commit
    /// becomes visible, and re-initialises every running task (their
    /// uncommitted writes and outputs are gone; they restore from their
    /// checkpoints and process again from their committed offsets). A
    /// `fatal` failure (the producer was fenced) replaces the producer
    /// first; every task and standby is then reopened on the new one.
    fn abort_and_reinitialise<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, cause: &Error, mut fatal: bool) -> Result<()> {
        self.parked = None;
        if fatal {
            metrics::counter!(crate::metrics::TRANSACTIONS_ABORTED).increment(1);
        } else if !self.abort_now() {
            fatal = true;
        }
        let id = self.producer.transactional_id().to_string();
        let partitions: Vec<i32> = if fatal {
            self.fenced_in_a_row += 1;
            if self.fenced_in_a_row >= MAX_FENCED_IN_A_ROW {
                tracing::error!(transactional_id = %id, times = self.fenced_in_a_row, error = %cause,
                    "the producer was fenced again and again: is another instance running on the same state directory?");
                return Err(Error::Transaction {
                    transactional_id: id,
                    operation: "commit",
                    detail: format!("fenced {} times in a row without a commit in between; last: {cause}", self.fenced_in_a_row),
                });
            }
            tracing::warn!(transactional_id = %id, error = %cause,
                "the transactional producer was fenced; replacing it and re-initialising every task (nothing of the open transaction is visible)");
            let Some(new_producer) = &self.new_producer else {
                return Err(Error::Transaction { transactional_id: id, operation: "commit", detail: cause.to_string() });
            };
            self.producer = Arc::new(new_producer()?);
            self.outputs = OutputSink::new(self.producer.clone());
            // Standby stores hold the old producer: reopen them (update_standbys does).
            for (p, state) in std::mem::take(&mut self.standbys) {
                if state == Standby::Following {
                    if let Some(job) = self.restorer.cancel(p) {
                        self.close_in_background(job.stores);
                    }
                }
            }
            self.tasks.keys().copied().collect()
        } else {
            tracing::warn!(transactional_id = %id, error = %cause,
                "transaction aborted; re-initialising the running tasks from their checkpoints and committed offsets");
            self.tasks.values().filter(|t| t.state == TaskState::Running).map(|t| t.partition).collect()
        };
        // Not counted as the tasks' own failures (a run of aborts from a long
        // rebalance or a broker restart must not end `run` with TaskFailed).
        for p in partitions {
            self.reinitialise_counted(consumer, p, Error::Transaction { transactional_id: id.clone(), operation: "commit", detail: cause.to_string() }, false)?;
        }
        Ok(())
    }

    /// Exactly-once: aborts the open transaction, if any, for tasks that
    /// are all being closed without commit (lost, or at a failed shutdown).
    fn abort_open_transaction(&mut self) {
        self.parked = None;
        if self.producer.in_transaction() && self.abort_now() {
            tracing::info!("open transaction aborted");
        }
    }

    /// Aborts the open transaction (counted); later outputs get a fresh
    /// tracker. Whether the abort went through (else the brokers abort it
    /// after `transaction_timeout`, and the producer is unusable).
    fn abort_now(&mut self) -> bool {
        metrics::counter!(crate::metrics::TRANSACTIONS_ABORTED).increment(1);
        self.outputs.reset();
        match self.producer.abort_transaction(self.config.commit_timeout) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "aborting the transaction failed; the brokers abort it after transaction_timeout");
                false
            }
        }
    }

    fn reinitialise_one<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, partition: i32, cause: Error) -> Result<()> {
        self.reinitialise_counted(consumer, partition, cause, true)
    }

    /// [`TaskManager::reinitialise_one`]; `count`: whether the failure
    /// counts toward [`MAX_TASK_FAILURES`].
    fn reinitialise_counted<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, partition: i32, cause: Error, count: bool) -> Result<()> {
        if self.inflight.as_ref().is_some_and(|c| c.transactional) {
            // Its offsets are committed: the task must restart after them,
            // or it would apply them again on top of the restored records.
            self.land_inflight(consumer, Offsets::Commit)?;
        }
        let Some(mut task) = self.tasks.remove(&partition) else { return Ok(()) };
        let now = Instant::now();
        let failures = self.failures.entry(partition).or_default();
        if failures.last.is_some_and(|t| now - t >= TASK_FAILURES_FORGOTTEN_AFTER) {
            failures.count = 0;
        }
        if count {
            if failures.count == 0 {
                failures.first = Some(now);
            }
            failures.count += 1;
            failures.last = Some(now);
        }
        let attempts = failures.count.max(1);
        let failing_for = failures.first.map_or(Duration::ZERO, |t| now - t);
        metrics::counter!(crate::metrics::TASK_REINITIALISATIONS, "partition" => partition.to_string()).increment(1);
        if count && attempts >= MAX_TASK_FAILURES && failing_for >= self.config.task_timeout {
            tracing::error!(partition, attempts, error = %cause, "task failed again; giving up");
            self.tasks.insert(partition, task); // closed with the others
            return Err(Error::TaskFailed { partition, attempts, last: Box::new(cause) });
        }
        // The first retry at once, then 0.5 s, 1 s, 2 s, ... up to 30 s.
        let backoff = if attempts == 1 || !count {
            Duration::ZERO
        } else {
            (Duration::from_millis(500) * (1 << (attempts - 2).min(6))).min(Duration::from_secs(30))
        };
        if count {
            tracing::error!(partition, attempt = attempts, ?backoff, error = %cause,
                "task failed; closing it without commit and restoring its stores from their changelogs");
        } else {
            tracing::warn!(partition, ?backoff, "task re-initialised after the transaction was aborted");
        }
        if let Err(e) = consumer.pause(&task.input()) {
            tracing::warn!(partition, error = %e, "pausing the input of a failed task failed");
        }
        let mut rewind = std::mem::take(&mut task.restart_from);
        // An offset commit in flight covers writes that landed: restarting
        // there is safe, and keeps the committed offset from going back.
        if let Some(inflight) = &self.offsets_in_flight {
            for e in inflight.elements().iter().filter(|e| e.partition() == partition) {
                if let (Some(r), Offset::Offset(o)) = (rewind.get_mut(e.topic()), e.offset()) {
                    *r = (*r).max(o);
                }
            }
        }
        for (topic, offset) in std::mem::take(&mut task.rewind) {
            let r = rewind.entry(topic).or_insert(offset);
            *r = (*r).min(offset);
        }
        let topics = std::mem::take(&mut task.topics);
        let stores = self.close_task(task, false);
        self.close_in_background(stores);
        let incarnation = self.incarnation();
        self.tasks.insert(partition, Task::new(partition, topics, rewind, incarnation, now + backoff));
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
                RestoreOutcome::Failed(job, e) if job.standby => {
                    let partition = job.partition;
                    self.close_in_background(job.stores);
                    if self.standbys.get(&partition) == Some(&Standby::Following) {
                        tracing::warn!(partition, error = %e, retry_in = ?STANDBY_RETRY_AFTER,
                            "a standby task failed; reopening it after a pause");
                        let incarnation = self.incarnation();
                        let open_at = Some(Instant::now() + STANDBY_RETRY_AFTER);
                        self.standbys.insert(partition, Standby::Opening { incarnation, open_at });
                    }
                    continue;
                }
                RestoreOutcome::Failed(job, e) => {
                    let partition = job.partition;
                    self.close_in_background(job.stores);
                    if self.tasks.get(&partition).is_some_and(|t| t.state == TaskState::Restoring) {
                        self.reinitialise(consumer, partition, e)?;
                    } else {
                        tracing::warn!(partition, error = %e, "restore of a revoked task failed; ignored");
                    }
                    continue;
                }
            };
            if !self.tasks.get(&job.partition).is_some_and(|t| t.state == TaskState::Restoring) {
                self.close_in_background(job.stores); // revoked meanwhile
                continue;
            }
            let task = self.tasks.get_mut(&job.partition).expect("checked");
            task.stores = job.stores;
            task.state = TaskState::Running;
            for topic in &task.topics {
                if let Some(offset) = task.rewind.remove(topic) {
                    consumer.seek(topic, task.partition, Offset::Offset(offset), Duration::from_secs(10))?;
                }
            }
            resume_now(consumer, &task.input(), self.fetch_waker.as_ref())?;
            tracing::info!(partition = task.partition, "task running");
        }
    }

    /// The standby tasks the current assignment gives this member (applied
    /// by [`TaskManager::update_standbys`]; a task revoked meanwhile that is
    /// among them stays open as a standby).
    pub(crate) fn set_standby_target(&mut self, target: BTreeSet<i32>) {
        self.standby_target = target;
    }

    /// Brings the standby tasks in line with the target: opens new ones
    /// (off the processing thread, at most [`MAX_OPENING`] at once with the
    /// active tasks), closes those no longer wanted. A task that is active
    /// here is never a standby.
    pub(crate) fn update_standbys(&mut self) -> Result<()> {
        let actives = self.partitions();
        let wanted: BTreeSet<i32> = self.standby_target.difference(&actives).copied().collect();
        let dropped: Vec<(i32, Standby)> =
            self.standbys.iter().filter(|(p, _)| !wanted.contains(p) && !actives.contains(p)).map(|(p, s)| (*p, *s)).collect();
        let mut stores = Vec::new();
        for (p, state) in dropped {
            self.standbys.remove(&p);
            if state == Standby::Following {
                if let Some(job) = self.restorer.cancel(p) {
                    stores.extend(job.stores);
                }
            }
            tracing::info!(partition = p, "standby task dropped");
        }
        self.close_in_background(stores);
        let now = Instant::now();
        for p in wanted {
            if !self.standbys.contains_key(&p) {
                let incarnation = self.incarnation();
                self.standbys.insert(p, Standby::Opening { incarnation, open_at: Some(now) });
            }
        }
        let free = MAX_OPENING.saturating_sub(self.opening);
        let due: Vec<(i32, u64)> = self
            .standbys
            .iter_mut()
            .filter_map(|(p, s)| match s {
                Standby::Opening { incarnation, open_at } if open_at.is_some_and(|at| at <= now) => {
                    *open_at = None;
                    Some((*p, *incarnation))
                }
                _ => None,
            })
            .take(free)
            .collect();
        for (p, incarnation) in due {
            self.start_opening(p, incarnation, None)?;
        }
        Ok(())
    }

    /// Deletes the local state of tasks that were neither active nor
    /// standby here for `state_cleanup_delay` (checked every
    /// [`CLEANUP_EVERY`] at most); a directory whose lock is held (another
    /// instance on the same state directory) is left alone.
    pub(crate) fn clean_state_dirs(&mut self) {
        let every = CLEANUP_EVERY.min(self.config.state_cleanup_delay / 2);
        if self.last_cleanup.elapsed() < every {
            return;
        }
        let now = Instant::now();
        self.last_cleanup = now;
        // Unowned time counts only while this member is in the group: a
        // coordinator outage or a startup must not delete local state.
        if self.generation.is_none() || !self.session_alive() {
            self.unowned_dirs.clear();
            return;
        }
        let held: BTreeSet<i32> = self.partitions().into_iter().chain(self.standbys.keys().copied()).collect();
        let mut on_disk = BTreeSet::new();
        for store in &self.config.stores {
            let dir = self.config.state_dir.join(&self.config.application_id).join(store.name());
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            on_disk.extend(entries.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()));
        }
        self.unowned_dirs.retain(|p, _| on_disk.contains(p) && !held.contains(p));
        for p in on_disk.difference(&held) {
            let since = *self.unowned_dirs.entry(*p).or_insert(now);
            if now - since < self.config.state_cleanup_delay {
                continue;
            }
            for store in &self.config.stores {
                let dir = self.config.store_dir(store.name(), *p);
                if !dir.is_dir() {
                    continue;
                }
                let Ok(lock) = crate::store::lock::DirLock::acquire(&dir, Duration::ZERO) else {
                    tracing::debug!(partition = p, dir = %dir.display(), "unowned task directory is locked; kept");
                    continue;
                };
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => tracing::info!(partition = p, store = store.name(), unowned_for = ?(now - since),
                        "deleted the local state of a task this instance no longer holds"),
                    Err(e) => tracing::warn!(partition = p, dir = %dir.display(), error = %e, "deleting unowned task state failed"),
                }
                drop(lock);
            }
            self.unowned_dirs.remove(p);
        }
    }

    /// For the group's subscription: per running active task, the sum of
    /// its stores' (checkpoint + 1).
    pub(crate) fn active_offsets(&self) -> BTreeMap<i32, i64> {
        self.tasks
            .values()
            .filter(|t| t.state == TaskState::Running)
            .map(|t| (t.partition, t.stores.iter().map(|s| s.checkpoint().unwrap_or(-1) + 1).sum()))
            .collect()
    }

    /// The standby checkpoints (see [`StandbyOffsets`]).
    pub(crate) fn standby_offsets(&self) -> crate::restore::StandbyOffsets {
        self.restorer.standby_offsets()
    }

    /// The partitions of every task this member holds or is about to open.
    pub(crate) fn partitions(&self) -> BTreeSet<i32> {
        self.tasks.keys().copied().chain(self.pending.iter().map(|(_, p)| *p)).collect()
    }

    /// Uncommitted bytes over every store, including a commit in flight.
    pub(crate) fn uncommitted_bytes(&self) -> usize {
        self.tasks.values().flat_map(|t| &t.stores).map(KeyValueStore::uncommitted_bytes).sum()
    }

    /// Starts a pipelined commit: waits for the previous one to land, seals
    /// each store's writes and hands them to a background writer, which
    /// sends them to the changelog, waits for every acknowledgement and
    /// writes RocksDB. Its input offsets are committed by
    /// [`TaskManager::poll_inflight`] once the writes landed.
    ///
    /// While the previous commit's writer is still busy (brokers slow or
    /// away) nothing is sealed and `false` is returned: processing goes on
    /// and the next call retries; the runtime stops taking records once
    /// `max_uncommitted_bytes` is reached (see [`TaskManager::backpressure`]).
    ///
    /// Exactly-once: the commit is one transaction, written on this thread
    /// (see [`TaskManager::commit_transaction`]).
    pub(crate) fn commit_pipelined<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<bool> {
        if self.inflight.as_ref().is_some_and(|c| !c.writer.is_finished()) || !self.session_alive() {
            return Ok(false);
        }
        if self.exactly_once() {
            if self.parked.is_some() || self.session.as_ref().is_some_and(|s| !s.generation_settled()) {
                return Ok(false); // once the group's new assignment is applied
            }
            self.commit_transaction(consumer, false)?;
            return Ok(true);
        }
        let (info, sealed) = self.seal_running(consumer, None)?;
        // Output records are waited for like changelog records.
        let outputs = self.outputs.rotate();
        if sealed.is_empty() && outputs.is_none() {
            self.commit_offsets(info.offsets, Offsets::Commit)?;
            return Ok(true);
        }
        let writer = std::thread::Builder::new()
            .name("kstate-commit".into())
            .spawn({
                let retired = std::mem::take(&mut self.retired);
                let producer = self.producer.clone();
                let (timeout, patience) = (self.config.commit_timeout, self.config.task_timeout);
                move || {
                    let written = write_sealed(sealed, &producer, outputs, timeout, patience);
                    drop(retired);
                    written
                }
            })
            .map_err(|e| Error::io("kstate-commit thread", e))?;
        self.inflight = Some(InFlightCommit { writer, info, transactional: false });
        Ok(true)
    }

    /// Whether to stop taking records for now: the uncommitted writes
    /// reached `max_uncommitted_bytes` while a commit is still being
    /// written, so a new one cannot start.
    pub(crate) fn backpressure(&mut self) -> bool {
        if self.parked.is_some() {
            return true;
        }
        let excess = self.resources.memtable_excess();
        if excess > 0 {
            self.relieve_memtables(excess);
            return true;
        }
        let no_commit_now = self.inflight.as_ref().is_some_and(|c| !c.writer.is_finished())
            || !self.session_alive()
            || (self.exactly_once() && self.session.as_ref().is_some_and(|s| !s.generation_settled()));
        no_commit_now && self.uncommitted_bytes() >= self.config.max_uncommitted_bytes
    }

    /// Over `max_state_memory`'s memtable share: schedules flushes of the
    /// stores with the largest active memtables, enough to free `excess`
    /// bytes (RocksDB flushes only the database being written to, which
    /// neither keeps up with hundreds of stores nor ever reaches an idle
    /// one). At most every 50 ms; the loop takes no records meanwhile.
    fn relieve_memtables(&mut self, excess: usize) {
        if self.last_relief.elapsed() < Duration::from_millis(50) {
            return;
        }
        self.last_relief = Instant::now();
        let mut sizes: Vec<(u64, i32, usize)> = self
            .tasks
            .values()
            .flat_map(|t| t.stores.iter().enumerate().map(move |(i, s)| (s, t.partition, i)))
            .filter_map(|(s, p, i)| Some((s.engine().property("rocksdb.cur-size-active-mem-table")?, p, i)))
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut freed = 0u64;
        for (size, p, i) in sizes {
            if freed >= excess as u64 || size == 0 {
                break;
            }
            if let Some(store) = self.tasks.get(&p).and_then(|t| t.stores.get(i)) {
                if store.engine().flush_soon().is_ok() {
                    freed += size;
                }
            }
        }
    }

    /// Whether the coordinator confirmed this member within a session
    /// timeout. A member past it (frozen, partitioned) has probably lost its
    /// tasks to another: writing their changelogs or committing would race
    /// the new owner, so commits wait until the membership reports (its
    /// tasks lost, or confirmed again).
    fn session_alive(&self) -> bool {
        self.session.as_ref().is_none_or(SessionClock::alive)
    }

    /// Completes the pipelined commit in flight if its writes have landed.
    pub(crate) fn poll_inflight<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        if self.inflight.as_ref().is_some_and(|c| c.writer.is_finished()) {
            self.land_inflight(consumer, Offsets::Commit)?;
        }
        Ok(())
    }

    /// Waits for the pipelined commit in flight, if any, to land; then
    /// deals with its input offsets as `offsets` says and re-initialises
    /// the tasks whose part of it failed.
    fn land_inflight<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, offsets: Offsets) -> Result<()> {
        let transactional = self.inflight.as_ref().is_some_and(|c| c.transactional);
        let Some((info, written)) = self.join_inflight() else { return Ok(()) };
        if transactional {
            return self.transaction_landed(consumer, info, written?);
        }
        self.finish_commit(consumer, info, written?, offsets, "pipelined commit landed")
    }

    /// Waits for the writer of the commit in flight, if any; the stores
    /// whose writes landed stop reading them from memory.
    fn join_inflight(&mut self) -> Option<(CommitInfo, Result<FailedTasks>)> {
        let InFlightCommit { writer, info, .. } = self.inflight.take()?;
        let written = writer.join().unwrap_or_else(|_| {
            Err(Error::Restore { topic: String::new(), partition: -1, detail: "the commit writer thread panicked".into() })
        });
        if let Ok(failed) = &written {
            self.mark_landed(&info.partitions, failed);
        }
        Some((info, written))
    }

    /// The last step of a commit whose writes landed (except those of the
    /// `failed` tasks): commits or hands back its input offsets, records
    /// its latency, re-initialises the failed tasks (their offsets are
    /// never committed: their input is processed again).
    fn finish_commit<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        info: CommitInfo,
        failed: FailedTasks,
        offsets: Offsets,
        what: &str,
    ) -> Result<()> {
        let stored = info.started.elapsed().as_secs_f64();
        let mut tpl = info.offsets;
        if !failed.is_empty() {
            let mut kept = TopicPartitionList::new();
            for e in tpl.elements().iter().filter(|e| !failed.contains_key(&e.partition())) {
                kept.add_partition_offset(e.topic(), e.partition(), e.offset())?;
            }
            tpl = kept;
        }
        let count = tpl.count();
        self.commit_offsets(tpl, offsets)?;
        let seconds = info.started.elapsed().as_secs_f64();
        metrics::histogram!(crate::metrics::COMMIT_SECONDS).record(seconds);
        tracing::debug!(seconds, stored, offsets = count, "{what}");
        for (partition, e) in failed {
            self.reinitialise(consumer, partition, e)?;
        }
        Ok(())
    }

    /// Commits input offsets under the group's current generation.
    ///
    /// While tasks run, the commit is asynchronous (a coordinator that is
    /// away must not block processing) and at most one is in flight: offsets
    /// that arrive meanwhile, or during a backoff, go back to their tasks
    /// and the next commit takes them (the newest win). Its result arrives
    /// in [`TaskManager::on_commit_result`]. For closing tasks the commit is
    /// synchronous and done once, together with the offsets of an
    /// asynchronous commit still in flight for them.
    fn commit_offsets(&mut self, mut tpl: TopicPartitionList, offsets: Offsets) -> Result<()> {
        if offsets == Offsets::CommitClosing {
            if let Some(inflight) = &self.offsets_in_flight {
                for e in inflight.elements() {
                    let closing = tpl.elements().iter().any(|c| c.partition() == e.partition());
                    if closing && tpl.find_partition(e.topic(), e.partition()).is_none() {
                        tpl.add_partition_offset(e.topic(), e.partition(), e.offset())?;
                    }
                }
            }
        }
        if tpl.count() == 0 {
            if self.offsets_in_flight.is_none() {
                // Nothing is left to retry: a failing run is over (a run that
                // never ends would fail a much later, unrelated commit).
                self.offset_commits.succeeded(Instant::now());
            }
            return Ok(());
        }
        // The previous commit's result may be in (a commit inside a long
        // batch of records never passes the loop's own check).
        self.poll_offset_commit()?;
        let waiting = self.offsets_in_flight.is_some() || !self.offset_commits.due(Instant::now());
        if offsets == Offsets::HandBack || (offsets == Offsets::Commit && waiting) {
            self.hand_back(&tpl);
            return Ok(());
        }
        let closing = offsets == Offsets::CommitClosing;
        let (Some(committer), Some(generation)) = (&self.committer, &self.generation) else {
            // Not a member yet: nothing can have been processed.
            self.hand_back(&tpl);
            return Ok(());
        };
        let list = offsets_of(&tpl);
        if closing {
            match committer.commit_sync(generation.clone(), list, self.config.commit_timeout) {
                Ok(()) => {
                    self.committed(&tpl);
                    Ok(())
                }
                Err(e) => self.commit_failed(e, &tpl, true),
            }
        } else {
            committer.send(generation.clone(), list);
            self.offsets_in_flight = Some(tpl);
            Ok(())
        }
    }

    /// Takes in the result of the asynchronous offset commit, if it arrived.
    pub(crate) fn poll_offset_commit(&mut self) -> Result<()> {
        let Some(committer) = &self.committer else { return Ok(()) };
        let Some((offsets, result)) = committer.result() else {
            if committer.is_dead() {
                return Err(Error::OffsetCommit("the offset commit thread stopped unexpectedly".into()));
            }
            return Ok(());
        };
        self.on_commit_result(result, &offsets)
    }

    /// The result of an asynchronous offset commit. Results of other
    /// commits are ignored.
    fn on_commit_result(&mut self, result: std::result::Result<(), CommitError>, offsets: &[(String, i32, i64)]) -> Result<()> {
        if self.offsets_in_flight.as_ref().is_none_or(|sent| offsets_of(sent) != offsets) {
            return Ok(());
        }
        let sent = self.offsets_in_flight.take().expect("checked");
        match result {
            Ok(()) => {
                self.committed(&sent);
                Ok(())
            }
            Err(e) => self.commit_failed(e, &sent, false),
        }
    }

    /// Offsets the coordinator accepted: where the tasks restart from if
    /// they are re-initialised.
    fn committed(&mut self, tpl: &TopicPartitionList) {
        if let Some((failing_for, attempts)) = self.offset_commits.succeeded(Instant::now()) {
            tracing::info!(?failing_for, attempts, "offset commits succeed again");
        }
        for e in tpl.elements() {
            if let (Some(task), Offset::Offset(o)) = (self.tasks.get_mut(&e.partition()), e.offset()) {
                task.restart_from.insert(e.topic().to_string(), o);
            }
        }
    }

    /// A failed offset commit: a group change or a retriable error hands the
    /// offsets back (or, for closing tasks, is logged); past `task_timeout`
    /// of failures in a row, or on any other error, this fails.
    fn commit_failed(&mut self, error: CommitError, tpl: &TopicPartitionList, closing: bool) -> Result<()> {
        let kind = error.kind;
        let label = kind.label();
        metrics::counter!(crate::metrics::OFFSET_COMMIT_FAILURES, "kind" => label).increment(1);
        if kind == CommitFailure::Fatal {
            return Err(Error::OffsetCommit(error.detail));
        }
        if closing {
            tracing::warn!(error = %error, kind = label,
                "offset commit of closing tasks failed; their next owner reprocesses from the last committed offset");
            return Ok(());
        }
        let now = Instant::now();
        let failing_for = self.offset_commits.failed(now);
        if failing_for >= self.config.task_timeout {
            return Err(Error::RetriesExhausted {
                operation: "offset commit",
                retried_for: failing_for,
                attempts: self.offset_commits.attempts(),
                timeout: self.config.task_timeout,
                last: Box::new(Error::OffsetCommit(error.detail)),
            });
        }
        if self.offset_commits.should_warn(now) {
            let why = if kind == CommitFailure::GroupChanged {
                "the group is rebalancing or moved on; partitions still owned commit with the next commit, lost ones are closed without commit"
            } else {
                "the group coordinator or the brokers are unavailable; retrying with backoff while processing goes on"
            };
            tracing::warn!(error = %error, ?failing_for, attempts = self.offset_commits.attempts(),
                task_timeout = ?self.config.task_timeout, "offset commit failed: {why}");
        }
        if self.hand_back(tpl) == 0 {
            // Their tasks are gone: nothing to retry.
            self.offset_commits.succeeded(now);
        }
        Ok(())
    }

    /// Gives offsets that were not committed back to the tasks that still
    /// run, so the next commit takes them; returns how many found a task.
    /// Every handed-back offset has landed writes behind it, so the larger
    /// of it and what a task holds is safe to commit. A task that has not
    /// processed the topic yet (a new incarnation: no `restart_from`) gets
    /// nothing: its restart position must come from its own first record.
    fn hand_back(&mut self, tpl: &TopicPartitionList) -> usize {
        let mut given = 0;
        for e in tpl.elements() {
            if let (Some(task), Offset::Offset(o)) = (self.tasks.get_mut(&e.partition()), e.offset()) {
                if task.topics.contains(e.topic()) && task.restart_from.contains_key(e.topic()) {
                    let held = task.offsets.entry(e.topic().to_string()).or_insert(o);
                    *held = (*held).max(o);
                    given += 1;
                }
            }
        }
        given
    }

    /// The commit protocol (DESIGN.md §1) for tasks that are closing (`only`
    /// these partitions, or all at shutdown): send each store's writes to
    /// the changelog and wait for every acknowledgement, write each store's
    /// writes and checkpoint in one RocksDB batch, then commit the input
    /// offsets once.
    ///
    /// Exactly-once: every running task commits (one transaction holds
    /// them all), not only the closing ones.
    pub(crate) fn commit_closing<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, only: Option<&[i32]>) -> Result<()> {
        if self.exactly_once() {
            if self.session_alive() {
                // Never parked: tasks close right after it, and a revoke
                // runs under the new generation (the membership waits
                // until it is applied before it joins again).
                return self.commit_transaction(consumer, true);
            }
            tracing::warn!("the group has not confirmed this member for a session timeout; closing without commit");
            if self.producer.in_transaction() {
                let cause = Error::GroupMembership { group: self.config.application_id.clone(), detail: "session expired".into() };
                return self.abort_and_reinitialise(consumer, &cause, false);
            }
            for task in self.tasks.values_mut().filter(|t| only.is_none_or(|o| o.contains(&t.partition))) {
                task.stores.iter_mut().for_each(KeyValueStore::discard_uncommitted);
            }
            return Ok(());
        }
        // A member the group may have dropped must not write.
        if !self.session_alive() {
            tracing::warn!("the group has not confirmed this member for a session timeout; closing without commit");
            match only {
                None => self.discard_all(),
                Some(partitions) => {
                    self.land_inflight(consumer, Offsets::HandBack)?;
                    for task in self.tasks.values_mut().filter(|t| partitions.contains(&t.partition)) {
                        task.stores.iter_mut().for_each(KeyValueStore::discard_uncommitted);
                    }
                }
            }
            return Ok(());
        }
        let (info, sealed) = self.seal_running(consumer, only)?;
        let outputs = self.outputs.rotate();
        let failed = write_sealed(sealed, &self.producer, outputs, self.config.commit_timeout, self.config.task_timeout)?;
        self.mark_landed(&info.partitions, &failed);
        self.finish_commit(consumer, info, failed, Offsets::CommitClosing, "committed")
    }

    /// The exactly-once commit, one transaction: seals every running task's
    /// writes, sends them to the changelogs inside the open transaction
    /// (the outputs went there as they were sent), waits for every
    /// acknowledgement, adds the input offsets under the member's
    /// generation, commits the transaction, and only then lands each
    /// store's writes and checkpoint in RocksDB. On this thread: the next
    /// period's outputs belong to the next transaction. A failure aborts
    /// the transaction and re-initialises the running tasks; failures that
    /// no retry mends (an output or changelog record refused) also end `run`.
    ///
    /// A commit `closing` tasks (a revoke while the new generation is
    /// applied, or shutdown) completes at once; any other waits (is parked)
    /// while the group moves to a new generation.
    fn commit_transaction<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, closing: bool) -> Result<()> {
        if self.parked.is_some() {
            // Still no new generation to complete it under (shutdown while
            // rebalancing): its input is processed again by whoever owns it.
            let cause = Error::GroupMembership {
                group: self.config.application_id.clone(),
                detail: "the group moved to a new generation during the last commit".into(),
            };
            return self.abort_and_reinitialise(consumer, &cause, false);
        }
        let (info, sealed) = self.seal_running(consumer, None)?;
        let outputs = self.outputs.rotate();
        if sealed.is_empty() && info.offsets.count() == 0 && !self.producer.in_transaction() {
            return Ok(());
        }
        let sent = send_transaction(sealed, &self.producer, outputs, self.config.commit_timeout, self.config.task_timeout);
        let items = match sent {
            Ok(items) => items,
            Err(failure) => return self.transaction_failed(consumer, failure),
        };
        self.complete_transaction(consumer, info, items, (!closing, !closing))
    }

    /// Exactly-once: whether a commit is parked (see [`TaskManager::parked`]).
    pub(crate) fn is_parked(&self) -> bool {
        self.parked.is_some()
    }

    /// Exactly-once: completes a commit parked while the group moved to a
    /// new generation, under that generation (called when the runtime
    /// applies it, before any task is revoked: no other member has
    /// processed these tasks' input since).
    pub(crate) fn complete_parked<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        match self.parked.take() {
            Some(ParkedCommit { info, items }) => self.complete_transaction(consumer, info, items, (false, false)),
            None => Ok(()),
        }
    }

    /// Exactly-once, after every record of the commit was acknowledged:
    /// sends its offsets under the current generation, commits the
    /// transaction, then lands the stores.
    /// With `background`, the RocksDB writes land on a thread of their own
    /// (see [`TaskManager::poll_inflight`]). A commit that `may_park` is
    /// parked if the group is moving to a new generation.
    fn complete_transaction<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        info: CommitInfo,
        items: Vec<SealedCommit>,
        (background, may_park): (bool, bool),
    ) -> Result<()> {
        let Some(generation) = self.generation.clone() else {
            let cause = Error::GroupMembership {
                group: self.config.application_id.clone(),
                detail: "no current generation to commit under".into(),
            };
            return self.abort_and_reinitialise(consumer, &cause, false);
        };
        let session = self.session.clone();
        let finished = finish_transaction(
            &self.producer,
            (&self.config.application_id, &generation, &offsets_of(&info.offsets)),
            (session.as_ref(), may_park),
            self.config.commit_timeout,
            self.config.task_timeout,
        );
        match finished {
            Err(failure) => return self.transaction_failed(consumer, failure),
            Ok(Finished::NotSettled) => {
                // Offsets under the old generation could be refused and the
                // whole transaction aborted: complete it under the new one.
                tracing::info!("the group is rebalancing; the commit completes under the new generation");
                self.parked = Some(ParkedCommit { info, items });
                return Ok(());
            }
            Ok(Finished::Committed) => {}
        }
        self.fenced_in_a_row = 0;
        if background {
            // Committed: landing the stores overlaps the next period's
            // processing (reads see the sealed writes meanwhile); the next
            // commit waits for it.
            let retired = std::mem::take(&mut self.retired);
            let writer = std::thread::Builder::new()
                .name("kstate-commit".into())
                .spawn(move || {
                    let landed = land_stores(items);
                    drop(retired);
                    Ok(landed)
                })
                .map_err(|e| Error::io("kstate-commit thread", e))?;
            self.inflight = Some(InFlightCommit { writer, info, transactional: true });
            return Ok(());
        }
        let failed = land_stores(items);
        self.mark_landed(&info.partitions, &failed);
        self.transaction_landed(consumer, info, failed)
    }

    /// Exactly-once: a committed transaction's stores landed (except the
    /// `failed` ones): its offsets are where the tasks restart from; the
    /// failed tasks restore the committed records from the changelogs.
    fn transaction_landed<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, info: CommitInfo, failed: FailedTasks) -> Result<()> {
        self.committed(&info.offsets);
        let seconds = info.started.elapsed().as_secs_f64();
        metrics::histogram!(crate::metrics::COMMIT_SECONDS).record(seconds);
        tracing::debug!(seconds, offsets = info.offsets.count(), "transaction committed and landed");
        for (partition, e) in failed {
            // Through `reinitialise`: the task may have sent outputs into
            // the transaction opened since.
            self.reinitialise(consumer, partition, e)?;
        }
        Ok(())
    }

    /// Aborts after a failed exactly-once commit; `run` ends if the failure says so.
    fn transaction_failed<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, failure: TxnFailure) -> Result<()> {
        let TxnFailure { error, fatal, ends_run } = failure;
        self.abort_and_reinitialise(consumer, &error, fatal)?;
        if ends_run {
            Err(*error)
        } else {
            Ok(())
        }
    }

    /// The first step of every commit, for `only` these partitions or all
    /// running tasks: lands the commit in flight, then seals each store's
    /// writes and takes the tasks' input offsets.
    fn seal_running<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        only: Option<&[i32]>,
    ) -> Result<(CommitInfo, Vec<SealedCommit>)> {
        self.land_inflight(consumer, Offsets::Commit)?;
        let started = Instant::now();
        let mut offsets = TopicPartitionList::new();
        let mut sealed = Vec::new();
        let mut partitions = Vec::new();
        for task in self.tasks.values_mut() {
            if only.is_some_and(|o| !o.contains(&task.partition)) || task.state != TaskState::Running {
                continue;
            }
            for (topic, offset) in task.offsets.drain() {
                offsets.add_partition_offset(&topic, task.partition, Offset::Offset(offset))?;
            }
            let before = sealed.len();
            for store in &mut task.stores {
                sealed.extend(store.seal()?);
            }
            if sealed.len() > before {
                partitions.push(task.partition);
            }
        }
        Ok((CommitInfo { started, offsets, partitions }, sealed))
    }

    /// The sealed writes of these tasks' stores are in RocksDB, except
    /// those of the failed tasks (which are re-initialised).
    fn mark_landed(&mut self, partitions: &[i32], failed: &FailedTasks) {
        for p in partitions.iter().filter(|p| !failed.contains_key(p)) {
            if let Some(task) = self.tasks.get_mut(p) {
                self.retired.extend(task.stores.iter_mut().map(KeyValueStore::commit_landed));
            }
        }
    }

    /// Publishes RocksDB figures and input lags every 10 s.
    pub(crate) fn refresh_metrics<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) {
        if self.last_engine_metrics.elapsed() < Duration::from_secs(10) {
            return;
        }
        self.last_engine_metrics = Instant::now();
        for task in self.tasks.values() {
            for s in &task.stores {
                s.record_engine_metrics();
            }
            if task.state != TaskState::Running {
                continue;
            }
            for topic in &task.topics {
                // The next record to process: after the last one processed, else the committed offset.
                let next = task.offsets.get(topic).or_else(|| task.restart_from.get(topic));
                if let (Some(next), Some(high)) = (next, crate::restore::cached_high(consumer, topic, task.partition)) {
                    metrics::gauge!(crate::metrics::INPUT_LAG, "topic" => topic.clone(), "partition" => task.partition.to_string())
                        .set((high - next).max(0) as f64);
                }
            }
        }
    }

    /// Lets the writes in flight land (without committing offsets), so no
    /// store closes under the background writer.
    fn wait_inflight(&mut self) {
        match self.join_inflight() {
            Some((_, Err(e))) => tracing::warn!(error = %e, "a pipelined commit failed; its writes stay uncommitted"),
            Some((_, Ok(failed))) if !failed.is_empty() => {
                tracing::warn!(tasks = ?failed.keys().collect::<Vec<_>>(), "a pipelined commit failed for some tasks; their writes stay uncommitted")
            }
            _ => {}
        }
    }

    /// Drops every task's uncommitted writes (after a failure).
    pub(crate) fn discard_all(&mut self) {
        self.wait_inflight();
        self.abort_open_transaction();
        for s in self.tasks.values_mut().flat_map(|t| &mut t.stores) {
            s.discard_uncommitted();
        }
    }

    /// Closes every task (after a final commit, or a failure).
    pub(crate) fn close_all(&mut self) {
        self.wait_inflight();
        let restoring: Vec<i32> =
            self.tasks.values().filter(|t| t.state == TaskState::Restoring).map(|t| t.partition).collect();
        for p in restoring {
            drop(self.restorer.cancel(p));
        }
        for (p, state) in std::mem::take(&mut self.standbys) {
            if state == Standby::Following {
                drop(self.restorer.cancel(p));
            }
        }
        for s in self.tasks.values().flat_map(|t| &t.stores) {
            s.metrics.clear_sizes();
        }
        self.tasks.clear();
        // Every store is closed when `run` returns.
        for handle in self.closing.drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for TaskManager {
    fn drop(&mut self) {
        // Also when `run` unwinds (a panicking processor): no write is left
        // in flight and no store closing behind it.
        self.close_all();
    }
}

/// A commit's offsets as the committer takes them, in the list's order.
fn offsets_of(tpl: &TopicPartitionList) -> Vec<(String, i32, i64)> {
    tpl.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.topic().to_string(), e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Resumes paused partitions and has librdkafka fetch them now rather
/// than up to 1 s later (see [`crate::fetch_wake`]).
fn resume_now<C: ConsumerContext>(consumer: &BaseConsumer<C>, tpl: &TopicPartitionList, waker: Option<&FetchWaker>) -> Result<()> {
    consumer.resume(tpl)?;
    if let Some(waker) = waker {
        waker.wake(tpl);
    }
    Ok(())
}

/// Sends sealed commits to their changelogs, waits for every
/// acknowledgement, then writes them to RocksDB spread over the machine's
/// cores (each store is its own RocksDB instance). A store whose part
/// fails (its send, a foreign record in its changelog, its RocksDB write)
/// fails its task only; the others land. The producer's flush waits
/// `timeout`, and while records are still queued (brokers unavailable) up
/// to `patience` in all, before the whole commit fails.
fn write_sealed(
    sealed: Vec<SealedCommit>,
    producer: &ChangelogProducer,
    outputs: Option<Arc<DeliveryTracker>>,
    timeout: Duration,
    patience: Duration,
) -> Result<FailedTasks> {
    let mut items: Vec<(SealedCommit, Option<Error>)> = sealed.into_iter().map(|s| (s, None)).collect();
    for (s, failure) in &mut items {
        if let Err(e) = s.send_and_build() {
            *failure = Some(e);
        }
    }
    // An output the brokers refused ends `run` before anything of this
    // commit lands: its input offsets stay uncommitted.
    await_acknowledgements(producer, items.iter().map(|(s, _)| s.tracker()), outputs.as_deref(), timeout, patience)?;
    if let Some(outputs) = &outputs {
        producer.release(outputs);
    }
    on_cores(&mut items, |(s, failure)| {
        if failure.is_none() {
            *failure = s.write().err();
        }
    });
    let mut failed = FailedTasks::new();
    for (s, failure) in items {
        match failure {
            // The producer gave up on a record (its message.timeout.ms passed,
            // the topic refuses it): not one task's fault, and reopening the
            // task would not help.
            Some(e @ Error::ChangelogDelivery { .. }) => return Err(e),
            Some(e) => {
                failed.entry(s.partition()).or_insert(e);
            }
            None => {}
        }
    }
    Ok(failed)
}

/// Why an exactly-once commit failed: the transaction is aborted, and
/// `run` ends if `ends_run` (a record the brokers refuse, acknowledgements
/// that never came); `fatal` if the producer is unusable (fenced).
struct TxnFailure {
    error: Box<Error>,
    fatal: bool,
    ends_run: bool,
}

impl From<Error> for TxnFailure {
    fn from(error: Error) -> Self {
        // A transaction that could not even begin: replace the producer.
        let fatal = matches!(error, Error::Transaction { .. });
        let ends_run = match &error {
            // Timed out while frozen or while the brokers were away, or the
            // producer fenced: only this transaction is lost.
            Error::ChangelogDelivery { source, .. } | Error::OutputDelivery { source, .. } => {
                !crate::kafka::dooms_transaction_only(source)
            }
            Error::CommitTimeout(_) | Error::RecordTooLarge { .. } => true,
            _ => false,
        };
        TxnFailure { error: Box::new(error), fatal, ends_run }
    }
}

/// The exactly-once counterpart of [`write_sealed`], first half: sends the
/// sealed writes inside the open transaction and waits for every
/// acknowledgement (changelogs and outputs).
fn send_transaction(
    sealed: Vec<SealedCommit>,
    producer: &ChangelogProducer,
    outputs: Option<Arc<DeliveryTracker>>,
    timeout: Duration,
    patience: Duration,
) -> std::result::Result<Vec<SealedCommit>, TxnFailure> {
    let sent = send_transaction_records(sealed, producer, outputs.as_ref(), timeout, patience);
    if let Some(outputs) = &outputs {
        producer.release(outputs);
    }
    sent
}

fn send_transaction_records(
    sealed: Vec<SealedCommit>,
    producer: &ChangelogProducer,
    outputs: Option<&Arc<DeliveryTracker>>,
    timeout: Duration,
    patience: Duration,
) -> std::result::Result<Vec<SealedCommit>, TxnFailure> {
    let mut items = sealed;
    for s in &mut items {
        s.send_and_build()?;
    }
    await_acknowledgements(producer, items.iter().map(SealedCommit::tracker), outputs.map(|o| &**o), timeout, patience)?;
    for s in &items {
        s.tracker().settle()?;
    }
    if producer.transaction_broken() {
        let id = producer.transactional_id().to_string();
        let detail = "an output was refused with the transaction in a failed state".to_string();
        let error = Box::new(Error::Transaction { transactional_id: id, operation: "send", detail });
        return Err(TxnFailure { error, fatal: false, ends_run: false });
    }
    Ok(items)
}

/// How [`finish_transaction`] ended.
enum Finished {
    Committed,
    /// The group is moving to a new generation: nothing was sent; park.
    NotSettled,
}

/// Second half: sends the input offsets (`group`, `generation`, `offsets`)
/// under the commit gate, unless the generation is not settled and the
/// commit `may_park`; then commits the transaction (retrying only the
/// commit: librdkafka resumes it; sending the offsets again would conflict
/// with it). [`land_stores`] then writes RocksDB.
fn finish_transaction(
    producer: &ChangelogProducer,
    (group, generation, offsets): (&str, &Generation, &[(String, i32, i64)]),
    (session, may_park): (Option<&SessionClock>, bool),
    timeout: Duration,
    patience: Duration,
) -> std::result::Result<Finished, TxnFailure> {
    let failed = |e: crate::kafka::TxnError| {
        let fatal = e.fatal;
        TxnFailure { error: Box::new(e.into_error(producer.transactional_id())), fatal, ends_run: false }
    };
    {
        // Held only while the offsets go out: the membership cannot start a
        // JoinGroup (which ends this generation) meanwhile.
        let _gate = session.map(SessionClock::commit_gate);
        if may_park && session.is_some_and(|s| !s.generation_settled()) {
            return Ok(Finished::NotSettled);
        }
        retry_resumable("sending the offsets to the transaction", timeout, || producer.send_offsets(group, generation, offsets, timeout))
            .map_err(failed)?;
    }
    retry_resumable("committing the transaction", patience, || producer.commit_transaction(timeout)).map_err(failed)?;
    Ok(Finished::Committed)
}

/// After the transaction committed: writes each store's data and
/// checkpoint to RocksDB, spread over the cores. A store whose write fails
/// fails its task only (it restores the committed records).
fn land_stores(items: Vec<SealedCommit>) -> FailedTasks {
    let mut items: Vec<(SealedCommit, Option<Error>)> = items.into_iter().map(|s| (s, None)).collect();
    on_cores(&mut items, |(s, failure)| *failure = s.write().err());
    items.into_iter().filter_map(|(s, e)| Some((s.partition(), e?))).collect()
}

/// Flushes the producer and waits until every record of `stores`' trackers
/// and of the `outputs` tracker was acknowledged or failed; an output the
/// brokers refused is [`Error::OutputDelivery`]. The flush waits `timeout`,
/// and while records are still queued (brokers away) up to `patience`.
fn await_acknowledgements<'t>(
    producer: &ChangelogProducer,
    stores: impl Iterator<Item = &'t DeliveryTracker>,
    outputs: Option<&'t DeliveryTracker>,
    timeout: Duration,
    patience: Duration,
) -> Result<()> {
    producer.flush_patiently(timeout, patience)?;
    let ours: Vec<&DeliveryTracker> = stores.chain(outputs).collect();
    producer.settle_trackers(&ours, timeout, patience)?;
    outputs.map_or(Ok(()), DeliveryTracker::settle_outputs)
}

/// Calls `f` until it succeeds or fails in a way that is not
/// [`TxnError::resumable`], for at most `bound`.
fn retry_resumable(what: &str, bound: Duration, mut f: impl FnMut() -> std::result::Result<(), crate::kafka::TxnError>) -> std::result::Result<(), crate::kafka::TxnError> {
    let started = Instant::now();
    loop {
        match f() {
            Err(e) if e.resumable() && started.elapsed() < bound => {
                tracing::warn!(error = %e, "{what} failed; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            done => return done,
        }
    }
}

/// Runs `f` on every item, spread over the machine's cores.
fn on_cores<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len());
    if workers <= 1 {
        return items.iter_mut().for_each(f);
    }
    let mut parts = items.chunks_mut(items.len().div_ceil(workers));
    let mine = parts.next().unwrap_or_default();
    let f = &f;
    std::thread::scope(|scope| {
        for part in parts {
            scope.spawn(move || part.iter_mut().for_each(f));
        }
        mine.iter_mut().for_each(f);
    });
}
