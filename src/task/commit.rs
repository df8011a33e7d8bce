//! The at-least-once commit: seal each store's writes, send them to the
//! changelogs and wait for every acknowledgement, write RocksDB, then commit
//! the input offsets (docs/architecture.md §1). The commit in flight lives in
//! [`InFlightCommit`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::kafka::{ChangelogProducer, DeliveryTracker};
use crate::store::published::{Landing, LandingGate};
use crate::store::{KeyValueStore, SealedCommit};

use super::{TaskManager, TaskState};

/// One commit after its seal (see `seal_running`), apart from the sealed
/// writes themselves.
pub(super) struct CommitInfo {
    pub(super) started: Instant,
    pub(super) offsets: TopicPartitionList,
    /// Tasks whose stores hold sealed writes.
    pub(super) partitions: Vec<i32>,
}

/// Tasks whose part of a commit failed (a diverged changelog, a RocksDB
/// error), with the first error of each: they are re-initialised, the
/// others' writes landed.
pub(super) type FailedTasks = BTreeMap<i32, Error>;

/// What happens to a landed commit's input offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Offsets {
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
/// background thread while processing goes on. docs/architecture.md §1's order holds
/// there: its changelog records are acknowledged before RocksDB is written,
/// and its input offsets are committed only after every store's write has
/// landed.
pub(super) struct InFlightCommit {
    /// What landed, and the landing to end once its offsets are published.
    pub(super) writer: std::thread::JoinHandle<(Result<FailedTasks>, Option<Landing>)>,
    pub(super) info: CommitInfo,
}

/// Sends sealed commits to their changelogs, waits for every
/// acknowledgement, then writes them to RocksDB spread over the machine's
/// cores (each store is its own RocksDB instance). A store whose part
/// fails (its send, a foreign record in its changelog, its RocksDB write)
/// fails its task only; the others land. The producer's flush waits
/// `timeout`, and while records are still queued (brokers unavailable) up
/// to `patience` in all, before the whole commit fails. The RocksDB writes
/// begin a [`Landing`] at `gate`, returned to be ended once the input
/// offsets are published.
pub(super) fn write_sealed(
    sealed: Vec<SealedCommit>,
    producer: &ChangelogProducer,
    outputs: Option<Arc<DeliveryTracker>>,
    (timeout, patience): (Duration, Duration),
    gate: &Arc<LandingGate>,
) -> (Result<FailedTasks>, Option<Landing>) {
    let mut landing = None;
    let written = send_and_write(sealed, producer, outputs, (timeout, patience), || landing = Some(gate.begin()));
    (written, landing)
}

