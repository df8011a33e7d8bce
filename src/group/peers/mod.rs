//! Failure detection among an application's instances (docs/architecture.md
//! §9): with `peer_address` set, every instance listens there, the leader
//! tells every member where the others listen, and each instance keeps a
//! link to every other one ([`link`]). A peer whose process is gone (its
//! link breaks and its listener refuses, or another process answers there)
//! or that fell silent for `peer_timeout` is dropped from the group at once
//! with a LeaveGroup naming it, instead of at its session timeout, and the
//! other members are nudged to rejoin, so the rebalance that moves its
//! tasks to their standbys starts within milliseconds.
//!
//! Dropping a member that is only frozen is safe because of leases: a
//! member writes only while every peer that could drop it for silence
//! granted it a lease (an ack of a ping sent less than `peer_timeout` ago,
//! see [`super::SessionClock::alive`]), so by the time a peer drops it, it
//! stopped writing. A dead process needs no lease: it writes nothing.

mod auth;
mod link;

pub(crate) use auth::{SecretSetting, Secrets};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::{GroupId, HeartbeatRequest, LeaveGroupRequest};
use kafka_protocol::protocol::StrBytes;

use super::conn::Connection;
use super::coordinator::Brokers;
use super::payload::{PeerAddress, PeerInfo};
use super::session::SessionClock;
use link::LinkCommand;

/// A peer dropped for silence again within this window waits longer first.
const FLAP_WINDOW: Duration = Duration::from_secs(600);

/// `peer_address` and `peer_timeout`, with the listener bound at startup.
#[derive(Debug, Clone)]
pub(crate) struct PeerSettings {
    pub(crate) listener: Arc<TcpListener>,
    /// `host:port` other instances connect to.
    pub(crate) advertised: String,
    pub(crate) timeout: Duration,
    /// The links' shared secrets (`None`: unauthenticated, chosen explicitly).
    pub(crate) secret: Option<Secrets>,
}

/// Why a peer was dropped (the `reason` label of `kstate_peers_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// Its process is gone (link broke and its listener refuses, or another process answers).
    Closed,
    /// Silent for its grace while it held this instance's lease.
    Timeout,
}

impl Reason {
    fn label(self) -> &'static str {
        match self {
            Reason::Closed => "closed",
            Reason::Timeout => "timeout",
        }
    }
}

/// What this instance knows of one peer of the current generation.
struct Peer {
    info: PeerInfo,
    /// When it last pinged this instance (any generation).
    last_heard: Option<Instant>,
    /// It holds this instance's lease: it may be dropped for silence.
    armed: bool,
    /// Until when the leases this instance granted it may run: the
    /// receipt of each ping answered with a lease plus that lease's
    /// grace, the latest of them. It is not judged before (a grace that
    /// grew after a drop and shrank again cannot cut a lease short).
    covered_until: Option<Instant>,
    /// This instance must stop writing at this time unless it hears from
    /// the peer: its lease from the peer (kept across generations until the
    /// peer answers from the same generation as this member).
    lease: Option<Instant>,
    /// The generation whose lease this instance holds (its pings say `armed`).
    lease_generation: Option<i32>,
    /// Why its process is known to be gone.
    gone: Option<String>,
    commands: Sender<LinkCommand>,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    /// A peer of a generation this instance just learnt of.
    fn new(info: PeerInfo, commands: Sender<LinkCommand>, thread: Option<JoinHandle<()>>) -> Peer {
        Peer {
            info,
            last_heard: None,
            armed: false,
            covered_until: None,
            lease: None,
            lease_generation: None,
            gone: None,
            commands,
            thread,
        }
    }
}

/// Timeout drops of one process (by incarnation), for damping.
#[derive(Default, Clone, Copy)]
struct Drops {
    count: u32,
    last: Option<Instant>,
}

struct State {
    member: String,
    generation: i32,
    /// `group.instance.id`, if static.
    instance_id: Option<String>,
    peers: BTreeMap<String, Peer>,
    /// Member ids this instance had dropped (their pings are told so).
    dropped: HashSet<String>,
    /// Processes that said bye.
    departed: HashSet<u64>,
    drops: HashMap<u64, Drops>,
    /// The last drop, for the time to the next assignment.
    detected: Option<Instant>,
    /// `(member id, generation)` of a JoinGroup answered but not yet
    /// synced: the coordinator holds this member in that generation while
    /// the round waits for the leader's SyncGroup (a leader frozen there
    /// is a silent peer like any other).
    joining: Option<(String, i32)>,
}

