//! The processing loop: serves the group's events and the task manager's
//! chores, feeds polled records to the processor one at a time, and commits
//! on the interval or at the bound on uncommitted bytes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset};

use crate::shutdown::ShutdownHandle;
use crate::kafka::consumer_batch::{pending_events, serve_consumer_queue, PolledBatch, PolledMessage, POLL_BATCH};
use crate::config::AppConfig;
use crate::error::{Error, Result};
use crate::group::Membership;
use crate::record::{Headers, Record, TimestampType};
use crate::task::{TaskManager, TaskState};


use super::callbacks::Callbacks;
use super::dispatch::{set_aside, Dispatch, ProcessorSet};
use super::merge::InputMerge;
use super::queues::RecordQueues;
use super::threads::{process_batches, PassParts};
use super::disk_gauges::DiskGauges;
use super::events::apply_group_events;
use super::{RuntimeContext, Shared};

/// How long an idle loop pass waits for records.
const IDLE_WAIT: Duration = Duration::from_millis(10);
/// Records processed between checks of the commit deadline and shutdown
/// inside a polled batch (a clock read per record would cost ~2% at 1M/s).
pub(super) const DEADLINE_CHECK_EVERY: usize = 32;
/// Several threads: how long an idle loop waits on one queue before it
/// looks at the next (a record's added latency when all were idle).
const WAIT_SLICE: Duration = Duration::from_millis(1);

/// What the processing loop works with.
pub(super) struct LoopParts<'a> {
    pub(super) config: &'a AppConfig,
    pub(super) shutdown: &'a ShutdownHandle,
    pub(super) consumer: &'a BaseConsumer<RuntimeContext>,
    pub(super) records: &'a RecordQueues,
    pub(super) membership: &'a Membership,
    pub(super) shared: &'a Shared,
    pub(super) store_index: &'a HashMap<String, usize>,
    pub(super) globals: &'a crate::global::GlobalTables,
}

