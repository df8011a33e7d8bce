//! Closing a task's stores without commit, on a thread of their own.

use crate::store::KeyValueStore;

use super::{Task, TaskManager, TaskState};

impl TaskManager {
    /// Closes a task without committing: its uncommitted writes are dropped,
    /// its stores stay at their checkpoints.
    /// Returns its stores, for [`Closer::close`].
    pub(super) fn close_task(&mut self, mut task: Task, lost: bool) -> Vec<KeyValueStore> {
        let _in_task = task.span.enter();
        let mut stores = std::mem::take(&mut task.stores);
        if task.state == TaskState::Restoring {
            // Partially restored stores are consistent at their checkpoint.
            stores.extend(self.restorer.cancel(task.partition).map(|job| job.stores).unwrap_or_default());
        }
        for s in &mut stores {
            s.discard_uncommitted();
            // Sizes describe this instance's active stores: its next owner
            // reports them from now on (a standby here reports its lag).
            s.metrics.clear_sizes();
        }
        tracing::info!(partition = task.partition, lost, "task closed");
        stores
    }
}

/// Threads closing stores, joined by [`Closer::join_all`].
#[derive(Default)]
pub(super) struct Closer {
    pub(super) threads: Vec<std::thread::JoinHandle<()>>,
}

impl Closer {
    /// Closes stores on a thread of their own: closing flushes RocksDB's
    /// memtables (up to `write_buffer_bytes` each), which must not stall the
    /// partitions this member keeps (a revoke runs inside the rebalance, on
    /// the processing thread). A store's directory lock is released once
    /// it is closed; whoever opens it next waits for that on its own thread.
    pub(super) fn close(&mut self, stores: Vec<KeyValueStore>) {
        if stores.is_empty() {
            return;
        }
        // Queries stop reading them now, not when the closer gets to them;
        // the engines are withdrawn when the stores drop on the closing
        // thread (which waits for a snapshot's checkpoint call, never this
        // thread).
        for s in &stores {
            s.unpublish();
        }
        self.threads.retain(|h| !h.is_finished());
        let spawned = std::thread::Builder::new().name("kstate-close".into()).spawn(move || drop(stores));
        match spawned {
            Ok(handle) => self.threads.push(handle),
            // The stores went with the failed closure: they closed here.
            Err(e) => tracing::warn!(error = %e, "no thread to close stores on; closed them in place"),
        }
    }

    /// Waits until every store handed to [`Closer::close`] is closed.
    pub(super) fn join_all(&mut self) {
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}
