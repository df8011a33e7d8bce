//! Failover benchmark: one kstate instance of the `failover` scenario of
//! `testing/bench/run.py` (three of these run at once; the runner SIGKILLs
//! one and reads the others' stdout), plus the steady input load. The
//! `scaleout` scenario runs the same instance (one, then two more).
//!
//! ```text
//! failover_bench instance --bootstrap B --app A --input T --state-dir D
//!                [--standbys 0] [--session-timeout-ms 10000] [--heartbeat-ms 1000]
//!                [--acceptable-lag N] [--max-warmups N] [--probing-ms MS]
//!                [--peer-address HOST:PORT] [--peer-timeout-ms MS]
//! failover_bench load --bootstrap B --topic T --partitions 6 --rate 2000
//! ```
//!
//! `instance` writes every input record to the store `s` (put, or delete on
//! a tombstone: one store record per input record) and prints lines to
//! stdout, every timestamp in milliseconds since the epoch (wall clock):
//!
//! * `ASSIGNED_FIRST_RECORD partition=P offset=O ts=T` the first time it
//!   processes a record of partition P, and again after a jump in P's
//!   offsets (the partition came back from elsewhere);
//! * `RESTORE_START partition=P ts=T start=S end=E` and
//!   `RESTORE_END partition=P ts=T records=N` from its `RestoreListener`
//!   (active tasks only; standby updates are not restores);
//! * `STATUS ts=T active=P:L,... standby=P:L,...` once a second: the
//!   partitions it processed in the last 2 s with the age in ms of the last
//!   processed record (now - its timestamp), and its standby tasks with
//!   their lag in records (`kstate_standby_lag_records`, read through a
//!   small `metrics` recorder; a standby whose gauge was not updated for
//!   3 s is taken as gone). `-` for an empty list;
//! * `PROGRESS partition=P first=F last=L maxgap=G records=N` once a second
//!   for each partition it processed records of since the last such line:
//!   the wall-clock ms of the first and last record processed in that
//!   window, the largest gap in ms between two consecutive records of P
//!   inside it, and how many. Together the lines of all instances give every
//!   pause in the processing of P (scale-out's longest pause).
//!
//! `--acceptable-lag`, `--max-warmups` and `--probing-ms` set the builder's
//! `acceptable_recovery_lag`, `max_warmup_replicas` and
//! `probing_rebalance_interval` (kstate's defaults when absent);
//! `--peer-address` turns on failure detection among the instances
//! (`peer_address`, port 0: any free port) and `--peer-timeout-ms` sets
//! `peer_timeout`.
//!
//! It stops cleanly when its stdin closes, or on Ctrl-C or SIGTERM. `load`
//! produces `--rate` records/s (new keys, 100-byte values, round robin over
//! the partitions) until its stdin closes or either signal arrives.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kstate::{App, RestoreEnd, RestoreListener, RestoreStart, StoreDefinition};
use metrics::{Counter, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use common::on_signal;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// `--name value` options.
struct Opts(HashMap<String, String>);

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, BoxError> {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let name = a.strip_prefix("--").ok_or_else(|| format!("unexpected argument `{a}`"))?;
            let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            map.insert(name.to_string(), value.clone());
        }
        Ok(Opts(map))
    }
    fn get(&self, name: &str) -> Result<String, BoxError> {
        self.0.get(name).cloned().ok_or_else(|| format!("missing --{name}").into())
    }
    fn or(&self, name: &str, default: &str) -> String {
        self.0.get(name).cloned().unwrap_or_else(|| default.to_string())
    }
}

/// Calls `f` once stdin reaches its end (the runner closed it or died).
fn on_stdin_close(f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        f();
    });
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        return Err("usage: failover_bench instance|load --option value ...".into());
    };
    let opts = Opts::parse(&args[1..])?;
    match cmd.as_str() {
        "instance" => instance(&opts),
        "load" => load(&opts),
        other => Err(format!("unknown subcommand `{other}`").into()),
    }
}

// ---- the instance ---------------------------------------------------------