pub(super) fn process_loop<S: ProcessorSet>(parts: LoopParts<'_>, processors: &mut S) -> Result<()> {
    let LoopParts { config, shutdown, consumer, records, membership, shared, store_index, globals } = parts;
    let dispatch = Dispatch { callbacks: Callbacks { config, store_index, globals: Some(globals) }, consumer };
    // One batch per processing thread's queue, and its error log.
    let mut polled: Vec<PolledBatch<'_>> = records.queues().iter().map(|q| PolledBatch::new(q, POLL_BATCH)).collect();
    let mut errors: Vec<ErrorLog> = polled.iter().map(|_| ErrorLog::default()).collect();
    let mut next_wait = 0;
    let mut consumer_errors = ErrorLog::default();
    let mut last_commit = Instant::now();
    // Several input topics: each task's records merged in timestamp order.
    let merge = InputMerge::new(config);
    let _disk = DiskGauges::start(config.state_dir.join(&config.application_id));
    while !shutdown.is_shutdown() {
        membership.polled();
        {
            let mut tasks = shared.tasks.lock().expect("task lock");
            apply_group_events(membership, consumer, records, &mut tasks, config, &mut |t, revoked| {
                dispatch.close_tasks(t, processors, Some(revoked))
            })?;
            tasks.open_pending(consumer)?;
            tasks.update_standbys()?;
            tasks.clean_state_dirs();
            tasks.collect_restored(consumer)?;
            tasks.poll_inflight(consumer)?;
            tasks.poll_offset_commit()?;
            tasks.refresh_metrics(consumer);
            tasks.sweep_expired(consumer)?;
            dispatch.serve_tasks(&mut tasks, processors)?;
        }
        // The consumer queue: errors and logs (served by rust-rdkafka, one
        // per call), and records of partitions that could not be forwarded
        // to the record queue.
        // Records not processed in this pass (see the parked check below).
        let mut not_processed = Vec::new();
        serve_consumer_queue(consumer, |event| {
            match event {
                Some(Ok(msg)) => {
                    let mut tasks = shared.tasks.lock().expect("task lock");
                    if tasks.is_parked() {
                        // Exactly-once: a commit waits for the group's new
                        // generation; read this record again later.
                        not_processed.push((msg.topic().to_string(), msg.partition(), msg.offset()));
                        return Ok(());
                    }
                    let timestamp_type = match msg.timestamp() {
                        rdkafka::Timestamp::CreateTime(_) => TimestampType::CreateTime,
                        rdkafka::Timestamp::LogAppendTime(_) => TimestampType::LogAppendTime,
                        rdkafka::Timestamp::NotAvailable => TimestampType::NotAvailable,
                    };
                    let record = Record {
                        topic: msg.topic(),
                        partition: msg.partition(),
                        offset: msg.offset(),
                        timestamp: msg.timestamp().to_millis(),
                        timestamp_type,
                        key: msg.key(),
                        value: msg.payload(),
                        // SAFETY: the message outlives the record (this closure).
                        headers: unsafe { Headers::of_message(msg.ptr()) },
                    };
                    if let Some(m) = &merge {
                        m.new_pass(&mut tasks); // (a poll of its own)
                    }
                    if !merge.as_ref().is_some_and(|m| m.hold(config, &mut tasks, (&record, false), consumer)) {
                        dispatch.process_one(&mut tasks, &record, processors)?;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                // librdkafka's fatal errors leave the consumer unusable.
                Some(Err(e @ KafkaError::MessageConsumptionFatal(_))) => {
                    tracing::error!(error = %e, "fatal consumer error; stopping");
                    return Err(Error::from(e));
                }
                Some(Err(e)) => consumer_errors.warn(&e),
            }
            Ok(())
        })?;
        if !not_processed.is_empty() {
            seek_back_to(consumer, &mut shared.tasks.lock().expect("task lock"), not_processed)?;
        }
        // At the bound on uncommitted writes, with a commit still being
        // written (brokers slow or away): take no records until it lands,
        // but keep serving the group (rebalances, heartbeats, max.poll.interval).
        if shared.tasks.lock().expect("task lock").backpressure() {
            std::thread::sleep(IDLE_WAIT);
            continue;
        }
        // The record queues, in batches. Waiting here delays events, task
        // openings and restored tasks: only briefly, and not at all when
        // an event is already waiting.
        let wait = if pending_events(consumer) > 0 { Duration::ZERO } else { IDLE_WAIT };
        let filled = poll_queues(&mut polled, wait, &mut next_wait);
        if filled > 0 {
            let mut tasks = shared.tasks.lock().expect("task lock");
            let mut parallel = false;
            if filled > 1 && merge.is_none() {
                let parts = PassParts {
                    callbacks: &dispatch.callbacks,
                    consumer,
                    polled: membership.poll_signal(),
                    shutdown,
                    // Overdue already (a commit in flight kept the next
                    // from starting): a whole interval, not 32 records.
                    commit_due: match last_commit + config.commit_interval {
                        due if due > Instant::now() => due,
                        _ => Instant::now() + config.commit_interval,
                    },
                };
                let mut batches: Vec<_> = polled.iter_mut().zip(errors.iter_mut()).filter(|(b, _)| !b.is_empty()).collect();
                parallel = process_batches(&parts, &mut batches, &mut tasks, processors)?;
            }
            if !parallel {
                let parts = PassEnv { dispatch: &dispatch, config, consumer, membership, shutdown, merge: merge.as_ref() };
                for (batch, errors) in polled.iter_mut().zip(errors.iter_mut()).filter(|(b, _)| !b.is_empty()) {
                    process_polled(&parts, batch, errors, &mut tasks, processors, &mut last_commit)?;
                }
            }
            if tasks.uncommitted_bytes() >= config.max_uncommitted_bytes && tasks.commit_pipelined(consumer)? {
                last_commit = Instant::now();
            }
        }
        if let Some(merge) = &merge {
            let mut tasks = shared.tasks.lock().expect("task lock");
            let parts = DrainParts { dispatch: &dispatch, config, consumer, membership, shutdown };
            drain_merged(merge, parts, &mut tasks, processors, &mut last_commit)?;
        }
        if last_commit.elapsed() >= config.commit_interval && shared.tasks.lock().expect("task lock").commit_pipelined(consumer)? {
            last_commit = Instant::now();
        }
    }
    Ok(())
}

/// What processing a polled batch on the poll thread needs besides it.
struct PassEnv<'a, 'd> {
    dispatch: &'a Dispatch<'d>,
    config: &'a AppConfig,
    consumer: &'a BaseConsumer<RuntimeContext>,
    membership: &'a Membership,
    shutdown: &'a ShutdownHandle,
    merge: Option<&'a InputMerge>,
}

/// Processes a polled batch on the poll thread, record by record, keeping
/// to the commit interval inside it.
fn process_polled<S: ProcessorSet>(
    parts: &PassEnv<'_, '_>,
    polled: &mut PolledBatch<'_>,
    consumer_errors: &mut ErrorLog,
    tasks: &mut TaskManager,
    processors: &mut S,
    last_commit: &mut Instant,
) -> Result<()> {
    let PassEnv { dispatch, config, consumer, membership, shutdown, merge } = *parts;
    let mut seek_back = Vec::new();
    // Several inputs: a new poll (answers of who is behind are asked
    // again), and which records a later one of another input follows.
    let later_other = match merge {
        Some(m) => {
            m.new_pass(tasks);
            m.later_other_inputs(polled)
        }
        None => Vec::new(),
    };
    // Remote stores read the batch's keys ahead, all at once.
    tasks.prefetch(polled.iter().filter_map(|m| Some((m.partition(), m.key()?))));
    for (i, msg) in polled.iter().enumerate() {
        // A batch of a slow processor can take seconds: keep to the
        // commit interval and stop promptly on shutdown inside it
        // (records not processed are not committed).
        if i % DEADLINE_CHECK_EVERY == 0 {
            if i > 0 && shutdown.is_shutdown() {
                break;
            }
            if i > 0 {
                membership.polled();
                if last_commit.elapsed() >= config.commit_interval && tasks.commit_pipelined(consumer)? {
                    *last_commit = Instant::now();
                }
            }
            if tasks.is_parked() {
                // Exactly-once: a commit waits for the group's new
                // generation; the rest of the batch must not add
                // outputs to its transaction. Read it again later.
                seek_back.extend(polled.iter().skip(i).filter_map(|m| {
                    Some((std::str::from_utf8(m.topic()).ok()?.to_string(), m.partition(), m.offset()))
                }));
                break;
            }
        }
        let Some(record) = record_of(&msg, consumer_errors, &mut seek_back) else { continue };
        if !merge.is_some_and(|m| m.hold(config, tasks, (&record, later_other.get(i).copied().unwrap_or(true)), consumer)) {
            dispatch.process_one(tasks, &record, processors)?;
        }
    }
    seek_back_to(consumer, tasks, seek_back)
}

/// The record a polled message holds; `None` for a consumer error (logged,
/// and its partition read again from there: a batch poll moves the
/// position past an error too, but its offset is the next record not yet
/// delivered).
pub(super) fn record_of<'b>(msg: &PolledMessage<'b>, errors: &mut ErrorLog, seek_back: &mut Vec<(String, i32, i64)>) -> Option<Record<'b>> {
    let (partition, offset) = (msg.partition(), msg.offset());
    let topic = std::str::from_utf8(msg.topic()).ok()?; // names are ASCII
    if let Some(e) = msg.error() {
        errors.warn_at(&e, topic, partition, offset);
        if offset >= 0 {
            seek_back.push((topic.to_string(), partition, offset));
        }
        return None;
    }
    if !seek_back.is_empty() {
        // Delivered after all: no need to seek back for it.
        seek_back.retain(|(t, p, o)| !(*p == partition && t == topic && offset >= *o));
    }
    Some(Record {
        topic,
        partition,
        offset,
        timestamp: msg.timestamp(),
        timestamp_type: msg.timestamp_type(),
        key: msg.key(),
        value: msg.payload(),
        headers: msg.headers(),
    })
}

