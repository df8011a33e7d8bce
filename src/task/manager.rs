//! The task manager's core: construction, assignment events and revocation,
//! what the group's subscription reports, memory back-pressure, metrics,
//! and closing everything at the end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use crate::assignment::AssignmentEvent;
use crate::error::Result;
use crate::group::{Generation, SessionClock};
use crate::kafka::OutputSink;
use crate::kafka::fetch_wake::FetchWaker;
use crate::restore::RestoreJob;
use crate::store::KeyValueStore;

use super::cleanup::StateCleanup;
use super::closing::Closer;
use super::commit::{CommitPipeline, Offsets};
use super::offsets::OffsetCommits;
use super::opening::Openers;
use super::standby::{Standby, Standbys};
use super::transaction::ExactlyOnce;
use super::{TaskManager, TaskManagerParts, TaskState};

/// Resumes paused partitions and has librdkafka fetch them now rather
/// than up to 1 s later (see [`crate::fetch_wake`]).
pub(super) fn resume_now<C: ConsumerContext>(consumer: &BaseConsumer<C>, tpl: &TopicPartitionList, waker: Option<&FetchWaker>) -> Result<()> {
    consumer.resume(tpl)?;
    if let Some(waker) = waker {
        waker.wake(tpl);
    }
    Ok(())
}

impl Drop for TaskManager {
    fn drop(&mut self) {
        // Also when `run` unwinds (a panicking processor): no write is left
        // in flight and no store closing behind it.
        self.close_all();
    }
}

impl TaskManager {
    /// Before a polled batch is processed: each running task's remote
    /// key-value stores read the batch's keys of its partition ahead,
    /// concurrently (architecture.md §22). Nothing without remote stores.
    pub(crate) fn prefetch<'k>(&mut self, records: impl Iterator<Item = (i32, &'k [u8])>) {
        if !self.config.remote_stores() {
            return;
        }
        let mut by_partition: std::collections::BTreeMap<i32, Vec<&[u8]>> = std::collections::BTreeMap::new();
        for (partition, key) in records {
            by_partition.entry(partition).or_default().push(key);
        }
        for (partition, keys) in by_partition {
            let Some(task) = self.tasks.get_mut(&partition).filter(|t| t.state == super::TaskState::Running) else { continue };
            for store in &mut task.stores {
                store.prefetch(keys.iter().copied());
            }
        }
    }

    pub(crate) fn new(parts: TaskManagerParts) -> Self {
        let TaskManagerParts {
            config,
            producer,
            new_producer,
            resources,
            max_record_bytes,
            changelogs,
            restorer,
            committer,
            brokers,
            snapshots,
            purger,
        } = parts;
        TaskManager {
            tasks: BTreeMap::new(),
            pending: Vec::new(),
            config,
            outputs: OutputSink::new(producer.clone()),
            producer,
            resources,
            restorer,
            openers: Openers::new(max_record_bytes, changelogs, brokers, snapshots),
            closer: Closer::default(),
            standbys: Standbys::default(),
            failures: HashMap::new(),
            commit: CommitPipeline::default(),
            offset_commits: OffsetCommits::new(committer),
            purger,
            eos: ExactlyOnce::new(new_producer),
            cleanup: StateCleanup::new(),
            last_relief: Instant::now(),
            last_sweep: Instant::now(),
            last_engine_metrics: Instant::now(),
            fetch_waker: None,
            generation: None,
            session: None,
        }
    }

    /// The application this task manager serves (for log spans).
    pub(crate) fn application_id(&self) -> &str {
        &self.config.application_id
    }

    /// Installs (or, with `None`, removes) the waker of the fetcher of
    /// resumed partitions, while the runtime's fetch-wake thread runs.
    pub(crate) fn set_fetch_waker(&mut self, waker: Option<FetchWaker>) {
        self.fetch_waker = waker;
    }

    /// The generation of the assignment being applied (`None`: this
    /// member lost its tasks): offsets are committed under it.
    pub(crate) fn set_generation(&mut self, generation: Option<Arc<Generation>>) {
        self.generation = generation;
    }

    /// Attaches the membership's session clock: past a session timeout
    /// without the coordinator's confirmation nothing is written.
    pub(crate) fn attach_session(&mut self, session: SessionClock) {
        self.session = Some(session);
    }

    /// Whether commits are transactions (exactly-once).
    pub(super) fn exactly_once(&self) -> bool {
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

    pub(super) fn revoke<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, tps: Vec<(String, i32)>, lost: bool) -> Result<()> {
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
        // standby keeps its stores open and follows its changelogs (not
        // remote ones: a writer closes, flushed, and the standby opens
        // readers, which the next owner's writer does not fence).
        let mut stores = Vec::new();
        for p in closing {
            let Some(task) = self.tasks.remove(&p) else { continue };
            let closed = self.close_task(task, lost);
            let writers = closed.iter().any(|s| s.engine().is_remote());
            if !lost && !writers && self.standbys.target.contains(&p) && !self.standbys.tasks.contains_key(&p) && !closed.is_empty() {
                let span = self.standby_span(p);
                span.in_scope(|| tracing::info!(partition = p, "active task demoted to standby; its stores stay open"));
                self.restorer.submit(RestoreJob { partition: p, stores: closed, standby: true, span });
                self.standbys.tasks.insert(p, Standby::Following);
            } else {
                stores.extend(closed);
            }
        }
        self.closer.close(stores);
        committed
    }

    /// These input partitions are no longer this member's: their tasks
    /// forget them (a later re-assignment starts from the committed offset).
    pub(super) fn forget_topics(&mut self, tps: &[(String, i32)]) {
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

    pub(super) fn incarnation(&mut self) -> u64 {
        self.openers.next_incarnation += 1;
        self.openers.next_incarnation
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

    /// Whether to stop taking records for now: the uncommitted writes
    /// reached `max_uncommitted_bytes` while a commit is still being
    /// written, so a new one cannot start.
    pub(crate) fn backpressure(&mut self) -> bool {
        if self.eos.parked.is_some() {
            return true;
        }
        let excess = self.resources.memtable_excess();
        if excess > 0 {
            self.relieve_memtables(excess);
            return true;
        }
        let no_commit_now = self.commit_in_flight()
            || !self.session_alive()
            || (self.exactly_once() && self.session.as_ref().is_some_and(|s| !s.generation_settled()));
        // Exactly-once: outputs held for the next transaction count too.
        no_commit_now && self.uncommitted_bytes() + self.outputs.held().unwrap_or(0) >= self.config.max_uncommitted_bytes
    }

    /// Over `max_state_memory`'s memtable share: schedules flushes of the
    /// stores with the largest active memtables, enough to free `excess`
    /// bytes (RocksDB flushes only the database being written to, which
    /// neither keeps up with hundreds of stores nor ever reaches an idle
    /// one). At most every 50 ms; the loop takes no records meanwhile.
    pub(super) fn relieve_memtables(&mut self, excess: usize) {
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
    pub(super) fn session_alive(&self) -> bool {
        self.session.as_ref().is_none_or(SessionClock::alive)
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
        for (p, state) in std::mem::take(&mut self.standbys.tasks) {
            if state == Standby::Following {
                drop(self.restorer.cancel(p));
            }
        }
        for s in self.tasks.values().flat_map(|t| &t.stores) {
            s.metrics.clear_sizes();
        }
        self.tasks.clear();
        // Every store is closed when `run` returns.
        self.closer.join_all();
    }
}
