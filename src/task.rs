//! Tasks: the unit of ownership. Task `p` owns input partition `p` of every
//! input topic and partition `p` of every store.
//!
//! The [`TaskManager`] turns assignment events into task lifecycles:
//! assigned → stores opened → restoring (input paused) → running (input
//! resumed) → revoked (committed and closed) or lost (closed without commit).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::assignment::AssignmentEvent;
use crate::changelog::ChangelogProducer;
use crate::config::AppConfig;
use crate::engine::EngineResources;
use crate::fetch_wake::FetchWaker;
use crate::error::Result;
use crate::restore::{RestoreJob, RestoreOutcome, Restorer};
use crate::store::{KeyValueStore, SealedCommit, StoreOpenArgs};

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
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
}

/// Owns every task of this member.
pub(crate) struct TaskManager {
    pub(crate) tasks: BTreeMap<i32, Task>,
    config: Arc<AppConfig>,
    producer: Arc<ChangelogProducer>,
    resources: EngineResources,
    max_record_bytes: usize,
    /// Each changelog's `delete.retention.ms`.
    tombstone_retention: HashMap<String, Duration>,
    restorer: Restorer,
    pending: Vec<(String, i32)>,
    last_engine_metrics: Instant,
    inflight: Option<InFlightCommit>,
    /// Landed writes no store reads any more, freed by the next commit's
    /// writer thread rather than the processing thread.
    retired: Vec<Arc<crate::overlay::Overlay>>,
    /// Wakes the fetcher of resumed partitions (set by the runtime).
    pub(crate) fetch_waker: Option<FetchWaker>,
}

/// One commit after its seal (see `seal_running`), apart from the sealed
/// writes themselves.
struct CommitInfo {
    started: Instant,
    offsets: TopicPartitionList,
    /// Tasks whose stores hold sealed writes.
    partitions: Vec<i32>,
}

