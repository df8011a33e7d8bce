//! Restore demo: builds state, crashes, and shows how fast it comes back.
//!
//! 1. Produces `KSTATE_DEMO_RECORDS` (default 200 000) records over 4
//!    partitions (50 000 distinct keys, 100-byte values).
//! 2. A child process stores the latest value per key and, once it has
//!    processed every record, aborts without a final commit (a crash).
//! 3. The same state directory restarts: its store is at the last commit
//!    RocksDB flushed (commits skip RocksDB's WAL; the changelog is the
//!    log), so the changelog records past that checkpoint (at most a few
//!    memtables' worth) are replayed, and the input the crash left
//!    uncommitted is processed again.
//! 4. A fresh state directory (a new machine) restores the whole changelog.
//!
//! ```text
//! bash testing/demo.sh                      # starts a broker and runs this
//! KSTATE_DEMO_KEEP=1 bash testing/demo.sh   # ... and keeps the state dirs for `kstate inspect`
//! cargo run --release --example restore_demo   # against KSTATE_BOOTSTRAP
//! ```
//!
//! Ctrl-C or SIGTERM stops the running application cleanly and ends the demo.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kstate::{App, RestoreEnd, RestoreListener, StoreDefinition};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use common::on_signal;

const PARTITIONS: i32 = 4;

/// Set by Ctrl-C or SIGTERM: the running application stops and the demo ends.
static STOPPED: AtomicBool = AtomicBool::new(false);

fn stopped_by_signal() -> Result<(), BoxError> {
    if STOPPED.load(Ordering::Relaxed) {
        return Err("stopped by a signal".into());
    }
    Ok(())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt().with_env_filter(std::env::var("KSTATE_LOG").unwrap_or_else(|_| "kstate=warn".into())).init();
    let bootstrap = std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 5 && args[1] == "--child" {
        let total: u64 = args[4].parse()?;
        return child(&bootstrap, &args[2], Path::new(&args[3]), total);
    }
    on_signal(|| STOPPED.store(true, Ordering::Relaxed));
    let records: u64 = std::env::var("KSTATE_DEMO_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let run_id = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let app_id = format!("kstate-restore-demo-{run_id}");
    let state = std::env::temp_dir().join(&app_id);

    println!("== kstate restore demo ({records} records, {PARTITIONS} partitions, broker {bootstrap})");
    let started = Instant::now();
    produce_input(&bootstrap, &format!("{app_id}-input"), records)?;
    println!("produced {records} input records in {:.2}s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    let status = Command::new(std::env::current_exe()?)
        .args(["--child", &app_id, &state.display().to_string(), &records.to_string()])
        .status()?;
    stopped_by_signal()?;
    println!(
        "child processed the input and crashed ({status}) after {:.2}s",
        started.elapsed().as_secs_f64()
    );

    let uncommitted = records - committed_input(&bootstrap, &app_id)?;
    println!("the crash left {uncommitted} of {records} input records uncommitted; the store is at its last flushed commit");
    let tail = restart(&bootstrap, &app_id, &state, uncommitted)?;
    report("restart after crash (same state dir)", &tail);
    println!(
        "  ... and reprocessed the {uncommitted} uncommitted input records: caught up {:.3}s after start",
        tail.done_seconds
    );
    let full = restore(&bootstrap, &app_id, &std::env::temp_dir().join(format!("{app_id}-fresh")))?;
    report("new instance (empty state dir)     ", &full);
    if std::env::var_os("KSTATE_DEMO_KEEP").is_some() {
        println!("state kept (KSTATE_DEMO_KEEP): look at it with");
        println!("  cargo run -p kstate-cli -- --state-dir {} inspect", state.display());
        println!("  cargo run -p kstate-cli -- --state-dir {} estimate-restore --app {app_id}", state.display());
    } else {
        let _ = std::fs::remove_dir_all(&state);
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("{app_id}-fresh")));
    }
    Ok(())
}

fn app(bootstrap: &str, app_id: &str, state: &Path) -> kstate::AppBuilder {
    App::builder()
        .application_id(app_id)
        .bootstrap_servers(bootstrap)
        .input_topic(format!("{app_id}-input"))
        .state_dir(state)
        .store(StoreDefinition::new("latest"))
        .commit_interval(Duration::from_millis(100))
        // Static membership: a restarted instance takes over the crashed one's
        // partitions at once instead of waiting out its session timeout.
        .kafka_config("group.instance.id", format!("{app_id}-instance"))
        .kafka_config("session.timeout.ms", "10000")
}

/// Stores the latest value per key, then aborts once everything was processed.
fn child(bootstrap: &str, app_id: &str, state: &Path, total: u64) -> Result<(), BoxError> {
    let seen = AtomicU64::new(0);
    let app = app(bootstrap, app_id, state).build()?;
    app.shutdown_handle().stop_on_signals();
    app.run(move |ctx, rec| {
        ctx.store("latest")?.put(rec.key.unwrap_or_default(), rec.value.unwrap_or_default())?;
        let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
        // Stretch the work over several commit intervals (~1 s), so the
        // crash lands between commits whatever the machine's speed (the
        // first commit on a broker just started can take a few hundred ms:
        // its changelog topic was just created).
        if n.is_multiple_of(200) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if n == total {
            eprintln!("child: all {total} records processed; aborting before the next commit");
            std::process::abort();
        }
        Ok::<(), kstate::Error>(())
    })?;
    Ok(())
}

