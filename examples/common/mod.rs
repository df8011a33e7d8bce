//! What the examples share: a flag of their own set on a signal (the
//! demos that stop something other than an `App`; an `App` stops with
//! `ShutdownHandle::stop_on_signals`).

use tokio::signal::unix::{signal, SignalKind};

/// Calls `stop` once on Ctrl-C (SIGINT) or SIGTERM (what a container runtime
/// sends): the app then stops cleanly (a final commit, stores closed).
pub fn on_signal(stop: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("signal runtime");
        let signalled = rt.block_on(async {
            let Ok(mut term) = signal(SignalKind::terminate()) else { return tokio::signal::ctrl_c().await.is_ok() };
            tokio::select! {
                interrupted = tokio::signal::ctrl_c() => interrupted.is_ok(),
                terminated = term.recv() => terminated.is_some(),
            }
        });
        if signalled {
            stop();
        }
    });
}
