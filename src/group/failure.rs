//! How kstate reacts to a failure: which Kafka errors mean "the group moved
//! on", which are worth retrying, and how long retrying may go on
//! (docs/architecture.md §3a: a fault is handled at the smallest unit it touches).

use std::time::{Duration, Instant};


/// What an offset-commit failure means for the tasks whose offsets it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitFailure {
    /// The group moved on (a rebalance, this member fenced or expelled): the
    /// offsets were not committed. Tasks this member still owns commit them
    /// with the next commit; tasks it lost are closed by the rebalance
    /// without committing (Kafka Streams' "task migrated").
    GroupChanged,
    /// The coordinator or the brokers are briefly away: retried with backoff
    /// while processing goes on.
    Retriable,
    /// Anything else (authorisation, a bad request): ends `run`.
    Fatal,
}

impl CommitFailure {
    /// The `kind` label of `kstate_offset_commit_failures_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            CommitFailure::GroupChanged => "group_changed",
            CommitFailure::Retriable => "retriable",
            CommitFailure::Fatal => "fatal",
        }
    }
}

/// Tracks a run of failed attempts at one kind of operation: when it began,
/// how many attempts failed, and when the next attempt is due (exponential
/// backoff from 100 ms up to 5 s).
#[derive(Debug, Default)]
pub(crate) struct RetryRun {
    since: Option<Instant>,
    attempts: u32,
    next_attempt: Option<Instant>,
    last_warned: Option<Instant>,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A failing run logs a warning at its start and then at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

impl RetryRun {
    /// Whether an attempt may be made now (no failure, or the backoff passed).
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next_attempt.is_none_or(|t| now >= t)
    }

    /// Records a failed attempt; returns how long the run has been failing.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        let since = *self.since.get_or_insert(now);
        self.attempts += 1;
        let backoff = FIRST_BACKOFF.saturating_mul(1 << self.attempts.min(16).saturating_sub(1)).min(MAX_BACKOFF);
        self.next_attempt = Some(now + backoff);
        now - since
    }

    /// Whether a warning about the run should be logged now.
    pub(crate) fn should_warn(&mut self, now: Instant) -> bool {
        if self.last_warned.is_some_and(|t| now - t < WARN_EVERY) {
            return false;
        }
        self.last_warned = Some(now);
        true
    }

    /// Failed attempts so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The operation succeeded: returns how long it had been failing, if it was.
    pub(crate) fn succeeded(&mut self, now: Instant) -> Option<(Duration, u32)> {
        let since = self.since.take()?;
        let attempts = std::mem::take(&mut self.attempts);
        self.next_attempt = None;
        self.last_warned = None;
        Some((now - since, attempts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_run_backs_off_and_reports_its_length() {
        let t0 = Instant::now();
        let mut run = RetryRun::default();
        assert!(run.due(t0));
        assert_eq!(run.failed(t0), Duration::ZERO);
        assert!(!run.due(t0 + Duration::from_millis(50)));
        assert!(run.due(t0 + Duration::from_millis(100)));
        assert_eq!(run.failed(t0 + Duration::from_millis(100)), Duration::from_millis(100));
        assert!(!run.due(t0 + Duration::from_millis(250)), "second backoff is 200 ms");
        for i in 0..20 {
            run.failed(t0 + Duration::from_secs(i));
        }
        assert!(run.due(t0 + Duration::from_secs(19) + MAX_BACKOFF), "backoff is capped");
        assert_eq!(run.attempts(), 22);
        assert_eq!(run.succeeded(t0 + Duration::from_secs(30)), Some((Duration::from_secs(30), 22)));
        assert!(run.due(t0 + Duration::from_secs(30)));
        assert_eq!(run.succeeded(t0 + Duration::from_secs(31)), None);
    }
}