/// What the threads share.
pub(super) struct Shared {
    group: String,
    incarnation: u64,
    /// This instance's peer address, as published.
    advertised: String,
    timeout: Duration,
    session_timeout: Duration,
    session: SessionClock,
    /// Asks the membership to heartbeat now (a rebalance may have started).
    nudge: Arc<dyn Fn() + Send + Sync>,
    stop: AtomicBool,
    /// Set when this instance stops on purpose: it judges no one any more.
    quiet: AtomicBool,
    state: Mutex<State>,
    /// The links' shared secrets (`None`: unauthenticated).
    secret: Option<Secrets>,
    /// What the listener refuses, and the connections per source.
    gate: auth::Gate,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long `incarnation` may be silent before it is dropped: doubled
    /// for each time it was dropped for silence in the last ten minutes.
    /// `None`: dropped too often; left to the session timeout.
    fn grace(&self, drops: &HashMap<u64, Drops>, incarnation: u64) -> Option<Duration> {
        let d = drops.get(&incarnation).copied().unwrap_or_default();
        let recent = if d.last.is_some_and(|t| t.elapsed() < FLAP_WINDOW) { d.count } else { 0 };
        let grace = self.timeout * (1u32 << recent.min(8));
        (grace < self.session_timeout).then_some(grace)
    }

    /// A ping from `member`: note it alive and answer with a lease (ms,
    /// 0 for none) and whether this instance dropped it.
    fn pinged(&self, member: &str, generation: i32, armed: bool) -> (u64, bool, i32) {
        let mut state = self.state();
        let current = state.generation;
        if state.dropped.contains(member) {
            return (0, true, current);
        }
        let Some(incarnation) = state.peers.get(member).map(|p| p.info.address.incarnation) else { return (0, false, current) };
        let grace = self.grace(&state.drops, incarnation);
        let peer = state.peers.get_mut(member).expect("looked up");
        peer.last_heard = Some(Instant::now());
        if generation != current || current < 0 {
            return (0, false, current);
        }
        match grace {
            Some(grace) => {
                let until = Instant::now() + grace;
                peer.covered_until = Some(peer.covered_until.map_or(until, |c| c.max(until)));
                if armed && !peer.armed {
                    peer.armed = true;
                    tracing::debug!(peer = %peer.info.address.address, member, "peer armed: it may be dropped for silence");
                }
                (grace.as_millis() as u64, false, current)
            }
            None => (0, false, current),
        }
    }

    /// The identity a ping to `peer` carries, and whether this instance
    /// holds that peer's lease.
    fn ping_identity(&self, peer: &str) -> (String, i32, bool) {
        let state = self.state();
        let armed = state.peers.get(peer).is_some_and(|p| p.lease_generation == Some(state.generation));
        (state.member.clone(), state.generation, armed)
    }

    /// An ack of a ping sent `at` under `generation`.
    fn acked(&self, peer: &str, generation: i32, at: Instant, ack: link::Ack) {
        let link::Ack { lease_ms, dropped, generation: theirs } = ack;
        let mut state = self.state();
        // An answer to a ping of an earlier generation (or sent before
        // this member found itself out) says nothing about this one.
        if generation != state.generation || generation < 0 {
            return;
        }
        if dropped {
            drop(state);
            tracing::warn!(peer, "a peer made the group drop this member; its tasks are elsewhere now");
            self.session.expire();
            (self.nudge)();
            return;
        }
        // Until the peer answers from this generation, the lease of the
        // previous one still bounds the writes: it may still judge us there.
        if theirs != generation {
            return;
        }
        if let Some(p) = state.peers.get_mut(peer) {
            if lease_ms == 0 {
                // It will not drop us for silence in this generation.
                p.lease = None;
                p.lease_generation = None;
            } else {
                // A quarter of the grace as margin: writes stop before the
                // peer could decide this member is gone.
                let until = at + Duration::from_millis(lease_ms * 3 / 4);
                let same = p.lease_generation == Some(generation);
                p.lease = Some(if same { p.lease.map_or(until, |l| l.max(until)) } else { until });
                p.lease_generation = Some(generation);
            }
        }
        self.refresh_lease(&state);
    }

