//! This instance's membership in the application's group, on a thread of
//! its own (`kstate-group`): JoinGroup, SyncGroup (the leader runs the
//! assignor), Heartbeat, LeaveGroup.
//!
//! Rebalances are cooperative, as in Kafka Streams: a member keeps
//! processing the tasks it keeps, the leader withholds a task that moves
//! until its previous owner has given it up, and a member that gave up
//! tasks rejoins at once so that a second round hands them out. Every
//! assignment (and every loss of the tasks, when this member was fenced)
//! goes to the runtime as a [`GroupEvent`]; the membership waits for the
//! runtime to apply it (revoked tasks committed and closed, lost ones closed
//! without commit) before it rejoins, heartbeating meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::{GroupId, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest};
use kafka_protocol::protocol::StrBytes;

use super::assignor::TaskId;
use super::conn::Connection;
use super::coordinator::Brokers;
use super::payload::{AssignmentError, MemberTasks, Subscription, SubscriptionInfo, USER_DATA_VERSION};
use super::peers::Peers;
use super::warmups::Warmups;
use super::session::{Generation, SessionClock};
use crate::error::{Error, Result};

/// How often a member holding warmups measures their lag.
const WARMUP_CHECK_EVERY: Duration = Duration::from_millis(500);

/// The protocol type: Kafka's consumer protocol, so the usual tools
/// describe the group, its members' partitions and their lag.
pub(crate) const PROTOCOL_TYPE: &str = "consumer";
/// The assignor's name in JoinGroup; every member must offer it.
pub(crate) const PROTOCOL_NAME: &str = "kstate";

/// What the membership needs to know about the application.
#[derive(Debug, Clone)]
pub(crate) struct GroupSettings {
    /// The group id (the application id).
    pub(crate) group: String,
    /// The input topics (every member must subscribe the same).
    pub(crate) topics: Vec<String>,
    /// Number of tasks (the input partition count).
    pub(crate) tasks: i32,
    pub(crate) session_timeout: Duration,
    pub(crate) heartbeat_interval: Duration,
    /// How long the group waits for members to rejoin (Kafka Streams'
    /// `max.poll.interval.ms`).
    pub(crate) rebalance_timeout: Duration,
    /// Static membership (`group.instance.id`).
    pub(crate) instance_id: Option<String>,
    pub(crate) num_standby_replicas: usize,
    /// Records of lag up to which a copy counts as caught up.
    pub(crate) acceptable_recovery_lag: u64,
    pub(crate) max_warmup_replicas: usize,
    /// Longest wait between probing rebalances while moves wait for warmups.
    pub(crate) probing_rebalance_interval: Duration,
    /// The application's changelog topics (lags are measured against their ends).
    pub(crate) changelog_topics: Vec<String>,
    /// Of those, the source tables' topics (measured to the group's committed offsets).
    pub(crate) table_topics: Vec<String>,
    pub(crate) process_id: String,
    pub(crate) endpoint: Option<String>,
    /// Failure detection among the instances (`peer_address`), if set.
    pub(crate) peer: Option<super::peers::PeerSettings>,
    pub(crate) client_tags: BTreeMap<String, String>,
    /// How long TLS or SASL refusals are retried after startup (they
    /// passed the startup check, so most likely a broker restarting) before
    /// the membership fails (`task_timeout`).
    pub(crate) give_up_after: Duration,
}

/// Reads the checkpoint offset sums of the tasks whose state is on this
/// instance's disk (called before every JoinGroup).
pub(crate) type LocalOffsets = Box<dyn FnMut() -> BTreeMap<TaskId, i64> + Send>;

/// What the runtime must apply, then acknowledge with [`Membership::applied`].
#[derive(Debug)]
pub(crate) enum GroupEvent {
    /// This member's tasks in a new generation: tasks active before but
    /// not now are revoked (commit under this generation, then close).
    Assigned {
        generation: Arc<Generation>,
        active: BTreeSet<TaskId>,
        /// Standby and warmup tasks (the runtime follows both alike).
        standby: BTreeSet<TaskId>,
        /// When this member started the rebalance round that ended here.
        since: Instant,
        /// Every member's endpoint and tasks (members with an
        /// `application_server` only).
        hosts: Vec<super::HostTasks>,
    },
    /// This member was fenced (session expired, generation moved on):
    /// another member may own its active tasks already, so close them
    /// without committing.
    Lost { reason: String },
    /// The membership cannot go on (see [`Error::GroupMembership`]); no
    /// acknowledgement expected.
    Failed(Error),
}

