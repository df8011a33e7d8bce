//! The key-value store of one (store name, partition): reads merge the
//! uncommitted overlay over RocksDB, writes go to the overlay, and a commit
//! sends the overlay's entries (the latest write of each key) to the
//! changelog, waits for their acknowledgements, then moves them into RocksDB
//! together with the checkpoint (docs/architecture.md §1).
//!
//! Processors get stores from their [`ProcessorContext`](crate::ProcessorContext);
//! [`TypedStore`] adds codecs on top.

mod backend;
pub(crate) use backend::StoreBackend;
pub(crate) mod closing;
pub(crate) mod engine;
pub(crate) mod lock;
pub(crate) mod memory;
pub(crate) mod objects;
pub(crate) mod overlay;
pub(crate) mod recent;
pub(crate) mod published;
pub(crate) mod schema;
mod seed;
#[cfg(test)]
mod scratch;
#[cfg(test)]
pub(crate) use scratch::{scratch_store, scratch_store_with};
pub(crate) mod segments;
pub(crate) mod state_dir;
pub(crate) mod table;
pub(crate) mod ttl;
mod typed;
pub use typed::TypedStore;
pub(crate) mod windowed;

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::kafka::{ChangelogSink, DeliveryTracker, RECORD_OVERHEAD};
use crate::store::engine::{Checkpoint, Engine, EngineResources};
use crate::error::{Error, Result};
use crate::store::lock::DirLock;
use crate::metrics::StoreMetrics;
use crate::store::overlay::{layered, MergeIter, Overlay};
use crate::store::segments::{Layout, Segments, SegmentsUpdate};
use crate::windows::Shape;
pub(crate) use seed::Seeded;
pub use seed::SnapshotSeed;
use ttl::Ttl;

pub(crate) use ttl::NO_TIME;
pub use windowed::{SessionRecord, SessionStore, WindowPut, WindowStore, WindowUpdate};

/// Everything a store partition needs to open.
pub(crate) struct StoreOpenArgs<'a> {
    pub(crate) name: &'a str,
    pub(crate) partition: i32,
    pub(crate) dir: PathBuf,
    pub(crate) changelog_topic: String,
    pub(crate) max_record_bytes: usize,
    pub(crate) producer: ChangelogSink,
    pub(crate) resources: &'a EngineResources,
    pub(crate) lock_timeout: Duration,
    /// The changelog's `delete.retention.ms`, if known.
    pub(crate) tombstone_retention: Option<Duration>,
    /// The store's time to live, if it has one.
    pub(crate) ttl: Option<(Duration, crate::time::TimeDomain)>,
    /// A window or session store: its shape and retention.
    pub(crate) segments: Option<(Shape, Duration)>,
    /// See [`KeyValueStore::live_tail_retention`].
    pub(crate) live_tail_retention: Option<i64>,
    /// Where the store is published for interactive queries.
    pub(crate) published: Option<Arc<published::Published>>,
    /// Seeds the database directory from a snapshot when it has none
    /// (called under the directory lock, before RocksDB opens it).
    pub(crate) seed: Option<&'a (dyn Fn(&Path) -> Seeded + Sync)>,
    /// The store's schema version and upgrade function.
    pub(crate) schema: schema::Schema,
    /// Whether its windows close with a final result (kstate's own timers).
    pub(crate) final_results: bool,
    /// RocksDB, in memory ([`crate::StoreDefinition::in_memory`]) or in
    /// object storage ([`crate::StoreDefinition::remote`]).
    pub(crate) backend: StoreBackend,
}

