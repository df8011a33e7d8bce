//! The in-memory write overlay of a store partition.
//!
//! Writes since the last commit live here (a put is `Some(value)`, a delete
//! is `None`) until the commit moves them into RocksDB together with the new
//! checkpoint. Reads merge the overlay over the engine, so a processor always
//! reads its own writes.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::ptr::NonNull;

/// Fixed per-entry cost (the index's share) added to the arena's bytes when
/// sizing the overlay.
const ENTRY_OVERHEAD: usize = 48;
/// The arena's first chunk; each next one doubles, up to [`MAX_CHUNK`], so
/// that a barely used store holds little and a busy one allocates rarely.
const FIRST_CHUNK: usize = 4 << 10;
const MAX_CHUNK: usize = 1 << 20;

/// Bytes in chunks that never move: a chunk is filled within its capacity
/// and never grown, so pointers into it stay valid until the arena drops.
///
/// Keys and values of an overlay live here rather than in one allocation
/// per write: a write costs no `malloc` and a landed commit frees a few
/// chunks rather than every entry, which in the write benchmark also kept
/// the allocator from slowing librdkafka's own allocations down.
#[derive(Debug, Default)]
struct Arena {
    chunks: Vec<Vec<u8>>,
    used: usize,
}

impl Arena {
    /// Copies `parts` next to each other; returns where they start.
    fn push(&mut self, parts: &[&[u8]]) -> NonNull<u8> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let fits = self.chunks.last().is_some_and(|c| c.capacity() - c.len() >= len);
        if !fits {
            let next = self.chunks.last().map_or(FIRST_CHUNK, |c| (c.capacity() * 2).min(MAX_CHUNK));
            self.chunks.push(Vec::with_capacity(next.max(len)));
        }
        let chunk = self.chunks.last_mut().expect("a chunk with room");
        let start = chunk.len();
        for p in parts {
            chunk.extend_from_slice(p); // within capacity: the chunk does not move
        }
        self.used += len;
        // SAFETY: `start <= chunk.len()`; the pointer is in (or one past) the chunk's buffer.
        unsafe { NonNull::new_unchecked(chunk.as_mut_ptr().add(start)) }
    }

    /// Gives back the `len` bytes of the last push, which nothing points at.
    fn unpush(&mut self, len: usize) {
        let chunk = self.chunks.last_mut().expect("a push came first");
        chunk.truncate(chunk.len() - len); // the buffer stays where it is
        self.used -= len;
    }
}

/// A key in the arena (or, to look one up, in the caller's memory),
/// ordered by its bytes.
///
/// Its first 8 bytes are kept as a big-endian number too (zero-padded:
/// padding sorts before every byte, so the order stays lexicographic): most
/// comparisons are then one integer compare instead of a `memcmp` call,
/// which was ~15% of the processing thread in the write benchmark.
#[derive(Debug, Clone, Copy)]
struct Key {
    prefix: u64,
    ptr: NonNull<u8>,
    len: u32,
}

impl Key {
    /// A key over `bytes`, valid while they are.
    fn over(bytes: &[u8]) -> Key {
        Key {
            prefix: super::key_prefix(bytes),
            ptr: NonNull::from(bytes).cast(),
            len: u32::try_from(bytes.len()).expect("record sizes are checked against max.message.bytes"),
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: points into the arena of the overlay that holds this key,
        // which outlives it and never moves or changes key bytes (or, for a
        // lookup key, into the caller's borrowed bytes).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.prefix == other.prefix && self.len == other.len && (self.len <= 8 || self.bytes() == other.bytes())
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.prefix.cmp(&other.prefix).then_with(|| {
            if self.len <= 8 && other.len <= 8 {
                // Equal prefixes: one key is the other padded with zero
                // bytes, so the shorter sorts first (no `memcmp` call).
                self.len.cmp(&other.len)
            } else {
                self.bytes().cmp(other.bytes())
            }
        })
    }
}

/// A key's latest write: a value in the arena (with room for `capacity`
/// bytes, so that an overwrite that fits reuses it) or a delete.
#[derive(Debug, Clone, Copy)]
struct Slot {
    ptr: NonNull<u8>,
    len: u32,
    capacity: u32,
    tombstone: bool,
}

impl Slot {
    /// `None` for a delete.
    fn value(&self) -> Option<&[u8]> {
        // SAFETY: as for `Key::bytes`; `len <= capacity` bytes are written.
        (!self.tombstone).then(|| unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) })
    }
}

