//! The processor's callbacks for one task, whoever holds the task: the
//! runtime's task manager (`dispatch.rs`) or the [`TestDriver`](crate::TestDriver)
//! (`src/driver/`). One code path, so the driver's semantics are the
//! runtime's: a record's timestamp extracted, stream time moved, the
//! stream-time timers it made due, the record, then the punctuations it
//! made due; wall-clock timers and punctuations; `init` and `close`.

use std::collections::HashMap;
use std::time::Instant;

use crate::config::{AppConfig, ProcessingDecision};
use crate::context::{ContextParts, ProcessorContext};
use crate::error::{Error, Result};
use crate::kafka::OutputSink;
use crate::processor::{Processor, ProcessorError};
use crate::record::{Headers, Record};
use crate::store::closing;
use crate::store::windowed;
use crate::store::table::Applied;
use crate::store::KeyValueStore;
use crate::table::TableUpdate;
use crate::windows::{ClosedWindow, Shape};
use crate::time::{InvalidTimestamp, TimeDomain};
use crate::timers::{Due, TaskTime};

/// Timers and punctuations run for one task in one go at most; the rest
/// run after the next record or in the next loop pass, so a callback that
/// keeps registering timers already due cannot hold the loop forever.
const MAX_FIRINGS: usize = 10_000;

/// One running task, as its callbacks see it.
pub(crate) struct TaskParts<'t> {
    pub(crate) partition: i32,
    pub(crate) stores: &'t mut [KeyValueStore],
    pub(crate) time: &'t mut TaskTime,
    pub(crate) span: &'t tracing::Span,
}

/// Reading a task's time store failed while its timers were read: the task
/// is to be re-initialised (the others go on), as opposed to a fatal error.
pub(crate) struct TaskFault(pub(crate) i32, pub(crate) Error);

/// What became of an input record: whether it counts as processed (its
/// offset may be committed: processed, or skipped), and a fault of its
/// task found before or after it.
pub(crate) struct Handled {
    pub(crate) processed: bool,
    pub(crate) fault: Option<TaskFault>,
}

/// The application's processing settings and store names: what every
/// callback needs besides its task.
pub(crate) struct Callbacks<'a> {
    pub(crate) config: &'a AppConfig,
    /// The user stores' positions in a task's stores, by name.
    pub(crate) store_index: &'a HashMap<String, usize>,
    pub(crate) globals: Option<&'a crate::global::GlobalTables>,
}

