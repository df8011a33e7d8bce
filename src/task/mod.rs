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
//!
//! One room per job, each an `impl TaskManager` block beside the state it owns:
//!
//! | file | what happens there |
//! |---|---|
//! | `manager.rs` | construction, assignment events, revocation, what the subscription reports, back-pressure, metrics, `close_all` |
//! | `opening.rs` | opening a task's stores off the processing thread, handing them to the restore thread, running restored tasks |
//! | `standby.rs` | standby tasks: opened, followed, dropped; promotion happens in `opening.rs` |
//! | `closing.rs` | closing stores without commit, on a thread of their own |
//! | `reinit.rs` | re-initialising a failed task, with a limit on failures in a row |
//! | `commit.rs` | the at-least-once commit: seal, send and await acknowledgements, write RocksDB (the commit in flight) |
//! | `offsets.rs` | committing input offsets under the group generation |
//! | `transaction.rs` | the exactly-once commit (one Kafka transaction), aborts, producer fencing, parked commits |
//! | `cleanup.rs` | deleting state directories of tasks no longer held here |
//! | `expiry.rs` | the TTL sweep: expired entries deleted, their tombstones sent with the next commit |
//! | `merge.rs` | several input topics: a task's records held per topic, and which goes next |

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use rdkafka::TopicPartitionList;

use crate::config::AppConfig;
use crate::error::Result;
use crate::group::Brokers;
use crate::group::Committer;
use crate::group::{Generation, SessionClock};
use crate::kafka::ChangelogProducer;
use crate::kafka::OutputSink;
use crate::kafka::fetch_wake::FetchWaker;
use crate::restore::Restorer;
use crate::store::KeyValueStore;
use crate::store::engine::EngineResources;
use crate::timers::TaskTime;

use cleanup::StateCleanup;
use closing::Closer;
use commit::CommitPipeline;
use offsets::OffsetCommits;
use opening::Openers;
use reinit::TaskFailures;
use standby::Standbys;
use topic_map::TopicMap;
use transaction::ExactlyOnce;

mod cleanup;
mod closing;
mod commit;
mod expiry;
mod manager;
pub(crate) mod merge;
mod offsets;
mod opening;
mod reinit;
mod standby;
mod topic_map;
mod transaction;

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
    pub(crate) offsets: TopicMap<i64>,
    /// First offset of records that arrived before the task ran and were
    /// dropped; the consumer seeks back here when the task starts running.
    pub(crate) rewind: HashMap<String, i64>,
    /// Per input topic, the offset after the last record processed by this
    /// incarnation (never drained): a record below it was delivered again
    /// (architecture.md §15) and is skipped.
    pub(crate) processed_to: TopicMap<i64>,
    /// Whether such a record was logged already.
    pub(crate) redelivery_logged: bool,
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
    /// The task's tracing span (application, partition): the lines of its
    /// opening, restore, processing and closing are logged in it.
    pub(crate) span: tracing::Span,
    /// Stream time, timers and punctuations (stream time and timers are
    /// read from the time store when the task starts running).
    pub(crate) time: TaskTime,
    /// Several input topics: records fetched and held for their turn
    /// (`merge.rs`); dropped with the task, read again if it starts over.
    pub(crate) held: Option<merge::TaskQueues>,
}

/// The tracing span of active task `partition` of `application_id`.
pub(crate) fn task_span(application_id: &str, partition: i32) -> tracing::Span {
    tracing::info_span!("task", app = %application_id, partition)
}

/// The tracing span of standby task `partition` of `application_id`.
pub(crate) fn standby_span(application_id: &str, partition: i32) -> tracing::Span {
    tracing::info_span!("standby", app = %application_id, partition)
}

impl Task {
    fn new(
        partition: i32,
        topics: BTreeSet<String>,
        rewind: HashMap<String, i64>,
        incarnation: u64,
        open_at: Instant,
        span: tracing::Span,
    ) -> Task {
        Task {
            partition,
            state: TaskState::Opening,
            topics,
            stores: Vec::new(),
            offsets: TopicMap::default(),
            processed_to: TopicMap::default(),
            redelivery_logged: false,
            restart_from: rewind.clone(),
            rewind,
            incarnation,
            processed: metrics::counter!(crate::metrics::RECORDS_PROCESSED, "partition" => partition.to_string()),
            open_at: Some(open_at),
            span,
            time: TaskTime::new(partition),
            held: None,
        }
    }