/// Uncommitted writes of one store partition.
#[derive(Default, Debug)]
pub(crate) struct Overlay {
    entries: BTreeMap<Key, Slot>,
    arena: Arena,
}

// SAFETY: the pointers in `entries` point into `arena`, which the overlay
// owns; it changes bytes only through `&mut self`.
unsafe impl Send for Overlay {}
unsafe impl Sync for Overlay {}

impl Overlay {
    /// Records a put (`Some`) or delete (`None`).
    ///
    /// Copies key and value to the arena first, so that a new key (the
    /// common case) costs one descent of the index: the entry points at the
    /// copy. A key already there keeps its entry and the copy is given back
    /// (a value that does not fit the old one's room is copied again alone).
    pub(crate) fn write(&mut self, key: &[u8], value: Option<&[u8]>) {
        let len = |b: &[u8]| u32::try_from(b.len()).expect("record sizes are checked against max.message.bytes");
        let v = value.unwrap_or_default();
        let ptr = self.arena.push(&[key, v]);
        // SAFETY: the arena holds the key's bytes at `ptr`, the value's right after.
        let (stored, value_ptr) = unsafe {
            (std::slice::from_raw_parts(ptr.as_ptr(), key.len()), NonNull::new_unchecked(ptr.as_ptr().add(key.len())))
        };
        let copied = key.len() + v.len();
        match self.entries.entry(Key::over(stored)) {
            Entry::Vacant(e) => {
                e.insert(Slot { ptr: value_ptr, len: len(v), capacity: len(v), tombstone: value.is_none() });
            }
            Entry::Occupied(mut e) => {
                // The key keeps its entry: nothing points at the copy.
                self.arena.unpush(copied);
                let slot = e.get_mut();
                match value {
                    None => slot.tombstone = true,
                    Some(v) if len(v) <= slot.capacity => {
                        // SAFETY: the slot's `capacity` bytes are ours (older
                        // than the bytes just given back), and no reference to
                        // them lives across this `&mut self` call.
                        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), slot.ptr.as_ptr(), v.len()) };
                        slot.len = len(v);
                        slot.tombstone = false;
                    }
                    Some(v) => {
                        let ptr = self.arena.push(&[v]);
                        *slot = Slot { ptr, len: len(v), capacity: len(v), tombstone: false };
                    }
                }
            }
        }
    }

    /// `None`: not in the overlay; `Some(None)`: deleted; `Some(Some(v))`: written.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.entries.get(&Key::over(key)).map(Slot::value)
    }

    /// Approximate memory held, in bytes: every byte written to the arena
    /// (an overwrite that does not fit its key's slot takes new room) plus
    /// a fixed cost per key.
    pub(crate) fn bytes(&self) -> usize {
        self.arena.used + self.entries.len() * ENTRY_OVERHEAD
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Overlay entries within the bounds, in key order.
    pub(crate) fn range<'a>(
        &'a self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        // BTreeMap::range panics on inverted or empty-exclusive bounds; a
        // store answers those with nothing, like RocksDB does.
        let empty = match (start, end) {
            (Bound::Included(s), Bound::Included(e)) => s > e,
            (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e)) | (Bound::Excluded(s), Bound::Included(e)) => {
                s >= e
            }
            _ => false,
        };
        let range = if empty { None } else { Some(self.entries.range((start.map(Key::over), end.map(Key::over)))) };
        range.into_iter().flatten().map(|(k, v)| (k.bytes(), v.value()))
    }

    /// Every entry, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.entries.iter().map(|(k, v)| (k.bytes(), v.value()))
    }

    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.arena = Arena::default();
    }
}

/// Overlay entries in key order: `None` marks a delete.
type OverlayIter<'a> = Box<dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a>;

