//! Who may speak on a peer link (docs/architecture.md §9): with a shared
//! secret (`AppBuilder::peer_secret`), both ends prove they hold it before
//! any message counts, by a challenge-response: each side sends a fresh
//! nonce, and each answers with an HMAC-SHA256 under the secret of both
//! nonces, both incarnations, the group and its role, so the secret never
//! crosses the wire and a proof cannot be replayed on another link. Without
//! a secret (`AppBuilder::peer_plaintext`, chosen explicitly) the links are
//! not authenticated. Either way the listener bounds what a connection may
//! cost: line length, handshake time, connections per source address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest secret `peer_secret` takes.
pub(crate) const MIN_SECRET_BYTES: usize = 16;
/// The longest message line a listener reads.
pub(super) const MAX_LINE_BYTES: usize = 16 * 1024;
/// Connections one source address may hold open on a listener at once.
pub(super) const MAX_CONNECTIONS_PER_SOURCE: usize = 16;

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

/// What the two ends of one link agree on before any message counts.
pub(super) struct Handshake<'a> {
    pub(super) group: &'a str,
    pub(super) caller_nonce: &'a str,
    pub(super) listener_nonce: &'a str,
    pub(super) caller_incarnation: u64,
    pub(super) listener_incarnation: u64,
}

impl Handshake<'_> {
    /// The proof of `role` (CALLER or LISTENER) under `secret`.
    pub(super) fn proof(&self, secret: &[u8], role: &str) -> String {
        let text = format!(
            "kstate-peer-v1\n{role}\n{}\n{}\n{}\n{}\n{}",
            self.group, self.caller_nonce, self.listener_nonce, self.caller_incarnation, self.listener_incarnation
        );
        let mac = openssl::pkey::PKey::hmac(secret)
            .and_then(|key| {
                let mut signer = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), &key)?;
                signer.update(text.as_bytes())?;
                signer.sign_to_vec()
            })
            .unwrap_or_default();
        hex(&mac)
    }

    /// Whether `proof` is `role`'s under `secret` (compared in constant time).
    pub(super) fn verify(&self, secret: &[u8], role: &str, proof: &str) -> bool {
        let wanted = self.proof(secret, role);
        !wanted.is_empty() && wanted.len() == proof.len() && openssl::memcmp::eq(wanted.as_bytes(), proof.as_bytes())
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
    logged: Mutex<HashMap<IpAddr, Instant>>,
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
}

impl Rejected {
    pub(super) fn label(self) -> &'static str {
        match self {
            Rejected::BadProof => "bad_proof",
            Rejected::Unauthenticated => "unauthenticated",
            Rejected::Garbage => "garbage",
            Rejected::TooManyConnections => "too_many_connections",
            Rejected::WrongGroup => "wrong_group",
        }
    }
}

impl Gate {
    /// Takes a connection slot for `from`; `false`: it holds too many.
    pub(super) fn admit(&self, from: IpAddr) -> bool {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(from).or_default();
        if *n >= MAX_CONNECTIONS_PER_SOURCE {
            return false;
        }
        *n += 1;
        true
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
        Handshake { group: "g", caller_nonce: caller, listener_nonce: listener, caller_incarnation: 1, listener_incarnation: 2 }
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
        assert!(!h.verify(secret, CALLER, ""));
        assert_ne!(nonce(), nonce());
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
    }
}