    /// Tells this incarnation of the task apart from earlier ones (a
    /// re-initialised task is a new incarnation).
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn input(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for topic in &self.topics {
            tpl.add_partition(topic, self.partition);
        }
        tpl
    }
}

/// Owns every task of this member: the active tasks and the rooms that
/// each do one job for them (opening, closing, standbys, commits, offset
/// commits, the exactly-once transaction, cleanup). Its methods are spread
/// over those rooms' files.
pub(crate) struct TaskManager {
    /// Active tasks by partition.
    pub(crate) tasks: BTreeMap<i32, Task>,
    /// Input partitions assigned and not yet taken in by `open_pending`.
    pending: Vec<(String, i32)>,
    config: Arc<AppConfig>,
    /// kstate's producer for changelogs and outputs (replaced when fenced).
    producer: Arc<ChangelogProducer>,
    /// Output records (the processor's `send`): kstate's producer and their deliveries.
    pub(crate) outputs: OutputSink,
    resources: EngineResources,
    restorer: Restorer,
    /// Stores being opened off the processing thread.
    openers: Openers,
    /// Stores being closed off the processing thread.
    closer: Closer,
    standbys: Standbys,
    /// Failures in a row per task, for the re-initialisation limit.
    failures: HashMap<i32, TaskFailures>,
    /// The commit whose writes are in flight.
    commit: CommitPipeline,
    /// Input offset commits: the one awaiting its result, failures in a row.
    offset_commits: OffsetCommits,
    /// Told every committed offset: purges the repartition topics below them.
    purger: crate::kafka::Purger,
    /// Exactly-once: fencing count and the commit parked over a rebalance.
    eos: ExactlyOnce,
    cleanup: StateCleanup,
    /// When the TTL sweep last took a step.
    last_sweep: Instant,
    /// When memtables were last flushed to stay within `max_state_memory`.
    last_relief: Instant,
    last_engine_metrics: Instant,
    /// Wakes the fetcher of resumed partitions (installed by the runtime
    /// while its fetch-wake thread runs).
    fetch_waker: Option<FetchWaker>,
    /// The generation of the current assignment: offsets are committed
    /// under it, so a member the group has fenced cannot commit.
    generation: Option<Arc<Generation>>,
    /// Whether the coordinator still counts this member in: past a session
    /// without confirmation nothing is written. Attached once the
    /// membership runs (it starts after the task manager, which it reads).
    session: Option<SessionClock>,
}

/// What a [`TaskManager`] is made of, built by the runtime.
pub(crate) struct TaskManagerParts {
    pub(crate) config: Arc<AppConfig>,
    /// kstate's producer for changelogs and outputs.
    pub(crate) producer: Arc<ChangelogProducer>,
    /// Exactly-once: makes a new transactional producer (same
    /// `transactional.id`) after the current one was fenced.
    pub(crate) new_producer: Box<dyn Fn() -> Result<ChangelogProducer> + Send>,
    pub(crate) resources: EngineResources,
    /// The largest record the changelogs accept.
    pub(crate) max_record_bytes: usize,
    /// Each changelog topic as validated at startup (its retention settings).
    pub(crate) changelogs: HashMap<String, crate::kafka::ChangelogInfo>,
    pub(crate) restorer: Restorer,
    /// Commits input offsets under the group generation.
    pub(crate) committer: Committer,
    /// kstate's own broker connections: exactly-once waits for stable
    /// committed offsets through them.
    pub(crate) brokers: Brokers,
    /// Seeds stores with no local state from snapshots, if configured.
    pub(crate) snapshots: Option<Arc<crate::snapshot::Snapshots>>,
    /// Deletes repartition records below the committed offsets.
    pub(crate) purger: crate::kafka::Purger,
}