enum Command {
    Applied,
    /// Stop heartbeating for a while, like a frozen process (tests).
    #[cfg(test)]
    Freeze(Duration),
    /// Leave the group (a clean shutdown) and end the thread.
    Leave,
    /// Heartbeat now: a peer was dropped, the group is rebalancing.
    Nudge,
}

/// Tells the membership that processing goes on (see [`Membership::polled`]);
/// shared by the processing threads.
#[derive(Clone, Copy)]
pub(crate) struct PollSignal<'a>(&'a SessionClock);

impl PollSignal<'_> {
    /// See [`Membership::polled`].
    pub(crate) fn polled(&self) {
        self.0.confirmed();
    }
}

/// The runtime's handle on the membership thread.
pub(crate) struct Membership {
    commands: Sender<Command>,
    /// Events for the runtime, in order.
    pub(crate) events: Receiver<GroupEvent>,
    thread: Option<JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
    /// When the coordinator last confirmed this member.
    pub(crate) session: SessionClock,
    /// When the processing thread last came round its loop (see
    /// [`Membership::polled`]).
    poll: SessionClock,
    /// Set to stop without LeaveGroup, as a crash would (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    silent: Arc<AtomicBool>,
}

impl Membership {
    /// Starts the membership thread; it joins the group at once.
    pub(crate) fn start(brokers: Brokers, settings: GroupSettings, local: LocalOffsets) -> Result<Membership> {
        let (commands, command_rx) = mpsc::channel();
        let (event_tx, events) = mpsc::channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let silent = Arc::new(AtomicBool::new(false));
        let session = SessionClock::new(settings.session_timeout);
        let poll = SessionClock::new(settings.rebalance_timeout);
        let peers = match &settings.peer {
            Some(peer) => {
                let nudge = commands.clone();
                let nudge = Box::new(move || {
                    let _ = nudge.send(Command::Nudge);
                });
                let peers = Peers::start(
                    peer,
                    &settings.group,
                    settings.instance_id.clone(),
                    settings.session_timeout,
                    session.clone(),
                    brokers.clone(),
                    nudge,
                )
                    .map_err(|e| Error::io("kstate-peers threads", e))?;
                Some(peers)
            }
            None => None,
        };
        let member = Member {
            peers,
            poll: poll.clone(),
            session: session.clone(),
            silent: silent.clone(),
            brokers,
            settings,
            local,
            events: event_tx,
            commands: command_rx,
            conn: None,
            rotate: 0,
            member_id: String::new(),
            generation: -1,
            owned: BTreeSet::new(),
            standby: BTreeSet::new(),
            pending: BTreeSet::new(),
            warmups: Warmups::default(),
            stopping: stopping.clone(),
            failures: 0,
            refused_since: None,
        };
        let thread = std::thread::Builder::new()
            .name("kstate-group".into())
            .spawn(move || member.run())
            .map_err(|e| Error::io("kstate-group thread", e))?;
        Ok(Membership { commands, events, thread: Some(thread), stopping, session, poll, silent })
    }

    /// The processing thread is alive and polling. A thread that does not
    /// come round for `max.poll.interval.ms` (a processor stuck in a call)
    /// makes this member leave the group, as a Kafka consumer would: its
    /// tasks move to others; when it comes back its tasks are lost and it
    /// rejoins.
    pub(crate) fn polled(&self) {
        self.poll.confirmed();
    }

