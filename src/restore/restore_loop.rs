//! The restore thread: one assign-only consumer replaying every changelog
//! partition handed to it (checkpoint checks, WAL-less batches, position
//! checks for completion) and following standbys until they are cancelled.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::batch::SortedBatch;
use super::live_tail::Prober;
use super::checkpoint::{full_restore_reason, ChangelogState, LocalCheckpoint};
use super::rate::RestoreRate;
use super::restorer::{Command, RestoreJob, RestoreOutcome};
use super::{RestoreEnd, RestoreListener, RestoreStart};
use crate::error::{Error, Result};
use crate::kafka::consumer_batch::{serve_consumer_queue, PolledBatch, QueueHandle, POLL_BATCH};
use crate::store::published::Role;
use crate::store::schema::{refusals_now_readable, version_in, RestoreSchema, Schema, SCHEMA_HEADER};
use crate::store::segments::Segments;
use crate::store::KeyValueStore;

mod standby;
mod table;
mod write;
pub(crate) use table::CommittedOffsets;

/// Records written to RocksDB per restore batch.
const BATCH_RECORDS: usize = 20_000;
/// Bytes written to RocksDB per restore batch.
const BATCH_BYTES: usize = 8 << 20;
/// Consumer errors in a row on one changelog partition that fail its restore.
const MAX_FAILED_FETCHES: u32 = 5;
/// How often restore progress and completion are checked when records keep coming.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);

/// The restore thread's longest wait for records while standbys run
/// (commands such as a promotion are read between waits).
const STANDBY_POLL: Duration = Duration::from_millis(10);

/// How often a caught-up standby records how fresh it is (see
/// `RestoreLoop::refresh_standby_age`).
const STANDBY_AGE_REFRESH: Duration = Duration::from_secs(30);

/// How often a standby writes what it applied, when records trickle in
/// (its checkpoint, and so its lag seen by the group, stays this fresh).
const STANDBY_WRITE_EVERY: Duration = Duration::from_millis(200);

/// Restore state of one store partition.
struct Active {
    partition: i32,
    /// Whether the changelog partition is assigned to the restore consumer.
    assigned: bool,
    store_index: usize,
    end: i64,
    /// When `end` was read (ms since the epoch).
    end_read_at_ms: i64,
    last_offset: i64,
    records: u64,
    bytes: u64,
    batch: SortedBatch,
    started: Instant,
    /// A standby's changelog partition: followed until cancelled.
    standby: bool,
    /// When the batch was last written (standbys write every
    /// [`STANDBY_WRITE_EVERY`]).
    last_write: Instant,
    /// In bulk-load mode (a restore, or a standby far behind).
    bulk: bool,
    /// A restore whose full batches are ingested as table files
    /// (`restore_loop/write.rs`): the bytes that fill the next one.
    ingest_bytes: Option<usize>,
    /// Identifies this restore to the file builder (unique in the loop).
    id: u64,
    /// Its batches at the file builder, oldest first.
    in_flight: std::collections::VecDeque<write::InFlight>,
    /// Batches ingested as table files.
    table_files: u64,
    /// When a standby last read its end offset from the broker, and how
    /// often it does (a quarter of the changelog's tombstone retention, at
    /// most [`STANDBY_AGE_REFRESH`]).
    age_refreshed: Instant,
    age_refresh_every: Duration,
    /// A standby's latest known end offset and when it was read (ms since
    /// the epoch): a batch that reaches it records that every later
    /// changelog record was appended after then (the age bound the restore
    /// checks against the changelog's tombstone retention).
    seen_end: (i64, i64),
    /// A window or session store's segments, moved by the records
    /// restored (copied back to the store with each batch written).
    segments: Option<Segments>,
    /// Records of expired windows skipped.
    expired: u64,
    /// Converts records of other schema versions, keeps refused keys.
    schema: RestoreSchema,
    /// A source table's copy (its end is the committed offset).
    table: Option<table::TableCopy>,
}

impl Active {
    /// Bytes of `records` records at the average key + value size replayed
    /// so far (0 before the first record).
    fn estimated_bytes(&self, records: u64) -> u64 {
        if self.records == 0 {
            return 0;
        }
        (records as f64 * self.bytes as f64 / self.records as f64) as u64
    }
}

