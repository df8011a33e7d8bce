//! Shared harness for tests against a real broker (`KSTATE_BOOTSTRAP`,
//! default 127.0.0.1:9092; `bash testing/test.sh` starts one).
#![allow(dead_code)]

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
    ClientConfig::new().set("bootstrap.servers", bootstrap()).create().expect("admin client")
}

pub fn create_topic(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin = admin();
    let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let res = futures::executor::block_on(admin.create_topics([&t], &AdminOptions::new())).expect("create_topics");
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e} — is the broker at {} running?", bootstrap()));
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
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
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
            let m = m.unwrap();
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
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let c = consumer.committed_offsets(tpl, TIMEOUT).unwrap();
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

/// Opens a store partition's RocksDB directly (the app must be stopped):
/// its data and its checkpoint.
pub fn read_store_dir(state_dir: &Path, app: &str, store: &str, partition: i32) -> (BTreeMap<Vec<u8>, Vec<u8>>, Option<i64>) {
    let path = store_db_path(state_dir, app, store, partition);
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

/// Polls `cond` until it holds or the deadline passes.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A builder with test-friendly settings.
pub fn builder(app_id: &str, input: &str, state_dir: &Path) -> AppBuilder {
    App::builder()
        .application_id(app_id)
        .bootstrap_servers(bootstrap())
        .input_topic(input)
        .state_dir(state_dir)
        .kafka_config("session.timeout.ms", "6000")
        .kafka_config("heartbeat.interval.ms", "500")
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
