//! Re-initialising a task after a fault confined to it, with a limit on
//! failures in a row (docs/architecture.md §3a).

use std::time::{Duration, Instant};

use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use crate::error::{Error, Result};

use super::{Task, TaskManager, TaskState};

/// A task that failed this many times in a row, over at least
/// `task_timeout`, ends `run`.
pub(super) const MAX_TASK_FAILURES: u32 = 5;

/// A task that ran this long since its last failure starts a new count.
pub(super) const TASK_FAILURES_FORGOTTEN_AFTER: Duration = Duration::from_secs(300);

#[derive(Default)]
pub(super) struct TaskFailures {
    pub(super) count: u32,
    pub(super) first: Option<Instant>,
    pub(super) last: Option<Instant>,
}

impl TaskManager {
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
    /// A running task's store failed outside a commit (reading its timers):
    /// re-initialise it as any task fault.
    pub(crate) fn reinitialise_task<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, partition: i32, cause: Error) -> Result<()> {
        self.reinitialise(consumer, partition, cause)
    }

    pub(super) fn reinitialise<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, partition: i32, cause: Error) -> Result<()> {
        let running = self.tasks.get(&partition).is_some_and(|t| t.state == TaskState::Running);
        // What the transaction in flight committed, first (should it fail,
        // every running task is re-initialised by its abort).
        if self.settle_transaction(consumer)? && running {
            return Ok(());
        }
        if running && self.transaction_open() {
            return self.abort_counting(consumer, &cause, false, Some(partition));
        }
        self.reinitialise_one(consumer, partition, cause)
    }

    pub(super) fn reinitialise_one<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, partition: i32, cause: Error) -> Result<()> {
        self.reinitialise_counted(consumer, partition, cause, true)
    }

    /// [`TaskManager::reinitialise_one`]; `count`: whether the failure
    /// counts toward [`MAX_TASK_FAILURES`].
    pub(super) fn reinitialise_counted<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, partition: i32, cause: Error, count: bool) -> Result<()> {
        if matches!(cause, Error::SchemaVersion { .. } | Error::BadRecord { .. }) {
            // Restoring again would refuse the same records.
            tracing::error!(partition, error = %cause, "a store's changelog holds values this code cannot read; stopping");
            return Err(cause);
        }
        if matches!(cause, Error::StateMemory { .. }) {
            // Restoring again would fill the same memory.
            tracing::error!(partition, error = %cause, "in-memory stores hold more than max_state_memory; stopping");
            return Err(cause);
        }
        // Another instance opened a remote store of this task for writing:
        // this one is a zombie (or the other is, and stops at its next
        // write). Re-opening at once would fence the other in turn; after
        // a session timeout the group has told the zombie it lost the
        // task, and only a true owner opens it again.
        let fenced = matches!(cause, Error::RemoteStore { kind: crate::error::RemoteFailure::Fenced, .. });
        let count = count && !fenced;
        // A transaction in flight may commit offsets of this task: it must
        // restart after them, or it would apply them again on top of the
        // restored records. Should it fail instead, its abort re-initialised
        // every running task, this one too.
        let running = self.tasks.get(&partition).is_some_and(|t| t.state == TaskState::Running);
        if self.settle_transaction(consumer)? && running {
            return Ok(());
        }
        let Some(mut task) = self.tasks.remove(&partition) else { return Ok(()) };
        let span = task.span.clone();
        let _in_task = span.clone().entered();
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
        let backoff = if fenced {
            self.session.as_ref().map_or(Duration::from_secs(10), |s| s.timeout())
        } else if attempts == 1 || !count {
            Duration::ZERO
        } else {
            (Duration::from_millis(500) * (1 << (attempts - 2).min(6))).min(Duration::from_secs(30))
        };
        if fenced {
            tracing::warn!(partition, ?backoff, error = %cause,
                "a remote store of this task was opened by another instance; closing the task, re-opened after a session timeout if it is still assigned here");
        } else if count {
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
        if let Some(inflight) = &self.offset_commits.in_flight {
            for e in inflight.elements().iter().filter(|e| e.partition() == partition) {
                if let (Some(r), Offset::Offset(o)) = (rewind.get_mut(e.topic()), e.offset()) {
                    *r = (*r).max(o);
                }
            }
        }
        // Records fetched and not processed (set aside while it did not
        // run, or held for their turn): read again.
        let held = task.held.take();
        let held = held.iter().flat_map(|h| h.lowest_offsets().map(|(t, o)| (self.config.input_topics[t].clone(), o)).collect::<Vec<_>>());
        for (topic, offset) in std::mem::take(&mut task.rewind).into_iter().chain(held) {
            let r = rewind.entry(topic).or_insert(offset);
            *r = (*r).min(offset);
        }
        let topics = std::mem::take(&mut task.topics);
        let stores = self.close_task(task, false);
        self.closer.close(stores);
        let incarnation = self.incarnation();
        self.tasks.insert(partition, Task::new(partition, topics, rewind, incarnation, now + backoff, span));
        Ok(())
    }
}