pub(super) struct RestoreLoop {
    /// Every changelog partition is forwarded here and read in batches.
    /// Declared before the consumer: dropped first.
    records: Arc<QueueHandle>,
    consumer: Arc<BaseConsumer>,
    /// Finds a window store's live tail for its restore from empty.
    prober: Prober,
    listener: Arc<dyn RestoreListener>,
    timeout: Duration,
    outcomes: Sender<RestoreOutcome>,
    jobs: HashMap<i32, RestoreJob>,
    /// Consecutive consumer errors per changelog partition (cleared by a record).
    failed_fetches: HashMap<(String, i32), u32>,
    active: HashMap<(String, i32), Active>,
    /// Standby checkpoints by (partition, store index), read by the group.
    standby_offsets: Arc<std::sync::Mutex<HashMap<(i32, usize), i64>>>,
    /// Restores finished since the last time none was running.
    busy: Option<Busy>,
    /// The application's committed offsets, which end tables' copies.
    committed: Option<CommittedOffsets>,
    /// Writes full restore batches as table files (`restore_loop/write.rs`).
    files: crate::restore::file_builder::FileBuilder,
    /// The next [`Active`]'s id.
    next_id: u64,
}

/// Restores that overlapped in time, for [`RestoreRate`].
struct Busy {
    since: Instant,
    records: u64,
    bytes: u64,
}

impl RestoreLoop {
    pub(super) fn new(
        consumer: BaseConsumer,
        probe_config: rdkafka::ClientConfig,
        listener: Arc<dyn RestoreListener>,
        timeout: Duration,
        outcomes: Sender<RestoreOutcome>,
        standby_offsets: Arc<std::sync::Mutex<HashMap<(i32, usize), i64>>>,
        committed: Option<CommittedOffsets>,
    ) -> Self {
        // SAFETY: the queue is a field declared before the consumer, and
        // `run` drops its clone before returning.
        let records = Arc::new(unsafe { QueueHandle::new(&consumer) });
        RestoreLoop {
            records,
            consumer: Arc::new(consumer),
            prober: Prober::new(probe_config),
            listener,
            timeout,
            outcomes,
            jobs: HashMap::new(),
            failed_fetches: HashMap::new(),
            busy: None,
            active: HashMap::new(),
            standby_offsets,
            committed,
            files: Default::default(),
            next_id: 0,
        }
    }

    /// The tracing span of the job of task `partition` (its changelog
    /// partitions have the same number), if it is here.
    fn job_span(&self, partition: i32) -> tracing::Span {
        self.jobs.get(&partition).map_or_else(tracing::Span::none, |j| j.span.clone())
    }

    fn publish_standby(&self, partition: i32, index: usize, checkpoint: Option<i64>) {
        let mut offsets = self.standby_offsets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match checkpoint {
            Some(c) => offsets.insert((partition, index), c),
            None => offsets.remove(&(partition, index)),
        };
    }

