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
    /// container runtimes and systemd send). The handlers are installed
    /// before this returns, and a small thread of its own waits for them.
    /// After the first signal both get their default action back, so a
    /// second one ends the process at once (a shutdown that hangs can
    /// still be interrupted). A handler that cannot be installed is
    /// logged, not fatal.
    ///
    /// ```no_run
    /// # fn f(app: kstate::App) -> kstate::Result<()> {
    /// app.shutdown_handle().stop_on_signals();
    /// app.run(|_ctx, _record| Ok::<(), kstate::Error>(()))
    /// # }
    /// ```
    pub fn stop_on_signals(&self) {
        use tokio::signal::unix::{signal, Signal, SignalKind};
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => return tracing::error!(error = %e, "no runtime for the signal handlers; SIGINT and SIGTERM end the process"),
        };
        let installed: Vec<(Signal, &'static str)> = {
            let _entered = runtime.enter();
            [(SignalKind::interrupt(), "SIGINT"), (SignalKind::terminate(), "SIGTERM")]
                .into_iter()
                .filter_map(|(kind, name)| match signal(kind) {
                    Ok(s) => Some((s, name)),
                    Err(e) => {
                        tracing::error!(signal = name, error = %e, "no handler for this signal: it ends the process without a clean shutdown");
                        None
                    }
                })
                .collect()
        };
        if installed.is_empty() {
            return;
        }
        let handle = self.clone();
        let spawned = std::thread::Builder::new().name("kstate-signals".into()).spawn(move || {
            let signal = runtime.block_on(async move {
                let waits = installed.into_iter().map(|(mut s, name)| Box::pin(async move { s.recv().await.map(|_| name) }));
                futures::future::select_all(waits).await.0
            });
            let Some(signal) = signal else { return };
            // A second signal: the default action (the process ends).
            // SAFETY: resetting a signal's disposition to its default.
            unsafe {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGTERM, libc::SIG_DFL);
            }
            tracing::info!(signal, "shutting down on a signal: final commit, stores closed, leaving the group (a second signal ends the process)");
            handle.shutdown();
        });
        if let Err(e) = spawned {
            // SAFETY: resetting a signal's disposition to its default.
            unsafe {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGTERM, libc::SIG_DFL);
            }
            tracing::error!(error = %e, "could not start the signal thread; SIGINT and SIGTERM end the process without a clean shutdown");
        }
    }
}