/// A changelog-backed key-value store of one partition, keyed and valued by bytes.
///
/// Keys are ordered by their bytes; [`range`](Self::range) and
/// [`prefix_scan`](Self::prefix_scan) iterate in that order. Writes are
/// visible to reads at once and become durable at the next commit.
pub struct KeyValueStore {
    name: Arc<str>,
    partition: i32,
    changelog_topic: String,
    overlay: Overlay,
    /// Writes of the commit in flight: being written to RocksDB in the
    /// background (which shares them), and read from here until that write
    /// has landed.
    sealed: Arc<Overlay>,
    /// Landed writes kept for point reads (the read cache).
    recent: recent::Recent,
    producer: ChangelogSink,
    tracker: Arc<DeliveryTracker>,
    max_record_bytes: usize,
    /// The changelog's `delete.retention.ms`, if known: local state older
    /// than that is restored in full.
    pub(crate) tombstone_retention: Option<Duration>,
    /// The changelog offset RocksDB reflects (durable).
    checkpoint: Option<i64>,
    /// The offset the commit in flight took RocksDB to (set by its writer;
    /// -1 until then).
    landed_checkpoint: Arc<AtomicI64>,
    pub(crate) metrics: StoreMetrics,
    /// RocksDB's counts as last published (see `record_engine_metrics`).
    reported_tickers: std::sync::Mutex<crate::store::engine::Tickers>,
    /// Why the local state cannot be trusted, found while opening it,
    /// and the `reason` label of the full restore it causes.
    pub(crate) open_problem: Option<(String, &'static str)>,
    /// Whether a snapshot seeded the database at open, or why none did.
    pub(crate) seeded: Seeded,
    db_dir: PathBuf,
    resources: EngineResources,
    /// Time to live of the entries, if the store has one.
    ttl: Option<Ttl>,
    /// A window or session store's segments, and its windows.
    pub(crate) segments: Option<Segments>,
    pub(crate) shape: Option<Shape>,
    /// The longest retention the changelog's records may have been written
    /// under (ms), for a restore from its live tail; `None`: restore all of it.
    pub(crate) live_tail_retention: Option<i64>,
    /// Whether a window write registers its window's closing (final results).
    pub(crate) final_results: bool,
    /// Where the data lives (a wipe reopens it there).
    backend: StoreBackend,
    /// This store partition's slot for interactive queries (its engine
    /// withdrawn before the engine closes, reopens or is replaced).
    slot: Option<Arc<published::Slot>>,
    // Field order matters: the engine closes before the lock is released.
    /// Shared with the background writer while a commit is in flight.
    engine: Option<Arc<Engine>>,
    /// The schema version its commits write, and the upgrade function.
    schema: schema::Schema,
    /// A source table's progress through its topic (`None`: the store's
    /// changelog is its own).
    source: Option<table::SourceTable>,
    /// `None` in memory (a test driver's store).
    _lock: Option<DirLock>,
}

impl Drop for KeyValueStore {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            slot.close();
        }
        self.producer.release(&self.tracker);
    }
}

/// A store's part of a commit, sealed on the processing thread; its
/// changelog records are sent (and its RocksDB batch built) by
/// [`SealedCommit::send_and_build`] and, once the producer is flushed, it
/// is written to RocksDB by [`SealedCommit::write`] (on any thread).
pub(crate) struct SealedCommit {
    engine: Arc<Engine>,
    writes: Arc<Overlay>,
    producer: ChangelogSink,
    /// Also names the changelog partition (`topic`, `partition`).
    tracker: Arc<DeliveryTracker>,
    /// The checkpoint RocksDB is at (every earlier commit has landed).
    previous: Option<i64>,
    /// When the commit was sealed (ms since the epoch): its records, and
    /// every later one, were appended after that.
    sealed_at_ms: i64,
    landed_checkpoint: Arc<AtomicI64>,
    /// The RocksDB batch, once built.
    batch: Option<engine::Batch>,
    /// A segmented store's bookkeeping, written with the data.
    segments: Option<SegmentsUpdate>,
    /// Bytes in front of each RocksDB key that the changelog key leaves
    /// out (a segmented store's segment).
    key_skip: usize,
    /// The `kstate.schema` header of every record (`None`: version 1).
    schema_header: Option<Vec<u8>>,
    /// A source table's commit: nothing to send, this checkpoint to write.
    source: Option<table::SourceCheckpoint>,
}

impl SealedCommit {
    /// The delivery tracker of this store's changelog partition.
    pub(crate) fn tracker(&self) -> &DeliveryTracker {
        &self.tracker
    }

    /// Sends the sealed writes to the changelog, one record per key (its
    /// latest write; a delete is a tombstone), in key order, and builds the
    /// RocksDB batch of the same writes as it goes: each chunk right after
    /// librdkafka copied it, while its bytes are still in the CPU cache (a
    /// second pass over a commit's overlay missed the cache all over again:
    /// the copies were ~15% of the write benchmark's CPU).
    pub(crate) fn send_and_build(&mut self) -> Result<()> {
        let mut batch = Engine::batch_with_capacity(self.writes.bytes());
        if self.source.is_some() {
            // A table's records are in its topic already.
            for (k, v) in self.writes.iter() {
                match v {
                    Some(v) => batch.put(k, v),
                    None => batch.delete(k),
                }
            }
            self.batch = Some(batch);
            return Ok(());
        }
        let header = self.schema_header.as_deref().map(|v| (schema::SCHEMA_HEADER, v));
        self.producer.send_all(&self.tracker, self.writes.iter(), (self.key_skip, header), |chunk| {
            for &(k, v) in chunk {
                match v {
                    Some(v) => batch.put(k, v),
                    None => batch.delete(k),
                }
            }
        })?;
        if let Some(update) = &self.segments {
            // After the data: a write into a segment that expired during
            // this commit is dropped with it.
            self.engine.add_segments_update(&mut batch, update);
        }
        self.batch = Some(batch);
        Ok(())
    }

