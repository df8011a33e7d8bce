//! A task's time: its stream time, its per-key timers and its punctuation
//! schedules ([`TaskTime`]). Stream time and timers are state: they live in
//! the task's time store (the internal store [`TIME_STORE`], present when
//! the application enables timers), written in the task's commits,
//! changelogged, restored and followed by standbys like any store
//! (architecture.md §6). Punctuation schedules are not state: the
//! processor's `init` schedules them whenever the task starts.
//!
//! | file | what |
//! |---|---|
//! | `queue.rs` | one clock's timers: segments of timers per commit and page, the watermark of fired ones, the loaded pages |
//! | `keys.rs` | timer keys in one buffer, their order inline |
//! | `loaded.rs` | the timers of the loaded pages in memory, grouped by time |
//! | `punctuation.rs` | punctuation schedules and when each runs next |

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::{KeyValueStore, NO_TIME};
use crate::time::{Punctuation, PunctuationId, TimeDomain, Timer};

mod keys;
mod loaded;
mod punctuation;
mod queue;

pub(crate) use queue::TimerQueue;

/// What a time store holds, read from its keys and values in key order
/// (`kstate inspect`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TimersSummary {
    /// The task's committed stream time, if any.
    pub stream_time: Option<i64>,
    /// Pending stream-time timers.
    pub stream_time_timers: u64,
    /// The earliest pending stream-time timer's time.
    pub earliest_stream_time_timer: Option<i64>,
    /// Pending wall-clock timers.
    pub wall_clock_timers: u64,
    /// The earliest pending wall-clock timer's time (ms since the epoch).
    pub earliest_wall_clock_timer: Option<i64>,
}

impl TimersSummary {
    /// Summarises a time store; `entries` gives its entries in key order
    /// (called once per clock).
    pub(crate) fn of<K, V, I>(entries: impl Fn() -> I) -> Result<TimersSummary>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
        I: Iterator<Item = Result<(K, V)>>,
    {
        let mut s = TimersSummary::default();
        for entry in entries() {
            let (k, v) = entry?;
            if k.as_ref() == STREAM_TIME_KEY {
                s.stream_time = v.as_ref().try_into().ok().map(i64::from_be_bytes);
                break;
            }
        }
        let stream = queue::live_timers(entries(), TimeDomain::StreamTime)?;
        s.stream_time_timers = stream.len() as u64;
        s.earliest_stream_time_timer = stream.first().map(|tk| queue::split_timer_key(tk).0);
        let wall = queue::live_timers(entries(), TimeDomain::WallClock)?;
        s.wall_clock_timers = wall.len() as u64;
        s.earliest_wall_clock_timer = wall.first().map(|tk| queue::split_timer_key(tk).0);
        Ok(s)
    }
}

use punctuation::Punctuations;

/// The internal store holding each task's stream time and timers (its
/// changelog: `<application_id>-kstate-time-changelog`). Reserved: no user
/// store may have this name.
pub const TIME_STORE: &str = "kstate-time";

/// The time store's key of the task's stream time (8 bytes, big-endian);
/// like the timer queues' own bookkeeping keys it starts with 0, before
/// every timer record (see `queue.rs`).
pub(crate) const STREAM_TIME_KEY: &[u8] = b"\x00stream-time";

/// Something due: a timer or a punctuation.
pub(crate) enum Due {
    Timer(Timer),
    Punctuation(Punctuation),
}

/// One task's clocks, timers and punctuations.
pub(crate) struct TaskTime {
    stream_time: Option<i64>,
    /// Stream time for the task's stream-time TTL stores (`NO_TIME` until known).
    clock: Arc<AtomicI64>,
    /// The stream time last written to the time store.
    persisted: Option<i64>,
    stream_timers: TimerQueue,
    wall_timers: TimerQueue,
    punctuations: Punctuations,
    /// Final-result closings registered since the task started here (one
    /// per open window of a store that emits final results; dropped when
    /// they fire).
    closings: std::collections::HashSet<Vec<u8>>,
    /// `kstate_stream_time_ms` of the task.
    gauge: metrics::Gauge,
    pub(crate) metrics: TimeMetrics,
}

