//! Typed handles on window and session stores (what
//! [`ProcessorContext::window_store`](crate::ProcessorContext::window_store)
//! and [`ProcessorContext::session_store`](crate::ProcessorContext::session_store)
//! return). The key layout and the segments are in `segments.rs`.

use std::marker::PhantomData;
use std::ops::Bound;

use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::store::closing::{self, Closing};
use crate::store::segments::{encode_time, decode_time, Segments, TIME};
use crate::store::engine::SnapshotRead;
use crate::store::KeyValueStore;
use crate::windows::Shape;
use crate::windows::{Session, SessionWindows, Windows};

/// What a window or session store did with a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum WindowPut {
    /// Written: readable now, durable at the next commit.
    Written,
    /// Dropped: its window had closed (end + grace passed in stream time)
    /// or expired (past the store's retention). Counted in
    /// `kstate_window_late_records_total`.
    Late,
}

fn segments(store: &KeyValueStore) -> &Segments {
    store.segments.as_ref().expect("a window or session store has segments")
}

/// Entries of one segment between two RocksDB keys (both included).
fn scan<'a>(store: &'a KeyValueStore, from: &[u8], to: &[u8]) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a {
    store.range_bounds(Bound::Included(from), Bound::Included(to))
}

/// [`scan`] into a sink (what [`window_entries`] and [`session_entries`] read with).
fn scan_into(store: &KeyValueStore, from: &[u8], to: &[u8], sink: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
    for entry in scan(store, from, to) {
        let (k, v) = entry?;
        sink(&k, &v);
    }
    Ok(())
}

/// `key`'s (encoded) windows starting in `[from, to]`, oldest first, as
/// `scan` reads them under the segments `s`: the store's own reads, or a
/// query's snapshot.
pub(crate) fn window_entries(s: &Segments, key: &[u8], from: i64, to: i64, mut scan: impl FnMut(&[u8], &[u8], &mut dyn FnMut(&[u8], &[u8])) -> Result<()>) -> Result<Vec<(i64, Vec<u8>)>> {
    let from = from.max(s.oldest_live());
    let mut out = Vec::new();
    if from > to {
        return Ok(out);
    }
    let live = s.live_segments();
    for segment in s.segment(from).max(*live.start())..=s.segment(to).min(*live.end()) {
        let prefix = encode_time(segment);
        let lo = [&prefix[..], key, &encode_time(from)].concat();
        let hi = [&prefix[..], key, &encode_time(to)].concat();
        scan(&lo, &hi, &mut |k, v| {
            // A longer key with this one as prefix can sort in between.
            if k.len() == key.len() + 2 * TIME {
                out.push((decode_time(&k[TIME + key.len()..]), v.to_vec()));
            }
        })?;
    }
    Ok(out)
}

/// `key`'s (encoded) sessions that end at or after `earliest_end` and
/// start at or before `latest_start`, by end (see [`window_entries`]).
pub(crate) fn session_entries(
    s: &Segments,
    key: &[u8],
    earliest_end: i64,
    latest_start: i64,
    mut scan: impl FnMut(&[u8], &[u8], &mut dyn FnMut(&[u8], &[u8])) -> Result<()>,
) -> Result<Vec<(Session, Vec<u8>)>> {
    let earliest_end = earliest_end.max(s.oldest_live());
    let mut out = Vec::new();
    let live = s.live_segments();
    for segment in s.segment(earliest_end).max(*live.start())..=*live.end() {
        let prefix = encode_time(segment);
        let lo = [&prefix[..], key, &encode_time(earliest_end)].concat();
        let hi = [&prefix[..], key, &encode_time(i64::MAX), &encode_time(i64::MAX)].concat();
        scan(&lo, &hi, &mut |k, v| {
            if k.len() != key.len() + 3 * TIME {
                return;
            }
            let at = TIME + key.len();
            let session = Session { end: decode_time(&k[at..]), start: decode_time(&k[at + TIME..]) };
            if session.start <= latest_start {
                out.push((session, v.to_vec()));
            }
        })?;
    }
    Ok(out)
}

/// When a session of a store that emits final results is final: once
/// stream time passes its end plus the gap (no record can extend it any
/// more) plus grace.
fn final_close(sessions: SessionWindows, end: i64) -> i64 {
    end.saturating_add(sessions.gap_ms()).saturating_add(sessions.grace_ms()).saturating_add(1)
}

