//! Shared harness for tests against a real broker (`KSTATE_BOOTSTRAP`,
//! default 127.0.0.1:9092; `bash testing/test.sh` starts one).
#![allow(dead_code)]

pub mod instances;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kstate::{App, AppBuilder, ProcessorContext, Record, RestoreEnd, RestoreListener, RestoreStart, ShutdownHandle};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

pub const TIMEOUT: Duration = Duration::from_secs(30);

/// An input or changelog record: `(partition, key, value)`; `None` is a tombstone.
pub type KeyedRecord = (i32, Vec<u8>, Option<Vec<u8>>);

pub fn bootstrap() -> String {
    std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "kstate=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// What most tests start from: a fresh input topic, application id and state dir.
pub struct Fixture {
    pub input: String,
    pub app: String,
    pub state: tempfile::TempDir,
}

/// Creates the input topic `<name>-in-…` with `partitions` partitions, an
/// application id `<name>-…` and an empty state directory.
pub fn fixture(name: &str, partitions: i32) -> Fixture {
    init_tracing();
    let f = Fixture {
        input: unique(&format!("{name}-in")),
        app: unique(name),
        state: tempfile::tempdir().unwrap(),
    };
    create_topic(&f.input, partitions, &[]);
    f
}

/// A name unique to this test run.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{}-{}", std::process::id(), nanos % 1_000_000_000, N.fetch_add(1, Ordering::Relaxed))
}

pub fn admin() -> AdminClient<DefaultClientContext> {
    admin_at(&bootstrap())
}

pub fn admin_at(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client")
}

pub fn create_topic(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    create_topic_at(&bootstrap(), name, partitions, configs)
}

