//! Several processing threads (`num_stream_threads`) against the broker:
//! tasks processed in parallel, each in offset order and by one thread at
//! a time, with exact state; a rebalance under load loses nothing; the
//! configuration errors. The exactly-once crash loop with two threads is in
//! `exactly_once.rs`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kstate::{Processor, ProcessorContext, ProcessorError, Record};

const PARTITIONS: i32 = 8;

/// What the processors of one instance saw, across tasks.
#[derive(Default)]
struct Seen {
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    threads: Mutex<BTreeSet<String>>,
    /// Tasks whose processor ran on two threads at once, or saw offsets out of order.
    violations: Mutex<Vec<String>>,
    processed: AtomicUsize,
}

/// Counts records per key in store `counts` and writes the availability
/// tests' idempotent `record_writes` to store `s`; checks that its task's
/// offsets come in order; takes `pause` per record.
struct Counting {
    partition: i32,
    last: Option<i64>,
    busy: bool,
    pause: Duration,
    seen: Arc<Seen>,
}

impl Processor for Counting {
    fn process(&mut self, ctx: &mut ProcessorContext<'_>, rec: &Record<'_>) -> Result<(), ProcessorError> {
        let n = self.seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.seen.most_in_flight.fetch_max(n, Ordering::SeqCst);
        let thread = std::thread::current();
        let name = thread.name().map_or_else(|| format!("{:?}", thread.id()), str::to_string);
        self.seen.threads.lock().unwrap().insert(name);
        if self.busy || rec.partition != self.partition || self.last.is_some_and(|l| rec.offset <= l) {
            self.seen.violations.lock().unwrap().push(format!("task {} at {}@{} after {:?}", self.partition, rec.partition, rec.offset, self.last));
        }
        self.busy = true;
        self.last = Some(rec.offset);
        std::thread::sleep(self.pause);
        let key = rec.key.unwrap();
        let counts = ctx.store("counts")?;
        let n = counts.get(key)?.map_or(0, |v| String::from_utf8(v).unwrap().parse::<u64>().unwrap()) + 1;
        counts.put(key, n.to_string().as_bytes())?;
        let s = ctx.store("s")?;
        for (k, v) in record_writes(key, rec.value.unwrap()) {
            s.put(&k, &v)?;
        }
        self.busy = false;
        self.seen.processed.fetch_add(1, Ordering::SeqCst);
        self.seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

fn threaded(app: &str, input: &str, state: &std::path::Path, threads: usize) -> kstate::AppBuilder {
    builder(app, input, state)
        .store(common::store("counts"))
        .store(common::store("s"))
        .num_stream_threads(threads)
        .commit_interval(Duration::from_millis(100))
}

fn start(builder: kstate::AppBuilder, pause: Duration) -> (Running, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let running = Running::start_processor(builder, move |partition| Counting { partition, last: None, busy: false, pause, seen: s.clone() });
    (running, seen)
}

/// A store's state per partition, read from its changelog.
fn changelog_per_partition(app: &str, store: &str) -> BTreeMap<(i32, Vec<u8>), Vec<u8>> {
    let topic = kstate::changelog_topic(app, store);
    let mut state = BTreeMap::new();
    for p in 0..PARTITIONS {
        for (_, k, v) in read_partition(&topic, p) {
            match v {
                Some(v) => state.insert((p, k), v),
                None => state.remove(&(p, k)),
            };
        }
    }
    state
}

#[test]
fn tasks_are_processed_in_parallel_on_two_threads_each_in_offset_order_with_exact_counts() {
    let Fixture { input, app, state } = fixture("threads", PARTITIONS);
    let records: Vec<KeyedRecord> =
        (0..2400).map(|i| ((i % PARTITIONS as usize) as i32, format!("k{}", i % 13).into_bytes(), Some(format!("v{i}").into_bytes()))).collect();
    produce(&input, &records);
    let (running, seen) = start(threaded(&app, &input, state.path(), 2), Duration::from_micros(500));
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    running.stop().unwrap();

    let violations = seen.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{} violations, first: {:?}", violations.len(), &violations[..violations.len().min(5)]);
    let threads = seen.threads.lock().unwrap().clone();
    let most = seen.most_in_flight.load(Ordering::SeqCst);
    eprintln!("processed on {threads:?}, at most {most} records at once");
    assert!(threads.contains("kstate-stream-1"), "no record was processed on the second thread: {threads:?}");
    assert_eq!(most, 2, "two threads process two tasks' records at once, never more");
    assert_eq!(seen.processed.load(Ordering::SeqCst), records.len(), "each record processed once (a clean run)");

    // Exact counts per partition and key, in the changelog and in the stores.
    let mut model: BTreeMap<(i32, Vec<u8>), u64> = BTreeMap::new();
    for (p, k, _) in &records {
        *model.entry((*p, k.clone())).or_default() += 1;
    }
    let logged = changelog_per_partition(&app, "counts");
    let logged: BTreeMap<(i32, Vec<u8>), u64> =
        logged.into_iter().map(|(k, v)| (k, String::from_utf8(v).unwrap().parse().unwrap())).collect();
    assert_eq!(logged, model, "counts changelog vs the model");
    for p in 0..PARTITIONS {
        let (local, _) = read_store_dir(state.path(), &app, "counts", p);
        assert_eq!(local.len(), model.keys().filter(|(q, _)| *q == p).count(), "p{p}: local store keys");
    }
}

#[test]
fn a_rebalance_under_load_with_two_threads_on_each_instance_loses_nothing() {
    let Fixture { input, app, state } = fixture("threads-rebalance", PARTITIONS);
    let second = tempfile::tempdir().unwrap();
    let feeder = Feeder::start(&bootstrap(), &input, PARTITIONS, 40, 800, 6000);
    let (a, seen_a) = start(threaded(&app, &input, state.path(), 2), Duration::from_micros(200));
    std::thread::sleep(Duration::from_secs(2));
    let (b, seen_b) = start(threaded(&app, &input, second.path(), 2), Duration::from_micros(200));
    std::thread::sleep(Duration::from_secs(3));
    a.stop().unwrap();
    let sent = feeder.join(false);
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    b.stop().unwrap();
    for (name, seen) in [("first", &seen_a), ("second", &seen_b)] {
        let violations = seen.violations.lock().unwrap().clone();
        assert!(violations.is_empty(), "{name}: {} violations, first: {:?}", violations.len(), &violations[..violations.len().min(5)]);
        assert!(seen.processed.load(Ordering::SeqCst) > 0, "{name} processed nothing");
    }
    // Every record's write is in the changelog (at-least-once: a record
    // processed twice writes the same).
    let logged = changelog_per_partition(&app, "s");
    for p in 0..PARTITIONS {
        let of_p: Vec<KeyedRecord> = sent.iter().filter(|r| r.0 == p).cloned().collect();
        let got: BTreeMap<Vec<u8>, Vec<u8>> = logged.iter().filter(|((q, _), _)| *q == p).map(|((_, k), v)| (k.clone(), v.clone())).collect();
        assert_same_state(&got, &model_of(&of_p), &format!("p{p}: changelog vs the model of the input"));
    }
}

#[test]
fn zero_threads_and_a_closure_on_several_threads_are_configuration_errors() {
    let state = tempfile::tempdir().unwrap();
    let zero = builder("threads-config", "in", state.path()).num_stream_threads(0).build();
    assert!(matches!(&zero, Err(kstate::Error::Config(m)) if m.contains("num_stream_threads")), "{:?}", zero.err());
    let app = builder("threads-config", "in", state.path()).num_stream_threads(2).build().unwrap();
    let started = std::time::Instant::now();
    let result = app.run(|_: &mut ProcessorContext<'_>, _: &Record<'_>| Ok::<(), kstate::Error>(()));
    assert!(matches!(&result, Err(kstate::Error::Config(m)) if m.contains("run_processor")), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "the error comes before anything connects");
}
