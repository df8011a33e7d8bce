//! The engine under one store partition: RocksDB, the in-memory maps of
//! [`heap`] for a store defined `in_memory()`, or a database in object
//! storage ([`remote`]) for a store defined `remote()`.
//!
//! One RocksDB instance per (store, partition) with two column families:
//! `default` holds the store's data, `kstate_meta` holds the changelog
//! checkpoint. Data and checkpoint are only ever written together in one
//! `WriteBatch`, so the database always reflects exactly the changelog prefix
//! `[0, checkpoint]` (docs/architecture.md §1).
//!
//! Every write skips RocksDB's WAL: the changelog is the log. `atomic_flush`
//! keeps both column families flushed together, so a crash (which loses the
//! memtables) leaves the database at its last flush, itself a consistent
//! prefix with its own checkpoint; the restore replays the changelog from
//! there. Flushes happen when a memtable fills, at least every
//! [`FLUSH_AT_LEAST_EVERY`] while a store commits, at the end of a restore
//! ([`Engine::finish_bulk_load`]) and when a store closes.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, FlushOptions, MemtableFactory, Options, WriteBatch, WriteBufferManager, WriteOptions, DB};

use crate::error::{Error, Result};

#[cfg(feature = "remote")]
mod counted;
mod heap;
mod ingest;
mod readonly;
#[cfg(feature = "remote")]
pub(crate) mod remote;
#[cfg(not(feature = "remote"))]
#[path = "engine/remote_off.rs"]
pub(crate) mod remote;
mod remote_dispatch;
use remote_dispatch::remote_writes;
mod stats;
mod view;

pub(crate) use ingest::TableFile;
pub(crate) use heap::{decode as decode_heap_file, HeapBudget, ENTRY_OVERHEAD as HEAP_ENTRY_OVERHEAD, FILE as HEAP_FILE};
pub(crate) use stats::{DataStats, Tickers};
pub(crate) use view::{Batch, SnapshotRead};
use view::scan_options;
pub(crate) use readonly::{read_checkpoint_hint, remove_checkpoint_hint, write_checkpoint_hint, ReadOnlyDb, CHECKPOINT_HINT};

const META_CF: &str = "kstate_meta";
const CHECKPOINT_KEY: &[u8] = b"changelog.checkpoint";
/// Milliseconds since the epoch before which no changelog record past the
/// checkpoint was appended (see [`Engine::commit_with_age_bound`]).
const APPENDED_AFTER_KEY: &[u8] = b"changelog.checkpoint.appended_after_ms";
/// The id of the changelog topic the local state came from (see
/// [`crate::topic_id`]).
const TOPIC_ID_KEY: &[u8] = b"changelog.topic_id";
/// A window or session store's segment interval and time (two i64s,
/// big-endian), layout (`w` or `s`) and retention (i64; see
/// `store/segments.rs`).
pub(crate) const SEGMENTS_KEY: &[u8] = b"segments.interval_and_time";
/// The schema version of the values (absent: 1), written with every
/// commit of a store at another version (architecture.md §11).
const SCHEMA_KEY: &[u8] = b"schema.version";
/// In front of each key a restore refused (`Engine::refused_keys`).
const REFUSED_PREFIX: &[u8] = b"schema.refused/";
/// L0 files after a restore from which it compacts before going live
/// (below RocksDB's default level0_slowdown_writes_trigger of 20).
const L0_COMPACT_AFTER_RESTORE: u64 = 16;

/// What the meta column family says about the changelog position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Checkpoint {
    /// Nothing committed yet (a new store).
    None,
    /// The offset of the last changelog record reflected in the data.
    At(i64),
    /// The stored checkpoint is unreadable.
    Corrupt(String),
}

fn meta_cf(db: &DB) -> &rocksdb::ColumnFamily {
    db.cf_handle(META_CF).expect("opened with the meta column family")
}

fn decode_i64(value: Option<Vec<u8>>) -> Option<i64> {
    value.and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok()).map(i64::from_be_bytes)
}

/// What object storage holds of a remote store partition (read without
/// fencing its writer): its data in key order, its checkpoint and, for a
/// window or session store, its recorded segments.
#[derive(Debug, Clone, Default)]
pub(crate) struct Durable {
    pub(crate) entries: Vec<(Vec<u8>, Vec<u8>)>,
    pub(crate) checkpoint: Option<i64>,
    pub(crate) segments: Option<RecordedSegments>,
}

/// What a segmented store recorded with its last commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordedSegments {
    pub(crate) interval: i64,
    pub(crate) time: i64,
    /// [`Layout::byte`](crate::store::segments::Layout::byte).
    pub(crate) layout: u8,
    pub(crate) retention: i64,
}

pub(crate) fn decode_segments(value: Option<Vec<u8>>) -> Option<RecordedSegments> {
    let int = |b: &[u8]| Some(i64::from_be_bytes(b.try_into().ok()?));
    value.and_then(|v| {
        Some(RecordedSegments { interval: int(v.get(..8)?)?, time: int(v.get(8..16)?)?, layout: *v.get(16)?, retention: int(v.get(17..25)?)? })
    })
}

fn decode_topic_id(value: Option<Vec<u8>>) -> Option<String> {
    value.map(|v| String::from_utf8_lossy(&v).into_owned())
}

fn decode_checkpoint(value: Option<Vec<u8>>) -> Checkpoint {
    match value {
        None => Checkpoint::None,
        Some(v) => match <[u8; 8]>::try_from(v.as_slice()) {
            Ok(b) if i64::from_be_bytes(b) >= 0 => Checkpoint::At(i64::from_be_bytes(b)),
            _ => Checkpoint::Corrupt(format!("checkpoint value {v:02x?} is not an offset")),
        },
    }
}

/// The entries of a scan, in key order (either backend).
pub(crate) type Scan<'a> = Box<dyn Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a>;

