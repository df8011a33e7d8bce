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

    /// Shuts the application down cleanly (a final commit, stores closed,
    /// the group left) on the first SIGINT (Ctrl-C) or SIGTERM (what
    /// container runtimes and systemd send), from a small thread of its
    /// own; returns at once. A second signal gets the default action
    /// (the process ends) only after the first was handled, so a stuck
    /// shutdown can still be interrupted by SIGKILL. Signal handlers that
    /// could not be installed are logged, not fatal.
    ///
    /// ```no_run
    /// # fn f(app: kstate::App) -> kstate::Result<()> {
    /// app.shutdown_handle().stop_on_signals();
    /// app.run(|_ctx, _record| Ok::<(), kstate::Error>(()))
    /// # }
    /// ```
    pub fn stop_on_signals(&self) {
        let handle = self.clone();
        let spawned = std::thread::Builder::new().name("kstate-signals".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => return tracing::error!(error = %e, "no runtime for the signal handlers; SIGINT and SIGTERM end the process"),
            };
            let signal = runtime.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let mut term = match signal(SignalKind::terminate()) {
                    Ok(term) => term,
                    Err(e) => {
                        tracing::error!(error = %e, "no SIGTERM handler; waiting for SIGINT only");
                        return tokio::signal::ctrl_c().await.ok().map(|_| "SIGINT");
                    }
                };
                tokio::select! {
                    interrupted = tokio::signal::ctrl_c() => interrupted.ok().map(|_| "SIGINT"),
                    terminated = term.recv() => terminated.map(|_| "SIGTERM"),
                }
            });
            if let Some(signal) = signal {
                tracing::info!(signal, "shutting down on a signal: final commit, stores closed, leaving the group");
                handle.shutdown();
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the signal thread; SIGINT and SIGTERM end the process");
        }
    }
}
