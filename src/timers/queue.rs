//! One clock's timers of one task (architecture.md §6). A timer's key is
//! `ts ++ key` (the time as 8 big-endian bytes, sign bit flipped, so keys
//! sort by time, then key). Timers are stored in the task's time store in
//! *segments*: the timers registered during one commit period that fall
//! into one page of time (`PAGE_MS`) are written as one record at the
//! commit, so a commit writes a few records, not one per timer. Firing
//! moves a watermark (every segment timer up to it has fired, written at
//! the commit) and deletes a segment once all its timers have fired. A
//! timer registered at or below the watermark (already due) is stored on
//! its own; a deleted timer that may sit in a stored segment gets a marker.
//! The pages up to a bound are loaded in memory, so checking and firing
//! timers costs no RocksDB read per record.
//!
//! Time store keys (`d`: 1 stream time, 2 wall clock):
//!
//! | key | value |
//! |---|---|
//! | `d ++ page (8) ++ seq (8)` | a segment: its timer keys, sorted, each `ts (8) ++ len (4) ++ key` |
//! | `d + 2 ++ ts ++ key` | a timer registered at or below the watermark (empty) |
//! | `d + 4 ++ ts ++ key` | a deletion marker (`[1]` once taken off the count, else empty) |
//! | `\x00fired-d` | the watermark: the last segment timer fired (`ts ++ key`) |
//! | `\x00seq-d` | the next segment number (8 bytes) |
//! | `\x00count-d` | pending timers, an estimate for the metric (8 bytes) |

use std::collections::{BTreeMap, BTreeSet};

use super::keys::Keys;
use super::loaded::Loaded;
use crate::error::{Error, Result};
use crate::store::KeyValueStore;
use crate::time::TimeDomain;

/// The span of time one page covers.
const PAGE_MS: u64 = 1_000;
/// The largest segment value written; more timers of a page in one commit
/// make several segments.
const SEGMENT_BYTES: usize = 128 << 10;

pub(crate) fn domain_byte(domain: TimeDomain) -> u8 {
    match domain {
        TimeDomain::StreamTime => 1,
        TimeDomain::WallClock => 2,
    }
}

fn flip(ts: i64) -> u64 {
    (ts as u64) ^ (1 << 63)
}

fn unflip(f: u64) -> i64 {
    (f ^ (1 << 63)) as i64
}

