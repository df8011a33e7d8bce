//! Several processing threads (`num_stream_threads`, architecture.md §15):
//! one poll of each thread's record queue (`queues.rs`), the batches
//! processed in parallel, each on the thread its tasks are placed on (the
//! poll thread takes the first), and what they came to applied after they
//! all return: records not reached are read again, and faulted tasks are
//! re-initialised.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rdkafka::consumer::BaseConsumer;

use crate::error::{Error, Result};
use crate::group::PollSignal;
use crate::kafka::consumer_batch::{LentMessages, PolledBatch};
use crate::kafka::OutputSink;
use crate::processor::Processor;
use crate::shutdown::ShutdownHandle;
use crate::task::{Task, TaskManager, TaskState};

use super::callbacks::{Callbacks, TaskFault};
use super::dispatch::{set_aside, set_aside_unless_running, ProcessorSet};
use super::poll_loop::{record_of, seek_back_to, ErrorLog, DEADLINE_CHECK_EVERY};
use super::RuntimeContext;

/// What every thread of a pass reads.
pub(super) struct PassParts<'a> {
    pub(super) callbacks: &'a Callbacks<'a>,
    pub(super) consumer: &'a BaseConsumer<RuntimeContext>,
    pub(super) polled: PollSignal<'a>,
    pub(super) shutdown: &'a ShutdownHandle,
    /// When the next commit is due: a thread stops there (its records not
    /// reached are read again after the commit).
    pub(super) commit_due: Instant,
}

/// One task of a thread's batch: the task, and its processor if it runs.
struct Slot<'t> {
    task: &'t mut Task,
    processor: Option<(&'t mut (dyn Processor + Send), bool)>,
}

/// What a thread's batch came to.
#[derive(Default)]
struct Outcome {
    /// Faulted tasks: (incarnation, fault).
    faults: Vec<(u64, TaskFault)>,
    /// Records not processed: (topic, partition, offset), to seek back to.
    seek_back: Vec<(String, i32, i64)>,
    error: Option<Error>,
    /// Tasks whose processor was built for this pass but got no record
    /// (its `init` has not run): dropped, to be built again.
    not_initialised: Vec<(i32, u64)>,
}

