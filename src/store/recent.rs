//! The read cache: values of a store partition's recently landed commits,
//! kept in memory for point reads (docs/architecture.md §20).
//!
//! A read that misses the uncommitted writes went to RocksDB. An aggregate
//! (a count, a sum) reads each key back soon after its last commit landed,
//! and that `Get` (a memtable search and a copy) was the largest cost of
//! its processing thread. A landed commit's writes are exactly what RocksDB
//! now holds for their keys, so they are kept here instead of dropped, and
//! a `get` finds them before it asks RocksDB (Kafka Streams' record cache
//! plays the same part).
//!
//! The cache must never disagree with RocksDB: it is filled only by landed
//! commits and emptied whenever RocksDB is written any other way (a
//! restore, a standby's apply, a wipe, discarded writes whose commit may
//! have landed). Window and session stores do not use it (their commits
//! drop whole segments beside the writes), nor in-memory stores (their
//! reads are a map lookup already).
//!
//! One budget bounds every store partition's cache together
//! (`AppBuilder::read_cache_bytes`). A landed commit that does not fit
//! empties its own store partition's cache first and, if it still does not
//! fit, is not kept.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::store::overlay::Overlay;
use crate::store::KeyValueStore;

impl KeyValueStore {
    /// Reads ahead the keys of `keys` that only the engine holds (a
    /// remote store reads them concurrently; other engines do nothing) and
    /// keeps what they hold in the read cache, so that the batch's reads
    /// do not ask the engine again. Correct until the engine changes: a
    /// landed commit overwrites its keys here, any other change empties
    /// the cache, and keys with writes not yet landed are not read. A
    /// key-value store's keys only.
    pub(crate) fn prefetch<'k>(&mut self, keys: impl Iterator<Item = &'k [u8]>) {
        if self.segments.is_some() || !self.engine().is_remote() {
            return;
        }
        let wanted: Vec<Vec<u8>> = keys
            .filter(|k| self.overlay.get(k).is_none() && self.sealed.get(k).is_none() && self.recent.get(k).is_none())
            .map(<[u8]>::to_vec)
            .collect();
        let read = self.engine().prefetch(wanted);
        if read.is_empty() {
            return;
        }
        let mut held = Overlay::default();
        for (k, v) in &read {
            held.write(k, v.as_deref());
        }
        self.recent.landed(&held);
        self.metrics.read_cache_bytes.set(self.recent.bytes() as f64);
    }

    /// A commit's `writes` landed in RocksDB (`written`: its landing was
    /// recorded): the read cache keeps them.
    pub(super) fn remember_landed(&mut self, writes: &Overlay, written: bool) {
        if !written {
            // (No caller lands writes that were not written; should one,
            // the cache must not hold them.)
            if !writes.is_empty() {
                self.forget_recent();
            }
        } else if self.segments.is_none() && self.backend != crate::store::StoreBackend::InMemory {
            self.recent.landed(writes);
            self.metrics.read_cache_bytes.set(self.recent.bytes() as f64);
        }
    }

    /// Empties the read cache: RocksDB is written another way than by a
    /// landed commit (a restore, a standby, a wipe).
    pub(crate) fn forget_recent(&mut self) {
        if self.recent.bytes() > 0 {
            self.recent.forget();
            self.metrics.read_cache_bytes.set(0.0);
        }
    }
}

/// The bytes all read caches of this instance may hold together.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget { limit, used: AtomicUsize::new(0) }
    }

    /// Bytes held by every read cache now.
    #[cfg(test)]
    fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if they fit under the limit.
    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| used.checked_add(bytes).filter(|&u| u <= self.limit))
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Takes `bytes` whether or not they fit.
    fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }
}

impl Default for Budget {
    fn default() -> Budget {
        Budget::new(DEFAULT_BYTES)
    }
}

/// `AppBuilder::read_cache_bytes`' default.
pub(crate) const DEFAULT_BYTES: usize = 16 << 20;

/// One store partition's read cache: the latest landed write of each key it
/// holds (a delete included: the key is known to be absent).
#[derive(Debug)]
pub(crate) struct Recent {
    /// What it holds; its bytes are what it has taken from the budget.
    entries: Overlay,
    budget: Arc<Budget>,
}