    /// [`Membership::polled`] for other processing threads.
    pub(crate) fn poll_signal(&self) -> PollSignal<'_> {
        PollSignal(&self.poll)
    }

    /// The runtime applied the last [`GroupEvent`].
    pub(crate) fn applied(&self) {
        let _ = self.commands.send(Command::Applied);
    }

    /// Leaves the group (dynamic members; a static member keeps its place
    /// until its session times out, as in Kafka Streams) and waits for the
    /// thread, at most `timeout`.
    pub(crate) fn leave(mut self, timeout: Duration) {
        self.stop(timeout);
    }

    /// Stops heartbeating for `pause`, like a process stopped with SIGSTOP.
    #[cfg(test)]
    pub(crate) fn freeze(&self, pause: Duration) {
        let _ = self.commands.send(Command::Freeze(pause));
    }

    /// Stops without leaving the group, like a crashed instance.
    #[cfg(test)]
    pub(crate) fn crash(mut self) {
        self.silent.store(true, Ordering::SeqCst);
        self.stop(Duration::from_secs(5));
    }

    fn stop(&mut self, timeout: Duration) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.commands.send(Command::Leave);
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + timeout;
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                tracing::warn!(?timeout, "the group thread did not stop in time; left behind");
            }
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The membership thread's state.
pub(super) struct Member {
    /// Failure detection among the instances, if `peer_address` is set.
    peers: Option<Peers>,
    session: SessionClock,
    poll: SessionClock,
    pub(super) brokers: Brokers,
    pub(super) settings: GroupSettings,
    pub(super) local: LocalOffsets,
    events: Sender<GroupEvent>,
    commands: Receiver<Command>,
    conn: Option<Connection>,
    /// Rotates the bootstrap broker tried first.
    pub(super) rotate: usize,
    pub(super) member_id: String,
    pub(super) generation: i32,
    /// Active tasks of the current generation (our subscription's owned partitions).
    owned: BTreeSet<TaskId>,
    standby: BTreeSet<TaskId>,
    /// Tasks the last assignment meant for us once released elsewhere.
    pending: BTreeSet<TaskId>,
    /// Warmup tasks and the tasks on their way here (KIP-441).
    pub(super) warmups: Warmups,
    stopping: Arc<AtomicBool>,
    silent: Arc<AtomicBool>,
    /// Retriable failures in a row (for backoff and logs).
    failures: u32,
    /// Since when TLS or SASL refuse this member, if they do.
    refused_since: Option<Instant>,
}

/// How a group request ended, apart from success.
enum Outcome {
    /// Rejoin the group (a rebalance started, or the coordinator moved).
    Rejoin,
    /// Start a rebalance to move tasks whose warmups caught up.
    Probe(String),
    /// This member is not in the group (any more): its tasks are lost.
    Fenced(String),
}

fn code_name(code: i16) -> String {
    ResponseError::try_from_code(code).map_or_else(|| "NONE".into(), |e| e.to_string())
}