/// The value of a closing window or session (`closes`) of `key` in a
/// window or session store, unless it is gone (deleted, merged into
/// another session, expired): what a final result reports.
pub(crate) fn closing_value(store: &KeyValueStore, closes: &closing::Closes, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let s = segments(store);
    let k = match *closes {
        closing::Closes::Window(start) => {
            if s.expired(start) {
                return Ok(None);
            }
            [&s.prefix(start)[..], key, &encode_time(start)].concat()
        }
        closing::Closes::Session(session) => {
            if s.expired(session.end) {
                return Ok(None);
            }
            [&s.prefix(session.end)[..], key, &encode_time(session.end), &encode_time(session.start)].concat()
        }
    };
    store.get(&k)
}

/// The segments of a snapshot of a segmented store: its shape and
/// retention, and the store time the snapshot recorded.
pub(crate) fn committed_segments(view: &SnapshotRead<'_>, shape: Shape, retention: std::time::Duration) -> Result<Segments> {
    let mut s = Segments::new(crate::store::layout_of(shape), retention);
    s.reset(view.segments()?.map_or(crate::store::segments::NO_TIME, |r| r.time));
    Ok(s)
}

/// A window store of one partition with key codec `K` and value codec `V`:
/// a value per (key, window start). Windows past the store's retention
/// are never returned; writes into closed windows are dropped
/// ([`WindowPut::Late`]).
///
/// ```no_run
/// # fn f(ctx: &mut kstate::ProcessorContext<'_>, user: String) -> kstate::Result<()> {
/// use kstate::codec::{U64Be, Utf8};
/// let now = ctx.timestamp().unwrap_or_default();
/// let mut clicks = ctx.window_store::<Utf8, U64Be>("clicks-per-5min")?;
/// // Count the click in every window that holds it.
/// clicks.update(&user, now, |_start, count| count.unwrap_or(0) + 1)?;
/// # Ok(()) }
/// ```
pub struct WindowStore<'s, K, V> {
    inner: &'s mut KeyValueStore,
    windows: Windows,
    stream_time: Option<i64>,
    /// Registers a new window's closing (a store that emits final results).
    closing: Option<Closing<'s>>,
    _codecs: PhantomData<(K, V)>,
}

/// How many windows an [`update`](WindowStore::update) wrote, and how many
/// it dropped as late.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowUpdate {
    /// Windows written.
    pub written: usize,
    /// Windows that had closed (the record was late for them).
    pub late: usize,
}

impl<'s, K: Codec, V: Codec> WindowStore<'s, K, V> {
    pub(crate) fn new(inner: &'s mut KeyValueStore, windows: Windows, stream_time: Option<i64>) -> Self {
        WindowStore { inner, windows, stream_time, closing: None, _codecs: PhantomData }
    }

    /// A handle whose new windows register their closing with `closing`.
    pub(crate) fn closing(mut self, closing: Option<Closing<'s>>) -> Self {
        self.closing = closing;
        self
    }

    /// Registers the closing of `key`'s window starting at `start` (final
    /// results only), once per window and task incarnation: again after a
    /// restart, so that a closing whose time-store record was lost while
    /// the window's landed (at-least-once) is registered anew.
    fn closes(&mut self, key: &[u8], start: i64) -> Result<()> {
        let Some(closing) = &mut self.closing else { return Ok(()) };
        let at = start.saturating_add(self.windows.size_ms()).saturating_add(self.windows.grace_ms());
        closing.register(at, &closing::window_key(self.inner.name(), start, key))
    }

    /// The store's windows.
    pub fn windows(&self) -> Windows {
        self.windows
    }

    /// The store's time: the latest window start written (`None`: empty).
    /// Windows starting at or before `time - retention` are expired.
    pub fn store_time(&self) -> Option<i64> {
        Some(segments(self.inner).time()).filter(|&t| t != crate::store::segments::NO_TIME)
    }

    fn local_key(&self, key: &[u8], start: i64) -> Vec<u8> {
        [&segments(self.inner).prefix(start)[..], key, &encode_time(start)].concat()
    }