    /// The task (input partition) this commit belongs to.
    pub(crate) fn partition(&self) -> i32 {
        self.tracker.partition
    }

    /// After the producer was flushed (and, under exactly-once, the
    /// transaction committed): checks that the records sent landed right
    /// after the checkpoint, then writes the sealed data and the new
    /// checkpoint (the offset of the last record) in one RocksDB batch.
    pub(crate) fn write(&mut self) -> Result<()> {
        if let Some(source) = self.source {
            // Written by others by definition: no check of who appended what.
            let batch = self.batch.take().expect("built before the write");
            self.engine.commit_bounded(batch, source.checkpoint, source.appended_after_ms)?;
            self.landed_checkpoint.store(source.checkpoint, Ordering::Release);
            return Ok(());
        }
        let acked = self.tracker.settle()?;
        let sent = self.writes.len() as i64;
        let ours = self.tracker.take_acked_count() as i64;
        let expected = self.previous.unwrap_or(-1) + sent;
        // At-least-once: only this store writes its changelog partition, so
        // our n records must be exactly the n offsets after the checkpoint.
        // Anything else means a foreign writer interleaved records we never
        // applied: committing would break "state == changelog prefix", so
        // stop instead (a restart restores what is there).
        // Exactly-once: transaction markers sit between commits, and a
        // fenced instance's aborted records may too; transactions (and the
        // group generation its offsets were sent under) keep anyone else's
        // records out of what `read_committed` restores, so ours only have
        // to follow the checkpoint.
        let landed_right = match self.producer.transactional() {
            false => acked == Some(expected),
            true => acked.is_some_and(|a| a >= expected),
        };
        if ours != sent || !landed_right {
            return Err(Error::ChangelogDiverged {
                topic: self.tracker.topic.clone(),
                partition: self.tracker.partition,
                expected,
                found: acked.unwrap_or(-1),
            });
        }
        let checkpoint = acked.unwrap_or(expected);
        let batch = self.batch.take().expect("built while sending");
        self.engine.commit_with_age_bound(batch, checkpoint, self.sealed_at_ms)?;
        self.landed_checkpoint.store(checkpoint, Ordering::Release);
        Ok(())
    }
}

impl std::fmt::Debug for KeyValueStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyValueStore")
            .field("name", &self.name)
            .field("partition", &self.partition)
            .field("checkpoint", &self.checkpoint)
            .field("uncommitted", &(self.overlay.len() + self.sealed.len()))
            .finish()
    }
}

