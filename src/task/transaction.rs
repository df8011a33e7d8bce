//! The exactly-once commit: one Kafka transaction of changelog records, output
//! records and input offsets; aborts, fencing of the producer, and commits
//! parked while the group moves to a new generation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, ConsumerContext};

use crate::error::{Error, Result};
use crate::group::{Generation, SessionClock};
use crate::kafka::OutputSink;
use crate::kafka::{ChangelogProducer, DeliveryTracker};
use crate::store::published::Landing;
use crate::store::SealedCommit;

use super::commit::{await_acknowledgements, land_stores, CommitInfo, FailedTasks};
use super::offsets::offsets_of;
use super::standby::Standby;
use super::{TaskManager, TaskState};

/// See [`TaskManager::parked`].
pub(super) struct ParkedCommit {
    pub(super) info: CommitInfo,
    pub(super) items: Vec<SealedCommit>,
}

/// Exactly-once: a producer fenced this many times without a committed
/// transaction in between ends `run` (another process with the same
/// `transactional.id`, i.e. the same state directory, is running).
pub(super) const MAX_FENCED_IN_A_ROW: u32 = 3;

/// Why an exactly-once commit failed: the transaction is aborted, and
/// `run` ends if `ends_run` (a record the brokers refuse, acknowledgements
/// that never came); `fatal` if the producer is unusable (fenced).
pub(super) struct TxnFailure {
    pub(super) error: Box<Error>,
    pub(super) fatal: bool,
    pub(super) ends_run: bool,
}

impl From<Error> for TxnFailure {
    fn from(error: Error) -> Self {
        // A transaction that could not even begin: replace the producer.
        let fatal = matches!(error, Error::Transaction { .. });
        let ends_run = match &error {
            // Timed out while frozen or while the brokers were away, or the
            // producer fenced: only this transaction is lost.
            Error::ChangelogDelivery { source, .. } | Error::OutputDelivery { source, .. } => {
                !crate::kafka::dooms_transaction_only(source.inner())
            }
            Error::CommitTimeout(_) | Error::RecordTooLarge { .. } => true,
            _ => false,
        };
        TxnFailure { error: Box::new(error), fatal, ends_run }
    }
}

/// How [`finish_transaction`] ended.
pub(super) enum Finished {
    Committed,
    /// The group is moving to a new generation: nothing was sent; park.
    NotSettled,
}

