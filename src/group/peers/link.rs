//! The peer links: newline-delimited JSON over TCP. Every instance
//! connects to every other instance's listener (one outbound link per
//! peer) and answers the links that reach its own listener.
//!
//! On a link the caller sends `Hello` once, then a `Ping` every
//! `peer_timeout / 6`; the listener answers `Welcome`, then an `Ack` per
//! ping. An ack may grant the caller a lease: "I will not drop you from the
//! group for silence until `lease_ms` after this ping was sent". The caller
//! holds that lease from then on (its pings say `armed`), and only an armed
//! caller can be dropped for silence: the two sides never disagree about
//! whether a silent member may still write.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::super::payload::{PeerAddress, PeerInfo};
use super::Shared;

/// One message on a peer link.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "t")]
pub(super) enum Msg {
    /// Caller → listener, first: who calls. A static member that restarted
    /// into its place without a rebalance is learnt from this (`Shared::introduced`).
    Hello {
        group: String,
        incarnation: u64,
        #[serde(default)]
        member: String,
        #[serde(default)]
        generation: i32,
        #[serde(default)]
        instance_id: Option<String>,
        #[serde(default)]
        address: String,
    },
    /// Listener → caller: the process answering here.
    Welcome { incarnation: u64 },
    /// Listener → caller: not a member of this application.
    Refused { reason: String },
    /// Caller → listener: still alive, as `member` of `generation`.
    /// `armed`: the caller holds the listener's lease for this generation.
    Ping { seq: u64, member: String, generation: i32, armed: bool },
    /// Listener → caller. `lease_ms` 0: no lease (not the same
    /// generation, or the caller is left to the session timeout).
    /// `dropped`: the listener made the group drop that member.
    /// `generation`: the listener's own.
    Ack { seq: u64, lease_ms: u64, dropped: bool, generation: i32 },
    /// Caller → listener: a member was dropped; ask the coordinator now
    /// whether the group rebalances.
    Nudge,
    /// Caller → listener: this process leaves on purpose (do not drop it).
    Bye,
}

/// A ping's answer, as [`Shared::acked`] reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ack {
    pub(super) lease_ms: u64,
    pub(super) dropped: bool,
    /// The answering peer's generation.
    pub(super) generation: i32,
}

/// What a link's owner asks of its thread.
pub(super) enum LinkCommand {
    /// Ping now (a new generation: arm at once).
    PingNow,
    Nudge,
    /// Say bye and end.
    Bye,
    /// End without a word.
    Stop,
}

/// Fault injection for the test suite: while the file named by
/// `KSTATE_PEER_MUTE_FILE` exists, this process sends no pings, as if its
/// links to the other instances were cut one way (the others drop it for
/// silence while it still reaches the brokers).
fn muted() -> bool {
    static FILE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    FILE.get_or_init(|| std::env::var_os("KSTATE_PEER_MUTE_FILE").map(Into::into)).as_ref().is_some_and(|f| f.exists())
}

fn send(stream: &mut TcpStream, msg: &Msg) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// Reads one message, waiting at most the stream's read timeout. `Ok(None)`:
/// nothing complete yet (the partial line stays in `buf`).
fn receive(reader: &mut BufReader<TcpStream>, buf: &mut Vec<u8>) -> std::io::Result<Option<Msg>> {
    match reader.read_until(b'\n', buf) {
        Ok(0) => Err(std::io::Error::new(ErrorKind::UnexpectedEof, "the peer closed the link")),
        Ok(_) if buf.ends_with(b"\n") => {
            let msg = serde_json::from_slice(buf).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e));
            buf.clear();
            msg.map(Some)
        }
        Ok(_) => Ok(None),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Accepts links until the peers stop; one thread per link.
