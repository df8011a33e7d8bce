//! What a commit writes ([`Batch`]) and what a reader of one committed
//! state sees ([`SnapshotRead`]), on either backend.

use std::ops::Bound;

use rocksdb::{Direction, IteratorMode, ReadOptions, WriteBatch, DB};

use super::{decode_segments, heap, remote, RecordedSegments, SEGMENTS_KEY};
use crate::error::Result;

/// Reads of one snapshot of a store partition (see [`Engine::committed`]).
pub(crate) enum SnapshotRead<'a> {
    Rocks { snapshot: rocksdb::SnapshotWithThreadMode<'a, DB>, meta: &'a rocksdb::ColumnFamily },
    Heap(std::sync::RwLockReadGuard<'a, heap::HeapState>),
    Remote { snapshot: std::sync::Arc<remote::Snapshot>, db: &'a remote::RemoteDb },
}

impl SnapshotRead<'_> {
    /// One key's value.
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self {
            SnapshotRead::Rocks { snapshot, .. } => Ok(snapshot.get_pinned(key)?.map(|v| v.to_vec())),
            SnapshotRead::Heap(state) => Ok(state.get(key).map(<[u8]>::to_vec)),
            SnapshotRead::Remote { snapshot, db } => db.snapshot_get(snapshot, remote::DATA, key),
        }
    }

    pub(super) fn meta_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self {
            SnapshotRead::Rocks { snapshot, meta } => Ok(snapshot.get_cf(*meta, key)?),
            SnapshotRead::Heap(state) => Ok(state.meta.get(key).map(|v| v.to_vec())),
            SnapshotRead::Remote { snapshot, db } => db.snapshot_get(snapshot, remote::META, key),
        }
    }

    /// Entries within the bounds in key order, to `take` until it returns false.
    pub(crate) fn scan(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, mut take: impl FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        let snapshot = match self {
            SnapshotRead::Rocks { snapshot, .. } => snapshot,
            SnapshotRead::Heap(state) => {
                for (k, v) in state.range(start, end) {
                    if !take(k, v) {
                        break;
                    }
                }
                return Ok(());
            }
            SnapshotRead::Remote { snapshot, db } => {
                for entry in db.scan(Some(snapshot.clone()), remote::DATA, start, end) {
                    let (k, v) = entry?;
                    if !take(&k, &v) {
                        break;
                    }
                }
                return Ok(());
            }
        };
        let (mode, ro, skip) = scan_options(start, end);
        for entry in snapshot.iterator_opt(mode, ro) {
            let (k, v) = entry?;
            if skip.as_deref() == Some(&k[..]) {
                continue;
            }
            if !take(&k, &v) {
                break;
            }
        }
        Ok(())
    }

    /// A segmented store's recorded segments (its time) in this snapshot.
    pub(crate) fn segments(&self) -> Result<Option<RecordedSegments>> {
        Ok(decode_segments(self.meta_get(SEGMENTS_KEY)?))
    }
}

/// An iterator's start, read options (the upper bound) and the key to
/// skip for an excluded start.
pub(super) fn scan_options<'k>(start: Bound<&'k [u8]>, end: Bound<&[u8]>) -> (IteratorMode<'k>, ReadOptions, Option<Vec<u8>>) {
    let mut ro = ReadOptions::default();
    match end {
        Bound::Excluded(e) => ro.set_iterate_upper_bound(e.to_vec()),
        Bound::Included(e) => {
            let mut v = e.to_vec();
            v.push(0);
            ro.set_iterate_upper_bound(v)
        }
        Bound::Unbounded => {}
    }
    let (mode, skip) = match start {
        Bound::Unbounded => (IteratorMode::Start, None),
        Bound::Included(s) => (IteratorMode::From(s, Direction::Forward), None),
        Bound::Excluded(s) => (IteratorMode::From(s, Direction::Forward), Some(s.to_vec())),
    };
    (mode, ro, skip)
}

/// A commit's writes: data puts and deletes, then range deletions (a
/// segmented store's expired segments), then meta keys, applied in that
/// order by [`Engine::commit_bounded`] on either backend.
pub(crate) struct Batch {
    pub(super) data: WriteBatch,
    pub(super) ranges: Vec<(Vec<u8>, Vec<u8>)>,
    pub(super) meta: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch::from(WriteBatch::default())
    }
}

impl From<WriteBatch> for Batch {
    fn from(data: WriteBatch) -> Batch {
        Batch { data, ranges: Vec::new(), meta: Vec::new() }
    }
}

impl Batch {
    /// Sets a key of the data.
    pub(crate) fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.data.put(key, value);
    }

    /// Deletes a key of the data.
    pub(crate) fn delete(&mut self, key: impl AsRef<[u8]>) {
        self.data.delete(key);
    }
}
