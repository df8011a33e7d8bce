//! Rust contenders of the benchmark suite; driven by `testing/bench/run.py`.
//!
//! Every subcommand prints one JSON line on stdout:
//!
//! * `consume --topic T` — plain rdkafka consumer reading every partition to the end (the physical limit);
//! * `consume-batch --topic T` — the same, reading up to 1024 records per call as kstate does;
//! * `rocksdb-raw --topic T --dir D` — the same consumer writing WAL-less WriteBatches into RocksDB;
//! * `kstate-restore --app A --store S --input I --state-dir D [--snapshot-url U] [--table T] [--in-memory]` — kstate restoring
//!   `A-S-changelog` (with `--table T`: a source table on topic T, committed at its end, restored from T); with a snapshot URL, stores without local state are seeded from snapshots first
//!   (S3 settings from the environment: `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, credentials);
//! * `kstate-join --app A --input I --table T --records N --state-dir D` — a stream-table left join,
//!   T a source table (the `join` scenario);
//! * `plain-repartition --input I --through T --records N` — the same count with plain clients and a
//!   hash map (read I, send re-keyed to T, read T back and count): the baseline of `kstate-repartition`;
//! * `kstate-repartition --app A --input I --records N --state-dir D [--read-cache-bytes B]` — a count
//!   re-keyed through a repartition topic by the value's first two bytes (the `repartition` scenario);
//! * `kstate-snapshot --app A --store S --input I --state-dir D --snapshot-url U` — kstate opening
//!   the state dir, then snapshotting every store partition at once: upload time, bytes uploaded
//!   (files the snapshot store did not have) and the snapshots' full size;
//! * `produce --topic T --source S` — a plain idempotent producer re-sending topic S's records to T;
//! * `pipe --input I --output O` — consume I in batches and produce every record to O, no store;
//! * `kstate-write --app A --input I --records N --state-dir D [--output T] [--guarantee exactly_once|at_least_once] [--processor closure|trait] [--threads N --work R] [--max-state-memory-mib M] [--block-every K] [--in-memory] [--remote-url U] [--curve]` (`--threads` > 1 needs `--processor trait`; `--work`: rounds of CPU work per record; `--block-every`: a 1 ms sleep every K records, processing that waits on I/O)
//!   — kstate putting every input record; with `--output`, also sending it unchanged to T
//!   (`ProcessorContext::send`); at-least-once unless `--guarantee exactly_once`; with `--curve`,
//!   also the records processed in each of the first 60 seconds and kstate's remote-store
//!   counters (requests by kind, bytes each way, cache hits and misses);
//! * `count --topic T [--read-committed]` — the records of T from the beginning to the end of every
//!   partition, as a `read_committed` consumer sees them with the flag (the write-eos check);
//! * `delete-topics --prefix P` — deletes every topic whose name starts with P (a full run writes GBs);
//! * `store-load --mode batch|sst --dir D --records N` — no Kafka: N generated records (16-byte keys,
//!   100-byte values) loaded into an empty RocksDB the way a restore does (`batch`: sorted
//!   20,000-record WriteBatches into a vector memtable, then a flush) or through SST files written
//!   with `SstFileWriter` and ingested (`sst`, 16 MiB each); wall and CPU seconds of the process.

#[path = "parts/query.rs"]
mod query;
#[path = "../tests/support/keeping.rs"]
mod keeping;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate::{App, Output, ProcessingGuarantee, RestoreEnd, RestoreListener, RestoreStart, StoreDefinition};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer, DefaultProducerContext};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `KSTATE_BENCH_RDKAFKA="k=v,k=v"` adds librdkafka settings (for experiments).
trait FromEnv {
    fn extend_from_env(&mut self) -> &mut Self;
}

