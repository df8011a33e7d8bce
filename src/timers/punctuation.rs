//! Punctuation schedules of one task: in memory, scheduled again by the
//! processor's `init` whenever the task starts (Kafka Streams' semantics,
//! stated in the README's "Time" section).

use crate::time::{Punctuation, PunctuationId, TimeDomain};

struct Schedule {
    id: PunctuationId,
    domain: TimeDomain,
    interval: i64,
    /// When it runs next.
    next: i64,
}

/// The task's punctuation schedules.
#[derive(Default)]
pub(crate) struct Punctuations {
    schedules: Vec<Schedule>,
    next_id: u64,
}

impl Punctuations {
    /// Schedules a punctuation every `interval_ms` of `domain`: on stream
    /// time aligned to 0 (the first runs at the task's first stream time),
    /// on the wall clock first at `now + interval`.
    pub(crate) fn schedule(&mut self, domain: TimeDomain, interval_ms: i64, wall_now: i64) -> PunctuationId {
        let id = PunctuationId(self.next_id);
        self.next_id += 1;
        let next = match domain {
            TimeDomain::StreamTime => 0,
            TimeDomain::WallClock => wall_now.saturating_add(interval_ms),
        };
        self.schedules.push(Schedule { id, domain, interval: interval_ms, next });
        id
    }

    /// Cancels a schedule; `false` if it did not exist.
    pub(crate) fn cancel(&mut self, id: PunctuationId) -> bool {
        let before = self.schedules.len();
        self.schedules.retain(|s| s.id != id);
        self.schedules.len() < before
    }

    /// The earliest time a punctuation of `domain` runs (`i64::MAX`: none).
    pub(crate) fn next_due(&self, domain: TimeDomain) -> i64 {
        self.schedules.iter().filter(|s| s.domain == domain && s.next < i64::MAX).map(|s| s.next).min().unwrap_or(i64::MAX)
    }

    /// The earliest punctuation of `domain` due at `now`, moved to its
    /// next time: the first multiple of its interval after `now` counted
    /// from its last due time, so a clock that jumped over several
    /// intervals runs it once, not once per interval.
    pub(crate) fn pop_due(&mut self, domain: TimeDomain, now: i64) -> Option<Punctuation> {
        // (A schedule whose next time saturated at i64::MAX runs no more.)
        let s = self
            .schedules
            .iter_mut()
            .filter(|s| s.domain == domain && s.next <= now && s.next < i64::MAX)
            .min_by_key(|s| (s.next, s.id))?;
        let missed = now.saturating_sub(s.next) / s.interval;
        s.next = s.next.saturating_add(missed.saturating_add(1).saturating_mul(s.interval));
        Some(Punctuation { id: s.id, domain, timestamp: now })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_time_jumping_over_intervals_runs_once_and_stays_aligned() {
        let mut p = Punctuations::default();
        let id = p.schedule(TimeDomain::StreamTime, 10, 1_000_000);
        // The first record (stream time 25) runs it: aligned to 0.
        assert_eq!(p.pop_due(TimeDomain::StreamTime, 25).map(|x| (x.id, x.timestamp)), Some((id, 25)));
        assert_eq!(p.pop_due(TimeDomain::StreamTime, 25), None);
        assert_eq!(p.next_due(TimeDomain::StreamTime), 30);
        assert_eq!(p.pop_due(TimeDomain::StreamTime, 29), None);
        // 30..=75 crosses five intervals: one run, next at 80.
        assert!(p.pop_due(TimeDomain::StreamTime, 75).is_some());
        assert_eq!(p.pop_due(TimeDomain::StreamTime, 75), None);
        assert_eq!(p.next_due(TimeDomain::StreamTime), 80);
        assert!(p.cancel(id));
        assert!(!p.cancel(id));
        assert_eq!(p.next_due(TimeDomain::StreamTime), i64::MAX);
    }

    #[test]
    fn wall_clock_first_runs_an_interval_after_scheduling() {
        let mut p = Punctuations::default();
        p.schedule(TimeDomain::WallClock, 100, 1_000);
        assert_eq!(p.pop_due(TimeDomain::WallClock, 1_099), None);
        assert!(p.pop_due(TimeDomain::WallClock, 1_100).is_some());
        assert_eq!(p.next_due(TimeDomain::WallClock), 1_200);
        assert_eq!(p.pop_due(TimeDomain::StreamTime, i64::MAX - 1), None);
    }

    #[test]
    fn a_clock_at_its_end_runs_a_punctuation_once() {
        let mut p = Punctuations::default();
        p.schedule(TimeDomain::StreamTime, 1, 0);
        assert!(p.pop_due(TimeDomain::StreamTime, i64::MAX).is_some());
        assert_eq!(p.pop_due(TimeDomain::StreamTime, i64::MAX), None);
        assert_eq!(p.next_due(TimeDomain::StreamTime), i64::MAX);
    }
}
