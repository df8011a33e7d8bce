//! Committing input offsets under the group generation: asynchronous while
//! tasks run, synchronous for closing tasks; failures retried or handed back.

use std::time::Instant;

use rdkafka::{Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::group::{CommitError, Committer};
use crate::group::{CommitFailure, RetryRun};

use super::TaskManager;
use super::commit::Offsets;

/// A commit's offsets as the committer takes them, in the list's order.
pub(super) fn offsets_of(tpl: &TopicPartitionList) -> Vec<(String, i32, i64)> {
    tpl.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.topic().to_string(), e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Input offset commits of this member.
pub(super) struct OffsetCommits {
    /// Commits input offsets under the group generation.
    pub(super) committer: Committer,
    /// Offset commits failing in a row (group changes, coordinator away).
    pub(super) retries: RetryRun,
    /// The asynchronous offset commit awaiting its result, if any.
    pub(super) in_flight: Option<TopicPartitionList>,
}

impl OffsetCommits {
    pub(super) fn new(committer: Committer) -> Self {
        OffsetCommits { committer, retries: RetryRun::default(), in_flight: None }
    }
}

impl TaskManager {
    /// Commits input offsets under the group's current generation.
    ///
    /// While tasks run, the commit is asynchronous (a coordinator that is
    /// away must not block processing) and at most one is in flight: offsets
    /// that arrive meanwhile, or during a backoff, go back to their tasks
    /// and the next commit takes them (the newest win). Its result arrives
    /// in [`TaskManager::on_commit_result`]. For closing tasks the commit is
    /// synchronous and done once, together with the offsets of an
    /// asynchronous commit still in flight for them.
    pub(super) fn commit_offsets(&mut self, mut tpl: TopicPartitionList, offsets: Offsets) -> Result<()> {
        if offsets == Offsets::CommitClosing {
            if let Some(inflight) = &self.offset_commits.in_flight {
                for e in inflight.elements() {
                    let closing = tpl.elements().iter().any(|c| c.partition() == e.partition());
                    if closing && tpl.find_partition(e.topic(), e.partition()).is_none() {
                        tpl.add_partition_offset(e.topic(), e.partition(), e.offset())?;
                    }
                }
            }
        }
        if tpl.count() == 0 {
            if self.offset_commits.in_flight.is_none() {
                // Nothing is left to retry: a failing run is over (a run that
                // never ends would fail a much later, unrelated commit).
                self.offset_commits.retries.succeeded(Instant::now());
            }
            return Ok(());
        }
        // The previous commit's result may be in (a commit inside a long
        // batch of records never passes the loop's own check).
        self.poll_offset_commit()?;
        let waiting = self.offset_commits.in_flight.is_some() || !self.offset_commits.retries.due(Instant::now());
        if offsets == Offsets::HandBack || (offsets == Offsets::Commit && waiting) {
            self.hand_back(&tpl);
            return Ok(());
        }
        let closing = offsets == Offsets::CommitClosing;
        let (committer, Some(generation)) = (&self.offset_commits.committer, &self.generation) else {
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
            self.offset_commits.in_flight = Some(tpl);
            Ok(())
        }
    }

    /// Takes in the result of the asynchronous offset commit, if it arrived.
    pub(crate) fn poll_offset_commit(&mut self) -> Result<()> {
        let committer = &self.offset_commits.committer;
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
    pub(super) fn on_commit_result(&mut self, result: std::result::Result<(), CommitError>, offsets: &[(String, i32, i64)]) -> Result<()> {
        if self.offset_commits.in_flight.as_ref().is_none_or(|sent| offsets_of(sent) != offsets) {
            return Ok(());
        }
        let sent = self.offset_commits.in_flight.take().expect("checked");
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
    pub(super) fn committed(&mut self, tpl: &TopicPartitionList) {
        if let Some((failing_for, attempts)) = self.offset_commits.retries.succeeded(Instant::now()) {
            tracing::info!(?failing_for, attempts, "offset commits succeed again");
        }
        for e in tpl.elements() {
            if let (Some(task), Offset::Offset(o)) = (self.tasks.get_mut(&e.partition()), e.offset()) {
                task.restart_from.insert(e.topic().to_string(), o);
            }
        }
        // Repartition records below committed offsets are not needed again.
        if !self.config.repartitions.is_empty() {
            self.purger.committed(offsets_of(tpl));
        }
    }

    /// A failed offset commit: a group change or a retriable error hands the
    /// offsets back (or, for closing tasks, is logged); past `task_timeout`
    /// of failures in a row, or on any other error, this fails.
    pub(super) fn commit_failed(&mut self, error: CommitError, tpl: &TopicPartitionList, closing: bool) -> Result<()> {
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
        let failing_for = self.offset_commits.retries.failed(now);
        if failing_for >= self.config.task_timeout {
            return Err(Error::RetriesExhausted {
                operation: "offset commit",
                retried_for: failing_for,
                attempts: self.offset_commits.retries.attempts(),
                timeout: self.config.task_timeout,
                last: Box::new(Error::OffsetCommit(error.detail)),
            });
        }
        if self.offset_commits.retries.should_warn(now) {
            let why = if kind == CommitFailure::GroupChanged {
                "the group is rebalancing or moved on; partitions still owned commit with the next commit, lost ones are closed without commit"
            } else {
                "the group coordinator or the brokers are unavailable; retrying with backoff while processing goes on"
            };
            tracing::warn!(error = %error, ?failing_for, attempts = self.offset_commits.retries.attempts(),
                task_timeout = ?self.config.task_timeout, "offset commit failed: {why}");
        }
        if self.hand_back(tpl) == 0 {
            // Their tasks are gone: nothing to retry.
            self.offset_commits.retries.succeeded(now);
        }
        Ok(())
    }

    /// Gives offsets that were not committed back to the tasks that still
    /// run, so the next commit takes them; returns how many found a task.
    /// Every handed-back offset has landed writes behind it, so the larger
    /// of it and what a task holds is safe to commit. A task that has not
    /// processed the topic yet (a new incarnation: no `restart_from`) gets
    /// nothing: its restart position must come from its own first record.
    pub(super) fn hand_back(&mut self, tpl: &TopicPartitionList) -> usize {
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
}
