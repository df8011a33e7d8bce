//! Joins as building blocks: a windowed stream-stream join
//! ([`StreamJoin`]) on window stores, with left and outer results emitted
//! once, when a record's window has closed (Kafka Streams' KIP-633
//! semantics, without its early non-matches). Stream-table joins need no
//! helper: README "Joins".
//!
//! A record `L@a` of the left topic and `R@b` of the right topic with the
//! same key match when `a - before <= b <= a + after`. Each side's records
//! wait in a window store of their own (window start = the record's
//! timestamp), until their window closes: `L@a` once stream time passes
//! `a + after + grace`, `R@b` once it passes `b + before + grace`. A record
//! that arrives after its own window closed is late: dropped and counted
//! (`kstate_window_late_records_total`). A record never pairs with a
//! partner whose window has closed if that partner's side reports
//! non-matches (left join: left records; outer: both), so a record
//! reported without a match never gets one afterwards; a record more than
//! `grace` out of order may so miss partners it would otherwise have had.
//! Records without a key or a value are dropped.

use std::time::Duration;

use crate::codec::RawBytes;
use crate::config::StoreDefinition;
use crate::context::ProcessorContext;
use crate::error::{Error, Result};
use crate::record::Record;
use crate::windows::{millis, ClosedWindow, Windows};

/// The time bounds of a stream-stream join.
///
/// ```
/// use std::time::Duration;
/// // Within 5 minutes of each other either way, records up to 30 s late.
/// let w = kstate::JoinWindows::within(Duration::from_secs(300)).grace(Duration::from_secs(30));
/// assert_eq!((w.before_ms(), w.after_ms(), w.grace_ms()), (300_000, 300_000, 30_000));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinWindows {
    before: i64,
    after: i64,
    grace: i64,
}

impl JoinWindows {
    /// Records at most `difference` apart match (either order); no grace.
    pub fn within(difference: Duration) -> JoinWindows {
        JoinWindows { before: millis(difference), after: millis(difference), grace: 0 }
    }

    /// How far before a left record a right one may be.
    pub fn before(mut self, before: Duration) -> JoinWindows {
        self.before = millis(before);
        self
    }

    /// How far after a left record a right one may be.
    pub fn after(mut self, after: Duration) -> JoinWindows {
        self.after = millis(after);
        self
    }

    /// How long after its window a record is still accepted, and a
    /// non-match waits before it is final (default none).
    pub fn grace(mut self, grace: Duration) -> JoinWindows {
        self.grace = millis(grace);
        self
    }

    /// `before` in ms.
    pub fn before_ms(&self) -> i64 {
        self.before
    }

    /// `after` in ms.
    pub fn after_ms(&self) -> i64 {
        self.after
    }

    /// `grace` in ms.
    pub fn grace_ms(&self) -> i64 {
        self.grace
    }
}

/// Which results a stream-stream join emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    /// Pairs only.
    Inner,
    /// Pairs, and each left record without a partner once its window closed.
    Left,
    /// Pairs, and each record of either side without a partner once its window closed.
    Outer,
}

/// One join result: the key, the left and right values (`None`: no
/// partner), and its timestamp (the later of a pair's two; an unmatched
/// record's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined<'a> {
    /// The join key.
    pub key: &'a [u8],
    /// The left record's value.
    pub left: Option<&'a [u8]>,
    /// The right record's value.
    pub right: Option<&'a [u8]>,
    /// The result's timestamp.
    pub timestamp: i64,
}

/// A windowed stream-stream join of two co-partitioned input topics,
/// keyed alike, inside a [`Processor`](crate::Processor): its two buffer
/// stores go to the builder ([`stores`](Self::stores)), each input record
/// to [`process`](Self::process), each closed window to
/// [`on_window_close`](Self::on_window_close); results reach `emit`
/// (typically a [`ProcessorContext::send`]). Results of a record are part
/// of the commit of that record (a non-match: of the commit that closes its
/// window), one transaction under exactly-once. A left or outer join needs
/// [`App::run_processor`](crate::App::run_processor).
///
/// ```no_run
/// use std::time::Duration;
/// use kstate::{App, ClosedWindow, JoinKind, JoinWindows, Joined, Output, Processor, ProcessorContext, ProcessorError, Record, StreamJoin};
///
/// struct Attribution(StreamJoin);
/// fn send(ctx: &mut ProcessorContext<'_>, j: Joined<'_>) -> kstate::Result<()> {
///     let value = [j.left.unwrap_or(b"-"), b"|", j.right.unwrap_or(b"-")].concat();
///     ctx.send(Output::to("attributed").key(j.key).value(&value).timestamp(j.timestamp))
/// }
/// impl Processor for Attribution {
///     fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError> {
///         self.0.process(ctx, record, send)?;
///         Ok(())
///     }
///     fn on_window_close(&mut self, ctx: &mut ProcessorContext<'_>, closed: &ClosedWindow<'_>) -> Result<(), ProcessorError> {
///         self.0.on_window_close(ctx, closed, send)?;
///         Ok(())
///     }
/// }
/// # fn main() -> kstate::Result<()> {
/// let join = StreamJoin::new("views-clicks", "views", "clicks", JoinWindows::within(Duration::from_secs(600)), JoinKind::Left)?;
/// let [left, right] = join.stores();
/// let app = App::builder()
///     .application_id("attribution")
///     .bootstrap_servers("127.0.0.1:9092")
///     .input_topic("views")
///     .input_topic("clicks")
///     .store(left)
///     .store(right)
///     .build()?;
/// app.run_processor(move |_| Attribution(join.clone()))
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct StreamJoin {
    left_store: String,
    right_store: String,
    left_topic: String,
    right_topic: String,
    windows: JoinWindows,
    kind: JoinKind,
}