    /// Whether the window starting at `start` takes no more writes: closed
    /// at the task's stream time, or expired in the store.
    pub fn is_closed(&self, start: i64) -> bool {
        self.stream_time.is_some_and(|t| self.windows.is_closed(start, t)) || segments(self.inner).expired(start)
    }

    /// Writes `value` for `key`'s window starting at `start` (at least 0,
    /// else [`Error::InvalidUse`]), unless the window is closed.
    pub fn put(&mut self, key: &K::Item, start: i64, value: &V::Item) -> Result<WindowPut> {
        if start < 0 {
            return Err(Error::InvalidUse(format!("window store `{}`: a window start must be at least 0, not {start}", self.inner.name())));
        }
        if self.is_closed(start) {
            self.inner.metrics.late_records.increment(1);
            return Ok(WindowPut::Late);
        }
        let encoded = K::encode(key)?;
        let k = self.local_key(&encoded, start);
        // A window with a value already has its closing registered.
        self.closes(&encoded, start)?;
        self.inner.put(&k, &V::encode(value)?)?;
        self.inner.segments.as_mut().expect("checked").observe(start);
        Ok(WindowPut::Written)
    }

    /// Deletes `key`'s window starting at `start` (a tombstone in the
    /// changelog). Like a write, it moves the store's time to `start` if
    /// later: a restore sees only the tombstone.
    pub fn delete(&mut self, key: &K::Item, start: i64) -> Result<()> {
        let k = self.local_key(&K::encode(key)?, start);
        self.inner.delete(&k)?;
        self.inner.segments.as_mut().expect("checked").observe(start);
        Ok(())
    }

    /// The value of `key`'s window starting at `start`, unless expired.
    pub fn get(&self, key: &K::Item, start: i64) -> Result<Option<V::Item>> {
        if segments(self.inner).expired(start) {
            return Ok(None);
        }
        let k = self.local_key(&K::encode(key)?, start);
        self.inner.get(&k)?.map(|v| V::decode(&v)).transpose()
    }

    /// Applies `f` to each window holding `timestamp` (the windows'
    /// [`windows_for`](Windows::windows_for)): `f(start, current value)`
    /// gives the new value. Closed windows are skipped and counted.
    pub fn update(&mut self, key: &K::Item, timestamp: i64, mut f: impl FnMut(i64, Option<V::Item>) -> V::Item) -> Result<WindowUpdate> {
        let encoded = K::encode(key)?;
        let mut done = WindowUpdate::default();
        for start in self.windows.windows_for(timestamp) {
            if self.is_closed(start) {
                self.inner.metrics.late_records.increment(1);
                done.late += 1;
                continue;
            }
            let k = self.local_key(&encoded, start);
            let old = self.inner.get(&k)?.map(|v| V::decode(&v)).transpose()?;
            self.closes(&encoded, start)?;
            self.inner.put(&k, &V::encode(&f(start, old))?)?;
            self.inner.segments.as_mut().expect("checked").observe(start);
            done.written += 1;
        }
        Ok(done)
    }

    /// `key`'s windows starting in `[from, to]`, oldest first.
    pub fn fetch(&self, key: &K::Item, from: i64, to: i64) -> Result<Vec<(i64, V::Item)>> {
        let raw = window_entries(segments(self.inner), &K::encode(key)?, from, to, |lo, hi, sink| scan_into(self.inner, lo, hi, sink))?;
        raw.into_iter().map(|(start, v)| Ok((start, V::decode(&v)?))).collect()
    }

    /// `key`'s windows starting in `[from, to]`, newest first.
    pub fn fetch_backward(&self, key: &K::Item, from: i64, to: i64) -> Result<Vec<(i64, V::Item)>> {
        let mut out = self.fetch(key, from, to)?;
        out.reverse();
        Ok(out)
    }