pub fn create_topic_at(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin = admin_at(bootstrap);
    let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let res = futures::executor::block_on(admin.create_topics([&t], &AdminOptions::new())).expect("create_topics");
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e} — is the broker at {bootstrap} running?"));
    }
    // Wait for the metadata to show every partition.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let md = admin.inner().fetch_metadata(Some(name), Duration::from_secs(5)).unwrap();
        if md.topics().iter().any(|t| t.error().is_none() && t.partitions().len() == partitions as usize) {
            return;
        }
        assert!(Instant::now() < deadline, "topic {name} did not appear");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn delete_topic(name: &str) {
    let admin = admin();
    let res = futures::executor::block_on(admin.delete_topics(&[name], &AdminOptions::new())).unwrap();
    for r in res {
        r.unwrap();
    }
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let md = admin.inner().fetch_metadata(Some(name), Duration::from_secs(5)).unwrap();
        if md.topics().iter().all(|t| t.error().is_some()) {
            return;
        }
        assert!(Instant::now() < deadline, "topic {name} was not deleted");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Produces `(partition, key, value)` records and waits for every ack.
pub fn produce(topic: &str, records: &[KeyedRecord]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for (p, k, v) in records {
        let mut r = BaseRecord::<[u8], [u8]>::to(topic).partition(*p).key(k.as_slice());
        if let Some(v) = v {
            r = r.payload(v.as_slice());
        }
        let mut r = Some(r);
        while let Some(rec) = r.take() {
            if let Err((_, rec)) = producer.send(rec) {
                producer.poll(Duration::from_millis(10));
                r = Some(rec);
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(TIMEOUT).expect("flush");
}

/// Reads a whole partition: `(offset, key, value)`.
pub fn read_partition(topic: &str, partition: i32) -> Vec<(i64, Vec<u8>, Option<Vec<u8>>)> {
    read_partition_at(&bootstrap(), topic, partition)
}

pub fn read_partition_at(bootstrap: &str, topic: &str, partition: i32) -> Vec<(i64, Vec<u8>, Option<Vec<u8>>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (low, high) = consumer.fetch_watermarks(topic, partition, TIMEOUT).unwrap();
    let mut out = Vec::new();
    if high <= low {
        return out;
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = match m {
                Ok(m) => m,
                // A connection dropped on a busy machine: librdkafka reconnects.
                Err(e) => {
                    eprintln!("reading {topic}[{partition}]: {e}; retrying");
                    assert!(Instant::now() < deadline, "reading {topic}[{partition}] timed out");
                    continue;
                }
            };
            out.push((m.offset(), m.key().unwrap_or_default().to_vec(), m.payload().map(<[u8]>::to_vec)));
            if m.offset() + 1 >= high {
                return out;
            }
        } else if let Ok(pos) = consumer.position() {
            if let Some(Offset::Offset(o)) = pos.find_partition(topic, partition).map(|e| e.offset()) {
                if o >= high {
                    return out;
                }
            }
        }
        assert!(Instant::now() < deadline, "reading {topic}[{partition}] timed out");
    }
}

pub fn committed_offset(group: &str, topic: &str, partition: i32) -> Option<i64> {
    committed_offset_at(&bootstrap(), group, topic, partition)
}

pub fn committed_offset_at(bootstrap: &str, group: &str, topic: &str, partition: i32) -> Option<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    // A coordinator that is loading or moving answers with a retriable error.
    let mut attempts = 0;
    let c = loop {
        match consumer.committed_offsets(tpl.clone(), TIMEOUT) {
            Ok(c) => break c,
            Err(e) if attempts < 20 => {
                eprintln!("committed offsets of {group}: {e}; retrying");
                attempts += 1;
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("committed offsets of {group}: {e}"),
        }
    };
    match c.find_partition(topic, partition).unwrap().offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// Applies changelog-like records to a map.
pub fn apply(model: &mut BTreeMap<Vec<u8>, Vec<u8>>, key: &[u8], value: Option<&[u8]>) {
    match value {
        Some(v) => model.insert(key.to_vec(), v.to_vec()),
        None => model.remove(key),
    };
}

/// Whether this run's stores are in memory (`KSTATE_TEST_STORES=memory`):
/// the store behaviour tests run once per backend (testing/test.sh).
pub fn stores_in_memory() -> bool {
    std::env::var("KSTATE_TEST_STORES").is_ok_and(|v| v == "memory")
}

/// Whether this run's stores are remote (`KSTATE_TEST_STORES=remote`):
/// databases in the MinIO server of testing/ (`KSTATE_S3_ENDPOINT`).
pub fn stores_remote() -> bool {
    std::env::var("KSTATE_TEST_STORES").is_ok_and(|v| v == "remote")
}

/// `def` (a window or session store) remote when the tests run with
/// `KSTATE_TEST_STORES=remote`; unchanged otherwise.
pub fn remote_when_testing_remote(def: kstate::StoreDefinition) -> kstate::StoreDefinition {
    if stores_remote() {
        def.remote()
    } else {
        def
    }
}

/// A store definition on this run's backend (see [`stores_in_memory`],
/// [`stores_remote`]).
pub fn store(name: impl Into<String>) -> kstate::StoreDefinition {
    let def = kstate::StoreDefinition::new(name);
    if stores_in_memory() {
        def.in_memory()
    } else if stores_remote() {
        def.remote()
    } else {
        def
    }
}

/// The object store options of MinIO at `endpoint` (testing/minio.sh's
/// credentials unless the environment names others).
pub fn s3_options(endpoint: &str) -> Vec<(String, String)> {
    let mut options = vec![("aws_endpoint".to_string(), endpoint.to_string()), ("aws_allow_http".to_string(), "true".to_string())];
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        options.push(("aws_access_key_id".into(), "kstate".into()));
        options.push(("aws_secret_access_key".into(), "kstate-secret".into()));
        options.push(("aws_region".into(), "us-east-1".into()));
    }
    options
}

/// Remote state in MinIO under `s3://<bucket>/remote` (applications have
/// ids of their own), flushing often so that crash tests replay little.
pub fn remote_state() -> kstate::RemoteStateConfig {
    remote_state_at(&s3_endpoint())
}

/// [`remote_state`] on the S3 server at `endpoint`.
pub fn remote_state_at(endpoint: &str) -> kstate::RemoteStateConfig {
    let mut config = kstate::RemoteStateConfig::new(format!("s3://{}/remote", s3_bucket())).flush_interval(Duration::from_millis(500)).timeout(Duration::from_secs(30));
    for (k, v) in s3_options(endpoint) {
        config = config.option(k, v);
    }
    config
}

/// Keys and values by key.
pub type Bytes = BTreeMap<Vec<u8>, Vec<u8>>;

/// Reads an in-memory store partition's file (`heap.kstate`): its data and
/// meta keys. Written independently of the library's reader.
pub fn read_heap_file(path: &Path) -> (Bytes, Bytes) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    assert_eq!(crc32fast::hash(body), u32::from_be_bytes(crc.try_into().unwrap()), "checksum of {}", path.display());
    assert_eq!(&body[..8], b"KSTHEAP\x01");
    let mut at = 12;
    let mut take = |n: usize| {
        let out = &body[at..at + n];
        at += n;
        out
    };
    let id_len = u32::from_be_bytes(take(4).try_into().unwrap()) as usize;
    take(id_len);
    let mut maps = Vec::new();
    for _ in 0..2 {
        let count = u64::from_be_bytes(take(8).try_into().unwrap());
        let mut map = BTreeMap::new();
        for _ in 0..count {
            let kl = u32::from_be_bytes(take(4).try_into().unwrap()) as usize;
            let vl = u32::from_be_bytes(take(4).try_into().unwrap()) as usize;
            let k = take(kl).to_vec();
            map.insert(k, take(vl).to_vec());
        }
        maps.push(map);
    }
    let data = maps.pop().unwrap();
    (data, maps.pop().unwrap())
}

/// Opens a store partition's RocksDB (or in-memory file) directly (the app
/// must be stopped): its data and its checkpoint.
/// With remote stores (see [`stores_remote`]): what object storage holds
/// of the store partition, whatever `state_dir`.
pub fn read_store_dir(state_dir: &Path, app: &str, store: &str, partition: i32) -> (BTreeMap<Vec<u8>, Vec<u8>>, Option<i64>) {
    if stores_remote() {
        return read_remote_store_at(&s3_endpoint(), app, store, partition);
    }
    let path = store_db_path(state_dir, app, store, partition);
    if path.join("heap.kstate").exists() {
        let (data, meta) = read_heap_file(&path.join("heap.kstate"));
        let cp = meta.get(&b"changelog.checkpoint"[..]).map(|v| i64::from_be_bytes(v.as_slice().try_into().unwrap()));
        return (data, cp);
    }
    let opts = rocksdb::Options::default();
    let db = rocksdb::DB::open_cf_for_read_only(&opts, &path, ["default", "kstate_meta"], false)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let data = db.iterator(rocksdb::IteratorMode::Start).map(|r| {
        let (k, v) = r.unwrap();
        (k.to_vec(), v.to_vec())
    });
    let data = data.collect();
    let meta = db.cf_handle("kstate_meta").unwrap();
    let cp = db
        .get_cf(meta, b"changelog.checkpoint")
        .unwrap()
        .map(|v| i64::from_be_bytes(v.as_slice().try_into().unwrap()));
    (data, cp)
}

/// [`read_store_dir`] after a SIGKILL: an in-memory store killed before its
/// first save has no file yet, which reads as empty with no checkpoint.
pub fn read_store_dir_after_kill(state_dir: &Path, app: &str, store: &str, partition: i32) -> (BTreeMap<Vec<u8>, Vec<u8>>, Option<i64>) {
    let path = store_db_path(state_dir, app, store, partition);
    if !stores_remote() && stores_in_memory() && !path.join("CURRENT").exists() && !path.join("heap.kstate").exists() {
        return (BTreeMap::new(), None);
    }
    read_store_dir(state_dir, app, store, partition)
}

/// A remote store partition's durable state in the S3 server at
/// `endpoint` under [`remote_state_at`]'s URL: its data and checkpoint.
pub fn read_remote_store_at(endpoint: &str, app: &str, store: &str, partition: i32) -> (BTreeMap<Vec<u8>, Vec<u8>>, Option<i64>) {
    let contents = kstate::admin::read_remote_store(&remote_state_at(endpoint), app, store, partition)
        .unwrap_or_else(|e| panic!("read remote store {app}/{store}/{partition}: {e}"));
    (contents.entries.into_iter().collect(), contents.checkpoint)
}

pub fn store_db_path(state_dir: &Path, app: &str, store: &str, partition: i32) -> PathBuf {
    state_dir.join(app).join(store).join(partition.to_string()).join("db")
}

/// Records every restore event.
#[derive(Clone, Default)]
pub struct Restores {
    pub starts: Arc<Mutex<Vec<RestoreStart>>>,
    pub ends: Arc<Mutex<Vec<RestoreEnd>>>,
}

impl RestoreListener for Restores {
    fn on_restore_start(&self, e: &RestoreStart) {
        self.starts.lock().unwrap().push(e.clone());
    }
    fn on_restore_end(&self, e: &RestoreEnd) {
        self.ends.lock().unwrap().push(e.clone());
    }
}

impl Restores {
    pub fn restored_records(&self) -> u64 {
        self.ends.lock().unwrap().iter().map(|e| e.records).sum()
    }
    pub fn ended(&self) -> usize {
        self.ends.lock().unwrap().len()
    }
}

/// An app running on its own thread.
pub struct Running {
    pub shutdown: ShutdownHandle,
    thread: JoinHandle<kstate::Result<()>>,
}

impl Running {
    pub fn start<F>(builder: AppBuilder, processor: F) -> Running
    where
        F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> Result<(), kstate::Error> + Send + 'static,
    {
        let app: App = builder.build().expect("valid config");
        let shutdown = app.shutdown_handle();
        let thread = std::thread::spawn(move || app.run(processor));
        Running { shutdown, thread }
    }

    /// [`Running::start`] of an app already built (to take handles first).
    pub fn start_app<F>(app: App, processor: F) -> Running
    where
        F: FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> Result<(), kstate::Error> + Send + 'static,
    {
        let shutdown = app.shutdown_handle();
        let thread = std::thread::spawn(move || app.run(processor));
        Running { shutdown, thread }
    }

    /// [`Running::start`] with a [`kstate::Processor`] per task.
    pub fn start_processor<P, F>(builder: AppBuilder, factory: F) -> Running
    where
        P: kstate::Processor + Send,
        F: FnMut(i32) -> P + Send + 'static,
    {
        let app: App = builder.build().expect("valid config");
        let shutdown = app.shutdown_handle();
        let thread = std::thread::spawn(move || app.run_processor(factory));
        Running { shutdown, thread }
    }

    /// Shuts the app down; a shutdown that hangs fails the test instead of
    /// hanging it.
    pub fn stop(self) -> kstate::Result<()> {
        self.shutdown.shutdown();
        wait_until("the app to stop (a hang in shutdown?)", Duration::from_secs(60), || self.thread.is_finished());
        self.thread.join().expect("runtime thread panicked")
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// A child instance's clean stop: shuts the app down when the parent
/// closes its stdin (see [`ChildInstance::stop`]).
pub fn stop_when_stdin_closes(shutdown: ShutdownHandle) {
    std::thread::spawn(move || {
        let _ = std::io::Read::read(&mut std::io::stdin(), &mut [0u8; 1]);
        shutdown.shutdown();
    });
}

/// Polls `cond` until it holds or the deadline passes.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A builder with test-friendly settings.
/// With in-memory stores (see [`stores_in_memory`]) their files are saved
/// every 300 ms, so that crash tests restart from background saves too.
pub fn builder(app_id: &str, input: &str, state_dir: &Path) -> AppBuilder {
    let builder = App::builder()
        .application_id(app_id)
        .bootstrap_servers(bootstrap())
        .input_topic(input)
        .state_dir(state_dir)
        .kafka_config("session.timeout.ms", "6000")
        .kafka_config("heartbeat.interval.ms", "500");
    if stores_in_memory() {
        builder.in_memory_save_interval(Duration::from_millis(300))
    } else if stores_remote() {
        builder.remote_state(remote_state())
    } else {
        builder
    }
}

/// Panics with a short description of how two key-value maps differ.
#[track_caller]
pub fn assert_same_state(actual: &BTreeMap<Vec<u8>, Vec<u8>>, expected: &BTreeMap<Vec<u8>, Vec<u8>>, what: &str) {
    if actual == expected {
        return;
    }
    let show = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
    let mut diffs = Vec::new();
    for (k, v) in actual {
        match expected.get(k) {
            None => diffs.push(format!("unexpected {}", show(k))),
            Some(e) if e != v => diffs.push(format!("{}: {} != expected {}", show(k), show(v), show(e))),
            _ => {}
        }
    }
    for k in expected.keys().filter(|k| !actual.contains_key(*k)) {
        diffs.push(format!("missing {}", show(k)));
    }
    let n = diffs.len();
    diffs.truncate(8);
    panic!("{what}: {n} keys differ ({} actual vs {} expected entries), e.g. {diffs:?}", actual.len(), expected.len());
}

/// The end offset (high watermark) of a partition.
pub fn end_offset_at(bootstrap: &str, topic: &str, partition: i32) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
    consumer.fetch_watermarks(topic, partition, TIMEOUT).unwrap().1
}

/// Waits until `group` has committed every partition of `topic` up to its end.
pub fn wait_all_committed_at(bootstrap: &str, group: &str, topic: &str, partitions: i32, timeout: Duration) {
    let ends: Vec<i64> = (0..partitions).map(|p| end_offset_at(bootstrap, topic, p)).collect();
    wait_until("every input offset to be committed", timeout, || {
        (0..partitions).all(|p| committed_offset_at(bootstrap, group, topic, p) == Some(ends[p as usize]))
    });
}

/// The state a store's changelog describes: every partition read in full
/// and applied in order.
pub fn changelog_state_at(bootstrap: &str, app: &str, store: &str, partitions: i32) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let topic = kstate::changelog_topic(app, store);
    let mut state = BTreeMap::new();
    for p in 0..partitions {
        for (_, k, v) in read_partition_at(bootstrap, &topic, p) {
            apply(&mut state, &k, v.as_deref());
        }
    }
    state
}

/// Produces records at a steady rate on a thread of its own: record `i`
/// goes to partition `i % partitions` with key `k<i % keys>` and value
/// `<i>`. The producer rides out broker outages (message timeout 5 min).
pub struct Feeder {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: JoinHandle<Vec<KeyedRecord>>,
}

impl Feeder {
    pub fn start(bootstrap: &str, topic: &str, partitions: i32, keys: usize, per_second: u32, total: usize) -> Feeder {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (bootstrap, topic, flag) = (bootstrap.to_string(), topic.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let producer: BaseProducer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("enable.idempotence", "true")
                .set("linger.ms", "2")
                .set("message.timeout.ms", "300000")
                .create()
                .unwrap();
            let started = Instant::now();
            let mut sent = Vec::with_capacity(total);
            for i in 0..total {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let due = started + Duration::from_secs_f64(i as f64 / per_second as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let (p, key, value) = ((i as i32) % partitions, format!("k{}", i % keys), i.to_string());
                let mut rec = Some(BaseRecord::<[u8], [u8]>::to(&topic).partition(p).key(key.as_bytes()).payload(value.as_bytes()));
                while let Some(r) = rec.take() {
                    if let Err((_, r)) = producer.send(r) {
                        producer.poll(Duration::from_millis(10));
                        rec = Some(r);
                    }
                }
                producer.poll(Duration::ZERO);
                sent.push((p, key.into_bytes(), Some(value.into_bytes())));
            }
            producer.flush(Duration::from_secs(300)).expect("every input record acknowledged");
            sent
        });
        Feeder { stop, thread }
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the feeder to send everything (or stops it early with
    /// `stop`); returns what it sent.
    pub fn join(self, stop: bool) -> Vec<KeyedRecord> {
        if stop {
            self.stop.store(true, Ordering::Relaxed);
        }
        wait_until("the feeder to finish", Duration::from_secs(400), || self.thread.is_finished());
        self.thread.join().expect("feeder panicked")
    }
}

/// What the availability tests' processor writes for an input record
/// `key -> value`: `key/value -> value` (one entry per input record, so a
/// lost record is a missing key) and `key -> value` (the latest value).
/// Both are idempotent, so reprocessing under at-least-once is harmless.
pub fn record_writes(key: &[u8], value: &[u8]) -> [(Vec<u8>, Vec<u8>); 2] {
    [([key, b"/", value].concat(), value.to_vec()), (key.to_vec(), value.to_vec())]
}

/// The state [`record_writes`] builds from `input`, applied in order.
pub fn model_of(input: &[KeyedRecord]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut model = BTreeMap::new();
    for (_, k, v) in input {
        for (key, value) in record_writes(k, v.as_deref().unwrap()) {
            model.insert(key, value);
        }
    }
    model
}

/// When each partition's records were processed, to measure pauses.
#[derive(Clone, Default)]
pub struct ProcessedTimes(pub Arc<Mutex<BTreeMap<i32, Vec<Instant>>>>);

impl ProcessedTimes {
    pub fn record(&self, partition: i32) {
        self.0.lock().unwrap().entry(partition).or_default().push(Instant::now());
    }

    /// The longest gap between two processed records of `partition` within
    /// `[from, to]` (counting from `from` to the first record and from the
    /// last record to `to`).
    pub fn longest_pause(&self, partition: i32, from: Instant, to: Instant) -> Duration {
        let times = self.0.lock().unwrap();
        let mut prev = from;
        let mut longest = Duration::ZERO;
        for &t in times.get(&partition).map(Vec::as_slice).unwrap_or_default() {
            if t < from || t > to {
                continue;
            }
            longest = longest.max(t - prev);
            prev = t;
        }
        longest.max(to.saturating_duration_since(prev))
    }

    pub fn count(&self, partition: i32) -> usize {
        self.0.lock().unwrap().get(&partition).map_or(0, Vec::len)
    }
}

/// An instance of the application run as a child process: this test binary
/// started again on the `#[ignore]`d entry test `entry`, with its settings
/// in `KSTATE_CHILD`; its output is appended to `log`. It stops cleanly when
/// its stdin closes; SIGKILLed when dropped.
pub struct ChildInstance {
    pub name: String,
    pub child: std::process::Child,
    pub log: PathBuf,
}

impl ChildInstance {
    pub fn spawn(name: &str, entry: &str, settings: String, log: PathBuf) -> ChildInstance {
        ChildInstance::spawn_env(name, entry, settings, log, &[])
    }

    /// [`ChildInstance::spawn`] with extra environment variables.
    pub fn spawn_env(name: &str, entry: &str, settings: String, log: PathBuf, env: &[(&str, String)]) -> ChildInstance {
        use std::process::{Command, Stdio};
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args([entry, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("KSTATE_CHILD", settings)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("RUST_LOG", "kstate=info")
            .stdin(Stdio::piped())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn a child instance");
        ChildInstance { name: name.to_string(), child, log }
    }

    /// Its output so far, without terminal colour codes.
    pub fn text(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// The last 40 lines of its output.
    pub fn tail(&self) -> String {
        let text = self.text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The lines around the first line containing `needle` (20 before, 20
    /// after), or the tail when nothing matches: what a failure message shows.
    pub fn around(&self, needle: &str) -> String {
        let text = self.text();
        let lines: Vec<&str> = text.lines().collect();
        match lines.iter().position(|l| l.contains(needle)) {
            Some(at) => lines[at.saturating_sub(20)..(at + 21).min(lines.len())].join("\n"),
            None => self.tail(),
        }
    }

    /// Fails the test if the instance ended on its own.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("instance {} ended on its own ({status}); its log ends with:\n{}", self.name, self.tail());
        }
    }

    /// Sends a signal (`-STOP`, `-CONT`, ...).
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill {signal} {}", self.name);
    }

    /// SIGKILL.
    pub fn kill(mut self) {
        self.assert_running();
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Closes its stdin (clean shutdown) and expects exit code 0 within 60 s.
    pub fn stop(mut self) {
        self.assert_running();
        drop(self.child.stdin.take());
        self.expect_clean_exit();
    }

    /// Expects it to exit with code 0 within 60 s (after a signal, say).
    pub fn expect_clean_exit(mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("instance {} did not stop within 60 s; its log ends with:\n{}", self.name, self.tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "instance {} stopped with {status}; its log ends with:\n{}", self.name, self.tail());
    }
}

impl Drop for ChildInstance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` without terminal colour codes.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub fn s3_endpoint() -> String {
    std::env::var("KSTATE_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:9000".into())
}

pub fn s3_bucket() -> String {
    std::env::var("KSTATE_S3_BUCKET").unwrap_or_else(|_| "kstate-test".into())
}

/// The snapshot settings for MinIO at `endpoint` (`testing/minio.sh`;
/// `KSTATE_S3_ENDPOINT`) under a prefix of the test's own, snapshots hourly.
pub fn s3_at(endpoint: &str, prefix: &str) -> (kstate::SnapshotConfig, kstate::admin::SnapshotStore) {
    let url = format!("s3://{}/{prefix}", s3_bucket());
    let options = s3_options(endpoint);
    let mut config = kstate::SnapshotConfig::new(&url).interval(Duration::from_secs(3600));
    for (k, v) in &options {
        config = config.option(k, v);
    }
    (config, kstate::admin::SnapshotStore { url, options })
}

/// Deletes the records of a compacted topic's partition before `offset`
/// (DeleteRecords). Kafka refuses it on a compacted topic, so the policy
/// is switched to `delete` and back, as an operator fixing a policy
/// mistake would.
pub fn delete_compacted_records_before(topic: &str, partition: i32, offset: i64) {
    let set_policy = |policy: &str| {
        let alter = rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(topic)).set("cleanup.policy", policy);
        let done = futures::executor::block_on(admin().alter_configs([&alter], &AdminOptions::new())).unwrap();
        assert!(done.iter().all(Result::is_ok), "{done:?}");
    };
    set_policy("delete");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset)).unwrap();
    let deleted = futures::executor::block_on(admin().delete_records(&tpl, &AdminOptions::new())).unwrap();
    assert!(deleted.elements().iter().all(|e| e.error().is_ok()), "{deleted:?}");
    set_policy("compact");
}

/// Produces `(partition, key, value, timestamp)` records in order and
/// waits for every acknowledgement.
pub fn produce_timestamped(topic: &str, records: &[(i32, String, String, i64)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for (p, k, v, ts) in records {
        let mut r = Some(BaseRecord::<str, str>::to(topic).partition(*p).key(k).payload(v).timestamp(*ts));
        while let Some(rec) = r.take() {
            if let Err((_, rec)) = producer.send(rec) {
                producer.poll(Duration::from_millis(10));
                r = Some(rec);
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(TIMEOUT).unwrap();
}

/// A MinIO server of a test's own, on free ports (it is killed and
/// restarted: testing/minio.sh's `kill` and `restart`); stopped when dropped.
pub struct OwnMinio {
    pub port: u16,
    data: tempfile::TempDir,
}

impl OwnMinio {
    /// Runs `testing/minio.sh <verb>` for this server.
    pub fn script(&self, verb: &str) -> std::process::Output {
        let out = std::process::Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("testing/minio.sh"))
            .arg(verb)
            .env("KSTATE_MINIO_PORT", self.port.to_string())
            .env("KSTATE_MINIO_DATA", self.data.path().join("minio"))
            .output()
            .unwrap();
        assert!(out.status.success(), "minio.sh {verb}: {}", String::from_utf8_lossy(&out.stderr));
        out
    }

    /// Starts one on a free port whose next port (the console's) is free too.
    pub fn start() -> OwnMinio {
        let port = (0..20)
            .find_map(|_| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let port = l.local_addr().unwrap().port();
                drop(l);
                (port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok()).then_some(port)
            })
            .expect("two free ports in a row");
        let m = OwnMinio { port, data: tempfile::tempdir().unwrap() };
        m.script("start");
        m
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for OwnMinio {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("testing/minio.sh"))
            .arg("stop")
            .env("KSTATE_MINIO_PORT", self.port.to_string())
            .env("KSTATE_MINIO_DATA", self.data.path().join("minio"))
            .output();
    }
}
