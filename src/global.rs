//! Global tables: a store filled from every partition of a topic on every
//! instance (reference data for joins), read-only to processors
//! (architecture.md §14). `run` bootstraps each one to its topic's end
//! offsets before it joins the group, then a thread (`kstate-global`)
//! follows the topic while the application runs. The topic is the log, as
//! a changelog is a store's: one RocksDB per table holds the records'
//! latest values and, in the same atomic batch, the next offset of each
//! source partition; a recreated topic, a changed partition count or
//! records deleted past those offsets discard the local copy and read the
//! topic again from the start (checked at startup only: while running, a
//! topic recreated under the follower is read from its start on top of
//! the old copy until the next start).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::restore::{RestoreEnd, RestoreListener, RestoreStart};
use crate::store::engine::{Engine, EngineResources};
use crate::store::lock::DirLock;

/// Meta key prefix of each source partition's next offset (4-byte
/// partition, big-endian; the value: 8 bytes).
const NEXT_PREFIX: &[u8] = b"global.next/";
/// Meta key of the source topic's partition count.
const PARTITIONS_KEY: &[u8] = b"global.partitions";
/// Records applied per RocksDB batch at most.
const BATCH_RECORDS: usize = 10_000;
/// How often the follower writes what it read.
const FOLLOW_COMMIT_EVERY: Duration = Duration::from_millis(100);

/// Where a global table's database lives: `<state_dir>/<application_id>/<table>/global`.
pub(crate) fn table_dir(state_dir: &Path, application_id: &str, table: &str) -> PathBuf {
    state_dir.join(application_id).join(table).join("global")
}

/// One global table's local copy.
pub(crate) struct GlobalStore {
    name: String,
    topic: String,
    /// `None` only while it is wiped.
    engine: Option<Engine>,
    dir: PathBuf,
    resources: EngineResources,
    _lock: Option<DirLock>,
}

impl GlobalStore {
    /// Opens (or creates) the table's database under `dir`.
    pub(crate) fn open(name: &str, topic: &str, dir: PathBuf, resources: &EngineResources, lock_timeout: Duration) -> Result<Self> {
        let lock = if resources.is_in_memory() { None } else { Some(DirLock::acquire(&dir, lock_timeout)?) };
        let engine = Engine::open(&dir.join("db"), resources)?;
        Ok(GlobalStore { name: name.into(), topic: topic.into(), engine: Some(engine), dir, resources: resources.clone(), _lock: lock })
    }

    fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("open")
    }

    /// Discards the local copy: the topic is read again from the start.
    fn wipe(&mut self, why: &str) -> Result<()> {
        tracing::warn!(table = %self.name, topic = %self.topic, reason = why, "global table discarded; reading its topic again from the start");
        drop(self.engine.take());
        let db = self.dir.join("db");
        self.resources.wipe(&db)?;
        self.engine = Some(Engine::open(&db, &self.resources)?);
        Ok(())
    }

    /// The next offset of each source partition read so far.
    fn next_offsets(&self) -> Result<BTreeMap<i32, i64>> {
        let mut next = BTreeMap::new();
        for p in 0..self.recorded_partitions()?.unwrap_or(0) {
            if let Some(v) = self.engine().meta_get(&next_key(p))? {
                next.insert(p, i64::from_be_bytes(v.as_slice().try_into().map_err(|_| corrupt(&self.name))?));
            }
        }
        Ok(next)
    }

    fn recorded_partitions(&self) -> Result<Option<i32>> {
        match self.engine().meta_get(PARTITIONS_KEY)? {
            Some(v) => Ok(Some(i32::from_be_bytes(v.as_slice().try_into().map_err(|_| corrupt(&self.name))?))),
            None => Ok(None),
        }
    }

    /// Writes `records` (a `None` value deletes) and the source partitions'
    /// next offsets in one atomic batch.
    pub(crate) fn apply(&self, records: &[(Vec<u8>, Option<Vec<u8>>)], next: &BTreeMap<i32, i64>, partitions: i32) -> Result<()> {
        let engine = self.engine();
        let mut batch = Engine::batch();
        for (key, value) in records {
            match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            }
        }
        for (p, offset) in next {
            engine.put_meta(&mut batch, &next_key(*p), &offset.to_be_bytes());
        }
        engine.put_meta(&mut batch, PARTITIONS_KEY, &partitions.to_be_bytes());
        engine.write_unlogged(batch)
    }

    /// Reads one key.
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.engine().get(key)
    }

    /// Every entry in `[start, end)` bounds, in key order.
    pub(crate) fn scan<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a {
        self.engine().scan(start, end)
    }
}

