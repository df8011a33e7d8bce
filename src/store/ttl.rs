//! Time to live of a key-value store's entries (architecture.md §6): each
//! value is stored with the time of its write in front (8 bytes,
//! big-endian; in RocksDB and in the changelog alike), reads hide an entry
//! from the moment its write time plus the TTL has passed, and a sweep
//! over the store deletes expired entries through the store, so that their
//! tombstones reach the changelog within a bounded delay.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::time::TimeDomain;

/// Bytes of the write time in front of each value.
pub(crate) const STAMP: usize = 8;

/// A stream clock nobody has set: the task has no stream time yet.
pub(crate) const NO_TIME: i64 = i64::MIN;

/// One store partition's TTL.
pub(crate) struct Ttl {
    ms: i64,
    domain: TimeDomain,
    /// The task's stream time (stream-time TTL), [`NO_TIME`] until known.
    stream_clock: Arc<AtomicI64>,
    /// Where the next sweep starts (empty: at the first key).
    cursor: Vec<u8>,
}

impl Ttl {
    pub(crate) fn new(ttl: Duration, domain: TimeDomain) -> Ttl {
        Ttl {
            ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            domain,
            stream_clock: Arc::new(AtomicI64::new(NO_TIME)),
            cursor: Vec::new(),
        }
    }

    /// A copy for readers on other threads (same TTL, same clock).
    pub(crate) fn for_reads(&self) -> Ttl {
        Ttl { ms: self.ms, domain: self.domain, stream_clock: self.stream_clock.clone(), cursor: Vec::new() }
    }

    /// Follows the task's stream time from now on.
    pub(crate) fn follow(&mut self, stream_clock: Arc<AtomicI64>) {
        self.stream_clock = stream_clock;
    }

    /// The TTL's clock now; `None` while stream time is unknown.
    fn now(&self) -> Option<i64> {
        match self.domain {
            TimeDomain::WallClock => Some(crate::time::wall_clock_ms()),
            TimeDomain::StreamTime => Some(self.stream_clock.load(Ordering::Relaxed)).filter(|&t| t != NO_TIME),
        }
    }

    /// `value` with the time of this write in front; `None` on stream
    /// time while the task has none yet (before its first record ever):
    /// such a write has no time to expire from.
    pub(crate) fn stamp(&self, value: &[u8]) -> Option<Vec<u8>> {
        let mut v = Vec::with_capacity(STAMP + value.len());
        v.extend_from_slice(&self.now()?.to_be_bytes());
        v.extend_from_slice(value);
        Some(v)
    }

    /// What a reader sees of a stored value: the value without its stamp,
    /// or `None` if it expired (a value too short to carry a stamp, which
    /// a TTL store never writes, is shown whole).
    pub(crate) fn live<'v>(&self, stored: &'v [u8], now: Option<i64>) -> Option<&'v [u8]> {
        if stored.len() < STAMP {
            return Some(stored);
        }
        let written = i64::from_be_bytes(stored[..STAMP].try_into().expect("8 bytes"));
        match now {
            Some(now) if written.saturating_add(self.ms) <= now => None,
            _ => Some(&stored[STAMP..]),
        }
    }

    /// The clock reads use (once per read or scan).
    pub(crate) fn read_time(&self) -> Option<i64> {
        self.now()
    }

    pub(crate) fn cursor(&self) -> &[u8] {
        &self.cursor
    }

    pub(crate) fn set_cursor(&mut self, cursor: Vec<u8>) {
        self.cursor = cursor;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_expires_when_its_write_time_plus_the_ttl_is_reached() {
        let mut ttl = Ttl::new(Duration::from_millis(100), TimeDomain::StreamTime);
        let clock = Arc::new(AtomicI64::new(NO_TIME));
        ttl.follow(clock.clone());
        assert_eq!(ttl.stamp(b"v"), None, "no stream time yet: no write");
        clock.store(1_000, Ordering::Relaxed);
        let stored = ttl.stamp(b"v").unwrap();
        assert_eq!(ttl.live(&stored, Some(1_099)), Some(&b"v"[..]));
        assert_eq!(ttl.live(&stored, Some(1_100)), None);
        assert_eq!(ttl.live(&stored, None), Some(&b"v"[..]), "no clock: nothing expires");
        assert_eq!(ttl.live(b"short", Some(i64::MAX)), Some(&b"short"[..]), "too short to be stamped");
    }
}