    /// The member may write until the earliest lease of a live peer.
    fn refresh_lease(&self, state: &State) {
        let until = state
            .peers
            .values()
            .filter(|p| {
                p.gone.is_none() && !state.departed.contains(&p.info.address.incarnation) && !state.dropped.contains(&p.info.member_id)
            })
            .filter_map(|p| p.lease)
            .min();
        self.session.set_lease(until);
    }

    fn gone(&self, peer: &PeerInfo, why: String) {
        let mut state = self.state();
        if let Some(p) = state.peers.get_mut(&peer.member_id) {
            if p.gone.is_none() && p.info.address.incarnation == peer.address.incarnation {
                tracing::info!(peer = %peer.address.address, member = %peer.member_id, reason = %why, "peer process gone");
                p.gone = Some(why);
            }
        }
        self.refresh_lease(&state);
    }

    /// This instance's `Hello`, with its nonce for the handshake.
    fn hello(&self, nonce: &str) -> link::Msg {
        let state = self.state();
        link::Msg::Hello {
            nonce: nonce.to_string(),
            group: self.group.clone(),
            incarnation: self.incarnation,
            member: state.member.clone(),
            generation: state.generation,
            instance_id: state.instance_id.clone(),
            address: self.advertised.clone(),
        }
    }

    /// A static member of this generation introduced itself under a member
    /// id or incarnation this instance does not know: it restarted into its
    /// place (`group.instance.id`) without a rebalance. Watch the new process
    /// instead of the old one.
    fn introduced(shared: &Arc<Shared>, info: PeerInfo, generation: i32) {
        let mut state = shared.state();
        if generation != state.generation || generation < 0 || info.instance_id.is_none() || info.instance_id == state.instance_id {
            return;
        }
        let Some(old) = state.peers.iter().find(|(_, p)| p.info.instance_id == info.instance_id).map(|(id, _)| id.clone()) else { return };
        if old == info.member_id && state.peers[&old].info.address == info.address {
            return;
        }
        if let Some(p) = state.peers.remove(&old) {
            let _ = p.commands.send(LinkCommand::Stop);
        }
        tracing::info!(peer = %info.address.address, member = %info.member_id, instance = ?info.instance_id,
            "a static member restarted into its place; watching the new process");
        let (commands, rx) = mpsc::channel();
        let (s, target) = (shared.clone(), info.clone());
        let thread = std::thread::Builder::new().name("kstate-peer-out".into()).spawn(move || link::call(s, target, rx)).ok();
        state.peers.insert(info.member_id.clone(), Peer::new(info, commands, thread));
        shared.refresh_lease(&state);
    }

    /// Whether `incarnation` is this process or a member of its generation.
    fn is_member_incarnation(&self, incarnation: u64) -> bool {
        incarnation == self.incarnation || self.state().peers.values().any(|p| p.info.address.incarnation == incarnation)
    }

    /// A peer said bye: it stops on purpose and leaves the group right
    /// after. This member heartbeats shortly after (twice, the leave may
    /// take a moment to reach the coordinator), so that the rebalance that
    /// moves the peer's tasks starts now instead of at the next heartbeat:
    /// a clean shutdown's partitions are served again within a second.
    fn departed(&self, incarnation: u64) {
        let mut state = self.state();
        state.departed.insert(incarnation);
        self.refresh_lease(&state);
        drop(state);
        let nudge = self.nudge.clone();
        let _ = std::thread::Builder::new().name("kstate-peer-bye".into()).spawn(move || {
            for pause in [Duration::from_millis(100), Duration::from_millis(400)] {
                std::thread::sleep(pause);
                nudge();
            }
        });
    }
}

/// The membership's handle on failure detection (a listener thread, a
/// monitor thread and one link thread per peer).
pub(crate) struct Peers {
    shared: Arc<Shared>,
    advertised: String,
    threads: Vec<JoinHandle<()>>,
}