fn next_key(partition: i32) -> Vec<u8> {
    [NEXT_PREFIX, &partition.to_be_bytes()].concat()
}

fn corrupt(table: &str) -> Error {
    Error::Codec { codec: "global table offsets", source: format!("global table `{table}`: its recorded offsets are not 8-byte numbers").into() }
}

/// The application's global tables, by name.
#[derive(Default)]
pub(crate) struct GlobalTables {
    pub(crate) tables: BTreeMap<String, Arc<GlobalStore>>,
}

impl GlobalTables {
    /// The table named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&GlobalStore> {
        self.tables.get(name).map(|t| &**t)
    }
}

/// A global table as a processor reads it (see
/// [`ProcessorContext::global_table`](crate::ProcessorContext::global_table)):
/// the latest value of each key of its topic, as far as this instance has
/// read it. Read-only: the topic is its only writer.
pub struct GlobalTable<'a> {
    store: &'a GlobalStore,
}

impl<'a> GlobalTable<'a> {
    pub(crate) fn new(store: &'a GlobalStore) -> Self {
        GlobalTable { store }
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.store.name
    }

    /// The latest value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.store.get(key)
    }

    /// The latest value of `key`, with codecs.
    pub fn get_typed<K: Codec, V: Codec>(&self, key: &K::Item) -> Result<Option<V::Item>> {
        self.store.get(&K::encode(key)?)?.map(|v| V::decode(&v)).transpose()
    }

    /// Every entry with a key in `[from, to)`, in key order.
    pub fn range(&self, from: &[u8], to: &[u8]) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a {
        self.store.scan(Bound::Included(from), Bound::Excluded(to))
    }

    /// Every entry whose key starts with `prefix`, in key order.
    pub fn prefix_scan(&self, prefix: &[u8]) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + 'a {
        let end = crate::store::prefix_successor(prefix);
        let end = match &end {
            Some(e) => Bound::Excluded(e.as_slice()),
            None => Bound::Unbounded,
        };
        self.store.scan(Bound::Included(prefix), end)
    }
}

/// A global table's source topic as the brokers describe it now.
struct SourceTopic {
    partitions: i32,
    /// (low, high) watermarks per partition.
    watermarks: Vec<(i64, i64)>,
    id: Option<String>,
}

