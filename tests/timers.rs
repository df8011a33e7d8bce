//! Time against the real broker: durable per-key timers through SIGKILL
//! crash loops (exactly-once: each timer's output exactly once to
//! `read_committed` readers; at-least-once: at least once), through a
//! failover onto a standby, and never before their time; stream time that
//! survives a restart; punctuations on both clocks; invalid timestamps;
//! and the typed errors of bad calls.
//!
//! The timer application: input value `i` (a number) has event time
//! `i * 10` ms (a timestamp extractor); each input registers a stream-time
//! timer for key `i` at `i * 10 + 50`; a fired timer sends
//! `<timer time>:<stream time>` under its key to the output topic. An
//! input valued `end` has a far event time and fires everything.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kstate::{
    App, Error, InvalidTimestamp, Output, ProcessingGuarantee, Processor, ProcessorContext, ProcessorError, Punctuation, Record, TimeDomain, Timer,
};
use rand::{Rng, SeedableRng};

const PARTITIONS: i32 = 3;
/// Event time of the `end` input: past every timer.
const END_TIME: i64 = 1 << 40;

fn event_time(record: &Record<'_>, _: Option<i64>) -> i64 {
    match record.value_str() {
        Some("end") => END_TIME,
        Some(v) => v.parse::<i64>().map_or(-1, |i| i * 10),
        None => -1,
    }
}

struct Deadlines {
    out: String,
}

impl Processor for Deadlines {
    fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError> {
        if record.offset % 2 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let value = record.value.unwrap();
        if value != b"end" {
            ctx.register_timer(TimeDomain::StreamTime, value, ctx.timestamp().unwrap() + 50)?;
        }
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut ProcessorContext<'_>, timer: &Timer) -> Result<(), ProcessorError> {
        let value = format!("{}:{}", timer.timestamp, ctx.stream_time().unwrap());
        // Stamped now: event times here are in 1970, which the output
        // topic's retention would delete at once.
        let now = ctx.wall_clock_time();
        ctx.send(Output::to(&self.out).key(&timer.key).value(value.as_bytes()).timestamp(now))?;
        Ok(())
    }
}

fn timer_builder(app: &str, input: &str, state: &Path, guarantee: ProcessingGuarantee) -> kstate::AppBuilder {
    builder(app, input, state)
        .timers(true)
        .timestamp_extractor(event_time)
        .processing_guarantee(guarantee)
        .commit_interval(Duration::from_millis(50))
        .kafka_config("linger.ms", "20")
}

/// The child instance: settings `app \t input \t output \t state \t
/// guarantee (eos|alo) \t name \t standbys`; a static member named `name`;
/// runs until killed or its stdin closes.
#[test]
#[ignore = "child process of the timer tests"]
fn timers_child() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    let [app, input, out, state, guarantee, name, standbys]: [&str; 7] =
        settings.split('\t').collect::<Vec<_>>().try_into().unwrap();
    init_tracing();
    let guarantee = if guarantee == "eos" { ProcessingGuarantee::ExactlyOnce } else { ProcessingGuarantee::AtLeastOnce };
    let app = timer_builder(app, input, Path::new(state), guarantee)
        .num_standby_replicas(standbys.parse().unwrap())
        .kafka_config("group.instance.id", format!("{app}-{name}"))
        .transaction_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    stop_when_stdin_closes(app.shutdown_handle());
    let out = out.to_string();
    app.run_processor(move |_| Deadlines { out: out.clone() }).unwrap();
}

#[allow(clippy::too_many_arguments)]
fn spawn(name: &str, app: &str, input: &str, out: &str, state: &Path, guarantee: &str, standbys: usize, log: &Path) -> ChildInstance {
    ChildInstance::spawn(
        name,
        "timers_child",
        format!("{app}\t{input}\t{out}\t{}\t{guarantee}\t{name}\t{standbys}", state.display()),
        log.to_path_buf(),
    )
}

/// Input `i` goes to partition `i % PARTITIONS`, valued `i`.
fn inputs(from: usize, to: usize) -> Vec<KeyedRecord> {
    (from..to).map(|i| ((i % PARTITIONS as usize) as i32, format!("k{i}").into_bytes(), Some(i.to_string().into_bytes()))).collect()
}