/// Merges two overlay layers in key order; on equal keys the `newer` entry
/// wins (a delete included, so it still hides the engine's entry).
pub(crate) fn layered<'a>(
    newer: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a,
    older: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a,
) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
    let (mut newer, mut older) = (newer.peekable(), older.peekable());
    std::iter::from_fn(move || match (newer.peek(), older.peek()) {
        (None, None) => None,
        (Some(_), None) => newer.next(),
        (None, Some(_)) => older.next(),
        (Some((n, _)), Some((o, _))) => {
            if n == o {
                older.next(); // shadowed
                newer.next()
            } else if n < o {
                newer.next()
            } else {
                older.next()
            }
        }
    })
}

/// Merges the overlay over an engine scan: overlay entries win, deletes hide
/// engine entries. Both inputs must be in ascending key order.
pub(crate) struct MergeIter<'a, E>
where
    E: Iterator<Item = crate::Result<(Vec<u8>, Vec<u8>)>>,
{
    overlay: std::iter::Peekable<OverlayIter<'a>>,
    engine: std::iter::Peekable<E>,
}

impl<'a, E> MergeIter<'a, E>
where
    E: Iterator<Item = crate::Result<(Vec<u8>, Vec<u8>)>>,
{
    pub(crate) fn new(
        overlay: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a,
        engine: E,
    ) -> Self {
        let overlay: OverlayIter<'a> = Box::new(overlay);
        MergeIter { overlay: overlay.peekable(), engine: engine.peekable() }
    }
}