#[derive(Default, Clone)]
struct Totals(Arc<Mutex<Vec<RestoreEnd>>>);

impl RestoreListener for Totals {
    fn on_restore_end(&self, e: &RestoreEnd) {
        self.0.lock().unwrap().push(e.clone());
    }
}

struct Restored {
    records: u64,
    bytes: u64,
    restore_seconds: f64,
    to_running_seconds: f64,
    /// Until every partition was restored and the run's condition held.
    done_seconds: f64,
}

/// Input records whose offsets the application committed.
fn committed_input(bootstrap: &str, app_id: &str) -> Result<u64, BoxError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).set("group.id", app_id).create()?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(&format!("{app_id}-input"), p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(committed.elements().iter().map(|e| e.offset().to_raw().unwrap_or(0).max(0) as u64).sum())
}

/// Restarts the crashed application on `state` (storing values like the
/// child did) until it is restored and has processed `uncommitted` records.
fn restart(bootstrap: &str, app_id: &str, state: &Path, uncommitted: u64) -> Result<Restored, BoxError> {
    let processed = Arc::new(AtomicU64::new(0));
    let counter = processed.clone();
    run_until(bootstrap, app_id, state, move || counter.load(Ordering::Relaxed) >= uncommitted, move |ctx, rec| {
        ctx.store("latest")?.put(rec.key.unwrap_or_default(), rec.value.unwrap_or_default())?;
        processed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })
}

/// Starts the app on `state`, waits until every partition is restored, stops.
fn restore(bootstrap: &str, app_id: &str, state: &Path) -> Result<Restored, BoxError> {
    run_until(bootstrap, app_id, state, || true, |_, _| Ok(()))
}

/// Runs the app on `state` until every partition is restored and `done`, then stops it.
fn run_until(
    bootstrap: &str,
    app_id: &str,
    state: &Path,
    done: impl Fn() -> bool,
    processor: impl FnMut(&mut kstate::ProcessorContext<'_>, &kstate::Record<'_>) -> Result<(), kstate::Error> + Send + 'static,
) -> Result<Restored, BoxError> {
    let totals = Totals::default();
    let app = app(bootstrap, app_id, state).restore_listener(totals.clone()).build()?;
    let stop = app.shutdown_handle();
    let started = Instant::now();
    let runner = std::thread::spawn(move || app.run(processor));
    let mut running_at = None;
    loop {
        if running_at.is_none() && totals.0.lock().unwrap().len() >= PARTITIONS as usize {
            running_at = Some(started.elapsed().as_secs_f64());
        }
        let stopped = STOPPED.load(Ordering::Relaxed);
        if (running_at.is_some() && done()) || stopped || runner.is_finished() || started.elapsed() > Duration::from_secs(600) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let done_seconds = started.elapsed().as_secs_f64();
    let to_running_seconds = running_at.unwrap_or(done_seconds);
    stop.shutdown();
    runner.join().expect("runtime thread")?;
    stopped_by_signal()?;
    let ends = totals.0.lock().unwrap();
    Ok(Restored {
        records: ends.iter().map(|e| e.records).sum(),
        bytes: ends.iter().map(|e| e.bytes).sum(),
        // Partitions restore in parallel: the longest one is the restore time.
        restore_seconds: ends.iter().map(|e| e.duration.as_secs_f64()).fold(0.0, f64::max),
        to_running_seconds,
        done_seconds,
    })
}

fn report(what: &str, r: &Restored) {
    println!(
        "{what}: restored {:>9} records, {:>7.1} MB in {:.3}s ({:.0} records/s); running {:.3}s after start",
        r.records,
        r.bytes as f64 / 1e6,
        r.restore_seconds,
        r.records as f64 / r.restore_seconds.max(1e-9),
        r.to_running_seconds
    );
}

fn produce_input(bootstrap: &str, topic: &str, records: u64) -> Result<(), BoxError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let t = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1));
    for r in futures::executor::block_on(admin.create_topics([&t], &AdminOptions::new()))? {
        r.map_err(|(t, e)| format!("creating {t}: {e}"))?;
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .create()?;
    let value = [b'v'; 100];
    for i in 0..records {
        let key = format!("key-{:011}", i % 50_000);
        // The partition the default partitioner gives the key (as a Java
        // producer's), so that queries would find it where kstate looks.
        let partition = kstate::murmur2_partition(key.as_bytes(), PARTITIONS);
        let mut rec = BaseRecord::to(topic).key(key.as_str()).payload(&value[..]).partition(partition);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    producer.poll(Duration::from_millis(5));
                    rec = r;
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}
