//! The peer links: newline-delimited JSON over TCP. Every instance
//! connects to every other instance's listener (one outbound link per
//! peer) and answers the links that reach its own listener.
//!
//! With a shared secret the link opens with a handshake (`auth.rs`): the
//! caller's `Hello` carries a nonce, the listener's `Welcome` its own nonce
//! and its proof, the caller's `Proof` its proof; nothing else counts
//! before, and every line after carries a seal (`auth::Seal`: an HMAC
//! under a key of that link over the line's direction, number and text),
//! so nothing injected into an established link counts either. On a link
//! the caller sends `Hello` once, then a `Ping` every `peer_timeout / 6`; the listener answers `Welcome`, then an `Ack` per
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
use super::auth::{self, Handshake, Proven, Rejected, Seal};
use super::Shared;

/// One message on a peer link.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "t")]
pub(super) enum Msg {
    /// Caller → listener, first: who calls. A static member that restarted
    /// into its place without a rebalance is learnt from this (`Shared::introduced`).
    Hello {
        /// The caller's nonce (empty without a secret).
        #[serde(default)]
        nonce: String,
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
    /// Listener → caller: the process answering here, with its nonce and
    /// its proof of the secret (both empty without one), and during a
    /// rotation its proof of the previous secret.
    Welcome {
        incarnation: u64,
        #[serde(default)]
        nonce: String,
        #[serde(default)]
        proof: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        previous_proof: String,
    },
    /// Caller → listener, after `Welcome`: its proof of the secret.
    Proof { proof: String },
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

/// Sends `msg` as one line; sealed once the link is authenticated.
fn send(stream: &mut TcpStream, msg: &Msg, seal: Option<&mut Seal>) -> std::io::Result<()> {
    let mut line = line_for(msg)?;
    if let Some(seal) = seal {
        seal.seal(&mut line);
    }
    write_line(stream, line)
}

/// The text of `msg` on a link (without its line end).
fn line_for(msg: &Msg) -> std::io::Result<Vec<u8>> {
    serde_json::to_vec(msg).map_err(std::io::Error::other)
}

/// Writes `line` and its line end.
fn write_line(stream: &mut TcpStream, mut line: Vec<u8>) -> std::io::Result<()> {
    line.push(b'\n');
    stream.write_all(&line)
}

/// Reads what the stream has towards one message: a single read, waiting
/// at most the stream's read timeout, so the caller's deadlines hold
/// however slowly bytes trickle in. `Ok(None)`: nothing complete yet (the
/// partial line stays in `buf`). A line longer than `limit` is an
/// `InvalidData` error however it arrives. With a `seal` (an authenticated
/// link) a line whose seal does not hold is a `PermissionDenied` error.
/// A message's line stays in `buf` until the next call ([`line_of`]).
fn receive(reader: &mut BufReader<TcpStream>, buf: &mut Vec<u8>, limit: usize, seal: Option<&mut Seal>) -> std::io::Result<Option<Msg>> {
    if buf.ends_with(b"\n") {
        buf.clear();
    }
    let available = match reader.fill_buf() {
        Ok([]) => return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "the peer closed the link")),
        Ok(bytes) => bytes,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => return Ok(None),
        Err(e) => return Err(e),
    };
    let end = available.iter().position(|b| *b == b'\n').map_or(available.len(), |i| i + 1);
    let take = end.min((limit + 1).saturating_sub(buf.len()));
    buf.extend_from_slice(&available[..take]);
    reader.consume(take);
    if !buf.ends_with(b"\n") {
        if buf.len() > limit {
            return Err(std::io::Error::new(ErrorKind::InvalidData, "a line longer than the limit"));
        }
        return Ok(None);
    }
    let text = match seal {
        None => Some(line_of(buf)),
        Some(seal) => seal.open(line_of(buf)),
    };
    match text {
        None => Err(std::io::Error::new(ErrorKind::PermissionDenied, "a message whose seal does not hold (injected or altered on the way?)")),
        Some(text) => serde_json::from_slice(text).map(Some).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e)),
    }
}

/// The line [`receive`] last returned a message of, without its line end.
fn line_of(buf: &[u8]) -> &[u8] {
    buf.strip_suffix(b"\n").unwrap_or(buf)
}

/// A listener's unauthenticated-connection slot for its source address,
/// given back once the caller authenticated, or when dropped (whatever
/// ends the connection's thread, or its spawn failing).
struct Slot {
    shared: Arc<Shared>,
    from: std::net::IpAddr,
    held: bool,
}

