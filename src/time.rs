//! Time as the processor sees it: the two clocks ([`TimeDomain`]), the
//! timestamp of each record ([`TimestampExtractor`], [`InvalidTimestamp`]),
//! per-key [`Timer`]s and [`Punctuation`]s. The machinery behind them is in
//! `src/timers/`; the semantics are in the README's "Time" section.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::record::Record;

/// Which clock a timer or a punctuation follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimeDomain {
    /// The task's stream time: the largest record timestamp it has
    /// processed. It moves only when records arrive, so replaying the same
    /// input gives the same firings.
    StreamTime,
    /// The machine's clock (milliseconds since the Unix epoch). It moves
    /// while the task is idle too.
    WallClock,
}

/// Reads a record's timestamp (milliseconds since the Unix epoch; Kafka
/// Streams' `TimestampExtractor`): given the record and the task's stream
/// time so far (`None` before its first record). A negative result is an
/// invalid timestamp, handled as [`AppBuilder::on_invalid_timestamp`](crate::AppBuilder::on_invalid_timestamp) says.
pub type TimestampExtractor = Arc<dyn Fn(&Record<'_>, Option<i64>) -> i64 + Send + Sync>;

/// What happens to a record whose extracted timestamp is invalid
/// (negative, or none at all): Kafka Streams' `FailOnInvalidTimestamp`,
/// `LogAndSkipOnInvalidTimestamp` and `UsePartitionTimeOnInvalidTimestamp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum InvalidTimestamp {
    /// The record fails with [`Error::InvalidTimestamp`](crate::Error::InvalidTimestamp),
    /// passed to the processing exception handler if there is one (which
    /// may skip the record), else `run` stops with it. The default.
    #[default]
    Fail,
    /// The record is skipped: logged and counted in
    /// `kstate_skipped_records_total`; its offset is committed.
    Skip,
    /// The record gets the task's stream time; before the task's first
    /// valid record it fails as with [`InvalidTimestamp::Fail`].
    UseStreamTime,
}

/// A timer that fired: the key and time it was registered for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    /// The clock it was registered on.
    pub domain: TimeDomain,
    /// The key it was registered for (bytes, as given to
    /// [`ProcessorContext::register_timer`](crate::ProcessorContext::register_timer)).
    pub key: Vec<u8>,
    /// The time it was registered for; it fires once its clock reaches it.
    pub timestamp: i64,
}

/// Names a punctuation scheduled by
/// [`ProcessorContext::schedule`](crate::ProcessorContext::schedule), to
/// tell punctuations apart and to cancel one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PunctuationId(pub(crate) u64);

/// A punctuation that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Punctuation {
    /// Which schedule it is.
    pub id: PunctuationId,
    /// The clock it follows.
    pub domain: TimeDomain,
    /// The time it runs at: the task's stream time, or the wall clock.
    pub timestamp: i64,
}

/// The wall clock in milliseconds since the Unix epoch: the system's, or
/// on a thread a [`TestDriver`](crate::TestDriver) runs on, the driver's
/// (see [`set_thread_clock`]).
pub(crate) fn wall_clock_ms() -> i64 {
    if let Some(ms) = DRIVER_CLOCK.with(std::cell::Cell::get) {
        return ms;
    }
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

thread_local! {
    /// The test driver's wall clock on this thread.
    static DRIVER_CLOCK: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
}

/// Sets this thread's wall clock (`None`: the system's again). A test
/// driver sets it to its own clock at each of its calls and leaves it
/// there, so that what the test reads afterwards on this thread (a
/// wall-clock TTL store's entries) sees the driver's time too; the driver
/// clears it when dropped.
pub(crate) fn set_thread_clock(ms: Option<i64>) {
    DRIVER_CLOCK.with(|c| c.set(ms));
}