impl Peers {
    /// Starts listening and watching. `nudge` asks the membership to
    /// heartbeat at once.
    pub(crate) fn start(
        settings: &PeerSettings,
        group: &str,
        instance_id: Option<String>,
        session_timeout: Duration,
        session: SessionClock,
        brokers: Brokers,
        nudge: Box<dyn Fn() + Send + Sync>,
    ) -> std::io::Result<Peers> {
        let shared = Arc::new(Shared {
            group: group.to_string(),
            incarnation: rand_u64(),
            advertised: settings.advertised.clone(),
            timeout: settings.timeout,
            session_timeout,
            session,
            nudge: Arc::from(nudge),
            stop: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
            secret: settings.secret.clone(),
            gate: auth::Gate::default(),
            state: Mutex::new(State {
                member: String::new(),
                generation: -1,
                instance_id,
                peers: BTreeMap::new(),
                dropped: HashSet::new(),
                departed: HashSet::new(),
                drops: HashMap::new(),
                detected: None,
                joining: None,
            }),
        });
        let listener = {
            let (shared, listener) = (shared.clone(), settings.listener.clone());
            std::thread::Builder::new().name("kstate-peer-listen".into()).spawn(move || link::listen(shared, listener))?
        };
        let monitor = {
            let shared = shared.clone();
            std::thread::Builder::new().name("kstate-peers".into()).spawn(move || monitor(shared, brokers))?
        };
        tracing::info!(address = %settings.advertised, peer_timeout = ?settings.timeout, "watching the other instances");
        Ok(Peers { shared, advertised: settings.advertised.clone(), threads: vec![listener, monitor] })
    }

    /// What this member publishes in its subscription.
    pub(crate) fn address(&self) -> PeerAddress {
        PeerAddress { address: self.advertised.clone(), incarnation: self.shared.incarnation }
    }

    /// A JoinGroup answered: this member is in `generation` of the
    /// coordinator until its SyncGroup returns (see `still_member`).
    pub(crate) fn joined(&self, generation: i32, member: &str) {
        self.shared.state().joining = Some((member.to_string(), generation));
    }

