//! A thread that turns a restore's full batches into table files
//! (architecture.md §21).
//!
//! Sorting a batch and encoding it as an SST file took most of the restore
//! thread's time once the memtable was bypassed; here that work runs beside
//! the thread, which keeps reading the changelog meanwhile. Files come back
//! in the order they were asked for (one builder thread), so each store
//! partition's files are ingested in changelog order. At most
//! [`IN_FLIGHT`] batches wait or are being written: past that the restore
//! thread waits for one, which bounds the memory to that many batches.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::batch::SortedBatch;
use crate::error::Result;
use crate::store::engine::TableFile;

/// Batches handed over and not yet returned.
const IN_FLIGHT: usize = 2;
/// Batches kept for reuse (their arenas keep their capacity).
const SPARE: usize = IN_FLIGHT + 1;
/// The longest wait for one file (a bound; writing one takes well under a second).
const WAIT: Duration = Duration::from_secs(120);

struct Build {
    owner: u64,
    batch: SortedBatch,
    file: TableFile,
}

/// A batch written as a table file (or the error that stopped it).
pub(crate) struct Built {
    /// Who asked (`FileBuilder::submit`).
    pub(crate) owner: u64,
    pub(crate) path: PathBuf,
    /// `Ok(false)`: the batch was empty, no file.
    pub(crate) result: Result<bool>,
}

/// The restore thread's ends of the channels to and from the builder thread.
type Channels = (Sender<Build>, Receiver<(Built, SortedBatch)>);

/// The restore thread's end of the builder thread (started on first use).
#[derive(Default)]
pub(crate) struct FileBuilder {
    thread: Option<Channels>,
    in_flight: usize,
    /// Received while waiting for another owner's file, in order.
    ready: VecDeque<Built>,
    spare: Vec<SortedBatch>,
}

impl FileBuilder {
    /// Hands `batch` over to be written to `file` for `owner`; returns an
    /// empty batch to go on with. Waits first while [`IN_FLIGHT`] are out.
    pub(crate) fn submit(&mut self, owner: u64, batch: SortedBatch, file: TableFile) -> std::result::Result<SortedBatch, String> {
        while self.in_flight >= IN_FLIGHT {
            let built = self.receive()?;
            self.ready.push_back(built);
        }
        let (jobs, _) = self.thread.get_or_insert_with(spawn);
        if jobs.send(Build { owner, batch, file }).is_err() {
            self.stopped();
            return Err(gone());
        }
        self.in_flight += 1;
        Ok(self.spare.pop().unwrap_or_default())
    }

    /// A file that is done, if any, without waiting (an error: the thread
    /// is gone, and every batch it held with it).
    pub(crate) fn try_next(&mut self) -> std::result::Result<Option<Built>, String> {
        if let Some(built) = self.ready.pop_front() {
            return Ok(Some(built));
        }
        let Some((_, done)) = self.thread.as_ref() else { return Ok(None) };
        match done.try_recv() {
            Ok((built, batch)) => {
                self.returned(batch);
                Ok(Some(built))
            }
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => {
                let lost = self.in_flight > 0;
                self.stopped();
                if lost { Err(gone()) } else { Ok(None) }
            }
        }
    }

    /// The next file of `owner` that is done, waiting for it; files of
    /// others received meanwhile wait for [`FileBuilder::try_next`].
    pub(crate) fn next_of(&mut self, owner: u64) -> std::result::Result<Built, String> {
        if let Some(i) = self.ready.iter().position(|b| b.owner == owner) {
            return Ok(self.ready.remove(i).expect("present"));
        }
        loop {
            let built = self.receive()?;
            if built.owner == owner {
                return Ok(built);
            }
            self.ready.push_back(built);
        }
    }

    /// Whether any batch is out or any file waits to be taken.
    pub(crate) fn is_busy(&self) -> bool {
        self.in_flight > 0 || !self.ready.is_empty()
    }

    /// Drops the spare batches (no restore writes table files now).
    pub(crate) fn release_spares(&mut self) {
        self.spare.clear();
    }

    /// The next file from the thread (an error: it is gone, took longer
    /// than [`WAIT`], or nothing was out).
    fn receive(&mut self) -> std::result::Result<Built, String> {
        if self.in_flight == 0 {
            return Err("no table file is being written".into());
        }
        let (_, done) = self.thread.as_ref().ok_or_else(gone)?;
        let (built, batch) = match done.recv_timeout(WAIT) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => return Err(format!("a table file was not written within {} s", WAIT.as_secs())),
            Err(RecvTimeoutError::Disconnected) => {
                self.stopped();
                return Err(gone());
            }
        };
        self.returned(batch);
        Ok(built)
    }

    /// The thread is gone (it panicked or did not start): what was out is
    /// lost (those restores fail), and the next batch starts a new one.
    fn stopped(&mut self) {
        self.thread = None;
        self.in_flight = 0;
    }

    fn returned(&mut self, batch: SortedBatch) {
        self.in_flight -= 1;
        if self.spare.len() < SPARE {
            self.spare.push(batch);
        }
    }
}

fn gone() -> String {
    "the thread that writes the restore's table files stopped".into()
}

fn spawn() -> Channels {
    let (jobs, todo) = mpsc::channel::<Build>();
    let (finished, done) = mpsc::channel();
    let spawned = std::thread::Builder::new().name("kstate-restore-files".into()).spawn(move || {
        for Build { owner, mut batch, file } in todo {
            let result = file.write(|each| batch.drain_sorted(each));
            // Empty whatever happened (a file that did not open left the
            // batch full): it is reused for another store partition.
            batch.clear();
            let built = Built { owner, path: file.path().to_path_buf(), result };
            if finished.send((built, batch)).is_err() {
                return;
            }
        }
    });
    if let Err(e) = spawned {
        // `submit`'s send then fails, and the restore with it.
        tracing::error!(error = %e, "cannot start the restore's file builder thread");
    }
    (jobs, done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: usize) -> SortedBatch {
        let mut b = SortedBatch::default();
        for i in 0..n {
            b.push(&[format!("k{:04}", (i * 7) % n).as_bytes()], (i % 5 != 0).then_some(b"value".as_slice()));
        }
        b
    }

    /// Files come back in order, each written; a batch whose file could not
    /// be opened comes back empty, so that the spare handed to the next
    /// submit (for any store partition) holds nothing of it.
    #[test]
    fn files_come_back_in_order_and_every_returned_batch_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = FileBuilder::default();
        let good = dir.path().join("a.sst");
        let bad = dir.path().join("missing-dir").join("b.sst");
        files.submit(1, batch(300), TableFile::at(&good)).unwrap();
        files.submit(2, batch(300), TableFile::at(&bad)).unwrap();
        let first = files.next_of(1).unwrap();
        assert!(matches!(first.result, Ok(true)), "{:?}", first.result.err());
        assert!(good.exists());
        let second = files.next_of(2).unwrap();
        assert!(second.result.is_err(), "a file in a missing directory cannot be written");
        assert!(!files.is_busy());
        let spare = files.submit(3, batch(10), TableFile::at(&dir.path().join("c.sst"))).unwrap();
        assert_eq!(spare.len(), 0, "a returned batch is empty whatever happened to its file");
        assert_eq!(files.next_of(3).unwrap().owner, 3);
    }
}
