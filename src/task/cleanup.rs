//! Deleting the local state of tasks this instance no longer holds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::TaskManager;

/// How often task directories are checked for cleanup (at most).
pub(super) const CLEANUP_EVERY: Duration = Duration::from_secs(30);

/// Task directories on disk that are neither active nor standby here.
pub(super) struct StateCleanup {
    /// Since when each has been unowned (deleted after `state_cleanup_delay`).
    pub(super) unowned: BTreeMap<i32, Instant>,
    /// When directories were last checked.
    pub(super) last: Instant,
}

impl StateCleanup {
    pub(super) fn new() -> Self {
        StateCleanup { unowned: BTreeMap::new(), last: Instant::now() }
    }
}

impl TaskManager {
    /// Deletes the local state of tasks that were neither active nor
    /// standby here for `state_cleanup_delay` (checked every
    /// [`CLEANUP_EVERY`] at most); a directory whose lock is held (another
    /// instance on the same state directory) is left alone.
    pub(crate) fn clean_state_dirs(&mut self) {
        let every = CLEANUP_EVERY.min(self.config.state_cleanup_delay / 2);
        if self.cleanup.last.elapsed() < every {
            return;
        }
        let now = Instant::now();
        self.cleanup.last = now;
        // Unowned time counts only while this member is in the group: a
        // coordinator outage or a startup must not delete local state.
        if self.generation.is_none() || !self.session_alive() {
            self.cleanup.unowned.clear();
            return;
        }
        let held: BTreeSet<i32> = self.partitions().into_iter().chain(self.standbys.tasks.keys().copied()).collect();
        let mut on_disk = BTreeSet::new();
        for store in &self.config.stores {
            let dir = self.config.state_dir.join(&self.config.application_id).join(store.name());
            on_disk.extend(crate::store::state_dir::partitions_of(&dir));
        }
        self.cleanup.unowned.retain(|p, _| on_disk.contains(p) && !held.contains(p));
        for p in on_disk.difference(&held) {
            let since = *self.cleanup.unowned.entry(*p).or_insert(now);
            if now - since < self.config.state_cleanup_delay {
                continue;
            }
            for store in &self.config.stores {
                let dir = self.config.store_dir(store.name(), *p);
                if !dir.is_dir() {
                    continue;
                }
                let Ok(lock) = crate::store::lock::DirLock::acquire(&dir, Duration::ZERO) else {
                    tracing::debug!(partition = p, dir = %dir.display(), "unowned task directory is locked; kept");
                    continue;
                };
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => tracing::info!(partition = p, store = store.name(), unowned_for = ?(now - since),
                        "deleted the local state of a task this instance no longer holds"),
                    Err(e) => tracing::warn!(partition = p, dir = %dir.display(), error = %e, "deleting unowned task state failed"),
                }
                // A remote store's disk cache of the partition goes with it
                // (its writer and readers open under the lock just held).
                if store.is_remote() {
                    let cache = self.config.state_dir.join(&self.config.application_id).join(".remote-cache").join(store.name()).join(p.to_string());
                    match std::fs::remove_dir_all(&cache) {
                        Ok(()) => tracing::info!(partition = p, store = store.name(), "deleted the disk cache of a remote store partition this instance no longer holds"),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => tracing::warn!(partition = p, dir = %cache.display(), error = %e, "deleting an unowned disk cache failed"),
                    }
                }
                drop(lock);
            }
            self.cleanup.unowned.remove(p);
        }
    }
}