pub(super) fn listen(shared: Arc<Shared>, listener: Arc<TcpListener>) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!(error = %e, "the peer listener cannot poll; peers cannot reach this instance");
        return;
    }
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, from)) => {
                let shared = shared.clone();
                let spawned = std::thread::Builder::new().name("kstate-peer-in".into()).spawn(move || {
                    if let Err(e) = answer(&shared, stream) {
                        tracing::debug!(%from, error = %e, "peer link closed");
                    }
                });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot start a thread for a peer link");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                tracing::warn!(error = %e, "accepting a peer link failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Answers one caller: its pings with acks (and leases), its nudges and bye.
fn answer(shared: &Arc<Shared>, stream: TcpStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    stream.set_write_timeout(Some(shared.timeout))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    let mut caller = None;
    let hello_by = Instant::now() + shared.timeout;
    while !shared.stop.load(Ordering::SeqCst) {
        let Some(msg) = receive(&mut reader, &mut buf)? else {
            if caller.is_none() && Instant::now() > hello_by {
                return Err(std::io::Error::new(ErrorKind::TimedOut, "no hello"));
            }
            continue;
        };
        match msg {
            Msg::Hello { group, incarnation, member, generation, instance_id, address } => {
                if group != shared.group {
                    let reason = format!("this is a peer of application `{}`, not `{group}`", shared.group);
                    send(&mut writer, &Msg::Refused { reason })?;
                    return Ok(());
                }
                caller = Some(incarnation);
                send(&mut writer, &Msg::Welcome { incarnation: shared.incarnation })?;
                if let Some(instance_id) = instance_id {
                    let info = PeerInfo { member_id: member, instance_id: Some(instance_id), address: PeerAddress { address, incarnation } };
                    Shared::introduced(shared, info, generation);
                }
            }
            Msg::Ping { seq, member, generation, armed } if caller.is_some() => {
                let (lease_ms, dropped, generation) = shared.pinged(&member, generation, armed);
                send(&mut writer, &Msg::Ack { seq, lease_ms, dropped, generation })?;
            }
            Msg::Nudge => (shared.nudge)(),
            Msg::Bye => {
                if let Some(incarnation) = caller {
                    shared.departed(incarnation);
                }
                return Ok(());
            }
            other => tracing::debug!(?other, "unexpected peer message"),
        }
    }
    Ok(())
}

/// This instance's link to one peer: connects, pings, reads acks; notes
/// the peer gone when its listener refuses after having answered.
pub(super) fn call(shared: Arc<Shared>, peer: PeerInfo, commands: Receiver<LinkCommand>) {
    let mut reached = false;
    let mut warned = false;
    let mut quick = 0;
    let retry = (shared.timeout / 4).max(Duration::from_millis(50));
    loop {
        let mut welcomed = false;
        let result = link(&shared, &peer, &commands, &mut welcomed);
        if welcomed {
            reached = true;
            quick = 0;
        }
        match result {
            Ok(()) => return, // told to stop
            Err(e) => {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                let refused = e.kind() == ErrorKind::ConnectionRefused;
                if refused && reached {
                    shared.gone(&peer, "its peer listener refuses connections: the process is gone".into());
                    // Keep the link: the peer may be a different process
                    // soon, and the commands still have to be drained.
                } else if !warned && !reached {
                    warned = true;
                    tracing::warn!(peer = %peer.address.address, member = %peer.member_id, error = %e,
                        "cannot reach this peer's listener; until it answers, only the session timeout detects its failure");
                }
                tracing::debug!(peer = %peer.address.address, error = %e, "peer link down; connecting again");
                // A link that broke: connect again at once (a few times:
                // a dying process's listener may still take a connection
                // for a moment), so that a dead process is told from a
                // live one without delay.
                if reached && quick < 10 {
                    quick += 1;
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
        }
        // Wait before connecting again, serving commands meanwhile.
        let until = Instant::now() + retry;
        while Instant::now() < until {
            match commands.try_recv() {
                Ok(LinkCommand::Bye) => return say_bye(&shared, &peer),
                Ok(LinkCommand::Stop) | Err(TryRecvError::Disconnected) => return,
                Ok(_) | Err(TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// A bye on a connection of its own (the link was down when told to).
fn say_bye(shared: &Shared, peer: &PeerInfo) {
    let Some(addr) = peer.address.address.to_socket_addrs().ok().and_then(|mut a| a.next()) else { return };
    if let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
        let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = send(&mut stream, &shared.hello());
        let _ = send(&mut stream, &Msg::Bye);
    }
}

/// One connection of [`call`]. `Ok`: told to stop.
fn link(shared: &Shared, peer: &PeerInfo, commands: &Receiver<LinkCommand>, welcomed: &mut bool) -> std::io::Result<()> {
    let addr = peer
        .address
        .address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(ErrorKind::NotFound, "the peer address resolves to nothing"))?;
    let stream = TcpStream::connect_timeout(&addr, shared.timeout / 2)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(shared.timeout))?;
    let tick = Duration::from_millis(20);
    stream.set_read_timeout(Some(tick))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    send(&mut writer, &shared.hello())?;
    let welcome_by = Instant::now() + shared.timeout;
    let interval = shared.timeout / 6;
    let mut next_ping = Instant::now();
    let mut seq = 0u64;
    // Pings in flight: sequence number, send time, generation.
    let mut sent: std::collections::VecDeque<(u64, Instant, i32)> = Default::default();
    loop {
        loop {
            match commands.try_recv() {
                Ok(LinkCommand::PingNow) => next_ping = Instant::now(),
                Ok(LinkCommand::Nudge) => send(&mut writer, &Msg::Nudge)?,
                Ok(LinkCommand::Bye) => {
                    let _ = send(&mut writer, &Msg::Bye);
                    return Ok(());
                }
                Ok(LinkCommand::Stop) | Err(TryRecvError::Disconnected) => return Ok(()),
                Err(TryRecvError::Empty) => break,
            }
        }
        if *welcomed && Instant::now() >= next_ping {
            next_ping = Instant::now() + interval;
            let (member, generation, armed) = shared.ping_identity(&peer.member_id);
            if generation < 0 || muted() {
                continue; // out of the group: nothing to be alive for
            }
            seq += 1;
            send(&mut writer, &Msg::Ping { seq, member, generation, armed })?;
            sent.push_back((seq, Instant::now(), generation));
            while sent.len() > 64 {
                sent.pop_front();
            }
        }
        let Some(msg) = receive(&mut reader, &mut buf)? else {
            if !*welcomed && Instant::now() > welcome_by {
                return Err(std::io::Error::new(ErrorKind::TimedOut, "no welcome from the peer"));
            }
            continue;
        };
        match msg {
            Msg::Welcome { incarnation } => {
                if shared.is_member_incarnation(incarnation) && incarnation != peer.address.incarnation {
                    // Not a restart: two members publish addresses that
                    // lead to the same process (e.g. `localhost`).
                    return Err(std::io::Error::new(
                        ErrorKind::AddrNotAvailable,
                        "this address leads to another member of the group (is its peer_address a host name only it resolves, like localhost?)",
                    ));
                }
                if incarnation != peer.address.incarnation {
                    shared.gone(peer, "another process answers at its peer address (it restarted)".into());
                    return Err(std::io::Error::other("a different process answers there"));
                }
                *welcomed = true;
            }
            Msg::Refused { reason } => {
                tracing::warn!(peer = %peer.address.address, %reason, "a peer refused this instance's link");
                return Err(std::io::Error::new(ErrorKind::PermissionDenied, reason));
            }
            Msg::Ack { seq, lease_ms, dropped, generation: theirs } => {
                if let Some(&(_, at, generation)) = sent.iter().find(|(s, ..)| *s == seq) {
                    shared.acked(&peer.member_id, generation, at, Ack { lease_ms, dropped, generation: theirs });
                }
                sent.retain(|(s, ..)| *s > seq);
            }
            other => tracing::debug!(?other, "unexpected peer message"),
        }
    }
}
