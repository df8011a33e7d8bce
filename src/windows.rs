//! Windows over time: fixed windows ([`Windows`], tumbling or hopping) and
//! sessions ([`SessionWindows`], separated by an inactivity gap), as
//! window and session stores use them
//! ([`StoreDefinition::window`](crate::StoreDefinition::window),
//! [`StoreDefinition::session`](crate::StoreDefinition::session)).
//!
//! Times are milliseconds, on the task's stream time. A window
//! `[start, start + size)` closes once stream time reaches
//! `start + size + grace`; a session `[start, end]` (both inclusive) once
//! stream time passes `end + grace`. A record for a closed window is late:
//! the stores drop it and count it.

use std::time::Duration;

/// `d` in whole milliseconds (saturating).
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Fixed windows: every `advance` a window of `size` starts, aligned to the
/// epoch (tumbling windows when `advance == size`, hopping ones when it is
/// smaller), with a grace period for out-of-order records.
///
/// ```
/// use std::time::Duration;
/// // 5-minute windows starting every minute, records up to 30 s late accepted.
/// let w = kstate::Windows::hopping(Duration::from_secs(300), Duration::from_secs(60))
///     .grace(Duration::from_secs(30));
/// // A record at 10:00:30 (ms since the epoch) counts in five windows.
/// let starts: Vec<i64> = w.windows_for(36_030_000).collect();
/// assert_eq!(starts, [35_760_000, 35_820_000, 35_880_000, 35_940_000, 36_000_000]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    size: i64,
    advance: i64,
    grace: i64,
}

impl Windows {
    /// Back-to-back windows of `size` (each record in exactly one).
    pub fn tumbling(size: Duration) -> Windows {
        Windows { size: millis(size), advance: millis(size), grace: 0 }
    }

    /// Windows of `size` starting every `advance` (each record in
    /// `size / advance` of them). `advance` must be at least 1 ms and at
    /// most `size`: checked when the application is built.
    pub fn hopping(size: Duration, advance: Duration) -> Windows {
        Windows { size: millis(size), advance: millis(advance), grace: 0 }
    }

    /// How long after a window's end records are still accepted into it
    /// (default none): the window closes at `end + grace` in stream time.
    pub fn grace(mut self, grace: Duration) -> Windows {
        self.grace = millis(grace);
        self
    }

    /// Window length in ms.
    pub fn size_ms(&self) -> i64 {
        self.size
    }

    /// Time between window starts in ms.
    pub fn advance_ms(&self) -> i64 {
        self.advance
    }

    /// Grace period in ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace
    }

    /// The starts of the windows that hold `timestamp`, oldest first
    /// (Kafka Streams' `windowsFor`: no window starts before 0).
    pub fn windows_for(&self, timestamp: i64) -> impl Iterator<Item = i64> {
        let (size, advance) = (self.size.max(1), self.advance.max(1));
        let first = (timestamp.saturating_sub(size).saturating_add(advance)).max(0).div_euclid(advance) * advance;
        (0..).map(move |i| first + i * advance).take_while(move |&start| start <= timestamp && timestamp >= 0)
    }

    /// Whether the window starting at `start` has closed at `stream_time`.
    pub fn is_closed(&self, start: i64, stream_time: i64) -> bool {
        start.saturating_add(self.size).saturating_add(self.grace) <= stream_time
    }

    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if self.size < 1 {
            return Err("the window size must be at least 1 ms".into());
        }
        if self.advance < 1 || self.advance > self.size {
            return Err(format!("the advance ({} ms) must be between 1 ms and the window size ({} ms)", self.advance, self.size));
        }
        Ok(())
    }
}

/// Session windows: a key's records closer than `gap` to each other fall
/// into one session; a session `[start, end]` spans its first to its last
/// record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionWindows {
    gap: i64,
    grace: i64,
}

impl SessionWindows {
    /// Sessions separated by at least `gap` of inactivity (at least 1 ms:
    /// checked when the application is built).
    pub fn with_gap(gap: Duration) -> SessionWindows {
        SessionWindows { gap: millis(gap), grace: 0 }
    }

    /// How long after a session's end records are still accepted into it
    /// (default none).
    pub fn grace(mut self, grace: Duration) -> SessionWindows {
        self.grace = millis(grace);
        self
    }

    /// The inactivity gap in ms.
    pub fn gap_ms(&self) -> i64 {
        self.gap
    }

    /// Grace period in ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace
    }

    /// Whether a session ending at `end` has closed at `stream_time`.
    pub fn is_closed(&self, end: i64, stream_time: i64) -> bool {
        end.saturating_add(self.grace) < stream_time
    }

    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if self.gap < 1 {
            return Err("the session gap must be at least 1 ms".into());
        }
        Ok(())
    }
}

/// One session: its first and last record's times (both inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Session {
    /// The time of the session's first record.
    pub start: i64,
    /// The time of its last record (`>= start`).
    pub end: i64,
}

