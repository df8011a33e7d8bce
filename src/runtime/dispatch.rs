//! Calling the processor: a record (its timestamp extracted, stream time
//! moved, the stream-time timers it made due, the record, then the
//! punctuations it made due), the
//! wall-clock timers and punctuations of running tasks, and each task's
//! processor built and initialised when the task starts running.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::time::Instant;

use rdkafka::consumer::BaseConsumer;

use crate::config::{AppConfig, ProcessingDecision};
use crate::context::{ContextParts, ProcessorContext};
use crate::error::{Error, Result};
use crate::kafka::OutputSink;
use crate::processor::{Processor, ProcessorError};
use crate::record::Record;
use crate::task::{Task, TaskManager, TaskState};
use crate::time::{InvalidTimestamp, TimeDomain};
use crate::store::KeyValueStore;
use crate::timers::{Due, TaskTime};

use super::RuntimeContext;

/// Timers and punctuations run for one task in one go at most; the rest
/// run after the next record or in the next loop pass, so a callback that
/// keeps registering timers already due cannot hold the loop forever.
const MAX_FIRINGS: usize = 10_000;

/// The processors of this instance's tasks.
pub(crate) trait ProcessorSet {
    /// The processor type.
    type P: Processor;
    /// Whether its processors take timer and punctuation callbacks.
    const CALLBACKS: bool;
    /// The processor of task `partition` in its `incarnation`, built if
    /// the task started since; `true` if it was just built (`init` is due).
    fn get(&mut self, partition: i32, incarnation: u64) -> (&mut Self::P, bool);
    /// Drops the processors of tasks that no longer run here.
    fn retain(&mut self, running: &dyn Fn(i32, u64) -> bool);
    /// Takes out the processor of task `partition` in its `incarnation`,
    /// if one was built (to close it).
    fn take(&mut self, partition: i32, incarnation: u64) -> Option<Self::P>;
}

/// One processor per task, built by the user's factory.
pub(crate) struct PerTask<F, P> {
    factory: F,
    live: HashMap<i32, (u64, P)>,
}

impl<F, P> PerTask<F, P> {
    pub(crate) fn new(factory: F) -> Self {
        PerTask { factory, live: HashMap::new() }
    }
}

impl<F: FnMut(i32) -> P, P: Processor> ProcessorSet for PerTask<F, P> {
    type P = P;
    const CALLBACKS: bool = true;

    fn get(&mut self, partition: i32, incarnation: u64) -> (&mut P, bool) {
        let fresh = !matches!(self.live.get(&partition), Some((i, _)) if *i == incarnation);
        if fresh {
            self.live.insert(partition, (incarnation, (self.factory)(partition)));
        }
        (&mut self.live.get_mut(&partition).expect("just checked").1, fresh)
    }

    fn retain(&mut self, running: &dyn Fn(i32, u64) -> bool) {
        self.live.retain(|p, (i, _)| running(*p, *i));
    }

    fn take(&mut self, partition: i32, incarnation: u64) -> Option<P> {
        match self.live.remove(&partition) {
            Some((i, p)) if i == incarnation => Some(p),
            _ => None,
        }
    }
}

/// The closure of [`App::run`](crate::App::run): one for every task, no callbacks.
pub(crate) struct Closure<F, E>(F, PhantomData<fn() -> E>);

impl<F, E> Closure<F, E> {
    pub(crate) fn new(f: F) -> Self {
        Closure(f, PhantomData)
    }
}

impl<F, E> Processor for Closure<F, E>
where
    F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E>,
    E: Into<ProcessorError>,
{
    fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> std::result::Result<(), ProcessorError> {
        (self.0)(ctx, record).map_err(Into::into)
    }
}

impl<F, E> ProcessorSet for Closure<F, E>
where
    F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> std::result::Result<(), E>,
    E: Into<ProcessorError>,
{
    type P = Self;
    const CALLBACKS: bool = false;

    fn get(&mut self, _: i32, _: u64) -> (&mut Self, bool) {
        (self, false)
    }

    fn retain(&mut self, _: &dyn Fn(i32, u64) -> bool) {}

    fn take(&mut self, _: i32, _: u64) -> Option<Self> {
        None
    }
}

/// Where the processor's context comes from, for every task.
pub(super) struct Dispatch<'a> {
    pub(super) config: &'a AppConfig,
    pub(super) store_index: &'a HashMap<String, usize>,
    /// For re-initialising a task whose time store failed.
    pub(super) consumer: &'a BaseConsumer<RuntimeContext>,
}

/// A store fault of one task while its timers were read (the task is
/// re-initialised, the others go on), as opposed to a fatal error.
struct TaskFault(i32, Error);