/// What [`StreamJoin::process`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinOutcome {
    /// The record is of neither joined topic: nothing done.
    NotJoined,
    /// No key or no value: dropped.
    Dropped,
    /// Its own window had closed: dropped and counted as late.
    Late,
    /// Buffered, after emitting this many pairs.
    Buffered(usize),
}

impl StreamJoin {
    /// A join named `name` (its stores: `<name>-left`, `<name>-right`) of
    /// `left_topic` and `right_topic`. A window of zero size (`before +
    /// after` = 0) or the same topic on both sides is [`Error::Config`].
    pub fn new(name: &str, left_topic: impl Into<String>, right_topic: impl Into<String>, windows: JoinWindows, kind: JoinKind) -> Result<StreamJoin> {
        let (left_topic, right_topic) = (left_topic.into(), right_topic.into());
        if windows.before.saturating_add(windows.after) <= 0 {
            return Err(Error::Config(format!("join `{name}`: the join window has zero size (before + after must be at least 1 ms)")));
        }
        if left_topic == right_topic {
            return Err(Error::Config(format!("join `{name}`: both sides read `{left_topic}`; a self-join needs a repartition or a second topic")));
        }
        Ok(StreamJoin {
            left_store: format!("{name}-left"),
            right_store: format!("{name}-right"),
            left_topic,
            right_topic,
            windows,
            kind,
        })
    }

    /// The two buffer stores to declare with
    /// [`AppBuilder::store`](crate::AppBuilder::store): window stores whose
    /// windows close exactly when a buffered record's join window does, the
    /// sides whose non-matches are emitted with final results.
    pub fn stores(&self) -> [StoreDefinition; 2] {
        let w = self.windows;
        let side = |name: &str, reach: i64, final_results: bool| {
            let windows = Windows::tumbling(Duration::from_millis(reach.saturating_add(1) as u64)).grace(Duration::from_millis(w.grace as u64));
            let def = StoreDefinition::window(name.to_string(), windows);
            if final_results {
                def.emit_final_results()
            } else {
                def
            }
        };
        [
            side(&self.left_store, w.after, self.kind != JoinKind::Inner),
            side(&self.right_store, w.before, self.kind == JoinKind::Outer),
        ]
    }

