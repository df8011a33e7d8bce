//! Window and session stores' storage (architecture.md §7): time is split
//! into segments, each RocksDB key starts with its segment, and a segment
//! that falls out of retention is deleted with one range deletion in the
//! batch of a commit (or of a restore batch), never key by key.
//!
//! | store | changelog key | RocksDB key | filed under |
//! |---|---|---|---|
//! | window | `key ++ start` | `segment ++ key ++ start` | the window's start |
//! | session | `key ++ end ++ start` | `segment ++ key ++ end ++ start` | the session's end |
//!
//! Times are 8 bytes big-endian with the sign bit flipped (so that byte
//! order is time order); `segment` is `time.div_euclid(interval)` encoded
//! the same way. The changelog key has no segment, so a changed segment
//! interval (a changed retention) never touches the changelog: the local
//! state is rebuilt from it (the interval is recorded in RocksDB's meta
//! column family with the store's time, and checked at open).
//!
//! The store's time is the latest time filed in it (Kafka Streams' observed
//! stream time of a segmented store): an entry filed at or before
//! `time - retention` is expired, never returned, and skipped by a restore.

use std::time::Duration;

/// Bytes of one encoded time (and of the segment prefix).
pub(crate) const TIME: usize = 8;

/// No time filed yet.
pub(crate) const NO_TIME: i64 = i64::MIN;

/// The smallest segment interval (Kafka Streams' too).
const MIN_INTERVAL_MS: i64 = 60_000;

/// Which store layout the keys follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `key ++ start`, filed under the window's start.
    Window,
    /// `key ++ end ++ start`, filed under the session's end.
    Session,
}

impl Layout {
    /// How RocksDB's meta column family records it.
    pub(crate) fn byte(self) -> u8 {
        match self {
            Layout::Window => b'w',
            Layout::Session => b's',
        }
    }
}

