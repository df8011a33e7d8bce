//! What fences a member: the [`Generation`] its commits go under, and the
//! [`SessionClock`] (when the coordinator last confirmed it, the commit gate,
//! whether the generation is settled) that stops a frozen member's writes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The identity under which this member's commits are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Generation {
    pub(crate) id: i32,
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
}

/// When the coordinator last confirmed this member (a heartbeat or a
/// SyncGroup answered without error). Past a session timeout without one,
/// the group has probably moved its tasks: the runtime then writes nothing
/// (no changelog record, no commit) until the membership reports.
#[derive(Clone)]
pub(crate) struct SessionClock {
    epoch: Instant,
    last_ok_ms: Arc<std::sync::atomic::AtomicU64>,
    timeout: Duration,
    /// Set when this member knows it is out (it left the group): not alive
    /// until the next confirmation.
    expired: Arc<AtomicBool>,
    /// A JoinGroup is waiting at the coordinator, which does not expire
    /// members waiting to rejoin: the session holds meanwhile.
    pub(super) joining: Arc<AtomicBool>,
    /// A JoinGroup answered (the group moved to a new generation) and the
    /// runtime has not applied its outcome yet: the current generation is
    /// stale, commits under it would be refused.
    pub(super) between_generations: Arc<AtomicBool>,
    /// Until when (ms on this clock's epoch) the peers that could drop this
    /// member for silence promised not to (`group::peers`); `u64::MAX`
    /// when none could. Past it the member writes nothing, as past a
    /// session timeout: a peer may have made the group drop it.
    lease_until_ms: Arc<std::sync::atomic::AtomicU64>,
    /// Held by an exactly-once commit while it sends offsets under the
    /// current generation, and by the membership while it starts a
    /// JoinGroup: no JoinGroup (which ends the generation once the group
    /// completes it) overlaps a commit's offsets.
    commit_gate: Arc<std::sync::Mutex<()>>,
}

impl SessionClock {
    pub(super) fn new(timeout: Duration) -> SessionClock {
        SessionClock {
            epoch: Instant::now(),
            last_ok_ms: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            timeout,
            expired: Arc::new(AtomicBool::new(false)),
            joining: Arc::new(AtomicBool::new(false)),
            between_generations: Arc::new(AtomicBool::new(false)),
            lease_until_ms: Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
            commit_gate: Arc::default(),
        }
    }

    /// The group's session timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Exactly-once: whether the current generation is settled: no
    /// JoinGroup is under way and the last one's assignment was applied.
    /// Check it while holding [`SessionClock::commit_gate`].
    pub(crate) fn generation_settled(&self) -> bool {
        !self.joining.load(Ordering::SeqCst) && !self.between_generations.load(Ordering::SeqCst)
    }

    /// Exactly-once: held while a commit sends offsets under the current
    /// generation (see [`SessionClock::generation_settled`]).
    pub(crate) fn commit_gate(&self) -> std::sync::MutexGuard<'_, ()> {
        self.commit_gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn confirmed(&self) {
        self.last_ok_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
        self.expired.store(false, Ordering::SeqCst);
    }

    /// This member is out of the group until the next confirmation.
    pub(super) fn expire(&self) {
        self.expired.store(true, Ordering::SeqCst);
    }

    /// How long since the last confirmation (or since the clock started).
    pub(super) fn since(&self) -> Duration {
        self.epoch.elapsed().saturating_sub(Duration::from_millis(self.last_ok_ms.load(Ordering::SeqCst)))
    }

    /// Whether the coordinator confirmed this member within a session
    /// timeout, and every peer watching it still holds it alive (its lease).
    pub(crate) fn alive(&self) -> bool {
        if self.expired.load(Ordering::SeqCst) || !self.leased() {
            return false;
        }
        let last = Duration::from_millis(self.last_ok_ms.load(Ordering::SeqCst));
        self.joining.load(Ordering::SeqCst) || self.epoch.elapsed().saturating_sub(last) < self.timeout
    }

    /// Whether the peers' lease holds (always, without peers).
    pub(crate) fn leased(&self) -> bool {
        (self.epoch.elapsed().as_millis() as u64) < self.lease_until_ms.load(Ordering::SeqCst)
    }

    /// Sets the peers' lease: writes stop at `until` (`None`: no peer can
    /// drop this member for silence).
    pub(super) fn set_lease(&self, until: Option<Instant>) {
        let ms = until.map_or(u64::MAX, |t| t.saturating_duration_since(self.epoch).as_millis() as u64);
        self.lease_until_ms.store(ms, Ordering::SeqCst);
    }

    /// Whether the coordinator confirmed this member within a session
    /// timeout, leaving the peers' lease aside (may it judge others?).
    pub(super) fn confirmed_recently(&self) -> bool {
        let last = Duration::from_millis(self.last_ok_ms.load(Ordering::SeqCst));
        !self.expired.load(Ordering::SeqCst)
            && (self.joining.load(Ordering::SeqCst) || self.epoch.elapsed().saturating_sub(last) < self.timeout)
    }
}