/// The exactly-once counterpart of [`write_sealed`], first half: sends the
/// sealed writes inside the open transaction and waits for every
/// acknowledgement (changelogs and outputs).
pub(super) fn send_transaction(
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

pub(super) fn send_transaction_records(
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

/// Second half: sends the input offsets (`group`, `generation`, `offsets`)
/// under the commit gate, unless the generation is not settled and the
/// commit `may_park`; then commits the transaction (retrying only the
/// commit: librdkafka resumes it; sending the offsets again would conflict
/// with it). [`land_stores`] then writes RocksDB.
pub(super) fn finish_transaction(
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

/// Calls `f` until it succeeds or fails in a way that is not
/// [`TxnError::resumable`], for at most `bound`.
pub(super) fn retry_resumable(what: &str, bound: Duration, mut f: impl FnMut() -> std::result::Result<(), crate::kafka::TxnError>) -> std::result::Result<(), crate::kafka::TxnError> {
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

/// Exactly-once state of the task manager.
pub(super) struct ExactlyOnce {
    /// Makes a new transactional producer (same `transactional.id`) after
    /// the current one was fenced.
    pub(super) new_producer: Box<dyn Fn() -> Result<ChangelogProducer> + Send>,
    /// Producers fenced since the last committed transaction.
    pub(super) fenced_in_a_row: u32,
    /// A commit whose records were all acknowledged when the group moved
    /// to a new generation; its transaction stays open until the runtime
    /// applies that generation ([`TaskManager::complete_parked`]). No
    /// records are taken meanwhile.
    pub(super) parked: Option<ParkedCommit>,
}

impl ExactlyOnce {
    pub(super) fn new(new_producer: Box<dyn Fn() -> Result<ChangelogProducer> + Send>) -> Self {
        ExactlyOnce { new_producer, fenced_in_a_row: 0, parked: None }
    }
}

/// Exactly-once: a transaction committing on a thread of its own while
/// processing goes on (docs/architecture.md, "Under exactly-once"): its changelog sends and
/// acknowledgements, the input offsets, the commit, then its stores'
/// landing. Outputs sent meanwhile are held for the next transaction
/// ([`OutputSink::hold`]); the next commit waits for this one.
pub(super) struct InFlightTransaction {
    pub(super) committer: std::thread::JoinHandle<TxnOutcome>,
    pub(super) info: CommitInfo,
}

/// How a transaction in flight ended.
pub(super) enum TxnOutcome {
    /// Committed, and its stores landed except the failed ones'.
    Committed(FailedTasks, Landing),
    /// It must be aborted; the landing (if begun) ends once its tasks are
    /// re-initialised.
    Failed(TxnFailure, Option<Landing>),
    /// The group moved to a new generation before the offsets went out:
    /// every record was acknowledged; it is parked.
    NotSettled(Vec<SealedCommit>),
}

impl TaskManager {
    /// The exactly-once commit, one transaction: seals every running task's
    /// writes, sends them to the changelogs inside the open transaction
    /// (the outputs went there as they were sent), waits for every
    /// acknowledgement, adds the input offsets under the member's
    /// generation, commits the transaction, and only then lands each
    /// store's writes and checkpoint in RocksDB. A failure aborts the
    /// transaction and re-initialises the running tasks; failures that no
    /// retry mends (an output or changelog record refused) also end `run`.
    ///
    /// A commit `closing` tasks (a revoke while the new generation is
    /// applied, or shutdown) completes here, at once. Any other commits
    /// in flight ([`InFlightTransaction`]) while processing goes on, and is
    /// parked if the group moves to a new generation meanwhile.
    pub(super) fn commit_transaction<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, closing: bool) -> Result<()> {
        self.settle_transaction(consumer)?;
        if self.eos.parked.is_some() {
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
        if closing {
            let sent = send_transaction(sealed, &self.producer, outputs, self.config.commit_timeout, self.config.task_timeout);
            return match sent {
                Ok(items) => self.complete_transaction(consumer, info, items, false),
                Err(failure) => self.transaction_failed(consumer, failure),
            };
        }
        let Some(generation) = self.generation.clone() else {
            return self.abort_without_generation(consumer);
        };
        let committer = std::thread::Builder::new()
            .name("kstate-commit".into())
            .spawn({
                let producer = self.producer.clone();
                let group = self.config.application_id.clone();
                let offsets = offsets_of(&info.offsets);
                let session = self.session.clone();
                let (timeout, patience) = (self.config.commit_timeout, self.config.task_timeout);
                let gate = self.config.published.landing.clone();
                let retired = std::mem::take(&mut self.commit.retired);
                move || {
                    let items = match send_transaction(sealed, &producer, outputs, timeout, patience) {
                        Ok(items) => items,
                        Err(failure) => return TxnOutcome::Failed(failure, None),
                    };
                    // Begun before the offsets commit with the transaction: a
                    // savepoint cut must not pair them with the state before
                    // this commit lands.
                    let landing = gate.begin();
                    match finish_transaction(&producer, (&group, &generation, &offsets), (session.as_ref(), true), timeout, patience) {
                        Err(failure) => TxnOutcome::Failed(failure, Some(landing)),
                        Ok(Finished::NotSettled) => {
                            landing.done();
                            TxnOutcome::NotSettled(items)
                        }
                        Ok(Finished::Committed) => {
                            let (failed, landing) = land_stores(items, landing);
                            drop(retired);
                            TxnOutcome::Committed(failed, landing)
                        }
                    }
                }
            })
            .map_err(|e| Error::io("kstate-commit thread", e))?;
        // Only this thread sends outputs, and not before this returns.
        self.outputs.hold();
        self.commit.transaction = Some(InFlightTransaction { committer, info });
        Ok(())
    }

    /// Exactly-once: waits for the transaction in flight, if any, and
    /// applies how it ended: committed (its offsets become the tasks'
    /// restart points, failed stores re-initialise, held outputs go into
    /// the next transaction), failed (aborted, every running task
    /// re-initialised: then `true`), or caught by a rebalance (parked).
    pub(super) fn settle_transaction<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<bool> {
        let Some(InFlightTransaction { committer, info }) = self.commit.transaction.take() else { return Ok(false) };
        match join_committer(committer, self.producer.transactional_id()) {
            TxnOutcome::Committed(failed, landing) => {
                self.committed_and_landed(&info, &failed, landing);
                // A failed task's held outputs abort the next transaction here.
                self.transaction_landed(consumer, info, failed)?;
                self.outputs.release();
                Ok(false)
            }
            TxnOutcome::Failed(failure, landing) => {
                // Its tasks are re-initialised (restoring) before the cut may look.
                let failed = self.transaction_failed(consumer, failure);
                if let Some(landing) = landing {
                    landing.done();
                }
                failed.map(|()| true)
            }
            TxnOutcome::NotSettled(items) => {
                // Offsets under the old generation could be refused and the
                // whole transaction aborted: complete it under the new one.
                tracing::info!("the group is rebalancing; the commit completes under the new generation");
                self.eos.parked = Some(ParkedCommit { info, items });
                Ok(false)
            }
        }
    }

    /// Exactly-once: waits for the transaction in flight, if any, for tasks
    /// that all close without a commit (lost, shutdown after a failure):
    /// what committed landed; anything else is aborted.
    pub(super) fn wait_transaction(&mut self) {
        let Some(InFlightTransaction { committer, info }) = self.commit.transaction.take() else { return };
        match join_committer(committer, self.producer.transactional_id()) {
            TxnOutcome::Committed(failed, landing) => {
                self.committed_and_landed(&info, &failed, landing);
                self.committed(&info.offsets);
                self.publish_input(&info.offsets, &failed);
                self.end_landing();
            }
            TxnOutcome::Failed(failure, landing) => {
                tracing::warn!(error = %failure.error, "the last transaction failed; aborting it");
                self.abort_now();
                if let Some(landing) = landing {
                    landing.done();
                }
            }
            TxnOutcome::NotSettled(_) => {
                tracing::info!("the last transaction was caught by a rebalance; aborting it");
                self.abort_now();
            }
        }
    }

    /// Exactly-once: whether anything was sent (or is held, or is
    /// committing) since the last transaction ended.
    pub(super) fn transaction_open(&self) -> bool {
        self.producer.in_transaction() || self.commit.transaction.is_some() || self.outputs.held().is_some()
    }

    /// Exactly-once: whether a commit is parked (see [`TaskManager::parked`]).
    pub(crate) fn is_parked(&self) -> bool {
        self.eos.parked.is_some()
    }

    /// Exactly-once: completes a commit parked while the group moved to a
    /// new generation, under that generation (called when the runtime
    /// applies it, before any task is revoked: no other member has
    /// processed these tasks' input since).
    pub(crate) fn complete_parked<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        self.settle_transaction(consumer)?;
        match self.eos.parked.take() {
            Some(ParkedCommit { info, items }) => {
                self.complete_transaction(consumer, info, items, false)?;
                self.outputs.release();
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Exactly-once, after every record of the commit was acknowledged, on
    /// this thread: sends its offsets under the current generation, commits
    /// the transaction, then lands the stores. A commit that `may_park` is
    /// parked if the group is moving to a new generation.
    pub(super) fn complete_transaction<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        info: CommitInfo,
        items: Vec<SealedCommit>,
        may_park: bool,
    ) -> Result<()> {
        let Some(generation) = self.generation.clone() else {
            return self.abort_without_generation(consumer);
        };
        let session = self.session.clone();
        // The landing begins before the offsets commit with the
        // transaction: a savepoint cut must not pair them with the state
        // before this commit lands.
        let landing = self.config.published.landing.begin();
        let finished = finish_transaction(
            &self.producer,
            (&self.config.application_id, &generation, &offsets_of(&info.offsets)),
            (session.as_ref(), may_park),
            self.config.commit_timeout,
            self.config.task_timeout,
        );
        match finished {
            Err(failure) => {
                // Its tasks are re-initialised (restoring) before the cut may look.
                let failed = self.transaction_failed(consumer, failure);
                landing.done();
                return failed;
            }
            Ok(Finished::NotSettled) => {
                landing.done();
                tracing::info!("the group is rebalancing; the commit completes under the new generation");
                self.eos.parked = Some(ParkedCommit { info, items });
                return Ok(());
            }
            Ok(Finished::Committed) => {}
        }
        let (failed, landing) = land_stores(items, landing);
        self.committed_and_landed(&info, &failed, landing);
        self.transaction_landed(consumer, info, failed)
    }

    /// A transaction committed and its stores landed (except the `failed`
    /// ones): no fence in a row any more, the landed stores stop reading
    /// their sealed writes, and the landing ends once the offsets are
    /// published.
    fn committed_and_landed(&mut self, info: &CommitInfo, failed: &FailedTasks, landing: Landing) {
        self.eos.fenced_in_a_row = 0;
        self.commit.landing = Some(landing);
        self.mark_landed(&info.partitions, failed);
    }

    /// No generation to commit under (the member left the group): the
    /// open transaction is aborted and the running tasks re-initialised.
    fn abort_without_generation<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) -> Result<()> {
        let cause = Error::GroupMembership { group: self.config.application_id.clone(), detail: "no current generation to commit under".into() };
        self.abort_and_reinitialise(consumer, &cause, false)
    }

    /// Exactly-once: a committed transaction's stores landed (except the
    /// `failed` ones): its offsets are where the tasks restart from; the
    /// failed tasks restore the committed records from the changelogs.
    pub(super) fn transaction_landed<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, info: CommitInfo, failed: FailedTasks) -> Result<()> {
        self.committed(&info.offsets);
        self.publish_input(&info.offsets, &failed);
        let seconds = info.started.elapsed().as_secs_f64();
        metrics::histogram!(crate::metrics::COMMIT_SECONDS).record(seconds);
        tracing::debug!(seconds, offsets = info.offsets.count(), "transaction committed and landed");
        for (partition, e) in failed {
            // Through `reinitialise`: the task may have sent outputs into
            // the transaction opened since.
            self.reinitialise(consumer, partition, e)?;
        }
        self.end_landing();
        Ok(())
    }

    /// Aborts after a failed exactly-once commit; `run` ends if the failure says so.
    pub(super) fn transaction_failed<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, failure: TxnFailure) -> Result<()> {
        let TxnFailure { error, fatal, ends_run } = failure;
        self.abort_and_reinitialise(consumer, &error, fatal)?;
        if ends_run {
            Err(*error)
        } else {
            Ok(())
        }
    }

    /// Exactly-once: the open transaction must not commit (it failed, or a
    /// task in it did): aborts it, so nothing sent since the last commit
    /// becomes visible, and re-initialises every running task (their
    /// uncommitted writes and outputs are gone; they restore from their
    /// checkpoints and process again from their committed offsets). A
    /// `fatal` failure (the producer was fenced) replaces the producer
    /// first; every task and standby is then reopened on the new one.
    pub(super) fn abort_and_reinitialise<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, cause: &Error, fatal: bool) -> Result<()> {
        self.abort_counting(consumer, cause, fatal, None)
    }

    /// [`TaskManager::abort_and_reinitialise`] for a fault of task `counted`
    /// (if any), whose re-initialisation counts toward its failures in a row.
    pub(super) fn abort_counting<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, cause: &Error, mut fatal: bool, counted: Option<i32>) -> Result<()> {
        // Every running task processes again: what it sent meanwhile goes.
        self.outputs.drop_held();
        if self.settle_transaction(consumer)? {
            return Ok(()); // aborted, and every running task re-initialised
        }
        self.eos.parked = None;
        if fatal {
            metrics::counter!(crate::metrics::TRANSACTIONS_ABORTED).increment(1);
        } else if !self.abort_now() {
            fatal = true;
        }
        let id = self.producer.transactional_id().to_string();
        let partitions: Vec<i32> = if fatal {
            self.eos.fenced_in_a_row += 1;
            if self.eos.fenced_in_a_row >= MAX_FENCED_IN_A_ROW {
                tracing::error!(transactional_id = %id, times = self.eos.fenced_in_a_row, error = %cause,
                    "the producer was fenced again and again: is another instance running on the same state directory?");
                return Err(Error::Transaction {
                    transactional_id: id,
                    operation: "commit",
                    detail: format!("fenced {} times in a row without a commit in between; last: {cause}", self.eos.fenced_in_a_row),
                });
            }
            tracing::warn!(transactional_id = %id, error = %cause,
                "the transactional producer was fenced; replacing it and re-initialising every task (nothing of the open transaction is visible)");
            self.producer = Arc::new((self.eos.new_producer)()?);
            self.outputs = OutputSink::new(self.producer.clone());
            // Standby stores hold the old producer: reopen them (update_standbys does).
            for (p, state) in std::mem::take(&mut self.standbys.tasks) {
                if state == Standby::Following {
                    if let Some(job) = self.restorer.cancel(p) {
                        self.closer.close(job.stores);
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
            let error = Error::Transaction { transactional_id: id.clone(), operation: "commit", detail: cause.to_string() };
            self.reinitialise_counted(consumer, p, error, counted == Some(p))?;
        }
        Ok(())
    }

    /// Exactly-once: aborts the open transaction, if any, for tasks that
    /// are all being closed without commit (lost, or at a failed shutdown).
    pub(super) fn abort_open_transaction(&mut self) {
        self.outputs.drop_held();
        self.wait_transaction();
        self.eos.parked = None;
        if self.transaction_open() && self.abort_now() {
            tracing::info!("open transaction aborted");
        }
    }

    /// Aborts the open transaction (counted); later outputs get a fresh
    /// tracker. Whether the abort went through (else the brokers abort it
    /// after `transaction_timeout`, and the producer is unusable).
    pub(super) fn abort_now(&mut self) -> bool {
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
}

/// The committer thread's outcome; a panic there is a failed transaction
/// that ends `run`.
fn join_committer(committer: std::thread::JoinHandle<TxnOutcome>, transactional_id: &str) -> TxnOutcome {
    committer.join().unwrap_or_else(|_| {
        let error = Error::Transaction { transactional_id: transactional_id.to_string(), operation: "commit", detail: "the commit thread panicked".into() };
        TxnOutcome::Failed(TxnFailure { error: Box::new(error), fatal: false, ends_run: true }, None)
    })
}