fn ends() -> Vec<KeyedRecord> {
    (0..PARTITIONS).map(|p| (p, b"end".to_vec(), Some(b"end".to_vec()))).collect()
}

/// Fired timers, read `read_committed`: timer key → the (timer time,
/// stream time at firing) of each of its outputs.
fn fired(topic: &str) -> BTreeMap<Vec<u8>, Vec<(i64, i64)>> {
    let mut out: BTreeMap<Vec<u8>, Vec<(i64, i64)>> = BTreeMap::new();
    for p in 0..PARTITIONS {
        for (_, k, v) in read_partition(topic, p) {
            let v = String::from_utf8(v.unwrap()).unwrap();
            let (t, s) = v.split_once(':').unwrap();
            out.entry(k).or_default().push((t.parse().unwrap(), s.parse().unwrap()));
        }
    }
    out
}

/// No timer fired before its time; under exactly-once none fired twice.
fn assert_on_time(what: &str, fired: &BTreeMap<Vec<u8>, Vec<(i64, i64)>>, exactly_once: bool) -> usize {
    let mut duplicates = 0;
    for (key, firings) in fired {
        for (t, stream) in firings {
            assert!(stream >= t, "{what}: timer {} at {t} fired early, at stream time {stream}", String::from_utf8_lossy(key));
        }
        if firings.len() > 1 {
            assert!(!exactly_once, "{what}: timer {} fired {} times under exactly-once: {firings:?}", String::from_utf8_lossy(key), firings.len());
            duplicates += firings.len() - 1;
        }
    }
    duplicates
}

/// The timers still pending in the time store's changelog (read
/// `read_committed`), by partition.
fn pending_in_changelog(app: &str) -> Vec<(i32, Vec<u8>)> {
    let topic = kstate::changelog_topic(app, kstate::TIME_STORE);
    let mut pending = Vec::new();
    for p in 0..PARTITIONS {
        let mut state = BTreeMap::new();
        for (_, k, v) in read_partition(&topic, p) {
            apply(&mut state, &k, v.as_deref());
        }
        pending.extend(state.into_keys().filter(|k| k[0] != 0).map(|k| (p, k)));
    }
    pending
}

fn crash_loop(name: &str, guarantee: &str, rounds: usize, total: usize) {
    let exactly_once = guarantee == "eos";
    let Fixture { input, app, state } = fixture(name, PARTITIONS);
    let out = unique(&format!("{name}-out"));
    create_topic(&out, PARTITIONS, &[]);
    produce(&input, &inputs(0, total));
    let log = state.path().join("child.log");
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    for round in 0..rounds {
        let child = spawn("a", &app, &input, &out, state.path(), guarantee, 0, &log);
        std::thread::sleep(Duration::from_millis(rng.random_range(1500..3500)));
        child.kill(); // SIGKILL, mid-commit or mid-processing
        let fired = fired(&out);
        assert_on_time(&format!("after kill {round}"), &fired, exactly_once);
        eprintln!("round {round}: {} timers fired", fired.len());
    }
    produce(&input, &ends());
    let last = spawn("a", &app, &input, &out, state.path(), guarantee, 0, &log);
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while fired(&out).len() < total {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for every timer to fire; the instance's log ends with:\n{}", last.tail());
        std::thread::sleep(Duration::from_millis(200));
    }
    last.stop();
    let fired = fired(&out);
    let duplicates = assert_on_time("at the end", &fired, exactly_once);
    let expected: BTreeSet<Vec<u8>> = (0..total).map(|i| i.to_string().into_bytes()).collect();
    let keys: BTreeSet<Vec<u8>> = fired.keys().cloned().collect();
    assert_eq!(keys, expected, "every input's timer fired, none else");
    for (key, firings) in &fired {
        let i: i64 = String::from_utf8_lossy(key).parse().unwrap();
        assert!(firings.iter().all(|(t, _)| *t == i * 10 + 50), "timer {i} fired for the time it was registered for: {firings:?}");
    }
    let pending = pending_in_changelog(&app);
    assert!(pending.is_empty(), "{} timers left pending in the changelog, e.g. {:?}", pending.len(), &pending[..pending.len().min(3)]);
    let text = strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
    eprintln!("{guarantee}: {total} timers fired, {duplicates} duplicates after {rounds} kills ({} restores)", text.matches("restore starting").count());
}

