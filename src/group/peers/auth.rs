//! Who may speak on a peer link (docs/architecture.md §9): with a shared
//! secret (`AppBuilder::peer_secret`), both ends prove they hold it before
//! any message counts, by a challenge-response: each side sends a fresh
//! nonce, and each answers with an HMAC-SHA256 under the secret of both
//! nonces, both incarnations, the group and its role, so the secret never
//! crosses the wire and a proof cannot be replayed on another link. Without
//! a secret (`AppBuilder::peer_plaintext`, chosen explicitly) the links are
//! not authenticated. During a rotation an instance also accepts the
//! secret it replaces (`AppBuilder::peer_previous_secret`): a listener then
//! proves both, a caller answers with the first of its own secrets a proof
//! matched, so instances with the old secret and instances with the new
//! one (and the old as previous) watch each other throughout a rollout.
//! Either way the listener bounds what a connection may cost: line length,
//! handshake time, connections per source address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The shortest secret `peer_secret` takes.
const MIN_SECRET_BYTES: usize = 16;
/// The longest message line a listener reads.
pub(super) const MAX_LINE_BYTES: usize = 16 * 1024;
/// The longest line a listener reads before the caller authenticated.
pub(super) const MAX_HANDSHAKE_LINE_BYTES: usize = 4 * 1024;
/// Connections one source address may hold open on a listener at once
/// before they authenticated (an authenticated link gives its slot back).
pub(super) const MAX_CONNECTIONS_PER_SOURCE: usize = 16;
/// Connections a listener holds open at once before they authenticated,
/// from all sources together (each costs a thread until it is refused).
pub(super) const MAX_UNAUTHENTICATED: usize = 128;

/// The caller's and the listener's proofs differ, so one cannot be
/// reflected as the other.
pub(super) const CALLER: &str = "caller";
pub(super) const LISTENER: &str = "listener";

/// A fresh nonce (hex of 16 random bytes).
pub(super) fn nonce() -> String {
    let mut bytes = [0u8; 16];
    if openssl::rand::rand_bytes(&mut bytes).is_err() {
        // (OpenSSL's generator does not fail once seeded; a time-based
        // fallback still never repeats within a process.)
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        bytes = t.to_le_bytes();
    }
    hex(&bytes)
}

/// The secrets a peer link accepts: the one this instance proves with,
/// and during a rotation the one it replaces.
#[derive(Clone)]
pub(crate) struct Secrets {
    current: Arc<[u8]>,
    previous: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the bytes.
        f.debug_struct("Secrets").field("previous", &self.previous.is_some()).finish()
    }
}

/// A configured secret, or why it could not be read (a file's error).
pub(crate) type SecretSetting = Option<Result<Arc<[u8]>, String>>;

impl Secrets {
    /// The links' secrets from `peer_secret`, `peer_previous_secret` and
    /// `peer_plaintext`; `Ok(None)`: unauthenticated, chosen explicitly.
    /// `Err`: what is wrong with them, for `Error::Config`.
    pub(crate) fn from_config(current: &SecretSetting, previous: &SecretSetting, plaintext: bool) -> Result<Option<Secrets>, String> {
        let short = |name: &str, secret: &[u8]| {
            format!(
                "{name} is {} bytes; it must be at least {MIN_SECRET_BYTES} (a random secret: `openssl rand -hex 32`)",
                secret.len()
            )
        };
        let previous = match previous {
            Some(Err(why)) => return Err(format!("peer_previous_secret_file: {why}")),
            Some(Ok(secret)) if secret.len() < MIN_SECRET_BYTES => return Err(short("peer_previous_secret", secret)),
            Some(Ok(secret)) => Some(secret.clone()),
            None => None,
        };
        let current = match (current, plaintext) {
            (Some(Err(why)), _) => return Err(format!("peer_secret_file: {why}")),
            (Some(Ok(secret)), _) if secret.len() < MIN_SECRET_BYTES => return Err(short("peer_secret", secret)),
            (Some(Ok(_)), true) => return Err("peer_secret and peer_plaintext exclude each other".into()),
            (Some(Ok(secret)), false) => secret.clone(),
            (None, true) if previous.is_none() => return Ok(None),
            (None, _) if previous.is_some() => {
                return Err("peer_previous_secret is the secret being replaced: it needs peer_secret (the new one)".into())
            }
            (None, _) => {
                return Err("peer_address needs peer_secret (or peer_secret_file) to authenticate the peer links, or \
                            peer_plaintext() to run them unauthenticated (anyone reaching the port could then make this \
                            instance stop watching another)"
                    .into())
            }
        };
        if previous.as_deref() == Some(&current[..]) {
            return Err("peer_previous_secret is the same as peer_secret: set the new secret as peer_secret, the old one as \
                        peer_previous_secret (drop it once every instance runs the new secret)"
                .into());
        }
        Ok(Some(Secrets { current, previous }))
    }