    /// Every key's windows starting in `[from, to]`, by start, then key bytes.
    #[allow(clippy::type_complexity)] // (key, start, value), as Kafka Streams' Windowed<K>
    pub fn fetch_all(&self, from: i64, to: i64) -> Result<Vec<(K::Item, i64, V::Item)>> {
        let s = segments(self.inner);
        let from = from.max(s.oldest_live());
        let mut raw = Vec::new();
        if from <= to {
            let live = s.live_segments();
            for segment in s.segment(from).max(*live.start())..=s.segment(to).min(*live.end()) {
                let prefix = encode_time(segment);
                let hi = encode_time(segment.saturating_add(1));
                for entry in self.inner.range(&prefix, &hi) {
                    let (k, v) = entry?;
                    let start = decode_time(&k[k.len() - TIME..]);
                    if (from..=to).contains(&start) {
                        raw.push((start, k[TIME..k.len() - TIME].to_vec(), v));
                    }
                }
            }
        }
        raw.sort();
        raw.into_iter().map(|(start, k, v)| Ok((K::decode(&k)?, start, V::decode(&v)?))).collect()
    }
}

/// A session store of one partition with key codec `K` and value codec
/// `V`: a value per (key, session). Sessions that ended at or before the
/// store's time minus its retention are never returned.
///
/// ```no_run
/// # fn f(ctx: &mut kstate::ProcessorContext<'_>, user: String) -> kstate::Result<()> {
/// use kstate::codec::{U64Be, Utf8};
/// let now = ctx.timestamp().unwrap_or_default();
/// let mut visits = ctx.session_store::<Utf8, U64Be>("visits")?;
/// // Count the event in its session, merging the sessions it bridges.
/// visits.record(&user, now, |merged| merged.iter().map(|(_, n)| n).sum::<u64>() + 1)?;
/// # Ok(()) }
/// ```
pub struct SessionStore<'s, K, V> {
    inner: &'s mut KeyValueStore,
    sessions: SessionWindows,
    stream_time: Option<i64>,
    /// Registers a new session's closing (a store that emits final results).
    closing: Option<Closing<'s>>,
    _codecs: PhantomData<(K, V)>,
}

/// What [`SessionStore::record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum SessionRecord {
    /// The record is in this session now (the sessions it merged were removed).
    Merged(Session),
    /// Its session had closed; nothing was written.
    Late,
}

impl<'s, K: Codec, V: Codec> SessionStore<'s, K, V> {
    pub(crate) fn new(inner: &'s mut KeyValueStore, sessions: SessionWindows, stream_time: Option<i64>) -> Self {
        SessionStore { inner, sessions, stream_time, closing: None, _codecs: PhantomData }
    }

    /// A handle whose new sessions register their closing with `closing`.
    pub(crate) fn closing(mut self, closing: Option<Closing<'s>>) -> Self {
        self.closing = closing;
        self
    }

    /// Registers the closing of `key`'s `session` (final results only, once
    /// per session and task incarnation): when stream time passes its end
    /// plus the gap plus grace, since until then a record could still
    /// extend it.
    fn closes(&mut self, key: &[u8], session: Session) -> Result<()> {
        let Some(closing) = &mut self.closing else { return Ok(()) };
        let at = final_close(self.sessions, session.end);
        closing.register(at, &closing::session_key(self.inner.name(), session, key))
    }

    /// The store's session windows.
    pub fn sessions(&self) -> SessionWindows {
        self.sessions
    }

    fn local_key(&self, key: &[u8], session: Session) -> Vec<u8> {
        [&segments(self.inner).prefix(session.end)[..], key, &encode_time(session.end), &encode_time(session.start)].concat()
    }

    /// Whether a session ending at `end` takes no more writes: closed at
    /// the task's stream time, or expired in the store.
    pub fn is_closed(&self, end: i64) -> bool {
        self.stream_time.is_some_and(|t| self.sessions.is_closed(end, t)) || segments(self.inner).expired(end)
    }

    /// Writes `value` for `key`'s `session` (`start <= end`, else
    /// [`Error::InvalidUse`]), unless it is closed.
    pub fn put(&mut self, key: &K::Item, session: Session, value: &V::Item) -> Result<WindowPut> {
        if session.start > session.end {
            return Err(Error::InvalidUse(format!("session store `{}`: a session's start {} is after its end {}", self.inner.name(), session.start, session.end)));
        }
        if self.is_closed(session.end) {
            self.inner.metrics.late_records.increment(1);
            return Ok(WindowPut::Late);
        }
        let encoded = K::encode(key)?;
        let k = self.local_key(&encoded, session);
        self.closes(&encoded, session)?;
        self.inner.put(&k, &V::encode(value)?)?;
        self.inner.segments.as_mut().expect("checked").observe(session.end);
        Ok(WindowPut::Written)
    }