/// The task's timer and punctuation metrics, per clock (index: stream
/// time 0, wall clock 1).
pub(crate) struct TimeMetrics {
    fired: [metrics::Counter; 2],
    pending: [metrics::Gauge; 2],
    lateness: [metrics::Histogram; 2],
    punctuations: [metrics::Counter; 2],
    punctuation_seconds: [metrics::Histogram; 2],
}

impl TimeMetrics {
    fn new(partition: i32) -> Self {
        use crate::metrics::{PUNCTUATIONS, PUNCTUATION_SECONDS, TIMERS_FIRED, TIMERS_PENDING, TIMER_LATENESS};
        let p = partition.to_string();
        fn both<T>(f: impl Fn(&'static str) -> T) -> [T; 2] {
            [f("stream_time"), f("wall_clock")]
        }
        TimeMetrics {
            fired: both(|d| metrics::counter!(TIMERS_FIRED, "partition" => p.clone(), "domain" => d)),
            pending: both(|d| metrics::gauge!(TIMERS_PENDING, "partition" => p.clone(), "domain" => d)),
            lateness: both(|d| metrics::histogram!(TIMER_LATENESS, "partition" => p.clone(), "domain" => d)),
            punctuations: both(|d| metrics::counter!(PUNCTUATIONS, "partition" => p.clone(), "domain" => d)),
            punctuation_seconds: both(|d| metrics::histogram!(PUNCTUATION_SECONDS, "partition" => p.clone(), "domain" => d)),
        }
    }

    /// A timer fired `late_ms` after its time (on its own clock).
    pub(crate) fn timer_fired(&self, domain: TimeDomain, late_ms: i64) {
        let i = domain as usize;
        self.fired[i].increment(1);
        self.lateness[i].record(late_ms.max(0) as f64 / 1000.0);
    }

    /// A punctuation ran for `took`.
    pub(crate) fn punctuated(&self, domain: TimeDomain, took: Duration) {
        let i = domain as usize;
        self.punctuations[i].increment(1);
        self.punctuation_seconds[i].record(took.as_secs_f64());
    }
}

impl TaskTime {
    pub(crate) fn new(partition: i32) -> Self {
        TaskTime {
            stream_time: None,
            clock: Arc::new(AtomicI64::new(NO_TIME)),
            persisted: None,
            stream_timers: TimerQueue::new(TimeDomain::StreamTime),
            wall_timers: TimerQueue::new(TimeDomain::WallClock),
            punctuations: Punctuations::default(),
            closings: Default::default(),
            gauge: metrics::gauge!(crate::metrics::STREAM_TIME, "partition" => partition.to_string()),
            metrics: TimeMetrics::new(partition),
        }
    }

    /// Reads the stream time the task committed last, when it starts running.
    pub(crate) fn load(&mut self, store: Option<&KeyValueStore>) -> Result<()> {
        let Some(store) = store else {
            // No time store: no timers to look for.
            self.stream_timers = TimerQueue::none(TimeDomain::StreamTime);
            self.wall_timers = TimerQueue::none(TimeDomain::WallClock);
            return Ok(());
        };
        self.stream_timers.load(store)?;
        self.wall_timers.load(store)?;
        if let Some(v) = store.get(STREAM_TIME_KEY)? {
            let t = i64::from_be_bytes(v.as_slice().try_into().map_err(|_| Error::Codec {
                codec: "stream time",
                source: format!("{} bytes in the time store of partition {}, not 8", v.len(), store.partition()).into(),
            })?);
            self.stream_time = Some(t);
            self.persisted = Some(t);
            self.clock.store(t, Ordering::Relaxed);
            self.gauge.set(t as f64);
        }
        Ok(())
    }

    /// Writes the timers registered and fired since the last commit, and
    /// the stream time if it moved, before the task's stores are sealed
    /// for a commit.
    pub(crate) fn persist(&mut self, store: Option<&mut KeyValueStore>) -> Result<()> {
        let Some(store) = store else {
            self.persisted = self.stream_time;
            return Ok(());
        };
        self.stream_timers.persist(store)?;
        self.wall_timers.persist(store)?;
        self.metrics.pending[0].set(self.stream_timers.count() as f64);
        self.metrics.pending[1].set(self.wall_timers.count() as f64);
        if self.stream_time == self.persisted {
            return Ok(());
        }
        if let Some(t) = self.stream_time {
            store.put(STREAM_TIME_KEY, &t.to_be_bytes())?;
        }
        self.persisted = self.stream_time;
        if let Some(t) = self.stream_time {
            self.gauge.set(t as f64);
        }
        Ok(())
    }