    /// This instance's secrets, the one it proves with first.
    fn all(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&self.current[..]).chain(self.previous.as_deref())
    }

    /// The secret a link was proven with.
    pub(super) fn get(&self, proven: Proven) -> &[u8] {
        match (proven, &self.previous) {
            (Proven::Previous, Some(previous)) => previous,
            _ => &self.current,
        }
    }
}

/// How a link's other end proved the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Proven {
    /// With this instance's `peer_secret`.
    Current,
    /// With its `peer_previous_secret`: a rotation is under way.
    Previous,
}

/// What the two ends of one link agree on before any message counts.
pub(super) struct Handshake<'a> {
    pub(super) group: &'a str,
    pub(super) caller_nonce: &'a str,
    pub(super) listener_nonce: &'a str,
    pub(super) caller_incarnation: u64,
    pub(super) listener_incarnation: u64,
    /// The digest of the caller's `Hello` line as sent ([`digest`]): its
    /// member id, generation, instance id and address count only once
    /// proven, so nothing on the way can alter them.
    pub(super) hello: &'a str,
}

/// The SHA-256 of `bytes`, in hex.
pub(super) fn digest(bytes: &[u8]) -> String {
    hex(&openssl::sha::sha256(bytes))
}

impl Handshake<'_> {
    /// The proof of `role` (CALLER, LISTENER, or SESSION for the link's
    /// seal key) under `secret`. Every field has a fixed form (hex, digits,
    /// or the group, last), so no two handshakes share a text.
    pub(super) fn proof(&self, secret: &[u8], role: &str) -> String {
        let text = format!(
            "kstate-peer-v1\n{role}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.caller_nonce, self.listener_nonce, self.caller_incarnation, self.listener_incarnation, self.hello, self.group
        );
        hmac_hex(secret, &[text.as_bytes()])
    }

    /// Whether `proof` is `role`'s under `secret` (compared in constant time).
    pub(super) fn verify(&self, secret: &[u8], role: &str, proof: &str) -> bool {
        same_mac(&self.proof(secret, role), proof.as_bytes())
    }

    /// The listener's proofs: under its secret, and under its previous
    /// one during a rotation (else empty).
    pub(super) fn listener_proofs(&self, secrets: &Secrets) -> (String, String) {
        let previous = secrets.previous.as_deref().map(|s| self.proof(s, LISTENER)).unwrap_or_default();
        (self.proof(&secrets.current, LISTENER), previous)
    }

    /// The caller's answer to the listener's `proofs`: its proof under the
    /// first of its secrets one of them matched, and which secret that was;
    /// `None`: the listener holds none of them.
    pub(super) fn caller_answer(&self, secrets: &Secrets, proofs: [&str; 2]) -> Option<(String, Proven)> {
        secrets.all().enumerate().find_map(|(i, secret)| {
            proofs.iter().any(|proof| self.verify(secret, LISTENER, proof)).then(|| (self.proof(secret, CALLER), proven(i)))
        })
    }

    /// Which of the listener's secrets the caller's `proof` holds for.
    pub(super) fn caller_proven(&self, secrets: &Secrets, proof: &str) -> Option<Proven> {
        secrets.all().position(|secret| self.verify(secret, CALLER, proof)).map(proven)
    }
}

fn proven(index: usize) -> Proven {
    if index == 0 {
        Proven::Current
    } else {
        Proven::Previous
    }
}

/// HMAC-SHA256 of `parts` (concatenated) under `key`, in hex (empty if
/// OpenSSL fails, which no proof or seal then matches).
fn hmac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    let mac = openssl::pkey::PKey::hmac(key)
        .and_then(|key| {
            let mut signer = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), &key)?;
            for part in parts {
                signer.update(part)?;
            }
            signer.sign_to_vec()
        })
        .unwrap_or_default();
    hex(&mac)
}