    pub(super) fn run(mut self, commands: Receiver<Command>) {
        // Declared before the batch, so the batch's messages are destroyed first.
        let records = self.records.clone();
        let consumer = self.consumer.clone();
        let mut polled = PolledBatch::new(&records, POLL_BATCH);
        let mut last_progress = Instant::now();
        loop {
            // Take commands; block only while there is nothing to restore.
            loop {
                let cmd = if self.active.is_empty() {
                    match commands.recv_timeout(Duration::from_millis(100)) {
                        Ok(c) => c,
                        Err(RecvTimeoutError::Timeout) => {
                            Self::serve_events(&consumer, |_, _, _, _, _| {});
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    match commands.try_recv() {
                        Ok(c) => c,
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => return,
                    }
                };
                match cmd {
                    Command::Start(job) => self.start_job(job),
                    Command::Cancel(p, reply) => {
                        let _ = reply.send(self.cancel_job(p));
                    }
                    Command::Shutdown => {
                        let parts: Vec<i32> = self.jobs.keys().copied().collect();
                        for p in parts {
                            self.cancel_job(p);
                        }
                        return;
                    }
                }
            }

            // Commands are read between polls: with standbys (which never
            // finish) a promotion must not wait long for its turn.
            let wait = if self.active.values().any(|a| a.standby) { STANDBY_POLL } else { Duration::from_millis(100) };
            polled.poll(wait);
            // Restarted in this pass: the rest of the batch predates their new assignment.
            let mut restarted: Vec<(String, i32)> = Vec::new();
            for msg in polled.iter() {
                let (topic, partition) = (msg.topic(), msg.partition());
                if restarted.iter().any(|k| k.1 == partition && k.0.as_bytes() == topic) {
                    continue;
                }
                match msg.error() {
                    None => {
                        let version = Schema::version_of(msg.headers().last(SCHEMA_HEADER));
                        self.on_record(topic, partition, msg.offset(), msg.key(), (msg.payload(), version, msg.timestamp()));
                    }
                    // With auto.offset.reset=error librdkafka reports
                    // _AUTO_OFFSET_RESET and stops fetching the partition.
                    Some(RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::AutoOffsetReset) => {
                        // The changelog lost records under us (e.g.
                        // truncated): validate every checkpoint again; the
                        // affected store falls back to a full restore.
                        tracing::warn!("changelog offset out of range during restore; re-validating checkpoints");
                        restarted = self.active.keys().cloned().collect();
                        self.restart(&restarted);
                    }
                    Some(e) => {
                        tracing::warn!(error = %e, topic = %String::from_utf8_lossy(topic), partition,
                            offset = msg.offset(), "restore consumer error");
                        // A batch poll moves the position past error messages
                        // too, so the position could claim the end offset
                        // without its last record: restart the partition from
                        // its last written checkpoint.
                        let key = self.active.keys().find(|k| k.1 == partition && k.0.as_bytes() == topic).cloned();
                        if let Some(key) = key {
                            // An error that keeps coming back (no record in
                            // between) fails the restore instead of looping.
                            let failures = self.failed_fetches.entry(key.clone()).or_default();
                            *failures += 1;
                            if *failures >= MAX_FAILED_FETCHES {
                                self.failed_fetches.remove(&key);
                                self.fail(partition, Error::Restore {
                                    topic: key.0.clone(),
                                    partition,
                                    detail: format!("fetching the changelog failed {MAX_FAILED_FETCHES} times in a row: {e}"),
                                });
                            } else {
                                self.restart(std::slice::from_ref(&key));
                            }
                            restarted.push(key);
                        }
                    }
                }
            }
            polled.clear();
            Self::serve_events(&consumer, |topic, partition, offset, key, value| {
                self.on_record(topic, partition, offset, key, value)
            });
            self.ingest_built();
            if !restarted.is_empty() {
                // Positions may still show the old assignment for a moment.
                last_progress = Instant::now();
            }
            if last_progress.elapsed() >= PROGRESS_INTERVAL {
                last_progress = Instant::now();
                self.check_positions();
            }
        }
    }

    /// Serves what waits in the consumer queue: librdkafka's events (logs,
    /// errors, through rust-rdkafka's context) and records of partitions that
    /// could not be forwarded (handed to `on_record`).
    fn serve_events(
        consumer: &BaseConsumer,
        mut on_record: impl FnMut(&[u8], i32, i64, Option<&[u8]>, (Option<&[u8]>, u32, Option<i64>)),
    ) {
        let served: std::result::Result<(), std::convert::Infallible> = serve_consumer_queue(consumer, |event| {
            match event {
                Some(Ok(m)) => on_record(m.topic().as_bytes(), m.partition(), m.offset(), m.key(), (m.payload(), version_in(m.headers()), m.timestamp().to_millis())),
                Some(Err(e)) => tracing::warn!(error = %e, "restore consumer error"),
                None => {}
            }
            Ok(())
        });
        let Ok(()) = served;
    }

    /// Adds one changelog record to its store's pending batch; writes the
    /// batch when full and finishes the store at the end offset.
    fn on_record(&mut self, topic: &[u8], partition: i32, offset: i64, key: Option<&[u8]>, (value, version, time): (Option<&[u8]>, u32, Option<i64>)) {
        // Few restores run at once: a scan beats allocating a key per record.
        let Some((id, a)) = self.active.iter_mut().find(|(k, _)| k.1 == partition && k.0.as_bytes() == topic) else {
            return;
        };
        if !self.failed_fetches.is_empty() {
            self.failed_fetches.remove(id);
        }
        // (A table's values have no schema version: a foreign header converts nothing.)
        let (version, skip) = match table::gate(a, offset) {
            table::Gate::Apply if a.table.is_some() => match table::applying(a, (topic, offset), time, value) {
                Ok(skip) => (1, skip),
                Err(detail) => {
                    let topic = String::from_utf8_lossy(topic).into_owned();
                    return self.fail(partition, Error::BadRecord { topic, partition, offset, detail });
                }
            },
            table::Gate::Apply => (version, false),
            table::Gate::Drop => return,
            table::Gate::Park => {
                let id = id.clone();
                return self.park(&id, offset);
            }
            table::Gate::Finish => {
                let id = id.clone();
                return self.finish(&id);
            }
        };
        // Expired windows are dropped below: neither converted nor refused.
        let expired = matches!((key, &a.segments), (Some(k), Some(s)) if s.time_of(k).is_some_and(|t| s.expired(t)));
        let value = match key.filter(|_| !expired).map(|k| a.schema.apply(version, k, value)) {
            Some(Ok(v)) => v,
            None => value.map(std::borrow::Cow::Borrowed),
            Some(Err(detail)) => {
                let (index, expected) = (a.store_index, a.schema.version());
                let store = self.jobs.get(&partition).map_or_else(String::new, |j| j.stores[index].name().to_string());
                return self.fail(partition, Error::SchemaVersion { store, partition, found: version, expected, detail });
            }
        };
        let value = value.as_deref();
        match (key, &mut a.segments) {
            (Some(_), None) if skip => {} // a table's refused value (`table_values`)
            (Some(k), None) => {
                a.batch.push(&[k], value);
                a.bytes += (k.len() + value.map_or(0, <[u8]>::len)) as u64;
            }
            (Some(k), Some(segments)) => match segments.time_of(k) {
                // Dropped with its segment anyway (architecture.md §7).
                Some(time) if segments.expired(time) => a.expired += 1,
                Some(time) => {
                    // Tombstones too, as the active's deletes (the time
                    // of a window put and deleted in one commit has only
                    // the tombstone to come back with).
                    segments.observe(time);
                    a.batch.push(&[&segments.prefix(time), k], value);
                    a.bytes += (k.len() + value.map_or(0, <[u8]>::len)) as u64;
                }
                None => tracing::warn!(topic = %String::from_utf8_lossy(topic), partition, offset,
                    "changelog record whose key is too short for a window or session store skipped"),
            },
            (None, _) => tracing::warn!(topic = %String::from_utf8_lossy(topic), partition, offset,
                "changelog record without a key skipped"),
        }
        a.records += 1;
        a.last_offset = offset;
        // (A batch with refused keys goes through the memtable: the usual size.)
        let full = match a.ingest_bytes {
            Some(limit) if !a.schema.has_changes() => a.batch.bytes() >= limit,
            _ => a.batch.len() >= BATCH_RECORDS || a.batch.bytes() >= BATCH_BYTES,
        };
        if a.standby {
            // Written when full, and every STANDBY_WRITE_EVERY by check_positions.
            if full {
                let id = id.clone();
                self.write_batch(&id);
            }
            return;
        }
        let at_end = offset + 1 >= a.end;
        if at_end || full {
            let id = id.clone();
            if at_end {
                self.finish(&id);
            } else if !self.write_batch_later(&id) {
                self.write_batch(&id);
            }
        }
    }

    fn store_of(&mut self, key: &(String, i32)) -> Option<(&mut Active, &mut KeyValueStore)> {
        let a = self.active.get_mut(key)?;
        let (partition, index) = (a.partition, a.store_index);
        let job = self.jobs.get_mut(&partition)?;
        Some((a, &mut job.stores[index]))
    }

    fn start_job(&mut self, job: RestoreJob) {
        let _in_job = job.span.clone().entered();
        let partition = job.partition;
        let n = job.stores.len();
        self.jobs.insert(partition, job);
        let mut up_to_date = Vec::new();
        for i in 0..n {
            match self.begin(partition, i) {
                Ok(Some(key)) => up_to_date.push(key),
                Ok(None) => {}
                Err(e) => {
                    self.fail(partition, e);
                    return;
                }
            }
        }
        // Finish stores with nothing to replay only after every store of the
        // job has begun, so the job is not handed back early.
        for key in up_to_date {
            self.finish(&key);
        }
        self.complete_if_done(partition);
    }

    /// Validates the checkpoint and starts replaying one store partition.
    /// Returns its key if there is nothing to replay (the caller finishes it).
    fn begin(&mut self, partition: i32, index: usize) -> Result<Option<(String, i32)>> {
        let timeout = self.timeout;
        let store = &mut self.jobs.get_mut(&partition).expect("job").stores[index];
        let topic = store.changelog_topic().to_string();
        // Records from `high` on are appended after this instant.
        let end_read_at_ms = crate::store::engine::now_ms();
        // A changelog created a moment ago may not have its leaders in place
        // yet (the broker answers NOT_LEADER for a while): retried briefly
        // here rather than failing the task.
        let mut attempt = 0;
        let (low, high) = loop {
            match self.consumer.fetch_watermarks(&topic, partition, timeout) {
                Ok(w) => break w,
                Err(e) if attempt < 20 && leader_moving(&e) => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(50 * attempt.min(4)));
                }
                Err(e) => {
                    return Err(Error::Restore { topic: topic.clone(), partition, detail: format!("cannot read watermarks: {e}") })
                }
            }
        };
        let topic_id = match crate::kafka::topic_id::describe(self.consumer.client().native_ptr(), &topic, timeout) {
            Ok(id) => Some(id),
            Err(why) => {
                tracing::warn!(%topic, reason = %why, "changelog topic id unknown; a recreated changelog is detected only by its offsets");
                None
            }
        };
        let (table, end) = match self.table_copy(&topic, partition, index, high)? {
            Some((t, end)) => (Some(t), end),
            None => (None, high),
        };
        let store = &mut self.jobs.get_mut(&partition).expect("job").stores[index];
        // A restore or standby writes RocksDB directly from here on.
        store.forget_recent();
        let recorded_id = store.engine().changelog_topic_id()?;
        let reason = match store.open_problem.take() {
            Some(problem) => Some(problem),
            None => full_restore_reason(
                &LocalCheckpoint {
                    checkpoint: store.checkpoint(),
                    topic_id: recorded_id.clone(),
                    appended_after_ms: store.engine().appended_after_ms()?,
                },
                &ChangelogState { low, high, topic_id: topic_id.clone(), tombstone_retention: store.tombstone_retention },
                end_read_at_ms,
            )
            .map_or_else(|| refusals_now_readable(store), |r| Ok(Some(r)))?,
        };
        // Exactly-once, a table past the committed offset was reset back.
        let reason = reason.or_else(|| {
            let source = store.source().filter(|s| s.rebuild_if_ahead && s.restore_end.is_some())?;
            let c = store.checkpoint().filter(|c| *c >= end)?;
            let detail = format!("local state is at offset {c}, past the committed offset {end} of the table's topic (offsets reset?)");
            source.rebuild_if_ahead.then_some((detail, "table_ahead_of_commit"))
        });
        if let Some((why, kind)) = &reason {
            tracing::warn!(store = store.name(), partition, %topic, reason = %why,
                "local state cannot be used; wiping it for a full restore from the changelog");
            store.metrics.full_restore(kind);
            store.wipe()?;
        }
        if let Some(id) = &topic_id {
            if reason.is_some() || recorded_id.as_ref() != Some(id) {
                store.engine().set_changelog_topic_id(id)?;
            }
        }
        // From here on, the end of what this copy applies.
        let high = end;
        let mut start = store.checkpoint().map_or(low, |c| c + 1).max(low);
        if store.checkpoint().is_none() && high > low {
            if let (Some(segments), Some(written_under)) = (store.segments.clone(), store.live_tail_retention) {
                start = self.prober.start(self.timeout, &topic, partition, (low, high), &segments, written_under);
            }
        }
        // A seeded store the checks above wiped was not restored from its snapshot.
        let seed = store.seeded.seed.take().filter(|_| reason.is_none());
        let event = RestoreStart {
            store: store.name().to_string(),
            partition,
            changelog_topic: topic.clone(),
            start_offset: start,
            end_offset: high,
            full_restore_reason: reason.map(|r| r.0),
            snapshot: seed,
            snapshots_skipped: std::mem::take(&mut store.seeded.skipped),
        };
        let standby = self.jobs[&partition].standby;
        let key = (topic.clone(), partition);
        if standby {
            tracing::info!(store = %event.store, partition, start, end = high, "standby starting");
        } else {
            tracing::info!(store = %event.store, partition, start, end = high, "restore starting");
            self.listener.on_restore_start(&event);
        }
        if !standby && !self.active.values().any(|other| !other.standby) {
            // Nothing restoring: what failed or was cancelled before is not part of this period.
            self.busy = None;
        }
        let store = &mut self.jobs.get_mut(&partition).expect("job").stores[index];
        let mut active = Active {
            partition,
            assigned: false,
            store_index: index,
            end: high,
            end_read_at_ms,
            last_offset: start - 1,
            records: 0,
            bytes: 0,
            batch: Default::default(),
            started: Instant::now(),
            standby,
            last_write: Instant::now(),
            bulk: false,
            ingest_bytes: None,
            id: self.next_id,
            in_flight: Default::default(),
            table_files: 0,
            seen_end: (high, end_read_at_ms),
            age_refreshed: Instant::now(),
            age_refresh_every: store.tombstone_retention.map_or(STANDBY_AGE_REFRESH, |r| (r / 4).min(STANDBY_AGE_REFRESH)),
            segments: store.segments.clone(),
            expired: 0,
            schema: RestoreSchema::new(store.schema().clone(), store.engine().refused_keys()?),
            table,
        };
        self.next_id += 1;
        if standby {
            let checkpoint = store.checkpoint();
            self.publish_standby(partition, index, checkpoint);
        }
        let store = &mut self.jobs.get_mut(&partition).expect("job").stores[index];
        if start >= high && !standby {
            self.active.insert(key.clone(), active);
            return Ok(Some(key));
        }
        if !standby {
            store.metrics.restore_remaining.set((high - start) as f64);
        }
        // A standby far behind copies like a restore, then follows in
        // normal mode (compaction on) once caught up.
        if !standby || high - start > BATCH_RECORDS as i64 {
            store.engine_mut().start_bulk_load()?;
        }
        // A standby restarted after an interrupted bulk copy is still in bulk mode.
        active.bulk = store.engine().is_bulk_loading();
        // (Not a table copy that must never be ahead of the committed offset,
        // exactly-once: a crash could leave a file past its checkpoint.)
        if !standby && active.segments.is_none() && !store.source().is_some_and(|s| s.rebuild_if_ahead) {
            active.ingest_bytes = store.engine().ingest_batch_bytes().map(|max| max / 2);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, partition, Offset::Offset(start))?;
        if !self.records.forward_partition(&self.consumer, &topic, partition) {
            tracing::warn!(%topic, partition, "cannot forward the changelog partition to the restore queue; reading it one record at a time");
        }
        self.consumer.incremental_assign(&tpl)?;
        if active.table.is_some() {
            let _ = self.consumer.resume(&tpl); // (a pause of an earlier copy)
        }
        active.assigned = true;
        self.active.insert(key, active);
        Ok(None)
    }

