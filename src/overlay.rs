//! The in-memory write overlay of a store partition.
//!
//! Writes since the last commit live here (a put is `Some(value)`, a delete
//! is `None`) until the commit moves them into RocksDB together with the new
//! checkpoint. Reads merge the overlay over the engine, so a processor always
//! reads its own writes.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::ops::Bound;

/// Fixed per-entry cost added to key and value lengths when sizing the overlay.
const ENTRY_OVERHEAD: usize = 48;

/// One write: key and value in a single allocation (a put or delete costs
/// one `malloc`, not one per key and value). Ordered and looked up by key.
#[derive(Debug)]
struct Entry {
    bytes: Box<[u8]>,
    key_len: u32,
    tombstone: bool,
}

impl Entry {
    fn new(key: &[u8], value: Option<&[u8]>) -> Entry {
        let mut bytes = Vec::with_capacity(key.len() + value.map_or(0, <[u8]>::len));
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(value.unwrap_or_default());
        Entry { bytes: bytes.into_boxed_slice(), key_len: key.len() as u32, tombstone: value.is_none() }
    }

    fn key(&self) -> &[u8] {
        &self.bytes[..self.key_len as usize]
    }

    /// `None` for a delete.
    fn value(&self) -> Option<&[u8]> {
        (!self.tombstone).then(|| &self.bytes[self.key_len as usize..])
    }

    fn size(&self) -> usize {
        self.bytes.len() + ENTRY_OVERHEAD
    }
}

impl Borrow<[u8]> for Entry {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(other.key())
    }
}

/// Uncommitted writes of one store partition.
#[derive(Default, Debug)]
pub(crate) struct Overlay {
    entries: BTreeSet<Entry>,
    bytes: usize,
}

impl Overlay {
    /// Records a put (`Some`) or delete (`None`).
    pub(crate) fn write(&mut self, key: &[u8], value: Option<&[u8]>) {
        let entry = Entry::new(key, value);
        self.bytes += entry.size();
        if let Some(old) = self.entries.replace(entry) {
            self.bytes -= old.size();
        }
    }

    /// `None`: not in the overlay; `Some(None)`: deleted; `Some(Some(v))`: written.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.entries.get(key).map(Entry::value)
    }

    /// Approximate memory held, in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
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
        let range = if empty { None } else { Some(self.entries.range::<[u8], _>((start, end))) };
        range.into_iter().flatten().map(|e| (e.key(), e.value()))
    }

    /// Every entry, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.entries.iter().map(|e| (e.key(), e.value()))
    }

    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        self.bytes = 0;
        self.entries.clear();
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
    fn size_accounting_follows_overwrites() {
        let mut o = Overlay::default();
        o.write(b"k", Some(&[0; 100]));
        let one = o.bytes();
        o.write(b"k", Some(&[0; 10]));
        assert_eq!(o.bytes(), one - 90);
        o.write(b"k", None);
        assert_eq!(o.bytes(), one - 100);
        assert_eq!(o.get(b"k"), Some(None));
        o.clear();
        assert_eq!(o.bytes(), 0);
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