impl KeyValueStore {
    /// Locks the directory and opens RocksDB. A corrupt database or
    /// checkpoint is wiped and reopened empty, with `open_problem` saying
    /// why; any other error (too many open files, no space, permissions) is
    /// returned, never a reason to delete state.
    /// In memory ([`EngineResources::in_memory`]): no lock, no seed.
    pub(crate) fn open(args: StoreOpenArgs<'_>) -> Result<KeyValueStore> {
        let no_files = args.resources.is_in_memory();
        let lock = if no_files { None } else { Some(DirLock::acquire(&args.dir, args.lock_timeout)?) };
        let db_dir = args.dir.join("db");
        let seeded = args.seed.filter(|_| !no_files && !args.backend.is_remote()).map(|seed| seed(&db_dir)).unwrap_or_default();
        let which = (args.backend, args.name, args.partition);
        let (engine, open_problem) = match Self::open_engine(&db_dir, args.resources, which) {
            Ok((e, refused_file)) => match e.checkpoint() {
                Ok(Checkpoint::Corrupt(why)) => {
                    drop(e);
                    (Self::reopen_empty(&db_dir, args.resources, which)?, Some((why, UNREADABLE)))
                }
                Ok(checkpoint) => match (layout_problem(&e, &checkpoint, args.segments)?, schema_problem(&e, &checkpoint, &args.schema)?) {
                    // Rebuilt from the changelog, whose keys have no segment.
                    (Some(why), _) => {
                        drop(e);
                        (Self::reopen_empty(&db_dir, args.resources, which)?, Some((why, "layout_changed")))
                    }
                    // Rebuilt from the changelog, converting its records.
                    (None, Some(why)) => {
                        drop(e);
                        (Self::reopen_empty(&db_dir, args.resources, which)?, Some((why, "schema_changed")))
                    }
                    (None, None) => (e, refused_file.map(|why| (why, UNREADABLE))),
                },
                Err(Error::RocksDb(err)) if err.is_corruption() => {
                    drop(e);
                    (Self::reopen_empty(&db_dir, args.resources, which)?, Some((format!("checkpoint unreadable: {err}"), UNREADABLE)))
                }
                Err(err) => return Err(err),
            },
            Err(Error::RocksDb(err)) if err.is_corruption() => (
                Self::reopen_empty(&db_dir, args.resources, which)?,
                Some((format!("local store unreadable: {err}"), UNREADABLE)),
            ),
            Err(err) => return Err(err),
        };
        let mut engine = engine;
        engine.set_schema_version(args.schema.version);
        let checkpoint = match engine.checkpoint()? {
            Checkpoint::At(c) => Some(c),
            _ => None,
        };
        let segments = match args.segments {
            Some((shape, retention)) => {
                let mut s = Segments::new(layout_of(shape), retention);
                s.reset(engine.segments()?.map_or(segments::NO_TIME, |r| r.time));
                Some(s)
            }
            None => None,
        };
        Ok(KeyValueStore {
            name: args.name.into(),
            partition: args.partition,
            tracker: args.producer.tracker(args.changelog_topic.clone(), args.partition),
            changelog_topic: args.changelog_topic,
            overlay: Overlay::default(),
            sealed: Arc::default(),
            recent: recent::Recent::new(args.resources.read_cache.clone()),
            producer: args.producer,
            max_record_bytes: args.max_record_bytes,
            tombstone_retention: args.tombstone_retention,
            checkpoint,
            landed_checkpoint: Arc::new(AtomicI64::new(-1)),
            metrics: StoreMetrics::new(args.name, args.partition),
            reported_tickers: Default::default(),
            open_problem,
            seeded,
            db_dir,
            resources: args.resources.clone(),
            ttl: args.ttl.map(|(ttl, domain)| Ttl::new(ttl, domain)),
            segments,
            shape: args.segments.map(|(shape, _)| shape),
            live_tail_retention: args.live_tail_retention,
            final_results: args.final_results,
            backend: args.backend,
            slot: args.published.map(|p| p.slot(args.name, args.partition)),
            engine: Some(Arc::new(engine)),
            schema: args.schema,
            source: None,
            _lock: lock,
        })
    }

    /// Makes the store readable by interactive queries as `role` (again,
    /// after a bulk load or a wipe withdrew it); nothing while it bulk loads.
    pub(crate) fn publish(&self, role: published::Role) {
        let Some(slot) = &self.slot else { return };
        if slot.is_published() {
            return slot.set_role(role);
        }
        let engine = self.engine.as_ref().expect("engine is open");
        if engine.is_bulk_loading() || engine.is_remote_follower() {
            // A standby's reader of a remote store answers no queries: it
            // sees what the owner flushed, not the changelog's position.
            // Readable once the bulk load ends; "restoring" meanwhile.
            slot.set_role(role);
            return;
        }
        slot.publish(engine.clone(), self.ttl.as_ref().map(Ttl::for_reads), role);
    }

    /// Makes the store unreadable by queries at once (it is being closed
    /// or handed to the closer).
    pub(crate) fn unpublish(&self) {
        if let Some(slot) = &self.slot {
            slot.retire();
        }
    }

    /// This store partition's query slot, if published.
    pub(crate) fn slot(&self) -> Option<&published::Slot> {
        self.slot.as_deref()
    }

    /// `<state_dir>/<application_id>`, the directory above the store's.
    pub(crate) fn app_dir(&self) -> Option<&Path> {
        // db_dir = <state_dir>/<application_id>/<store>/<partition>/db
        self.db_dir.ancestors().nth(3)
    }