    /// Completes one store partition: last batch, checkpoint at `end - 1`, flush.
    fn finish(&mut self, key: &(String, i32)) {
        let _in_job = self.job_span(key.1).entered();
        if let Some(Active { segments: Some(s), schema, .. }) = self.active.get_mut(key) {
            schema.forget(|k| s.time_of(k).is_none_or(|t| s.expired(t))); // dropped with their segments
        }
        self.write_batch(key);
        let Some(a) = self.remove_active(key) else { return };
        let Some(job) = self.jobs.get_mut(&a.partition) else { return };
        let store = &mut job.stores[a.store_index];
        if let Some(e) = a.schema.leftover(store.name(), a.partition) {
            return self.fail(a.partition, e);
        }
        let result = (|| -> Result<()> {
            // Everything below `end` is applied (compaction gaps and markers
            // included), so the checkpoint may move to `end - 1`.
            // Records past `end - 1` were appended after `end` was read.
            if a.end > 0 && a.table.is_none() {
                let batch = store.segments_batch();
                store.engine().commit_with_age_bound(batch, a.end - 1, a.end_read_at_ms)?;
                store.set_checkpoint(Some(a.end - 1));
            } else if a.end > 0 && store.checkpoint().is_none_or(|c| c < a.end - 1) {
                // A table kept ahead of the committed offset keeps its checkpoint.
                store.engine().commit_bounded(Default::default(), a.end - 1, table::age_bound(&a))?;
                store.set_checkpoint(Some(a.end - 1));
            }
            store.engine_mut().finish_bulk_load()?;
            Ok(())
        })();
        if let Err(e) = result {
            self.fail(a.partition, e);
            return;
        }
        let duration = a.started.elapsed();
        let store = &self.jobs[&a.partition].stores[a.store_index];
        store.metrics.restore_remaining.set(0.0);
        store.metrics.restore_remaining_bytes.set(0.0);
        if a.records > 0 {
            store.metrics.restore_bytes.increment(a.bytes);
            store.metrics.restore_rate.set(a.records as f64 / duration.as_secs_f64().max(1e-9));
        }
        let event = RestoreEnd {
            store: store.name().to_string(),
            partition: a.partition,
            records: a.records,
            bytes: a.bytes,
            duration,
            table_files: a.table_files,
        };
        tracing::info!(store = %event.store, partition = a.partition, records = a.records, bytes = a.bytes,
            expired_skipped = a.expired, table_files = a.table_files, seconds = duration.as_secs_f64(), "restore finished");
        let app_dir = store.app_dir().map(Path::to_path_buf);
        self.listener.on_restore_end(&event);
        // Restores run side by side on this one thread: the rate that
        // predicts the next restore is the thread's, from the first start to
        // the last end of restores that overlapped.
        let busy = self.busy.get_or_insert(Busy { since: a.started, records: 0, bytes: 0 });
        busy.since = busy.since.min(a.started);
        busy.records += a.records;
        busy.bytes += a.bytes;
        if !self.active.values().any(|other| !other.standby) {
            let busy = self.busy.take().expect("set above");
            if let (true, Some(dir)) = (busy.records >= RestoreRate::MIN_RECORDS, app_dir) {
                RestoreRate::measured(busy.records, busy.bytes, busy.since.elapsed()).save(&dir);
            }
        }
        self.complete_if_done(a.partition);
    }