/// Processes the polled `batches` (each of one thread's queue) in
/// parallel. `false`, with nothing processed, if they cannot be: a task's
/// records in two batches (a task that moved threads while records of its
/// were queued), or processors that cannot leave the poll thread.
pub(super) fn process_batches<S: ProcessorSet>(
    parts: &PassParts<'_>,
    batches: &mut [(&mut PolledBatch<'_>, &mut ErrorLog)],
    tasks: &mut TaskManager,
    set: &mut S,
) -> Result<bool> {
    // Each task's thread: the batch its records are in.
    let mut thread_of: HashMap<i32, usize> = HashMap::new();
    for (t, (batch, _)) in batches.iter().enumerate() {
        for partition in batch.iter().map(|m| m.partition()).collect::<BTreeSet<_>>() {
            if *thread_of.entry(partition).or_insert(t) != t {
                return Ok(false);
            }
        }
    }
    let wanted: Vec<(i32, u64)> = tasks
        .tasks
        .values()
        .filter(|t| t.state == TaskState::Running && thread_of.contains_key(&t.partition))
        .map(|t| (t.partition, t.incarnation()))
        .collect();
    let Some(processors) = set.split(&wanted) else { return Ok(false) };
    let mut shares: Vec<HashMap<i32, Slot<'_>>> = batches.iter().map(|_| HashMap::new()).collect();
    let outputs = &tasks.outputs;
    for (partition, task) in tasks.tasks.iter_mut() {
        if let Some(t) = thread_of.get(partition) {
            shares[*t].insert(*partition, Slot { task, processor: None });
        }
    }
    for (partition, processor, fresh) in processors {
        if let Some(slot) = thread_of.get(&partition).and_then(|t| shares[*t].get_mut(&partition)) {
            slot.processor = Some((processor, fresh));
        }
    }
    let abort = AtomicBool::new(false);
    let work: Vec<_> = batches.iter_mut().zip(shares).map(|((b, e), s)| ((b.lend(), s), &mut **e)).collect();
    let callbacks = S::CALLBACKS;
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let mut work = work.into_iter();
        let first = work.next();
        let mut handles = Vec::new();
        let mut failed = None;
        for (i, ((messages, share), errors)) in work.enumerate() {
            let (abort, outputs) = (&abort, outputs);
            let spawned = std::thread::Builder::new()
                .name(format!("kstate-stream-{}", i + 1))
                .spawn_scoped(scope, move || guarded(abort, || process_share(parts, messages, share, outputs, errors, abort, callbacks)));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // Fatal, as a thread of `run` that cannot start: the
                    // others stop at once.
                    abort.store(true, Ordering::Release);
                    failed = Some(Outcome { error: Some(Error::io("kstate-stream thread", e)), ..Outcome::default() });
                    break;
                }
            }
        }
        let mut outcomes: Vec<Outcome> = failed.into_iter().collect();
        let mut panicked = None;
        if let Some(((messages, share), errors)) = first {
            match guarded(&abort, || process_share(parts, messages, share, outputs, errors, &abort, callbacks)) {
                Ok(o) => outcomes.push(o),
                Err(panic) => panicked = Some(panic),
            }
        }
        for h in handles {
            match h.join() {
                Ok(Ok(o)) => outcomes.push(o),
                Ok(Err(panic)) | Err(panic) => panicked = panicked.or(Some(panic)),
            }
        }
        if let Some(panic) = panicked {
            std::panic::resume_unwind(panic);
        }
        outcomes
    });
    for (partition, incarnation) in outcomes.iter().flat_map(|o| o.not_initialised.iter()) {
        drop(set.take(*partition, *incarnation));
    }
    // Seek back first: a re-initialised task then restarts where it must,
    // whatever a seek here said.
    seek_back_to(parts.consumer, tasks, outcomes.iter().flat_map(|o| o.seek_back.iter().cloned()).collect())?;
    let mut error = None;
    for outcome in outcomes {
        if error.is_none() {
            error = outcome.error;
        }
        for (incarnation, TaskFault(partition, e)) in outcome.faults {
            // Exactly-once: an abort re-initialised every task already.
            if error.is_none() && tasks.tasks.get(&partition).is_some_and(|t| t.incarnation() == incarnation) {
                tasks.reinitialise_task(parts.consumer, partition, e)?;
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

/// One thread's batch: each record handed to its task's processor, in
/// queue order, until the batch ends, the commit is due, `run` shuts down
/// or another thread failed.
fn process_share(
    parts: &PassParts<'_>,
    messages: LentMessages<'_>,
    mut share: HashMap<i32, Slot<'_>>,
    outputs: &OutputSink,
    errors: &mut ErrorLog,
    abort: &AtomicBool,
    callbacks: bool,
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut faulted: Vec<i32> = Vec::new();
    let mut stopped = false;
    for (i, msg) in messages.iter().enumerate() {
        if !stopped && i > 0 && i % DEADLINE_CHECK_EVERY == 0 {
            parts.polled.polled();
            stopped = abort.load(Ordering::Acquire) || parts.shutdown.is_shutdown() || Instant::now() >= parts.commit_due;
        }
        if stopped {
            // Read again after the commit (or not at all: shutting down).
            if let (Ok(topic), true) = (std::str::from_utf8(msg.topic()), msg.error().is_none()) {
                outcome.seek_back.push((topic.to_string(), msg.partition(), msg.offset()));
            }
            continue;
        }
        let Some(record) = record_of(&msg, errors, &mut outcome.seek_back) else { continue };
        let Some(slot) = share.get_mut(&record.partition) else { continue }; // revoked while in flight
        if set_aside_unless_running(slot.task, &record) {
            continue;
        }
        if faulted.contains(&record.partition) {
            // Re-initialised after this pass: read again then.
            set_aside(slot.task, record.topic, record.offset);
            continue;
        }
        let Some((processor, fresh)) = slot.processor.as_mut() else { continue };
        let first = std::mem::take(fresh);
        let handled = parts.callbacks.handle(slot.task, outputs, &record, &mut **processor, (first, callbacks));
        match handled {
            Ok(None) => {}
            Ok(Some(fault)) => {
                faulted.push(record.partition);
                outcome.faults.push((slot.task.incarnation(), fault));
            }
            Err(e) => {
                abort.store(true, Ordering::Release);
                outcome.error = Some(e);
                stopped = true;
            }
        }
    }
    outcome.not_initialised =
        share.values().filter(|s| s.processor.as_ref().is_some_and(|(_, fresh)| *fresh)).map(|s| (s.task.partition, s.task.incarnation())).collect();
    outcome
}

/// Runs a thread's share; a panic (kstate's own: a processor's is caught
/// as its error) stops the other threads before it is passed on.
fn guarded(abort: &AtomicBool, share: impl FnOnce() -> Outcome) -> std::thread::Result<Outcome> {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(share));
    if result.is_err() {
        abort.store(true, Ordering::Release);
    }
    result
}
