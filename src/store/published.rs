//! Store partitions published for interactive queries (`crate::query`).
//!
//! Every store partition open on this instance has a [`Slot`] in the
//! application's [`Published`] registry: its RocksDB engine (read through
//! snapshots, so a reader sees one committed state with its checkpoint,
//! never half a commit), which copy this is (restoring, standby or active),
//! the changelog's end offset as last seen, and for an active copy how far
//! its input is reflected in RocksDB. The store withdraws its engine before
//! it closes, reopens for a bulk load or is wiped: the withdrawal waits only
//! for the reads in progress (each a point read or a bounded scan), so a
//! query never keeps a closed RocksDB open and never holds up a rebalance
//! (architecture.md §8).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::group::HostTasks;
use crate::store::engine::{Checkpoint, Engine};
use crate::store::ttl::Ttl;

/// Which copy of a store partition this instance holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// None (closed, or not opened here).
    Gone = 0,
    /// An active task's copy, being restored.
    Restoring = 1,
    /// A standby's or warmup's copy.
    Standby = 2,
    /// The active task's copy, processing.
    Active = 3,
}

impl Role {
    fn of(b: u8) -> Role {
        match b {
            1 => Role::Restoring,
            2 => Role::Standby,
            3 => Role::Active,
            _ => Role::Gone,
        }
    }
}

/// What a reader needs of an open store partition.
struct OpenStore {
    engine: Arc<Engine>,
    /// The store's TTL (a copy for reads, following the same clock).
    ttl: Option<Ttl>,
}

/// One store partition as readers on other threads see it.
pub(crate) struct Slot {
    open: RwLock<Option<OpenStore>>,
    role: AtomicU8,
    /// The changelog's end offset as last seen by the restore thread
    /// (restoring and standby copies); -1: unknown.
    end: AtomicI64,
    /// Every changelog offset below this one is reflected in RocksDB: the
    /// restore consumer's position once all it returned was written, past
    /// transaction markers and aborted records, which the checkpoint (the
    /// last record written) is not; -1: unknown.
    reflected: AtomicI64,
    /// An active copy's input offsets (per topic, the next offset to
    /// process) whose writes are all in RocksDB.
    input: Mutex<BTreeMap<String, i64>>,
    /// A commit's writes landed here without its input offsets being
    /// published (a commit abandoned at a close): `input` may lag the
    /// state until the copy is published again; savepoints pass it over.
    input_behind: AtomicBool,
}

