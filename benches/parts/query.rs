//! `kstate-query` and `query-generate`: point reads through
//! [`kstate::Queries`] from several threads while the application processes
//! at full speed (driven by `testing/bench/query_bench.py`).
//!
//! The input's first `keys` records write keys 0..keys (the load, not
//! timed); the rest overwrite random keys (timed). Query threads start when
//! the load is processed and read random keys until the last record is.
//! Key bytes `ppp:iiiiiiiiiiii` name their partition, which the query
//! partitioner reads back (the generator writes each key to that partition).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate::codec::RawBytes;
use kstate::{QueryOptions, StoreDefinition};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::BoxError;

fn key(partitions: u64, idx: u64) -> (i32, Vec<u8>) {
    let p = idx % partitions;
    (p as i32, format!("{p:03}:{idx:012}").into_bytes())
}

/// A small fast random number generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Creates `topic` and writes the load and the overwrites.
pub fn generate(bootstrap: &str, topic: &str, records: u64, keys: u64, partitions: u64) -> Result<String, BoxError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let new = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(1));
    futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new()))?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let started = Instant::now();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let value = vec![7u8; 100];
    for i in 0..records {
        let idx = if i < keys { i } else { rng.below(keys) };
        let (p, k) = key(partitions, idx);
        super::send_retrying(&producer, BaseRecord::to(topic).partition(p).key(k.as_slice()).payload(value.as_slice()));
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(format!("{{\"topic\":\"{topic}\",\"records\":{records},\"keys\":{keys},\"seconds\":{:.3}}}", started.elapsed().as_secs_f64()))
}

/// One run: `variant` is `plain` (no queries), `paced` (`rate` reads/s in
/// all) or `max` (as many as the threads can).
#[allow(clippy::too_many_arguments)]
pub fn run(bootstrap: &str, app: &str, input: &str, records: u64, keys: u64, state: &str, variant: &str, threads: usize, rate: u64) -> Result<String, BoxError> {
    let queried = match variant {
        "plain" => false,
        "paced" | "max" => true,
        v => return Err(format!("--variant: expected plain, paced or max, got `{v}`").into()),
    };
    let app = super::bench_app(bootstrap, app, input, state)
        .store(StoreDefinition::new("kv"))
        .commit_interval(Duration::from_millis(100))
        .query_partitioner(|k, n| std::str::from_utf8(&k[..3.min(k.len())]).ok().and_then(|p| p.parse::<i32>().ok()).unwrap_or(0) % n)
        .build()?;
    let queries = app.queries();
    let stop = app.shutdown_handle();
    let seen = Arc::new(AtomicU64::new(0));
    let (loaded, ended) = (Arc::new(Mutex::new(None::<Instant>)), Arc::new(Mutex::new(None::<Instant>)));
    let go = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let runner = {
        let (seen, loaded, ended, go, done, stop) = (seen.clone(), loaded.clone(), ended.clone(), go.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            app.run(move |ctx, rec| {
                let store = ctx.store("kv")?;
                match rec.value {
                    Some(v) => store.put(rec.key.unwrap_or_default(), v)?,
                    None => store.delete(rec.key.unwrap_or_default())?,
                }
                let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
                if n == keys {
                    *loaded.lock().unwrap() = Some(Instant::now());
                    go.store(true, Ordering::SeqCst);
                }
                if n == records {
                    *ended.lock().unwrap() = Some(Instant::now());
                    done.store(true, Ordering::SeqCst);
                    stop.shutdown();
                }
                Ok::<_, kstate::Error>(())
            })
        })
    };
    let readers: Vec<_> = (0..if queried { threads } else { 0 })
        .map(|t| {
            let (queries, go, done) = (queries.clone(), go.clone(), done.clone());
            let per_thread = if variant == "paced" { rate as f64 / threads as f64 } else { f64::INFINITY };
            std::thread::spawn(move || {
                let mut rng = Rng(0x2545_F491 + t as u64 * 7919);
                let mut latencies: Vec<u32> = Vec::with_capacity(1 << 20);
                let (mut found, mut errors) = (0u64, 0u64);
                while !go.load(Ordering::SeqCst) {
                    if done.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                let started = Instant::now();
                let options = QueryOptions::new();
                while !done.load(Ordering::Relaxed) {
                    let (_, k) = key(PARTITIONS, rng.below(keys));
                    let t0 = Instant::now();
                    match queries.get::<RawBytes, RawBytes>("kv", &k, &options) {
                        Ok(a) => found += u64::from(a.value.is_some()),
                        Err(_) => errors += 1,
                    }
                    latencies.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    if per_thread.is_finite() {
                        let due = Duration::from_secs_f64(latencies.len() as f64 / per_thread);
                        let elapsed = started.elapsed();
                        if due > elapsed {
                            std::thread::sleep(due - elapsed);
                        }
                    }
                }
                (latencies, found, errors, started.elapsed())
            })
        })
        .collect();
    runner.join().map_err(|_| "runtime panicked")??;
    let (l, e) = (loaded.lock().unwrap().ok_or("the load was not processed")?, ended.lock().unwrap().ok_or("did not finish")?);
    let secs = (e - l).as_secs_f64();
    let (mut all, mut found, mut errors, mut read_secs) = (Vec::new(), 0, 0, 0f64);
    for r in readers {
        let (lat, f, err, took) = r.join().map_err(|_| "a reader panicked")?;
        all.extend(lat);
        found += f;
        errors += err;
        read_secs = read_secs.max(took.as_secs_f64());
    }
    all.sort_unstable();
    let pct = |q: f64| all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1))).copied().unwrap_or(0);
    Ok(format!(
        "{{\"contender\":\"kstate-query\",\"variant\":\"{variant}\",\"records\":{},\"seconds\":{secs:.4},\"records_per_sec\":{:.1},\"reads\":{},\"reads_per_sec\":{:.1},\"found\":{found},\"errors\":{errors},\"p50_us\":{},\"p99_us\":{},\"p999_us\":{}}}",
        records - keys,
        (records - keys) as f64 / secs,
        all.len(),
        if read_secs > 0.0 { all.len() as f64 / read_secs } else { 0.0 },
        pct(0.5),
        pct(0.99),
        pct(0.999),
    ))
}

/// Partitions of the generated input.
pub const PARTITIONS: u64 = 4;