#[test]
fn under_exactly_once_each_timer_fires_once_through_a_crash_loop() {
    crash_loop("timers-eos", "eos", 4, 4000);
}

#[test]
fn under_at_least_once_each_timer_fires_at_least_once_and_never_early() {
    crash_loop("timers-alo", "alo", 3, 3000);
}

#[test]
fn timers_registered_on_a_crashed_instance_fire_on_its_standby() {
    let Fixture { input, app, state } = fixture("timers-standby", PARTITIONS);
    let out = unique("timers-standby-out");
    create_topic(&out, PARTITIONS, &[]);
    let (log_a, log_b) = (state.path().join("a.log"), state.path().join("b.log"));
    let a = spawn("a", &app, &input, &out, &state.path().join("a"), "eos", 1, &log_a);
    wait_until("a to run", Duration::from_secs(60), || a.text().matches("task running").count() >= PARTITIONS as usize);
    let b = spawn("b", &app, &input, &out, &state.path().join("b"), "eos", 1, &log_b);
    wait_until("b to follow a standby", Duration::from_secs(60), || b.text().contains("standby task opened"));
    // Timers registered on whoever runs each task; none is due yet.
    produce(&input, &inputs(0, 600));
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(2)); // the standbys catch up
    let before = b.text().len();
    a.kill();
    wait_until("b to run every task", Duration::from_secs(60), || {
        b.text().lines().rfind(|l| l.contains("applying the group's assignment")).is_some_and(|l| l.contains("active={0, 1, 2}"))
    });
    produce(&input, &ends());
    wait_until("every timer to fire on b", Duration::from_secs(60), || fired(&out).len() >= 600);
    let text = b.text();
    b.stop();
    let fired = fired(&out);
    assert_on_time("after the failover", &fired, true);
    assert_eq!(fired.len(), 600, "every timer fired");
    assert!(pending_in_changelog(&app).is_empty(), "no timer left pending");
    let after = &text[before..];
    assert!(after.contains("standby promoted to active"), "b took a's tasks over from its standbys");
    for line in after.lines().filter(|l| l.contains("restore finished")) {
        let records: u64 = line.split("records=").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|r| r.parse().ok()).unwrap_or(0);
        assert!(records < 100, "a promoted standby replayed {records} records: {line}");
    }
}

/// What the probe processor saw.
#[derive(Default)]
struct Seen {
    /// Stream time at each `init`.
    init_stream_time: Vec<Option<i64>>,
    punctuations: Vec<Punctuation>,
}

struct Probe {
    seen: Arc<Mutex<Seen>>,
    wall: Option<Duration>,
}

impl Processor for Probe {
    fn init(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
        self.seen.lock().unwrap().init_stream_time.push(ctx.stream_time());
        ctx.schedule(TimeDomain::StreamTime, Duration::from_millis(100))?;
        if let Some(every) = self.wall {
            ctx.schedule(TimeDomain::WallClock, every)?;
        }
        Ok(())
    }

    fn process(&mut self, _: &mut ProcessorContext<'_>, _: &Record<'_>) -> Result<(), ProcessorError> {
        Ok(())
    }

    fn punctuate(&mut self, _: &mut ProcessorContext<'_>, punctuation: &Punctuation) -> Result<(), ProcessorError> {
        self.seen.lock().unwrap().punctuations.push(*punctuation);
        Ok(())
    }
}

fn run_probe(app: App, seen: &Arc<Mutex<Seen>>, wall: Option<Duration>) -> (kstate::ShutdownHandle, std::thread::JoinHandle<kstate::Result<()>>) {
    let stop = app.shutdown_handle();
    let seen = seen.clone();
    (stop, std::thread::spawn(move || app.run_processor(move |_| Probe { seen: seen.clone(), wall })))
}