    /// Removes `key`'s `session` (a tombstone in the changelog). Like a
    /// write, it moves the store's time to the session's end if later.
    pub fn remove(&mut self, key: &K::Item, session: Session) -> Result<()> {
        let k = self.local_key(&K::encode(key)?, session);
        self.inner.delete(&k)?;
        self.inner.segments.as_mut().expect("checked").observe(session.end);
        Ok(())
    }

    /// The value of `key`'s `session`, unless expired.
    pub fn get(&self, key: &K::Item, session: Session) -> Result<Option<V::Item>> {
        if segments(self.inner).expired(session.end) {
            return Ok(None);
        }
        let k = self.local_key(&K::encode(key)?, session);
        self.inner.get(&k)?.map(|v| V::decode(&v)).transpose()
    }

    /// `key`'s sessions that end at or after `earliest_end` and start at or
    /// before `latest_start` (those overlapping `[earliest_end,
    /// latest_start]`), by end.
    pub fn find_sessions(&self, key: &K::Item, earliest_end: i64, latest_start: i64) -> Result<Vec<(Session, V::Item)>> {
        let key = K::encode(key)?;
        self.find_encoded(&key, earliest_end, latest_start)
    }

    fn find_encoded(&self, key: &[u8], earliest_end: i64, latest_start: i64) -> Result<Vec<(Session, V::Item)>> {
        let raw = session_entries(segments(self.inner), key, earliest_end, latest_start, |lo, hi, sink| scan_into(self.inner, lo, hi, sink))?;
        raw.into_iter().map(|(session, v)| Ok((session, V::decode(&v)?))).collect()
    }

    /// Every live session of `key`, by end.
    pub fn fetch(&self, key: &K::Item) -> Result<Vec<(Session, V::Item)>> {
        self.find_sessions(key, i64::MIN, i64::MAX)
    }