/// Polls every thread's queue once: all at once, or with none queued,
/// waits up to `wait` for one of them (in slices of [`WAIT_SLICE`] per
/// queue, starting with the one after `next_wait`'s last). Returns how
/// many batches hold records.
fn poll_queues(batches: &mut [PolledBatch<'_>], wait: Duration, next_wait: &mut usize) -> usize {
    if let [batch] = batches {
        return usize::from(batch.poll(wait) > 0);
    }
    let mut filled = batches.iter_mut().filter_map(|b| (b.poll(Duration::ZERO) > 0).then_some(())).count();
    let until = Instant::now() + wait;
    while filled == 0 && Instant::now() < until {
        *next_wait = (*next_wait + 1) % batches.len();
        if batches[*next_wait].poll(WAIT_SLICE) > 0 {
            filled = 1 + batches.iter_mut().enumerate().filter_map(|(i, b)| (i != *next_wait && b.poll(Duration::ZERO) > 0).then_some(())).count();
        }
    }
    filled
}

/// What processing held records needs besides them and the tasks.
struct DrainParts<'a, 'd> {
    dispatch: &'a Dispatch<'d>,
    config: &'a AppConfig,
    consumer: &'a BaseConsumer<RuntimeContext>,
    membership: &'a Membership,
    shutdown: &'a ShutdownHandle,
}

/// Several input topics: processes the held records whose turn has come
/// (see `merge.rs`), keeping to the commit interval as a polled batch does.
fn drain_merged<S: ProcessorSet>(
    merge: &InputMerge,
    parts: DrainParts<'_, '_>,
    tasks: &mut TaskManager,
    processors: &mut S,
    last_commit: &mut Instant,
) -> Result<()> {
    let DrainParts { dispatch, config, consumer, membership, shutdown } = parts;
    merge.new_pass(tasks); // (seeks may have moved positions since)
    let mut done = 0usize;
    // One record per task per round, at most a polled batch's worth per
    // pass: the loop's other duties (the group's events, timers) wait no
    // longer than after a batch.
    let mut ready = merge.partitions(tasks);
    while !ready.is_empty() && done < POLL_BATCH {
        let mut i = 0;
        while i < ready.len() {
            // Exactly-once: a commit waits for the group's new generation
            // (held records wait too); at the bound on uncommitted bytes,
            // until the commit in flight lands (asked as often as a polled
            // batch asks for its deadline: it reads the clock).
            if tasks.is_parked() || shutdown.is_shutdown() || (done.is_multiple_of(DEADLINE_CHECK_EVERY) && tasks.backpressure()) {
                return Ok(());
            }
            // (A task re-initialised meanwhile holds nothing: its records
            // are read again, see task/reinit.rs.)
            let Some(held) = merge.next(ready[i], tasks, consumer) else {
                ready.remove(i);
                continue;
            };
            dispatch.process_one(tasks, &held.record(merge.topics(), ready[i]), processors)?;
            done += 1;
            i += 1;
            if done.is_multiple_of(DEADLINE_CHECK_EVERY) {
                membership.polled();
                if last_commit.elapsed() >= config.commit_interval && tasks.commit_pipelined(consumer)? {
                    *last_commit = Instant::now();
                }
            }
        }
    }
    if done > 0 && tasks.uncommitted_bytes() >= config.max_uncommitted_bytes && tasks.commit_pipelined(consumer)? {
        *last_commit = Instant::now();
    }
    Ok(())
}

/// Seeks each partition among `records` (topic, partition, offset) back to
/// the lowest of its offsets, so that no record that was not processed is
/// skipped. Negative offsets (none known) are ignored. A seek that fails
/// would leave the position past those records: a running task is
/// re-initialised (it restarts from its committed offsets), another one
/// reads them again when it runs.
pub(super) fn seek_back_to(consumer: &BaseConsumer<RuntimeContext>, tasks: &mut TaskManager, records: Vec<(String, i32, i64)>) -> Result<()> {
    let mut lowest: HashMap<(String, i32), i64> = HashMap::new();
    for (topic, partition, offset) in records.into_iter().filter(|r| r.2 >= 0) {
        let o = lowest.entry((topic, partition)).or_insert(offset);
        *o = (*o).min(offset);
    }
    for ((topic, partition), offset) in lowest {
        tracing::debug!(%topic, partition, offset, "seeking back to records not processed");
        let Err(e) = consumer.seek(&topic, partition, Offset::Offset(offset), Duration::from_secs(10)) else { continue };
        tracing::warn!(error = %e, %topic, partition, offset, "seeking back to records not processed failed; the task reads them again");
        match tasks.tasks.get_mut(&partition) {
            Some(task) if task.state == TaskState::Running => tasks.reinitialise_task(consumer, partition, Error::from(e))?,
            Some(task) => set_aside(task, &topic, offset),
            None => {} // revoked: its next owner starts from the committed offset
        }
    }
    Ok(())
}

/// Logs consumer errors without flooding: while brokers are down librdkafka
/// reports the same error for every connection and partition many times a
/// second. Each distinct message is logged once per [`ERROR_LOG_EVERY`],
/// with the number of repeats held back.
#[derive(Default)]
pub(super) struct ErrorLog {
    seen: HashMap<String, (Instant, u64)>,
}

const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

impl ErrorLog {
    fn due(&mut self, text: String) -> Option<(String, u64)> {
        let now = Instant::now();
        match self.seen.get_mut(&text) {
            Some((last, repeats)) if now - *last < ERROR_LOG_EVERY => {
                *repeats += 1;
                None
            }
            Some((last, repeats)) => {
                *last = now;
                Some((text, std::mem::take(repeats)))
            }
            None => {
                if self.seen.len() > 1000 {
                    self.seen.clear();
                }
                self.seen.insert(text.clone(), (now, 0));
                Some((text, 0))
            }
        }
    }

    fn warn(&mut self, error: &KafkaError) {
        if let Some((error, repeated)) = self.due(error.to_string()) {
            tracing::warn!(%error, repeated, "consumer error");
        }
    }

    fn warn_at(&mut self, error: &impl std::fmt::Display, topic: &str, partition: i32, offset: i64) {
        if let Some((error, repeated)) = self.due(format!("{error} ({topic} [{partition}])")) {
            tracing::warn!(%error, topic, partition, offset, repeated, "consumer error");
        }
    }
}