/// Whether `got` is the MAC `wanted` (compared in constant time; an empty
/// `wanted`, OpenSSL having failed, matches nothing).
fn same_mac(wanted: &str, got: &[u8]) -> bool {
    !wanted.is_empty() && wanted.len() == got.len() && openssl::memcmp::eq(wanted.as_bytes(), got)
}

/// The role tag of a link's seal key.
const SESSION: &str = "session";

/// Seals an authenticated link's messages: each line after the handshake
/// carries an HMAC under a key only the two ends can derive (from the
/// secret they proved and both nonces) over its direction, its number in
/// that direction and its text. Something on the network path can then
/// neither inject a message (a `Bye`, an `Ack` with a lease) nor replay,
/// reorder or drop one unnoticed: the link closes instead.
pub(super) struct Seal {
    key: Vec<u8>,
    /// This end's role (CALLER or LISTENER), and the other's.
    outgoing: &'static str,
    incoming: &'static str,
    sent: u64,
    received: u64,
}

impl Seal {
    /// The seal of `role`'s end of the link `handshake` opened with `secret`.
    pub(super) fn new(handshake: &Handshake, secret: &[u8], role: &'static str) -> Seal {
        let incoming = if role == CALLER { LISTENER } else { CALLER };
        Seal { key: handshake.proof(secret, SESSION).into_bytes(), outgoing: role, incoming, sent: 0, received: 0 }
    }

    fn mac(&self, from: &str, n: u64, text: &[u8]) -> String {
        hmac_hex(&self.key, &[from.as_bytes(), b"\n", n.to_string().as_bytes(), b"\n", text])
    }

    /// Appends the tab and the seal to the next outgoing line's `text`.
    pub(super) fn seal(&mut self, text: &mut Vec<u8>) {
        let mac = self.mac(self.outgoing, self.sent, text);
        self.sent += 1;
        text.push(b'\t');
        text.extend_from_slice(mac.as_bytes());
    }

    /// The text of the next incoming `line` (without its line end), if its
    /// seal holds.
    pub(super) fn open<'a>(&mut self, line: &'a [u8]) -> Option<&'a [u8]> {
        let tab = line.iter().rposition(|b| *b == b'\t')?;
        let (text, mac) = (&line[..tab], &line[tab + 1..]);
        same_mac(&self.mac(self.incoming, self.received, text), mac).then(|| {
            self.received += 1;
            text
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Connections refused by a listener: counted per reason, logged once per
/// source address and minute, and the open connections per source.
#[derive(Default)]
pub(super) struct Gate {
    open: Mutex<HashMap<IpAddr, usize>>,
    /// Source addresses that authenticated a link before: peers. They are
    /// not held to [`MAX_UNAUTHENTICATED`], so strangers filling it from
    /// other addresses cannot keep a known peer from reconnecting.
    known: Mutex<std::collections::HashSet<IpAddr>>,
    logged: Mutex<HashMap<IpAddr, Instant>>,
    /// When a link last authenticated with the previous secret was logged.
    previous_logged: Mutex<Option<Instant>>,
}

/// Why a connection was refused (the `reason` label of `kstate_peer_rejected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rejected {
    /// Its proof of the secret was wrong.
    BadProof,
    /// It spoke before completing the handshake, or not at all in time.
    Unauthenticated,
    /// Not a message: not JSON, or a line too long.
    Garbage,
    /// Its source address holds too many connections already.
    TooManyConnections,
    /// A peer of another application.
    WrongGroup,
    /// After the handshake, a message whose seal does not hold (injected,
    /// replayed or altered on the way).
    BadSeal,
}

impl Rejected {
    pub(super) fn label(self) -> &'static str {
        match self {
            Rejected::BadProof => "bad_proof",
            Rejected::Unauthenticated => "unauthenticated",
            Rejected::Garbage => "garbage",
            Rejected::TooManyConnections => "too_many_connections",
            Rejected::WrongGroup => "wrong_group",
            Rejected::BadSeal => "bad_seal",
        }
    }
}