/// A timer's key: `ts ++ key`.
pub(crate) fn timer_key(timestamp: i64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    k.extend_from_slice(&flip(timestamp).to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// A timer key's time as it sorts (its first 8 bytes, big-endian, sign
/// bit flipped).
pub(super) fn time_of(tk: &[u8]) -> u64 {
    u64::from_be_bytes(tk[..8].try_into().expect("a timer key has 8 bytes of time"))
}

/// The time and key of a timer key.
pub(crate) fn split_timer_key(tk: &[u8]) -> (i64, &[u8]) {
    (unflip(time_of(tk)), &tk[8..])
}

fn page_of(tk: &[u8]) -> u64 {
    time_of(tk) / PAGE_MS
}

/// The earliest time of a page.
fn page_start(page: u64) -> i64 {
    unflip(page.saturating_mul(PAGE_MS))
}

fn segment_key(d: u8, page: u64, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(d);
    k.extend_from_slice(&page.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn prefixed(prefix: u8, tk: &[u8]) -> Vec<u8> {
    [&[prefix][..], tk].concat()
}

pub(crate) fn watermark_key(d: u8) -> Vec<u8> {
    [&b"\x00fired-"[..], &[b'0' + d]].concat()
}

fn seq_key(d: u8) -> Vec<u8> {
    [&b"\x00seq-"[..], &[b'0' + d]].concat()
}

/// The largest segment value a store takes: [`SEGMENT_BYTES`], or less
/// if its changelog's records must be smaller.
fn segment_cap(store: &KeyValueStore) -> usize {
    SEGMENT_BYTES.min(store.max_record_bytes().saturating_sub(crate::kafka::RECORD_OVERHEAD + 17))
}

fn count_key(d: u8) -> Vec<u8> {
    [&b"\x00count-"[..], &[b'0' + d]].concat()
}

fn damaged(what: &str, k: &[u8]) -> Error {
    Error::Codec { codec: "time store", source: format!("{what}: {k:02x?}").into() }
}

/// The timer keys of a segment value.
pub(crate) fn decode_segment(v: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut rest = v;
    while !rest.is_empty() {
        let len = rest.get(8..12).map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize);
        let Some(entry) = len.and_then(|len| rest.get(..len.checked_add(12)?)) else {
            return Err(damaged("a segment cut short", &rest[..rest.len().min(16)]));
        };
        out.push([&entry[..8], &entry[12..]].concat());
        rest = &rest[entry.len()..];
    }
    Ok(out)
}

fn encode_entry(out: &mut Vec<u8>, tk: &[u8]) {
    out.extend_from_slice(&tk[..8]);
    out.extend_from_slice(&((tk.len() - 8) as u32).to_be_bytes());
    out.extend_from_slice(&tk[8..]);
}

/// The page of a segment key.
pub(crate) fn segment_page(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(k.get(1..9)?.try_into().ok()?)).filter(|_| k.len() == 17)
}

/// One clock's timers of one task.
#[derive(Debug)]
pub(crate) struct TimerQueue {
    d: u8,
    /// The live timers of every page below `loaded_until` (stored,
    /// pending, not fired, not deleted).
    loaded: Loaded,
    /// Pages below it are in `loaded`; `None`: every page is.
    loaded_until: Option<u64>,
    /// Timers registered since the last commit, by page: the next segments
    /// (unsorted; the ones fired meanwhile are dropped when written).
    pending: BTreeMap<u64, Keys>,
    /// Timers registered at or below the watermark, each stored on its own.
    late: BTreeSet<Vec<u8>>,
    /// Deleted timers that may sit in a stored segment.
    /// (With whether the deletion was taken off `count` already.)
    markers: BTreeMap<Vec<u8>, bool>,
    /// Every segment timer up to it has fired.
    fired: Option<Vec<u8>>,
    persisted_fired: Option<Vec<u8>>,
    /// The stored segments of loaded pages, by their largest timer key:
    /// deleted once the watermark passes it.
    segments: BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
    next_seq: u64,
    persisted_seq: u64,
    /// Pending timers, an estimate kept in the store (`kstate_timers_pending`):
    /// exact but for a timer registered again while its page is not in
    /// memory (counted twice until every page is in memory).
    count: i64,
    persisted_count: i64,
    /// A buffer for the timer key being registered.
    scratch: Vec<u8>,
}

impl TimerQueue {
    /// A queue that must [`load`](Self::load) from its store before use.
    pub(crate) fn new(domain: TimeDomain) -> Self {
        TimerQueue {
            d: domain_byte(domain),
            loaded: Loaded::default(),
            loaded_until: Some(0),
            pending: BTreeMap::new(),
            late: BTreeSet::new(),
            markers: BTreeMap::new(),
            fired: None,
            persisted_fired: None,
            segments: BTreeMap::new(),
            next_seq: 0,
            persisted_seq: 0,
            count: 0,
            persisted_count: 0,
            scratch: Vec::new(),
        }
    }

    /// A queue that holds no timers and never reads a store (no time store).
    pub(crate) fn none(domain: TimeDomain) -> Self {
        TimerQueue { loaded_until: None, ..Self::new(domain) }
    }

    /// Reads the watermark, the segment number, the timers stored on their
    /// own and the deletion markers (pages are read as they are needed).
    pub(crate) fn load(&mut self, store: &KeyValueStore) -> Result<()> {
        *self = TimerQueue::new(if self.d == 1 { TimeDomain::StreamTime } else { TimeDomain::WallClock });
        self.fired = match store.get(&watermark_key(self.d))? {
            Some(w) if w.len() < 8 => return Err(damaged("a watermark", &w)),
            w => w,
        };
        self.persisted_fired = self.fired.clone();
        if let Some(v) = store.get(&seq_key(self.d))? {
            self.next_seq = u64::from_be_bytes(v.as_slice().try_into().map_err(|_| damaged("a segment number", &v))?);
            self.persisted_seq = self.next_seq;
        }
        if let Some(v) = store.get(&count_key(self.d))? {
            self.count = i64::from_be_bytes(v.as_slice().try_into().map_err(|_| damaged("a timer count", &v))?);
            self.persisted_count = self.count;
        }
        for prefix in [self.d + 2, self.d + 4] {
            for entry in store.range(&[prefix], &[prefix + 1]) {
                let (k, v) = entry?;
                if k.len() < 9 {
                    return Err(damaged("a timer key", &k));
                }
                if prefix == self.d + 2 {
                    self.late.insert(k[1..].to_vec());
                } else {
                    self.markers.insert(k[1..].to_vec(), !v.is_empty());
                }
            }
        }
        Ok(())
    }

    /// Pending timers (see the `count` field).
    pub(crate) fn count(&self) -> i64 {
        self.count
    }

    /// A time no pending timer fires before (`i64::MAX`: none pending).
    pub(crate) fn next_due(&self) -> i64 {
        let loaded = match (self.loaded.first_time(), self.loaded_until) {
            (Some(t), _) => unflip(t),
            (None, Some(page)) => page_start(page),
            (None, None) => i64::MAX,
        };
        let late = self.late.first().map_or(i64::MAX, |tk| split_timer_key(tk).0);
        loaded.min(late)
    }

    fn passed(&self, tk: &[u8]) -> bool {
        self.fired.as_deref().is_some_and(|w| tk <= w)
    }

    /// Registers a timer (again: the same key and time is one timer).
    pub(crate) fn register(&mut self, store: &mut KeyValueStore, timestamp: i64, key: &[u8]) -> Result<()> {
        if 12 + key.len() > segment_cap(store) {
            return Err(Error::RecordTooLarge {
                store: store.name().to_string(),
                size: 12 + key.len() + 17 + crate::kafka::RECORD_OVERHEAD,
                limit: store.max_record_bytes(),
            });
        }
        // Built in a buffer kept for it: no allocation per timer.
        let mut tk = std::mem::take(&mut self.scratch);
        tk.clear();
        tk.extend_from_slice(&flip(timestamp).to_be_bytes());
        tk.extend_from_slice(key);
        let registered = self.register_key(store, &tk);
        self.scratch = tk;
        registered
    }

    fn register_key(&mut self, store: &mut KeyValueStore, tk: &[u8]) -> Result<()> {
        if self.passed(tk) {
            store.put(&prefixed(self.d + 2, tk), &[])?;
            if self.late.insert(tk.to_vec()) {
                self.count += 1;
            }
            return Ok(());
        }
        if !self.markers.is_empty() && self.markers.remove(tk).is_some() {
            store.delete(&prefixed(self.d + 4, tk))?;
        }
        let page = page_of(tk);
        if self.loaded_until.is_none_or(|until| page < until) {
            if self.loaded.insert(tk) {
                self.count += 1;
            }
        } else {
            self.count += 1; // (it may be there already: see `count`)
        }
        self.pending.entry(page).or_default().push(tk);
        Ok(())
    }

    /// Deletes a timer; nothing happens if it is not registered.
    pub(crate) fn delete(&mut self, store: &mut KeyValueStore, timestamp: i64, key: &[u8]) -> Result<()> {
        let tk = timer_key(timestamp, key);
        if self.late.remove(&tk) {
            self.count -= 1;
            return store.delete(&prefixed(self.d + 2, &tk));
        }
        if self.passed(&tk) {
            return Ok(()); // fired already, or never registered
        }
        let page = page_of(&tk);
        let was_loaded = self.loaded.remove(tk.as_slice());
        let mut was_pending = false;
        if let Some(timers) = self.pending.get_mut(&page) {
            let before = timers.len();
            timers.retain(|t| t != tk);
            was_pending = timers.len() < before;
        }
        if was_loaded || was_pending {
            self.count -= 1;
        }
        if self.loaded_until.is_none_or(|until| page < until) && !was_loaded {
            return Ok(()); // its page is loaded and it is not there: not registered
        }
        // It may also sit in a stored segment.
        let counted = was_loaded || was_pending;
        if self.markers.get(&tk) != Some(&true) {
            self.markers.insert(tk.clone(), counted);
            store.put(&prefixed(self.d + 4, &tk), if counted { &[1] } else { &[] })?;
        }
        Ok(())
    }

    /// Removes and returns the earliest timer due at `now`, if any
    /// (timestamp, key); what records the removal is written to the store
    /// like any other write.
    pub(crate) fn pop_due(&mut self, store: &mut KeyValueStore, now: i64) -> Result<Option<(i64, Vec<u8>)>> {
        loop {
            let late = self.late.first().map(|tk| split_timer_key(tk).0);
            if self.loaded.is_empty() {
                if let Some(page) = self.loaded_until {
                    if page_start(page) <= now.min(late.unwrap_or(i64::MAX)) {
                        self.fill(store, page)?;
                        continue;
                    }
                }
            }
            let segment = self.loaded.first_time().map(unflip);
            // (A late timer is at or below the watermark, every loaded one above it.)
            let take_late = match (self.late.first(), self.loaded.first()) {
                (Some(l), Some(s)) => l.as_slice() < s,
                (Some(_), None) => true,
                _ => false,
            };
            if take_late {
                if late.is_some_and(|l| l > now) {
                    return Ok(None);
                }
                let tk = self.late.pop_first().expect("checked");
                self.count -= 1;
                store.delete(&prefixed(self.d + 2, &tk))?;
                let (ts, key) = split_timer_key(&tk);
                return Ok(Some((ts, key.to_vec())));
            }
            match segment {
                Some(ts) if ts <= now => {}
                _ => return Ok(None),
            }
            // The watermark's buffer takes the timer.
            let mut tk = self.fired.take().unwrap_or_default();
            self.loaded.pop_first_into(&mut tk);
            let (ts, key) = split_timer_key(&tk);
            let fired = (ts, key.to_vec());
            self.count -= 1;
            self.fired = Some(tk);
            self.drop_passed(store)?;
            return Ok(Some(fired));
        }
    }

    /// Deletes the segments and markers the watermark passed.
    fn drop_passed(&mut self, store: &mut KeyValueStore) -> Result<()> {
        let Some(w) = self.fired.as_deref() else { return Ok(()) };
        while self.segments.first_key_value().is_some_and(|(max, _)| max.as_slice() <= w) {
            for k in self.segments.pop_first().expect("checked").1 {
                store.delete(&k)?;
            }
        }
        while self.markers.first_key_value().is_some_and(|(m, _)| m.as_slice() <= w) {
            let (m, _) = self.markers.pop_first().expect("checked");
            store.delete(&prefixed(self.d + 4, &m))?;
        }
        Ok(())
    }

    /// Moves the watermark over what is dead: every segment timer and
    /// marker of the loaded pages below the first live timer has fired or
    /// was deleted (the loaded pages' live timers are all in `loaded`), so
    /// the watermark may pass the last of them, and their segments and
    /// markers go, even when nothing fires (timers deleted and registered
    /// again, never due).
    fn pass_dead(&mut self, store: &mut KeyValueStore) -> Result<()> {
        let bound: Option<Vec<u8>> = match (self.loaded.first(), self.loaded_until) {
            (Some(tk), _) => Some(tk.to_vec()),
            (None, Some(page)) => Some(page.saturating_mul(PAGE_MS).to_be_bytes().to_vec()),
            (None, None) => None, // nothing live in any page
        };
        let below = |k: &Vec<u8>| bound.as_ref().is_none_or(|b| k < b);
        let dead_segment = self.segments.keys().rev().find(|k| below(k)).cloned();
        let dead_marker = self.markers.keys().rev().find(|k| below(k)).cloned();
        let Some(last) = dead_segment.max(dead_marker) else { return Ok(()) };
        if self.fired.as_deref().is_none_or(|w| last.as_slice() > w) {
            self.fired = Some(last);
        }
        if self.loaded_until.is_none() {
            // Every page is in memory: the count is exact again.
            self.count = (self.loaded.len() + self.late.len()) as i64;
        }
        self.drop_passed(store)
    }

    /// The pending timers of `page` still to be written: sorted, once
    /// each, above the watermark.
    fn live_pending(&mut self, page: u64) -> &Keys {
        let timers = self.pending.entry(page).or_default();
        timers.settle(self.fired.as_deref());
        timers
    }

    /// Loads the first page at or after `from` that holds timers (stored
    /// or pending); with none left, every page is loaded.
    fn fill(&mut self, store: &mut KeyValueStore, from: u64) -> Result<()> {
        let mut stored_page = None;
        let mut read = Vec::new();
        for entry in store.range(&segment_key(self.d, from, 0), &[self.d + 1]) {
            let (k, v) = entry?;
            let page = segment_page(&k).ok_or_else(|| damaged("a segment key", &k))?;
            if stored_page.is_some_and(|p| p != page) {
                break;
            }
            stored_page = Some(page);
            read.push((k, decode_segment(&v)?));
        }
        let pages: Vec<u64> = self.pending.range(from..).map(|(p, _)| *p).collect();
        let mut pending_page = None;
        for p in pages {
            if stored_page.is_some_and(|s| s <= p) {
                break;
            }
            if !self.live_pending(p).is_empty() {
                pending_page = Some(p);
                break;
            }
        }
        let page = match (stored_page, pending_page) {
            (Some(s), Some(p)) => s.min(p),
            (s, p) => match s.or(p) {
                Some(page) => page,
                None => {
                    self.loaded_until = None;
                    return Ok(());
                }
            },
        };
        if stored_page == Some(page) {
            for (k, timers) in read {
                let max = timers.last().cloned().unwrap_or_default();
                if self.passed(&max) {
                    store.delete(&k)?; // fired in full already
                    continue;
                }
                self.segments.entry(max).or_default().push(k);
                for tk in timers {
                    if self.passed(&tk) {
                        continue;
                    }
                    match self.markers.get_mut(&tk) {
                        None => {
                            self.loaded.insert(&tk);
                        }
                        Some(counted) => {
                            // Deleted while its page was not in memory: off the count now, once.
                            if !*counted {
                                *counted = true;
                                self.count -= 1;
                                store.put(&prefixed(self.d + 4, &tk), &[1])?;
                            }
                        }
                    }
                }
            }
        }
        self.live_pending(page);
        for tk in self.pending.get(&page).into_iter().flat_map(Keys::iter) {
            self.loaded.insert(tk);
        }
        self.loaded_until = Some(page + 1);
        Ok(())
    }

    /// Writes one segment of `page` whose largest timer is `last`.
    fn write_segment(&mut self, store: &mut KeyValueStore, page: u64, value: &[u8], last: &[u8]) -> Result<()> {
        let k = segment_key(self.d, page, self.next_seq);
        self.next_seq += 1;
        store.put(&k, value)?;
        if self.loaded_until.is_none_or(|until| page < until) {
            self.segments.entry(last.to_vec()).or_default().push(k);
        }
        Ok(())
    }

    /// Writes what changed since the last commit: the timers registered
    /// meanwhile as segments, the watermark, the segment number. Runs
    /// before the task's stores are sealed for a commit.
    pub(crate) fn persist(&mut self, store: &mut KeyValueStore) -> Result<()> {
        let cap = segment_cap(store);
        for (page, mut timers) in std::mem::take(&mut self.pending) {
            timers.settle(self.fired.as_deref());
            let mut value = Vec::new();
            let mut last: Option<&[u8]> = None;
            for tk in timers.iter() {
                if !value.is_empty() && value.len() + 4 + tk.len() > cap {
                    self.write_segment(store, page, &value, last.expect("written one"))?;
                    value.clear();
                }
                encode_entry(&mut value, tk);
                last = Some(tk);
            }
            if let Some(last) = last {
                self.write_segment(store, page, &value, last)?;
            }
        }
        self.pass_dead(store)?;
        self.count = self.count.max(0);
        if self.count != self.persisted_count {
            store.put(&count_key(self.d), &self.count.to_be_bytes())?;
            self.persisted_count = self.count;
        }
        if self.next_seq != self.persisted_seq {
            store.put(&seq_key(self.d), &self.next_seq.to_be_bytes())?;
            self.persisted_seq = self.next_seq;
        }
        if self.fired != self.persisted_fired {
            if let Some(w) = &self.fired {
                store.put(&watermark_key(self.d), w)?;
            }
            self.persisted_fired = self.fired.clone();
        }
        Ok(())
    }
}

/// Every live timer of one clock in a time store's entries (in key order),
/// as `ts ++ key`: segment timers above the watermark and not deleted,
/// and the timers stored on their own (for `kstate inspect` and tests).
pub(crate) fn live_timers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    entries: impl Iterator<Item = Result<(K, V)>>,
    domain: TimeDomain,
) -> Result<BTreeSet<Vec<u8>>> {
    let d = domain_byte(domain);
    let (mut fired, mut segments, mut late, mut markers) = (None, BTreeSet::new(), Vec::new(), Vec::new());
    for entry in entries {
        let (k, v) = entry?;
        let (k, v) = (k.as_ref(), v.as_ref());
        match k.first() {
            Some(0) if k == watermark_key(d).as_slice() => fired = Some(v.to_vec()),
            Some(&b) if b == d => segments.extend(decode_segment(v)?),
            Some(&b) if b == d + 2 && k.len() >= 9 => late.push(k[1..].to_vec()),
            Some(&b) if b == d + 4 && k.len() >= 9 => markers.push(k[1..].to_vec()),
            _ => {}
        }
    }
    if let Some(w) = fired {
        segments.retain(|tk| *tk > w);
    }
    for m in markers {
        segments.remove(&m);
    }
    segments.extend(late);
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_sort_by_time_then_key() {
        let mut keys = [
            timer_key(5, b"b"),
            timer_key(-3, b"z"),
            timer_key(5, b"a"),
            timer_key(i64::MAX, b""),
            timer_key(i64::MIN, b"q"),
            timer_key(0, b""),
        ];
        keys.sort();
        let decoded: Vec<(i64, &[u8])> = keys.iter().map(|k| split_timer_key(k)).collect();
        assert_eq!(decoded, vec![(i64::MIN, &b"q"[..]), (-3, b"z"), (0, b""), (5, b"a"), (5, b"b"), (i64::MAX, b"")]);
        assert!(page_start(page_of(&timer_key(-1_500, b""))) <= -1_500);
        assert!(page_start(page_of(&timer_key(i64::MAX, b""))) > i64::MAX - 1_000);
        assert_eq!(page_start(page_of(&timer_key(i64::MIN, b""))), i64::MIN);
    }

    /// An empty scratch store (in a directory removed on drop) and a
    /// stream-time queue loaded from it.
    fn fresh() -> (tempfile::TempDir, KeyValueStore, TimerQueue) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::scratch_store(dir.path());
        let mut queue = TimerQueue::new(TimeDomain::StreamTime);
        queue.load(&store).unwrap();
        (dir, store, queue)
    }

    /// A watchdog: each step deletes the key's timer before it is due and
    /// registers it again further ahead; nothing ever fires. What the
    /// deleted timers leave in the store (segments, markers) must not pile
    /// up as time passes them.
    #[test]
    fn timers_deleted_before_they_fire_leave_nothing_behind_as_time_passes() {
        let (_dir, mut store, mut queue) = fresh();
        queue.register(&mut store, 30_000, b"k").unwrap();
        queue.persist(&mut store).unwrap();
        for i in 0..50i64 {
            let due = 30_000 + 10_000 * i;
            assert_eq!(queue.pop_due(&mut store, due - 20_000).unwrap(), None, "nothing is due at step {i}");
            queue.delete(&mut store, due, b"k").unwrap();
            queue.register(&mut store, due + 10_000, b"k").unwrap();
            queue.persist(&mut store).unwrap();
        }
        let records = store.all().filter(|e| e.as_ref().unwrap().0[0] != 0).count();
        assert!(records <= 6, "{records} segment and marker records after 50 steps");
        assert_eq!(live(&store), vec![(30_000 + 10_000 * 50, b"k".to_vec())]);
        // Deletions in pages not read yet are counted when their page is read.
        assert!(queue.count() <= 3, "count {}", queue.count());
        assert_eq!(queue.pop_due(&mut store, 30_000 + 10_000 * 50 - 1).unwrap(), None);
        assert_eq!(queue.count(), 1, "the estimate is exact once the pages are read");
    }

    #[test]
    fn segments_stay_under_the_record_limit_and_a_key_too_large_is_refused() {
        let (_dir, mut store, mut queue) = fresh();
        let huge = vec![b'x'; 200 << 10];
        assert!(matches!(queue.register(&mut store, 5, &huge), Err(Error::RecordTooLarge { .. })));
        for i in 0..20_000u32 {
            queue.register(&mut store, 500, format!("key-{i:011}").as_bytes()).unwrap();
        }
        queue.persist(&mut store).unwrap();
        let segments: Vec<usize> = store.all().map(|e| e.unwrap()).filter(|(k, _)| k[0] == 1).map(|(_, v)| v.len()).collect();
        assert!(segments.len() > 1 && segments.iter().all(|&n| n <= SEGMENT_BYTES), "{segments:?}");
        assert_eq!(live(&store).len(), 20_000);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Register(i64, u8),
        Delete(i64, u8),
        /// Fire everything due at this time.
        Advance(i64),
        /// A commit: what changed is written.
        Persist,
        /// A commit, then the task starts again from its store.
        Restart,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Times across a few pages, many timers sharing one.
            4 => (0i64..4_000, 0u8..6).prop_map(|(t, k)| Op::Register(t - t % 250, k)),
            1 => (0i64..4_000, 0u8..6).prop_map(|(t, k)| Op::Delete(t - t % 250, k)),
            2 => (0i64..4_500).prop_map(Op::Advance),
            1 => Just(Op::Persist),
            1 => Just(Op::Restart),
        ]
    }

    fn live(store: &KeyValueStore) -> Vec<(i64, Vec<u8>)> {
        live_timers(store.all(), TimeDomain::StreamTime)
            .unwrap()
            .iter()
            .map(|tk| {
                let (t, k) = split_timer_key(tk);
                (t, k.to_vec())
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Register, delete, advance, commit and restart in any order fire
        /// exactly the model's timers, each once, in (time, key) order,
        /// never before their time; after a commit the store holds exactly
        /// the model's pending timers.
        #[test]
        fn fires_exactly_the_models_timers_in_order(ops in proptest::collection::vec(op(), 1..150)) {
            let (_dir, mut store, mut queue) = fresh();
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
                    Op::Persist => {
                        queue.persist(&mut store).unwrap();
                        prop_assert_eq!(live(&store), model.iter().cloned().collect::<Vec<_>>());
                        prop_assert!(queue.count() >= model.len() as i64, "count {} < {}", queue.count(), model.len());
                    }
                    Op::Restart => {
                        queue.persist(&mut store).unwrap();
                        queue = TimerQueue::new(TimeDomain::StreamTime);
                        queue.load(&store).unwrap();
                    }
                }
            }
            let mut fired = Vec::new();
            while let Some(t) = queue.pop_due(&mut store, i64::MAX).unwrap() {
                fired.push(t);
            }
            prop_assert_eq!(fired, model.into_iter().collect::<Vec<_>>());
            queue.persist(&mut store).unwrap();
            prop_assert!(live(&store).is_empty());
            // Nothing left behind: no segment, late timer or marker.
            let left: Vec<Vec<u8>> = store.all().map(|e| e.unwrap().0).filter(|k| k[0] != 0).collect();
            prop_assert!(left.is_empty(), "left in the store: {:02x?}", left);
        }
    }
}
