//! A restore batch that reaches RocksDB sorted by key, last write per key only.
//!
//! Changelog order is random key order, and inserting random keys into
//! RocksDB's skiplist memtable dominated restore time (measured:
//! `InlineSkipList::RecomputeSpliceLevels` was the top symbol). Sorting a
//! batch first lets the memtable insert along one splice, and dropping
//! superseded writes to the same key saves inserts altogether. Within a
//! batch the last write of a key wins, exactly as replaying it in order would.

use rocksdb::WriteBatch;

use crate::store::key_prefix;

/// How many entries ahead `drain_sorted` prefetches.
const PREFETCH_AHEAD: usize = 8;

/// Hints the CPU to load the cache lines of `bytes` (at most two: a key and
/// the start of its value behind it). Not a read: it never faults.
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = bytes.as_ptr() as *const i8;
        // SAFETY: prefetching is a hint; it neither reads nor faults, and
        // both addresses are within or one line past a live slice.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Where one record's key and value sit in the arena.
struct Entry {
    key: (u32, u32),
    /// `None`: a tombstone.
    value: Option<(u32, u32)>,
}

/// Accumulates changelog records in one byte arena.
#[derive(Default)]
pub(crate) struct SortedBatch {
    arena: Vec<u8>,
    entries: Vec<Entry>,
}

impl SortedBatch {
    /// Appends a put (`Some`) or delete (`None`) of the key made of `key_parts`.
    pub(crate) fn push(&mut self, key_parts: &[&[u8]], value: Option<&[u8]>) {
        let start = self.arena.len() as u32;
        for part in key_parts {
            self.arena.extend_from_slice(part);
        }
        let key_at = (start, self.arena.len() as u32 - start);
        let value_at = value.map(|v| self.append(v));
        self.entries.push(Entry { key: key_at, value: value_at });
    }

    fn append(&mut self, bytes: &[u8]) -> (u32, u32) {
        let start = self.arena.len() as u32;
        self.arena.extend_from_slice(bytes);
        (start, bytes.len() as u32)
    }

    fn slice(&self, (start, len): (u32, u32)) -> &[u8] {
        &self.arena[start as usize..(start + len) as usize]
    }

    /// Drops every record pushed (keeps the memory).
    pub(crate) fn clear(&mut self) {
        self.arena.clear();
        self.entries.clear();
    }

    /// Records pushed (including superseded ones).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.arena.len()
    }

    /// Sorts by key (stable, so pushes of one key stay in order), keeps the
    /// last write per key, and returns the RocksDB batch; empties `self`.
    pub(crate) fn take_sorted(&mut self) -> WriteBatch {
        let mut batch = WriteBatch::default();
        let _ = self.drain_sorted(|key, value| {
            match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            }
            Ok::<(), std::convert::Infallible>(())
        });
        batch
    }

    /// Calls `each` with the last write of every key (`None`: a delete) in
    /// key order, stopping at its first error; empties `self` either way.
    pub(crate) fn drain_sorted<E>(&mut self, mut each: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), E>) -> Result<(), E> {
        // Sorted by each key's first 8 bytes (zero-padded, big-endian: the
        // same order as the bytes) held inline, then the whole key, then the
        // push order: most comparisons never touch the arena.
        let key_of = |i: u32| self.slice(self.entries[i as usize].key);
        let mut order: Vec<(u64, u32)> = (0..self.entries.len() as u32).map(|i| (key_prefix(key_of(i)), i)).collect();
        order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| key_of(a.1).cmp(key_of(b.1))).then(a.1.cmp(&b.1)));
        let mut result = Ok(());
        for (i, &(prefix, idx)) in order.iter().enumerate() {
            // Sorted order reads the arena at random: ask for a later
            // entry's bytes now, so that they are in cache when its turn comes.
            if let Some(&(_, ahead)) = order.get(i + PREFETCH_AHEAD) {
                let (start, len) = self.entries[ahead as usize].key;
                prefetch(&self.arena[start as usize..(start + len) as usize]);
            }
            let e = &self.entries[idx as usize];
            let key = self.slice(e.key);
            // (Another prefix: another key, without reading it from the arena.)
            let superseded = order
                .get(i + 1)
                .is_some_and(|&(next_prefix, next)| next_prefix == prefix && self.slice(self.entries[next as usize].key) == key);
            if superseded {
                continue;
            }
            result = each(key, e.value.map(|v| self.slice(v)));
            if result.is_err() {
                break;
            }
        }
        self.clear();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies a batch to a map through RocksDB's batch iterator.
    fn contents(batch: &WriteBatch) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        struct Collect(Vec<(Vec<u8>, Option<Vec<u8>>)>);
        impl rocksdb::WriteBatchIterator for Collect {
            fn put(&mut self, k: &[u8], v: &[u8]) {
                self.0.push((k.to_vec(), Some(v.to_vec())));
            }
            fn delete(&mut self, k: &[u8]) {
                self.0.push((k.to_vec(), None));
            }
        }
        let mut c = Collect(Vec::new());
        batch.iterate(&mut c);
        c.0
    }

    #[test]
    fn sorted_and_last_write_per_key_wins() {
        let mut b = SortedBatch::default();
        b.push(&[b"c"], Some(b"1"));
        b.push(&[b"a"], Some(b"1"));
        b.push(&[b"c"], None);
        b.push(&[b"b"], None);
        b.push(&[b"a"], Some(b"2"));
        b.push(&[b"b"], Some(b"3"));
        assert_eq!(b.len(), 6);
        let got = contents(&b.take_sorted());
        let want = vec![
            (b"a".to_vec(), Some(b"2".to_vec())),
            (b"b".to_vec(), Some(b"3".to_vec())),
            (b"c".to_vec(), None),
        ];
        assert_eq!(got, want);
        assert_eq!((b.len(), b.bytes()), (0, 0));
    }

    #[test]
    fn the_order_is_the_keys_byte_order_whatever_their_length() {
        let keys: Vec<&[u8]> = vec![b"", b"\0", b"a", b"a\0", b"a\0\x01", b"ab", b"abcdefgh", b"abcdefgh\0", b"abcdefghi", b"abcdefgg\xff", b"\xff"];
        let mut b = SortedBatch::default();
        for (i, k) in keys.iter().enumerate().rev() {
            b.push(&[k], Some(&[i as u8]));
        }
        let got: Vec<Vec<u8>> = contents(&b.take_sorted()).into_iter().map(|(k, _)| k).collect();
        let mut want: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        want.sort();
        assert_eq!(got, want);
    }
}
