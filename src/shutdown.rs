//! Stopping a running application from another thread or a signal handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Stops a running [`App`](crate::App); cheap to clone and send.
#[derive(Clone, Default, Debug)]
pub struct ShutdownHandle(Arc<AtomicBool>);

impl ShutdownHandle {
    /// Asks the application to commit, close its stores and leave the group.
    pub fn shutdown(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether shutdown was requested.
    pub fn is_shutdown(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