    /// A new generation: watch its members (all but `member`, this one).
    /// A peer kept from the last one keeps its arming (below).
    pub(crate) fn assigned(&self, generation: i32, member: &str, peers: &[PeerInfo]) {
        let mut state = self.shared.state();
        state.joining = None;
        state.member = member.to_string();
        // A peer kept from the last generation (same member id, same
        // process) stays armed: its writes are still bounded by the lease
        // it holds from this instance, whichever generation granted it (a
        // lease runs out on its own; a new one comes only with an ack), so
        // a peer that freezes in the round before a generation, or before
        // it applies the new one, is dropped for silence as in a settled
        // generation. The leases this member holds stay as limits until
        // each peer answers from the new generation (see `Shared::acked`).
        state.generation = generation;
        if let Some(at) = state.detected.take() {
            let took = at.elapsed();
            metrics::histogram!(crate::metrics::PEER_FAILOVER_SECONDS).record(took.as_secs_f64());
            tracing::info!(generation, took = ?took, "new assignment after dropping a peer");
        }
        let instance_id = state.instance_id.clone();
        let wanted: BTreeMap<&str, &PeerInfo> = peers
            .iter()
            .filter(|p| p.member_id != member && p.address.incarnation != self.shared.incarnation)
            // This member's own place under an earlier member id (a static
            // member that restarted into an unchanged generation).
            .filter(|p| p.instance_id.is_none() || p.instance_id != instance_id)
            .map(|p| (p.member_id.as_str(), p))
            .collect();
        let stale: Vec<String> = state
            .peers
            .iter()
            .filter(|(id, p)| wanted.get(id.as_str()).is_none_or(|w| w.address != p.info.address))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if let Some(p) = state.peers.remove(&id) {
                let _ = p.commands.send(LinkCommand::Stop);
            }
        }
        for (id, info) in wanted {
            if let Some(p) = state.peers.get_mut(id) {
                let _ = p.commands.send(LinkCommand::PingNow);
                continue;
            }
            let (commands, rx) = mpsc::channel();
            let (shared, target) = (self.shared.clone(), info.clone());
            let thread = std::thread::Builder::new().name("kstate-peer-out".into()).spawn(move || link::call(shared, target, rx)).ok();
            state.peers.insert(id.to_string(), Peer::new(info.clone(), commands, thread));
        }
        state.dropped.retain(|m| peers.iter().all(|p| &p.member_id != m));
        if state.dropped.len() > 10_000 {
            state.dropped.clear(); // a bound; old members' pings stop long before
        }
        metrics::gauge!(crate::metrics::PEERS).set(state.peers.len() as f64);
        self.shared.refresh_lease(&state);
    }

    /// This member is out of the group: it watches no one until it is back.
    /// The session is over too: nothing may be written until the member
    /// is confirmed in a new generation.
    pub(crate) fn lost(&self) {
        let mut state = self.shared.state();
        state.generation = -1;
        state.member.clear();
        state.joining = None;
        for p in state.peers.values_mut() {
            p.armed = false;
        }
        self.shared.session.expire();
    }

    /// Stops the threads; `bye`: tell the peers this is on purpose.
    pub(crate) fn stop(mut self, bye: bool) {
        self.shared.quiet.store(true, Ordering::SeqCst);
        {
            let mut state = self.shared.state();
            for (_, p) in std::mem::take(&mut state.peers) {
                let _ = p.commands.send(if bye { LinkCommand::Bye } else { LinkCommand::Stop });
                self.threads.extend(p.thread);
            }
        }
        // The byes go out before the listener closes.
        let deadline = Instant::now() + Duration::from_secs(1);
        for t in self.threads.drain(2..) {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            while !t.is_finished() && Instant::now() < deadline + Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

impl Drop for Peers {
    /// Without [`Peers::stop`] (the membership thread ended abruptly):
    /// judge no one, end every thread.
    fn drop(&mut self) {
        self.shared.quiet.store(true, Ordering::SeqCst);
        self.shared.stop.store(true, Ordering::SeqCst);
        for p in self.shared.state().peers.values() {
            let _ = p.commands.send(LinkCommand::Stop);
        }
    }
}

/// The monitor: drops peers found gone or silent, every few milliseconds.
fn monitor(shared: Arc<Shared>, brokers: Brokers) {
    let tick = (shared.timeout / 20).clamp(Duration::from_millis(5), Duration::from_millis(50));
    let mut last_tick = Instant::now();
    let mut conn: Option<Connection> = None;
    let mut retry_at: HashMap<String, Instant> = HashMap::new();
    let mut leased = true;
    let mut stalled_at: Option<Instant> = None;
    // After the coordinator did not confirm this member (or could not be
    // asked): no silence is judged before this, so that the check is not
    // repeated every tick while the member rejoins.
    let mut judge_after: Option<Instant> = None;
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        let now = Instant::now();
        let gap = now - last_tick;
        last_tick = now;
        let mut state = shared.state();
        if leased && !shared.session.leased() {
            metrics::counter!(crate::metrics::PEER_LEASE_LAPSES).increment(1);
            let late: Vec<&str> = state
                .peers
                .values()
                .filter(|p| p.gone.is_none() && p.lease.is_some_and(|l| l <= now + tick))
                .map(|p| p.info.address.address.as_str())
                .collect();
            tracing::warn!(peers = ?late, "peers' acks stopped: this instance writes nothing until they answer or the group drops them");
        }
        leased = shared.session.leased();
        // This instance itself was frozen or starved: the peers' silence
        // meanwhile says nothing about them.
        if gap > shared.timeout / 3 {
            tracing::warn!(stalled_for = ?gap, "this instance did not run for a while; peers' silence meanwhile is not held against them");
            state.peers.values_mut().filter(|p| p.last_heard.is_some()).for_each(|p| p.last_heard = Some(now));
            stalled_at = Some(now);
            drop(state);
            (shared.nudge)(); // is this member still in the group?
            continue;
        }
        // Only a member the coordinator confirms judges others (for
        // silence, after a stall: confirmed again since). A JoinGroup round
        // does not stop the judging: a live peer keeps pinging through it
        // (its links do not wait on its membership), and a silent one's
        // writes stopped with its lease.
        let confirmed_since_stall = stalled_at.is_none_or(|t| shared.session.since() < t.elapsed());
        if shared.quiet.load(Ordering::SeqCst) || !shared.session.confirmed_recently() || state.generation < 0 {
            continue;
        }
        let mut victims = Vec::new();
        for (id, p) in &state.peers {
            if state.dropped.contains(id) || state.departed.contains(&p.info.address.incarnation) {
                continue;
            }
            if retry_at.get(id).is_some_and(|t| now < *t) {
                continue;
            }
            if let Some(why) = &p.gone {
                victims.push((p.info.clone(), Reason::Closed, why.clone()));
            } else if confirmed_since_stall && judge_after.is_none_or(|t| now >= t) && p.armed {
                // Judged by today's grace, and never before the leases
                // it was granted may have run out.
                let grace = shared.grace(&state.drops, p.info.address.incarnation);
                if let (Some(grace), Some(heard)) = (grace, p.last_heard) {
                    if now - heard >= grace && p.covered_until.is_none_or(|c| now >= c) {
                        victims.push((p.info.clone(), Reason::Timeout, format!("silent for {:?} (peer_timeout {grace:?})", now - heard)));
                    }
                }
            }
        }
        if victims.is_empty() {
            continue;
        }
        // A peer is silent to a member that the group dropped, too (it
        // stopped pinging a member no longer in its generation): before
        // dropping anyone for silence, this member asks the coordinator
        // whether it is itself still in a stable generation.
        // A member waiting in SyncGroup is asked about under the
        // generation it joined (the one it applies has moved on).
        let me = match &state.joining {
            Some((member, generation)) => (member.clone(), *generation, state.instance_id.clone()),
            None => (state.member.clone(), state.generation, state.instance_id.clone()),
        };
        drop(state);
        if victims.iter().any(|(_, reason, _)| *reason == Reason::Timeout) {
            let confirmed = match still_member(&brokers, &shared.group, &me, &mut conn) {
                Ok(true) => true,
                Ok(false) => {
                    tracing::info!(generation = me.1, "peers fell silent, but the coordinator does not hold this member in its generation: it drops no one for silence until it is confirmed");
                    (shared.nudge)();
                    false
                }
                Err(e) => {
                    conn = None;
                    tracing::debug!(error = %e, "cannot ask the coordinator about this member; dropping no one for silence now");
                    false
                }
            };
            if !confirmed {
                victims.retain(|(_, reason, _)| *reason != Reason::Timeout);
                judge_after = Some(Instant::now() + shared.timeout / 4);
            }
        }
        let mut state = shared.state();
        // Marked before the LeaveGroup: a ping arriving meanwhile gets no
        // new lease but "dropped".
        for (peer, ..) in &victims {
            state.dropped.insert(peer.member_id.clone());
        }
        drop(state);
        for (peer, reason, why) in victims {
            match leave_group(&brokers, &shared.group, &peer, &why, &mut conn) {
                Ok(first) => {
                    let mut state = shared.state();
                    if reason == Reason::Timeout {
                        let d = state.drops.entry(peer.address.incarnation).or_default();
                        d.count = if d.last.is_some_and(|t| t.elapsed() < FLAP_WINDOW) { d.count + 1 } else { 1 };
                        d.last = Some(Instant::now());
                    }
                    if first {
                        state.detected = Some(now);
                        metrics::counter!(crate::metrics::PEERS_DROPPED, "reason" => reason.label()).increment(1);
                        tracing::warn!(peer = %peer.address.address, member = %peer.member_id, instance = ?peer.instance_id,
                            reason = reason.label(), detail = %why, "dropped a peer from the group; its tasks move now");
                    } else {
                        tracing::info!(peer = %peer.address.address, member = %peer.member_id, reason = reason.label(),
                            "a peer was already out of the group");
                    }
                    let links: Vec<Sender<LinkCommand>> =
                        state.peers.iter().filter(|(id, _)| **id != peer.member_id).map(|(_, p)| p.commands.clone()).collect();
                    drop(state);
                    // The rebalance ends once every member rejoined: tell
                    // them now rather than at their next heartbeat.
                    (shared.nudge)();
                    for l in links {
                        let _ = l.send(LinkCommand::Nudge);
                    }
                }
                Err(e) => {
                    conn = None;
                    // Not dropped after all; the member it told so rejoins
                    // or finds itself confirmed.
                    shared.state().dropped.remove(&peer.member_id);
                    retry_at.insert(peer.member_id.clone(), Instant::now() + Duration::from_millis(500));
                    tracing::warn!(peer = %peer.address.address, member = %peer.member_id, error = %e,
                        "could not drop a peer from the group; trying again");
                }
            }
        }
        last_tick = Instant::now();
    }
}

/// A heartbeat of this member (`(member id, generation, instance id)`)
/// from the monitor's connection: `Ok(true)` when the coordinator holds it
/// a member of its generation, stable or in a JoinGroup round
/// (`REBALANCE_IN_PROGRESS`: the round waits for the members of that
/// generation, a frozen one included, so dropping it ends the wait).
fn still_member(brokers: &Brokers, group: &str, me: &(String, i32, Option<String>), conn: &mut Option<Connection>) -> crate::error::Result<bool> {
    if conn.is_none() {
        *conn = Some(brokers.coordinator(group, 0)?);
    }
    let c = conn.as_mut().expect("connected");
    let mut request = HeartbeatRequest::default();
    request.group_id = GroupId(StrBytes::from_string(group.to_string()));
    request.generation_id = me.1;
    request.member_id = StrBytes::from_string(me.0.clone());
    request.group_instance_id = me.2.clone().map(StrBytes::from_string);
    let (response, _) = c.send(&request)?;
    match ResponseError::try_from_code(response.error_code) {
        None | Some(ResponseError::RebalanceInProgress) => Ok(true),
        Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable | ResponseError::CoordinatorLoadInProgress) => {
            *conn = None;
            Ok(false)
        }
        Some(_) => Ok(false),
    }
}