    /// Session aggregation in one call (Kafka Streams'
    /// `SessionWindowedKStream::aggregate`): the record at `timestamp`
    /// joins every session of `key` within the gap of it; those sessions
    /// are removed and one merged session is written with the value
    /// `f(merged sessions and their values)` returns (empty: a new
    /// session). A record whose merged session has closed writes nothing
    /// (so none can reopen a session a store with final results reported:
    /// that happens once stream time passes its end plus gap plus grace).
    pub fn record(&mut self, key: &K::Item, timestamp: i64, f: impl FnOnce(&[(Session, V::Item)]) -> V::Item) -> Result<SessionRecord> {
        let encoded = K::encode(key)?;
        let gap = self.sessions.gap_ms();
        let found = self.find_encoded(&encoded, timestamp.saturating_sub(gap), timestamp.saturating_add(gap))?;
        let merged = found.iter().fold(Session::at(timestamp), |m, (s, _)| m.merge(*s));
        // (With final results no record can merge into a reported session:
        // one is reported once stream time passes its end + gap + grace, so
        // a record within the gap of it is late here already.)
        if self.is_closed(merged.end) {
            self.inner.metrics.late_records.increment(1);
            return Ok(SessionRecord::Late);
        }
        let value = V::encode(&f(&found))?;
        for (session, _) in &found {
            if *session != merged {
                let k = self.local_key(&encoded, *session);
                self.inner.delete(&k)?;
            }
        }
        // The merged sessions' closings find nothing when they fire.
        self.closes(&encoded, merged)?;
        let k = self.local_key(&encoded, merged);
        self.inner.put(&k, &value)?;
        self.inner.segments.as_mut().expect("checked").observe(merged.end);
        Ok(SessionRecord::Merged(merged))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::codec::{RawBytes, U64Be};
    use crate::store::engine::Engine;
    use crate::store::scratch_store_with;
    use crate::windows::Shape;

    const SIZE: i64 = 100;
    const ADVANCE: i64 = 50;
    const GRACE: i64 = 20;
    /// Segments of 75 s: retention long enough for several.
    const RETENTION: i64 = 150_000;

    fn window_store(dir: &std::path::Path) -> (KeyValueStore, Windows) {
        let w = Windows::hopping(Duration::from_millis(SIZE as u64), Duration::from_millis(ADVANCE as u64)).grace(Duration::from_millis(GRACE as u64));
        (scratch_store_with(dir, Some((Shape::Window(w), Duration::from_millis(RETENTION as u64)))), w)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(u8, i64, u64),
        Delete(u8, i64),
        Advance(i64),
    }

    /// Keys that are prefixes of each other (the last one sorting among
    /// the first one's encoded times), to catch scans that mix them up.
    const KEYS: [&[u8]; 4] = [b"a", b"ab", b"b", b"a\x80\x00\x00\x00\x00\x00"];

    /// Operations on windows starting before `windows * ADVANCE`.
    fn op(windows: i64) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..4, 0..windows, any::<u64>()).prop_map(|(k, w, v)| Op::Put(k, w * ADVANCE, v)),
            1 => (0u8..4, 0..windows).prop_map(|(k, w)| Op::Delete(k, w * ADVANCE)),
            1 => (0i64..40_000).prop_map(Op::Advance),
        ]
    }

    /// Ops over a long time (windows expire) or a short one (the store's
    /// time stays low, so scans start low and cross the last key's bytes).
    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop_oneof![
            proptest::collection::vec(op(8_000), 1..120),
            proptest::collection::vec(op(1_000), 1..120),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Puts, deletes, lateness, expiry and every fetch equal a map of
        /// (key, start) → value filtered by the store's time.
        #[test]
        fn window_store_equals_a_model(ops in ops(), from in prop_oneof![0i64..1_000, 0i64..400_000], len in 0i64..400_000) {
            let dir = tempfile::tempdir().unwrap();
            let (mut kv, windows) = window_store(dir.path());
            let mut model: BTreeMap<(Vec<u8>, i64), u64> = BTreeMap::new();
            let (mut stream_time, mut store_time) = (None::<i64>, i64::MIN);
            for op in ops {
                let mut ws = WindowStore::<RawBytes, U64Be>::new(&mut kv, windows, stream_time);
                match op {
                    Op::Put(k, start, v) => {
                        let late = stream_time.is_some_and(|t| start + SIZE + GRACE <= t)
                            || (store_time != i64::MIN && start <= store_time - RETENTION);
                        let got = ws.put(&KEYS[k as usize].to_vec(), start, &v).unwrap();
                        prop_assert_eq!(got, if late { WindowPut::Late } else { WindowPut::Written });
                        if !late {
                            model.insert((KEYS[k as usize].to_vec(), start), v);
                            store_time = store_time.max(start);
                        }
                    }
                    Op::Delete(k, start) => {
                        ws.delete(&KEYS[k as usize].to_vec(), start).unwrap();
                        model.remove(&(KEYS[k as usize].to_vec(), start));
                        store_time = store_time.max(start);
                    }
                    Op::Advance(by) => stream_time = Some(stream_time.unwrap_or(0) + by),
                }
            }
            let live = |start: i64| store_time == i64::MIN || start > store_time - RETENTION;
            let to = from + len;
            let ws = WindowStore::<RawBytes, U64Be>::new(&mut kv, windows, stream_time);
            for key in KEYS {
                let want: Vec<(i64, u64)> = model.range((key.to_vec(), from)..=(key.to_vec(), to))
                    .filter(|((_, s), _)| live(*s)).map(|((_, s), v)| (*s, *v)).collect();
                prop_assert_eq!(ws.fetch(&key.to_vec(), from, to).unwrap(), want.clone());
                let mut back = want.clone();
                back.reverse();
                prop_assert_eq!(ws.fetch_backward(&key.to_vec(), from, to).unwrap(), back);
                for (start, v) in &want {
                    prop_assert_eq!(ws.get(&key.to_vec(), *start).unwrap(), Some(*v));
                }
            }
            let mut all: Vec<(Vec<u8>, i64, u64)> = model.iter()
                .filter(|((_, s), _)| (from..=to).contains(s) && live(*s)).map(|((k, s), v)| (k.clone(), *s, *v)).collect();
            all.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
            prop_assert_eq!(ws.fetch_all(from, to).unwrap(), all);
        }

        /// Session aggregation (a count per session) equals a model that
        /// merges every session within the gap of each record.
        #[test]
        fn session_store_equals_a_model(records in proptest::collection::vec((0u8..4, 0i64..3_000), 1..100)) {
            const GAP: i64 = 100;
            let dir = tempfile::tempdir().unwrap();
            let sessions = SessionWindows::with_gap(Duration::from_millis(GAP as u64)).grace(Duration::from_millis(1_000));
            let mut kv = scratch_store_with(dir.path(), Some((Shape::Session(sessions), Duration::from_secs(3_600))));
            let mut model: BTreeMap<Vec<u8>, Vec<(Session, u64)>> = BTreeMap::new();
            let mut stream_time = None::<i64>;
            for (k, ts) in records {
                let key = KEYS[k as usize].to_vec();
                stream_time = Some(stream_time.map_or(ts, |t: i64| t.max(ts)));
                // The model.
                let mine = model.entry(key.clone()).or_default();
                let (near, far): (Vec<_>, Vec<_>) = mine.drain(..).partition(|(s, _)| s.end >= ts - GAP && s.start <= ts + GAP);
                let merged = near.iter().fold(Session::at(ts), |m, (s, _)| m.merge(*s));
                let late = merged.end + 1_000 < stream_time.unwrap();
                *mine = far;
                if late {
                    mine.extend(near);
                } else {
                    mine.push((merged, near.iter().map(|(_, n)| n).sum::<u64>() + 1));
                }
                mine.sort();
                // The store.
                let mut ss = SessionStore::<RawBytes, U64Be>::new(&mut kv, sessions, stream_time);
                let got = ss.record(&key, ts, |found| found.iter().map(|(_, n)| n).sum::<u64>() + 1).unwrap();
                prop_assert_eq!(got, if late { SessionRecord::Late } else { SessionRecord::Merged(merged) });
            }
            let ss = SessionStore::<RawBytes, U64Be>::new(&mut kv, sessions, stream_time);
            for key in KEYS {
                let mut want = model.get(key).cloned().unwrap_or_default();
                want.sort_by_key(|(s, _)| (s.end, s.start));
                prop_assert_eq!(ss.fetch(&key.to_vec()).unwrap(), want);
            }
        }
    }

    #[test]
    fn an_expired_segment_is_dropped_with_one_range_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let (mut kv, windows) = window_store(dir.path());
        let mut ws = WindowStore::<RawBytes, U64Be>::new(&mut kv, windows, None);
        for start in [0, 60_000, 120_000, 180_000] {
            assert_eq!(ws.put(&b"k".to_vec(), start, &1).unwrap(), WindowPut::Written);
        }
        // As a commit writes them: the data, then the bookkeeping.
        let mut batch = Engine::batch();
        for (k, v) in kv.overlay.iter() {
            batch.put(k, v.unwrap());
        }
        let update = kv.segments.as_mut().unwrap().take_update();
        // Store time 180 s, retention 150 s: segment 0 holds only expired windows.
        assert_eq!(update.drop.map(|(_, to)| to), Some(encode_time(0)));
        kv.engine().add_segments_update(&mut batch, &update);
        kv.engine().commit(batch, 3).unwrap();
        kv.overlay.clear();
        let stored: Vec<Vec<u8>> = kv.engine().scan(Bound::Unbounded, Bound::Unbounded).map(|e| e.unwrap().0.to_vec()).collect();
        assert_eq!(stored.len(), 4, "segment 0 was not expired yet at the drop");
        let recorded = kv.engine().segments().unwrap().unwrap();
        assert_eq!((recorded.interval, recorded.time, recorded.layout, recorded.retention), (75_000, 180_000, b'w', RETENTION));
        let mut ws = WindowStore::<RawBytes, U64Be>::new(&mut kv, windows, None);
        assert_eq!(ws.put(&b"k".to_vec(), 240_000, &1).unwrap(), WindowPut::Written);
        let update = kv.segments.as_mut().unwrap().take_update();
        let mut batch = Engine::batch();
        kv.engine().add_segments_update(&mut batch, &update);
        kv.engine().commit(batch, 4).unwrap();
        let stored: Vec<i64> = kv.engine().scan(Bound::Unbounded, Bound::Unbounded).map(|e| decode_time(&e.unwrap().0[TIME + 1..])).collect();
        assert_eq!(stored, [120_000, 180_000], "windows at or before 90 s dropped with their segments");
    }
}