    /// Opens the engine of store partition `(backend, store, partition)`.
    /// The second value says why an in-memory store's file was refused.
    fn open_engine(db_dir: &Path, res: &EngineResources, (backend, store, partition): (StoreBackend, &str, i32)) -> Result<(Engine, Option<String>)> {
        match backend {
            StoreBackend::InMemory => Engine::open_in_memory(db_dir, res, &format!("{store}/{partition}")),
            StoreBackend::RocksDb => Ok((Engine::open(db_dir, res)?, None)),
            StoreBackend::Remote => Ok((Engine::open_remote(db_dir, res, store, partition, false)?, None)),
            StoreBackend::RemoteFollower => Ok((Engine::open_remote(db_dir, res, store, partition, true)?, None)),
        }
    }

    /// Opens the store partition with nothing in it: its local files
    /// removed first, or (remote) every key of its database deleted.
    fn reopen_empty(db_dir: &Path, res: &EngineResources, which: (StoreBackend, &str, i32)) -> Result<Engine> {
        if !which.0.is_remote() {
            res.wipe(db_dir)?;
        }
        let engine = Self::open_engine(db_dir, res, which)?.0;
        engine.wipe_remote()?;
        Ok(engine)
    }

    pub(crate) fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("engine is open")
    }

    /// Exclusive access, for restore mode switches: only while no commit
    /// is in flight (the task manager waits for it before a store leaves
    /// the running state).
    pub(crate) fn engine_mut(&mut self) -> &mut Engine {
        self.forget_recent();
        if let Some(slot) = &self.slot {
            slot.withdraw_engine();
        }
        Arc::get_mut(self.engine.as_mut().expect("engine is open")).expect("no commit in flight")
    }

    /// Deletes all local state so a full restore can start from scratch.
    pub(crate) fn wipe(&mut self) -> Result<()> {
        self.overlay.clear();
        self.sealed = Arc::default();
        self.forget_recent();
        self.forget_source_progress();
        if let Some(slot) = &self.slot {
            slot.withdraw_engine();
        }
        drop(self.engine.take());
        let mut engine = Self::reopen_empty(&self.db_dir, &self.resources, (self.backend, &self.name, self.partition))?;
        engine.set_schema_version(self.schema.version);
        self.engine = Some(Arc::new(engine));
        self.checkpoint = None;
        if let Some(s) = &mut self.segments {
            s.reset(segments::NO_TIME);
        }
        Ok(())
    }

    /// The schema version its commits write, and the upgrade function.
    pub(crate) fn schema(&self) -> &schema::Schema {
        &self.schema
    }

    /// This store seen through key codec `K` and value codec `V` (for
    /// stores taken together with [`ProcessorContext::split`](crate::ProcessorContext::split)).
    pub fn typed<K: crate::codec::Codec, V: crate::codec::Codec>(&mut self) -> TypedStore<'_, K, V> {
        TypedStore::new(self)
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The partition this store belongs to.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The changelog topic this store writes to.
    pub fn changelog_topic(&self) -> &str {
        &self.changelog_topic
    }

    /// The changelog offset of the last write that is in RocksDB, if any
    /// (a commit whose write is still in flight does not count yet).
    pub fn checkpoint(&self) -> Option<i64> {
        self.checkpoint
    }

    pub(crate) fn set_checkpoint(&mut self, c: Option<i64>) {
        self.checkpoint = c;
    }

    /// Reads a key, seeing uncommitted writes.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.metrics.gets.increment(1);
        let stored = match self.overlay.get(key).or_else(|| self.sealed.get(key)) {
            Some(v) => v.map(<[u8]>::to_vec),
            None => match self.recent.get(key) {
                Some(v) => {
                    self.metrics.read_cache_hits.increment(1);
                    v.map(<[u8]>::to_vec)
                }
                None => self.engine().get(key)?,
            },
        };
        Ok(match (&self.ttl, stored) {
            (Some(ttl), Some(v)) => ttl.live(&v, ttl.read_time()).map(<[u8]>::to_vec),
            (_, stored) => stored,
        })
    }

    /// Writes a key. Fails with [`Error::RecordTooLarge`] before anything is
    /// written if the record would not fit the changelog topic.
    ///
    /// The write reaches the changelog at the next commit: only the latest
    /// write of each key since the previous commit is sent (as Kafka
    /// Streams' record cache does).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.check_writable()?;
        let stamped = match &self.ttl {
            Some(ttl) => Some(ttl.stamp(value).ok_or_else(|| {
                Error::InvalidUse(format!(
                    "store `{}` has a stream-time TTL and partition {} has no stream time yet (no record processed): a write now has no time to expire from",
                    self.name, self.partition
                ))
            })?),
            None => None,
        };
        let value = stamped.as_deref().unwrap_or(value);
        self.check_size(key.len() + value.len())?;
        self.overlay.write(key, Some(value));
        self.metrics.puts.increment(1);
        self.metrics.overlay_bytes.set(self.overlay.bytes() as f64);
        Ok(())
    }

    /// Deletes a key (a tombstone in the changelog). Deleting a missing key is fine.
    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.check_size(key.len())?;
        self.overlay.write(key, None);
        self.metrics.deletes.increment(1);
        self.metrics.overlay_bytes.set(self.overlay.bytes() as f64);
        Ok(())
    }

    fn check_size(&self, payload: usize) -> Result<()> {
        let size = payload + RECORD_OVERHEAD;
        if size > self.max_record_bytes {
            return Err(Error::RecordTooLarge {
                store: self.name.to_string(),
                size,
                limit: self.max_record_bytes,
            });
        }
        Ok(())
    }

    /// Entries with `from <= key < to`, in key order.
    pub fn range<'a>(&'a self, from: &[u8], to: &[u8]) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a {
        self.range_bounds(Bound::Included(from), Bound::Excluded(to))
    }

    /// Entries within arbitrary bounds, in key order.
    pub fn range_bounds<'a>(
        &'a self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a {
        let now = self.ttl.as_ref().and_then(Ttl::read_time);
        self.stored_range(start, end).filter_map(move |entry| match (&self.ttl, entry) {
            (Some(ttl), Ok((k, v))) => ttl.live(&v, now).map(|live| Ok((k, live.to_vec()))),
            (_, entry) => Some(entry),
        })
    }

    /// Entries within bounds as stored (TTL stamps included, expired ones too).
    fn stored_range<'a>(
        &'a self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a {
        let overlays = layered(self.overlay.range(start, end), self.sealed.range(start, end));
        MergeIter::new(overlays, self.engine().scan(start, end))
    }

    /// The largest changelog record (key + value + overhead) the store writes.
    pub(crate) fn max_record_bytes(&self) -> usize {
        self.max_record_bytes
    }

    /// Whether the store has a TTL.
    pub(crate) fn has_ttl(&self) -> bool {
        self.ttl.is_some()
    }

    /// A stream-time TTL follows this clock (the task's stream time).
    pub(crate) fn follow_stream_clock(&mut self, clock: &Arc<AtomicI64>) {
        if let Some(ttl) = &mut self.ttl {
            ttl.follow(clock.clone());
            if let Some(slot) = &self.slot {
                // Readers follow the same clock from now on.
                slot.withdraw_engine();
                self.publish(slot.role());
            }
        }
    }

    /// The next step of the TTL sweep: reads up to `budget` entries from
    /// where the last step stopped (wrapping at the end) and deletes the
    /// expired ones, so that their tombstones go out with the next commit.
    /// Returns how many it deleted.
    pub(crate) fn sweep_expired(&mut self, budget: usize) -> Result<u64> {
        let Some(ttl) = &self.ttl else { return Ok(0) };
        let now = ttl.read_time();
        if now.is_none() {
            return Ok(0);
        }
        let from = ttl.cursor().to_vec();
        let (mut expired, mut last, mut read) = (Vec::new(), None, 0);
        for entry in self.stored_range(Bound::Included(&from), Bound::Unbounded).take(budget) {
            let (k, v) = entry?;
            read += 1;
            if ttl.live(&v, now).is_none() {
                expired.push(k.clone());
            }
            last = Some(k);
        }
        let next = match last {
            Some(mut k) if read == budget => {
                k.push(0);
                k
            }
            _ => Vec::new(), // the end: start over
        };
        self.ttl.as_mut().expect("checked").set_cursor(next);
        for k in &expired {
            self.delete(k)?;
        }
        self.metrics.expired.increment(expired.len() as u64);
        Ok(expired.len() as u64)
    }

    /// Every entry whose key starts with `prefix`, in key order.
    pub fn prefix_scan<'a>(&'a self, prefix: &[u8]) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a {
        let end = prefix_successor(prefix);
        let end_bound = match &end {
            Some(e) => Bound::Excluded(e.as_slice()),
            None => Bound::Unbounded,
        };
        self.range_bounds(Bound::Included(prefix), end_bound)
    }

    /// Every entry, in key order.
    pub fn all(&self) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + '_ {
        self.range_bounds(Bound::Unbounded, Bound::Unbounded)
    }

    /// RocksDB's estimate of the number of keys, plus uncommitted new keys.
    /// Cheap, and approximate by design (deletes and overwrites are counted
    /// until compaction).
    pub fn approximate_num_entries(&self) -> u64 {
        self.engine().property("rocksdb.estimate-num-keys").unwrap_or(0)
            + (self.overlay.len() + self.sealed.len()) as u64
    }

    /// Bytes held by uncommitted writes (including those of a commit in flight).
    pub fn uncommitted_bytes(&self) -> usize {
        self.overlay.bytes() + self.sealed.bytes()
    }

    /// Step 1 of a commit: hands the overlay to a [`SealedCommit`] that
    /// sends it to the changelog and writes it to RocksDB. The writes stay
    /// readable (as the sealed layer) until
    /// [`commit_landed`](Self::commit_landed). `None` if there is nothing
    /// to write.
    pub(crate) fn seal(&mut self) -> Result<Option<SealedCommit>> {
        if !self.sealed.is_empty() {
            // A commit whose write did not land (its error stopped the
            // runtime): sealing again would hide its writes from reads and
            // check the changelog against a stale checkpoint.
            return Err(Error::Restore {
                topic: self.changelog_topic.clone(),
                partition: self.partition,
                detail: "a previous commit of this store did not land".into(),
            });
        }
        let sealed_at_ms = crate::store::engine::now_ms();
        let source = self.source_checkpoint(sealed_at_ms);
        if self.overlay.is_empty() && source.is_none() {
            return Ok(None);
        }
        self.sealed = Arc::new(std::mem::take(&mut self.overlay));
        self.landed_checkpoint.store(-1, Ordering::Release);
        self.metrics.overlay_bytes.set(0.0);
        let (segments, key_skip) = match &mut self.segments {
            Some(s) => {
                let update = s.take_update();
                self.metrics.segments_dropped.increment(update.dropped);
                let live = s.live_segments();
                self.metrics.segments.set(live.end().saturating_sub(*live.start()).saturating_add(1).max(0) as f64);
                if s.time() != segments::NO_TIME {
                    self.metrics.oldest_live.set(s.oldest_live() as f64);
                }
                (Some(update), segments::TIME)
            }
            None => (None, 0),
        };
        Ok(Some(SealedCommit {
            segments,
            key_skip,
            engine: self.engine.clone().expect("engine is open"),
            writes: self.sealed.clone(),
            producer: self.producer.clone(),
            tracker: self.tracker.clone(),
            previous: self.checkpoint,
            sealed_at_ms,
            landed_checkpoint: self.landed_checkpoint.clone(),
            batch: None,
            schema_header: self.schema.header(),
            source,
        }))
    }

    /// The sealed writes are in RocksDB: stop reading them from the sealed
    /// layer (the read cache keeps a copy). Returns them, so that the
    /// caller can free them off the processing thread.
    pub(crate) fn commit_landed(&mut self) -> Arc<Overlay> {
        let landed = self.landed_checkpoint.swap(-1, Ordering::AcqRel);
        if landed >= 0 {
            self.checkpoint = Some(landed);
            if let Some(s) = &mut self.segments {
                s.landed();
            }
        }
        let writes = std::mem::take(&mut self.sealed);
        self.remember_landed(&writes, landed >= 0);
        writes
    }

    /// Drops uncommitted writes; local state stays at the last checkpoint.
    pub(crate) fn discard_uncommitted(&mut self) {
        let writes = self.overlay.len() + self.sealed.len();
        if writes > 0 {
            tracing::warn!(store = %self.name, partition = self.partition, writes,
                "discarding uncommitted writes; they will be replayed from the changelog or reprocessed");
        }
        self.overlay.clear();
        self.sealed = Arc::default();
        // Its commit may have landed unseen by the cache.
        self.forget_recent();
        let landed = self.landed_checkpoint.swap(-1, Ordering::AcqRel) >= 0;
        if let Some(s) = &mut self.segments {
            if landed {
                s.landed();
            }
            s.rewind();
        }
        self.metrics.overlay_bytes.set(0.0);
    }

    /// An otherwise empty batch with a segmented store's bookkeeping (its
    /// time and layout, with every checkpoint a restore writes, so that
    /// the next open finds them even when no data record was applied).
    pub(crate) fn segments_batch(&mut self) -> engine::Batch {
        let mut batch = Engine::batch();
        let update = self.segments.as_mut().map(|segments| {
            let update = segments.take_update();
            segments.landed();
            update
        });
        if let Some(update) = update {
            self.engine().add_segments_update(&mut batch, &update);
        }
        batch
    }

    /// Publishes RocksDB's sizes, compaction and cache figures.
    pub(crate) fn record_engine_metrics(&self) {
        let e = self.engine();
        let m = &self.metrics;
        let stats = e.data_stats();
        let tickers = e.tickers();
        m.rocksdb_keys.set(stats.keys as f64);
        m.logical_bytes.set(stats.logical_bytes as f64);
        m.physical_bytes.set(stats.physical_bytes as f64);
        m.rocksdb_pending_compaction.set(stats.pending_compaction_bytes as f64);
        m.rocksdb_live_sst.set(stats.sst_bytes as f64);
        if let Some(v) = e.property("rocksdb.block-cache-usage") {
            m.rocksdb_block_cache.set(v as f64);
        }
        // Counters only grow (the facade's `absolute` keeps the maximum):
        // publish what moved since the last call.
        let mut reported = self.reported_tickers.lock().expect("tickers lock");
        let moved = tickers.since(*reported);
        *reported = tickers;
        m.write_stalls.increment(moved.write_stalls);
        m.write_stall_micros.increment(moved.stall_micros);
        m.block_cache_hits.increment(moved.block_cache_hits);
        m.block_cache_misses.increment(moved.block_cache_misses);
    }
}