/// A pipelined commit whose changelog sends and RocksDB writes run on a
/// background thread while processing goes on. DESIGN.md §1's order holds
/// there: its changelog records are acknowledged before RocksDB is written,
/// and its input offsets are committed only after every store's write has
/// landed.
struct InFlightCommit {
    writer: std::thread::JoinHandle<Result<()>>,
    info: CommitInfo,
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
        TaskManager {
            tasks: BTreeMap::new(),
            config,
            producer,
            resources,
            max_record_bytes,
            tombstone_retention,
            restorer,
            pending: Vec::new(),
            last_engine_metrics: Instant::now(),
            inflight: None,
            retired: Vec::new(),
            fetch_waker: None,
        }
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
        let mut closing = Vec::new();
        for (topic, p) in &tps {
            if let Some(task) = self.tasks.get_mut(p) {
                task.topics.remove(topic);
                task.rewind.remove(topic); // a later re-assignment starts from the committed offset
                if task.topics.is_empty() {
                    closing.push(*p);
                }
            }
        }
        if closing.is_empty() {
            return Ok(());
        }
        // Close the tasks even if their commit fails: the partitions are
        // leaving this member either way, and nothing may commit them later.
        // A lost assignment may not commit offsets, but the RocksDB writes
        // in flight must land before their stores close.
        let committed = if lost { self.land_inflight(consumer, None) } else { self.commit(consumer, Some(&closing)) };
        for p in closing {
            let Some(mut task) = self.tasks.remove(&p) else { continue };
            if task.state == TaskState::Restoring {
                // Partially restored stores are consistent at their checkpoint.
                drop(self.restorer.cancel(p));
            }
            for s in &mut task.stores {
                s.discard_uncommitted();
            }
            tracing::info!(partition = p, lost, "task closed");
        }
        committed
    }

    /// Opens the stores of newly assigned partitions and starts their restore.
    pub(crate) fn open_pending<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
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
            let mut stores = Vec::with_capacity(self.config.stores.len());
            for def in &self.config.stores {
                let changelog_topic = crate::changelog_topic(&self.config.application_id, def.name());
                stores.push(KeyValueStore::open(StoreOpenArgs {
                    name: def.name(),
                    partition: p,
                    dir: self.config.store_dir(def.name(), p),
                    tombstone_retention: self.tombstone_retention.get(&changelog_topic).copied(),
                    changelog_topic,
                    max_record_bytes: self.max_record_bytes,
                    producer: self.producer.clone(),
                    resources: &self.resources,
                    lock_timeout: self.config.lock_timeout,
                })?);
            }
            tracing::info!(partition = p, "task assigned; restoring its stores");
            self.restorer.submit(RestoreJob { partition: p, stores });
            self.tasks.insert(
                p,
                Task {
                    partition: p,
                    state: TaskState::Restoring,
                    topics: BTreeSet::from([topic]),
                    stores: Vec::new(),
                    offsets: HashMap::new(),
                    rewind: HashMap::new(),
                },
            );
        }
        for tpl in resume {
            resume_now(consumer, &tpl, self.fetch_waker.as_ref())?;
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
                    return Err(crate::error::Error::Restore {
                        topic: String::new(),
                        partition: -1,
                        detail: "the restore thread stopped unexpectedly".into(),
                    })
                }
            };
            let job = match outcome {
                RestoreOutcome::Done(job) => job,
                RestoreOutcome::Failed(job, e) => {
                    if !self.tasks.contains_key(&job.partition) {
                        tracing::warn!(partition = job.partition, error = %e, "restore of a revoked task failed; ignored");
                        continue;
                    }
                    tracing::error!(partition = job.partition, error = %e, "restore failed");
                    return Err(e);
                }
            };
            let Some(task) = self.tasks.get_mut(&job.partition) else {
                continue; // revoked meanwhile; dropping the stores closes them
            };
            task.stores = job.stores;
            task.state = TaskState::Running;
            let mut tpl = TopicPartitionList::new();
            for topic in &task.topics {
                if let Some(offset) = task.rewind.remove(topic) {
                    consumer.seek(topic, task.partition, Offset::Offset(offset), Duration::from_secs(10))?;
                }
                tpl.add_partition(topic, task.partition);
            }
            resume_now(consumer, &tpl, self.fetch_waker.as_ref())?;
            tracing::info!(partition = task.partition, "task running");
        }
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
    pub(crate) fn commit_pipelined<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        let (info, sealed) = self.seal_running(consumer, None)?;
        if sealed.is_empty() {
            if info.offsets.count() > 0 {
                consumer.commit(&info.offsets, CommitMode::Sync)?;
            }
            return Ok(());
        }
        let writer = std::thread::Builder::new()
            .name("kstate-commit".into())
            .spawn({
                let retired = std::mem::take(&mut self.retired);
                let (producer, timeout) = (self.producer.clone(), self.config.commit_timeout);
                move || {
                    let written = write_sealed(sealed, &producer, timeout);
                    drop(retired);
                    written
                }
            })
            .map_err(|e| crate::error::Error::io("kstate-commit thread", e))?;
        self.inflight = Some(InFlightCommit { writer, info });
        Ok(())
    }

    /// Completes the pipelined commit in flight if its writes have landed.
    pub(crate) fn poll_inflight<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        if self.inflight.as_ref().is_some_and(|c| c.writer.is_finished()) {
            // Sync: a failed offset commit is an error here, as in the
            // unpipelined commit, and no older commit can land after a newer one.
            self.land_inflight(consumer, Some(CommitMode::Sync))?;
        }
        Ok(())
    }

    /// Waits for the pipelined commit in flight, if any, to land; then
    /// commits its input offsets with `mode`. With `None` (a lost
    /// assignment) they go back to the tasks that remain, so the next
    /// commit takes them.
    fn land_inflight<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, mode: Option<CommitMode>) -> Result<()> {
        let Some((info, written)) = self.join_inflight() else { return Ok(()) };
        written?;
        self.finish_commit(consumer, info, mode, "pipelined commit landed")
    }

    /// Waits for the writer of the commit in flight, if any; if its writes
    /// landed, the stores stop reading them from memory.
    fn join_inflight(&mut self) -> Option<(CommitInfo, Result<()>)> {
        let InFlightCommit { writer, info } = self.inflight.take()?;
        let written = writer.join().unwrap_or_else(|_| {
            Err(crate::error::Error::Restore {
                topic: String::new(),
                partition: -1,
                detail: "the commit writer thread panicked".into(),
            })
        });
        if written.is_ok() {
            self.mark_landed(&info.partitions);
        }
        Some((info, written))
    }

    /// The last step of a commit whose writes landed: commits its input
    /// offsets with `mode` (`None`: hands them back to the tasks), records
    /// its latency.
    fn finish_commit<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        info: CommitInfo,
        mode: Option<CommitMode>,
        what: &str,
    ) -> Result<()> {
        let stored = info.started.elapsed().as_secs_f64();
        match mode {
            Some(mode) if info.offsets.count() > 0 => consumer.commit(&info.offsets, mode)?,
            Some(_) => {}
            None => {
                for e in info.offsets.elements() {
                    if let (Some(task), Offset::Offset(o)) = (self.tasks.get_mut(&e.partition()), e.offset()) {
                        // Offsets processed after the seal are newer: they win.
                        task.offsets.entry(e.topic().to_string()).or_insert(o);
                    }
                }
            }
        }
        let seconds = info.started.elapsed().as_secs_f64();
        metrics::histogram!(crate::metrics::COMMIT_SECONDS).record(seconds);
        tracing::debug!(seconds, stored, offsets = info.offsets.count(), "{what}");
        self.refresh_engine_metrics();
        Ok(())
    }

    /// The commit protocol (DESIGN.md §1) for `only` these partitions or all:
    /// send each store's writes to the changelog and wait for every
    /// acknowledgement, write each store's writes and checkpoint in one
    /// RocksDB batch, then commit the input offsets.
    pub(crate) fn commit<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, only: Option<&[i32]>) -> Result<()> {
        let (info, sealed) = self.seal_running(consumer, only)?;
        write_sealed(sealed, &self.producer, self.config.commit_timeout)?;
        self.mark_landed(&info.partitions);
        self.finish_commit(consumer, info, Some(CommitMode::Sync), "committed")
    }

    /// The first step of every commit, for `only` these partitions or all
    /// running tasks: lands the commit in flight, then seals each store's
    /// writes and takes the tasks' input offsets.
    fn seal_running<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        only: Option<&[i32]>,
    ) -> Result<(CommitInfo, Vec<SealedCommit>)> {
        self.land_inflight(consumer, Some(CommitMode::Sync))?;
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

    /// The sealed writes of these tasks' stores are in RocksDB.
    fn mark_landed(&mut self, partitions: &[i32]) {
        for p in partitions {
            if let Some(task) = self.tasks.get_mut(p) {
                self.retired.extend(task.stores.iter_mut().map(KeyValueStore::commit_landed));
            }
        }
    }

    /// Publishes RocksDB gauges every 10 s (called after commits).
    fn refresh_engine_metrics(&mut self) {
        if self.last_engine_metrics.elapsed() >= Duration::from_secs(10) {
            self.last_engine_metrics = Instant::now();
            for s in self.tasks.values().flat_map(|t| &t.stores) {
                s.record_engine_metrics();
            }
        }
    }

    /// Lets the writes in flight land (without committing offsets), so no
    /// store closes under the background writer.
    fn wait_inflight(&mut self) {
        if let Some((_, Err(e))) = self.join_inflight() {
            tracing::warn!(error = %e, "a pipelined commit failed; its writes stay uncommitted");
        }
    }

    /// Drops every task's uncommitted writes (after a failure).
    pub(crate) fn discard_all(&mut self) {
        self.wait_inflight();
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
        self.tasks.clear();
    }
}

impl Drop for TaskManager {
    fn drop(&mut self) {
        self.wait_inflight();
    }
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
/// cores (each store is its own RocksDB instance).
fn write_sealed(mut sealed: Vec<SealedCommit>, producer: &ChangelogProducer, timeout: Duration) -> Result<()> {
    for s in &mut sealed {
        s.send_and_build()?;
    }
    producer.flush(timeout)?;
    on_cores(&mut sealed, SealedCommit::write)
}

/// Runs `f` on every item, spread over the machine's cores.
fn on_cores<T: Send>(items: &mut [T], f: impl Fn(&mut T) -> Result<()> + Sync) -> Result<()> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len());
    if workers <= 1 {
        return items.iter_mut().try_for_each(f);
    }
    let mut parts = items.chunks_mut(items.len().div_ceil(workers));
    let mine = parts.next().unwrap_or_default();
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = parts.map(|part| scope.spawn(move || part.iter_mut().try_for_each(f))).collect();
        let first = mine.iter_mut().try_for_each(f);
        handles.into_iter().map(|h| h.join().expect("store commit thread panicked")).fold(first, Result::and)
    })
}