impl Session {
    /// A session of one record at `timestamp`.
    pub fn at(timestamp: i64) -> Session {
        Session { start: timestamp, end: timestamp }
    }

    /// The smallest session covering both.
    pub fn merge(self, other: Session) -> Session {
        Session { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

/// A window or session that closed, with its final value: what
/// [`Processor::on_window_close`](crate::Processor::on_window_close) gets
/// for a store that emits final results
/// ([`StoreDefinition::emit_final_results`](crate::StoreDefinition::emit_final_results)).
/// Key and value are the store's encoded bytes; decode them with the
/// codecs the processor writes with.
///
/// ```
/// # use kstate::ClosedWindow;
/// # use kstate::codec::{U64Be, Utf8};
/// fn describe(closed: &ClosedWindow<'_>) -> kstate::Result<String> {
///     let (user, count) = (closed.key_as::<Utf8>()?, closed.value_as::<U64Be>()?);
///     Ok(format!("{user} [{}, {}) = {count}", closed.start(), closed.end()))
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClosedWindow<'a> {
    pub(crate) store: &'a str,
    pub(crate) key: &'a [u8],
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) session: bool,
    pub(crate) value: &'a [u8],
}

impl<'a> ClosedWindow<'a> {
    /// The store it belongs to.
    pub fn store(&self) -> &'a str {
        self.store
    }

    /// The record key (encoded).
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The key decoded with `K`.
    pub fn key_as<K: crate::codec::Codec>(&self) -> crate::Result<K::Item> {
        K::decode(self.key)
    }

    /// The final value (encoded).
    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    /// The value decoded with `V`.
    pub fn value_as<V: crate::codec::Codec>(&self) -> crate::Result<V::Item> {
        V::decode(self.value)
    }

    /// The window's start (a session: its first record's time).
    pub fn start(&self) -> i64 {
        self.start
    }

    /// A window's end, `start + size` (exclusive); a session's last
    /// record's time (inclusive, as [`Session::end`]).
    pub fn end(&self) -> i64 {
        self.end
    }

    /// The session, if a session store's session closed.
    pub fn session(&self) -> Option<Session> {
        self.session.then_some(Session { start: self.start, end: self.end })
    }
}

/// What a window or session store is shaped as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Window(Windows),
    Session(SessionWindows),
}

impl Shape {
    /// The least retention that keeps every window until it closes:
    /// size + grace; for sessions gap + grace + 1 ms (a record at `t` not
    /// yet late merges with a session ending at `t - gap`, and the store's
    /// time may be `t + grace` then).
    pub(crate) fn min_retention_ms(&self) -> i64 {
        match self {
            Shape::Window(w) => w.size.saturating_add(w.grace),
            Shape::Session(s) => s.gap.saturating_add(s.grace).saturating_add(1),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Shape::Window(_) => "window",
            Shape::Session(_) => "session",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Window assignment equals a brute-force model: every multiple of
        /// `advance` (from 0) whose window holds the timestamp.
        #[test]
        fn windows_for_holds_exactly_the_windows_containing_the_time(
            size in 1i64..500, advance_div in 1i64..10, ts in 0i64..5_000,
        ) {
            let advance = (size / advance_div).max(1);
            let w = Windows::hopping(Duration::from_millis(size as u64), Duration::from_millis(advance as u64));
            let got: Vec<i64> = w.windows_for(ts).collect();
            let model: Vec<i64> = (0..=ts).filter(|s| s % advance == 0 && *s <= ts && ts < s + size).collect();
            prop_assert_eq!(got, model);
        }
    }

    #[test]
    fn tumbling_windows_hold_each_time_once() {
        let w = Windows::tumbling(Duration::from_secs(60));
        assert_eq!(w.windows_for(125_000).collect::<Vec<_>>(), [120_000]);
        assert_eq!(w.windows_for(-5).count(), 0);
    }

    #[test]
    fn closing_times() {
        let w = Windows::tumbling(Duration::from_millis(100)).grace(Duration::from_millis(10));
        assert!(!w.is_closed(0, 109));
        assert!(w.is_closed(0, 110));
        let s = SessionWindows::with_gap(Duration::from_millis(100)).grace(Duration::from_millis(10));
        assert!(!s.is_closed(50, 60));
        assert!(s.is_closed(50, 61));
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(Windows::hopping(Duration::from_secs(1), Duration::from_secs(2)).check().is_err());
        assert!(Windows::hopping(Duration::from_secs(1), Duration::ZERO).check().is_err());
        assert!(Windows::tumbling(Duration::ZERO).check().is_err());
        assert!(SessionWindows::with_gap(Duration::ZERO).check().is_err());
        assert!(Windows::hopping(Duration::from_secs(2), Duration::from_secs(1)).check().is_ok());
    }
}