/// What a read through a slot found, and the state it was read at.
pub(crate) struct SlotRead<T> {
    pub(crate) value: T,
    /// The checkpoint of the snapshot read (`None`: nothing committed).
    pub(crate) checkpoint: Option<i64>,
    pub(crate) role: Role,
    /// The changelog's end offset as last seen (-1: unknown).
    pub(crate) end: i64,
    /// See [`Slot::set_reflected`] (-1: unknown).
    pub(crate) reflected: i64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            open: RwLock::new(None),
            role: AtomicU8::new(0),
            end: AtomicI64::new(-1),
            reflected: AtomicI64::new(-1),
            input: Mutex::new(BTreeMap::new()),
            input_behind: AtomicBool::new(false),
        }
    }

    /// Makes the store readable (again) as `role`.
    pub(crate) fn publish(&self, engine: Arc<Engine>, ttl: Option<Ttl>, role: Role) {
        let mut open = self.open.write().unwrap_or_else(|p| p.into_inner());
        *open = Some(OpenStore { engine, ttl });
        self.reflected.store(-1, Ordering::Release);
        self.input_behind.store(false, Ordering::Release);
        self.set_role(role);
    }

    /// Takes the engine away (a bulk load, a wipe), once the reads in
    /// progress finished; the copy stays what it is (reads of it answer
    /// "restoring" meanwhile).
    pub(crate) fn withdraw_engine(&self) {
        self.open.write().unwrap_or_else(|p| p.into_inner()).take();
        self.reflected.store(-1, Ordering::Release);
    }

    /// The copy is gone from here (closing, or handed to the closer).
    pub(crate) fn close(&self) {
        let mut open = self.open.write().unwrap_or_else(|p| p.into_inner());
        open.take();
        self.role.store(Role::Gone as u8, Ordering::Release);
        self.end.store(-1, Ordering::Release);
        self.reflected.store(-1, Ordering::Release);
        self.input.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The copy is no longer offered to queries (closing): its role is
    /// `Gone` at once, without waiting for the reads or the snapshot
    /// checkpoint in progress; [`Slot::close`] (when the store drops, on the
    /// closing thread) then takes the engine away.
    pub(crate) fn retire(&self) {
        self.role.store(Role::Gone as u8, Ordering::Release);
        self.end.store(-1, Ordering::Release);
        self.reflected.store(-1, Ordering::Release);
        self.input.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Whether an engine is published.
    pub(crate) fn is_published(&self) -> bool {
        self.open.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    pub(crate) fn set_role(&self, role: Role) {
        self.role.store(role as u8, Ordering::Release);
        if role != Role::Active {
            self.input.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    pub(crate) fn role(&self) -> Role {
        Role::of(self.role.load(Ordering::Acquire))
    }

    pub(crate) fn set_end(&self, end: i64) {
        self.end.store(end, Ordering::Release);
    }

    /// Every changelog offset below `next` is reflected in RocksDB (the
    /// restore consumer's position with nothing it returned left unwritten):
    /// a caught-up copy of a transactional changelog, whose last offsets are
    /// commit markers, lags 0 records, not 1.
    pub(crate) fn set_reflected(&self, next: i64) {
        self.reflected.fetch_max(next, Ordering::AcqRel);
    }

    /// An active copy's input up to `next` (exclusive) of `topic` is in RocksDB.
    pub(crate) fn input_landed(&self, topic: &str, next: i64) {
        let mut input = self.input.lock().unwrap_or_else(|p| p.into_inner());
        match input.get_mut(topic) {
            Some(o) => *o = (*o).max(next),
            None => {
                input.insert(topic.to_string(), next);
            }
        }
    }

    /// The next input offset of `topic` not yet reflected (actives; `None`: unknown).
    pub(crate) fn input_reflected(&self, topic: &str) -> Option<i64> {
        self.input.lock().unwrap_or_else(|p| p.into_inner()).get(topic).copied()
    }

    /// Writes landed here whose input offsets were never published (see
    /// `input_behind`).
    pub(crate) fn input_fell_behind(&self) {
        self.input_behind.store(true, Ordering::Release);
    }

    /// Whether [`Slot::input_reflected`] may lag the state (no savepoint
    /// cut of this copy).
    pub(crate) fn input_is_behind(&self) -> bool {
        self.input_behind.load(Ordering::Acquire)
    }

    /// Runs `f` on the published engine, held like a read (a snapshot's
    /// checkpoint call); `None` when nothing is published.
    pub(crate) fn with_engine<T>(&self, f: impl FnOnce(&Engine) -> T) -> Option<T> {
        let open = self.open.read().unwrap_or_else(|p| p.into_inner());
        open.as_ref().map(|o| f(&o.engine))
    }

    /// Reads through the published engine; `None` when nothing is
    /// published. `read` gets the engine and the TTL filter, and returns
    /// its value with the checkpoint of the snapshot it read.
    pub(crate) fn read<T>(&self, read: impl FnOnce(&Engine, &dyn Fn(&[u8]) -> Option<Vec<u8>>) -> Result<(T, Checkpoint)>) -> Option<Result<SlotRead<T>>> {
        let open = self.open.read().unwrap_or_else(|p| p.into_inner());
        let open = open.as_ref()?;
        // Under the lock: the role and end of the copy being read (a
        // promotion may still come after, reporting the lesser copy).
        let role = self.role();
        let end = self.end.load(Ordering::Acquire);
        let reflected = self.reflected.load(Ordering::Acquire);
        let now = open.ttl.as_ref().and_then(Ttl::read_time);
        let live = |stored: &[u8]| match &open.ttl {
            Some(ttl) => ttl.live(stored, now).map(<[u8]>::to_vec),
            None => Some(stored.to_vec()),
        };
        Some(read(&open.engine, &live).map(|(value, checkpoint)| SlotRead {
            value,
            checkpoint: match checkpoint {
                Checkpoint::At(c) => Some(c),
                _ => None,
            },
            role,
            end,
            reflected,
        }))
    }
}

/// Whether the application runs, as queries see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunState {
    NotStarted = 0,
    Running = 1,
    Stopped = 2,
}

/// The group's view of where tasks are, as of one assignment.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hosts {
    pub(crate) hosts: Vec<HostTasks>,
}

/// Every published store partition of one application, the group's
/// host metadata, and whether it runs.
#[derive(Default)]
pub(crate) struct Published {
    slots: RwLock<HashMap<String, HashMap<i32, Arc<Slot>>>>,
    state: AtomicU8,
    /// The input topics' partition count (0: not known yet).
    partitions: AtomicI32,
    hosts: RwLock<Arc<Hosts>>,
    /// Commits landing in RocksDB, against savepoint cuts.
    pub(crate) landing: Arc<LandingGate>,
}

impl Published {
    /// The slot of a store partition, created on first use.
    pub(crate) fn slot(&self, store: &str, partition: i32) -> Arc<Slot> {
        if let Some(s) = self.find(store, partition) {
            return s;
        }
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        slots.entry(store.to_string()).or_default().entry(partition).or_insert_with(|| Arc::new(Slot::new())).clone()
    }

    /// The slot of a store partition, if it was ever opened here.
    pub(crate) fn find(&self, store: &str, partition: i32) -> Option<Arc<Slot>> {
        self.slots.read().unwrap_or_else(|p| p.into_inner()).get(store)?.get(&partition).cloned()
    }

    /// Every slot of a store, by partition.
    pub(crate) fn slots_of(&self, store: &str) -> Vec<(i32, Arc<Slot>)> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = slots.get(store).map(|m| m.iter().map(|(p, s)| (*p, s.clone())).collect()).unwrap_or_default();
        out.sort_by_key(|(p, _)| *p);
        out
    }

    pub(crate) fn set_state(&self, state: RunState) {
        self.state.store(state as u8, Ordering::Release);
    }

    pub(crate) fn state(&self) -> RunState {
        match self.state.load(Ordering::Acquire) {
            0 => RunState::NotStarted,
            1 => RunState::Running,
            _ => RunState::Stopped,
        }
    }

    pub(crate) fn set_partitions(&self, n: i32) {
        self.partitions.store(n, Ordering::Release);
    }

    pub(crate) fn partitions(&self) -> i32 {
        self.partitions.load(Ordering::Acquire)
    }

    pub(crate) fn set_hosts(&self, hosts: Hosts) {
        *self.hosts.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(hosts);
    }

    pub(crate) fn hosts(&self) -> Arc<Hosts> {
        self.hosts.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Keeps a savepoint's cut of a task (a checkpoint of each of its stores
/// and its input offsets) from seeing half a commit: a commit counts as
/// landing from its first RocksDB write until its input offsets are
/// published ([`Slot::input_landed`]), on whichever threads that happens;
/// a cut waits until no commit is landing and holds new ones back for the
/// checkpoint calls (architecture.md §10, "savepoints").
#[derive(Default)]
pub(crate) struct LandingGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    landing: usize,
    cutting: bool,
    /// A landing was abandoned (its commit failed): the state may be ahead
    /// of the published input offsets until the application restarts.
    poisoned: bool,
}

/// One commit landing; [`Landing::done`] once its input offsets are
/// published. Dropped without it (a failed commit), it refuses every later
/// cut: the state may be ahead of the offsets.
#[must_use]
pub(crate) struct Landing {
    gate: Option<Arc<LandingGate>>,
}

impl LandingGate {
    /// A commit starts landing (waits while a cut takes its checkpoints).
    pub(crate) fn begin(self: &Arc<Self>) -> Landing {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.cutting {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.landing += 1;
        Landing { gate: Some(self.clone()) }
    }

    /// Runs `f` once no commit is landing, holding new ones back; gives up
    /// after `patience` (a commit that takes that long to land) or once
    /// `stop` says so (checked every 100 ms).
    pub(crate) fn cut<T>(&self, patience: Duration, stop: &dyn Fn() -> bool, f: impl FnOnce() -> T) -> std::result::Result<T, String> {
        const POISONED: &str = "a commit failed while landing; savepoints are refused until the application restarts";
        let deadline = Instant::now() + patience;
        let wait = |s| self.changed.wait_timeout(s, Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner()).0;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.cutting {
            if Instant::now() >= deadline || stop() {
                return Err("another cut is taking long".into());
            }
            s = wait(s);
        }
        if s.poisoned {
            return Err(POISONED.into());
        }
        s.cutting = true;
        drop(s);
        // New landings go on once the cut ends, whatever way (a panic in
        // `f`). Declared before the lock below, so dropped after it.
        struct Reset<'g>(&'g LandingGate);
        impl Drop for Reset<'_> {
            fn drop(&mut self) {
                self.0.state.lock().unwrap_or_else(|p| p.into_inner()).cutting = false;
                self.0.changed.notify_all();
            }
        }
        let _reset = Reset(self);
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.landing > 0 && !s.poisoned {
            if Instant::now() >= deadline || stop() {
                return Err(format!("a commit was still landing after {patience:?}, or the application is stopping"));
            }
            s = wait(s);
        }
        if s.poisoned {
            return Err(POISONED.into());
        }
        drop(s);
        Ok(f())
    }
}

impl Landing {
    /// The commit's input offsets are published (or its tasks closed).
    pub(crate) fn done(mut self) {
        if let Some(gate) = self.gate.take() {
            let mut s = gate.state.lock().unwrap_or_else(|p| p.into_inner());
            s.landing -= 1;
            gate.changed.notify_all();
        }
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            let mut s = gate.state.lock().unwrap_or_else(|p| p.into_inner());
            s.landing -= 1;
            s.poisoned = true;
            gate.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod gate_tests {
    use super::*;

    #[test]
    fn a_cut_waits_for_landings_and_holds_new_ones_back() {
        let gate = Arc::new(LandingGate::default());
        let landing = gate.begin();
        let never = || false;
        assert!(gate.cut(Duration::from_millis(50), &never, || ()).is_err(), "a landing in progress blocks the cut");
        assert!(gate.cut(Duration::from_secs(60), &|| true, || ()).is_err(), "a stop ends the wait");
        let g = gate.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            landing.done();
            g.begin().done();
        });
        let order = gate.cut(Duration::from_secs(5), &never, || "cut").unwrap();
        assert_eq!(order, "cut");
        t.join().unwrap();
        let abandoned = gate.begin();
        drop(abandoned);
        assert!(gate.cut(Duration::from_secs(1), &never, || ()).unwrap_err().contains("refused"));
    }
}