/// Tuning shared by every engine of one runtime.
#[derive(Clone)]
pub(crate) struct EngineResources {
    pub(crate) block_cache: Cache,
    pub(crate) write_buffer_bytes: usize,
    /// With `max_state_memory`: every memtable is charged to the block
    /// cache, so that the cache's capacity bounds blocks, index and filter
    /// blocks and memtables of every store together.
    write_buffer_manager: Option<WriteBufferManager>,
    /// RocksDB's in-memory environment (the test driver's stores): no
    /// file is read or written, and no state dir file beside a database
    /// either.
    memory: Option<rocksdb::Env>,
    /// Whether each database keeps RocksDB statistics (the block-cache
    /// and stall tickers): they cost about 70 KiB per CPU (at least 8) per
    /// store partition, allocated and zeroed when it opens (docs/architecture.md §16).
    pub(crate) statistics: bool,
    /// Every in-memory store partition's bytes, against `max_state_memory`.
    pub(crate) heap_budget: Arc<HeapBudget>,
    /// How often an in-memory store that commits saves its file.
    pub(crate) heap_save_every: Duration,
    /// The bytes every store partition's read cache holds together.
    pub(crate) read_cache: Arc<crate::store::recent::Budget>,
    /// The object store, runtime and cache of remote stores, if any.
    pub(crate) remote: Option<Arc<remote::RemoteState>>,
}

impl EngineResources {
    pub(crate) fn new(block_cache_bytes: usize, write_buffer_bytes: usize) -> Self {
        EngineResources {
            block_cache: Cache::new_lru_cache(block_cache_bytes),
            write_buffer_bytes,
            write_buffer_manager: None,
            memory: None,
            statistics: false,
            heap_budget: Arc::default(),
            heap_save_every: FLUSH_AT_LEAST_EVERY,
            read_cache: Arc::default(),
            remote: None,
        }
    }

    /// In-memory stores save their files at least every `every` while they commit.
    pub(crate) fn with_heap_save_every(self, every: Duration) -> Self {
        EngineResources { heap_save_every: every, ..self }
    }

    /// Every store partition's read cache together holds at most `bytes`.
    pub(crate) fn with_read_cache(self, bytes: usize) -> Self {
        EngineResources { read_cache: Arc::new(crate::store::recent::Budget::new(bytes)), ..self }
    }

    /// Remote stores open their databases through `remote`.
    pub(crate) fn with_remote(self, remote: Option<Arc<remote::RemoteState>>) -> Self {
        EngineResources { remote, ..self }
    }

    /// With `on`: each database keeps RocksDB's tickers (see `statistics`).
    pub(crate) fn with_statistics(self, on: bool) -> Self {
        EngineResources { statistics: on, ..self }
    }

    /// Databases in one in-memory environment of their own: paths name
    /// them, and they live as long as the environment (as long as these
    /// resources or a database opened with them).
    pub(crate) fn in_memory(block_cache_bytes: usize, write_buffer_bytes: usize) -> Result<Self> {
        let env = rocksdb::Env::mem_env()?;
        Ok(EngineResources { memory: Some(env), ..Self::new(block_cache_bytes, write_buffer_bytes) })
    }

    /// Whether databases live in memory.
    pub(crate) fn is_in_memory(&self) -> bool {
        self.memory.is_some()
    }

    /// Removes the (closed) database at `path`: its files, or its
    /// in-memory copy.
    pub(crate) fn wipe(&self, path: &Path) -> Result<()> {
        let Some(env) = &self.memory else { return Engine::wipe(path) };
        let mut options = Options::default();
        options.set_env(env);
        Ok(DB::destroy(&options, path)?)
    }

    /// With `max_state_memory`: memtable bytes over the manager's limit (0
    /// when within it, or without a bound).
    pub(crate) fn memtable_excess(&self) -> usize {
        self.write_buffer_manager.as_ref().map_or(0, |m| m.get_usage().saturating_sub(m.get_buffer_size()))
    }

    /// One bound for all of RocksDB's memory in this instance: a cache of
    /// `total` bytes that memtables are charged to (up to half of it). Past
    /// that, RocksDB flushes only the database being written to, which
    /// neither keeps up with hundreds of stores nor reaches an idle one: the
    /// task manager flushes the largest memtables itself and holds records
    /// back meanwhile ([`EngineResources::memtable_excess`]). RocksDB's own
    /// write stall is off: with hundreds of databases sharing the manager, a
    /// stalled writer waits for flushes that only writes to the other
    /// databases would start (the first test run hung).
    pub(crate) fn bounded(total: usize, write_buffer_bytes: usize) -> Self {
        let block_cache = Cache::new_lru_cache(total);
        let cache = block_cache.clone();
        let manager = WriteBufferManager::new_write_buffer_manager_with_cache(total / 2, false, block_cache.clone());
        EngineResources {
            block_cache,
            write_buffer_bytes: write_buffer_bytes.min(total / 4),
            write_buffer_manager: Some(manager),
            memory: None,
            statistics: false,
            heap_budget: Arc::new(HeapBudget::new(Some(total)).sharing(cache)),
            heap_save_every: FLUSH_AT_LEAST_EVERY,
            read_cache: Arc::default(),
            remote: None,
        }
    }
}

/// One store partition's RocksDB instance, or its in-memory maps.
pub(crate) struct Engine {
    /// RocksDB: always `Some` outside of [`Engine::reopen`].
    db: Option<DB>,
    /// In memory: `Some` (and `db` is `None`).
    heap: Option<heap::Heap>,
    /// In object storage: `Some` (and `db` is `None`).
    remote: Option<remote::RemoteDb>,
    path: PathBuf,
    resources: EngineResources,
    bulk_loading: bool,
    /// When a flush was last asked for (see [`FLUSH_AT_LEAST_EVERY`]).
    last_flush: Mutex<Instant>,
    /// The options the database was opened with: they hold its RocksDB
    /// statistics (tickers).
    options: Options,
    /// Ticker counts of the databases closed by [`Engine::reopen`], so the
    /// counters only grow.
    carried: Tickers,
    /// The schema version commits record.
    schema_version: u32,
}