impl Member {
    fn run(mut self) {
        let result = self.run_inner();
        if let Err(e) = result {
            tracing::error!(group = %self.settings.group, error = %e, "group membership failed");
            let _ = self.events.send(GroupEvent::Failed(e));
        }
        let silent = self.silent.load(Ordering::SeqCst);
        // The peers hear the bye before the group hears the leave, so that
        // none of them takes the shutdown for a crash.
        if let Some(peers) = self.peers.take() {
            peers.stop(!silent);
        }
        if self.settings.instance_id.is_none() && !self.member_id.is_empty() && self.generation >= 0 && !silent {
            self.leave_group();
        }
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    fn run_inner(&mut self) -> Result<()> {
        let mut reason = "joining".to_string();
        let mut round_started = None;
        let mut last_generation = None;
        while !self.stopping() {
            let since = *round_started.get_or_insert_with(Instant::now);
            let Some((generation, tasks)) = self.join_and_sync(&reason)? else {
                continue;
            };
            round_started = None;
            let revoked: BTreeSet<TaskId> = self.owned.difference(&tasks.active).copied().collect();
            let generation = Arc::new(generation);
            tracing::info!(
                group = %self.settings.group, generation = generation.id, member = %generation.member_id,
                active = ?tasks.active, standby = ?tasks.standby, warmup = ?tasks.warmup, handed_over_next = ?tasks.pending,
                revoked = ?revoked, "assignment received"
            );
            self.track_moves(&tasks);
            if let Some(peers) = &self.peers {
                peers.assigned(generation.id, &generation.member_id, &tasks.peers);
            }
            self.warmups.caught_up.clear();
            // A member that rejoined into an unchanged generation (the group
            // did not rebalance yet) waits for its heartbeat to say so.
            let rejoin_now = tasks.rejoin_now && Some(generation.id) != last_generation;
            last_generation = Some(generation.id);
            self.owned = tasks.active.clone();
            self.standby = tasks.standby.clone();
            self.pending = tasks.pending.clone();
            self.warmups.tasks = tasks.warmup.clone();
            self.warmups.awaited = tasks.awaited.clone();
            self.warmups.reported = false;
            self.warmups.probe_at = tasks.probe_in_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
            let followed = tasks.standby.union(&tasks.warmup).copied().collect();
            let event = GroupEvent::Assigned { generation: generation.clone(), active: tasks.active, standby: followed, since, hosts: tasks.hosts };
            if self.events.send(event).is_err() {
                return Ok(()); // the runtime is gone
            }
            let mut next = self.wait_applied(Some(&generation))?;
            reason = "the group is rebalancing".into();
            if next.is_none() && !revoked.is_empty() {
                // Cooperative: the tasks given up go out in a second round.
                next = Some(Outcome::Rejoin);
                reason = format!("gave up tasks {revoked:?}");
            } else if next.is_none() && rejoin_now {
                // Another member gives tasks up: be in the second round at once.
                next = Some(Outcome::Rejoin);
                reason = "tasks are being handed over".into();
            }
            if next.is_none() {
                next = self.stable(&generation)?;
            }
            match next {
                Some(Outcome::Fenced(why)) => {
                    self.lose(&why)?;
                    reason = format!("fenced: {why}");
                }
                Some(Outcome::Probe(why)) => reason = why,
                Some(Outcome::Rejoin) => {}
                None => {}
            }
        }
        Ok(())
    }

    /// Heartbeats until a rebalance, a fence or shutdown.
    fn stable(&mut self, generation: &Generation) -> Result<Option<Outcome>> {
        let mut last_ok = Instant::now();
        let mut next_heartbeat = Instant::now() + self.settings.heartbeat_interval;
        let mut next_warmup_check = Instant::now() + WARMUP_CHECK_EVERY;
        loop {
            let mut wake = next_heartbeat;
            if let Some(at) = self.warmups.probe_at {
                wake = wake.min(at);
            }
            if !self.warmups.awaited.is_empty() && !self.warmups.reported {
                wake = wake.min(next_warmup_check);
            }
            match self.commands.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                Ok(Command::Leave) | Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Ok(Command::Nudge) => next_heartbeat = Instant::now(),
                Ok(Command::Applied) | Err(RecvTimeoutError::Timeout) => {}
                #[cfg(test)]
                Ok(Command::Freeze(pause)) => std::thread::sleep(pause),
            }
            if self.stopping() {
                return Ok(None);
            }
            if !self.poll.alive() {
                return self.processing_stuck();
            }
            if self.warmups.probe_at.is_some_and(|at| Instant::now() >= at) {
                self.warmups.probe_at = None;
                metrics::counter!(crate::metrics::PROBING_REBALANCES, "reason" => "interval").increment(1);
                return Ok(Some(Outcome::Probe("probing rebalance: moves wait for warmups".into())));
            }
            if !self.warmups.awaited.is_empty() && !self.warmups.reported && Instant::now() >= next_warmup_check {
                next_warmup_check = Instant::now() + WARMUP_CHECK_EVERY;
                if let Some(why) = self.warmups_caught_up() {
                    self.warmups.reported = true;
                    metrics::counter!(crate::metrics::PROBING_REBALANCES, "reason" => "warmups_caught_up").increment(1);
                    return Ok(Some(Outcome::Probe(why)));
                }
            }
            if Instant::now() < next_heartbeat {
                continue;
            }
            next_heartbeat = Instant::now() + self.settings.heartbeat_interval;
            match self.heartbeat(generation) {
                Ok(None) => last_ok = Instant::now(),
                Ok(Some(outcome)) => return Ok(Some(outcome)),
                Err(e @ Error::BrokerUnreachable { .. }) => {
                    self.conn = None;
                    // The coordinator has dropped a member that it did not
                    // hear from for a session: its tasks may be elsewhere.
                    if last_ok.elapsed() >= self.settings.session_timeout {
                        return Ok(Some(Outcome::Fenced(format!("no heartbeat for a session timeout: {e}"))));
                    }
                    tracing::warn!(group = %self.settings.group, error = %e, "heartbeat failed; finding the coordinator again");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The processing thread has not polled for `max.poll.interval.ms`:
    /// leave the group (a static member just stops heartbeating, as Kafka's
    /// consumer does) so its tasks move, then wait for the thread and report
    /// the tasks lost.
    fn processing_stuck(&mut self) -> Result<Option<Outcome>> {
        let stuck_for = self.poll.since();
        self.leave_because_stuck();
        while !self.poll.alive() {
            if self.stopping() {
                return Ok(None);
            }
            std::thread::sleep(self.settings.heartbeat_interval.min(Duration::from_millis(200)));
        }
        Ok(Some(Outcome::Fenced(format!("the processing thread did not poll for {stuck_for:?}"))))
    }

    /// Leaves the group for a stuck processing thread (a static member just
    /// stops heartbeating) and marks the session expired, so nothing the
    /// thread does when it comes back is written.
    fn leave_because_stuck(&mut self) {
        tracing::error!(group = %self.settings.group, stuck_for = ?self.poll.since(), max_poll_interval = ?self.settings.rebalance_timeout,
            "the processing thread has not polled for max.poll.interval.ms; leaving the group so its tasks move elsewhere");
        self.session.expire();
        if self.settings.instance_id.is_none() {
            self.leave_group();
            self.generation = -1;
        }
    }

    /// Waits until the runtime applied the last event, heartbeating under
    /// `generation` meanwhile (if any). Returns what the heartbeats found.
    fn wait_applied(&mut self, generation: Option<&Generation>) -> Result<Option<Outcome>> {
        let mut found = None;
        loop {
            match self.commands.recv_timeout(self.settings.heartbeat_interval) {
                Ok(Command::Applied) => {
                    self.session.between_generations.store(false, Ordering::SeqCst);
                    return Ok(found);
                }
                Ok(Command::Leave) | Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Ok(Command::Nudge) | Err(RecvTimeoutError::Timeout) => {}
                #[cfg(test)]
                Ok(Command::Freeze(pause)) => std::thread::sleep(pause),
            }
            if self.stopping() {
                return Ok(None);
            }
            // The runtime stuck while applying: leave, as in `stable`; the
            // tasks are reported lost once it has applied this event.
            if generation.is_some() && !matches!(found, Some(Outcome::Fenced(_))) && !self.poll.alive() {
                self.leave_because_stuck();
                found = Some(Outcome::Fenced(format!("the processing thread did not poll for {:?}", self.poll.since())));
            }
            // Heartbeats go on while the runtime applies the assignment
            // (a rebalance keeps the session alive with them), until the
            // coordinator says this member is out.
            let fenced = matches!(found, Some(Outcome::Fenced(_)));
            if let (Some(g), false) = (generation, fenced) {
                match self.heartbeat(g) {
                    Ok(None) => {}
                    Ok(Some(Outcome::Rejoin)) => found = Some(Outcome::Rejoin),
                    Ok(outcome) => found = outcome,
                    Err(Error::BrokerUnreachable { .. }) => self.conn = None,
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// Tells the runtime its active tasks are lost and waits until it
    /// closed them; standbys stay (they only follow changelogs).
    fn lose(&mut self, why: &str) -> Result<()> {
        tracing::warn!(group = %self.settings.group, member = %self.member_id, tasks = ?self.owned, reason = why,
            "this member was fenced; its active tasks are closed without commit");
        self.generation = -1;
        if let Some(peers) = &self.peers {
            peers.lost();
        }
        if self.owned.is_empty() {
            return Ok(());
        }
        self.owned.clear();
        if self.events.send(GroupEvent::Lost { reason: why.to_string() }).is_err() {
            return Ok(());
        }
        self.wait_applied(None)?;
        Ok(())
    }

    /// The coordinator connection, found again if needed. Retriable
    /// failures back off (100 ms doubling to 5 s) and retry until shutdown.
    fn coordinator(&mut self) -> Result<Option<&mut Connection>> {
        while self.conn.is_none() {
            if self.stopping() {
                return Ok(None);
            }
            match self.brokers.coordinator(&self.settings.group, self.rotate) {
                Ok(conn) => {
                    if self.failures > 0 {
                        tracing::info!(group = %self.settings.group, coordinator = conn.broker(), attempts = self.failures, "coordinator found");
                    }
                    self.failures = 0;
                    self.refused_since = None;
                    self.conn = Some(conn);
                }
                Err(e @ Error::BrokerUnreachable { .. }) => self.backoff(&e),
                Err(e @ (Error::Tls { .. } | Error::Authentication { .. })) => {
                    let since = *self.refused_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.settings.give_up_after {
                        return Err(e);
                    }
                    tracing::error!(group = %self.settings.group, error = %e, refused_for = ?since.elapsed(),
                        give_up_after = ?self.settings.give_up_after, "the broker refuses this member's connection; retrying");
                    self.backoff(&e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.conn.as_mut())
    }

    fn backoff(&mut self, error: &Error) {
        self.failures += 1;
        self.rotate += 1;
        let wait = (Duration::from_millis(100) * (1 << self.failures.min(6))).min(Duration::from_secs(5));
        if self.failures == 1 || self.failures.is_multiple_of(10) {
            tracing::warn!(group = %self.settings.group, error = %error, attempts = self.failures, ?wait,
                "group coordinator unavailable; retrying");
        }
        // Wake early on shutdown.
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline && !self.stopping() {
            std::thread::sleep(Duration::from_millis(20).min(deadline - Instant::now()));
        }
    }

    /// One retriable protocol failure: drop the connection, back off.
    fn retry_after(&mut self, error: Error) -> Result<()> {
        match error {
            e @ Error::BrokerUnreachable { .. } => {
                self.conn = None;
                self.backoff(&e);
                Ok(())
            }
            e => Err(e),
        }
    }

    /// Sends a request the coordinator answers only once the group is
    /// ready (JoinGroup, SyncGroup): the wait may last the rebalance
    /// timeout. `None`: a retriable failure, backed off already.
    fn send_group_request<R: kafka_protocol::protocol::Request>(&mut self, request: &R) -> Result<Option<R::Response>> {
        let (long, short) = (self.settings.rebalance_timeout + Duration::from_secs(5), self.brokers.timeout);
        let Some(conn) = self.coordinator()? else { return Ok(None) };
        conn.set_request_timeout(long)?;
        let sent = conn.send(request);
        let _ = conn.set_request_timeout(short);
        match sent {
            Ok((response, _)) => Ok(Some(response)),
            Err(e) => self.retry_after(e).map(|()| None),
        }
    }

    fn subscription(&mut self) -> Subscription {
        let task_offsets = (self.local)();
        Subscription {
            topics: self.settings.topics.clone(),
            owned: self.owned.clone(),
            info: SubscriptionInfo {
                version: USER_DATA_VERSION,
                latest_supported_version: USER_DATA_VERSION,
                process_id: self.settings.process_id.clone(),
                endpoint: self.settings.endpoint.clone(),
                peer: self.peers.as_ref().map(Peers::address),
                client_tags: self.settings.client_tags.clone(),
                standby: self.standby.clone(),
                pending: self.pending.clone(),
                caught_up: self.warmups.caught_up.clone(),
                task_offsets,
            },
        }
    }

    fn fatal(&self, detail: String) -> Error {
        Error::GroupMembership { group: self.settings.group.clone(), detail }
    }

    /// One JoinGroup + SyncGroup round. `None`: try again (retriable
    /// failure, rebalance restarted); errors are fatal.
    fn join_and_sync(&mut self, reason: &str) -> Result<Option<(Generation, MemberTasks)>> {
        let metadata = self.subscription().encode();
        let settings = self.settings.clone();
        let member_id = self.member_id.clone();
        let Some(conn) = self.coordinator()? else { return Ok(None) };
        let version = conn.version::<JoinGroupRequest>()?;
        if settings.instance_id.is_some() && version < 5 {
            return Err(Error::GroupMembership {
                group: settings.group.clone(),
                detail: "static membership (`group.instance.id`) needs JoinGroup v5 (Kafka 2.3 or newer)".into(),
            });
        }
        let mut join = JoinGroupRequest::default();
        join.group_id = GroupId(StrBytes::from_string(settings.group.clone()));
        join.session_timeout_ms = millis(settings.session_timeout);
        join.rebalance_timeout_ms = millis(settings.rebalance_timeout);
        join.member_id = StrBytes::from_string(member_id);
        join.group_instance_id = settings.instance_id.clone().map(StrBytes::from_string);
        join.protocol_type = StrBytes::from_static_str(PROTOCOL_TYPE);
        let mut protocol = JoinGroupRequestProtocol::default();
        protocol.name = StrBytes::from_static_str(PROTOCOL_NAME);
        protocol.metadata = metadata;
        join.protocols = vec![protocol];
        join.reason = Some(StrBytes::from_string(reason.to_string()));
        // The coordinator answers once every member rejoined, or after the
        // rebalance timeout.
        let started = Instant::now();
        {
            // After any commit sending offsets under the current generation.
            let _gate = self.session.commit_gate();
            self.session.joining.store(true, Ordering::SeqCst);
        }
        let sent = self.send_group_request(&join);
        // A new generation: between generations before no longer joining,
        // or a commit could find the generation settled in between.
        if matches!(&sent, Ok(Some(r)) if ResponseError::try_from_code(r.error_code).is_none()) {
            self.session.between_generations.store(true, Ordering::SeqCst);
        }
        self.session.joining.store(false, Ordering::SeqCst);
        let Some(response) = sent? else { return Ok(None) };
        match ResponseError::try_from_code(response.error_code) {
            None => {}
            Some(ResponseError::MemberIdRequired) => {
                // Kafka 2.2+: the first JoinGroup only hands out the member id.
                self.member_id = response.member_id.to_string();
                return Ok(None);
            }
            Some(ResponseError::UnknownMemberId) => {
                self.member_id.clear();
                self.lose("the coordinator no longer knows this member")?;
                return Ok(None);
            }
            Some(
                ResponseError::RebalanceInProgress
                | ResponseError::CoordinatorLoadInProgress
                | ResponseError::CoordinatorNotAvailable
                | ResponseError::NotCoordinator,
            ) => {
                self.conn = None;
                self.backoff(&self.fatal(format!("JoinGroup: {}", code_name(response.error_code))));
                return Ok(None);
            }
            Some(ResponseError::FencedInstanceId) => {
                return Err(self.fatal(format!(
                    "another instance joined with the same `group.instance.id` ({:?}); this one stops",
                    settings.instance_id.unwrap_or_default()
                )))
            }
            Some(ResponseError::InconsistentGroupProtocol) => {
                return Err(self.fatal(
                    "the group's other members use another protocol (a consumer or an older kstate with the same group id?); \
                     every instance of an application must run the same kstate protocol"
                        .into(),
                ))
            }
            Some(e) => return Err(self.fatal(format!("JoinGroup failed: {e}"))),
        }
        self.member_id = response.member_id.to_string();
        self.generation = response.generation_id;
        self.session.confirmed();
        if let Some(peers) = &self.peers {
            peers.joined(response.generation_id, &self.member_id);
        }
        let leader = response.leader == response.member_id;
        tracing::debug!(group = %settings.group, generation = response.generation_id, leader, members = response.members.len(),
            waited = ?started.elapsed(), "joined");
        // A static leader that restarted into a stable group is told to
        // keep the assignment it no longer knows (KIP-814).
        let assignments = if leader && !response.skip_assignment { self.assign(&response.members) } else { Vec::new() };
        if leader {
            freeze_leader_if_asked();
        }
        let generation = Generation {
            id: response.generation_id,
            member_id: self.member_id.clone(),
            instance_id: settings.instance_id.clone(),
        };
        let mut sync = SyncGroupRequest::default();
        sync.group_id = GroupId(StrBytes::from_string(settings.group.clone()));
        sync.generation_id = generation.id;
        sync.member_id = StrBytes::from_string(generation.member_id.clone());
        sync.group_instance_id = settings.instance_id.clone().map(StrBytes::from_string);
        sync.protocol_type = Some(StrBytes::from_static_str(PROTOCOL_TYPE));
        sync.protocol_name = Some(StrBytes::from_static_str(PROTOCOL_NAME));
        sync.assignments = assignments;
        let Some(response) = self.send_group_request(&sync)? else { return Ok(None) };
        match ResponseError::try_from_code(response.error_code) {
            None => {}
            Some(ResponseError::RebalanceInProgress) => return Ok(None),
            Some(ResponseError::UnknownMemberId) => {
                self.member_id.clear();
                self.lose("the coordinator no longer knows this member")?;
                return Ok(None);
            }
            Some(ResponseError::IllegalGeneration) => {
                self.lose("the generation moved on during SyncGroup")?;
                return Ok(None);
            }
            Some(ResponseError::CoordinatorNotAvailable | ResponseError::NotCoordinator | ResponseError::CoordinatorLoadInProgress) => {
                self.conn = None;
                return Ok(None);
            }
            Some(ResponseError::FencedInstanceId) => {
                return Err(self.fatal("another instance joined with the same `group.instance.id`; this one stops".into()))
            }
            Some(e) => return Err(self.fatal(format!("SyncGroup failed: {e}"))),
        }
        self.session.confirmed();
        let tasks = MemberTasks::decode(response.assignment)
            .map_err(|e| self.fatal(format!("the leader's assignment cannot be read: {e}")))?;
        if tasks.error == AssignmentError::MismatchedTopics as u16 {
            return Err(self.fatal(
                "the group's members subscribe to different input topics; every instance of an application must read the same topics".into(),
            ));
        }
        Ok(Some((generation, tasks)))
    }

    /// One heartbeat. `Ok(None)`: still a member of this generation.
    fn heartbeat(&mut self, generation: &Generation) -> Result<Option<Outcome>> {
        let group = self.settings.group.clone();
        let Some(conn) = self.coordinator()? else { return Ok(None) };
        let mut request = HeartbeatRequest::default();
        request.group_id = GroupId(StrBytes::from_string(group.clone()));
        request.generation_id = generation.id;
        request.member_id = StrBytes::from_string(generation.member_id.clone());
        request.group_instance_id = generation.instance_id.clone().map(StrBytes::from_string);
        let (response, _) = conn.send(&request)?;
        let unconfirmed = |e: ResponseError| Error::BrokerUnreachable {
            bootstrap: group.clone(),
            timeout: Duration::ZERO,
            detail: format!("heartbeat not confirmed: {e}"),
        };
        match ResponseError::try_from_code(response.error_code) {
            None => {
                self.session.confirmed();
                Ok(None)
            }
            Some(ResponseError::RebalanceInProgress) => {
                self.session.confirmed();
                Ok(Some(Outcome::Rejoin))
            }
            Some(ResponseError::IllegalGeneration) => {
                Ok(Some(Outcome::Fenced("heartbeat: the group moved to a newer generation".into())))
            }
            Some(ResponseError::UnknownMemberId) => {
                self.member_id.clear();
                Ok(Some(Outcome::Fenced("heartbeat: the coordinator no longer knows this member".into())))
            }
            Some(ResponseError::FencedInstanceId) => {
                Err(self.fatal("another instance joined with the same `group.instance.id`; this one stops".into()))
            }
            Some(e) => {
                // The coordinator moved or is loading (or an unexpected
                // error): not a confirmation; the callers find it again.
                self.conn = None;
                Err(unconfirmed(e))
            }
        }
    }

    /// LeaveGroup, so the group rebalances at once instead of after the
    /// session timeout. Best effort.
    fn leave_group(&mut self) {
        let group = self.settings.group.clone();
        let member_id = std::mem::take(&mut self.member_id);
        let Ok(Some(conn)) = self.coordinator_once() else { return };
        let mut request = LeaveGroupRequest::default();
        request.group_id = GroupId(StrBytes::from_string(group.clone()));
        let version = conn.version::<LeaveGroupRequest>().unwrap_or(0);
        if version >= 3 {
            let mut identity = MemberIdentity::default();
            identity.member_id = StrBytes::from_string(member_id.clone());
            identity.reason = Some(StrBytes::from_static_str("the instance is shutting down"));
            request.members = vec![identity];
        } else {
            request.member_id = StrBytes::from_string(member_id.clone());
        }
        match conn.send(&request) {
            Ok((r, _)) if r.error_code == 0 => tracing::info!(group = %group, member = %member_id, "left the group"),
            Ok((r, _)) => tracing::warn!(group = %group, error = %code_name(r.error_code), "LeaveGroup failed"),
            Err(e) => tracing::warn!(group = %group, error = %e, "LeaveGroup failed"),
        }
    }

    /// The coordinator connection without retries (for leaving).
    fn coordinator_once(&mut self) -> Result<Option<&mut Connection>> {
        if self.conn.is_none() {
            self.conn = Some(self.brokers.coordinator(&self.settings.group, self.rotate)?);
        }
        Ok(self.conn.as_mut())
    }
}

/// Fault injection for the test suite: a leader that finds the file named
/// by `KSTATE_LEADER_FREEZE_FILE` removes it and stops its own process
/// (SIGSTOP) between its JoinGroup and its SyncGroup, the moment the
/// others wait on it. One leader at most freezes per file.
fn freeze_leader_if_asked() {
    let Some(file) = std::env::var_os("KSTATE_LEADER_FREEZE_FILE") else { return };
    if std::fs::remove_file(&file).is_ok() {
        tracing::warn!("fault injection: the leader stops itself before its SyncGroup");
        // SAFETY: raise has no memory-safety preconditions.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
    }
}

fn millis(d: Duration) -> i32 {
    d.as_millis().min(i32::MAX as u128) as i32
}