/// How a store of `shape` lays out its keys.
pub(crate) fn layout_of(shape: Shape) -> Layout {
    match shape {
        Shape::Window(_) => Layout::Window,
        Shape::Session(_) => Layout::Session,
    }
}

/// The `reason` of a full restore for a store RocksDB could not read.
const UNREADABLE: &str = "local_store_unreadable";

/// Why local data cannot be read with the store's definition: a window or
/// session store whose segment interval changed (its retention did), or
/// data written under another layout (a key-value store redefined as a
/// window store, or back).
/// Why local state of another schema version cannot be kept (it is
/// rebuilt from the changelog, converting or refusing its records).
fn schema_problem(engine: &Engine, checkpoint: &Checkpoint, schema: &schema::Schema) -> Result<Option<String>> {
    if !matches!(checkpoint, Checkpoint::At(_)) {
        return Ok(None);
    }
    let recorded = engine.recorded_schema_version()?;
    Ok((recorded != schema.version).then(|| format!("the local state has schema version {recorded}, this code {}", schema.version)))
}

fn layout_problem(engine: &Engine, checkpoint: &Checkpoint, wanted: Option<(Shape, Duration)>) -> Result<Option<String>> {
    let recorded = engine.segments()?;
    Ok(match (wanted, recorded) {
        (Some((shape, retention)), Some(crate::store::engine::RecordedSegments { interval, layout, retention: was, .. })) => {
            let want = Segments::new(layout_of(shape), retention);
            if layout != want.layout.byte() {
                Some(format!("the local data was written as a {} store", if layout == b'w' { "window" } else { "session" }))
            } else if interval != want.interval || was != want.retention {
                // A longer retention needs windows already dropped here; a
                // shorter one other segments: rebuilt from the changelog.
                Some(format!(
                    "the store's retention changed from {was} ms to {} ms (segments of {interval} ms, now {} ms)",
                    want.retention, want.interval
                ))
            } else {
                None
            }
        }
        (Some(_), None) if matches!(checkpoint, Checkpoint::At(_)) => {
            Some("the local data was not written as a window or session store".into())
        }
        (None, Some(_)) => Some("the local data was written as a window or session store".into()),
        _ => None,
    })
}

/// A key's first 8 bytes, zero-padded, as a big-endian number: ordered as
/// the keys are wherever they differ there (padding sorts before every
/// byte), so that most key comparisons can be one integer compare (the
/// overlay, restore batches, timers in memory).
pub(crate) fn key_prefix(key: &[u8]) -> u64 {
    let mut p = [0u8; 8];
    let n = key.len().min(8);
    p[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(p)
}

/// The smallest key greater than every key starting with `prefix`, if any.
pub(crate) fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::prefix_successor;

    #[test]
    fn prefix_successor_carries_over_ff() {
        assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_successor(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_successor(&[0xff, 0xff]), None);
        assert_eq!(prefix_successor(b""), None);
    }
}
