//! Reading a store partition's database that this process does not hold
//! (operator tooling), and the checkpoint hint beside a closed database.

use std::path::Path;

use rocksdb::{IteratorMode, Options, DB};

use super::heap::{self, HeapState};
use super::{decode_checkpoint, decode_i64, decode_segments, decode_topic_id, meta_cf, Checkpoint, DataStats, RecordedSegments};
use super::{APPENDED_AFTER_KEY, CHECKPOINT_KEY, META_CF, SEGMENTS_KEY, TOPIC_ID_KEY};
use crate::error::{Error, Result};

/// A key and its value as RocksDB's iterator returns them.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// A store partition's database opened for reading only.
///
/// RocksDB is opened as a *secondary* instance: it takes no lock and
/// writes nothing under the store's directory (only under its own scratch
/// directory), so it can read a store a live instance holds. It sees the
/// state as of the primary's last flush, which is a committed prefix with
/// its own checkpoint (commits skip the WAL). An in-memory store is read
/// from its file ([`heap::FILE`]): the state as of its last save, a
/// committed prefix too.
pub(crate) enum ReadOnlyDb {
    Rocks(DB),
    Heap(HeapState),
}

/// An in-memory store's file in `db_path`, read, if the directory holds one
/// and no RocksDB database.
fn heap_state(db_path: &Path) -> Result<Option<HeapState>> {
    let file = db_path.join(heap::FILE);
    if db_path.join("CURRENT").exists() || !file.exists() {
        return Ok(None);
    }
    let bytes = std::fs::read(&file).map_err(|e| Error::io(&file, e))?;
    let state = heap::decode(&bytes, None).map_err(|why| Error::io(&file, std::io::Error::new(std::io::ErrorKind::InvalidData, why)))?;
    Ok(Some(state))
}

impl ReadOnlyDb {
    /// Opens the database at `db_path` for reading; `scratch` receives the
    /// secondary instance's own info log.
    pub(crate) fn open(db_path: &Path, scratch: &Path) -> Result<ReadOnlyDb> {
        if let Some(state) = heap_state(db_path)? {
            return Ok(ReadOnlyDb::Heap(state));
        }
        let mut opts = Options::default();
        opts.create_if_missing(false);
        // Required by secondary instances: keep every file it opened open.
        opts.set_max_open_files(-1);
        let cfs = [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF];
        let db = DB::open_cf_as_secondary(&opts, db_path, scratch, cfs)?;
        Ok(ReadOnlyDb::Rocks(db))
    }

    /// Opens a database nothing else has open (a checkpoint directory) read-only.
    pub(crate) fn open_read_only(db_path: &Path) -> Result<ReadOnlyDb> {
        if let Some(state) = heap_state(db_path)? {
            return Ok(ReadOnlyDb::Heap(state));
        }
        let mut opts = Options::default();
        // Table files opened as read, not all at open (a large store has thousands).
        opts.set_max_open_files(64);
        let cfs = [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF];
        let db = DB::open_cf_for_read_only(&opts, db_path, cfs, false)?;
        Ok(ReadOnlyDb::Rocks(db))
    }

    /// Whether the store is an in-memory one (read from its file).
    pub(crate) fn is_in_memory(&self) -> bool {
        matches!(self, ReadOnlyDb::Heap(_))
    }

    /// A meta key's value (a source table's topic).
    pub(crate) fn meta_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self {
            ReadOnlyDb::Rocks(db) => Ok(db.get_cf(meta_cf(db), key)?),
            ReadOnlyDb::Heap(state) => Ok(state.meta.get(key).map(|v| v.to_vec())),
        }
    }

    /// The changelog checkpoint.
    pub(crate) fn checkpoint(&self) -> Result<Checkpoint> {
        Ok(decode_checkpoint(self.meta_get(CHECKPOINT_KEY)?))
    }

    /// The id of the changelog topic the state came from, if recorded.
    pub(crate) fn changelog_topic_id(&self) -> Result<Option<String>> {
        Ok(decode_topic_id(self.meta_get(TOPIC_ID_KEY)?))
    }

    /// See [`Engine::appended_after_ms`](super::Engine::appended_after_ms).
    pub(crate) fn appended_after_ms(&self) -> Result<Option<i64>> {
        Ok(decode_i64(self.meta_get(APPENDED_AFTER_KEY)?))
    }

    /// See [`Engine::segments`](super::Engine::segments).
    pub(crate) fn segments(&self) -> Result<Option<RecordedSegments>> {
        Ok(decode_segments(self.meta_get(SEGMENTS_KEY)?))
    }

    /// Sizes from RocksDB's properties, or of the in-memory maps.
    pub(crate) fn data_stats(&self) -> DataStats {
        match self {
            ReadOnlyDb::Rocks(db) => DataStats::of(db),
            ReadOnlyDb::Heap(state) => DataStats::of_heap(state),
        }
    }

    /// Every key and value of the data, in key order.
    pub(crate) fn iter(&self) -> Box<dyn Iterator<Item = Result<KeyValue>> + '_> {
        match self {
            ReadOnlyDb::Rocks(db) => Box::new(db.iterator(IteratorMode::Start).map(|r| r.map_err(Error::from))),
            ReadOnlyDb::Heap(state) => Box::new(state.data.iter().map(|e| Ok((e.key().into(), e.value().into())))),
        }
    }
}

/// The file beside a database that tells its checkpoint as of its last
/// clean close, so the group subscription can report how caught up every
/// local copy is without opening each database.
pub(crate) const CHECKPOINT_HINT: &str = "kstate.checkpoint";

/// Writes the hint of a store partition directory whose database is closed
/// at checkpoint `c` (`kstate import-snapshot` writes it too).
pub(crate) fn write_checkpoint_hint(store_dir: &Path, c: i64) -> std::io::Result<()> {
    crate::store::state_dir::write_atomically(&store_dir.join(CHECKPOINT_HINT), c.to_string().as_bytes())
}

/// Removes the hint: the database is about to change.
pub(crate) fn remove_checkpoint_hint(store_dir: &Path) -> Result<()> {
    crate::store::state_dir::remove_if_present(&store_dir.join(CHECKPOINT_HINT))
}

/// The checkpoint a store partition directory's database had when it was
/// last closed cleanly, if it was (see [`CHECKPOINT_HINT`]). A lower bound
/// of its state: a database that is open, crashed or was wiped has none.
pub(crate) fn read_checkpoint_hint(store_dir: &Path) -> Option<i64> {
    std::fs::read_to_string(store_dir.join(CHECKPOINT_HINT)).ok()?.trim().parse().ok()
}
