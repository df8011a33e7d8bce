//! The state dir gauges: a thread of their own that measures the state dir,
//! started by the processing loop and stopped when it ends.

use std::path::PathBuf;
use std::time::Duration;

/// `kstate_state_dir_used_bytes` and `kstate_state_dir_free_bytes`, every
/// 10 s, on a thread of their own (walking a large state dir takes time the
/// processing thread should not spend); it ends when this is dropped.
pub(super) struct DiskGauges {
    _stop: std::sync::mpsc::Sender<()>,
}

impl DiskGauges {
    const EVERY: Duration = Duration::from_secs(10);

    pub(super) fn start(dir: PathBuf) -> DiskGauges {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new().name("kstate-disk".into()).spawn(move || loop {
            metrics::gauge!(crate::metrics::STATE_DIR_USED_BYTES).set(crate::store::state_dir::dir_bytes(&dir) as f64);
            if let Some(free) = crate::store::state_dir::free_bytes(&dir) {
                metrics::gauge!(crate::metrics::STATE_DIR_FREE_BYTES).set(free as f64);
            }
            if stopped.recv_timeout(Self::EVERY) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                return;
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the state dir size thread; kstate_state_dir_* stay unset");
        }
        DiskGauges { _stop: stop }
    }
}