/// LeaveGroup naming `peer` (KIP-345's member removal). `Ok(true)`: it
/// was removed; `Ok(false)`: it was no longer a member.
fn leave_group(brokers: &Brokers, group: &str, peer: &PeerInfo, why: &str, conn: &mut Option<Connection>) -> crate::error::Result<bool> {
    if conn.is_none() {
        *conn = Some(brokers.coordinator(group, 0)?);
    }
    let c = conn.as_mut().expect("connected");
    if c.version::<LeaveGroupRequest>()? < 3 {
        return Err(crate::error::Error::GroupMembership {
            group: group.to_string(),
            detail: "dropping another member needs LeaveGroup v3 (Kafka 2.4 or newer)".into(),
        });
    }
    let mut identity = MemberIdentity::default();
    identity.member_id = StrBytes::from_string(peer.member_id.clone());
    identity.group_instance_id = peer.instance_id.clone().map(StrBytes::from_string);
    identity.reason = Some(StrBytes::from_string(format!("dropped by a peer: {why}")));
    let mut request = LeaveGroupRequest::default();
    request.group_id = GroupId(StrBytes::from_string(group.to_string()));
    request.members = vec![identity];
    let (response, _) = c.send(&request)?;
    let code = response.members.first().map_or(response.error_code, |m| if response.error_code != 0 { response.error_code } else { m.error_code });
    match ResponseError::try_from_code(code) {
        None => Ok(true),
        Some(ResponseError::UnknownMemberId | ResponseError::FencedInstanceId) => Ok(false),
        Some(e @ (ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable | ResponseError::CoordinatorLoadInProgress)) => {
            *conn = None;
            Err(crate::error::Error::GroupMembership { group: group.to_string(), detail: format!("LeaveGroup: {e}") })
        }
        Some(e) => Err(crate::error::Error::GroupMembership { group: group.to_string(), detail: format!("LeaveGroup: {e}") }),
    }
}