impl Dispatch<'_> {
    /// The context of a task (its fields apart, so that its span can be
    /// entered meanwhile).
    fn context<'t>(
        &'t self,
        partition: i32,
        stores: &'t mut [KeyValueStore],
        time: &'t mut TaskTime,
        outputs: &'t OutputSink,
        timestamp: Option<i64>,
        callbacks: bool,
    ) -> ProcessorContext<'t> {
        ProcessorContext::new(ContextParts {
            partition,
            stores,
            store_index: self.store_index,
            outputs,
            timestamp,
            time,
            time_store: self.config.time_store_index(),
            callbacks,
        })
    }

    /// Builds and initialises the processors of tasks that started
    /// running, drops those of tasks gone, and runs the timers and
    /// punctuations that are due: on the wall clock, and on stream time
    /// those left over (registered already due by a callback, beyond
    /// [`MAX_FIRINGS`], or due at the stream time a task started with).
    pub(super) fn serve_tasks<S: ProcessorSet>(&self, tasks: &mut TaskManager, set: &mut S) -> Result<()> {
        // Exactly-once: a commit waits for the group's new generation, and
        // nothing may add outputs to its transaction; at the bound on
        // uncommitted bytes nothing new is written either.
        if tasks.is_parked() || tasks.backpressure() {
            return Ok(());
        }
        let now = crate::time::wall_clock_ms();
        let outputs = &tasks.outputs;
        let mut fault = None;
        for task in tasks.tasks.values_mut().filter(|t| t.state == TaskState::Running) {
            let (processor, fresh) = set.get(task.partition, task.incarnation());
            if fresh {
                let _in_task = task.span.enter();
                let mut ctx = self.context(task.partition, &mut task.stores, &mut task.time, outputs, None, S::CALLBACKS);
                let partition = task.partition;
                processor.init(&mut ctx).map_err(|source| Error::Callback { callback: "init", partition, source })?;
            }
            if !S::CALLBACKS {
                continue;
            }
            let due = [Some((TimeDomain::WallClock, now)), task.time.stream_time().map(|t| (TimeDomain::StreamTime, t))];
            for (domain, at) in due.into_iter().flatten() {
                if task.time.maybe_due(domain, at, true) {
                    let span = task.span.clone();
                    let _in_task = span.enter();
                    if let Err(f) = self.fire(task, outputs, processor, domain, at, true)? {
                        fault = Some(f);
                        break;
                    }
                }
            }
            if fault.is_some() {
                break;
            }
        }
        let live = &tasks.tasks;
        set.retain(&|p, i| live.get(&p).is_some_and(|t| t.state == TaskState::Running && t.incarnation() == i));
        if let Some(TaskFault(partition, e)) = fault {
            tasks.reinitialise_task(self.consumer, partition, e)?;
        }
        Ok(())
    }

    /// Closes the processors of the running tasks among `partitions` (all
    /// with `None`) before their final commit: [`Processor::close`], whose
    /// writes and outputs that commit takes.
    pub(super) fn close_tasks<S: ProcessorSet>(&self, tasks: &mut TaskManager, set: &mut S, partitions: Option<&[i32]>) {
        let outputs = &tasks.outputs;
        for task in tasks.tasks.values_mut().filter(|t| t.state == TaskState::Running && partitions.is_none_or(|p| p.contains(&t.partition))) {
            let Some(mut processor) = set.take(task.partition, task.incarnation()) else { continue };
            let _in_task = task.span.enter();
            let mut ctx = self.context(task.partition, &mut task.stores, &mut task.time, outputs, None, S::CALLBACKS);
            if let Err(e) = processor.close(&mut ctx) {
                tracing::error!(partition = task.partition, error = %e, "the processor's close failed; the task closes anyway");
            }
        }
    }

    /// Runs the timers and punctuations of `domain` due at `now` (timers
    /// only with `punctuations` false), in time order. `Ok(Err(fault))`:
    /// reading the task's time store failed (the task is to be
    /// re-initialised); `Err`: a callback failed (fatal). The caller has
    /// entered the task's span.
    fn fire<P: Processor>(
        &self,
        task: &mut Task,
        outputs: &OutputSink,
        processor: &mut P,
        domain: TimeDomain,
        now: i64,
        punctuations: bool,
    ) -> Result<std::result::Result<(), TaskFault>> {
        let time_store = self.config.time_store_index();
        let partition = task.partition;
        for _ in 0..MAX_FIRINGS {
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
                Due::Timer(timer) => {
                    task.time.metrics.timer_fired(domain, now.saturating_sub(timer.timestamp));
                    let mut ctx = self.context(partition, &mut task.stores, &mut task.time, outputs, Some(timer.timestamp), true);
                    processor.on_timer(&mut ctx, &timer).map_err(|source| Error::Callback { callback: "on_timer", partition, source })?;
                }
                Due::Punctuation(punctuation) => {
                    let started = Instant::now();
                    let mut ctx = self.context(partition, &mut task.stores, &mut task.time, outputs, Some(punctuation.timestamp), true);
                    let result = processor.punctuate(&mut ctx, &punctuation);
                    task.time.metrics.punctuated(domain, started.elapsed());
                    result.map_err(|source| Error::Callback { callback: "punctuate", partition, source })?;
                }
            }
        }
        Ok(Ok(()))
    }

    /// Hands one input record to its task's processor: reads its
    /// timestamp, moves stream time, runs the stream-time timers it made
    /// due, processes it, then runs the punctuations it made due (and
    /// timers its processing registered already due).
    pub(super) fn process_one<S: ProcessorSet>(&self, tasks: &mut TaskManager, record: &Record<'_>, set: &mut S) -> Result<()> {
        let config = self.config;
        let (topic, partition, offset) = (record.topic, record.partition, record.offset);
        let outputs = &tasks.outputs;
        let Some(task) = tasks.tasks.get_mut(&partition) else {
            return Ok(()); // revoked while the record was in flight
        };
        if task.state != TaskState::Running || !task.topics.contains(topic) {
            // Fetched before the pause took effect: replay it once the task runs.
            let r = task.rewind.entry(topic.to_string()).or_insert(offset);
            *r = (*r).min(offset);
            return Ok(());
        }
        let extracted = match &config.timestamp_extractor {
            Some(extract) => Some(extract(record, task.time.stream_time())),
            None => record.timestamp,
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
            mark_processed(task, topic, offset);
            return Ok(());
        };
        task.time.advance(timestamp);
        // The processor's own log lines (its callbacks' too) belong to the
        // task: one span entered per record.
        let span = task.span.clone();
        let in_task = span.enter();
        let (processor, fresh) = set.get(partition, task.incarnation());
        if fresh {
            let mut ctx = self.context(partition, &mut task.stores, &mut task.time, outputs, Some(timestamp), S::CALLBACKS);
            processor.init(&mut ctx).map_err(|source| Error::Callback { callback: "init", partition, source })?;
        }
        // The timers the record's time made due run before it (as Flink's
        // event-time timers before later elements): the record sees state
        // as of after them, and a final result read by a timer is not yet
        // expired by the record's own writes (architecture.md §6).
        if S::CALLBACKS {
            let now = task.time.stream_time().expect("set by this record or before");
            if task.time.maybe_due(TimeDomain::StreamTime, now, false) {
                if let Err(TaskFault(partition, e)) = self.fire(task, outputs, processor, TimeDomain::StreamTime, now, false)? {
                    // Re-initialised: the record comes again from its committed offset.
                    drop(in_task); // (its log lines may be about every task)
                    return tasks.reinitialise_task(self.consumer, partition, e);
                }
            }
        }
        let mut ctx = self.context(partition, &mut task.stores, &mut task.time, outputs, Some(timestamp), S::CALLBACKS);
        let processed = processor.process(&mut ctx, record);
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
        mark_processed(task, topic, offset);
        // Due punctuations (after the record, as Kafka Streams), and timers
        // the callback registered already due.
        if S::CALLBACKS {
            let now = task.time.stream_time().expect("set by this record or before");
            if task.time.maybe_due(TimeDomain::StreamTime, now, true) {
                if let Err(TaskFault(partition, e)) = self.fire(task, outputs, processor, TimeDomain::StreamTime, now, true)? {
                    drop(in_task);
                    tasks.reinitialise_task(self.consumer, partition, e)?;
                }
            }
        }
        Ok(())
    }
}

fn skipped(topic: &str, partition: i32) {
    metrics::counter!(crate::metrics::SKIPPED_RECORDS, "topic" => topic.to_string(), "partition" => partition.to_string())
        .increment(1);
}

/// Counts the record and moves the task's next offset to commit past it.
fn mark_processed(task: &mut Task, topic: &str, offset: i64) {
    task.processed.increment(1);
    // No String allocation per record: the topic's entry exists after its first record.
    match task.offsets.get_mut(topic) {
        Some(next) => *next = offset + 1,
        None => {
            task.offsets.insert(topic.to_string(), offset + 1);
            // Where a re-initialised task restarts if nothing was committed yet.
            if !task.restart_from.contains_key(topic) {
                task.restart_from.insert(topic.to_string(), offset);
            }
        }
    }
}