/// Wall-clock milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The longest a store goes without a flush while it commits.
///
/// Commits skip the WAL, so a crash loses the memtables: the store reopens
/// at its last flush and the restore replays the changelog from there. That
/// must not reach back too far: the broker drops a compacted changelog's
/// tombstones `delete.retention.ms` (default 24 h) after cleaning them, and
/// a replay that starts before a dropped tombstone brings its key back. A
/// store that commits but rarely fills a memtable would otherwise keep an
/// old flush for as long as it runs.
pub(crate) const FLUSH_AT_LEAST_EVERY: Duration = Duration::from_secs(60);

impl Engine {
    /// Opens (or creates) the database at `path`.
    pub(crate) fn open(path: &Path, res: &EngineResources) -> Result<Engine> {
        // The hint describes the database as last closed; from now on it
        // changes (or is wiped), so the hint goes until the next close.
        if let Some(store_dir) = path.parent().filter(|_| res.memory.is_none()) {
            remove_checkpoint_hint(store_dir)?;
        }
        if res.memory.is_none() && path.join(heap::FILE).exists() {
            // The store was in memory until this start: rebuilt from the changelog.
            tracing::info!(dir = %path.display(), "store is on RocksDB now; removing its in-memory file");
            Self::wipe(path)?;
        }
        if res.memory.is_none() {
            ingest::remove_leftovers(path)?;
        }
        let (db, options) = Self::open_db(path, res, false)?;
        Ok(Self::new(path, res, (Some(db), None), options))
    }

    /// A newly opened engine on `backend` (RocksDB or the in-memory maps).
    fn new(path: &Path, res: &EngineResources, (db, heap): (Option<DB>, Option<heap::Heap>), options: Options) -> Engine {
        Engine {
            db,
            heap,
            remote: None,
            path: path.to_path_buf(),
            resources: res.clone(),
            bulk_loading: false,
            last_flush: Mutex::new(Instant::now()),
            options,
            carried: Tickers::default(),
            schema_version: 1,
        }
    }

    /// Opens (or creates) an in-memory store partition whose file lives at
    /// `path` (`identity`: `store/partition`, checked against the file's).
    /// The second value says why a file there was refused (the store then
    /// opens empty and is restored in full).
    pub(crate) fn open_in_memory(path: &Path, res: &EngineResources, identity: &str) -> Result<(Engine, Option<String>)> {
        let dir = res.memory.is_none().then_some(path);
        if let Some(store_dir) = dir.and_then(Path::parent) {
            remove_checkpoint_hint(store_dir)?;
        }
        let (heap, problem) = heap::Heap::open(dir, identity, res.heap_budget.clone())?;
        Ok((Self::new(path, res, (None, Some(heap)), Options::default()), problem))
    }

    /// Opens RocksDB; `bulk` selects the restore tuning: a vector memtable
    /// (appends instead of skiplist inserts; sorted once at flush, which is
    /// RocksDB's own bulk-load advice), uncompressed flushes and no
    /// auto-compaction. Measured on 2M records: +15% (vector), +10% (no
    /// compression); see BENCHMARKS.md.
    fn open_db(path: &Path, res: &EngineResources, bulk: bool) -> Result<(DB, Options)> {
        let cf_opts = Self::data_options(res, bulk);
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_atomic_flush(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_keep_log_file_num(2);
        if res.statistics {
            // Tickers only (block-cache hits, stall time): no timers, no
            // histograms (whose memory is allocated all the same).
            db_opts.enable_statistics();
            db_opts.set_statistics_level(rocksdb::statistics::StatsLevel::ExceptHistogramOrTimers);
        }
        if let Some(manager) = &res.write_buffer_manager {
            db_opts.set_write_buffer_manager(manager);
        }
        if let Some(env) = &res.memory {
            db_opts.set_env(env);
        }

        // The meta column family holds a few keys (the checkpoint): a small
        // memtable, not RocksDB's default 64 MiB (whose arena blocks would
        // count against `max_state_memory` per store partition).
        let mut meta_opts = Options::default();
        meta_opts.set_write_buffer_size(256 << 10);
        let cfs = vec![
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, cf_opts),
            ColumnFamilyDescriptor::new(META_CF, meta_opts),
        ];
        let db = DB::open_cf_descriptors(&db_opts, path, cfs)?;
        Ok((db, db_opts))
    }

