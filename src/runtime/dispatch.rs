//! The task manager's tasks handed to their processors: each task's
//! processor built when the task starts running and dropped when it goes,
//! records routed to their task, and the task manager's side of a failed
//! task. The callbacks themselves are in `callbacks.rs`.

use std::collections::HashMap;
use std::marker::PhantomData;

use rdkafka::consumer::BaseConsumer;

use crate::context::ProcessorContext;
use crate::error::Result;
use crate::processor::{Processor, ProcessorError};
use crate::record::Record;
use crate::task::{Task, TaskManager, TaskState};

use super::callbacks::{Callbacks, TaskFault, TaskParts};
use super::RuntimeContext;

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
    /// Several processing threads: the processors of the tasks `wanted`
    /// (partition, incarnation), built where missing, each with whether it
    /// was just built; `None` if they cannot go to other threads (one
    /// closure for every task).
    fn split(&mut self, wanted: &[(i32, u64)]) -> Option<Vec<(i32, &mut (dyn Processor + Send), bool)>> {
        let _ = wanted;
        None
    }
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

impl<F: FnMut(i32) -> P, P: Processor + Send> ProcessorSet for PerTask<F, P> {
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

    fn split(&mut self, wanted: &[(i32, u64)]) -> Option<Vec<(i32, &mut (dyn Processor + Send), bool)>> {
        let mut fresh = Vec::new();
        for &(partition, incarnation) in wanted {
            if !matches!(self.live.get(&partition), Some((i, _)) if *i == incarnation) {
                self.live.insert(partition, (incarnation, (self.factory)(partition)));
                fresh.push(partition);
            }
        }
        let wanted = |p: &i32| wanted.iter().any(|w| w.0 == *p);
        Some(self.live.iter_mut().filter(|(p, _)| wanted(p)).map(|(p, (_, processor))| (*p, processor as &mut (dyn Processor + Send), fresh.contains(p))).collect())
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

    /// The closure gets a table's records too (after the table has them).
    fn on_table_update(&mut self, ctx: &mut ProcessorContext<'_>, update: &crate::TableUpdate<'_>) -> std::result::Result<(), ProcessorError> {
        (self.0)(ctx, update.record()).map_err(Into::into)
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

/// The processors' callbacks for every task of the task manager.
pub(super) struct Dispatch<'a> {
    pub(super) callbacks: Callbacks<'a>,
    /// For re-initialising a task whose time store failed.
    pub(super) consumer: &'a BaseConsumer<RuntimeContext>,
}

/// A running task's parts, as its callbacks see them.
fn parts(task: &mut Task) -> TaskParts<'_> {
    TaskParts { partition: task.partition, stores: &mut task.stores, time: &mut task.time, span: &task.span }
}

impl Dispatch<'_> {
    /// Builds and initialises the processors of tasks that started
    /// running, drops those of tasks gone, and runs the timers and
    /// punctuations that are due (see [`Callbacks::serve`]).
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
            fault = self.callbacks.serve(&mut parts(task), outputs, processor, (fresh, S::CALLBACKS), now)?;
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
            self.callbacks.close(&mut parts(task), outputs, &mut processor, S::CALLBACKS);
        }
    }

    /// Hands one input record to its task's processor (see
    /// [`Callbacks::record`]); a record of a task that is not running
    /// (fetched before its pause took effect) is read again once it runs.
    pub(super) fn process_one<S: ProcessorSet>(&self, tasks: &mut TaskManager, record: &Record<'_>, set: &mut S) -> Result<()> {
        let outputs = &tasks.outputs;
        let Some(task) = tasks.tasks.get_mut(&record.partition) else {
            return Ok(()); // revoked while the record was in flight
        };
        if set_aside_unless_running(task, record) {
            return Ok(());
        }
        let (processor, fresh) = set.get(record.partition, task.incarnation());
        match self.callbacks.handle(task, outputs, record, processor, (fresh, S::CALLBACKS))? {
            None => Ok(()),
            // Re-initialised: processing restarts from the committed offset.
            Some(TaskFault(partition, e)) => tasks.reinitialise_task(self.consumer, partition, e),
        }
    }
}

/// A record of a task that is not running (fetched before its pause took
/// effect), or of an input topic it no longer has, is set aside: read
/// again once the task runs. `true` if it was.
pub(super) fn set_aside_unless_running(task: &mut Task, record: &Record<'_>) -> bool {
    if task.state == TaskState::Running && task.topics.contains(record.topic) {
        return false;
    }
    set_aside(task, record.topic, record.offset);
    true
}

/// Has task's input `topic` read again from `offset` when the task
/// (re-)starts, unless it is to start lower.
pub(super) fn set_aside(task: &mut Task, topic: &str, offset: i64) {
    let r = task.rewind.entry(topic.to_string()).or_insert(offset);
    *r = (*r).min(offset);
}

impl Callbacks<'_> {
    /// Hands a record to its running task's processor (see
    /// [`Callbacks::record`]) and moves the task's offset past it; a
    /// record the task faulted on is set aside. Returns the fault, for the
    /// task manager to re-initialise the task.
    pub(super) fn handle<P: Processor + ?Sized>(
        &self,
        task: &mut Task,
        outputs: &crate::kafka::OutputSink,
        record: &Record<'_>,
        processor: &mut P,
        fresh: (bool, bool),
    ) -> Result<Option<TaskFault>> {
        if task.processed_to.get(record.topic).is_some_and(|next| record.offset < *next) {
            // Processed by this incarnation already: librdkafka fetched it
            // again (its offset lookup of a partition with no committed
            // offset can restart the fetch after a seek; §15). Once more
            // would apply it twice.
            if !std::mem::replace(&mut task.redelivery_logged, true) {
                tracing::warn!(partition = task.partition, topic = record.topic, offset = record.offset, next = task.processed_to[record.topic],
                    "the consumer delivered records this task had processed already; skipping them (logged once per task)");
            }
            return Ok(None);
        }
        let handled = self.record(&mut parts(task), outputs, record, processor, fresh)?;
        if handled.processed {
            mark_processed(task, record.topic, record.offset);
        } else if handled.fault.is_some() {
            // Not processed: read it again after the re-initialisation,
            // also when nothing of its topic was committed or processed yet.
            set_aside(task, record.topic, record.offset);
        }
        Ok(handled.fault)
    }
}

/// Counts the record and moves the task's next offset to commit past it.
fn mark_processed(task: &mut Task, topic: &str, offset: i64) {
    task.processed.increment(1);
    match task.processed_to.get_mut(topic) {
        Some(next) => *next = offset + 1,
        None => {
            task.processed_to.insert(topic.to_string(), offset + 1);
        }
    }
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
