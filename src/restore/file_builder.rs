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

    /// A file that is done, if any, without waiting.
    pub(crate) fn try_next(&mut self) -> Option<Built> {
        if let Some(built) = self.ready.pop_front() {
            return Some(built);
        }
        let (_, done) = self.thread.as_ref()?;
        let (built, batch) = done.try_recv().ok()?;
        self.returned(batch);
        Some(built)
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

    /// Drops the spare batches (nothing is restoring).
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