    /// The options of the data column family (see [`Engine::open_db`]).
    fn data_options(res: &EngineResources, bulk: bool) -> Options {
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&res.block_cache);
        table.set_cache_index_and_filter_blocks(true);
        table.set_bloom_filter(10.0, false);
        let mut cf_opts = Options::default();
        cf_opts.set_block_based_table_factory(&table);
        cf_opts.set_write_buffer_size(res.write_buffer_bytes);
        // L0 and the level L0 compacts into hold the newest, most rewritten
        // data (with dynamic level sizes, a small store's only level): leave
        // them uncompressed, as Kafka Streams leaves every level, and
        // compress the deeper levels where most of a large store lives.
        // Measured: +5% write throughput at 5M records (BENCHMARKS.md).
        use rocksdb::DBCompressionType::{Lz4, None as Plain};
        cf_opts.set_compression_per_level(&[Plain, Plain, Lz4, Lz4, Lz4, Lz4, Lz4]);
        if bulk {
            cf_opts.set_memtable_factory(MemtableFactory::Vector);
            cf_opts.set_disable_auto_compactions(true);
            // Flushes during a restore compete with it for CPU; their files
            // are compressed later, when compaction rewrites them.
            cf_opts.set_compression_per_level(&[Plain; 7]);
        }
        cf_opts
    }

    fn db(&self) -> &DB {
        self.db.as_ref().expect("database is open")
    }

    /// Closes and reopens the database with bulk-load tuning on or off.
    fn reopen(&mut self, bulk: bool) -> Result<()> {
        self.flush()?;
        self.carried = self.tickers();
        drop(self.db.take());
        let (db, options) = Self::open_db(&self.path, &self.resources, bulk)?;
        self.db = Some(db);
        self.options = options;
        Ok(())
    }

    /// Removes every file of the database at `path`.
    pub(crate) fn wipe(path: &Path) -> Result<()> {
        match std::fs::remove_dir_all(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    fn meta(&self) -> &rocksdb::ColumnFamily {
        meta_cf(self.db())
    }

    /// Reads the changelog checkpoint.
    pub(crate) fn checkpoint(&self) -> Result<Checkpoint> {
        Ok(decode_checkpoint(self.meta_get(CHECKPOINT_KEY)?))
    }

    /// A segmented store's recorded segment interval and time, if any.
    pub(crate) fn segments(&self) -> Result<Option<RecordedSegments>> {
        Ok(decode_segments(self.meta_get(SEGMENTS_KEY)?))
    }

    /// Adds a segmented store's bookkeeping to a commit's batch: its
    /// interval and time, and the range deletion of expired segments.
    pub(crate) fn add_segments_update(&self, batch: &mut Batch, update: &crate::store::segments::SegmentsUpdate) {
        if let Some((from, to)) = &update.drop {
            batch.ranges.push((from.to_vec(), to.to_vec()));
        }
        let value = [&update.interval.to_be_bytes()[..], &update.time.to_be_bytes(), &[update.layout.byte()], &update.retention.to_be_bytes()].concat();
        batch.meta.push((SEGMENTS_KEY.to_vec(), Some(value)));
    }

    /// Reads one key from the data.
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(heap) = &self.heap {
            return Ok(heap.read().get(key).map(<[u8]>::to_vec));
        }
        if let Some(r) = &self.remote {
            return r.get(remote::DATA, key);
        }
        Ok(self.db().get_pinned(key)?.map(|v| v.to_vec()))
    }

    /// Runs `read` on one RocksDB snapshot and returns its result with the
    /// snapshot's checkpoint: a reader on another thread sees one committed
    /// state at an exact changelog offset, never half a commit
    /// (architecture.md §8).
    /// In memory: under the read lock, which commits wait for; `read` must
    /// not call back into the engine (a second read lock could wait behind
    /// a waiting commit).
    pub(crate) fn committed<T>(&self, read: impl FnOnce(&SnapshotRead<'_>) -> Result<T>) -> Result<(T, Checkpoint)> {
        let view = match (&self.heap, &self.remote) {
            (Some(heap), _) => SnapshotRead::Heap(heap.read()),
            (None, Some(r)) => SnapshotRead::Remote { snapshot: r.snapshot()?, db: r },
            (None, None) => SnapshotRead::Rocks { snapshot: self.db().snapshot(), meta: self.meta() },
        };
        let checkpoint = decode_checkpoint(view.meta_get(CHECKPOINT_KEY)?);
        Ok((read(&view)?, checkpoint))
    }

    /// Iterates the data over `[start, end)` bounds in key order.
    pub(crate) fn scan(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Scan<'_> {
        if let Some(heap) = &self.heap {
            return Box::new(heap.scan(start, end));
        }
        if let Some(r) = &self.remote {
            return Box::new(r.scan(None, remote::DATA, start, end));
        }
        let (mode, ro, skip) = scan_options(start, end);
        Box::new(
            self.db()
                .iterator_opt(mode, ro)
                .filter(move |r| match (r, &skip) {
                    (Ok((k, _)), Some(s)) => k.as_ref() != s.as_slice(),
                    _ => true,
                })
                .map(|r| r.map(|(k, v)| (k.into_vec(), v.into_vec())).map_err(Error::from)),
        )
    }

    /// Starts a batch of writes; apply it with [`Engine::commit_bounded`].
    pub(crate) fn batch() -> Batch {
        Batch::from(WriteBatch::default())
    }

    /// An empty batch with room for about `data_bytes` of keys and values
    /// (growing a batch copies it each time it doubles).
    pub(crate) fn batch_with_capacity(data_bytes: usize) -> Batch {
        Batch::from(WriteBatch::with_capacity_bytes(data_bytes + data_bytes / 8 + 64))
    }

    /// Writes `batch` plus the new checkpoint atomically, without RocksDB's
    /// write-ahead log; with `appended_after_ms`, also records that every
    /// changelog record past `checkpoint` was appended at or after it (ms
    /// since the epoch). A store whose bound is older than the changelog's
    /// `delete.retention.ms` may have missed tombstones the broker dropped
    /// meanwhile and is restored in full (see the restore's `begin`).
    /// Commits without a bound keep the previous one, which stays true for
    /// any later checkpoint.
    ///
    /// The changelog is the log: a crash loses the memtables, and RocksDB
    /// reopens at its last flush, which (flushes are atomic across both
    /// column families) is some earlier commit with its own checkpoint; the
    /// restore replays the changelog from there. Kafka Streams disables the
    /// WAL for the same reason. Measured: +7% write throughput at 5M
    /// records (+17% in an earlier build; BENCHMARKS.md). Every write skips
    /// the WAL, so no logged write can be recovered on top of a lost
    /// unlogged one.
    ///
    /// A store whose memtables rarely fill is flushed (in the background)
    /// at least every [`FLUSH_AT_LEAST_EVERY`], so that a crash never sends
    /// the restore back further than that.
    pub(crate) fn commit_bounded(&self, mut batch: Batch, checkpoint: i64, appended_after_ms: Option<i64>) -> Result<()> {
        batch.meta.push((CHECKPOINT_KEY.to_vec(), Some(checkpoint.to_be_bytes().to_vec())));
        if self.schema_version != 1 {
            batch.meta.push((SCHEMA_KEY.to_vec(), Some(self.schema_version.to_be_bytes().to_vec())));
        }
        if let Some(ms) = appended_after_ms {
            batch.meta.push((APPENDED_AFTER_KEY.to_vec(), Some(ms.to_be_bytes().to_vec())));
        }
        self.write_batch(batch)?;
        if !self.bulk_loading && self.last_flush().elapsed() >= self.flush_every() {
            self.flush_opt(false)?;
        }
        Ok(())
    }

    /// [`Engine::commit_bounded`] without a bound.
    #[cfg(test)]
    pub(crate) fn commit(&self, batch: Batch, checkpoint: i64) -> Result<()> {
        self.commit_bounded(batch, checkpoint, None)
    }

    /// [`Engine::commit_bounded`] with a bound.
    pub(crate) fn commit_with_age_bound(&self, batch: Batch, checkpoint: i64, appended_after_ms: i64) -> Result<()> {
        self.commit_bounded(batch, checkpoint, Some(appended_after_ms))
    }

    /// The bound recorded by [`Engine::commit_with_age_bound`], if any.
    pub(crate) fn appended_after_ms(&self) -> Result<Option<i64>> {
        Ok(decode_i64(self.meta_get(APPENDED_AFTER_KEY)?))
    }

    /// The changelog topic id recorded by [`Engine::set_changelog_topic_id`].
    pub(crate) fn changelog_topic_id(&self) -> Result<Option<String>> {
        Ok(decode_topic_id(self.meta_get(TOPIC_ID_KEY)?))
    }

    /// The schema version of the data committed (1 if none was recorded).
    pub(crate) fn recorded_schema_version(&self) -> Result<u32> {
        Ok(self.meta_get(SCHEMA_KEY)?.and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok()).map_or(1, u32::from_be_bytes))
    }

    /// The schema version later commits record.
    pub(crate) fn set_schema_version(&mut self, version: u32) {
        self.schema_version = version;
    }

    /// Keys a restore refused (their latest changelog record is of another
    /// schema version; `store::schema::RestoreSchema`), with that version.
    pub(crate) fn refused_keys(&self) -> Result<std::collections::HashMap<Vec<u8>, u32>> {
        let mut out = std::collections::HashMap::new();
        // Meta keys from the prefix on, until the first without it.
        let mut take = |k: &[u8], v: &[u8]| {
            let Some(key) = k.strip_prefix(REFUSED_PREFIX) else { return false };
            out.insert(key.to_vec(), <[u8; 4]>::try_from(v).map_or(u32::MAX, u32::from_be_bytes));
            true
        };
        if let Some(heap) = &self.heap {
            let state = heap.read();
            let _ = state.meta.range::<[u8], _>((Bound::Included(REFUSED_PREFIX), Bound::Unbounded)).all(|(k, v)| take(k, v));
        } else if let Some(r) = &self.remote {
            for entry in r.scan_meta(REFUSED_PREFIX) {
                let (k, v) = entry?;
                if !take(&k, &v) {
                    break;
                }
            }
        } else {
            for entry in self.db().iterator_cf(self.meta(), rocksdb::IteratorMode::From(REFUSED_PREFIX, rocksdb::Direction::Forward)) {
                let (k, v) = entry?;
                if !take(&k, &v) {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Adds changes to the refused keys (`None`: no longer refused) to `batch`.
    pub(crate) fn add_refused_changes(&self, batch: &mut Batch, changes: Vec<(Vec<u8>, Option<u32>)>) {
        for (key, version) in changes {
            batch.meta.push(([REFUSED_PREFIX, &key].concat(), version.map(|v| v.to_be_bytes().to_vec())));
        }
    }

    /// Records the id of the changelog topic the state comes from. Like
    /// commits it skips the WAL: a crash before the next flush loses it
    /// together with everything restored after it.
    pub(crate) fn set_changelog_topic_id(&self, id: &str) -> Result<()> {
        if let Some(heap) = &self.heap {
            heap.write().put_meta(TOPIC_ID_KEY, Some(id.as_bytes()));
            return Ok(());
        }
        if let Some(r) = &self.remote {
            return r.write(&[], vec![(remote::prefixed(remote::META, TOPIC_ID_KEY), Some(id.as_bytes().to_vec()))]);
        }
        let mut wo = WriteOptions::default();
        wo.disable_wal(true);
        self.db().put_cf_opt(self.meta(), TOPIC_ID_KEY, id.as_bytes(), &wo)?;
        Ok(())
    }

    /// A meta key's value (a global table's bookkeeping).
    pub(crate) fn meta_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(heap) = &self.heap {
            return Ok(heap.read().meta.get(key).map(|v| v.to_vec()));
        }
        if let Some(r) = &self.remote {
            return r.get(remote::META, key);
        }
        Ok(self.db().get_cf(self.meta(), key)?)
    }

    /// Adds a meta key's new value to `batch`.
    pub(crate) fn put_meta(&self, batch: &mut Batch, key: &[u8], value: &[u8]) {
        batch.meta.push((key.to_vec(), Some(value.to_vec())));
    }

    /// Writes `batch` (data and meta keys, no checkpoint) as a commit does:
    /// atomically, without the WAL, flushed at least every
    /// [`FLUSH_AT_LEAST_EVERY`] (a global table: its source topic is the log).
    pub(crate) fn write_unlogged(&self, batch: Batch) -> Result<()> {
        self.write_batch(batch)?;
        if self.last_flush().elapsed() >= self.flush_every() {
            self.flush_opt(false)?;
        }
        Ok(())
    }


    /// Applies `batch` atomically: the data, then range deletions, then
    /// meta keys (one RocksDB write without the WAL, or one write lock).
    /// In memory, the bytes are then charged to `max_state_memory`.
    fn write_batch(&self, batch: Batch) -> Result<()> {
        let Batch { mut data, ranges, meta } = batch;
        if let Some(heap) = &self.heap {
            {
                let mut state = heap.write();
                struct Apply<'a>(&'a mut heap::HeapState);
                impl rocksdb::WriteBatchIterator for Apply<'_> {
                    fn put(&mut self, key: &[u8], value: &[u8]) {
                        self.0.put(key, value);
                    }
                    fn delete(&mut self, key: &[u8]) {
                        self.0.delete(key);
                    }
                }
                data.iterate(&mut Apply(&mut state));
                for (from, to) in &ranges {
                    state.delete_range(from, to);
                }
                for (k, v) in &meta {
                    state.put_meta(k, v.as_deref());
                }
            }
            return heap.charge();
        }
        if let Some(r) = &self.remote {
            return r.write(&ranges, remote_writes(data, &ranges, meta));
        }
        for (from, to) in &ranges {
            data.delete_range(from, to);
        }
        for (k, v) in &meta {
            match v {
                Some(v) => data.put_cf(self.meta(), k, v),
                None => data.delete_cf(self.meta(), k),
            }
        }
        let mut wo = WriteOptions::default();
        wo.disable_wal(true);
        self.db().write_opt(data, &wo)?;
        Ok(())
    }

    /// How long a committing store goes without a flush (RocksDB) or a
    /// save of its file (in memory).
    fn flush_every(&self) -> Duration {
        match (&self.heap, &self.resources.remote) {
            (Some(_), _) => self.resources.heap_save_every,
            (None, Some(state)) if self.remote.is_some() => state.flush_interval(),
            _ => FLUSH_AT_LEAST_EVERY,
        }
    }

    fn last_flush(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.last_flush.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the database is in restore mode (see [`Engine::start_bulk_load`]).
    pub(crate) fn is_bulk_loading(&self) -> bool {
        self.bulk_loading
    }

    /// Switches to restore mode: WAL off, vector memtable, auto-compaction
    /// deferred. The store must not be read until [`Engine::finish_bulk_load`].
    pub(crate) fn start_bulk_load(&mut self) -> Result<()> {
        if !self.bulk_loading && self.db.is_some() {
            self.reopen(true)?;
            self.bulk_loading = true;
        }
        Ok(())
    }

    /// Ends restore mode: flushes all column families together (the
    /// restored data is durable before the task runs), then turns
    /// compaction back on.
    pub(crate) fn finish_bulk_load(&mut self) -> Result<()> {
        if self.heap.is_some() || self.remote.is_some() {
            // Saved in the background: a crash soon after replays the tail only.
            self.flush_opt(false)?;
            return Ok(());
        }
        if !self.bulk_loading {
            return Ok(());
        }
        self.reopen(false)?;
        self.bulk_loading = false;
        // Auto-compaction was off, so a large restore can leave more L0
        // files than RocksDB's write slowdown (20) and stop (36) triggers
        // allow; the first commits would then stall the processing thread.
        // Compact before the store goes live when that is near.
        let l0 = self.property("rocksdb.num-files-at-level0").unwrap_or(0);
        if l0 >= L0_COMPACT_AFTER_RESTORE {
            let started = std::time::Instant::now();
            self.db().compact_range(None::<&[u8]>, None::<&[u8]>);
            tracing::info!(l0_files = l0, seconds = started.elapsed().as_secs_f64(), "compacted after restore");
        }
        Ok(())
    }

    /// Flushes the memtables of both column families atomically.
    pub(crate) fn flush(&self) -> Result<()> {
        self.flush_opt(true)
    }

    /// Flushes both column families atomically; `wait`: until it is done,
    /// else only until it is scheduled.
    /// In memory: saves the file (`wait`: now, else on another thread).
    /// (A background save not started because one is under way leaves the
    /// clock alone: the next commit asks again.)
    fn flush_opt(&self, wait: bool) -> Result<()> {
        if let Some(heap) = &self.heap {
            if wait {
                *self.last_flush() = Instant::now();
                return heap.save();
            }
            if heap.save_in_background() {
                *self.last_flush() = Instant::now();
            }
            return Ok(());
        }
        *self.last_flush() = Instant::now();
        if let Some(r) = &self.remote {
            return r.flush(wait);
        }
        let mut fo = FlushOptions::default();
        fo.set_wait(wait);
        let Some(db) = self.db.as_ref() else {
            // A reopen failed earlier; its error was already reported.
            return Err(Error::io(&self.path, std::io::Error::other("database is closed after a failed reopen")));
        };
        let default = db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME).expect("default cf");
        db.flush_cfs_opt(&[default, self.meta()], &fo)?;
        Ok(())
    }

    /// Schedules a flush of both column families without waiting for it.
    pub(crate) fn flush_soon(&self) -> Result<()> {
        self.flush_opt(false)
    }

    /// An integer RocksDB property of the data column family, e.g. `rocksdb.estimate-num-keys`.
    /// In memory: only `rocksdb.estimate-num-keys` (the exact count).
    pub(crate) fn property(&self, name: &str) -> Option<u64> {
        if let Some(heap) = &self.heap {
            return (name == "rocksdb.estimate-num-keys").then(|| heap.read().data.len() as u64);
        }
        if self.remote.is_some() {
            return None;
        }
        self.db().property_int_value(name).ok().flatten()
    }

    /// Block-cache and stall tickers since the engine was opened (none in memory).
    pub(crate) fn tickers(&self) -> Tickers {
        if self.db.is_none() {
            return self.carried;
        }
        self.carried.plus(Tickers::of(&self.options, self.db(), self.resources.statistics))
    }

    /// Sizes and compaction state of the data (RocksDB properties, no scan).
    pub(crate) fn data_stats(&self) -> DataStats {
        match (&self.heap, &self.db) {
            (Some(heap), _) => DataStats::of_heap(&heap.read()),
            (None, Some(db)) => DataStats::of(db),
            (None, None) => DataStats::default(),
        }
    }

    /// The database's directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a RocksDB checkpoint (hard links of the SST files where the
    /// file system allows) of both column families to `dest`, which must
    /// not exist. Flushes first: the data skips the WAL.
    /// In memory: the store's file, written into `dest`.
    pub(crate) fn create_checkpoint(&self, dest: &Path) -> Result<()> {
        if let Some(heap) = &self.heap {
            return heap.save_to(dest);
        }
        if self.remote.is_some() {
            return Err(Error::InvalidUse("a remote store partition has no local checkpoint: its database in object storage is its durable copy".into()));
        }
        self.flush()?;
        rocksdb::checkpoint::Checkpoint::new(self.db())?.create_checkpoint(dest)?;
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Writes skip the WAL: a store that closes makes its memtables
        // durable, so a clean shutdown or rebalance restores nothing on the
        // next start. Cheap if nothing is unflushed.
        if let Some(r) = &self.remote {
            // Closing flushes the memtable: the next owner replays nothing.
            if let Err(e) = r.close() {
                tracing::warn!(path = %self.path.display(), error = %e,
                    "closing a remote store failed; its next owner replays the changelog from its last landed flush");
            }
            return;
        }
        if self.db.is_some() || self.heap.is_some() {
            match self.flush() {
                Ok(()) => self.write_checkpoint_hint(),
                Err(e) => tracing::warn!(path = %self.path.display(), error = %e,
                    "flush on close failed; the next start replays the changelog from an older checkpoint"),
            }
        }
    }
}

impl Engine {
    /// Writes the checkpoint hint after the close's flush (best effort).
    fn write_checkpoint_hint(&self) {
        if self.resources.memory.is_some() {
            return;
        }
        let (Ok(Checkpoint::At(c)), Some(store_dir)) = (self.checkpoint(), self.path.parent()) else { return };
        if let Err(e) = write_checkpoint_hint(store_dir, c) {
            tracing::debug!(dir = %store_dir.display(), error = %e, "writing the checkpoint hint failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res() -> EngineResources {
        EngineResources::new(8 << 20, 4 << 20)
    }

    #[test]
    fn checkpoint_is_written_with_data_and_survives_reopen() {
        for heap in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            {
                let e = open_as(dir.path(), heap);
                assert_eq!(e.checkpoint().unwrap(), Checkpoint::None);
                let mut b = Engine::batch();
                b.put(b"k", b"v");
                e.commit(b, 41).unwrap();
            }
            let e = open_as(dir.path(), heap);
            assert_eq!(e.checkpoint().unwrap(), Checkpoint::At(41), "in memory: {heap}");
            assert_eq!(e.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        }
    }

    /// RocksDB, or in memory as the store partition `s/0`.
    fn open_as(path: &Path, heap: bool) -> Engine {
        match heap {
            true => Engine::open_in_memory(path, &res(), "s/0").unwrap().0,
            false => Engine::open(path, &res()).unwrap(),
        }
    }

    #[test]
    fn in_memory_commits_meta_ranges_snapshots_and_a_changed_backend_work_as_on_rocksdb() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let e = open_as(&db, true);
        let mut b = Engine::batch();
        for k in ["a1", "a2", "b1", "c1"] {
            b.put(k, "v");
        }
        b.delete("c1");
        e.add_segments_update(&mut b, &crate::store::segments::SegmentsUpdate {
            drop: Some((*b"a\0\0\0\0\0\0\0", *b"b\0\0\0\0\0\0\0")), interval: 10, time: 20, layout: crate::store::segments::Layout::Window, retention: 30, dropped: 1,
        });
        e.add_refused_changes(&mut b, vec![(b"x".to_vec(), Some(2))]);
        e.commit_with_age_bound(b, 5, 1234).unwrap();
        assert_eq!(e.scan(Bound::Unbounded, Bound::Unbounded).map(|r| r.unwrap().0).collect::<Vec<_>>(), vec![b"b1".to_vec()]);
        assert_eq!(e.segments().unwrap().map(|s| (s.interval, s.time, s.retention)), Some((10, 20, 30)));
        assert_eq!(e.refused_keys().unwrap().get(&b"x"[..]), Some(&2));
        assert_eq!(e.appended_after_ms().unwrap(), Some(1234));
        let (seen, checkpoint) = e.committed(|view| view.get(b"b1")).unwrap();
        assert_eq!((seen.as_deref(), checkpoint), (Some(&b"v"[..]), Checkpoint::At(5)));
        e.create_checkpoint(&dir.path().join("snap")).unwrap();
        drop(e);
        assert_eq!(read_checkpoint_hint(dir.path()), Some(5), "a closed in-memory store leaves the hint");
        let ro = ReadOnlyDb::open_read_only(&dir.path().join("snap")).unwrap();
        assert!(ro.is_in_memory());
        assert_eq!((ro.checkpoint().unwrap(), ro.iter().count()), (Checkpoint::At(5), 1));
        // RocksDB now: the in-memory file goes, the store starts empty; and back.
        let e = open_as(&db, false);
        assert_eq!(e.checkpoint().unwrap(), Checkpoint::None);
        drop(e);
        let (e, problem) = Engine::open_in_memory(&db, &res(), "s/0").unwrap();
        assert!(problem.unwrap().contains("RocksDB"));
        assert_eq!(e.checkpoint().unwrap(), Checkpoint::None);
    }

    #[test]
    fn a_clean_close_leaves_a_checkpoint_hint_that_the_next_open_removes() {
        let store_dir = tempfile::tempdir().unwrap();
        let db = store_dir.path().join("db");
        {
            let e = Engine::open(&db, &res()).unwrap();
            e.commit(Engine::batch(), 41).unwrap();
            assert_eq!(read_checkpoint_hint(store_dir.path()), None, "no hint while open");
        }
        assert_eq!(read_checkpoint_hint(store_dir.path()), Some(41));
        let e = Engine::open(&db, &res()).unwrap();
        assert_eq!(read_checkpoint_hint(store_dir.path()), None, "an open database has no hint");
        drop(e);
        assert_eq!(read_checkpoint_hint(store_dir.path()), Some(41));
    }

    #[test]
    fn bulk_load_is_durable_and_reopens_in_normal_mode() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut e = Engine::open(dir.path(), &res()).unwrap();
            e.start_bulk_load().unwrap();
            let mut b = Engine::batch();
            b.put(b"z", b"1");
            b.put(b"a", b"2");
            e.commit(b, 7).unwrap();
            e.finish_bulk_load().unwrap();
            assert_eq!(e.get(b"a").unwrap().as_deref(), Some(&b"2"[..]));
            e.commit(Engine::batch(), 8).unwrap(); // a normal commit after the bulk load
        }
        let e = Engine::open(dir.path(), &res()).unwrap();
        assert_eq!(e.checkpoint().unwrap(), Checkpoint::At(8));
        let keys: Vec<_> = e.scan(Bound::Unbounded, Bound::Unbounded).map(|r| r.unwrap().0).collect();
        assert_eq!(keys, [b"a".to_vec(), b"z".to_vec()]);
    }

    #[test]
    fn a_committing_store_is_flushed_at_least_every_interval() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path(), &res()).unwrap();
        let sst_files = |e: &Engine| e.property("rocksdb.num-files-at-level0").unwrap();
        let mut b = Engine::batch();
        b.put(b"k", b"v");
        e.commit(b, 1).unwrap();
        assert_eq!(sst_files(&e), 0, "no flush before the interval is up");
        *e.last_flush() = Instant::now().checked_sub(FLUSH_AT_LEAST_EVERY).unwrap();
        e.commit(Engine::batch(), 2).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while sst_files(&e) == 0 {
            assert!(Instant::now() < deadline, "the overdue flush did not happen");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(e.last_flush().elapsed() < FLUSH_AT_LEAST_EVERY);
    }

    #[test]
    fn large_restore_is_compacted_before_going_live() {
        let dir = tempfile::tempdir().unwrap();
        let res = EngineResources::new(8 << 20, 64 << 10); // 64 KiB memtables: many flushes
        let mut e = Engine::open(dir.path(), &res).unwrap();
        e.start_bulk_load().unwrap();
        for round in 0..40 {
            let mut b = Engine::batch();
            for i in 0..1000u32 {
                b.put(format!("k{round:03}-{i:05}"), [7u8; 100]);
            }
            e.commit(b, round).unwrap();
            e.flush().unwrap();
        }
        let l0 = |e: &Engine| e.property("rocksdb.num-files-at-level0").unwrap();
        assert!(l0(&e) >= L0_COMPACT_AFTER_RESTORE, "the test must build up L0 files");
        e.finish_bulk_load().unwrap();
        assert!(l0(&e) < L0_COMPACT_AFTER_RESTORE, "{} L0 files left", l0(&e));
        assert_eq!(e.get(b"k039-00999").unwrap().as_deref(), Some(&[7u8; 100][..]));
    }

    #[test]
    fn tickers_count_block_cache_reads_and_survive_a_bulk_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = Engine::open(dir.path(), &res().with_statistics(true)).unwrap();
        let mut b = Engine::batch();
        for i in 0..1000u32 {
            b.put(format!("k{i:04}"), [7u8; 100]);
        }
        e.commit(b, 999).unwrap();
        e.flush().unwrap();
        for i in 0..1000u32 {
            assert!(e.get(format!("k{i:04}").as_bytes()).unwrap().is_some());
        }
        let before = e.tickers();
        assert!(before.block_cache_misses > 0 && before.block_cache_hits > 0, "{before:?}");
        e.start_bulk_load().unwrap(); // reopens the database
        let after = e.tickers();
        assert!(after.block_cache_hits >= before.block_cache_hits && after.block_cache_misses >= before.block_cache_misses, "{after:?}");
        assert_eq!(after.since(before).block_cache_hits, after.block_cache_hits - before.block_cache_hits);
        // A new engine's counts start again from 0: all of them moved.
        let fresh = Tickers { block_cache_hits: 3, ..Tickers::default() };
        assert_eq!(fresh.since(after).block_cache_hits, 3);
        let stats = e.data_stats();
        assert!(stats.keys >= 900 && stats.logical_bytes >= 1000 * 105 && stats.physical_bytes > 0, "{stats:?}");
    }

    #[test]
    fn without_statistics_the_tickers_stay_zero() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(dir.path(), &res()).unwrap();
        let mut b = Engine::batch();
        b.put("k", [7u8; 100]);
        e.commit(b, 0).unwrap();
        e.flush().unwrap();
        assert!(e.get(b"k").unwrap().is_some());
        assert_eq!(e.tickers(), Tickers::default());
    }

    #[test]
    fn scan_honours_bounds() {
        for heap in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let e = open_as(dir.path(), heap);
            let mut b = Engine::batch();
            for k in ["a", "b", "c", "d"] {
                b.put(k, k);
            }
            e.commit(b, 0).unwrap();
            let keys = |s, t| -> Vec<String> { e.scan(s, t).map(|r| String::from_utf8(r.unwrap().0).unwrap()).collect() };
            assert_eq!(keys(Bound::Included(&b"b"[..]), Bound::Excluded(&b"d"[..])), ["b", "c"]);
            assert_eq!(keys(Bound::Excluded(&b"b"[..]), Bound::Included(&b"d"[..])), ["c", "d"]);
            assert_eq!(keys(Bound::Unbounded, Bound::Unbounded), ["a", "b", "c", "d"]);
            assert!(keys(Bound::Excluded(&b"b"[..]), Bound::Excluded(&b"b"[..])).is_empty());
        }
        // In memory, a scan longer than one chunk sees every key once, in order.
        let dir = tempfile::tempdir().unwrap();
        let e = open_as(dir.path(), true);
        let mut b = Engine::batch();
        for i in 0..1000u32 {
            b.put(i.to_be_bytes(), b"v");
        }
        e.commit(b, 0).unwrap();
        let keys: Vec<u32> = e.scan(Bound::Excluded(&3u32.to_be_bytes()[..]), Bound::Unbounded).map(|r| u32::from_be_bytes(r.unwrap().0.try_into().unwrap())).collect();
        assert_eq!(keys, (4..1000).collect::<Vec<_>>());
    }
}