impl Callbacks<'_> {
    fn context<'t>(&'t self, task: &'t mut TaskParts<'_>, outputs: &'t OutputSink, timestamp: Option<i64>, callbacks: bool) -> ProcessorContext<'t> {
        self.context_with(task, outputs, timestamp, callbacks, Headers::empty())
    }

    /// [`Callbacks::context`] for a record with `headers`.
    fn context_with<'t>(
        &'t self,
        task: &'t mut TaskParts<'_>,
        outputs: &'t OutputSink,
        timestamp: Option<i64>,
        callbacks: bool,
        headers: Headers<'t>,
    ) -> ProcessorContext<'t> {
        ProcessorContext::new(ContextParts {
            partition: task.partition,
            stores: task.stores,
            store_index: self.store_index,
            outputs,
            timestamp,
            time: task.time,
            time_store: self.config.time_store_index(),
            callbacks,
            globals: self.globals,
            config: self.config,
            headers,
        })
    }

    fn init<P: Processor + ?Sized>(&self, task: &mut TaskParts<'_>, outputs: &OutputSink, processor: &mut P, timestamp: Option<i64>, callbacks: bool) -> Result<()> {
        let partition = task.partition;
        let mut ctx = self.context(task, outputs, timestamp, callbacks);
        caught(|| processor.init(&mut ctx)).map_err(|source| Error::Callback { callback: "init", partition, source })
    }

    /// A loop pass over a running task: its processor initialised if it
    /// was just built (`fresh`), then the timers and punctuations due on
    /// the wall clock at `now` and on stream time (those left over:
    /// registered already due by a callback, beyond [`MAX_FIRINGS`], or due
    /// at the stream time the task started with).
    pub(crate) fn serve<P: Processor + ?Sized>(
        &self,
        task: &mut TaskParts<'_>,
        outputs: &OutputSink,
        processor: &mut P,
        (fresh, callbacks): (bool, bool),
        now: i64,
    ) -> Result<Option<TaskFault>> {
        if fresh {
            let _in_task = task.span.clone().entered();
            self.init(task, outputs, processor, None, callbacks)?;
        }
        if !callbacks {
            return Ok(None);
        }
        let due = [Some((TimeDomain::WallClock, now)), task.time.stream_time().map(|t| (TimeDomain::StreamTime, t))];
        for (domain, at) in due.into_iter().flatten() {
            if task.time.maybe_due(domain, at, true) {
                let _in_task = task.span.clone().entered();
                if let Err(fault) = self.fire(task, outputs, processor, domain, at, true)? {
                    return Ok(Some(fault));
                }
            }
        }
        Ok(None)
    }

    /// [`Processor::close`] of a task about to close after running; its
    /// writes and outputs belong to the task's final commit. An error is
    /// logged; the task closes anyway.
    pub(crate) fn close<P: Processor + ?Sized>(&self, task: &mut TaskParts<'_>, outputs: &OutputSink, processor: &mut P, callbacks: bool) {
        let _in_task = task.span.clone().entered();
        let partition = task.partition;
        let mut ctx = self.context(task, outputs, None, callbacks);
        if let Err(e) = caught(|| processor.close(&mut ctx)) {
            tracing::error!(partition, error = %e, "the processor's close failed; the task closes anyway");
        }
    }

    /// Runs the timers and punctuations of `domain` due at `now` (timers
    /// only with `punctuations` false), in time order. `Ok(Err(fault))`:
    /// reading the task's time store failed; `Err`: a callback failed
    /// (fatal). The caller has entered the task's span.
    fn fire<P: Processor + ?Sized>(
        &self,
        task: &mut TaskParts<'_>,
        outputs: &OutputSink,
        processor: &mut P,
        domain: TimeDomain,
        now: i64,
        punctuations: bool,
    ) -> Result<std::result::Result<(), TaskFault>> {
        let time_store = self.config.time_store_index();
        let partition = task.partition;
        // kstate's own closings do not count: none is ever registered
        // already due, and one left for later could find its window
        // expired by the record that follows.
        let mut budget = MAX_FIRINGS;
        while budget > 0 {
            let store = time_store.map(|i| &mut task.stores[i]);
            let due = match task.time.pop_due(store, domain, now, punctuations) {
                Ok(Some(due)) => due,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the task's timers failed; re-initialising the task");
                    return Ok(Err(TaskFault(partition, e)));
                }
            };
            match due {
                Due::Timer(timer) if closing::is_reserved(&timer.key) => {
                    if let Err(fault) = self.window_closed(task, outputs, processor, &timer)? {
                        return Ok(Err(fault));
                    }
                }
                Due::Timer(timer) => {
                    budget -= 1;
                    task.time.metrics.timer_fired(domain, now.saturating_sub(timer.timestamp));
                    let mut ctx = self.context(task, outputs, Some(timer.timestamp), true);
                    caught(|| processor.on_timer(&mut ctx, &timer)).map_err(|source| Error::Callback { callback: "on_timer", partition, source })?;
                }
                Due::Punctuation(punctuation) => {
                    budget -= 1;
                    let started = Instant::now();
                    let mut ctx = self.context(task, outputs, Some(punctuation.timestamp), true);
                    let result = caught(|| processor.punctuate(&mut ctx, &punctuation));
                    task.time.metrics.punctuated(domain, started.elapsed());
                    result.map_err(|source| Error::Callback { callback: "punctuate", partition, source })?;
                }
            }
        }
        Ok(Ok(()))
    }

    /// A window of a store that emits final results closed (its timer,
    /// kstate's own, fired): [`Processor::on_window_close`] with its value,
    /// unless it has none any more (deleted, merged into another session,
    /// expired early). `Ok(Err(fault))`: reading the store failed.
    fn window_closed<P: Processor + ?Sized>(
        &self,
        task: &mut TaskParts<'_>,
        outputs: &OutputSink,
        processor: &mut P,
        timer: &crate::time::Timer,
    ) -> Result<std::result::Result<(), TaskFault>> {
        let partition = task.partition;
        task.time.closing_fired(&timer.key);
        let Some(closing) = closing::parse(&timer.key) else {
            tracing::warn!(key = ?timer.key, "a malformed final-result timer; dropped");
            return Ok(Ok(()));
        };
        let Some(&i) = self.store_index.get(closing.store) else {
            tracing::warn!(store = closing.store, "a final-result timer of a store the application no longer has; dropped");
            return Ok(Ok(()));
        };
        let store = &task.stores[i];
        if !store.final_results {
            tracing::info!(store = closing.store, "a final-result timer of a store that no longer emits final results; dropped");
            return Ok(Ok(()));
        }
        let (start, end, session) = match (closing.closes.clone(), store.shape) {
            (closing::Closes::Window(start), Some(Shape::Window(w))) => (start, start.saturating_add(w.size_ms()), false),
            (closing::Closes::Session(s), Some(Shape::Session(_))) => (s.start, s.end, true),
            _ => {
                tracing::warn!(store = closing.store, "a final-result timer of another kind of store than this one; dropped");
                return Ok(Ok(()));
            }
        };
        let value = match windowed::closing_value(store, &closing.closes, closing.key) {
            Ok(Some(value)) => value,
            Ok(None) => return Ok(Ok(())),
            Err(e) => {
                tracing::warn!(error = %e, store = closing.store, "reading a closing window failed; re-initialising the task");
                return Ok(Err(TaskFault(partition, e)));
            }
        };
        let closed = ClosedWindow { store: closing.store, key: closing.key, start, end, session, value: &value };
        let mut ctx = self.context(task, outputs, Some(timer.timestamp), true);
        caught(|| processor.on_window_close(&mut ctx, &closed)).map_err(|source| Error::Callback { callback: "on_window_close", partition, source })?;
        task.stores[i].metrics.final_results.increment(1);
        Ok(Ok(()))
    }

    /// Hands one input record to its running task's processor (built just
    /// now if `fresh`: initialised first): reads its timestamp, moves
    /// stream time, runs the stream-time timers it made due, processes it,
    /// then runs the punctuations it made due (and timers its processing
    /// registered already due). A fault: the task is to be re-initialised
    /// (before the record: it comes again from its committed offset; after
    /// it: it counts as processed, so that a task with no committed offset
    /// yet restarts at it, not past it).
    pub(crate) fn record<P: Processor + ?Sized>(
        &self,
        task: &mut TaskParts<'_>,
        outputs: &OutputSink,
        record: &Record<'_>,
        processor: &mut P,
        (fresh, callbacks): (bool, bool),
    ) -> Result<Handled> {
        let config = self.config;
        let (topic, partition, offset) = (record.topic, record.partition, record.offset);
        if let Some(key) = record.key {
            crate::partitioner::check_input(&config.partitioner, topic, partition, config.published.partitions(), key);
        }
        // A table's record changes its store whatever its timestamp; the
        // processor hears of it below like any record.
        let table = config.table_store_of(topic);
        let old = match table.map(|i| task.stores[i].apply_source((partition, offset), record.key, record.value, record.timestamp)) {
            Some(Ok(Applied::Old(old))) => old,
            Some(Ok(Applied::Refused)) => return Ok(Handled { processed: true, fault: None }), // counted by the check
            Some(Ok(Applied::Skipped)) => {
                tracing::warn!(topic, partition, offset, "a table record without a key; skipped");
                skipped(topic, partition);
                return Ok(Handled { processed: true, fault: None });
            }
            Some(Err(e @ Error::BadRecord { .. })) => return Err(e),
            Some(Err(e)) => return Ok(Handled { processed: false, fault: Some(TaskFault(partition, e)) }),
            None => None,
        };
        // A re-keyed record carries its cause's extracted time already.
        let extracted = match &config.timestamp_extractor {
            Some(extract) if !config.is_repartition_topic(topic) => Some(extract(record, task.time.stream_time())),
            _ => record.timestamp,
        };
        let timestamp = match extracted {
            Some(t) if t >= 0 => Some(t),
            _ => match (config.invalid_timestamp, task.time.stream_time()) {
                (InvalidTimestamp::Skip, _) => None,
                (InvalidTimestamp::UseStreamTime, Some(t)) => Some(t),
                _ => {
                    let e = Error::InvalidTimestamp { topic: topic.to_string(), partition, offset, timestamp: extracted };
                    match &config.processing_exception_handler {
                        Some(handler) if handler(record, &e) == ProcessingDecision::Continue => None,
                        _ => return Err(e),
                    }
                }
            },
        };
        let Some(timestamp) = timestamp else {
            tracing::warn!(topic, partition, offset, timestamp = ?extracted, "invalid timestamp; record skipped");
            skipped(topic, partition);
            return Ok(Handled { processed: true, fault: None });
        };
        task.time.advance(timestamp);
        // The processor's own log lines (its callbacks' too) belong to the
        // task: one span entered per record.
        let _in_task = task.span.clone().entered();
        if fresh {
            self.init(task, outputs, processor, Some(timestamp), callbacks)?;
        }
        // The timers the record's time made due run before it (as Flink's
        // event-time timers before later elements): the record sees state
        // as of after them, and a final result read by a timer is not yet
        // expired by the record's own writes (architecture.md §6).
        if callbacks {
            let now = task.time.stream_time().expect("set by this record or before");
            if task.time.maybe_due(TimeDomain::StreamTime, now, false) {
                if let Err(fault) = self.fire(task, outputs, processor, TimeDomain::StreamTime, now, false)? {
                    return Ok(Handled { processed: false, fault: Some(fault) });
                }
            }
        }
        let mut ctx = self.context_with(task, outputs, Some(timestamp), callbacks, record.headers);
        let processed = match table {
            Some(i) => {
                let update = TableUpdate { store: config.stores[i].name(), record, old: old.as_deref() };
                caught(|| processor.on_table_update(&mut ctx, &update))
            }
            None => caught(|| processor.process(&mut ctx, record)),
        };
        if let Err(source) = processed {
            // kstate's own output failure, passed on by the processor's `?`: the
            // typed error, whatever a handler would say (skipping the record
            // would not bring the output back).
            let source = match source.downcast::<Error>() {
                Ok(e) if matches!(*e, Error::OutputDelivery { .. }) => return Err(*e),
                Ok(e) => e as ProcessorError,
                Err(source) => source,
            };
            let decision = match &config.processing_exception_handler {
                Some(handler) => handler(record, &*source),
                None => ProcessingDecision::Fail,
            };
            if decision != ProcessingDecision::Continue {
                return Err(Error::Processor { topic: topic.to_string(), partition, offset, source });
            }
            tracing::warn!(topic, partition, offset, error = %source, "processor failed; the handler skips the record");
            skipped(topic, partition);
        }
        // Due punctuations (after the record, as Kafka Streams), and timers
        // the callback registered already due.
        if callbacks {
            let now = task.time.stream_time().expect("set by this record or before");
            if task.time.maybe_due(TimeDomain::StreamTime, now, true) {
                if let Err(fault) = self.fire(task, outputs, processor, TimeDomain::StreamTime, now, true)? {
                    return Ok(Handled { processed: true, fault: Some(fault) });
                }
            }
        }
        Ok(Handled { processed: true, fault: None })
    }
}

/// Runs a processor callback; a panic in it becomes its error, so that a
/// panicking `process` is the processing exception handler's case (as an
/// error is) and a panicking timer or punctuation ends `run` with
/// [`Error::Callback`] instead of unwinding through kstate's threads. The
/// callback's writes until the panic stay in the overlay, as an error's
/// do: committed if the handler continues, dropped when `run` ends.
fn caught(callback: impl FnOnce() -> std::result::Result<(), ProcessorError>) -> std::result::Result<(), ProcessorError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback)) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(format!("the processor panicked: {what}").into())
        }
    }
}

fn skipped(topic: &str, partition: i32) {
    metrics::counter!(crate::metrics::SKIPPED_RECORDS, "topic" => topic.to_string(), "partition" => partition.to_string())
        .increment(1);
}