    fn complete_if_done(&mut self, partition: i32) {
        if self.active.values().any(|a| a.partition == partition) {
            return;
        }
        if let Some(job) = self.jobs.remove(&partition) {
            let _ = self.outcomes.send(RestoreOutcome::Done(job));
        }
    }

    /// Keys of the active restores of `partition`.
    fn active_keys(&self, partition: i32) -> Vec<(String, i32)> {
        self.active.iter().filter(|(_, a)| a.partition == partition).map(|(k, _)| k.clone()).collect()
    }

    /// Stops tracking one store partition and releases its changelog partition.
    fn remove_active(&mut self, key: &(String, i32)) -> Option<Active> {
        let a = self.active.remove(key)?;
        if !a.in_flight.is_empty() {
            self.discard_files(a.id, a.in_flight.len());
        }
        if !self.files.is_busy() && !self.active.values().any(|a| a.ingest_bytes.is_some()) {
            self.files.release_spares(); // nothing writes table files: their memory goes
        }
        if let Some(job) = self.jobs.get(&a.partition) {
            job.stores[a.store_index].metrics.clear_lags();
        }
        if a.assigned {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&key.0, key.1);
            // A parked table copy's pause would outlive the assignment.
            if a.table.as_ref().is_some_and(|t| t.parked_at.is_some()) {
                let _ = self.consumer.resume(&tpl);
            }
            if let Err(e) = self.consumer.incremental_unassign(&tpl) {
                tracing::warn!(topic = %key.0, partition = key.1, error = %e, "unassigning a restored changelog partition failed");
            }
        }
        Some(a)
    }

    fn fail(&mut self, partition: i32, error: Error) {
        let _in_job = self.job_span(partition).entered();
        for k in self.active_keys(partition) {
            self.remove_active(&k);
        }
        if let Some(mut job) = self.jobs.remove(&partition) {
            for i in 0..job.stores.len() {
                self.publish_standby(partition, i, None);
            }
            for s in &mut job.stores {
                let _ = s.engine_mut().finish_bulk_load();
            }
            let _ = self.outcomes.send(RestoreOutcome::Failed(job, error));
        }
    }

    fn cancel_job(&mut self, partition: i32) -> Option<RestoreJob> {
        let _in_job = self.job_span(partition).entered();
        for k in self.active_keys(partition) {
            self.write_batch(&k);
            self.remove_active(&k);
        }
        let mut job = self.jobs.remove(&partition)?;
        for i in 0..job.stores.len() {
            self.publish_standby(partition, i, None);
        }
        for s in &mut job.stores {
            if let Err(e) = s.engine_mut().finish_bulk_load() {
                tracing::warn!(store = s.name(), partition, error = %e, "flush after cancelled restore failed");
            }
        }
        Some(job)
    }

    /// Completes restores whose position reached the end offset even though
    /// the last offsets delivered no record (compaction gaps, markers).
    fn check_positions(&mut self) {
        if self.active.is_empty() {
            return;
        }
        // librdkafka drops a partition's forwarding when its fetcher stops,
        // which an unassign does asynchronously: if that raced with the
        // forward before a re-assignment, forward again (idempotent).
        for (topic, partition) in self.active.iter().filter(|(_, a)| a.assigned).map(|(k, _)| k) {
            self.records.forward_partition(&self.consumer, topic, *partition);
        }
        // Standbys: write what trickled in, leave bulk mode once caught up,
        // and now and then record how fresh they are.
        let due: Vec<(String, i32)> = self
            .active
            .iter()
            .filter(|(_, a)| a.standby && a.batch.len() > 0 && a.last_write.elapsed() >= STANDBY_WRITE_EVERY)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.write_batch(&key);
        }
        let Ok(positions) = self.consumer.position() else { return };
        // One pass over the positions: standbys that finished their bulk
        // copy, standby lags, restores that reached their end offset.
        let (mut caught_up, mut lags, mut done, mut ends) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for e in positions.elements() {
            let key = (e.topic().to_string(), e.partition());
            let (Some(a), Offset::Offset(o)) = (self.active.get(&key), e.offset()) else { continue };
            if !a.standby {
                ends.push((key.clone(), a.end, Role::Restoring, None));
                if o >= a.end {
                    done.push(key);
                }
                continue;
            }
            if a.bulk && o >= a.end {
                caught_up.push(key.clone());
            }
            // All it returned is written: RocksDB reflects every offset below its
            // position (past commit markers), once that position is this copy's own.
            let reflected = (a.table.is_none() && a.batch.len() == 0 && (a.records > 0 || o == a.last_offset + 1)).then_some(o);
            if let Some(high) = cached_high(&self.consumer, &key.0, key.1) {
                ends.push((key.clone(), high, Role::Standby, reflected));
                lags.push((key, (high - o).max(0)));
            }
        }
        // What queries see of these copies: their end offset, and the copy
        // itself again once a bulk load ended.
        for (key, end, role, reflected) in ends {
            if let Some((_, store)) = self.store_of(&key) {
                if let Some(slot) = store.slot() {
                    slot.set_end(end);
                    if let Some(next) = reflected { slot.set_reflected(next) }
                }
                store.publish(role);
            }
        }
        for key in caught_up {
            self.write_batch(&key);
            self.standby_caught_up(&key);
        }
        self.refresh_standby_age(&positions);
        self.refresh_table_limits();
        for (key, lag) in lags {
            if let Some((a, store)) = self.store_of(&key) {
                store.metrics.standby_lag.set(lag as f64);
                store.metrics.standby_lag_bytes.set(a.estimated_bytes(lag as u64) as f64);
            }
        }
        for key in done {
            self.finish(&key);
        }
    }

    /// Re-validates the given active restores from their last written
    /// checkpoints and assigns them again.
    fn restart(&mut self, keys: &[(String, i32)]) {
        let mut starts = Vec::new();
        for k in keys {
            self.write_batch(k);
            if let Some(a) = self.remove_active(k) {
                starts.push((a.partition, a.store_index));
            }
        }
        let mut up_to_date = Vec::new();
        for (p, i) in starts {
            if !self.jobs.contains_key(&p) {
                continue; // failed while restarting another of its stores
            }
            match self.begin(p, i) {
                Ok(Some(key)) => up_to_date.push(key),
                Ok(None) => {}
                Err(e) => self.fail(p, e),
            }
        }
        for key in up_to_date {
            self.finish(&key);
        }
    }
}

/// Whether a watermark request failed because the partition's leadership is
/// being set up or moving (retriable within seconds).
fn leader_moving(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(e.rdkafka_error_code(), Some(C::NotLeaderForPartition | C::LeaderNotAvailable | C::UnknownTopicOrPartition))
}

/// The end offset librdkafka last saw for a partition it fetches (no
/// request: from the latest fetch response).
pub(crate) fn cached_high<C: rdkafka::consumer::ConsumerContext>(consumer: &BaseConsumer<C>, topic: &str, partition: i32) -> Option<i64> {
    crate::kafka::watermarks::cached(consumer.client().native_ptr(), topic, partition).map(|(_, high)| high)
}
