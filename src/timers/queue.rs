//! One clock's timers of one task: stored in the task's time store under
//! an order-preserving key (architecture.md §6), with the earliest of them
//! cached in memory so that checking and firing them costs no RocksDB read
//! per record.

use std::collections::BTreeSet;

use crate::error::Result;
use crate::store::KeyValueStore;
use crate::time::TimeDomain;

/// Timers read from the store into the cache at a time.
const CACHE_FILL: usize = 1024;

/// The key of a timer: `[domain byte] ++ timestamp (8 bytes, big-endian,
/// sign bit flipped so that negative times sort first) ++ the timer's key`.
pub(crate) fn timer_key(domain: TimeDomain, timestamp: i64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.push(domain_byte(domain));
    k.extend_from_slice(&((timestamp as u64) ^ (1 << 63)).to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// The timestamp and key of a stored timer key, `None` if it is none.
pub(crate) fn decode_timer_key(k: &[u8]) -> Option<(TimeDomain, i64, &[u8])> {
    let domain = match *k.first()? {
        1 => TimeDomain::StreamTime,
        2 => TimeDomain::WallClock,
        _ => return None,
    };
    let ts = u64::from_be_bytes(k.get(1..9)?.try_into().ok()?) ^ (1 << 63);
    Some((domain, ts as i64, &k[9..]))
}

pub(crate) fn domain_byte(domain: TimeDomain) -> u8 {
    match domain {
        TimeDomain::StreamTime => 1,
        TimeDomain::WallClock => 2,
    }
}

/// A key in a time store's timer range that is no timer key (a damaged
/// store or changelog).
fn not_a_timer(k: &[u8]) -> crate::error::Error {
    crate::error::Error::Codec { codec: "timer key", source: format!("{} bytes in the timer range of a time store: {k:02x?}", k.len()).into() }
}

/// The timestamp a cache bound stands for: every stored timer at or past
/// the bound is due at this time or later.
fn bound_time(bound: &[u8]) -> i64 {
    bound.get(1..9).map_or(i64::MIN, |b| (u64::from_be_bytes(b.try_into().expect("8 bytes")) ^ (1 << 63)) as i64)
}

/// The timers of one clock: the store holds them all, `cache` exactly those
/// whose key sorts before `bound` (`None`: all of them).
#[derive(Debug)]
pub(crate) struct TimerQueue {
    domain: TimeDomain,
    cache: BTreeSet<Vec<u8>>,
    bound: Option<Vec<u8>>,
    /// Timers read at a time ([`CACHE_FILL`]; smaller in tests).
    fill: usize,
}

impl TimerQueue {
    /// A queue that has read nothing yet: its first check reads the store.
    pub(crate) fn new(domain: TimeDomain) -> Self {
        TimerQueue { domain, cache: BTreeSet::new(), bound: Some(vec![domain_byte(domain)]), fill: CACHE_FILL }
    }

    /// A queue that holds no timers and never reads the store (no time store).
    pub(crate) fn none(domain: TimeDomain) -> Self {
        TimerQueue { bound: None, ..Self::new(domain) }
    }

    /// A time no pending timer fires before (`i64::MAX`: none pending).
    pub(crate) fn next_due(&self) -> i64 {
        let cached = self.cache.first().map_or(i64::MAX, |k| bound_time(k));
        let stored = self.bound.as_deref().map_or(i64::MAX, bound_time);
        cached.min(stored)
    }

    /// Registers a timer (again: the same key and time is one timer).
    pub(crate) fn register(&mut self, store: &mut KeyValueStore, timestamp: i64, key: &[u8]) -> Result<()> {
        let k = timer_key(self.domain, timestamp, key);
        store.put(&k, &[])?;
        if self.bound.as_ref().is_none_or(|b| k < *b) {
            self.cache.insert(k);
        }
        Ok(())
    }

    /// Deletes a timer; nothing happens if it is not registered.
    pub(crate) fn delete(&mut self, store: &mut KeyValueStore, timestamp: i64, key: &[u8]) -> Result<()> {
        let k = timer_key(self.domain, timestamp, key);
        self.cache.remove(&k);
        store.delete(&k)
    }

    /// Removes and returns the earliest timer due at `now`, if any
    /// (timestamp, key); the removal is a store write like any other.
    pub(crate) fn pop_due(&mut self, store: &mut KeyValueStore, now: i64) -> Result<Option<(i64, Vec<u8>)>> {
        loop {
            if let Some(first) = self.cache.first() {
                if bound_time(first) > now {
                    return Ok(None);
                }
                let k = self.cache.pop_first().expect("non-empty");
                store.delete(&k)?;
                let (_, ts, key) = decode_timer_key(&k).ok_or_else(|| not_a_timer(&k))?;
                return Ok(Some((ts, key.to_vec())));
            }
            match &self.bound {
                Some(b) if bound_time(b) <= now => self.fill(store)?,
                _ => return Ok(None),
            }
        }
    }

    /// Reads the next timers past the bound into the (empty) cache.
    fn fill(&mut self, store: &KeyValueStore) -> Result<()> {
        let Some(from) = &self.bound else { return Ok(()) };
        let end = [domain_byte(self.domain) + 1];
        // Read first, then change the cache and the bound together: a read
        // error leaves the queue as it was.
        let mut read = Vec::new();
        for entry in store.range(from, &end).take(self.fill) {
            let (k, _) = entry?;
            if decode_timer_key(&k).is_none() {
                return Err(not_a_timer(&k));
            }
            read.push(k);
        }
        self.bound = match read.last() {
            // More may follow: the bound is just past the last one read.
            Some(last) if read.len() >= self.fill => Some([last.as_slice(), &[0]].concat()),
            _ => None,
        };
        self.cache.extend(read);
        Ok(())
    }

    /// Every pending timer (timestamp, key), in firing order, read from the store.
    #[cfg(test)]
    pub(crate) fn pending(store: &KeyValueStore, domain: TimeDomain) -> Result<Vec<(i64, Vec<u8>)>> {
        let (from, end) = ([domain_byte(domain)], [domain_byte(domain) + 1]);
        store
            .range(&from, &end)
            .map(|e| {
                let (k, _) = e?;
                let (_, ts, key) = decode_timer_key(&k).ok_or_else(|| not_a_timer(&k))?;
                Ok((ts, key.to_vec()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[derive(Debug, Clone)]
    enum Op {
        Register(i64, u8),
        Delete(i64, u8),
        /// Fire everything due at this time.
        Advance(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Few distinct times: many timers share one, across cache fills.
            3 => (0i64..12, 0u8..6).prop_map(|(t, k)| Op::Register(t, k)),
            1 => (0i64..12, 0u8..6).prop_map(|(t, k)| Op::Delete(t, k)),
            2 => (0i64..14).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Register, delete and advance in any order fire exactly the
        /// model's timers, each once, in (time, key) order, never before
        /// their time; what is left pending is the model's, also in a
        /// queue rebuilt from the store (a restart), and with a cache
        /// smaller than the number of timers.
        #[test]
        fn fires_exactly_the_models_timers_in_order(ops in proptest::collection::vec(op(), 1..120), fill in 1usize..5) {
            let dir = tempfile::tempdir().unwrap();
            let mut store = crate::store::scratch_store(dir.path());
            let mut queue = TimerQueue { fill, ..TimerQueue::new(TimeDomain::StreamTime) };
            let mut model: BTreeSet<(i64, Vec<u8>)> = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Register(t, k) => {
                        queue.register(&mut store, t, &[k]).unwrap();
                        model.insert((t, vec![k]));
                    }
                    Op::Delete(t, k) => {
                        queue.delete(&mut store, t, &[k]).unwrap();
                        model.remove(&(t, vec![k]));
                    }
                    Op::Advance(now) => {
                        let mut fired = Vec::new();
                        while let Some(t) = queue.pop_due(&mut store, now).unwrap() {
                            fired.push(t);
                        }
                        let expected: Vec<(i64, Vec<u8>)> = model.iter().filter(|(t, _)| *t <= now).cloned().collect();
                        model.retain(|(t, _)| *t > now);
                        prop_assert_eq!(fired, expected);
                        let next = model.first().map_or(i64::MAX, |(t, _)| *t);
                        prop_assert!(queue.next_due() <= next, "next_due {} after a timer at {}", queue.next_due(), next);
                    }
                }
                // A new queue over the same store (a restarted task) agrees.
                let pending: Vec<(i64, Vec<u8>)> = model.iter().cloned().collect();
                prop_assert_eq!(TimerQueue::pending(&store, TimeDomain::StreamTime).unwrap(), pending);
            }
            let mut restarted = TimerQueue { fill, ..TimerQueue::new(TimeDomain::StreamTime) };
            let mut fired = Vec::new();
            while let Some(t) = restarted.pop_due(&mut store, i64::MAX).unwrap() {
                fired.push(t);
            }
            prop_assert_eq!(fired, model.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn keys_sort_by_time_then_key() {
        let mut keys = [
            timer_key(TimeDomain::StreamTime, 5, b"b"),
            timer_key(TimeDomain::StreamTime, -3, b"z"),
            timer_key(TimeDomain::StreamTime, 5, b"a"),
            timer_key(TimeDomain::StreamTime, i64::MAX, b""),
            timer_key(TimeDomain::StreamTime, i64::MIN, b"q"),
            timer_key(TimeDomain::StreamTime, 0, b""),
        ];
        keys.sort();
        let decoded: Vec<(i64, &[u8])> = keys.iter().map(|k| decode_timer_key(k).map(|(_, t, k)| (t, k)).unwrap()).collect();
        assert_eq!(
            decoded,
            vec![(i64::MIN, &b"q"[..]), (-3, b"z"), (0, b""), (5, b"a"), (5, b"b"), (i64::MAX, b"")]
        );
        assert!(timer_key(TimeDomain::StreamTime, i64::MAX, b"\xff") < vec![2]);
    }
}