    /// The task's stream time as its stream-time TTL stores read it.
    pub(crate) fn clock(&self) -> &Arc<AtomicI64> {
        &self.clock
    }

    /// The largest record timestamp the task has processed.
    pub(crate) fn stream_time(&self) -> Option<i64> {
        self.stream_time
    }

    /// Moves stream time to `timestamp` if that is later; `true` if it moved.
    pub(crate) fn advance(&mut self, timestamp: i64) -> bool {
        if self.stream_time.is_none_or(|t| timestamp > t) {
            self.stream_time = Some(timestamp);
            self.clock.store(timestamp, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    fn queue(&mut self, domain: TimeDomain) -> &mut TimerQueue {
        match domain {
            TimeDomain::StreamTime => &mut self.stream_timers,
            TimeDomain::WallClock => &mut self.wall_timers,
        }
    }

    pub(crate) fn register_timer(&mut self, store: &mut KeyValueStore, domain: TimeDomain, key: &[u8], timestamp: i64) -> Result<()> {
        self.queue(domain).register(store, timestamp, key)
    }

    /// A final-result closing fired: a write of its window registers it again.
    pub(crate) fn closing_fired(&mut self, key: &[u8]) {
        self.closings.remove(key);
    }

    pub(crate) fn delete_timer(&mut self, store: &mut KeyValueStore, domain: TimeDomain, key: &[u8], timestamp: i64) -> Result<()> {
        self.queue(domain).delete(store, timestamp, key)
    }

    pub(crate) fn schedule(&mut self, domain: TimeDomain, interval: Duration, wall_now: i64) -> Result<PunctuationId> {
        let ms = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
        if ms < 1 {
            return Err(Error::InvalidUse(format!("a punctuation interval must be at least 1 ms, not {interval:?}")));
        }
        Ok(self.punctuations.schedule(domain, ms, wall_now))
    }

    pub(crate) fn cancel(&mut self, id: PunctuationId) -> bool {
        self.punctuations.cancel(id)
    }

    /// Whether anything of `domain` may be due at `now` (a cheap check:
    /// [`TaskTime::pop_due`] says for sure); timers only with `punctuations` false.
    pub(crate) fn maybe_due(&self, domain: TimeDomain, now: i64, punctuations: bool) -> bool {
        let timers = match domain {
            TimeDomain::StreamTime => &self.stream_timers,
            TimeDomain::WallClock => &self.wall_timers,
        };
        timers.next_due() <= now || (punctuations && self.punctuations.next_due(domain) <= now)
    }

    /// The earliest timer or punctuation of `domain` due at `now` (a timer
    /// first when both are due at the same time; timers only with
    /// `punctuations` false); a timer is removed from the store in the same
    /// commit as what its callback writes.
    pub(crate) fn pop_due(&mut self, store: Option<&mut KeyValueStore>, domain: TimeDomain, now: i64, punctuations: bool) -> Result<Option<Due>> {
        let punctuation_at = if punctuations { self.punctuations.next_due(domain) } else { i64::MAX };
        if let Some(store) = store {
            if let Some((timestamp, key)) = self.queue(domain).pop_due(store, now.min(punctuation_at))? {
                return Ok(Some(Due::Timer(Timer { domain, key, timestamp })));
            }
        }
        if !punctuations {
            return Ok(None);
        }
        Ok(self.punctuations.pop_due(domain, now).map(Due::Punctuation))
    }
}

/// Final results register their windows' closings here (`store/closing.rs`).
impl crate::store::closing::StreamTimers for TaskTime {
    fn register_closing(&mut self, time_store: &mut KeyValueStore, key: &[u8], at: i64) -> Result<()> {
        if self.closings.contains(key) {
            return Ok(());
        }
        self.register_timer(time_store, TimeDomain::StreamTime, key, at)?;
        self.closings.insert(key.to_vec());
        Ok(())
    }
}