impl<'a, E> Iterator for MergeIter<'a, E>
where
    E: Iterator<Item = crate::Result<(Vec<u8>, Vec<u8>)>>,
{
    type Item = crate::Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let take_overlay = match (self.overlay.peek(), self.engine.peek()) {
                (None, None) => return None,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(_), Some(Err(_))) => false,
                (Some((ok, _)), Some(Ok((ek, _)))) => {
                    if *ok == ek.as_slice() {
                        self.engine.next(); // shadowed by the overlay
                        true
                    } else {
                        *ok < ek.as_slice()
                    }
                }
            };
            if take_overlay {
                let (k, v) = self.overlay.next().expect("peeked");
                if let Some(v) = v {
                    return Some(Ok((k.to_vec(), v.to_vec())));
                }
                // a delete: skip and look again
            } else {
                return self.engine.next();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overwrites_that_fit_reuse_their_slot() {
        let mut o = Overlay::default();
        o.write(b"k", Some(&[1; 100]));
        let one = o.bytes();
        o.write(b"k", Some(&[2; 10]));
        assert_eq!(o.bytes(), one, "a smaller value reuses the slot");
        assert_eq!(o.get(b"k"), Some(Some(&[2u8; 10][..])));
        o.write(b"k", None);
        assert_eq!(o.get(b"k"), Some(None));
        o.write(b"k", Some(&[3; 100]));
        assert_eq!(o.bytes(), one, "a delete keeps the slot's room");
        assert_eq!(o.get(b"k"), Some(Some(&[3u8; 100][..])));
        o.write(b"k", Some(&[4; 101]));
        assert_eq!(o.bytes(), one + 101, "a bigger value takes new room");
        assert_eq!(o.get(b"k"), Some(Some(&[4u8; 101][..])));
        assert_eq!(o.len(), 1);
        o.clear();
        assert_eq!(o.bytes(), 0);
        assert!(o.get(b"k").is_none());
    }

    #[test]
    fn entries_survive_many_chunks_in_key_order() {
        // Values bigger than a chunk and thousands of small ones: every
        // pointer must stay valid as the arena grows.
        let mut o = Overlay::default();
        let mut model = std::collections::BTreeMap::new();
        for i in 0u32..20_000 {
            let key = format!("key-{:05}", (i * 7919) % 5000).into_bytes();
            let value = if i % 1000 == 0 { vec![i as u8; 3 * MAX_CHUNK / 2] } else { i.to_be_bytes().repeat(1 + i as usize % 9) };
            if i % 13 == 0 {
                o.write(&key, None);
                model.insert(key, None);
            } else {
                o.write(&key, Some(&value));
                model.insert(key, Some(value));
            }
        }
        let got: Vec<(Vec<u8>, Option<Vec<u8>>)> = o.iter().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect();
        let want: Vec<(Vec<u8>, Option<Vec<u8>>)> = model.into_iter().collect();
        assert_eq!(got, want);
    }

    #[test]
    fn order_and_ranges_are_lexicographic_for_any_key_length() {
        // Short keys, zero bytes and shared 8-byte prefixes: the integer
        // prefix must never disagree with byte order.
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut o = Overlay::default();
        let mut model = std::collections::BTreeMap::new();
        let alphabet = [0u8, 1, 0x7f, 0x80, 0xff];
        let key = |rng: &mut rand::rngs::StdRng| -> Vec<u8> {
            let n = rng.random_range(0..12);
            (0..n).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect()
        };
        for i in 0..3000u32 {
            let k = key(&mut rng);
            o.write(&k, Some(&i.to_be_bytes()));
            model.insert(k, i.to_be_bytes().to_vec());
        }
        let got: Vec<Vec<u8>> = o.iter().map(|(k, _)| k.to_vec()).collect();
        assert_eq!(got, model.keys().cloned().collect::<Vec<_>>());
        for _ in 0..300 {
            let (a, b) = (key(&mut rng), key(&mut rng));
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let got: Vec<Vec<u8>> =
                o.range(Bound::Included(&lo[..]), Bound::Excluded(&hi[..])).map(|(k, _)| k.to_vec()).collect();
            let want: Vec<Vec<u8>> = model.range(lo.clone()..hi.clone()).map(|(k, _)| k.clone()).collect();
            assert_eq!(got, want, "range {lo:?}..{hi:?}");
            assert_eq!(o.get(&lo).map(|v| v.map(<[u8]>::to_vec)), model.get(&lo).map(|v| Some(v.clone())));
        }
    }

    #[test]
    fn inverted_ranges_are_empty_not_a_panic() {
        let mut o = Overlay::default();
        o.write(b"a", Some(b"1"));
        assert_eq!(o.range(Bound::Included(&b"z"[..]), Bound::Excluded(&b"a"[..])).count(), 0);
        assert_eq!(o.range(Bound::Excluded(&b"a"[..]), Bound::Excluded(&b"a"[..])).count(), 0);
        assert_eq!(o.range(Bound::Included(&b"a"[..]), Bound::Included(&b"a"[..])).count(), 1);
    }

    #[test]
    fn newer_layer_wins_and_keeps_its_deletes() {
        let mut newer = Overlay::default();
        newer.write(b"b", None);
        newer.write(b"c", Some(b"C2"));
        let mut older = Overlay::default();
        older.write(b"a", Some(b"A"));
        older.write(b"b", Some(b"B"));
        older.write(b"c", Some(b"C"));
        older.write(b"d", None);
        let got: Vec<(&[u8], Option<&[u8]>)> = layered(newer.iter(), older.iter()).collect();
        let want: Vec<(&[u8], Option<&[u8]>)> =
            vec![(&b"a"[..], Some(&b"A"[..])), (b"b", None), (b"c", Some(b"C2")), (b"d", None)];
        assert_eq!(got, want);
    }

    #[test]
    fn merge_prefers_overlay_and_hides_deletes() {
        let mut o = Overlay::default();
        o.write(b"b", Some(b"B2"));
        o.write(b"c", None);
        o.write(b"e", Some(b"E"));
        let engine = vec![
            Ok((b"a".to_vec(), b"A".to_vec())),
            Ok((b"b".to_vec(), b"B".to_vec())),
            Ok((b"c".to_vec(), b"C".to_vec())),
            Ok((b"d".to_vec(), b"D".to_vec())),
        ];
        let got: Vec<(Vec<u8>, Vec<u8>)> =
            MergeIter::new(o.range(Bound::Unbounded, Bound::Unbounded), engine.into_iter())
                .map(Result::unwrap)
                .collect();
        let want: Vec<(Vec<u8>, Vec<u8>)> = [("a", "A"), ("b", "B2"), ("d", "D"), ("e", "E")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(got, want);
    }
}
