//! The in-memory write overlay of a store partition.
//!
//! Writes since the last commit live here (a put is `Some(value)`, a delete
//! is `None`) until the commit moves them into RocksDB together with the new
//! checkpoint. Reads merge the overlay over the engine, so a processor always
//! reads its own writes.

use std::collections::BTreeMap;
use std::ops::Bound;

/// Fixed per-entry cost added to key and value lengths when sizing the overlay.
const ENTRY_OVERHEAD: usize = 48;

/// Uncommitted writes of one store partition.
#[derive(Default, Debug)]
pub(crate) struct Overlay {
    entries: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    bytes: usize,
}

fn entry_size(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD
}

impl Overlay {
    /// Records a put (`Some`) or delete (`None`).
    pub(crate) fn write(&mut self, key: &[u8], value: Option<Vec<u8>>) {
        self.bytes += entry_size(key, &value);
        if let Some(old) = self.entries.insert(key.to_vec(), value) {
            self.bytes -= entry_size(key, &old);
        }
    }

    /// `None`: not in the overlay; `Some(None)`: deleted; `Some(Some(v))`: written.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.entries.get(key).map(|v| v.as_deref())
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
        range.into_iter().flatten().map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// Every entry, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.entries.iter().map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// Takes every entry out, leaving the overlay empty.
    pub(crate) fn drain(&mut self) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        self.bytes = 0;
        std::mem::take(&mut self.entries)
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
        o.write(b"k", Some(vec![0; 100]));
        let one = o.bytes();
        o.write(b"k", Some(vec![0; 10]));
        assert_eq!(o.bytes(), one - 90);
        o.write(b"k", None);
        assert_eq!(o.bytes(), one - 100);
        assert_eq!(o.get(b"k"), Some(None));
        o.drain();
        assert_eq!(o.bytes(), 0);
    }

    #[test]
    fn inverted_ranges_are_empty_not_a_panic() {
        let mut o = Overlay::default();
        o.write(b"a", Some(b"1".to_vec()));
        assert_eq!(o.range(Bound::Included(&b"z"[..]), Bound::Excluded(&b"a"[..])).count(), 0);
        assert_eq!(o.range(Bound::Excluded(&b"a"[..]), Bound::Excluded(&b"a"[..])).count(), 0);
        assert_eq!(o.range(Bound::Included(&b"a"[..]), Bound::Included(&b"a"[..])).count(), 1);
    }

    #[test]
    fn newer_layer_wins_and_keeps_its_deletes() {
        let mut newer = Overlay::default();
        newer.write(b"b", None);
        newer.write(b"c", Some(b"C2".to_vec()));
        let mut older = Overlay::default();
        older.write(b"a", Some(b"A".to_vec()));
        older.write(b"b", Some(b"B".to_vec()));
        older.write(b"c", Some(b"C".to_vec()));
        older.write(b"d", None);
        let got: Vec<(&[u8], Option<&[u8]>)> = layered(newer.iter(), older.iter()).collect();
        let want: Vec<(&[u8], Option<&[u8]>)> =
            vec![(&b"a"[..], Some(&b"A"[..])), (b"b", None), (b"c", Some(b"C2")), (b"d", None)];
        assert_eq!(got, want);
    }

    #[test]
    fn merge_prefers_overlay_and_hides_deletes() {
        let mut o = Overlay::default();
        o.write(b"b", Some(b"B2".to_vec()));
        o.write(b"c", None);
        o.write(b"e", Some(b"E".to_vec()));
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