fn describe(consumer: &BaseConsumer, table: &str, topic: &str, timeout: Duration) -> Result<SourceTopic> {
    use rdkafka::types::RDKafkaRespErr;
    let deadline = Instant::now() + timeout;
    let partitions = loop {
        let md = consumer.fetch_metadata(Some(topic), timeout)?;
        let error = match md.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => break t.partitions().len() as i32,
            Some(t) => t.error(),
            None => None,
        };
        // Unknown: missing. Anything else (no leader yet) passes; wait.
        let missing = matches!(
            error,
            None | Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC | RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
        );
        if missing || Instant::now() >= deadline {
            return Err(Error::MissingGlobalTableTopic { table: table.into(), topic: topic.into() });
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut watermarks = Vec::with_capacity(partitions as usize);
    for p in 0..partitions {
        watermarks.push(consumer.fetch_watermarks(topic, p, timeout)?);
    }
    let id = crate::kafka::topic_id::describe(consumer.client().native_ptr(), topic, timeout).ok();
    Ok(SourceTopic { partitions, watermarks, id })
}

/// Opens every global table of the application, brings each up to its
/// topic's end offsets as of now (reported to `listener` as restores,
/// one per source partition), and returns them with the consumers that
/// follow them.
pub(crate) fn bootstrap(
    config: &crate::config::AppConfig,
    base: &ClientConfig,
    resources: &EngineResources,
    listener: &dyn RestoreListener,
) -> Result<(GlobalTables, Vec<Follower>)> {
    let mut tables = GlobalTables::default();
    let mut followers = Vec::new();
    for (name, topic) in &config.global_tables {
        let consumer = global_consumer(base, &config.application_id)?;
        let source = describe(&consumer, name, topic, config.startup_timeout)?;
        let dir = table_dir(&config.state_dir, &config.application_id, name);
        let mut store = GlobalStore::open(name, topic, dir, resources, config.lock_timeout)?;
        let reason = discard_reason(&store, &source)?;
        if let Some(why) = &reason {
            store.wipe(why)?;
        }
        if let Some(id) = &source.id {
            store.engine().set_changelog_topic_id(id)?;
        }
        let mut follower = Follower::start(store, consumer, source.partitions)?;
        follower.catch_up(&source, reason, listener, config.startup_timeout)?;
        tables.tables.insert(name.clone(), follower.store.clone());
        followers.push(follower);
    }
    Ok((tables, followers))
}

fn global_consumer(base: &ClientConfig, application_id: &str) -> Result<BaseConsumer> {
    let mut c = base.clone();
    for key in crate::config::MEMBERSHIP_KEYS {
        c.remove(key);
    }
    // (Never joins or commits: the group id only names the client.)
    c.set("group.id", format!("{application_id}-kstate-global"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed");
    Ok(c.create()?)
}

/// Why the local copy cannot go on from its offsets, if it cannot.
fn discard_reason(store: &GlobalStore, source: &SourceTopic) -> Result<Option<String>> {
    let recorded_id = store.engine().changelog_topic_id()?;
    if let (Some(was), Some(now)) = (&recorded_id, &source.id) {
        if was != now {
            return Ok(Some(format!("topic `{}` was recreated (id {was} is now {now})", store.topic)));
        }
    }
    match store.recorded_partitions()? {
        Some(n) if n != source.partitions => {
            return Ok(Some(format!("topic `{}` has {} partitions, the local copy was read from {n}", store.topic, source.partitions)))
        }
        _ => {}
    }
    for (p, next) in store.next_offsets()? {
        let (low, high) = source.watermarks[p as usize];
        if next < low || next > high {
            return Ok(Some(format!("partition {p}: the local copy goes on at offset {next}, the topic now holds [{low}, {high})")));
        }
    }
    Ok(None)
}

/// Reads a global table's topic into its store: at startup up to the end
/// offsets, then on its thread while the application runs.
pub(crate) struct Follower {
    store: Arc<GlobalStore>,
    consumer: BaseConsumer,
    partitions: i32,
    /// The next offset of each partition (what the store holds).
    next: BTreeMap<i32, i64>,
    /// `kstate_global_table_records_total` and `kstate_global_table_lag_records` of the table.
    records: metrics::Counter,
    lag: metrics::Gauge,
}

impl Follower {
    fn start(store: GlobalStore, consumer: BaseConsumer, partitions: i32) -> Result<Self> {
        let next = store.next_offsets()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            let offset = next.get(&p).map_or(Offset::Beginning, |o| Offset::Offset(*o));
            tpl.add_partition_offset(&store.topic, p, offset)?;
        }
        consumer.assign(&tpl)?;
        let records = metrics::counter!(crate::metrics::GLOBAL_TABLE_RECORDS, "table" => store.name.clone());
        let lag = metrics::gauge!(crate::metrics::GLOBAL_TABLE_LAG, "table" => store.name.clone());
        Ok(Follower { store: Arc::new(store), consumer, partitions, next, records, lag })
    }

    /// Reads up to the end offsets `source` saw; fails if nothing comes
    /// for `patience` while records are missing.
    fn catch_up(&mut self, source: &SourceTopic, reason: Option<String>, listener: &dyn RestoreListener, patience: Duration) -> Result<()> {
        let started = Instant::now();
        let name = self.store.name.clone();
        let topic = self.store.topic.clone();
        let mut counts = vec![(0u64, 0u64); self.partitions as usize];
        for p in 0..self.partitions {
            listener.on_restore_start(&RestoreStart {
                store: name.clone(),
                partition: p,
                changelog_topic: topic.clone(),
                start_offset: self.next.get(&p).copied().unwrap_or(source.watermarks[p as usize].0),
                end_offset: source.watermarks[p as usize].1,
                full_restore_reason: reason.clone(),
                snapshot: None,
                snapshots_skipped: Vec::new(),
            });
        }
        let partitions = self.partitions;
        let behind = |next: &BTreeMap<i32, i64>| {
            (0..partitions).any(|p| {
                let (low, high) = source.watermarks[p as usize];
                high > low && next.get(&p).copied().unwrap_or(low) < high
            })
        };
        let mut last_progress = Instant::now();
        while behind(&self.next) {
            let read = self.read_batch(Duration::from_millis(100), Some(&mut counts))?;
            // Past control records (a topic written in transactions ends
            // with a commit marker, which no record's offset + 1 reaches):
            // the consumer's position counts them.
            self.skip_to_position();
            if read > 0 {
                last_progress = Instant::now();
            } else if last_progress.elapsed() >= patience {
                return Err(Error::Restore {
                    topic: topic.clone(),
                    partition: -1,
                    detail: format!("global table `{name}`: no record for {patience:?} while its bootstrap is behind the end offsets"),
                });
            }
        }
        self.store.apply(&[], &self.next, self.partitions)?;
        for (p, (records, bytes)) in counts.into_iter().enumerate() {
            listener.on_restore_end(&RestoreEnd { store: name.clone(), partition: p as i32, records, bytes, duration: started.elapsed(), table_files: 0 });
        }
        tracing::info!(table = %name, topic = %topic, took = ?started.elapsed(), "global table bootstrapped");
        Ok(())
    }

    /// Moves each partition's next offset up to the consumer's position
    /// (which counts the control records it passed).
    fn skip_to_position(&mut self) {
        let Ok(positions) = self.consumer.position() else { return };
        for e in positions.elements_for_topic(&self.store.topic) {
            if let Offset::Offset(o) = e.offset() {
                let next = self.next.entry(e.partition()).or_insert(o);
                *next = (*next).max(o);
            }
        }
    }

    /// Polls for up to `wait`, then keeps reading what is there (up to
    /// [`BATCH_RECORDS`]) and writes it with the new offsets. Returns the
    /// records read (keyless ones included: they move the offsets).
    fn read_batch(&mut self, wait: Duration, mut counts: Option<&mut Vec<(u64, u64)>>) -> Result<usize> {
        let mut records = Vec::new();
        let (mut wait, mut read) = (wait, 0);
        while read < BATCH_RECORDS {
            let Some(polled) = self.consumer.poll(wait) else { break };
            wait = Duration::ZERO;
            let msg = match polled {
                Ok(m) => m,
                Err(rdkafka::error::KafkaError::PartitionEOF(_)) => continue,
                Err(e) => {
                    tracing::warn!(table = %self.store.name, error = %e, "global table consumer error");
                    continue;
                }
            };
            self.next.insert(msg.partition(), msg.offset() + 1);
            read += 1;
            let Some(key) = msg.key() else { continue }; // (a record without key has no place in a table)
            if let Some(c) = counts.as_deref_mut().and_then(|c| c.get_mut(msg.partition() as usize)) {
                c.0 += 1;
                c.1 += (key.len() + msg.payload().map_or(0, <[u8]>::len)) as u64;
            }
            records.push((key.to_vec(), msg.payload().map(<[u8]>::to_vec)));
        }
        if read > 0 {
            self.store.apply(&records, &self.next, self.partitions)?;
            self.records.increment(records.len() as u64);
        }
        self.record_lag();
        Ok(read)
    }

    /// Updates the lag gauge: records of the topic past what the store
    /// holds, against librdkafka's last seen end offsets.
    fn record_lag(&self) {
        let rk = self.consumer.client().native_ptr();
        let lag: i64 = (0..self.partitions)
            .filter_map(|p| {
                let (low, high) = crate::kafka::watermarks::cached(rk, &self.store.topic, p)?;
                Some((high - self.next.get(&p).copied().unwrap_or(low)).max(0))
            })
            .sum();
        self.lag.set(lag as f64);
    }

    /// Follows the topic until `stop` is set: what it reads is written
    /// every [`FOLLOW_COMMIT_EVERY`] at most. A failed write is logged and
    /// retried (the records are read again from the last offsets written).
    pub(crate) fn follow(mut self, stop: &AtomicBool) {
        let mut resync = false;
        while !stop.load(Ordering::Acquire) {
            if resync {
                // Back to what the store holds before reading on.
                std::thread::sleep(Duration::from_secs(1));
                let Ok(next) = self.store.next_offsets() else { continue };
                self.next = next;
                resync = false;
                for p in 0..self.partitions {
                    let offset = self.next.get(&p).map_or(Offset::Beginning, |o| Offset::Offset(*o));
                    if let Err(e) = self.consumer.seek(&self.store.topic, p, offset, Duration::from_secs(10)) {
                        tracing::warn!(table = %self.store.name, partition = p, error = %e, "seeking a global table's topic back failed; retrying");
                        resync = true;
                    }
                }
                if resync {
                    continue;
                }
            }
            if let Err(e) = self.read_batch(FOLLOW_COMMIT_EVERY, None) {
                tracing::error!(table = %self.store.name, error = %e, "a global table write failed; reading again from its last offsets");
                resync = true;
            }
        }
    }
}