#[test]
fn stream_time_punctuations_follow_kafka_streams_and_stream_time_survives_a_restart() {
    let Fixture { input, app, state } = fixture("punctuate", 1);
    let values = ["100", "105", "110", "145", "146"]; // event times 1000, 1050, 1100, 1450, 1460
    produce(&input, &values.iter().map(|v| (0, b"k".to_vec(), Some(v.as_bytes().to_vec()))).collect::<Vec<_>>());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let build = || builder(&app, &input, state.path()).timers(true).timestamp_extractor(event_time).build().unwrap();
    let (stop, thread) = run_probe(build(), &seen, None);
    wait_all_committed_at(&bootstrap(), &app, &input, 1, Duration::from_secs(60));
    stop.shutdown();
    thread.join().unwrap().unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.init_stream_time, vec![None], "a new task has no stream time");
        let at: Vec<i64> = seen.punctuations.iter().map(|p| p.timestamp).collect();
        // Aligned to 0: the first record runs it; 1050 is before the next
        // (1100); 1450 jumps over three intervals and runs it once; 1460
        // is before the next (1500).
        assert_eq!(at, vec![1000, 1100, 1450], "stream-time punctuations");
    }
    // Restarted: the task's stream time is the one committed.
    let (stop, thread) = run_probe(build(), &seen, None);
    wait_until("the restarted task to start", Duration::from_secs(60), || seen.lock().unwrap().init_stream_time.len() == 2);
    stop.shutdown();
    thread.join().unwrap().unwrap();
    assert_eq!(seen.lock().unwrap().init_stream_time[1], Some(1460), "stream time survives the restart");
}

#[test]
fn wall_clock_punctuations_run_while_the_task_is_idle() {
    let Fixture { input, app, state } = fixture("punctuate-wall", 1);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop, thread) = run_probe(builder(&app, &input, state.path()).build().unwrap(), &seen, Some(Duration::from_millis(200)));
    wait_until("the task to start", Duration::from_secs(60), || !seen.lock().unwrap().init_stream_time.is_empty());
    std::thread::sleep(Duration::from_millis(1500));
    stop.shutdown();
    thread.join().unwrap().unwrap();
    let seen = seen.lock().unwrap();
    let wall: Vec<i64> = seen.punctuations.iter().filter(|p| p.domain == TimeDomain::WallClock).map(|p| p.timestamp).collect();
    assert!((5..=8).contains(&wall.len()), "about one wall-clock punctuation per 200 ms of 1.5 s idle: {wall:?}");
    assert!(wall.windows(2).all(|w| w[1] - w[0] >= 150), "not run more often than the interval: {wall:?}");
    assert!(seen.punctuations.iter().all(|p| p.domain == TimeDomain::WallClock), "no stream-time punctuation without records");
}

#[test]
fn invalid_timestamps_fail_by_default_or_are_skipped_and_counted() {
    let Fixture { input, app, state } = fixture("bad-ts", 1);
    produce(&input, &[(0, b"k".to_vec(), Some(b"oops".to_vec())), (0, b"k".to_vec(), Some(b"7".to_vec()))]);
    let processed = Arc::new(Mutex::new(Vec::new()));
    let run = |policy: Option<InvalidTimestamp>| {
        let mut b = builder(&app, &input, state.path()).timestamp_extractor(event_time);
        if let Some(p) = policy {
            b = b.on_invalid_timestamp(p);
        }
        let seen = processed.clone();
        Running::start(b, move |ctx, rec| {
            seen.lock().unwrap().push((rec.offset, ctx.timestamp(), ctx.stream_time()));
            Ok(())
        })
    };
    // Default: run stops with the typed error naming the record.
    let r = run(None);
    wait_until("run to fail", Duration::from_secs(60), || r.is_finished());
    match r.stop() {
        Err(Error::InvalidTimestamp { partition: 0, offset: 0, timestamp: Some(-1), .. }) => {}
        other => panic!("expected InvalidTimestamp for offset 0, got {other:?}"),
    }
    assert!(processed.lock().unwrap().is_empty());
    // Skip: the record is skipped, the next one processed with its time.
    let r = run(Some(InvalidTimestamp::Skip));
    wait_until("the valid record", Duration::from_secs(60), || !processed.lock().unwrap().is_empty());
    r.stop().unwrap();
    assert_eq!(*processed.lock().unwrap(), vec![(1, Some(70), Some(70))]);
    assert_eq!(committed_offset(&app, &input, 0), Some(2), "the skipped record's offset is committed");
}