    /// Joins an input record: a record of either topic is paired with the
    /// other side's buffered records in its window (each pair to `emit`),
    /// then buffered itself until its window closes.
    pub fn process(
        &self,
        ctx: &mut ProcessorContext<'_>,
        record: &Record<'_>,
        mut emit: impl FnMut(&mut ProcessorContext<'_>, Joined<'_>) -> Result<()>,
    ) -> Result<JoinOutcome> {
        let Some(left) = which(record.topic, &self.left_topic, &self.right_topic) else {
            return Ok(JoinOutcome::NotJoined);
        };
        let (Some(key), Some(value), Some(ts)) = (record.key, record.value, ctx.timestamp()) else {
            return Ok(JoinOutcome::Dropped);
        };
        let (own, other) = if left { (&self.left_store, &self.right_store) } else { (&self.right_store, &self.left_store) };
        // L@a matches R@b in [a - before, a + after]; R@b matches L@a in [b - after, b + before].
        let w = self.windows;
        let (lo, hi) = if left {
            (ts.saturating_sub(w.before), ts.saturating_add(w.after))
        } else {
            (ts.saturating_sub(w.after), ts.saturating_add(w.before))
        };
        // A partner whose window closed was reported unmatched if its side
        // reports non-matches: it pairs with nothing any more. (A side
        // that reports none keeps pairing until its buffer expires.)
        let guarded = match self.kind {
            JoinKind::Inner => false,
            JoinKind::Left => !left, // the partner is a left record
            JoinKind::Outer => true,
        };
        let key = key.to_vec();
        if ctx.window_store::<RawBytes, RawBytes>(own)?.is_closed(ts) {
            // (counted as late by the store)
            let _ = ctx.window_store::<RawBytes, RawBytes>(own)?.put(&key, ts, &Vec::new())?;
            return Ok(JoinOutcome::Late);
        }
        let mut partners = Vec::new();
        {
            let store = ctx.window_store::<RawBytes, RawBytes>(other)?;
            for (start, bag) in store.fetch(&key, lo.max(0), hi)? {
                if !(guarded && store.is_closed(start)) {
                    partners.push((start, Bag::decode(&bag)?));
                }
            }
        }
        let mut pairs = 0;
        for (start, bag) in &partners {
            for (_, partner) in &bag.entries {
                let (l, r) = if left { (value, &partner[..]) } else { (&partner[..], value) };
                emit(ctx, Joined { key: &key, left: Some(l), right: Some(r), timestamp: ts.max(*start) })?;
                pairs += 1;
            }
        }
        if pairs > 0 {
            let mut store = ctx.window_store::<RawBytes, RawBytes>(other)?;
            for (start, mut bag) in partners {
                if bag.entries.iter().any(|(matched, _)| !matched) {
                    bag.entries.iter_mut().for_each(|(matched, _)| *matched = true);
                    let _ = store.put(&key, start, &bag.encode())?;
                }
            }
        }
        let mut store = ctx.window_store::<RawBytes, RawBytes>(own)?;
        let mut bag = match store.get(&key, ts)? {
            Some(bytes) => Bag::decode(&bytes)?,
            None => Bag::default(),
        };
        bag.entries.push((pairs > 0, value.to_vec()));
        let _ = store.put(&key, ts, &bag.encode())?;
        Ok(JoinOutcome::Buffered(pairs))
    }

    /// A window of one of the join's buffer stores closed: its records
    /// that found no partner go to `emit` (left join: the left side's;
    /// outer join: both sides'), once. `false`: the window is not one of
    /// the join's.
    pub fn on_window_close(
        &self,
        ctx: &mut ProcessorContext<'_>,
        closed: &ClosedWindow<'_>,
        mut emit: impl FnMut(&mut ProcessorContext<'_>, Joined<'_>) -> Result<()>,
    ) -> Result<bool> {
        let Some(left) = which(closed.store(), &self.left_store, &self.right_store) else {
            return Ok(false);
        };
        let emits = match self.kind {
            JoinKind::Inner => false,
            JoinKind::Left => left,
            JoinKind::Outer => true,
        };
        if emits {
            for (matched, value) in Bag::decode(closed.value())?.entries {
                if !matched {
                    let (l, r) = if left { (Some(&value[..]), None) } else { (None, Some(&value[..])) };
                    emit(ctx, Joined { key: closed.key(), left: l, right: r, timestamp: closed.start() })?;
                }
            }
        }
        Ok(true)
    }
}

/// Whether `name` is the left one (`Some(true)`), the right one, or neither.
fn which(name: &str, left: &str, right: &str) -> Option<bool> {
    (name == left || name == right).then_some(name == left)
}

/// The records of one key and timestamp buffered on one side, in arrival
/// order, each with whether it found a partner: `[matched u8][len u32
/// big-endian][value]` each.
#[derive(Default)]
struct Bag {
    entries: Vec<(bool, Vec<u8>)>,
}

impl Bag {
    fn decode(mut bytes: &[u8]) -> Result<Bag> {
        let bad = || Error::codec("join buffer", "a truncated entry");
        let mut entries = Vec::new();
        while !bytes.is_empty() {
            let (&flag, rest) = bytes.split_first().ok_or_else(bad)?;
            let len = u32::from_be_bytes(rest.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
            let value = rest.get(4..4 + len).ok_or_else(bad)?;
            entries.push((flag == 1, value.to_vec()));
            bytes = &rest[4 + len..];
        }
        Ok(Bag { entries })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (matched, value) in &self.entries {
            out.push(u8::from(*matched));
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bags_round_trip_and_refuse_truncation() {
        let bag = Bag { entries: vec![(true, b"a".to_vec()), (false, Vec::new()), (false, b"xyz".to_vec())] };
        let bytes = bag.encode();
        assert_eq!(Bag::decode(&bytes).unwrap().entries, bag.entries);
        assert!(Bag::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