/// Prints restores of active tasks.
struct PrintRestores;

impl RestoreListener for PrintRestores {
    fn on_restore_start(&self, e: &RestoreStart) {
        println!("RESTORE_START partition={} ts={} start={} end={}", e.partition, now_ms(), e.start_offset, e.end_offset);
    }
    fn on_restore_end(&self, e: &RestoreEnd) {
        println!("RESTORE_END partition={} ts={} records={}", e.partition, now_ms(), e.records);
    }
}

/// A gauge that remembers its value and when it was last set.
#[derive(Default)]
struct TimedGauge {
    bits: AtomicU64,
    set_at_ms: AtomicU64,
}

impl GaugeFn for TimedGauge {
    fn increment(&self, v: f64) {
        self.set(f64::from_bits(self.bits.load(Ordering::Relaxed)) + v);
    }
    fn decrement(&self, v: f64) {
        self.set(f64::from_bits(self.bits.load(Ordering::Relaxed)) - v);
    }
    fn set(&self, v: f64) {
        self.bits.store(v.to_bits(), Ordering::Relaxed);
        self.set_at_ms.store(now_ms() as u64, Ordering::Relaxed);
    }
}

/// Keeps only `kstate_standby_lag_records`, by partition.
#[derive(Default, Clone)]
struct StandbyLags(Arc<Mutex<BTreeMap<i32, Arc<TimedGauge>>>>);

impl Recorder for StandbyLags {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        if key.name() != kstate::metrics::STANDBY_LAG {
            return Gauge::noop();
        }
        let Some(p) = key.labels().find(|l| l.key() == "partition").and_then(|l| l.value().parse().ok()) else {
            return Gauge::noop();
        };
        Gauge::from_arc(self.0.lock().unwrap().entry(p).or_default().clone())
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn list<T: std::fmt::Display>(items: impl Iterator<Item = (i32, T)>) -> String {
    let s: Vec<String> = items.map(|(p, v)| format!("{p}:{v}")).collect();
    if s.is_empty() { "-".into() } else { s.join(",") }
}

/// Records of one partition processed since the last `PROGRESS` line.
struct Window {
    first: i64,
    last: i64,
    max_gap: i64,
    records: u64,
}

impl Window {
    fn new(now: i64) -> Window {
        Window { first: now, last: now, max_gap: 0, records: 0 }
    }
    fn add(&mut self, now: i64) {
        self.max_gap = self.max_gap.max(now - self.last);
        self.last = now;
        self.records += 1;
    }
}

type Windows = BTreeMap<i32, Window>;

/// Prints (and starts anew) the `PROGRESS` window of every partition processed since the last call.
fn print_progress(windows: &Mutex<Windows>) {
    let taken = std::mem::take(&mut *windows.lock().unwrap());
    for (p, w) in taken {
        println!("PROGRESS partition={p} first={} last={} maxgap={} records={}", w.first, w.last, w.max_gap, w.records);
    }
}

fn instance(o: &Opts) -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(std::env::var("KSTATE_LOG").unwrap_or_else(|_| "kstate=info".into()))
        .init();
    let lags = StandbyLags::default();
    metrics::set_global_recorder(lags.clone()).map_err(|_| "metrics recorder already set")?;
    let standbys: usize = o.or("standbys", "0").parse()?;
    let app = App::builder()
        .application_id(o.get("app")?)
        .bootstrap_servers(o.get("bootstrap")?)
        .input_topic(o.get("input")?)
        .state_dir(PathBuf::from(o.get("state-dir")?))
        .store(StoreDefinition::new("s"))
        .num_standby_replicas(standbys)
        .kafka_config("session.timeout.ms", o.or("session-timeout-ms", "10000"))
        .kafka_config("heartbeat.interval.ms", o.or("heartbeat-ms", "1000"))
        .restore_listener(PrintRestores);
    let app = match o.0.get("acceptable-lag") {
        Some(v) => app.acceptable_recovery_lag(v.parse()?),
        None => app,
    };
    let app = match o.0.get("max-warmups") {
        Some(v) => app.max_warmup_replicas(v.parse()?),
        None => app,
    };
    let app = match o.0.get("probing-ms") {
        Some(v) => app.probing_rebalance_interval(Duration::from_millis(v.parse()?)),
        None => app,
    };
    let app = match o.0.get("peer-address") {
        Some(v) => app.peer_address(v).peer_secret("failover-bench-peer-secret"),
        None => app,
    };
    let app = match o.0.get("peer-timeout-ms") {
        Some(v) => app.peer_timeout(Duration::from_millis(v.parse()?)),
        None => app,
    };
    let app = app.build()?;
    let stop = app.shutdown_handle();
    stop.stop_on_signals();
    on_stdin_close(move || stop.shutdown());