impl Gate {
    /// Takes an unauthenticated connection's slot for `from`; `false`: it
    /// (or all sources together) holds too many.
    pub(super) fn admit(&self, from: IpAddr) -> bool {
        let known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&from);
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !known && open.values().sum::<usize>() >= MAX_UNAUTHENTICATED {
            return false;
        }
        let n = open.entry(from).or_default();
        if *n >= MAX_CONNECTIONS_PER_SOURCE {
            return false;
        }
        *n += 1;
        true
    }

    /// Whether a link authenticated with the previous secret should be
    /// logged now (at most once a minute).
    pub(super) fn previous_secret_seen(&self) -> bool {
        let mut logged = self.previous_logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if logged.is_some_and(|at| now.duration_since(at) < Duration::from_secs(60)) {
            return false;
        }
        *logged = Some(now);
        true
    }

    /// `from` authenticated a link: a peer's address from now on.
    pub(super) fn authenticated(&self, from: IpAddr) {
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if known.len() >= 4096 {
            known.clear(); // a bound; peers authenticate again on their next link
        }
        known.insert(from);
    }

    /// Gives `from`'s slot back.
    pub(super) fn release(&self, from: IpAddr) {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&from) {
            *n -= 1;
            if *n == 0 {
                open.remove(&from);
            }
        }
    }

    /// Counts a refused connection; logs it unless `from` was logged in the
    /// last minute.
    pub(super) fn rejected(&self, from: IpAddr, why: Rejected, detail: &str) {
        metrics::counter!(crate::metrics::PEER_REJECTED, "reason" => why.label()).increment(1);
        let mut logged = self.logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if logged.get(&from).is_some_and(|at| now.duration_since(*at) < Duration::from_secs(60)) {
            return;
        }
        logged.retain(|_, at| now.duration_since(*at) < Duration::from_secs(60));
        logged.insert(from, now);
        tracing::warn!(%from, reason = why.label(), detail, "a connection to the peer listener was refused (logged once a minute per source)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake<'a>(caller: &'a str, listener: &'a str) -> Handshake<'a> {
        Handshake { group: "g", caller_nonce: caller, listener_nonce: listener, caller_incarnation: 1, listener_incarnation: 2, hello: "h" }
    }

    #[test]
    fn a_proof_holds_only_for_its_secret_role_and_nonces() {
        let secret = b"0123456789abcdef";
        let h = handshake("aa", "bb");
        let proof = h.proof(secret, CALLER);
        assert!(h.verify(secret, CALLER, &proof));
        assert!(!h.verify(secret, LISTENER, &proof), "a caller's proof is not a listener's");
        assert!(!h.verify(b"another secret!!", CALLER, &proof));
        assert!(!handshake("aa", "bc").verify(secret, CALLER, &proof), "another nonce, another proof");
        let altered = Handshake { hello: "another hello", ..handshake("aa", "bb") };
        assert!(!altered.verify(secret, CALLER, &proof), "a hello altered on the way, another proof");
        assert!(!h.verify(secret, CALLER, ""));
        assert_ne!(nonce(), nonce());
    }

    fn secrets(current: &[u8], previous: Option<&[u8]>) -> Secrets {
        let setting = |s: &[u8]| Some(Ok(Arc::from(s)));
        Secrets::from_config(&setting(current), &previous.and_then(setting), false).unwrap().unwrap()
    }

    /// Both sides of one handshake: the secret the listener accepted the
    /// caller with, or `None` if either side refused the other.
    fn link(caller: &Secrets, listener: &Secrets) -> Option<Proven> {
        let h = handshake("c1", "l1");
        let (proof, previous) = h.listener_proofs(listener);
        let (answer, _) = h.caller_answer(caller, [&proof, &previous])?;
        h.caller_proven(listener, &answer)
    }

    #[test]
    fn during_a_rotation_old_and_new_instances_accept_each_other_and_strangers_stay_out() {
        let (old, new) = (&b"the-old-secret-0123"[..], &b"the-new-secret-4567"[..]);
        let (o, n) = (secrets(old, None), secrets(new, None));
        let rolled = secrets(new, Some(old));
        assert_eq!(link(&o, &o), Some(Proven::Current));
        assert_eq!(link(&rolled, &o), Some(Proven::Current), "a rolled instance answers an old one with the old secret");
        assert_eq!(link(&o, &rolled), Some(Proven::Previous), "an old instance is accepted by its previous secret");
        assert_eq!(link(&rolled, &rolled), Some(Proven::Current));
        assert_eq!(link(&n, &rolled), Some(Proven::Current));
        assert_eq!(link(&rolled, &n), Some(Proven::Current));
        assert_eq!(link(&n, &o), None, "without the previous secret, old and new refuse each other");
        assert_eq!(link(&o, &n), None);
        let stranger = secrets(b"someone-else-entirely", None);
        assert_eq!(link(&stranger, &rolled), None);
        assert_eq!(link(&rolled, &stranger), None);
    }

    #[test]
    fn a_seal_holds_only_for_its_link_direction_and_place_in_the_stream() {
        let secret = b"0123456789abcdef";
        let h = handshake("aa", "bb");
        let (mut caller, mut listener) = (Seal::new(&h, secret, CALLER), Seal::new(&h, secret, LISTENER));
        let sealed = |seal: &mut Seal, text: &str| {
            let mut line = text.as_bytes().to_vec();
            seal.seal(&mut line);
            line
        };
        let first = sealed(&mut caller, r#"{"t":"Nudge"}"#);
        assert_eq!(listener.open(&first), Some(&br#"{"t":"Nudge"}"#[..]));
        assert_eq!(listener.open(&first), None, "a replay is refused");
        let mut listener = Seal::new(&h, secret, LISTENER);
        let second = sealed(&mut caller, r#"{"t":"Bye"}"#);
        assert_eq!(listener.open(&second), None, "out of order (the first was dropped)");
        let mut listener = Seal::new(&h, secret, LISTENER);
        assert_eq!(listener.open(br#"{"t":"Bye"}"#), None, "unsealed");
        let mut forged = first.clone();
        forged[6] = b'X';
        assert_eq!(listener.open(&forged), None, "altered");
        let mut other_caller = Seal::new(&h, secret, LISTENER);
        let reflected = sealed(&mut other_caller, r#"{"t":"Nudge"}"#);
        assert_eq!(listener.open(&reflected), None, "a line of the other direction");
        let mut elsewhere = Seal::new(&handshake("aa", "bc"), secret, CALLER);
        let other_link = sealed(&mut elsewhere, r#"{"t":"Nudge"}"#);
        assert_eq!(listener.open(&other_link), None, "a line of another link");
        assert_eq!(listener.open(&first), Some(&br#"{"t":"Nudge"}"#[..]), "the genuine first line still opens");
    }

    #[test]
    fn bad_secret_settings_are_refused_with_the_setting_named() {
        let ok = |s: &[u8]| Some(Ok(Arc::<[u8]>::from(s)));
        let long = &b"0123456789abcdef"[..];
        let cases: [(SecretSetting, SecretSetting, bool, &str); 6] = [
            (None, None, false, "peer_address needs peer_secret"),
            (ok(b"short"), None, false, "peer_secret is 5 bytes"),
            (ok(long), ok(b"short"), false, "peer_previous_secret is 5 bytes"),
            (None, ok(long), false, "needs peer_secret"),
            (ok(long), ok(long), false, "the same as peer_secret"),
            (ok(long), Some(Err("cannot read `x`".into())), false, "peer_previous_secret_file: cannot read"),
        ];
        for (current, previous, plaintext, wanted) in cases {
            let err = Secrets::from_config(&current, &previous, plaintext).unwrap_err();
            assert!(err.contains(wanted), "{err} should say {wanted}");
        }
        assert!(Secrets::from_config(&None, &None, true).unwrap().is_none());
        assert!(!format!("{:?}", secrets(long, None)).contains("0123"), "Debug never shows a secret");
    }

    #[test]
    fn a_source_gets_a_bounded_number_of_connections() {
        let gate = Gate::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..MAX_CONNECTIONS_PER_SOURCE {
            assert!(gate.admit(ip));
        }
        assert!(!gate.admit(ip));
        gate.release(ip);
        assert!(gate.admit(ip));
        assert!(gate.admit("10.0.0.2".parse().unwrap()), "other sources are not affected");
        // All sources together are bounded too.
        let many = (0..MAX_UNAUTHENTICATED as u32).map(|i| IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i)));
        let admitted = many.filter(|ip| gate.admit(*ip)).count();
        assert_eq!(admitted + MAX_CONNECTIONS_PER_SOURCE + 1, MAX_UNAUTHENTICATED);
        assert!(!gate.admit("12.0.0.1".parse().unwrap()));
        // An address that authenticated a link before is not held to it.
        gate.authenticated("10.0.0.2".parse().unwrap());
        assert!(gate.admit("10.0.0.2".parse().unwrap()), "a known peer reconnects through a full gate");
    }
}