impl FromEnv for ClientConfig {
    fn extend_from_env(&mut self) -> &mut Self {
        if let Ok(extra) = std::env::var("KSTATE_BENCH_RDKAFKA") {
            for kv in extra.split(',').filter(|s| !s.is_empty()) {
                if let Some((k, v)) = kv.split_once('=') {
                    self.set(k, v);
                }
            }
        }
        self
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.first().is_none_or(|a| a.starts_with('-')) {
        // `cargo test --all-targets` runs this binary without arguments, or
        // with libtest's (`--exact --skip ...`).
        eprintln!("kstate_bench: contenders for testing/bench/run.py; see the module docs");
        return;
    }
    if let Ok(filter) = std::env::var("KSTATE_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
    IN_MEMORY.store(args.iter().any(|a| a == "--in-memory"), Ordering::Relaxed);
    if args.iter().any(|a| a == "--curve") {
        let registry = Arc::new(metrics_util::registry::Registry::atomic());
        let _ = metrics::set_global_recorder(keeping::Keeping(registry.clone()));
        let _ = CURVE.set(registry);
    }
    if let Ok(url) = opt(&args, "--remote-url") {
        let latency = opt(&args, "--remote-latency-ms").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let _ = REMOTE.set((url.to_string(), latency));
    }
    let result = run(&args);
    match result {
        Ok(json) => println!("{json}"),
        Err(e) => {
            println!("{{\"error\":{:?}}}", e.to_string());
            std::process::exit(1);
        }
    }
}

/// `--in-memory` (kstate-write, kstate-restore): the store is
/// `StoreDefinition::in_memory()`.
static IN_MEMORY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--curve` (kstate-write): per-second throughput and kstate's remote
/// counters, kept by a recorder installed for the run.
static CURVE: std::sync::OnceLock<Arc<metrics_util::registry::Registry<metrics::Key, metrics_util::registry::AtomicStorage>>> =
    std::sync::OnceLock::new();

/// `--remote-url URL` (kstate-write, kstate-restore): the store is
/// `StoreDefinition::remote()` under URL (MinIO: the `AWS_*` environment
/// of testing/minio.sh), with `--remote-latency-ms` added before every
/// request (a distant object store).
static REMOTE: std::sync::OnceLock<(String, u64)> = std::sync::OnceLock::new();

/// The bench's store `name`, in memory with `--in-memory`, remote with `--remote-url`.
fn bench_store(name: &str) -> StoreDefinition {
    let def = StoreDefinition::new(name);
    if IN_MEMORY.load(Ordering::Relaxed) {
        def.in_memory()
    } else if REMOTE.get().is_some() {
        def.remote()
    } else {
        def
    }
}

fn opt<'a>(args: &'a [String], name: &str) -> Result<&'a str, BoxError> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .ok_or_else(|| format!("missing {name}").into())
}

fn bootstrap(args: &[String]) -> String {
    opt(args, "--bootstrap").map(str::to_string).unwrap_or_else(|_| {
        std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into())
    })
}

fn run(args: &[String]) -> Result<String, BoxError> {
    let cmd = args.first().map(String::as_str).unwrap_or("");
    let b = bootstrap(args);
    match cmd {
        "consume" => consume(&b, opt(args, "--topic")?, None),
        "rocksdb-raw" => consume(&b, opt(args, "--topic")?, Some(opt(args, "--dir")?)),
        "store-load" => store_load(opt(args, "--mode")?, opt(args, "--dir")?, opt(args, "--records")?.parse()?),
        "consume-batch" => consume_batch(&b, opt(args, "--topic")?),
        "pipe" => pipe(&b, opt(args, "--input")?, opt(args, "--output")?),
        "plain-repartition" => plain_repartition(&b, opt(args, "--input")?, opt(args, "--through")?, opt(args, "--records")?.parse()?),
        "kstate-restore" => kstate_restore(
            &b,
            opt(args, "--app")?,
            opt(args, "--store")?,
            opt(args, "--input")?,
            opt(args, "--state-dir")?,
            opt(args, "--snapshot-url").ok(),
            opt(args, "--table").ok(),
        ),
        "kstate-snapshot" => kstate_snapshot(
            &b,
            opt(args, "--app")?,
            opt(args, "--store")?,
            opt(args, "--input")?,
            opt(args, "--state-dir")?,
            opt(args, "--snapshot-url")?,
        ),
        "produce" => produce(&b, opt(args, "--topic")?, opt(args, "--source")?),
        "kstate-join" => kstate_join(
            &b,
            opt(args, "--app")?,
            opt(args, "--input")?,
            opt(args, "--table")?,
            opt(args, "--records")?.parse()?,
            opt(args, "--state-dir")?,
        ),
        "kstate-repartition" => kstate_repartition(
            &b,
            opt(args, "--app")?,
            opt(args, "--input")?,
            opt(args, "--records")?.parse()?,
            opt(args, "--state-dir")?,
            opt(args, "--read-cache-bytes").ok().map(str::parse).transpose()?,
        ),
        "kstate-write" => kstate_write(
            &b,
            opt(args, "--app")?,
            opt(args, "--input")?,
            opt(args, "--records")?.parse()?,
            opt(args, "--state-dir")?,
            opt(args, "--output").ok(),
            match opt(args, "--guarantee").unwrap_or("at_least_once") {
                "at_least_once" => ProcessingGuarantee::AtLeastOnce,
                "exactly_once" => ProcessingGuarantee::ExactlyOnce,
                g => return Err(format!("--guarantee: expected exactly_once or at_least_once, got `{g}`").into()),
            },
            match opt(args, "--processor").unwrap_or("closure") {
                "closure" => false,
                "trait" => true,
                p => return Err(format!("--processor: expected closure or trait, got `{p}`").into()),
            },
            (
                opt(args, "--threads").map_or(Ok(1), str::parse)?,
                opt(args, "--work").map_or(Ok(0), str::parse)?,
                opt(args, "--max-state-memory-mib").ok().map(str::parse).transpose()?,
                opt(args, "--block-every").map_or(Ok(0), str::parse)?,
            ),
        ),
        "kstate-time" => kstate_time(
            &b,
            opt(args, "--app")?,
            opt(args, "--input")?,
            opt(args, "--records")?.parse()?,
            opt(args, "--state-dir")?,
            opt(args, "--variant")?,
        ),
        "kstate-window" => kstate_window(
            &b,
            opt(args, "--app")?,
            opt(args, "--input")?,
            Some(opt(args, "--records")?.parse()?),
            opt(args, "--state-dir")?,
            WindowSpec::of(args)?,
        ),
        "kstate-window-restore" => {
            kstate_window(&b, opt(args, "--app")?, opt(args, "--input")?, None, opt(args, "--state-dir")?, WindowSpec::of(args)?)
        }
        "query-generate" => query::generate(&b, opt(args, "--topic")?, opt(args, "--records")?.parse()?, opt(args, "--keys")?.parse()?, query::PARTITIONS),
        "kstate-query" => query::run(
            &b,
            opt(args, "--app")?,
            opt(args, "--input")?,
            opt(args, "--records")?.parse()?,
            opt(args, "--keys")?.parse()?,
            opt(args, "--state-dir")?,
            opt(args, "--variant")?,
            opt(args, "--threads").unwrap_or("4").parse()?,
            opt(args, "--rate").unwrap_or("200000").parse()?,
        ),
        "count" => count(&b, opt(args, "--topic")?, args.iter().any(|a| a == "--read-committed")),
        "delete-topics" => delete_topics(&b, opt(args, "--prefix")?),
        _ => Err(format!("unknown subcommand `{cmd}`").into()),
    }
}

/// Deletes the topics a run created, so repeated runs do not fill the broker's disk.
fn delete_topics(bootstrap: &str, prefix: &str) -> Result<String, BoxError> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let config = ClientConfig::new().set("bootstrap.servers", bootstrap).clone();
    let consumer: BaseConsumer = config.create()?;
    let md = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    let names: Vec<&str> = md.topics().iter().map(|t| t.name()).filter(|n| n.starts_with(prefix)).collect();
    if !names.is_empty() {
        let admin: AdminClient<DefaultClientContext> = config.create()?;
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for result in futures::executor::block_on(admin.delete_topics(&names, &opts))? {
            result.map_err(|(topic, code)| format!("deleting {topic}: {code}"))?;
        }
    }
    Ok(format!("{{\"deleted\":{}}}", names.len()))
}

fn partitions_of(consumer: &BaseConsumer, topic: &str) -> Result<Vec<(i32, i64, i64)>, BoxError> {
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md.topics().iter().find(|t| t.name() == topic).ok_or("topic missing")?;
    let mut out = Vec::new();
    for p in t.partitions() {
        let (lo, hi) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
        out.push((p.id(), lo, hi));
    }
    Ok(out)
}

/// The consumer of the restore contenders: librdkafka bulk-read settings
/// (no fetch-queue backoff, deep queue), as kstate's restore consumer.
fn bulk_consumer(bootstrap: &str) -> Result<BaseConsumer, BoxError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "kstate-bench-consume")
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "104857600")
        .set("max.partition.fetch.bytes", "16777216")
        .set("queued.max.messages.kbytes", "131072")
        .set("queued.min.messages", "10000000")
        .set("fetch.queue.backoff.ms", "0")
        .extend_from_env()
        .create()?)
}

/// Reads `topic` to its end; with `dir`, writes WAL-less WriteBatches into RocksDB there.
fn consume(bootstrap: &str, topic: &str, dir: Option<&str>) -> Result<String, BoxError> {
    let consumer = bulk_consumer(bootstrap)?;
    let parts = partitions_of(&consumer, topic)?;
    let db = match dir {
        Some(d) => {
            let _ = std::fs::remove_dir_all(d);
            let mut o = rocksdb::Options::default();
            o.create_if_missing(true);
            o.set_compression_type(rocksdb::DBCompressionType::Lz4);
            o.set_write_buffer_size(16 << 20); // as kstate's default
            Some(rocksdb::DB::open(&o, d)?)
        }
        None => None,
    };
    let mut wo = rocksdb::WriteOptions::default();
    wo.disable_wal(true);
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0;
    let mut ends = HashMap::new();
    for (p, lo, hi) in &parts {
        if hi > lo {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
            ends.insert(*p, *hi);
            remaining += 1;
        }
    }
    let started = Instant::now();
    consumer.assign(&tpl)?;
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut batch = rocksdb::WriteBatch::default();
    while remaining > 0 {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                records += 1;
                let k = m.key().unwrap_or_default();
                bytes += (k.len() + m.payload().map_or(0, <[u8]>::len)) as u64;
                if let Some(db) = &db {
                    match m.payload() {
                        Some(v) => batch.put(k, v),
                        None => batch.delete(k),
                    }
                    if batch.len() >= 20_000 {
                        db.write_opt(std::mem::take(&mut batch), &wo)?;
                    }
                }
                if m.offset() + 1 >= ends[&m.partition()] {
                    remaining -= 1;
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    if let Some(db) = &db {
        db.write_opt(batch, &wo)?;
        db.flush()?;
    }
    let secs = started.elapsed().as_secs_f64();
    let contender = if dir.is_some() { "rocksdb-raw" } else { "plain-consumer" };
    Ok(format!(
        "{{\"contender\":\"{contender}\",\"records\":{records},\"bytes\":{bytes},\"seconds\":{secs:.4},\"records_per_sec\":{:.1}}}",
        records as f64 / secs
    ))
}

/// A consumer whose partitions of `topic` are forwarded to one queue that is
/// read up to 1024 records per call (`rd_kafka_consume_batch_queue`), as
/// kstate reads.
struct BatchReader {
    queue: *mut rdkafka::bindings::rd_kafka_queue_t,
    /// End offset per partition still to be reached.
    ends: HashMap<i32, i64>,
    /// Kept alive (and dropped after the queue) while the queue is read.
    _consumer: BaseConsumer,
}

impl BatchReader {
    fn new(consumer: BaseConsumer, topic: &str) -> Result<BatchReader, BoxError> {
        use rdkafka::bindings as rdsys;
        let parts = partitions_of(&consumer, topic)?;
        let rk = consumer.client().native_ptr();
        let ctopic = std::ffi::CString::new(topic)?;
        // SAFETY: destroyed in Drop, before the consumer (a later field).
        let queue = unsafe { rdsys::rd_kafka_queue_new(rk) };
        let mut tpl = TopicPartitionList::new();
        let mut ends = HashMap::new();
        for (p, lo, hi) in &parts {
            if hi > lo {
                unsafe {
                    let pq = rdsys::rd_kafka_queue_get_partition(rk, ctopic.as_ptr(), *p);
                    rdsys::rd_kafka_queue_forward(pq, queue);
                    rdsys::rd_kafka_queue_destroy(pq);
                }
                tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
                ends.insert(*p, *hi);
            }
        }
        consumer.assign(&tpl)?;
        Ok(BatchReader { queue, ends, _consumer: consumer })
    }

    /// Calls `f(partition, key, value)` for every record until every
    /// partition reached its end offset.
    fn read_all(&mut self, mut f: impl FnMut(i32, &[u8], &[u8])) -> Result<(), BoxError> {
        use rdkafka::bindings as rdsys;
        let mut remaining = self.ends.len();
        let mut msgs: Vec<*mut rdsys::rd_kafka_message_t> = Vec::with_capacity(1024);
        let mut failure = None;
        while remaining > 0 && failure.is_none() {
            let n = unsafe { rdsys::rd_kafka_consume_batch_queue(self.queue, 100, msgs.as_mut_ptr(), 1024) };
            unsafe { msgs.set_len(n.max(0) as usize) };
            for &m in &msgs {
                let m = unsafe { &*m };
                if m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    failure = Some(format!("consumer error {:?}", m.err));
                    continue;
                }
                let bytes = |p: *mut std::ffi::c_void, len: usize| -> &[u8] {
                    if p.is_null() { &[] } else { unsafe { std::slice::from_raw_parts(p as *const u8, len) } }
                };
                f(m.partition, bytes(m.key, m.key_len), bytes(m.payload, m.len));
                if m.offset + 1 >= self.ends[&m.partition] {
                    remaining -= 1;
                }
            }
            for m in msgs.drain(..) {
                unsafe { rdsys::rd_kafka_message_destroy(m) };
            }
        }
        failure.map_or(Ok(()), |f| Err(f.into()))
    }
}

impl Drop for BatchReader {
    fn drop(&mut self) {
        unsafe { rdkafka::bindings::rd_kafka_queue_destroy(self.queue) };
    }
}

/// The plain consumer again, reading batches as kstate's restore does: what
/// librdkafka itself can deliver here.
fn consume_batch(bootstrap: &str, topic: &str) -> Result<String, BoxError> {
    let mut reader = BatchReader::new(bulk_consumer(bootstrap)?, topic)?;
    let started = Instant::now();
    let (mut records, mut bytes) = (0u64, 0u64);
    reader.read_all(|_, k, v| {
        records += 1;
        bytes += (k.len() + v.len()) as u64;
    })?;
    let secs = started.elapsed().as_secs_f64();
    Ok(format!(
        "{{\"contender\":\"plain-consumer-batch\",\"records\":{records},\"bytes\":{bytes},\"seconds\":{secs:.4},\"records_per_sec\":{:.1}}}",
        records as f64 / secs
    ))
}

/// The changelog producer's settings, shared by the producing contenders.
fn bench_producer(bootstrap: &str) -> Result<ThreadedProducer<DefaultProducerContext>, BoxError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

fn send_retrying(producer: &ThreadedProducer<DefaultProducerContext>, mut r: BaseRecord<'_, [u8], [u8]>) {
    loop {
        match producer.send(r) {
            Ok(()) => return,
            Err((_, back)) => {
                r = back;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Consume-then-produce with no store: every input record is read in
/// batches (kstate's processing consumer settings) and sent to `output`
/// (the changelog producer's settings). The ceiling of any
/// consume-process-produce loop here; timed from the first record read to
/// the last one acknowledged.
fn pipe(bootstrap: &str, input: &str, output: &str) -> Result<String, BoxError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "kstate-bench-pipe")
        .set("enable.auto.commit", "false")
        .set("fetch.queue.backoff.ms", "10")
        .extend_from_env()
        .create()?;
    let producer = bench_producer(bootstrap)?;
    let mut reader = BatchReader::new(consumer, input)?;
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut first = None;
    reader.read_all(|p, k, v| {
        first.get_or_insert_with(Instant::now);
        records += 1;
        bytes += (k.len() + v.len()) as u64;
        send_retrying(&producer, BaseRecord::<[u8], [u8]>::to(output).partition(p).key(k).payload(v));
    })?;
    // Until every record is acknowledged, like the plain producer: with a
    // 1M-message producer queue, N-th sent would leave half the data unsent.
    producer.flush(Duration::from_secs(120))?;
    let secs = first.ok_or("nothing read")?.elapsed().as_secs_f64();
    Ok(format!(
        "{{\"contender\":\"consume-produce\",\"records\":{records},\"bytes\":{bytes},\"seconds\":{secs:.4},\"records_per_sec\":{:.1}}}",
        records as f64 / secs
    ))
}

/// The `repartition` scenario with plain clients and no state store: one
/// thread reads `input` in batches and sends each record re-keyed (the
/// value's first two bytes) to `through`, while this thread reads
/// `through` from its start and counts per key in a hash map, timed from
/// the first count to the `records`-th, as `kstate-repartition`. What any
/// re-keying count costs on this broker and machine: the baseline that
/// says which part of the rate is kstate's.
fn plain_repartition(bootstrap: &str, input: &str, through: &str, records: u64) -> Result<String, BoxError> {
    let consumer = |group: &str| -> Result<BaseConsumer, BoxError> {
        Ok(ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("fetch.queue.backoff.ms", "10")
            .extend_from_env()
            .create()?)
    };
    let reader = consumer("kstate-bench-plain-repartition-in")?;
    let producer = bench_producer(bootstrap)?;
    let (source, target) = (input.to_string(), through.to_string());
    let sender = std::thread::spawn(move || -> Result<(), String> {
        BatchReader::new(reader, &source)
            .map_err(|e| e.to_string())?
            .read_all(|_, _, v| {
                let key = [v.first().copied().unwrap_or(0), v.get(1).copied().unwrap_or(0)];
                send_retrying(&producer, BaseRecord::<[u8], [u8]>::to(&target).key(&key[..]).payload(&[][..]));
            })
            .map_err(|e| e.to_string())?;
        producer.flush(Duration::from_secs(120)).map_err(|e| e.to_string())
    });
    let counter = consumer("kstate-bench-plain-repartition-out")?;
    let mut tpl = TopicPartitionList::new();
    for (p, _, _) in partitions_of(&counter, through)? {
        tpl.add_partition_offset(through, p, Offset::Beginning)?;
    }
    counter.assign(&tpl)?;
    let mut counts: HashMap<Vec<u8>, u64> = HashMap::new();
    let (mut counted, mut first) = (0u64, None);
    let deadline = Instant::now() + Duration::from_secs(600);
    while counted < records {
        if Instant::now() > deadline {
            return Err(format!("counted {counted} of {records} records in 600 s").into());
        }
        if let Some(m) = counter.poll(Duration::from_millis(100)) {
            let m = m?;
            first.get_or_insert_with(Instant::now);
            *counts.entry(m.key().unwrap_or_default().to_vec()).or_default() += 1;
            counted += 1;
        }
    }
    let secs = first.ok_or("nothing counted")?.elapsed().as_secs_f64();
    sender.join().map_err(|_| "the sender panicked")??;
    Ok(format!(
        "{{\"contender\":\"plain-clients\",\"records\":{records},\"seconds\":{secs:.4},\"records_per_sec\":{:.1},\"keys\":{}}}",
        records as f64 / secs,
        counts.len()
    ))
}

#[derive(Default, Clone)]
struct Times {
    first_start: Arc<Mutex<Option<Instant>>>,
    starts: Arc<Mutex<Vec<RestoreStart>>>,
    ends: Arc<Mutex<Vec<(Instant, RestoreEnd)>>>,
}

impl Times {
    /// Records and bytes restored, and seconds from the first restore's
    /// start to the last one's end.
    fn summary(&self) -> Result<(u64, u64, f64), BoxError> {
        let ends = self.ends.lock().unwrap();
        let first = self.first_start.lock().unwrap().ok_or("no restore started")?;
        let last = ends.iter().map(|e| e.0).max().ok_or("no restore ended")?;
        let records: u64 = ends.iter().map(|e| e.1.records).sum();
        let bytes: u64 = ends.iter().map(|e| e.1.bytes).sum();
        Ok((records, bytes, (last - first).as_secs_f64().max(1e-6)))
    }
}

impl RestoreListener for Times {
    fn on_restore_start(&self, e: &RestoreStart) {
        self.first_start.lock().unwrap().get_or_insert_with(Instant::now);
        self.starts.lock().unwrap().push(e.clone());
    }
    fn on_restore_end(&self, e: &RestoreEnd) {
        self.ends.lock().unwrap().push((Instant::now(), e.clone()));
    }
}

fn kstate_restore(
    bootstrap: &str,
    app: &str,
    store: &str,
    input: &str,
    state: &str,
    snapshot_url: Option<&str>,
    table: Option<&str>,
) -> Result<String, BoxError> {
    let admin: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let partitions = partitions_of(&admin, input)?.len();
    let times = Times::default();
    let builder = bench_app(bootstrap, app, input, state).restore_listener(times.clone());
    let mut builder = match table {
        // A source table on the topic: committed at its end, so that the
        // restore replays all of it (as a changelog restore does).
        Some(topic) => {
            let group: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).set("group.id", app).create()?;
            let mut tpl = rdkafka::TopicPartitionList::new();
            for (p, _, high) in partitions_of(&admin, topic)? {
                tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(high))?;
            }
            group.commit(&tpl, rdkafka::consumer::CommitMode::Sync)?;
            builder.table(topic, StoreDefinition::new(store))
        }
        None => builder.store(bench_store(store)),
    };
    if let Some(url) = snapshot_url {
        builder = builder.snapshots(kstate::SnapshotConfig::new(url).interval(Duration::from_secs(24 * 3600)));
    }
    let app = builder.build()?;
    let stop = app.shutdown_handle();
    let started = Instant::now();
    let runner = std::thread::spawn(move || app.run(|_, _| Ok::<(), kstate::Error>(())));
    while times.ends.lock().unwrap().len() < partitions {
        if runner.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let to_running = started.elapsed().as_secs_f64();
    stop.shutdown();
    runner.join().map_err(|_| "runtime panicked")??;
    let (records, bytes, secs) = times.summary()?;
    let seeds: Vec<kstate::SnapshotSeed> = times.starts.lock().unwrap().iter().filter_map(|s| s.snapshot.clone()).collect();
    let seeded_bytes: u64 = seeds.iter().map(|s| s.bytes).sum();
    let download = seeds.iter().map(|s| s.download.as_secs_f64()).fold(0.0, f64::max);
    Ok(format!(
        "{{\"contender\":\"{}\",\"records\":{records},\"bytes\":{bytes},\"seconds\":{secs:.4},\"records_per_sec\":{:.1},\"seconds_to_running\":{to_running:.4},\
         \"seeded_partitions\":{},\"seeded_bytes\":{seeded_bytes},\"download_seconds\":{download:.4}}}",
        if table.is_some() { "kstate-table" } else { "kstate" },
        records as f64 / secs,
        seeds.len()
    ))
}

/// Opens the state dir (replaying any tail), then takes a snapshot of every
/// store partition at once and waits until each is listed at its
/// changelog's last offset.
fn kstate_snapshot(bootstrap: &str, app_id: &str, store: &str, input: &str, state: &str, url: &str) -> Result<String, BoxError> {
    let admin: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let partitions = partitions_of(&admin, input)?.len();
    let changelog = kstate::changelog_topic(app_id, store);
    let last: HashMap<i32, i64> = partitions_of(&admin, &changelog)?.into_iter().map(|(p, _, hi)| (p, hi - 1)).collect();
    let at = kstate::admin::SnapshotStore { url: url.to_string(), options: vec![] };
    let before: HashSet<(i32, String)> = kstate::admin::list_snapshots(&at, app_id, Some(store))
        .unwrap_or_default()
        .into_iter()
        .flat_map(|p| p.snapshots.into_iter().flat_map(move |s| s.files.into_iter().map(move |f| (p.partition, f.object))))
        .collect();
    let times = Times::default();
    let app = bench_app(bootstrap, app_id, input, state)
        .store(StoreDefinition::new(store))
        .restore_listener(times.clone())
        .snapshots(kstate::SnapshotConfig::new(url).interval(Duration::from_secs(24 * 3600)).seed_stores(false))
        .build()?;
    let stop = app.shutdown_handle();
    let handle = app.snapshot_handle();
    let runner = std::thread::spawn(move || app.run(|_, _| Ok::<(), kstate::Error>(())));
    while times.ends.lock().unwrap().len() < partitions && !runner.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Past the first round of the snapshot thread (which skips nothing
    // but finds the tasks still opening).
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    handle.snapshot_now();
    let newest = loop {
        let listed = kstate::admin::list_snapshots(&at, app_id, Some(store))?;
        let newest: Vec<kstate::RemoteSnapshot> =
            listed.into_iter().filter_map(|p| p.snapshots.into_iter().max_by_key(|s| s.checkpoint)).collect();
        if newest.len() == last.len() && newest.iter().all(|s| s.checkpoint >= last[&s.partition]) {
            break newest;
        }
        if runner.is_finished() || started.elapsed() > Duration::from_secs(1800) {
            return Err("the snapshots did not appear".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = started.elapsed().as_secs_f64();
    stop.shutdown();
    runner.join().map_err(|_| "runtime panicked")??;
    let full: u64 = newest.iter().map(|s| s.bytes()).sum();
    let uploaded: u64 =
        newest.iter().flat_map(|s| s.files.iter().filter(|f| !before.contains(&(s.partition, f.object.clone()))).map(|f| f.size)).sum();
    let files: usize = newest.iter().map(|s| s.files.len()).sum();
    Ok(format!(
        "{{\"contender\":\"kstate-snapshot\",\"seconds\":{secs:.4},\"uploaded_bytes\":{uploaded},\"full_bytes\":{full},\"files\":{files},\
         \"upload_bytes_per_sec\":{:.1}}}",
        uploaded as f64 / secs
    ))
}

/// Re-sends every record of `source` to `topic` (same partition) with a plain producer.
fn produce(bootstrap: &str, topic: &str, source: &str) -> Result<String, BoxError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "kstate-bench-produce")
        .set("enable.auto.commit", "false")
        .create()?;
    // Load the records first so that only producing is timed.
    let parts = partitions_of(&consumer, source)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for (p, lo, hi) in &parts {
        if hi > lo {
            tpl.add_partition_offset(source, *p, Offset::Beginning)?;
            ends.insert(*p, *hi);
        }
    }
    consumer.assign(&tpl)?;
    let mut recs: Vec<(i32, Vec<u8>, Vec<u8>)> = Vec::new();
    let mut remaining = ends.len();
    while remaining > 0 {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m?;
            recs.push((m.partition(), m.key().unwrap_or_default().to_vec(), m.payload().unwrap_or_default().to_vec()));
            if m.offset() + 1 >= ends[&m.partition()] {
                remaining -= 1;
            }
        }
    }
    let producer = bench_producer(bootstrap)?;
    let started = Instant::now();
    let mut bytes = 0u64;
    for (p, k, v) in &recs {
        bytes += (k.len() + v.len()) as u64;
        send_retrying(&producer, BaseRecord::<[u8], [u8]>::to(topic).partition(*p).key(k).payload(v));
    }
    producer.flush(Duration::from_secs(120))?;
    let secs = started.elapsed().as_secs_f64();
    Ok(format!(
        "{{\"contender\":\"plain-producer\",\"records\":{},\"bytes\":{bytes},\"seconds\":{secs:.4},\"records_per_sec\":{:.1}}}",
        recs.len(),
        recs.len() as f64 / secs
    ))
}

/// `KSTATE_BENCH_RDKAFKA` settings as kstate `kafka_config` entries.
/// A kstate contender's builder: its application id, broker, input and
/// state dir, with the `KSTATE_BENCH_RDKAFKA` overrides.
fn bench_app(bootstrap: &str, app: &str, input: &str, state: &str) -> kstate::AppBuilder {
    let b = with_env_kafka_config(App::builder()).application_id(app).bootstrap_servers(bootstrap).input_topic(input).state_dir(state);
    match REMOTE.get() {
        Some((url, latency)) => {
            let mut config = kstate::RemoteStateConfig::new(url.clone()).simulated_latency(Duration::from_millis(*latency));
            if let Ok(endpoint) = std::env::var("KSTATE_S3_ENDPOINT") {
                config = config.option("aws_endpoint", endpoint).option("aws_allow_http", "true");
            }
            b.remote_state(config)
        }
        None => b,
    }
}

fn with_env_kafka_config(mut b: kstate::AppBuilder) -> kstate::AppBuilder {
    if let Ok(extra) = std::env::var("KSTATE_BENCH_RDKAFKA") {
        for kv in extra.split(',').filter(|s| !s.is_empty()) {
            if let Some((k, v)) = kv.split_once('=') {
                b = b.kafka_config(k, v);
            }
        }
    }
    b
}

/// What the write contender does per record, as a closure or as a
/// `Processor` (`--processor trait`): the same body either way, so their
/// difference is the cost of the trait's dispatch.
#[derive(Clone)]
struct WriteBody {
    out_topic: Option<String>,
    records: u64,
    seen: Arc<AtomicU64>,
    first: Arc<Mutex<Option<Instant>>>,
    last: Arc<Mutex<Option<Instant>>>,
    stop: kstate::ShutdownHandle,
    /// Rounds of CPU work per record (the `threads` scenario): the record's
    /// value mixed with the key's stored value that many times, the result
    /// stored instead of the value (a read-modify-write).
    work: u32,
    /// A 1 ms sleep every this many records (0: never): processing that
    /// waits on something else (a lookup, a disk) with the CPU idle.
    block_every: u64,
    /// With `work`: the get and put of every 16th record, timed (ns).
    latencies: Arc<Mutex<(Vec<u32>, Vec<u32>)>>,
}

/// The `q` quantile of `v` (sorts it), 0 if empty.
fn quantile(v: &mut [u32], q: f64) -> u32 {
    v.sort_unstable();
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or(0)
}

impl WriteBody {
    fn process(&self, ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> kstate::Result<()> {
        if self.seen.load(Ordering::Relaxed) == 0 {
            *self.first.lock().unwrap() = Some(Instant::now());
        }
        let store = ctx.store("kv")?;
        match rec.value {
            Some(v) if self.work > 0 => {
                let key = rec.key.unwrap_or_default();
                let timed = self.seen.load(Ordering::Relaxed).is_multiple_of(16);
                let started = Instant::now();
                let mut acc = store.get(key)?.unwrap_or_default();
                let got = started.elapsed();
                acc.resize(v.len().max(8), 0);
                for round in 0..self.work {
                    for (i, b) in v.iter().enumerate() {
                        acc[i] = acc[i].rotate_left(3) ^ b.wrapping_add(round as u8);
                    }
                }
                let started = Instant::now();
                store.put(key, &std::hint::black_box(acc))?;
                if timed {
                    let mut l = self.latencies.lock().unwrap();
                    l.0.push(got.as_nanos() as u32);
                    l.1.push(started.elapsed().as_nanos() as u32);
                }
            }
            Some(v) => store.put(rec.key.unwrap_or_default(), v)?,
            None => store.delete(rec.key.unwrap_or_default())?,
        }
        // The record unchanged (a null value stays a tombstone), partitioned by its key.
        if let Some(topic) = &self.out_topic {
            let mut out = Output::to(topic);
            if let Some(k) = rec.key {
                out = out.key(k);
            }
            if let Some(v) = rec.value {
                out = out.value(v);
            }
            ctx.send(out)?;
        }
        let seen = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if self.block_every > 0 && seen.is_multiple_of(self.block_every) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if seen == self.records {
            *self.last.lock().unwrap() = Some(Instant::now());
            self.stop.shutdown();
        }
        Ok(())
    }
}

impl kstate::Processor for WriteBody {
    fn process(&mut self, ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), kstate::ProcessorError> {
        WriteBody::process(self, ctx, rec).map_err(Into::into)
    }
}

#[allow(clippy::too_many_arguments)]
fn kstate_write(
    bootstrap: &str,
    app: &str,
    input: &str,
    records: u64,
    state: &str,
    output: Option<&str>,
    guarantee: ProcessingGuarantee,
    as_trait: bool,
    (threads, work, memory, block_every): (usize, u32, Option<usize>, u64),
) -> Result<String, BoxError> {
    let mut app = bench_app(bootstrap, app, input, state)
        .store(bench_store("kv"))
        .commit_interval(Duration::from_millis(100))
        .processing_guarantee(guarantee)
        .num_stream_threads(threads);
    if let Some(mib) = memory {
        app = app.max_state_memory(mib << 20);
    }
    let app = app.build()?;
    let body = WriteBody {
        out_topic: output.map(str::to_string),
        records,
        seen: Arc::new(AtomicU64::new(0)),
        first: Arc::new(Mutex::new(None)),
        last: Arc::new(Mutex::new(None)),
        stop: app.shutdown_handle(),
        work,
        block_every,
        latencies: Arc::default(),
    };
    let (first, last, latencies) = (body.first.clone(), body.last.clone(), body.latencies.clone());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = CURVE.get().map(|_| {
        let (seen, first, done) = (body.seen.clone(), body.first.clone(), done.clone());
        std::thread::spawn(move || per_second(&seen, &first, &done, 60))
    });
    let runner = std::thread::spawn(move || {
        if as_trait {
            app.run_processor(move |_| body.clone())
        } else {
            app.run(move |ctx, rec| body.process(ctx, rec))
        }
    });
    let ran = runner.join().map_err(|_| "runtime panicked");
    done.store(true, Ordering::SeqCst);
    ran??;
    let curve = match sampler {
        Some(s) => format!(",\"curve\":{:?},{}", s.join().map_err(|_| "sampler panicked")?, remote_counters()),
        None => String::new(),
    };
    let stopped = Instant::now();
    let (f, l) = (first.lock().unwrap().ok_or("nothing processed")?, last.lock().unwrap().ok_or("did not finish")?);
    let secs = (l - f).as_secs_f64();
    let to_stopped = (stopped - f).as_secs_f64();
    let guarantee = match guarantee {
        ProcessingGuarantee::ExactlyOnce => "exactly_once",
        _ => "at_least_once",
    };
    let output = output.map_or("null".to_string(), |t| format!("{t:?}"));
    let processor = if as_trait { "trait" } else { "closure" };
    let (gets, puts) = &mut *latencies.lock().unwrap();
    let (get50, get99, put50, put99) = (quantile(gets, 0.5), quantile(gets, 0.99), quantile(puts, 0.5), quantile(puts, 0.99));
    Ok(format!(
        "{{\"contender\":\"kstate\",\"records\":{records},\"seconds\":{secs:.4},\"records_per_sec\":{:.1},\"seconds_to_stopped\":{to_stopped:.4},\"processing_guarantee\":\"{guarantee}\",\"output_topic\":{output},\"processor\":\"{processor}\",\"threads\":{threads},\"work\":{work},\"block_every\":{block_every},\"get_ns_p50\":{get50},\"get_ns_p99\":{get99},\"put_ns_p50\":{put50},\"put_ns_p99\":{put99}{curve}}}",
        records as f64 / secs
    ))
}

/// Records processed in each second after the first one, for `limit`
/// seconds or until the run is `done`.
fn per_second(seen: &AtomicU64, first: &Mutex<Option<Instant>>, done: &std::sync::atomic::AtomicBool, limit: usize) -> Vec<u64> {
    let start = loop {
        if let Some(t) = *first.lock().unwrap() {
            break t;
        }
        if done.load(Ordering::SeqCst) {
            return Vec::new();
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut curve = Vec::new();
    let mut before = 0;
    while curve.len() < limit {
        let next = start + Duration::from_secs(curve.len() as u64 + 1);
        while Instant::now() < next {
            if done.load(Ordering::SeqCst) {
                return curve;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let now = seen.load(Ordering::Relaxed);
        curve.push(now - before);
        before = now;
    }
    curve
}

/// kstate's remote-store counters as JSON fields: `remote_requests`
/// (by kind), `remote_bytes` (by direction), cache hits and misses.
fn remote_counters() -> String {
    let Some(registry) = CURVE.get() else { return String::new() };
    let (mut requests, mut bytes, mut hits, mut misses) = (Vec::new(), Vec::new(), 0, 0);
    registry.visit_counters(|key, counter| {
        let value = counter.load(Ordering::Relaxed);
        let label = |name: &str| key.labels().find(|l| l.key() == name).map(|l| l.value().to_string()).unwrap_or_default();
        match key.name() {
            "kstate_remote_requests_total" => requests.push(format!("{:?}:{value}", label("kind"))),
            "kstate_remote_bytes_total" => bytes.push(format!("{:?}:{value}", label("direction"))),
            "kstate_remote_cache_hits_total" => hits += value,
            "kstate_remote_cache_misses_total" => misses += value,
            _ => {}
        }
    });
    requests.sort();
    bytes.sort();
    format!(
        "\"remote_requests\":{{{}}},\"remote_bytes\":{{{}}},\"remote_cache_hits\":{hits},\"remote_cache_misses\":{misses}",
        requests.join(","),
        bytes.join(",")
    )
}

/// A stream-table left join: `table` read as a source table
/// (`AppBuilder::table`), each stream record looked up in it (the Kafka
/// Streams contender's `stream.leftJoin(builder.table(..))`), no output.
/// Timed from the first to the `records`-th stream record.
fn kstate_join(bootstrap: &str, app_id: &str, input: &str, table: &str, records: u64, state: &str) -> Result<String, BoxError> {
    let app = bench_app(bootstrap, app_id, input, state)
        .table(table, StoreDefinition::new("table"))
        .commit_interval(Duration::from_millis(100))
        .build()?;
    let stop = app.shutdown_handle();
    let joined = Arc::new(AtomicU64::new(0));
    let times: Arc<Mutex<(Option<Instant>, Option<Instant>)>> = Arc::default();
    let (seen, span, table_topic) = (joined.clone(), times.clone(), table.to_string());
    let found = Arc::new(AtomicU64::new(0));
    let hits = found.clone();
    let runner = std::thread::spawn(move || {
        app.run(move |ctx, rec| {
            if rec.topic == table_topic {
                return Ok(()); // the table has it
            }
            let key = rec.key.unwrap_or_default();
            if ctx.store("table")?.get(key)?.is_some() {
                hits.fetch_add(1, Ordering::Relaxed);
            }
            let c = seen.fetch_add(1, Ordering::Relaxed) + 1;
            if c == 1 {
                span.lock().unwrap().0 = Some(Instant::now());
            }
            if c == records {
                span.lock().unwrap().1 = Some(Instant::now());
                stop.shutdown();
            }
            Ok::<(), kstate::Error>(())
        })
    });
    runner.join().map_err(|_| "runtime panicked")??;
    let (first, last) = *times.lock().unwrap();
    let secs = (last.ok_or("did not join every record")? - first.ok_or("nothing joined")?).as_secs_f64();
    Ok(format!(
        "{{\"contender\":\"kstate\",\"records\":{records},\"seconds\":{secs:.4},\"records_per_sec\":{:.1},\"found\":{}}}",
        records as f64 / secs,
        found.load(Ordering::Relaxed)
    ))
}

/// A count re-keyed through a repartition topic: each input record goes
/// to the task of its value's first two bytes (`ctx.repartition`), which
/// counts it (the Kafka Streams contender's `groupBy(..).count()`). Timed,
/// as that one, from the first count update to the `records`-th.
fn kstate_repartition(
    bootstrap: &str,
    app_id: &str,
    input: &str,
    records: u64,
    state: &str,
    read_cache: Option<usize>,
) -> Result<String, BoxError> {
    let mut app = bench_app(bootstrap, app_id, input, state)
        .store(StoreDefinition::new("counts"))
        .repartition("by-prefix")
        .commit_interval(Duration::from_millis(100));
    if let Some(bytes) = read_cache {
        app = app.read_cache_bytes(bytes);
    }
    let app = app.build()?;
    let by_prefix = kstate::repartition_topic(app_id, "by-prefix");
    let stop = app.shutdown_handle();
    let counted = Arc::new(AtomicU64::new(0));
    let times: Arc<Mutex<(Option<Instant>, Option<Instant>)>> = Arc::default();
    let (seen, span) = (counted.clone(), times.clone());
    let runner = std::thread::spawn(move || {
        app.run(move |ctx, rec| {
            if rec.topic != by_prefix {
                let Some(v) = rec.value else { return Ok(()) };
                let key = [v.first().copied().unwrap_or(0), v.get(1).copied().unwrap_or(0)];
                return ctx.repartition("by-prefix", &key, b"");
            }
            let key = rec.key.unwrap_or_default();
            let counts = ctx.store("counts")?;
            let n = counts.get(key)?.map_or(0, |v| u64::from_be_bytes(v.as_slice().try_into().unwrap_or([0; 8]))) + 1;
            counts.put(key, &n.to_be_bytes())?;
            let c = seen.fetch_add(1, Ordering::Relaxed) + 1;
            if c == 1 {
                span.lock().unwrap().0 = Some(Instant::now());
            }
            if c == records {
                span.lock().unwrap().1 = Some(Instant::now());
                stop.shutdown();
            }
            Ok::<(), kstate::Error>(())
        })
    });
    runner.join().map_err(|_| "runtime panicked")??;
    let (first, last) = *times.lock().unwrap();
    let secs = (last.ok_or("did not count every record")? - first.ok_or("nothing counted")?).as_secs_f64();
    Ok(format!(
        "{{\"contender\":\"kstate\",\"records\":{records},\"seconds\":{secs:.4},\"records_per_sec\":{:.1},\"counted\":{}}}",
        records as f64 / secs,
        counted.load(Ordering::Relaxed)
    ))
}

/// The windowing of the `window` scenario (same options and defaults as
/// the Kafka Streams contender's `window`).
#[derive(Clone, Copy)]
struct WindowSpec {
    size_ms: u64,
    advance_ms: u64,
    /// Event time = base + offset × step (per partition), as the Java contender.
    step_ms: i64,
    base_ms: i64,
}

impl WindowSpec {
    fn of(args: &[String]) -> Result<WindowSpec, BoxError> {
        let num = |name: &str, default: u64| -> Result<u64, BoxError> { Ok(opt(args, name).map_or(Ok(default), str::parse)?) };
        Ok(WindowSpec {
            size_ms: num("--window-size-ms", 300_000)?,
            advance_ms: num("--advance-ms", 60_000)?,
            step_ms: num("--event-step-ms", 5)? as i64,
            base_ms: num("--event-base-ms", 0)? as i64,
        })
    }
}

/// Hopping-window counts (`update` of the windows holding each record's
/// event time) of `records` input records, timed from the first to the
/// last; with `records` `None`, the restore of the window store from its
/// changelog into an empty state dir, timed from the first restore start
/// to the last end.
fn kstate_window(bootstrap: &str, app: &str, input: &str, records: Option<u64>, state: &str, w: WindowSpec) -> Result<String, BoxError> {
    use kstate::codec::{RawBytes, U64Be};
    let admin: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let partitions = partitions_of(&admin, input)?.len();
    let times = Times::default();
    let windows = kstate::Windows::hopping(Duration::from_millis(w.size_ms), Duration::from_millis(w.advance_ms));
    let app = bench_app(bootstrap, app, input, state)
        .store(StoreDefinition::window("w", windows))
        .commit_interval(Duration::from_millis(100))
        .timestamp_extractor(move |rec, _| w.base_ms + rec.offset * w.step_ms)
        .restore_listener(times.clone())
        .build()?;
    let stop = app.shutdown_handle();
    let seen = Arc::new(AtomicU64::new(0));
    let (first, last) = (Arc::new(Mutex::new(None::<Instant>)), Arc::new(Mutex::new(None::<Instant>)));
    let (s, f, l, st) = (seen.clone(), first.clone(), last.clone(), stop.clone());
    let target = records.unwrap_or(u64::MAX);
    let started = Instant::now();
    let runner = std::thread::spawn(move || {
        app.run(move |ctx, rec| {
            if s.load(Ordering::Relaxed) == 0 {
                *f.lock().unwrap() = Some(Instant::now());
            }
            if let (Some(k), Some(_)) = (rec.key, rec.value) {
                let now = ctx.timestamp().unwrap_or_default();
                let _ = ctx.window_store::<RawBytes, U64Be>("w")?.update(&k.to_vec(), now, |_, n| n.unwrap_or(0) + 1)?;
            }
            if s.fetch_add(1, Ordering::Relaxed) + 1 == target {
                *l.lock().unwrap() = Some(Instant::now());
                st.shutdown();
            }
            Ok::<(), kstate::Error>(())
        })
    });
    if records.is_none() {
        // Two stores per partition: the window store and the time store.
        while times.ends.lock().unwrap().len() < 2 * partitions && !runner.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let to_running = started.elapsed().as_secs_f64();
        stop.shutdown();
        runner.join().map_err(|_| "runtime panicked")??;
        let (restored, _, secs) = times.summary()?;
        return Ok(format!(
            "{{\"contender\":\"kstate\",\"mode\":\"window-restore\",\"records\":{restored},\"seconds\":{secs:.4},\"records_per_sec\":{:.1},\"seconds_to_running\":{to_running:.4}}}",
            restored as f64 / secs
        ));
    }
    runner.join().map_err(|_| "runtime panicked")??;
    let (f, l) = (first.lock().unwrap().ok_or("nothing processed")?, last.lock().unwrap().ok_or("did not finish")?);
    let secs = (l - f).as_secs_f64();
    let n = records.unwrap_or_default();
    Ok(format!(
        "{{\"contender\":\"kstate\",\"mode\":\"window\",\"records\":{n},\"seconds\":{secs:.4},\"records_per_sec\":{:.1}}}",
        n as f64 / secs
    ))
}

/// The time workloads, each a [`kstate::Processor`] writing every input
/// record into store `kv` (a tombstone deletes):
/// - `plain`: just that;
/// - `timers`: plus a stream-time timer registered per record, 100 ms of
///   event time ahead, keyed by the record key (in steady state one timer
///   fires per record; the callback does nothing), with timers enabled;
/// - `ttl`: `kv` has a one-hour wall-clock TTL;
/// - `read` / `ttl-read`: `plain` / `ttl` plus a `get` of the key before the write.
fn kstate_time(bootstrap: &str, app: &str, input: &str, records: u64, state: &str, variant: &str) -> Result<String, BoxError> {
    use kstate::{Processor, ProcessorContext, ProcessorError, Record, TimeDomain, Timer};
    let (timers, ttl, read) = match variant {
        "plain" => (false, false, false),
        "timers" => (true, false, false),
        "ttl" => (false, true, false),
        "read" => (false, false, true),
        "ttl-read" => (false, true, true),
        v => return Err(format!("--variant: expected plain, timers, ttl, read or ttl-read, got `{v}`").into()),
    };
    let mut store = StoreDefinition::new("kv");
    if ttl {
        store = store.ttl(Duration::from_secs(3600), TimeDomain::WallClock);
    }
    let app = bench_app(bootstrap, app, input, state)
        .store(store)
        .timers(timers)
        .commit_interval(Duration::from_millis(100))
        .build()?;
    struct Work {
        timers: bool,
        read: bool,
        seen: Arc<AtomicU64>,
        first: Arc<Mutex<Option<Instant>>>,
        last: Arc<Mutex<Option<Instant>>>,
        fired: Arc<AtomicU64>,
        records: u64,
        stop: kstate::ShutdownHandle,
    }
    impl Processor for Work {
        fn process(&mut self, ctx: &mut ProcessorContext<'_>, rec: &Record<'_>) -> Result<(), ProcessorError> {
            if self.seen.load(Ordering::Relaxed) == 0 {
                *self.first.lock().unwrap() = Some(Instant::now());
            }
            let key = rec.key.unwrap_or_default();
            let store = ctx.store("kv")?;
            if self.read {
                std::hint::black_box(store.get(key)?);
            }
            match rec.value {
                Some(v) => store.put(key, v)?,
                None => store.delete(key)?,
            }
            if self.timers {
                let at = ctx.timestamp().unwrap_or(0) + 100;
                ctx.register_timer(TimeDomain::StreamTime, key, at)?;
            }
            if self.seen.fetch_add(1, Ordering::Relaxed) + 1 == self.records {
                *self.last.lock().unwrap() = Some(Instant::now());
                self.stop.shutdown();
            }
            Ok(())
        }
        fn on_timer(&mut self, _: &mut ProcessorContext<'_>, _: &Timer) -> Result<(), ProcessorError> {
            self.fired.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }
    let (seen, first, last, fired) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None)), Arc::new(AtomicU64::new(0)));
    let stop = app.shutdown_handle();
    let (s, f, l, fi) = (seen.clone(), first.clone(), last.clone(), fired.clone());
    let runner = std::thread::spawn(move || {
        app.run_processor(move |_| Work {
            timers,
            read,
            seen: s.clone(),
            first: f.clone(),
            last: l.clone(),
            fired: fi.clone(),
            records,
            stop: stop.clone(),
        })
    });
    runner.join().map_err(|_| "runtime panicked")??;
    let (f, l) = (first.lock().unwrap().ok_or("nothing processed")?, last.lock().unwrap().ok_or("did not finish")?);
    let secs = (l - f).as_secs_f64();
    Ok(format!(
        "{{\"contender\":\"kstate-time\",\"variant\":\"{variant}\",\"records\":{records},\"seconds\":{secs:.4},\"records_per_sec\":{:.1},\"timers_fired\":{}}}",
        records as f64 / secs,
        fired.load(Ordering::Relaxed)
    ))
}

/// Counts the records of `topic`, every partition from its start to its
/// end; with `read_committed`, as an `isolation.level=read_committed`
/// consumer sees them: only records of committed transactions (and
/// non-transactional ones), no transaction markers, and the end of a
/// partition is its last stable offset (an open transaction's records are
/// not counted). `offset_span` is the sum of high watermark - start offset,
/// markers and aborted records included.
fn count(bootstrap: &str, topic: &str, read_committed: bool) -> Result<String, BoxError> {
    let isolation = if read_committed { "read_committed" } else { "read_uncommitted" };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "kstate-bench-count")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        // A partition is read to its end when its EOF event arrives: offsets
        // cannot tell (the last offsets of a transactional partition are
        // markers, which are never delivered).
        .set("enable.partition.eof", "true")
        .create()?;
    let parts = partitions_of(&consumer, topic)?;
    let span: i64 = parts.iter().map(|(_, lo, hi)| hi - lo).sum();
    let mut tpl = TopicPartitionList::new();
    for (p, _, _) in &parts {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    let started = Instant::now();
    consumer.assign(&tpl)?;
    let (mut records, mut tombstones) = (0u64, 0u64);
    let mut at_end = HashSet::new();
    while at_end.len() < parts.len() {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("count: {} of {} partitions read to the end after 600 s", at_end.len(), parts.len()).into());
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                records += 1;
                if m.payload().is_none() {
                    tombstones += 1;
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(format!(
        "{{\"topic\":{topic:?},\"isolation_level\":\"{isolation}\",\"records\":{records},\"tombstones\":{tombstones},\"offset_span\":{span},\"seconds\":{secs:.4}}}"
    ))
}

/// CPU seconds (user and system) of the whole process so far.
fn cpu_secs() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// `store-load`: what loading sorted data into an empty store costs with
/// WriteBatches (kstate's restore) and with SST files ingested (issue 27).
fn store_load(mode: &str, dir: &str, records: usize) -> Result<String, BoxError> {
    use rocksdb::{BlockBasedOptions, IngestExternalFileOptions, MemtableFactory, Options, SstFileWriter, WriteBatch, WriteOptions, DB};
    let _ = std::fs::remove_dir_all(dir);
    // SplitMix64: the same data every run.
    let mut state: u64 = 42;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let data: Vec<(Vec<u8>, Vec<u8>)> = (0..records)
        .map(|_| {
            let key = [next().to_be_bytes(), next().to_be_bytes()].concat();
            let value: Vec<u8> = (0..13).flat_map(|_| next().to_be_bytes()).take(100).collect();
            (key, value)
        })
        .collect();
    // The restore's tuning (store/engine.rs): bloom filters, no
    // compression, no auto-compaction, 16 MiB memtables.
    let mut table = BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    let mut options = Options::default();
    options.create_if_missing(true);
    options.set_block_based_table_factory(&table);
    options.set_write_buffer_size(16 << 20);
    options.set_compression_type(rocksdb::DBCompressionType::None);
    options.set_disable_auto_compactions(true);
    options.set_max_background_jobs(2);
    if mode == "batch" {
        options.set_memtable_factory(MemtableFactory::Vector);
    }
    let db = DB::open(&options, dir)?;
    let sorted = |chunk: &[(Vec<u8>, Vec<u8>)]| {
        let mut order: Vec<usize> = (0..chunk.len()).collect();
        order.sort_unstable_by(|a, b| chunk[*a].0.cmp(&chunk[*b].0));
        order
    };
    let (cpu0, started) = (cpu_secs(), Instant::now());
    match mode {
        "batch" => {
            let mut no_wal = WriteOptions::default();
            no_wal.disable_wal(true);
            for chunk in data.chunks(20_000) {
                let mut batch = WriteBatch::default();
                for i in sorted(chunk) {
                    batch.put(&chunk[i].0, &chunk[i].1);
                }
                db.write_opt(batch, &no_wal)?;
            }
            db.flush()?;
        }
        "sst" => {
            let mut moved = IngestExternalFileOptions::default();
            moved.set_move_files(true);
            for (n, chunk) in data.chunks((16 << 20) / 116).enumerate() {
                let path = format!("{dir}/load-{n}.sst");
                let mut writer = SstFileWriter::create(&options);
                writer.open(&path)?;
                for i in sorted(chunk) {
                    writer.put(&chunk[i].0, &chunk[i].1)?;
                }
                writer.finish()?;
                db.ingest_external_file_opts(&moved, vec![path])?;
            }
        }
        m => return Err(format!("--mode: expected batch or sst, got `{m}`").into()),
    }
    let (cpu, wall) = (cpu_secs() - cpu0, started.elapsed().as_secs_f64());
    let l0 = db.property_int_value("rocksdb.num-files-at-level0")?.unwrap_or(0);
    Ok(format!("{{\"contender\":\"store-load\",\"mode\":\"{mode}\",\"records\":{records},\"seconds\":{wall:.3},\"cpu_seconds\":{cpu:.3},\"l0_files\":{l0}}}"))
}
