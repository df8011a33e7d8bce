//! The measured restore rate of this state directory: measured by the
//! restore thread, saved next to the state, loaded by `estimate-restore`.

use std::time::Duration;

/// The rate of this state directory's last sizeable restore (the restore
/// thread's: restores that overlapped count together), kept in
/// `<state_dir>/<application_id>/kstate.restore-rate.json` so that the
/// operator CLI's `estimate-restore` can use a rate measured on this
/// machine.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RestoreRate {
    /// Records replayed by that restore.
    pub(crate) records: u64,
    /// Key + value bytes replayed.
    pub(crate) bytes: u64,
    /// Its wall time.
    pub(crate) seconds: f64,
    /// When it finished (ms since the epoch).
    pub(crate) at_ms: i64,
}

impl RestoreRate {
    /// Restores shorter than this say more about fixed costs than the rate.
    pub(crate) const MIN_RECORDS: u64 = 10_000;
    const FILE: &'static str = "kstate.restore-rate.json";

    pub(super) fn measured(records: u64, bytes: u64, duration: Duration) -> RestoreRate {
        RestoreRate { records, bytes, seconds: duration.as_secs_f64().max(1e-6), at_ms: crate::store::engine::now_ms() }
    }

    /// Records per second.
    pub(crate) fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.seconds
    }

    /// Writes the file (best effort: a failure is logged at debug level).
    pub(super) fn save(&self, app_dir: &std::path::Path) {
        let path = app_dir.join(Self::FILE);
        let written = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|bytes| crate::store::state_dir::write_atomically(&path, &bytes));
        if let Err(e) = written {
            tracing::debug!(path = %path.display(), error = %e, "writing the restore rate failed");
        }
    }

    /// The last rate saved under `app_dir`, if any.
    pub(crate) fn load(app_dir: &std::path::Path) -> Option<RestoreRate> {
        serde_json::from_slice(&std::fs::read(app_dir.join(Self::FILE)).ok()?).ok()
    }
}
