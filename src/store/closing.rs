//! Final results: the keys of kstate's own stream-time timers for the
//! windows and sessions of stores that emit final results
//! ([`StoreDefinition::emit_final_results`](crate::StoreDefinition::emit_final_results)),
//! architecture.md §7a.
//!
//! A write that creates a window (or session) registers one timer at the
//! time the window closes; when stream time reaches it, the runtime reads
//! the window's value and calls
//! [`Processor::on_window_close`](crate::Processor::on_window_close) instead
//! of `on_timer`. The timers live in the time store like the processor's
//! own, so they are durable, restored and followed by standbys, and a
//! timer's removal lands in the same commit as what its callback wrote.
//!
//! A timer key is [`PREFIX`], the store name's length (2 bytes, big-endian)
//! and the name, a kind byte, then for a window its start (8 bytes), for a
//! session its end and start (8 bytes each), then the encoded record key.
//! [`PREFIX`] is reserved: the processor cannot register timers under it.

use crate::error::Result;
use crate::windows::Session;

/// What registers stream-time timers in a time store (the task's
/// `TaskTime`, in `timers/`).
pub(crate) trait StreamTimers {
    /// Registers the closing timer `key` at `at` in `time_store`, unless it
    /// was registered already since the task started here.
    fn register_closing(&mut self, time_store: &mut crate::store::KeyValueStore, key: &[u8], at: i64) -> Result<()>;
}

/// Where a window or session store that emits final results registers
/// its windows' closings: the task's timers and its time store (the
/// context splits them off the task; plain references, so a handle that
/// holds one ends its borrows where it is last used).
pub(crate) struct Closing<'s> {
    pub(crate) timers: &'s mut dyn StreamTimers,
    pub(crate) time_store: &'s mut crate::store::KeyValueStore,
}

impl Closing<'_> {
    /// Registers a closing at `at` under the timer key `key`.
    pub(crate) fn register(&mut self, at: i64, key: &[u8]) -> Result<()> {
        self.timers.register_closing(self.time_store, key, at)
    }
}

/// The first bytes of every final-result timer key.
pub(crate) const PREFIX: &[u8] = b"\xffkstate.close\x00";

const WINDOW: u8 = b'w';
const SESSION: u8 = b's';

/// Whether `key` is a final-result timer key (reserved for kstate).
pub(crate) fn is_reserved(key: &[u8]) -> bool {
    key.starts_with(PREFIX)
}

/// What a final-result timer closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Closes {
    /// The window starting at this time.
    Window(i64),
    /// This session.
    Session(Session),
}

/// A parsed final-result timer key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClosingKey<'k> {
    pub(crate) store: &'k str,
    pub(crate) closes: Closes,
    pub(crate) key: &'k [u8],
}

fn head(store: &str, kind: u8, capacity: usize) -> Vec<u8> {
    let name = store.as_bytes();
    let mut out = Vec::with_capacity(PREFIX.len() + 3 + name.len() + capacity);
    out.extend_from_slice(PREFIX);
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name);
    out.push(kind);
    out
}

/// The timer key of `key`'s window starting at `start` in `store`.
pub(crate) fn window_key(store: &str, start: i64, key: &[u8]) -> Vec<u8> {
    let mut out = head(store, WINDOW, 8 + key.len());
    out.extend_from_slice(&start.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The timer key of `key`'s `session` in `store`.
pub(crate) fn session_key(store: &str, session: Session, key: &[u8]) -> Vec<u8> {
    let mut out = head(store, SESSION, 16 + key.len());
    out.extend_from_slice(&session.end.to_be_bytes());
    out.extend_from_slice(&session.start.to_be_bytes());
    out.extend_from_slice(key);
    out
}

fn time_at(bytes: &[u8], at: usize) -> Option<i64> {
    Some(i64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Parses a final-result timer key (`None`: not one, or malformed).
pub(crate) fn parse(timer_key: &[u8]) -> Option<ClosingKey<'_>> {
    let rest = timer_key.strip_prefix(PREFIX)?;
    let len = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    let store = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
    let rest = &rest[2 + len..];
    match *rest.first()? {
        WINDOW => Some(ClosingKey { store, closes: Closes::Window(time_at(rest, 1)?), key: rest.get(9..)? }),
        SESSION => {
            let session = Session { end: time_at(rest, 1)?, start: time_at(rest, 9)? };
            Some(ClosingKey { store, closes: Closes::Session(session), key: rest.get(17..)? })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_back() {
        let w = window_key("clicks-per-minute", 60_000, b"ada");
        assert!(is_reserved(&w));
        assert_eq!(parse(&w), Some(ClosingKey { store: "clicks-per-minute", closes: Closes::Window(60_000), key: b"ada" }));
        let s = session_key("visits", Session { start: 5, end: 90 }, b"");
        assert_eq!(parse(&s), Some(ClosingKey { store: "visits", closes: Closes::Session(Session { start: 5, end: 90 }), key: b"" }));
        assert_eq!(parse(b"user timer"), None);
        assert_eq!(parse(&w[..w.len() - 4]), None, "a start cut short");
        assert_eq!(parse(&[PREFIX, &[0, 9], b"short"].concat()), None);
    }
}