/// A byte-ordered time: big-endian with the sign bit flipped.
pub(crate) fn encode_time(t: i64) -> [u8; TIME] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// The inverse of [`encode_time`]; `bytes` must be [`TIME`] long.
pub(crate) fn decode_time(bytes: &[u8]) -> i64 {
    let mut b = [0u8; TIME];
    b.copy_from_slice(&bytes[..TIME]);
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One segmented store partition: its layout, retention and segment
/// interval, the store's time and what has been dropped already.
#[derive(Debug, Clone)]
pub(crate) struct Segments {
    pub(crate) layout: Layout,
    /// Retention in ms: an entry filed at or before `time - retention` is expired.
    pub(crate) retention: i64,
    /// Segment length in ms: `max(retention / 2, 60 s)`.
    pub(crate) interval: i64,
    /// The latest time filed ([`NO_TIME`]: none).
    time: i64,
    /// Every segment below this one has been deleted from RocksDB (or is
    /// deleted by the commit in flight).
    dropped_below: i64,
    /// The time of the commit in flight (sealed, not landed yet).
    sealed_time: i64,
    /// The time in RocksDB: of the last commit that landed.
    committed_time: i64,
}

impl Segments {
    pub(crate) fn new(layout: Layout, retention: Duration) -> Segments {
        let retention = millis(retention);
        Segments {
            layout,
            retention,
            interval: (retention / 2).max(MIN_INTERVAL_MS),
            time: NO_TIME,
            dropped_below: i64::MIN,
            sealed_time: NO_TIME,
            committed_time: NO_TIME,
        }
    }

    /// The store's time: the latest time filed, or [`NO_TIME`].
    pub(crate) fn time(&self) -> i64 {
        self.time
    }

    /// Starts from the time recorded in RocksDB (or none: an empty store).
    pub(crate) fn reset(&mut self, recorded: i64) {
        self.time = recorded;
        self.sealed_time = recorded;
        self.committed_time = recorded;
        // Each commit recorded its time with the drop that time allowed.
        self.dropped_below = self.first_live_segment();
    }

    /// The commit sealed by the last [`take_update`](Self::take_update)
    /// is in RocksDB.
    pub(crate) fn landed(&mut self) {
        self.committed_time = self.sealed_time;
    }

    /// Uncommitted writes were discarded: back to the time in RocksDB (a
    /// time moved by discarded writes must not expire anything).
    pub(crate) fn rewind(&mut self) {
        self.reset(self.committed_time);
    }

    /// Files `time` (a window's start, a session's end).
    pub(crate) fn observe(&mut self, time: i64) {
        self.time = self.time.max(time);
    }

    /// The segment holding `time`.
    pub(crate) fn segment(&self, time: i64) -> i64 {
        time.div_euclid(self.interval)
    }

    /// The RocksDB key prefix of `time`'s segment.
    pub(crate) fn prefix(&self, time: i64) -> [u8; TIME] {
        encode_time(self.segment(time))
    }

    /// The time of the oldest entry that may still be live: anything filed
    /// before it is expired (`i64::MIN`: nothing is).
    pub(crate) fn oldest_live(&self) -> i64 {
        if self.time == NO_TIME {
            i64::MIN
        } else {
            self.time.saturating_sub(self.retention).saturating_add(1)
        }
    }

    /// Whether an entry filed at `time` is expired.
    pub(crate) fn expired(&self, time: i64) -> bool {
        time < self.oldest_live()
    }

    /// The time a changelog key is filed under; `None` for a key too short
    /// to be one of this layout's.
    pub(crate) fn time_of(&self, changelog_key: &[u8]) -> Option<i64> {
        let n = changelog_key.len();
        match self.layout {
            Layout::Window if n >= TIME => Some(decode_time(&changelog_key[n - TIME..])),
            Layout::Session if n >= 2 * TIME => Some(decode_time(&changelog_key[n - 2 * TIME..n - TIME])),
            _ => None,
        }
    }

    /// The first segment that may hold a live entry; every one below it is
    /// wholly expired.
    fn first_live_segment(&self) -> i64 {
        match self.oldest_live() {
            i64::MIN => i64::MIN,
            t => self.segment(t),
        }
    }

    /// Live segments (from the first that may be live to the store's time's).
    pub(crate) fn live_segments(&self) -> std::ops::RangeInclusive<i64> {
        if self.time == NO_TIME {
            #[allow(clippy::reversed_empty_ranges)] // empty on purpose
            return 1..=0;
        }
        self.first_live_segment()..=self.segment(self.time)
    }

    /// What a commit writes besides the data: the store's time (every
    /// commit: its presence also says the data has this layout), and a range deletion of the segments that expired since the
    /// last one (`[from, to)` RocksDB keys). Marks them dropped.
    pub(crate) fn take_update(&mut self) -> SegmentsUpdate {
        let first_live = self.first_live_segment();
        let drop = (first_live > self.dropped_below).then(|| (encode_time(self.dropped_below), encode_time(first_live)));
        // Segments that held live entries here (not the open range below
        // the first time filed into an empty store).
        let dropped = match self.dropped_below {
            i64::MIN => 0,
            below => first_live.saturating_sub(below).max(0) as u64,
        };
        if drop.is_some() {
            self.dropped_below = first_live;
        }
        self.sealed_time = self.time;
        SegmentsUpdate { layout: self.layout, retention: self.retention, interval: self.interval, time: self.time, drop, dropped }
    }
}

/// What a commit or restore batch of a segmented store writes to RocksDB
/// besides the data.
#[derive(Debug, Clone)]
pub(crate) struct SegmentsUpdate {
    pub(crate) layout: Layout,
    pub(crate) retention: i64,
    /// Recorded with the time, to notice a changed interval at open.
    pub(crate) interval: i64,
    /// The store's time.
    pub(crate) time: i64,
    /// Segments to delete: RocksDB keys in `[from, to)`.
    pub(crate) drop: Option<([u8; TIME], [u8; TIME])>,
    /// Segments dropped that had been live (for the metric).
    pub(crate) dropped: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_times_sort_as_times() {
        let times = [i64::MIN, -86_400_000, -1, 0, 1, 59_999, 60_000, i64::MAX];
        for w in times.windows(2) {
            assert!(encode_time(w[0]) < encode_time(w[1]), "{} vs {}", w[0], w[1]);
            assert_eq!(decode_time(&encode_time(w[0])), w[0]);
        }
    }

    #[test]
    fn interval_is_half_the_retention_and_at_least_a_minute() {
        assert_eq!(Segments::new(Layout::Window, Duration::from_secs(3600)).interval, 1_800_000);
        assert_eq!(Segments::new(Layout::Window, Duration::from_secs(10)).interval, 60_000);
    }

    #[test]
    fn expiry_follows_the_latest_time_filed() {
        let mut s = Segments::new(Layout::Window, Duration::from_secs(600));
        assert!(!s.expired(0));
        assert_eq!(s.live_segments().count(), 0);
        s.observe(1_000_000);
        assert_eq!(s.oldest_live(), 400_001);
        assert!(s.expired(400_000));
        assert!(!s.expired(400_001));
        s.observe(5); // time never goes back
        assert_eq!(s.time(), 1_000_000);
        // Segments of 300 s: live ones hold 400_001..=1_000_000.
        assert_eq!(s.live_segments(), 1..=3);
    }

    #[test]
    fn a_commit_drops_each_expired_segment_once() {
        let mut s = Segments::new(Layout::Window, Duration::from_secs(120));
        s.observe(30_000);
        let u = s.take_update();
        assert_eq!(u.time, 30_000);
        assert_eq!(u.drop, Some((encode_time(i64::MIN), encode_time(-2))), "nothing live below -89 s");
        assert!(s.take_update().drop.is_none());
        s.observe(300_000);
        let u = s.take_update();
        // Oldest live 180_001 ms: segment 3 (60 s segments).
        assert_eq!(u.drop, Some((encode_time(-2), encode_time(3))));
        assert_eq!(u.dropped, 5);
        // Reopened at the recorded time: those are gone already.
        s.reset(300_000);
        assert!(s.take_update().drop.is_none());
        // A time moved by writes that were then discarded comes back.
        s.landed();
        s.observe(900_000);
        let u = s.take_update();
        assert!(u.drop.is_some());
        s.rewind();
        assert_eq!(s.time(), 300_000);
        assert!(!s.expired(200_000));
        assert!(s.take_update().drop.is_none(), "nothing dropped that the time in RocksDB keeps");
    }

    #[test]
    fn keys_are_filed_under_start_or_end() {
        let w = Segments::new(Layout::Window, Duration::from_secs(120));
        let key = [b"k".as_slice(), &encode_time(42)].concat();
        assert_eq!(w.time_of(&key), Some(42));
        assert_eq!(w.time_of(b"short"), None);
        let s = Segments::new(Layout::Session, Duration::from_secs(120));
        let key = [b"k".as_slice(), &encode_time(50), &encode_time(42)].concat();
        assert_eq!(s.time_of(&key), Some(50));
    }
}