#[test]
fn bad_calls_are_typed_errors() {
    let Fixture { input, app, state } = fixture("time-misuse", 1);
    produce(&input, &[(0, b"k".to_vec(), Some(b"1".to_vec()))]);
    // A closure processor has no callbacks.
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let r = Running::start(builder(&app, &input, state.path()).timers(true), move |ctx, _| {
        let mut e = seen.lock().unwrap();
        e.push(ctx.register_timer(TimeDomain::StreamTime, b"k", 5).unwrap_err().to_string());
        e.push(ctx.schedule(TimeDomain::WallClock, Duration::from_secs(1)).unwrap_err().to_string());
        Ok(())
    });
    wait_until("the record", Duration::from_secs(60), || !errors.lock().unwrap().is_empty());
    r.stop().unwrap();
    for e in errors.lock().unwrap().iter() {
        assert!(e.contains("needs a Processor (App::run_processor)"), "{e}");
    }
    // A Processor: a zero interval, and a timer without timers enabled.
    struct Misuse(Arc<Mutex<Vec<String>>>);
    impl Processor for Misuse {
        fn process(&mut self, ctx: &mut ProcessorContext<'_>, _: &Record<'_>) -> Result<(), ProcessorError> {
            let mut e = self.0.lock().unwrap();
            e.push(ctx.schedule(TimeDomain::StreamTime, Duration::ZERO).unwrap_err().to_string());
            e.push(ctx.register_timer(TimeDomain::WallClock, b"k", 5).unwrap_err().to_string());
            Ok(())
        }
    }
    let other = unique("time-misuse-2");
    let errors = Arc::new(Mutex::new(Vec::new()));
    let app2 = builder(&other, &input, state.path()).build().unwrap();
    let stop = app2.shutdown_handle();
    let seen = errors.clone();
    let thread = std::thread::spawn(move || app2.run_processor(move |_| Misuse(seen.clone())));
    wait_until("the record", Duration::from_secs(60), || !errors.lock().unwrap().is_empty());
    stop.shutdown();
    thread.join().unwrap().unwrap();
    let e = errors.lock().unwrap();
    assert!(e[0].contains("at least 1 ms"), "{}", e[0]);
    assert!(e[1].contains("AppBuilder::timers(true)"), "{}", e[1]);
    // The time store's name is kstate's own.
    match builder(&app, &input, state.path()).store(common::store(kstate::TIME_STORE)).build() {
        Err(Error::Config(m)) => assert!(m.contains("kstate's own"), "{m}"),
        other => panic!("expected a config error, got {:?}", other.err()),
    }
}

/// The ops processor: input `<event time> reg <key> <time>` registers a
/// stream-time timer, `... del <key> <time>` deletes one, `... now <key>`
/// registers one at the current stream time; a wall-clock punctuation
/// scheduled in `init` is cancelled by the first record. Every callback is
/// logged in order.
struct Ops {
    log: Arc<Mutex<Vec<String>>>,
    punctuation: Option<kstate::PunctuationId>,
}

impl Processor for Ops {
    fn init(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
        self.punctuation = Some(ctx.schedule(TimeDomain::WallClock, Duration::from_millis(20))?);
        Ok(())
    }

    fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError> {
        let value = record.value_str().unwrap().to_string();
        if let Some(id) = self.punctuation.take() {
            assert!(ctx.cancel(id), "the punctuation was scheduled");
            self.log.lock().unwrap().push("cancelled".into());
        }
        self.log.lock().unwrap().push(format!("process {value}"));
        let parts: Vec<&str> = value.split(' ').collect();
        match parts[1..] {
            ["reg", key, at] => ctx.register_timer(TimeDomain::StreamTime, key.as_bytes(), at.parse()?)?,
            ["del", key, at] => ctx.delete_timer(TimeDomain::StreamTime, key.as_bytes(), at.parse()?)?,
            ["now", key] => ctx.register_timer(TimeDomain::StreamTime, key.as_bytes(), ctx.stream_time().unwrap())?,
            _ => {}
        }
        Ok(())
    }

