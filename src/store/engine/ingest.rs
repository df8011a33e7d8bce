//! A restore's large batches as table files (architecture.md §21).
//!
//! In restore mode a full batch, sorted and with one write per key, is
//! written straight into an SST file ([`TableFile`], on any thread) and
//! ingested: no memtable insert and no flush (whose sort of the vector
//! memtable was most of the flush thread's time). The file is durable once
//! ingested; the checkpoint then follows as a meta-only write: the batch is
//! durable before the checkpoint moves. A crash between the two leaves data
//! ahead of the checkpoint, which the restore replays over: replaying the
//! puts and deletes of a key-value store from an earlier offset ends at the
//! same state. So only plain key-value batches come here (no window
//! segments, no refused keys), and only while the store is not readable.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rocksdb::{IngestExternalFileOptions, Options, SstFileWriter};

use super::{Batch, Engine};
use crate::error::{Error, Result};
use crate::store::state_dir::remove_if_present as remove_file;

/// Names of the files being written start with this, inside the database
/// directory (RocksDB ignores names it did not make).
const FILE_PREFIX: &str = "kstate-restore-";

/// The smallest and largest restore batch written as one table file.
const MIN_BATCH_BYTES: usize = 2 << 20;
const MAX_BATCH_BYTES: usize = 64 << 20;

/// Numbers the files being written in this process.
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// A table file to write for one store partition; `Send`, so another
/// thread may write it while the restore goes on.
pub(crate) struct TableFile {
    options: Options,
    path: PathBuf,
}

impl TableFile {
    /// A file at `path` with the restore's options (tests of the builder).
    #[cfg(test)]
    pub(crate) fn at(path: &Path) -> TableFile {
        TableFile { options: Engine::data_options(&super::EngineResources::new(8 << 20, 4 << 20), true), path: path.to_path_buf() }
    }

    /// Where the file goes.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the entries `fill` gives (in strictly increasing key order;
    /// `None`: a delete). `Ok(false)`: there were none, and no file is left.
    pub(crate) fn write<F>(&self, fill: F) -> Result<bool>
    where
        F: FnOnce(&mut dyn FnMut(&[u8], Option<&[u8]>) -> Result<()>) -> Result<()>,
    {
        let mut writer = SstFileWriter::create(&self.options);
        let mut entries = 0u64;
        let written = writer.open(&self.path).map_err(Error::from).and_then(|()| {
            fill(&mut |key, value| {
                entries += 1;
                match value {
                    Some(v) => writer.put(key, v)?,
                    None => writer.delete(key)?,
                }
                Ok(())
            })?;
            if entries > 0 {
                writer.finish()?;
            }
            Ok(())
        });
        drop(writer);
        if entries == 0 || written.is_err() {
            remove_file(&self.path)?;
        }
        written.map(|()| entries > 0)
    }
}

/// Removes the files a crash left half written in the database at `path`.
pub(super) fn remove_leftovers(path: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(path) else { return Ok(()) };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(FILE_PREFIX) {
            remove_file(&entry.path())?;
        }
    }
    Ok(())
}

impl Engine {
    /// A new table file for this store's next restore batch, if it ingests
    /// them: RocksDB on disk, in restore mode.
    pub(crate) fn table_file(&self) -> Option<TableFile> {
        self.ingest_batch_bytes()?;
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let path = self.path.join(format!("{FILE_PREFIX}{n}.sst"));
        Some(TableFile { options: Self::data_options(&self.resources, true), path })
    }

    /// The most bytes of keys and values a restore batch collects before it
    /// is written as a table file, if this store ingests them: a memtable
    /// (within [`MIN_BATCH_BYTES`, `MAX_BATCH_BYTES`]), no more than the
    /// memtables it bypasses would hold.
    pub(crate) fn ingest_batch_bytes(&self) -> Option<usize> {
        let ingests = self.bulk_loading && self.heap.is_none() && self.resources.memory.is_none();
        ingests.then_some(self.resources.write_buffer_bytes.clamp(MIN_BATCH_BYTES, MAX_BATCH_BYTES))
    }

    /// Ingests the table file at `path` (written by [`TableFile::write`],
    /// moved into the database), then records `checkpoint` (and the age
    /// bound, as [`Engine::commit_with_age_bound`]).
    pub(crate) fn ingest(&self, path: &Path, checkpoint: i64, appended_after_ms: Option<i64>) -> Result<()> {
        // Batches written through the memtable before (with refused keys)
        // are durable first, so that a crash leaves at most this file past
        // the durable checkpoint (nothing to flush: nothing done).
        self.flush()?;
        let mut opts = IngestExternalFileOptions::default();
        opts.set_move_files(true);
        let default = self.db().cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME).expect("default cf");
        let ingested = self.db().ingest_external_file_cf_opts(&default, &opts, vec![path]).map_err(Error::from);
        // RocksDB removes the file once moved in; after a failure, ours goes.
        remove_file(path)?;
        ingested?;
        self.commit_bounded(Batch::default(), checkpoint, appended_after_ms)?;
        // The checkpoint is durable at once too (a flush of both column
        // families, the data's memtable empty): a crash leaves the data
        // ahead of it by at most the file just ingested.
        self.flush()
    }
}