/// A random incarnation number (no `rand` dependency in the library).
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(timeout_ms: u64, session_ms: u64) -> Shared {
        Shared {
            group: "g".into(),
            incarnation: 1,
            advertised: "me:1".into(),
            timeout: Duration::from_millis(timeout_ms),
            session_timeout: Duration::from_millis(session_ms),
            session: SessionClock::new(Duration::from_millis(session_ms)),
            nudge: Arc::new(|| {}),
            stop: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
            secret: None,
            gate: auth::Gate::default(),
            state: Mutex::new(State {
                member: "me".into(),
                generation: 5,
                instance_id: None,
                peers: BTreeMap::new(),
                dropped: HashSet::new(),
                departed: HashSet::new(),
                drops: HashMap::new(),
                detected: None,
                joining: None,
            }),
        }
    }

    fn add_peer(s: &Shared, member: &str, incarnation: u64) {
        let (commands, _) = mpsc::channel();
        let info = PeerInfo {
            member_id: member.into(),
            instance_id: None,
            address: PeerAddress { address: "h:1".into(), incarnation },
        };
        s.state().peers.insert(member.into(), Peer::new(info, commands, None));
    }

    #[test]
    fn a_peer_dropped_for_silence_again_gets_twice_the_time_until_the_session_timeout() {
        let s = shared(1_000, 10_000);
        let mut drops = HashMap::new();
        assert_eq!(s.grace(&drops, 7), Some(Duration::from_secs(1)));
        drops.insert(7, Drops { count: 1, last: Some(Instant::now()) });
        assert_eq!(s.grace(&drops, 7), Some(Duration::from_secs(2)));
        drops.insert(7, Drops { count: 3, last: Some(Instant::now()) });
        assert_eq!(s.grace(&drops, 7), Some(Duration::from_secs(8)));
        // 16 s is not below the session timeout: left to the session.
        drops.insert(7, Drops { count: 4, last: Some(Instant::now()) });
        assert_eq!(s.grace(&drops, 7), None);
    }

    #[test]
    fn only_a_ping_of_this_generation_gets_a_lease_and_only_an_armed_one_arms() {
        let s = shared(1_000, 10_000);
        add_peer(&s, "p", 7);
        assert_eq!(s.pinged("stranger", 5, true), (0, false, 5), "not in this generation's view");
        assert_eq!(s.pinged("p", 4, true), (0, false, 5), "an older generation");
        assert!(!s.state().peers["p"].armed);
        assert_eq!(s.pinged("p", 5, false), (1_000, false, 5));
        assert!(!s.state().peers["p"].armed, "a lease offered is not a lease held");
        assert_eq!(s.pinged("p", 5, true), (1_000, false, 5));
        assert!(s.state().peers["p"].armed);
        assert!(s.state().peers["p"].covered_until.is_some_and(|c| c > Instant::now() + Duration::from_millis(900)));
        s.state().dropped.insert("p".into());
        assert_eq!(s.pinged("p", 5, true), (0, true, 5), "a dropped member is told so");
    }

    #[test]
    fn a_peer_kept_into_a_new_generation_stays_armed_until_this_member_is_lost() {
        let s = Arc::new(shared(1_000, 10_000));
        add_peer(&s, "p", 7);
        assert_eq!(s.pinged("p", 5, true), (1_000, false, 5));
        let peers = Peers { shared: s.clone(), advertised: "me:1".into(), threads: Vec::new() };
        let info = |member: &str, incarnation| PeerInfo {
            member_id: member.into(),
            instance_id: None,
            address: PeerAddress { address: "h:1".into(), incarnation },
        };
        peers.assigned(6, "me", &[info("me", 1), info("p", 7)]);
        let state = s.state();
        let p = &state.peers["p"];
        assert!(p.armed && p.last_heard.is_some(), "the same process kept into generation 6 is still judged");
        assert!(p.covered_until.is_some(), "and its lease from generation 5 still counts");
        drop(state);
        peers.lost();
        assert!(!s.state().peers["p"].armed, "a member out of the group judges no one");
    }

    #[test]
    fn a_member_writes_only_while_every_live_peer_s_lease_holds() {
        let s = shared(1_000, 10_000);
        s.session.confirmed();
        add_peer(&s, "p", 7);
        add_peer(&s, "q", 8);
        assert!(s.session.alive(), "no lease held: nothing to wait for");
        let ack = |lease_ms, generation| link::Ack { lease_ms, dropped: false, generation };
        let sent = Instant::now();
        s.acked("p", 5, sent, ack(400, 5));
        assert!(s.session.alive());
        s.acked("q", 4, sent, ack(1_000, 4));
        assert!(s.state().peers["q"].lease.is_none(), "an ack of an older generation's ping holds nothing");
        s.acked("q", 5, sent, ack(1_000, 4));
        assert!(s.state().peers["q"].lease.is_none(), "nor one from a peer still in an older generation");
        std::thread::sleep(Duration::from_millis(320)); // past 3/4 of 400 ms
        s.refresh_lease(&s.state());
        assert!(!s.session.alive(), "p's lease ran out");
        // A new generation: the old lease still bounds the writes until p
        // answers from the new generation too.
        s.state().generation = 6;
        s.acked("p", 6, Instant::now(), ack(400, 5));
        assert!(!s.session.alive(), "p is still in generation 5, where it may judge us");
        s.acked("p", 6, Instant::now(), ack(0, 6));
        assert!(s.session.alive(), "p will not judge us in generation 6");
        assert!(s.session.confirmed_recently(), "the coordinator's confirmation is another matter");
        // A peer whose process is gone cannot drop anyone: its lease is moot.
        let p = s.state().peers["p"].info.clone();
        s.gone(&p, "refused".into());
        assert!(s.session.alive());
        // Being told "dropped" ends the session at once.
        s.acked("q", 6, Instant::now(), link::Ack { lease_ms: 0, dropped: true, generation: 6 });
        assert!(!s.session.alive());
    }
}