    fn on_timer(&mut self, _: &mut ProcessorContext<'_>, timer: &Timer) -> Result<(), ProcessorError> {
        self.log.lock().unwrap().push(format!("timer {}@{}", String::from_utf8_lossy(&timer.key), timer.timestamp));
        Ok(())
    }

    fn punctuate(&mut self, _: &mut ProcessorContext<'_>, p: &Punctuation) -> Result<(), ProcessorError> {
        self.log.lock().unwrap().push(format!("punctuate {:?}", p.domain));
        Ok(())
    }
}

#[test]
fn a_timer_due_when_registered_fires_right_after_a_deleted_one_never_and_a_cancelled_punctuation_stops() {
    let Fixture { input, app, state } = fixture("timer-ops", 1);
    let log = Arc::new(Mutex::new(Vec::new()));
    let b = builder(&app, &input, state.path())
        .timers(true)
        .timestamp_extractor(|r, _| r.value_str().and_then(|v| v.split(' ').next()?.parse().ok()).unwrap_or(-1));
    let l = log.clone();
    let r = Running::start_processor(b, move |_| Ops { log: l.clone(), punctuation: None });
    let values = ["1000 reg a 1500", "1000 reg b 1600", "1000 del b 1600", "1000 now c", "1700 tick"];
    produce(&input, &values.iter().map(|v| (0, b"k".to_vec(), Some(v.as_bytes().to_vec()))).collect::<Vec<_>>());
    wait_until("the last timer", TIMEOUT, || log.lock().unwrap().iter().any(|l| l.starts_with("timer a")));
    std::thread::sleep(Duration::from_millis(300)); // a cancelled punctuation would run meanwhile
    r.stop().unwrap();
    let log = log.lock().unwrap();
    let after_cancel: Vec<&String> = log.iter().skip_while(|l| *l != "cancelled").filter(|l| !l.starts_with("punctuate")).collect();
    assert_eq!(
        after_cancel,
        [
            "cancelled",
            "process 1000 reg a 1500",
            "process 1000 reg b 1600",
            "process 1000 del b 1600",
            "process 1000 now c",
            "timer c@1000",
            // Due at the tick's time: before the tick is processed.
            "timer a@1500",
            "process 1700 tick",
        ],
        "whole log: {log:?}"
    );
    let cancelled_at = log.iter().position(|l| l == "cancelled").unwrap();
    assert!(!log[cancelled_at..].iter().any(|l| l.starts_with("punctuate")), "a cancelled punctuation ran: {log:?}");
}

#[test]
fn use_stream_time_and_wall_clock_timestamps() {
    let Fixture { input, app, state } = fixture("ts-policies", 1);
    produce(&input, &[(0, b"k".to_vec(), Some(b"5".to_vec())), (0, b"k".to_vec(), Some(b"oops".to_vec()))]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let r = Running::start(
        builder(&app, &input, state.path()).timestamp_extractor(event_time).on_invalid_timestamp(InvalidTimestamp::UseStreamTime),
        move |ctx, rec| {
            s.lock().unwrap().push((rec.offset, ctx.timestamp()));
            Ok(())
        },
    );
    wait_until("both records", TIMEOUT, || seen.lock().unwrap().len() == 2);
    r.stop().unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![(0, Some(50)), (1, Some(50))], "the invalid record gets the stream time");
    // Processing time: the wall clock when the record is processed.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let other = unique("ts-wall");
    let r = Running::start(builder(&other, &input, state.path()).wall_clock_timestamps(), move |ctx, _| {
        s.lock().unwrap().push((ctx.timestamp().unwrap(), ctx.wall_clock_time()));
        Ok(())
    });
    wait_until("both records", TIMEOUT, || seen.lock().unwrap().len() == 2);
    r.stop().unwrap();
    for (ts, wall) in seen.lock().unwrap().iter() {
        assert!((wall - ts).abs() < 1_000, "stamped {ts}, wall clock {wall}");
    }
}