fn send_and_write(
    sealed: Vec<SealedCommit>,
    producer: &ChangelogProducer,
    outputs: Option<Arc<DeliveryTracker>>,
    (timeout, patience): (Duration, Duration),
    begin_landing: impl FnOnce(),
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
    begin_landing();
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

/// After the transaction committed: writes each store's data and
/// checkpoint to RocksDB, spread over the cores. A store whose write fails
/// fails its task only (it restores the committed records).
pub(super) fn land_stores(items: Vec<SealedCommit>, landing: Landing) -> (FailedTasks, Landing) {
    let mut items: Vec<(SealedCommit, Option<Error>)> = items.into_iter().map(|s| (s, None)).collect();
    on_cores(&mut items, |(s, failure)| *failure = s.write().err());
    (items.into_iter().filter_map(|(s, e)| Some((s.partition(), e?))).collect(), landing)
}

/// Flushes the producer and waits until every record of `stores`' trackers
/// and of the `outputs` tracker was acknowledged or failed; an output the
/// brokers refused is [`Error::OutputDelivery`]. The flush waits `timeout`,
/// and while records are still queued (brokers away) up to `patience`.
pub(super) fn await_acknowledgements<'t>(
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

/// Runs `f` on every item, spread over the machine's cores.
pub(super) fn on_cores<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
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

/// The commit in flight, if any, and what its writer frees.
#[derive(Default)]
pub(super) struct CommitPipeline {
    pub(super) inflight: Option<InFlightCommit>,
    /// Exactly-once: the transaction committing in flight, if any.
    pub(super) transaction: Option<super::transaction::InFlightTransaction>,
    /// The landing of the last commit written, until its input offsets
    /// are published.
    pub(super) landing: Option<Landing>,
    /// Landed writes no store reads any more, freed by the next commit's
    /// writer thread rather than the processing thread.
    pub(super) retired: Vec<Arc<crate::store::overlay::Overlay>>,
}

impl TaskManager {
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
    /// Exactly-once: the commit is one transaction, committing in flight
    /// the same way (see [`TaskManager::commit_transaction`]).
    pub(crate) fn commit_pipelined<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<bool> {
        if self.commit_in_flight() || !self.session_alive() {
            return Ok(false);
        }
        if self.exactly_once() {
            self.settle_transaction(consumer)?;
            if self.eos.parked.is_some() || self.session.as_ref().is_some_and(|s| !s.generation_settled()) {
                return Ok(false); // once the group's new assignment is applied
            }
            self.commit_transaction(consumer, false)?;
            return Ok(true);
        }
        let (info, sealed) = self.seal_running(consumer, None)?;
        // Output records are waited for like changelog records.
        let outputs = self.outputs.rotate();
        if sealed.is_empty() && outputs.is_none() {
            // Nothing to write: the state reflects these offsets already
            // (the previous commit landed when this one was sealed).
            self.publish_input(&info.offsets, &FailedTasks::default());
            self.commit_offsets(info.offsets, Offsets::Commit)?;
            return Ok(true);
        }
        let writer = std::thread::Builder::new()
            .name("kstate-commit".into())
            .spawn({
                let retired = std::mem::take(&mut self.commit.retired);
                let producer = self.producer.clone();
                let times = (self.config.commit_timeout, self.config.task_timeout);
                let gate = self.config.published.landing.clone();
                move || {
                    let written = write_sealed(sealed, &producer, outputs, times, &gate);
                    drop(retired);
                    written
                }
            })
            .map_err(|e| Error::io("kstate-commit thread", e))?;
        self.commit.inflight = Some(InFlightCommit { writer, info });
        Ok(true)
    }

    /// The commit protocol (docs/architecture.md §1) for tasks that are closing (`only`
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
            if self.settle_transaction(consumer)? {
                return Ok(()); // it failed: aborted, every running task re-initialised
            }
            if self.transaction_open() {
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
        let (written, landing) =
            write_sealed(sealed, &self.producer, outputs, (self.config.commit_timeout, self.config.task_timeout), &self.config.published.landing);
        self.commit.landing = landing;
        let failed = written?;
        self.mark_landed(&info.partitions, &failed);
        self.finish_commit(consumer, info, failed, Offsets::CommitClosing, "committed")
    }

    /// The first step of every commit, for `only` these partitions or all
    /// running tasks: lands the commit in flight, then seals each store's
    /// writes and takes the tasks' input offsets.
    pub(super) fn seal_running<C: ConsumerContext>(
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
            let time_store = self.config.time_store_index().map(|i| &mut task.stores[i]);
            task.time.persist(time_store)?;
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
    pub(super) fn mark_landed(&mut self, partitions: &[i32], failed: &FailedTasks) {
        for p in partitions.iter().filter(|p| !failed.contains_key(p)) {
            if let Some(task) = self.tasks.get_mut(p) {
                self.commit.retired.extend(task.stores.iter_mut().map(KeyValueStore::commit_landed));
            }
        }
    }

    /// Tells queries that these input offsets (the next to process, per
    /// task) are reflected in the stores of the tasks that landed.
    pub(super) fn publish_input(&self, offsets: &TopicPartitionList, failed: &FailedTasks) {
        for e in offsets.elements() {
            let (rdkafka::Offset::Offset(next), false) = (e.offset(), failed.contains_key(&e.partition())) else { continue };
            for store in self.tasks.get(&e.partition()).map(|t| t.stores.as_slice()).unwrap_or_default() {
                if let Some(slot) = store.slot() {
                    slot.input_landed(e.topic(), next);
                }
            }
        }
    }

    /// Whether a commit (or exactly-once, a transaction) is still being
    /// written on its thread.
    pub(super) fn commit_in_flight(&self) -> bool {
        self.commit.inflight.as_ref().is_some_and(|c| !c.writer.is_finished())
            || self.commit.transaction.as_ref().is_some_and(|t| !t.committer.is_finished())
    }

    /// Completes the pipelined commit (or transaction) in flight if it has
    /// landed.
    pub(crate) fn poll_inflight<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        if self.commit.inflight.as_ref().is_some_and(|c| c.writer.is_finished()) {
            self.land_inflight(consumer, Offsets::Commit)?;
        }
        if self.commit.transaction.as_ref().is_some_and(|t| t.committer.is_finished()) {
            self.settle_transaction(consumer)?;
        }
        Ok(())
    }

    /// Waits for the pipelined commit in flight, if any, to land; then
    /// deals with its input offsets as `offsets` says and re-initialises
    /// the tasks whose part of it failed.
    pub(super) fn land_inflight<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, offsets: Offsets) -> Result<()> {
        let Some((info, written)) = self.join_inflight() else { return Ok(()) };
        self.finish_commit(consumer, info, written?, offsets, "pipelined commit landed")
    }

    /// Waits for the writer of the commit in flight, if any; the stores
    /// whose writes landed stop reading them from memory.
    pub(super) fn join_inflight(&mut self) -> Option<(CommitInfo, Result<FailedTasks>)> {
        let InFlightCommit { writer, info, .. } = self.commit.inflight.take()?;
        let (written, landing) = writer.join().unwrap_or_else(|_| {
            (Err(Error::Restore { topic: String::new(), partition: -1, detail: "the commit writer thread panicked".into() }), None)
        });
        self.commit.landing = landing;
        if let Ok(failed) = &written {
            self.mark_landed(&info.partitions, failed);
        }
        Some((info, written))
    }

    /// Lets the writes in flight land (without committing offsets), so no
    /// store closes under the background writer.
    pub(super) fn wait_inflight(&mut self) {
        self.wait_transaction();
        let joined = self.join_inflight();
        // Writes that landed without their offsets: a savepoint must not
        // cut these tasks until they are opened again.
        if let Some((info, _)) = &joined {
            for task in info.partitions.iter().filter_map(|p| self.tasks.get(p)) {
                task.stores.iter().filter_map(KeyValueStore::slot).for_each(|s| s.input_fell_behind());
            }
        }
        if joined.as_ref().is_some_and(|(_, w)| w.is_ok()) {
            self.end_landing();
        }
        match joined {
            Some((_, Err(e))) => tracing::warn!(error = %e, "a pipelined commit failed; its writes stay uncommitted"),
            Some((_, Ok(failed))) if !failed.is_empty() => {
                tracing::warn!(tasks = ?failed.keys().collect::<Vec<_>>(), "a pipelined commit failed for some tasks; their writes stay uncommitted")
            }
            _ => {}
        }
    }

    /// The last step of a commit whose writes landed (except those of the
    /// `failed` tasks): commits or hands back its input offsets, records
    /// its latency, re-initialises the failed tasks (their offsets are
    /// never committed: their input is processed again).
    pub(super) fn finish_commit<C: ConsumerContext>(
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
        self.publish_input(&tpl, &failed);
        self.commit_offsets(tpl, offsets)?;
        let seconds = info.started.elapsed().as_secs_f64();
        metrics::histogram!(crate::metrics::COMMIT_SECONDS).record(seconds);
        tracing::debug!(seconds, stored, offsets = count, "{what}");
        for (partition, e) in failed {
            self.reinitialise(consumer, partition, e)?;
        }
        self.end_landing();
        Ok(())
    }

    /// The last commit's input offsets are published and its failed tasks
    /// re-initialised: savepoint cuts may see it.
    pub(super) fn end_landing(&mut self) {
        if let Some(landing) = self.commit.landing.take() {
            landing.done();
        }
    }
}