impl Recent {
    pub(crate) fn new(budget: Arc<Budget>) -> Recent {
        Recent { entries: Overlay::default(), budget }
    }

    /// `None`: not cached; `Some(None)`: absent; `Some(Some(v))`: RocksDB holds `v`.
    #[inline]
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.entries.get(key)
    }

    /// `writes` are what the engine holds now (a landed commit's writes,
    /// or values read ahead): keeps them, within the budget.
    pub(crate) fn landed(&mut self, writes: &Overlay) {
        if writes.is_empty() {
            return;
        }
        // At most what the writes hold in their own overlay: an overwrite
        // here takes no more room than the write took there.
        let growth = writes.bytes();
        if !self.budget.take(growth) {
            self.forget();
            if !self.budget.take(growth) {
                return;
            }
        }
        let before = self.entries.bytes();
        for (k, v) in writes.iter() {
            self.entries.write(k, v);
        }
        // Give back what the overwrites did not use (`growth` bounds what
        // the writes add; should it not, the excess is charged, so that
        // the budget always holds exactly the caches' bytes).
        let (taken, held) = (before + growth, self.entries.bytes());
        match held.cmp(&taken) {
            std::cmp::Ordering::Less => self.budget.give_back(taken - held),
            std::cmp::Ordering::Greater => self.budget.charge(held - taken),
            std::cmp::Ordering::Equal => {}
        }
    }

    /// Empties the cache: RocksDB is about to change another way, or did.
    pub(crate) fn forget(&mut self) {
        self.budget.give_back(self.entries.bytes());
        self.entries.clear();
    }

    /// Bytes this cache holds (taken from the budget).
    pub(crate) fn bytes(&self) -> usize {
        self.entries.bytes()
    }
}

impl Drop for Recent {
    fn drop(&mut self) {
        self.forget();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(entries: &[(&str, Option<&str>)]) -> Overlay {
        let mut o = Overlay::default();
        for (k, v) in entries {
            o.write(k.as_bytes(), v.map(str::as_bytes));
        }
        o
    }

    #[test]
    fn keeps_the_latest_landed_write_of_each_key_deletes_included() {
        let budget = Arc::new(Budget::new(1 << 20));
        let mut r = Recent::new(budget.clone());
        assert_eq!(r.get(b"a"), None);
        r.landed(&writes(&[("a", Some("1")), ("b", Some("2"))]));
        r.landed(&writes(&[("a", Some("3")), ("b", None)]));
        assert_eq!(r.get(b"a"), Some(Some(&b"3"[..])));
        assert_eq!(r.get(b"b"), Some(None));
        assert_eq!(r.get(b"c"), None);
        assert_eq!(budget.used(), r.bytes());
        r.forget();
        assert_eq!(r.get(b"a"), None);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn one_budget_bounds_every_cache_and_a_commit_that_does_not_fit_empties_its_own() {
        let one = writes(&[("x1", Some("0123456789"))]).bytes();
        let budget = Arc::new(Budget::new(3 * one));
        let (mut x, mut y) = (Recent::new(budget.clone()), Recent::new(budget.clone()));
        x.landed(&writes(&[("x1", Some("0123456789"))]));
        x.landed(&writes(&[("x2", Some("0123456789"))]));
        y.landed(&writes(&[("y1", Some("0123456789"))]));
        assert!(budget.used() <= 3 * one);
        // y's next commit does not fit: y forgets its own and keeps the new one; x keeps its.
        y.landed(&writes(&[("y2", Some("0123456789"))]));
        assert_eq!(y.get(b"y1"), None);
        assert!(y.get(b"y2").is_some());
        assert!(x.get(b"x1").is_some() && x.get(b"x2").is_some());
        // A commit larger than the whole budget is not kept.
        let big: Vec<(String, Option<&str>)> = (0..10).map(|i| (format!("b{i}"), Some("0123456789"))).collect();
        let big: Vec<(&str, Option<&str>)> = big.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        x.landed(&writes(&big));
        assert_eq!(x.get(b"b0"), None);
        assert_eq!(x.get(b"x1"), None, "it emptied its own first");
        drop(y);
        assert_eq!(budget.used(), 0);
    }
}