    // partition -> (last offset, when processed (ms), record timestamp (ms))
    type Seen = BTreeMap<i32, (i64, i64, i64)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let windows: Arc<Mutex<Windows>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let status = {
        let (seen, windows, done) = (seen.clone(), windows.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                print_progress(&windows);
                let now = now_ms();
                let active = list(
                    seen.lock().unwrap().iter().filter(|(_, s)| now - s.1 < 2_000).map(|(p, s)| (*p, now - s.2)).collect::<Vec<_>>().into_iter(),
                );
                let standby = list(
                    lags.0
                        .lock()
                        .unwrap()
                        .iter()
                        .filter(|(_, g)| now - (g.set_at_ms.load(Ordering::Relaxed) as i64) < 3_000)
                        .map(|(p, g)| (*p, f64::from_bits(g.bits.load(Ordering::Relaxed)) as i64))
                        .collect::<Vec<_>>()
                        .into_iter(),
                );
                println!("STATUS ts={now} active={active} standby={standby}");
            }
        })
    };
    let processed = windows.clone();
    let result = app.run(move |ctx, rec| {
        let store = ctx.store("s")?;
        match rec.value {
            Some(v) => store.put(rec.key.unwrap_or_default(), v)?,
            None => store.delete(rec.key.unwrap_or_default())?,
        }
        let now = now_ms();
        processed.lock().unwrap().entry(rec.partition).or_insert_with(|| Window::new(now)).add(now);
        let mut seen = seen.lock().unwrap();
        let last = seen.insert(rec.partition, (rec.offset, now, rec.timestamp.unwrap_or(now)));
        if last.is_none_or(|(o, _, _)| rec.offset != o + 1) {
            println!("ASSIGNED_FIRST_RECORD partition={} offset={} ts={now}", rec.partition, rec.offset);
        }
        Ok::<(), kstate::Error>(())
    });
    done.store(true, Ordering::Relaxed);
    let _ = status.join();
    print_progress(&windows);
    result?;
    Ok(())
}

// ---- the load -------------------------------------------------------------

fn load(o: &Opts) -> Result<(), BoxError> {
    let topic = o.get("topic")?;
    let partitions: i32 = o.or("partitions", "6").parse()?;
    let rate: u64 = o.or("rate", "2000").parse()?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", o.get("bootstrap")?)
        .set("linger.ms", "5")
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .create()?;
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, on_term) = (stop.clone(), stop.clone());
    on_signal(move || on_term.store(true, Ordering::Relaxed));
    on_stdin_close(move || flag.store(true, Ordering::Relaxed));
    let nonce = now_ms();
    let value = [b'l'; 100];
    let started = Instant::now();
    let mut sent: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        // Every 10 ms, whatever brings the total to rate * elapsed.
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let key = format!("load-{nonce}-{sent:012}");
            let rec = BaseRecord::to(&topic).partition((sent % partitions as u64) as i32).key(key.as_bytes()).payload(&value[..]);
            if let Err((e, _)) = producer.send(rec) {
                eprintln!("load: send failed: {e}");
                producer.poll(Duration::from_millis(10));
                break;
            }
            sent += 1;
        }
        producer.poll(Duration::from_millis(10));
    }
    producer.flush(Duration::from_secs(10))?;
    eprintln!("load: sent {sent} records in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