impl Slot {
    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            self.shared.gate.release(self.from);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
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
                if !shared.gate.admit(from.ip()) {
                    shared.gate.rejected(from.ip(), Rejected::TooManyConnections, "");
                    continue; // (dropped: closed)
                }
                let mut slot = Slot { shared: shared.clone(), from: from.ip(), held: true };
                let spawned = std::thread::Builder::new().name("kstate-peer-in".into()).spawn(move || {
                    let shared = slot.shared.clone();
                    match answer(&shared, stream, &mut slot) {
                        Ok(()) => {}
                        Err(Refusal::Rejected(why, detail)) => shared.gate.rejected(from.ip(), why, &detail),
                        Err(Refusal::Io(e)) => tracing::debug!(%from, error = %e, "peer link closed"),
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

/// Why a listener closed a link.
enum Refusal {
    /// Counted and logged (`kstate_peer_rejected_total`).
    Rejected(Rejected, String),
    /// The link broke or ended.
    Io(std::io::Error),
}

impl From<std::io::Error> for Refusal {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            ErrorKind::InvalidData => Refusal::Rejected(Rejected::Garbage, e.to_string()),
            ErrorKind::PermissionDenied => Refusal::Rejected(Rejected::BadSeal, e.to_string()),
            _ => Refusal::Io(e),
        }
    }
}

/// Answers one caller: the handshake, then its pings with acks (and
/// leases), its nudges and bye. Nothing counts before the caller is
/// authenticated (with a secret: its proof checked), and a caller that is
/// not within `peer_timeout` is refused.
fn answer(shared: &Arc<Shared>, stream: TcpStream, slot: &mut Slot) -> Result<(), Refusal> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    stream.set_write_timeout(Some(shared.timeout))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    // The caller's incarnation, once authenticated.
    let mut caller = None;
    // With a secret, between `Welcome` and `Proof`: the caller's hello,
    // the digest of its line, and this side's nonce.
    let mut pending: Option<(Msg, String, String)> = None;
    // With a secret, after the caller's proof: what seals the messages.
    let mut seal: Option<Seal> = None;
    // Counted while the link lasts if proven with the previous secret.
    let mut _previous: Option<PreviousSecretLink> = None;
    let hello_by = Instant::now() + shared.timeout;
    let unauthenticated = |what: &str| Err(Refusal::Rejected(Rejected::Unauthenticated, what.to_string()));
    while !shared.stop.load(Ordering::SeqCst) {
        if caller.is_none() && Instant::now() > hello_by {
            return unauthenticated("no handshake within peer_timeout");
        }
        let limit = if caller.is_some() { auth::MAX_LINE_BYTES } else { auth::MAX_HANDSHAKE_LINE_BYTES };
        let Some(msg) = receive(&mut reader, &mut buf, limit, seal.as_mut())? else { continue };
        match msg {
            Msg::Hello { .. } if caller.is_some() || pending.is_some() => return unauthenticated("a second hello"),
            Msg::Hello { ref group, .. } if group != &shared.group => {
                let reason = format!("this is a peer of application `{}`, not `{group}`", shared.group);
                send(&mut writer, &Msg::Refused { reason }, None)?;
                return Err(Refusal::Rejected(Rejected::WrongGroup, group.clone()));
            }
            Msg::Hello { ref nonce, .. } if nonce.is_empty() && shared.secret.is_some() => {
                // A caller without the secret (peer_plaintext, or an older
                // version): told so, rather than left to fail at its pings.
                let reason = "this peer authenticates its links: set the same peer_secret on every instance".to_string();
                send(&mut writer, &Msg::Refused { reason }, None)?;
                return unauthenticated("a hello without a nonce (a caller without peer_secret)");
            }
            Msg::Hello { ref nonce, incarnation, .. } => match &shared.secret {
                None => {
                    let welcome = Msg::Welcome {
                        incarnation: shared.incarnation,
                        nonce: String::new(),
                        proof: String::new(),
                        previous_proof: String::new(),
                    };
                    send(&mut writer, &welcome, None)?;
                    // (Unauthenticated: it keeps its place under the
                    // per-source bound for as long as it lasts.)
                    caller = Some(incarnation);
                    welcomed(shared, msg);
                }
                Some(secrets) => {
                    let (mine, hello) = (auth::nonce(), auth::digest(line_of(&buf)));
                    let (proof, previous_proof) = listener_handshake(shared, (nonce, incarnation, &hello), &mine).listener_proofs(secrets);
                    send(&mut writer, &Msg::Welcome { incarnation: shared.incarnation, nonce: mine.clone(), proof, previous_proof }, None)?;
                    pending = Some((msg, hello, mine));
                }
            },
            Msg::Proof { proof } => {
                let (Some((hello, digest, mine)), Some(secrets)) = (pending.take(), &shared.secret) else {
                    return unauthenticated("a proof out of turn");
                };
                let Msg::Hello { ref nonce, incarnation, ref address, .. } = hello else { unreachable!("pending holds a hello") };
                let handshake = listener_handshake(shared, (nonce, incarnation, &digest), &mine);
                let Some(proven) = handshake.caller_proven(secrets, &proof) else {
                    return Err(Refusal::Rejected(Rejected::BadProof, "the caller's proof of the shared secret is wrong".into()));
                };
                if proven == Proven::Previous {
                    _previous = Some(PreviousSecretLink::new(shared, address, "calls this instance"));
                }
                seal = Some(Seal::new(&handshake, secrets.get(proven), auth::LISTENER));
                caller = Some(incarnation);
                // A peer: it gives its place back, and its address is known.
                slot.release();
                shared.gate.authenticated(slot.from);
                welcomed(shared, hello);
            }
            Msg::Ping { seq, member, generation, armed } if caller.is_some() => {
                let (lease_ms, dropped, generation) = shared.pinged(&member, generation, armed);
                send(&mut writer, &Msg::Ack { seq, lease_ms, dropped, generation }, seal.as_mut())?;
            }
            Msg::Nudge if caller.is_some() => (shared.nudge)(),
            Msg::Bye if caller.is_some() => {
                if let Some(incarnation) = caller {
                    shared.departed(incarnation);
                }
                return Ok(());
            }
            other if caller.is_none() => return unauthenticated(&format!("{other:?} before the handshake")),
            other => tracing::debug!(?other, "unexpected peer message"),
        }
    }
    Ok(())
}

/// The listener's side of one link's handshake: the caller's nonce,
/// incarnation and hello digest, and this side's nonce.
fn listener_handshake<'a>(shared: &'a Shared, (caller_nonce, caller_incarnation, hello): (&'a str, u64, &'a str), mine: &'a str) -> Handshake<'a> {
    Handshake { group: &shared.group, caller_nonce, listener_nonce: mine, caller_incarnation, listener_incarnation: shared.incarnation, hello }
}

/// An open link authenticated with `peer_previous_secret`: a rotation is
/// under way, and the instance at the other end still runs the old secret
/// alone. Counted in `kstate_peer_previous_secret_links` while it lasts
/// (0 on every instance: the rollout is complete) and logged (at most once
/// a minute per instance).
struct PreviousSecretLink;

impl PreviousSecretLink {
    fn new(shared: &Shared, peer: &str, direction: &str) -> PreviousSecretLink {
        metrics::gauge!(crate::metrics::PEER_PREVIOUS_SECRET_LINKS).increment(1.0);
        if shared.gate.previous_secret_seen() {
            tracing::info!(peer, direction, "a peer link authenticated with peer_previous_secret: that instance still runs the old secret alone");
        }
        PreviousSecretLink
    }
}

impl Drop for PreviousSecretLink {
    fn drop(&mut self) {
        metrics::gauge!(crate::metrics::PEER_PREVIOUS_SECRET_LINKS).decrement(1.0);
    }
}

/// An authenticated caller's hello: a static member that restarted into
/// its place is learnt from it.
fn welcomed(shared: &Arc<Shared>, hello: Msg) {
    if let Msg::Hello { incarnation, member, generation, instance_id: Some(instance_id), address, .. } = hello {
        let info = PeerInfo { member_id: member, instance_id: Some(instance_id), address: PeerAddress { address, incarnation } };
        Shared::introduced(shared, info, generation);
    }
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

/// A bye on a connection of its own (the link was down when told to),
/// after the handshake (at most about 200 ms).
fn say_bye(shared: &Shared, peer: &PeerInfo) {
    let Some(addr) = peer.address.address.to_socket_addrs().ok().and_then(|mut a| a.next()) else { return };
    let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else { return };
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    let Ok(calling) = Calling::hello(shared, &mut writer) else { return };
    let (mut buf, by) = (Vec::new(), Instant::now() + Duration::from_millis(200));
    while Instant::now() < by {
        match receive(&mut reader, &mut buf, auth::MAX_LINE_BYTES, None) {
            Ok(Some(Msg::Welcome { incarnation, nonce: theirs, proof, previous_proof })) => {
                let mut seal = match answer_welcome(shared, &calling, (incarnation, &theirs, [&proof, &previous_proof])) {
                    Ok(Some((reply, seal, _))) => {
                        let _ = send(&mut writer, &reply, None);
                        Some(seal)
                    }
                    Ok(None) => None,
                    Err(_) => return, // not a peer that holds the secret
                };
                let _ = send(&mut writer, &Msg::Bye, seal.as_mut());
                return;
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

/// The caller's side of one link's handshake: its nonce and the digest of
/// the `Hello` line it sent.
struct Calling {
    nonce: String,
    hello: String,
}

impl Calling {
    /// Sends this instance's `Hello` with a fresh nonce.
    fn hello(shared: &Shared, writer: &mut TcpStream) -> std::io::Result<Calling> {
        let nonce = auth::nonce();
        let line = line_for(&shared.hello(&nonce))?;
        let hello = auth::digest(&line);
        write_line(writer, line)?;
        Ok(Calling { nonce, hello })
    }
}

/// The caller's side of the handshake: checks the listener's proofs of
/// the secret and returns the caller's, the seal of the link's messages
/// from then on, and whether the previous secret was the one that held
/// (`None`: no secret, nothing to prove).
fn answer_welcome(
    shared: &Shared,
    calling: &Calling,
    (incarnation, theirs, proofs): (u64, &str, [&str; 2]),
) -> std::io::Result<Option<(Msg, Seal, Proven)>> {
    let Some(secrets) = &shared.secret else { return Ok(None) };
    let handshake = Handshake {
        group: &shared.group,
        caller_nonce: &calling.nonce,
        listener_nonce: theirs,
        caller_incarnation: shared.incarnation,
        listener_incarnation: incarnation,
        hello: &calling.hello,
    };
    match handshake.caller_answer(secrets, proofs) {
        None => Err(std::io::Error::new(
            ErrorKind::PermissionDenied,
            "the peer could not prove the shared secret (another peer_secret, or not a peer of this application)",
        )),
        Some((proof, proven)) => Ok(Some((Msg::Proof { proof }, Seal::new(&handshake, secrets.get(proven), auth::CALLER), proven))),
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
    let calling = Calling::hello(shared, &mut writer)?;
    // With a secret, after this side's proof: what seals the messages.
    let mut seal: Option<Seal> = None;
    // Counted while the link lasts if proven with the previous secret.
    let mut _previous: Option<PreviousSecretLink> = None;
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
                // (Before the handshake ended a nudge would not count, and
                // the listener would refuse the link: it is not sent.)
                Ok(LinkCommand::Nudge) if *welcomed => send(&mut writer, &Msg::Nudge, seal.as_mut())?,
                Ok(LinkCommand::Nudge) => {}
                Ok(LinkCommand::Bye) => {
                    // Before the handshake ended a bye would not count:
                    // say it on a connection of its own.
                    if *welcomed {
                        let _ = send(&mut writer, &Msg::Bye, seal.as_mut());
                    } else {
                        say_bye(shared, peer);
                    }
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
            send(&mut writer, &Msg::Ping { seq, member, generation, armed }, seal.as_mut())?;
            sent.push_back((seq, Instant::now(), generation));
            while sent.len() > 64 {
                sent.pop_front();
            }
        }
        let received = receive(&mut reader, &mut buf, auth::MAX_LINE_BYTES, seal.as_mut()).inspect_err(|e| {
            if e.kind() == ErrorKind::PermissionDenied {
                tracing::warn!(peer = %peer.address.address, error = %e, "closing a peer link: a message failed its seal");
            }
        });
        let Some(msg) = received? else {
            if !*welcomed && Instant::now() > welcome_by {
                return Err(std::io::Error::new(ErrorKind::TimedOut, "no welcome from the peer"));
            }
            continue;
        };
        match msg {
            Msg::Welcome { incarnation, nonce: theirs, proof, previous_proof } => {
                // Nothing the listener says counts before its proof.
                if *welcomed {
                    return Err(std::io::Error::new(ErrorKind::InvalidData, "a second welcome"));
                }
                if let Some((reply, sealed, proven)) = answer_welcome(shared, &calling, (incarnation, &theirs, [&proof, &previous_proof]))? {
                    send(&mut writer, &reply, None)?;
                    seal = Some(sealed);
                    if proven == Proven::Previous {
                        _previous = Some(PreviousSecretLink::new(shared, &peer.address.address, "this instance calls"));
                    }
                }
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
