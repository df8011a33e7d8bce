//! Availability: instances joining and leaving, a broker restart, one
//! task's fault or a held directory lock never stop the application, and
//! nothing is lost (docs/architecture.md §3a).
//!
//! The multi-instance test runs each instance as a child process: this test
//! binary started again with `child_instance` and its settings in
//! `KSTATE_CHILD`.

mod common;
#[path = "common/recorded.rs"]
mod recorded;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;
use recorded::metrics;
use kstate::{Error, ProcessingDecision};

/// The tests of this file run one at a time: they measure pauses, which
/// another test starting a broker or several processes beside them on a
/// 2-core machine would stretch.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The value of counter `name` with exactly these labels, if recorded.
fn counter(name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    recorded::metric(name, labels).map(|n| n as u64)
}

/// A child instance: runs the application until its stdin closes, then
/// stops cleanly. Exits 0 if `run` returned `Ok`, 3 (printing the error)
/// otherwise. Does nothing unless started by a test with `KSTATE_CHILD`.
#[test]
#[ignore = "run by the availability tests as a child process"]
fn child_instance() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    let [bootstrap, app, input, state]: [&str; 4] =
        settings.split('\t').collect::<Vec<_>>().try_into().expect("KSTATE_CHILD: bootstrap, app, input, state dir");
    init_tracing();
    let app = builder(app, input, Path::new(state))
        .bootstrap_servers(bootstrap)
        .store(common::store("s"))
        .build()
        .expect("valid config");
    let stop = app.shutdown_handle();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stop.shutdown();
    });
    let result = app.run(apply_record);
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("CHILD RUN FAILED: {e:?}");
            std::process::exit(3)
        }
    }
}

/// A child instance of this file's `child_instance`.
type Instance = ChildInstance;

fn start_instance(name: &str, bootstrap: &str, app: &str, input: &str, dir: &Path) -> Instance {
    let state = dir.join(format!("state-{name}"));
    let settings = format!("{bootstrap}\t{app}\t{input}\t{}", state.display());
    ChildInstance::spawn(name, "child_instance", settings, dir.join(format!("{name}.log")))
}

#[test]
fn instances_joining_and_leaving_under_load_stop_nobody_and_lose_nothing() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("members", 4);
    let bootstrap = bootstrap();
    let dir = state.path();
    let feeder = Feeder::start(&bootstrap, &input, 4, 64, 1000, 22_000);
    let mut live: Vec<Instance> = Vec::new();
    // (seconds after start, action): two, then three instances; members
    // join, are killed (SIGKILL) and stop cleanly while records flow.
    let plan: [(u64, &str, &str); 9] = [
        (0, "start", "a"),
        (2, "start", "b"),
        (5, "start", "c"),
        (8, "kill", "b"),
        (11, "stop", "a"),
        (13, "start", "d"),
        (16, "kill", "c"),
        (18, "start", "e"),
        (21, "stop", "d"),
    ];
    let started = Instant::now();
    // Committed offsets only move forward: a member's late or handed-back
    // commit never takes a partition back.
    let mut highest = [None::<i64>; 4];
    let check_committed = |highest: &mut [Option<i64>; 4]| {
        for p in 0..4 {
            let now = committed_offset(&app, &input, p);
            assert!(now >= highest[p as usize], "partition {p}: committed offset went back from {:?} to {now:?}", highest[p as usize]);
            highest[p as usize] = now;
        }
    };
    for (at, action, name) in plan {
        while started.elapsed() < Duration::from_secs(at) {
            live.iter_mut().for_each(Instance::assert_running);
            check_committed(&mut highest);
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("t={:.1}s: {action} {name}", started.elapsed().as_secs_f64());
        match action {
            "start" => live.push(start_instance(name, &bootstrap, &app, &input, dir)),
            _ => {
                let i = live.iter().position(|x| x.name == name).unwrap();
                let instance = live.remove(i);
                if action == "kill" { instance.kill() } else { instance.stop() }
            }
        }
    }
    let sent = feeder.join(false);
    // The last instance takes over the killed members' partitions after
    // their session timeout (6 s) and processes everything.
    let deadline = Instant::now() + Duration::from_secs(90);
    let ends: Vec<i64> = (0..4).map(|p| end_offset_at(&bootstrap, &input, p)).collect();
    while !(0..4).all(|p| committed_offset(&app, &input, p) == Some(ends[p as usize])) {
        live.iter_mut().for_each(Instance::assert_running);
        check_committed(&mut highest);
        assert!(Instant::now() < deadline, "input not fully committed within 90 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    for instance in live {
        instance.stop();
    }
    let state = changelog_state_at(&bootstrap, &app, "s", 4);
    assert_same_state(&state, &model_of(&sent), "the changelogs after joins, kills and clean stops");
}

/// Starts a broker of this test's own (port `port`, its own data dir) with
/// `testing/kafka.sh`, so stopping it disturbs no other test.
struct OwnBroker {
    env: Vec<(String, String)>,
}

impl OwnBroker {
    fn run(&self, command: &str) -> std::io::Result<std::process::ExitStatus> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("testing/kafka.sh");
        Command::new("bash")
            .arg(&script)
            .arg(command)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .status()
    }

    fn script(&self, command: &str) {
        let status = self.run(command).expect("run testing/kafka.sh");
        assert!(status.success(), "testing/kafka.sh {command} failed");
    }

    /// Like `script`, but only reports a failure (for `Drop`, which may run
    /// while the test is already panicking).
    fn try_script(&self, command: &str) {
        let status = self.run(command);
        if !status.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("testing/kafka.sh {command} failed: {status:?}");
        }
    }

    /// Starts a broker on four ports that are free now (client, controller,
    /// SSL, SASL: `testing/kafka.sh` opens all four), returning it and its
    /// bootstrap address.
    fn start() -> (OwnBroker, String) {
        let [port, controller, ssl, sasl] = free_ports::<4>();
        let data = std::env::temp_dir().join(format!("kstate-kafka-{port}-{}", std::process::id()));
        let broker = OwnBroker {
            env: vec![
                ("KSTATE_KAFKA_PORT".into(), port.to_string()),
                ("KSTATE_KAFKA_CONTROLLER_PORT".into(), controller.to_string()),
                ("KSTATE_KAFKA_SSL_PORT".into(), ssl.to_string()),
                ("KSTATE_KAFKA_SASL_PORT".into(), sasl.to_string()),
                ("KSTATE_KAFKA_DATA".into(), data.display().to_string()),
                ("KSTATE_KAFKA_HEAP".into(), "384m".into()),
            ],
        };
        broker.script("start");
        (broker, format!("127.0.0.1:{port}"))
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.try_script("stop");
        if let Some((_, data)) = self.env.iter().find(|(k, _)| k == "KSTATE_KAFKA_DATA") {
            let _ = std::fs::remove_dir_all(data);
        }
    }
}

/// `N` distinct TCP ports on 127.0.0.1 that are free now: each bound to
/// port 0 (the kernel picks), all held until every one is chosen, then
/// released for the broker to take.
fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> = (0..N).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port")).collect();
    std::array::from_fn(|i| held[i].local_addr().expect("a bound port").port())
}

/// A broker of the test's own on ports that are free and its address
/// (`None`, reported as skipped, without java to run one).
fn own_broker() -> Option<(OwnBroker, String)> {
    if std::process::Command::new("java").arg("-version").output().is_err() {
        eprintln!("skipped: no java to run a broker of the test's own");
        return None;
    }
    init_tracing();
    Some(OwnBroker::start())
}

#[test]
fn a_broker_restart_under_load_stops_nothing_and_loses_nothing() {
    let _serial = serial();
    let Some((broker, bootstrap)) = own_broker() else { return };
    let (input, app) = (unique("restart-in"), unique("restart"));
    create_topic_at(&bootstrap, &input, 2, &[]);
    let state = tempfile::tempdir().unwrap();
    let times = ProcessedTimes::default();
    let running = start_counting(builder(&app, &input, state.path()).bootstrap_servers(&bootstrap), &times);
    // A second application on the same input, without stores and with a
    // long commit interval: its offset commits go out without a changelog
    // send to wait for, and some are due while the broker is down.
    let reader_app = unique("restart-reader");
    let read = ProcessedTimes::default();
    let reader_builder =
        builder(&reader_app, &input, state.path()).bootstrap_servers(&bootstrap).commit_interval(Duration::from_secs(3));
    let reader = Running::start(reader_builder, {
        let read = read.clone();
        move |_, rec| {
            read.record(rec.partition);
            Ok(())
        }
    });
    let feeder = Feeder::start(&bootstrap, &input, 2, 64, 500, 20_000);
    wait_until("processing to start", TIMEOUT, || {
        assert!(!reader.is_finished() && !running.is_finished(), "an application stopped before the outage");
        times.count(0) > 100 && times.count(1) > 100 && read.count(0) > 100 && read.count(1) > 100
    });
    broker.script("stop");
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(20));
    assert!(!running.is_finished(), "the application stopped while the broker was down");
    assert!(!reader.is_finished(), "the reader stopped while the broker was down");
    broker.script("restart");
    let up = Instant::now();
    eprintln!("broker down for {:.1} s", (up - down).as_secs_f64());
    let sent = feeder.join(false);
    let fed = Instant::now();
    wait_all_committed_at(&bootstrap, &app, &input, 2, Duration::from_secs(120));
    wait_all_committed_at(&bootstrap, &reader_app, &input, 2, Duration::from_secs(60));
    for p in 0..2 {
        // From the broker's return to the end of the input.
        let pause = times.longest_pause(p, up, fed);
        eprintln!("partition {p}: longest pause after the broker returned {pause:?}");
        // Reconnecting, then rejoining the group: the restarted coordinator
        // no longer knows the member and waits out its old session (6 s).
        assert!(pause < Duration::from_secs(20), "partition {p} paused {pause:?} after the broker returned");
    }
    assert!(!running.is_finished(), "the application stopped after the broker returned");
    running.stop().expect("a clean stop after the outage");
    reader.stop().expect("the reader stops cleanly after the outage");
    let state_after = changelog_state_at(&bootstrap, &app, "s", 2);
    assert_same_state(&state_after, &model_of(&sent), "the changelogs after a broker restart");
    drop(broker);
}

#[test]
fn under_exactly_once_a_broker_restart_under_load_loses_and_duplicates_nothing() {
    let _serial = serial();
    let Some((broker, bootstrap)) = own_broker() else { return };
    let (input, app, out) = (unique("eos-restart-in"), unique("eos-restart"), unique("eos-restart-out"));
    create_topic_at(&bootstrap, &input, 2, &[]);
    create_topic_at(&bootstrap, &out, 2, &[]);
    let state = tempfile::tempdir().unwrap();
    let times = ProcessedTimes::default();
    // An output per input, named by the input's position: the transaction
    // a commit has in flight when the broker goes holds outputs sent since
    // (held for the next one), and it fails.
    let builder = builder(&app, &input, state.path())
        .bootstrap_servers(&bootstrap)
        .store(common::store("s"))
        .processing_guarantee(kstate::ProcessingGuarantee::ExactlyOnce)
        // The transaction in flight fails while the broker is away (its
        // records time out), and aborts once it is back (or, should the
        // abort fail too, the producer is replaced).
        .kafka_config("message.timeout.ms", "3000")
        // Longer than the outage: the coordinator does not end it (which
        // would fence the producer).
        .transaction_timeout(Duration::from_secs(60));
    let running = Running::start(builder, {
        let (times, out) = (times.clone(), out.clone());
        move |ctx, rec| {
            // Slower than the feeder: a backlog is fetched when the broker
            // goes, and processed while the transaction in flight fails.
            std::thread::sleep(Duration::from_millis(1));
            apply_record(ctx, rec)?;
            let position = format!("{}:{}", rec.partition, rec.offset);
            ctx.send(kstate::Output::to(&out).key(rec.key.unwrap()).value(position.as_bytes()))?;
            times.record(rec.partition);
            Ok(())
        }
    });
    let feeder = Feeder::start(&bootstrap, &input, 2, 64, 2_000, 16_000);
    wait_until("a backlog", TIMEOUT, || {
        assert!(!running.is_finished(), "the application stopped before the outage");
        times.count(0) > 800 && times.count(1) > 800
    });
    broker.script("stop");
    std::thread::sleep(Duration::from_secs(8));
    assert!(!running.is_finished(), "the application stopped while the broker was down");
    broker.script("restart");
    let sent = feeder.join(false);
    wait_all_committed_at(&bootstrap, &app, &input, 2, Duration::from_secs(120));
    assert!(!running.is_finished(), "the application stopped after the broker returned");
    running.stop().expect("a clean stop after the outage");
    // Every input exactly once among the committed outputs, and the
    // changelogs equal to the model of the input.
    let mut seen = std::collections::BTreeMap::new();
    for p in 0..2 {
        for (_, _, v) in read_partition_at(&bootstrap, &out, p) {
            let position = String::from_utf8(v.unwrap()).unwrap();
            *seen.entry(position).or_insert(0) += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).take(5).collect();
    assert!(twice.is_empty(), "inputs with more than one committed output: {twice:?}");
    let counts: Vec<i64> = (0..2).map(|p| committed_offset_at(&bootstrap, &app, &input, p).unwrap_or(0)).collect();
    assert_eq!(seen.len() as i64, counts.iter().sum::<i64>(), "one committed output per committed input (committed {counts:?})");
    assert_eq!(counts.iter().sum::<i64>(), sent.len() as i64, "all input committed");
    let state_after = changelog_state_at(&bootstrap, &app, "s", 2);
    assert_same_state(&state_after, &model_of(&sent), "the changelogs after a broker restart");
    drop(broker);
}

/// The processor of these tests: applies [`record_writes`] to store `s`.
fn apply_record(ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), Error> {
    let s = ctx.store("s")?;
    for (k, v) in record_writes(rec.key.unwrap(), rec.value.unwrap()) {
        s.put(&k, &v)?;
    }
    Ok(())
}

/// Runs an application with store `s` and [`apply_record`]; when each
/// partition's records were processed goes to `times`.
fn start_counting(builder: kstate::AppBuilder, times: &ProcessedTimes) -> Running {
    let times = times.clone();
    Running::start(builder.store(common::store("s")), move |ctx, rec| {
        apply_record(ctx, rec)?;
        times.record(rec.partition);
        Ok(())
    })
}

#[test]
fn a_foreign_writer_in_one_changelog_reinitialises_that_task_only() {
    let _serial = serial();
    metrics();
    let reinitialised = || counter("kstate_task_reinitialisations_total", &[("partition", "0")]).unwrap_or(0);
    let reinitialised_before = reinitialised();
    let Fixture { input, app, state } = fixture("foreign", 2);
    let restores = Restores::default();
    let times = ProcessedTimes::default();
    let running = start_counting(builder(&app, &input, state.path()).restore_listener(restores.clone()), &times);
    let feeder = Feeder::start(&bootstrap(), &input, 2, 32, 400, 8_000);
    wait_until("processing to start", TIMEOUT, || times.count(0) > 200 && times.count(1) > 200);
    let before = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    // Another instance (a zombie) writes partition 0 of the changelog.
    let changelog = kstate::changelog_topic(&app, "s");
    let fault = Instant::now();
    produce(&changelog, &[(0, b"zombie".to_vec(), Some(b"was here".to_vec()))]);
    wait_until("task 0 to be restored again", TIMEOUT, || restores.starts.lock().unwrap().iter().filter(|s| s.partition == 0).count() >= 2);
    let sent = feeder.join(false);
    // Pauses up to the end of the input (after it, nothing is left to process).
    let done = Instant::now();
    wait_all_committed_at(&bootstrap(), &app, &input, 2, Duration::from_secs(60));
    assert!(!running.is_finished(), "the application stopped");
    let pause = times.longest_pause(1, fault, done);
    eprintln!(
        "partition 1: longest pause after the fault {pause:?} (before it: {:?}); partition 0: {:?}",
        times.longest_pause(1, before, fault),
        times.longest_pause(0, fault, done)
    );
    assert!(pause < Duration::from_millis(1000), "the unrelated partition paused {pause:?}");
    running.stop().expect("clean stop");
    assert_eq!(reinitialised() - reinitialised_before, 1, "kstate_task_reinitialisations_total{{partition=0}}");
    let starts = restores.starts.lock().unwrap();
    assert_eq!(starts.iter().filter(|s| s.partition == 1).count(), 1, "task 1 was never re-initialised");
    drop(starts);
    // The foreign record is part of the changelog and so of the state.
    let mut expected = model_of(&sent);
    expected.insert(b"zombie".to_vec(), b"was here".to_vec());
    assert_same_state(&changelog_state_at(&bootstrap(), &app, "s", 2), &expected, "the changelogs");
    let mut local = read_store_dir(state.path(), &app, "s", 0).0;
    local.append(&mut read_store_dir(state.path(), &app, "s", 1).0);
    assert_same_state(&local, &expected, "the local stores");
}

#[test]
fn a_task_failing_again_and_again_ends_run_with_a_typed_error() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("foreign-again", 1);
    let times = ProcessedTimes::default();
    let running = {
        let times = times.clone();
        // Gives up after 5 failures in a row that span at least 2 s.
        Running::start(
            builder(&app, &input, state.path()).store(common::store("s")).task_timeout(Duration::from_secs(2)),
            move |ctx, rec| {
                ctx.store("s")?.put(rec.key.unwrap(), rec.value.unwrap())?;
                times.record(rec.partition);
                Ok(())
            },
        )
    };
    let feeder = Feeder::start(&bootstrap(), &input, 1, 32, 200, 100_000);
    wait_until("processing to start", TIMEOUT, || times.count(0) > 50);
    let changelog = kstate::changelog_topic(&app, "s");
    // A zombie that never stops writing.
    let started = Instant::now();
    while !running.is_finished() {
        assert!(started.elapsed() < Duration::from_secs(60), "run did not give up on the task");
        produce(&changelog, &[(0, b"zombie".to_vec(), Some(b"again".to_vec()))]);
        std::thread::sleep(Duration::from_millis(300));
    }
    feeder.join(true);
    match running.stop() {
        Err(Error::TaskFailed { partition, attempts, last }) => {
            assert_eq!((partition, attempts), (0, 5));
            assert!(matches!(*last, Error::ChangelogDiverged { .. }), "{last:?}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
}

#[test]
fn a_held_directory_lock_stalls_only_its_own_task() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("locked", 2);
    // Another process (here: this one, through its own file handle) holds
    // partition 1's store directory.
    let dir = state.path().join(&app).join("s").join("1");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(".kstate.lock")).unwrap();
    lock.lock().unwrap();
    let times = ProcessedTimes::default();
    let feeder = Feeder::start(&bootstrap(), &input, 2, 32, 400, 6_000);
    let t0 = Instant::now();
    let running = start_counting(builder(&app, &input, state.path()), &times);
    wait_until("partition 0 to be processed", TIMEOUT, || times.count(0) > 0);
    let first = t0.elapsed();
    std::thread::sleep(Duration::from_secs(5).saturating_sub(t0.elapsed()));
    assert_eq!(times.count(1), 0, "partition 1 processed while its lock was held");
    let released = Instant::now();
    drop(lock);
    wait_until("partition 1 to be processed", TIMEOUT, || times.count(1) > 0);
    let p0_pause = times.longest_pause(0, t0 + first, released);
    eprintln!("first record of partition 0 after {first:?}; its longest pause while 1 was locked {p0_pause:?}; partition 1 ran {:?} after the release", released.elapsed());
    assert!(first < Duration::from_secs(4), "partition 0 waited {first:?} for partition 1's lock");
    assert!(p0_pause < Duration::from_millis(1000), "partition 0 paused {p0_pause:?}");
    let sent = feeder.join(false);
    wait_all_committed_at(&bootstrap(), &app, &input, 2, Duration::from_secs(60));
    running.stop().expect("clean stop");
    assert_same_state(&changelog_state_at(&bootstrap(), &app, "s", 2), &model_of(&sent), "the changelogs");
}

#[test]
fn the_processing_exception_handler_skips_failed_records_and_counts_them() {
    let _serial = serial();
    metrics();
    let Fixture { input, app, state } = fixture("handler", 1);
    let records: Vec<KeyedRecord> = (0..100)
        .map(|i| {
            let value = match i % 10 {
                3 => b"bad".to_vec(),
                7 => b"panic".to_vec(),
                _ => i.to_string().into_bytes(),
            };
            (0, format!("k{i}").into_bytes(), Some(value))
        })
        .collect();
    produce(&input, &records);
    let skipped = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let running = Running::start(
        builder(&app, &input, state.path()).store(common::store("s")).processing_exception_handler({
            let skipped = skipped.clone();
            let seen = seen.clone();
            move |record, error| {
                seen.lock().unwrap().push((record.offset, record.value.map(<[u8]>::to_vec), error.to_string()));
                skipped.fetch_add(1, Ordering::Relaxed);
                ProcessingDecision::Continue
            }
        }),
        move |ctx, rec| {
            tx.send(rec.offset).unwrap();
            // A panicking processor is the handler's case too.
            assert!(rec.value_str() != Some("panic"), "the processor panicked at offset {}", rec.offset);
            let n: u64 = rec.value_str().unwrap().parse().map_err(|e| Error::Config(format!("cannot parse: {e}")))?;
            ctx.store("s")?.put(rec.key.unwrap(), &n.to_be_bytes())?;
            Ok(())
        },
    );
    for _ in 0..100 {
        rx.recv_timeout(TIMEOUT).unwrap();
    }
    wait_until("the input to be committed", TIMEOUT, || committed_offset(&app, &input, 0) == Some(100));
    running.stop().expect("skipped records do not stop the app");
    assert_eq!(skipped.load(Ordering::Relaxed), 20);
    for (offset, value, error) in seen.lock().unwrap().iter() {
        match offset % 10 {
            3 => assert!(value.as_deref() == Some(&b"bad"[..]) && error.contains("cannot parse"), "{error}"),
            7 => assert!(error.contains("the processor panicked: the processor panicked at offset"), "{error}"),
            _ => panic!("only the bad records reach the handler: {offset}"),
        }
    }
    assert_eq!(counter("kstate_skipped_records_total", &[("topic", &input), ("partition", "0")]), Some(20));
    let (data, _) = read_store_dir(state.path(), &app, "s", 0);
    assert_eq!(data.len(), 80, "every good record processed, the bad ones skipped");
    assert!(!data.contains_key(&b"k3"[..]) && !data.contains_key(&b"k7"[..]));
}

#[test]
fn a_handler_that_says_fail_stops_the_app_with_the_processor_error() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("handler-fail", 1);
    produce(&input, &[(0, b"a".to_vec(), Some(b"bad".to_vec()))]);
    let asked = Arc::new(AtomicBool::new(false));
    let app = builder(&app, &input, state.path())
        .store(common::store("s"))
        .processing_exception_handler({
            let asked = asked.clone();
            move |_, _| {
                asked.store(true, Ordering::Relaxed);
                ProcessingDecision::Fail
            }
        })
        .build()
        .unwrap();
    let e = app.run(|_, _| Err::<(), _>("cannot handle it")).unwrap_err();
    assert!(matches!(e, Error::Processor { offset: 0, .. }), "{e:?}");
    assert!(asked.load(Ordering::Relaxed));
}

#[test]
fn a_changelog_recreated_and_refilled_past_the_checkpoint_is_restored_in_full() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("recreated", 1);
    let changelog = kstate::changelog_topic(&app, "s");
    let old: Vec<KeyedRecord> = (0..20).map(|i| (0, format!("old{i}").into_bytes(), Some(b"1".to_vec()))).collect();
    produce(&input, &old);
    let times = ProcessedTimes::default();
    let running = start_counting(builder(&app, &input, state.path()), &times);
    wait_all_committed_at(&bootstrap(), &app, &input, 1, TIMEOUT);
    running.stop().unwrap();
    let (_, checkpoint) = read_store_dir(state.path(), &app, "s", 0);
    let checkpoint = checkpoint.expect("a checkpoint");

    // The changelog is deleted, recreated and refilled past the old checkpoint.
    delete_topic(&changelog);
    create_topic(&changelog, 1, &[("cleanup.policy", "compact")]);
    let new: Vec<KeyedRecord> =
        (0..checkpoint + 10).map(|i| (0, format!("new{i}").into_bytes(), Some(b"2".to_vec()))).collect();
    produce(&changelog, &new);

    let restores = Restores::default();
    let running = Running::start(
        builder(&app, &input, state.path()).store(common::store("s")).restore_listener(restores.clone()),
        |_, _| Ok(()),
    );
    wait_until("the restore", TIMEOUT, || restores.ended() == 1);
    running.stop().unwrap();
    let start = restores.starts.lock().unwrap()[0].clone();
    let reason = start.full_restore_reason.unwrap_or_default();
    assert!(reason.contains("recreated"), "full restore reason: {reason:?}");
    assert_eq!(start.start_offset, 0);
    let (data, _) = read_store_dir(state.path(), &app, "s", 0);
    let mut expected = std::collections::BTreeMap::new();
    for (_, k, v) in &new {
        apply(&mut expected, k, v.as_deref());
    }
    assert_same_state(&data, &expected, "the store after the changelog was recreated");
}

#[test]
fn a_member_joining_under_load_pauses_nothing_the_first_member_keeps() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("join", 4);
    let second_state = tempfile::tempdir().unwrap();
    let (first_times, second_times) = (ProcessedTimes::default(), ProcessedTimes::default());
    let feeder = Feeder::start(&bootstrap(), &input, 4, 64, 800, 16_000);
    let first = start_counting(builder(&app, &input, state.path()), &first_times);
    wait_until("the first member to process every partition", TIMEOUT, || (0..4).all(|p| first_times.count(p) > 100));
    let joined = Instant::now();
    let second = start_counting(builder(&app, &input, second_state.path()), &second_times);
    wait_until("the second member to take partitions", TIMEOUT, || (0..4).any(|p| second_times.count(p) > 0));
    std::thread::sleep(Duration::from_secs(2));
    let settled = Instant::now();
    // The partitions the first member kept: processed by it after the rebalance.
    let kept: Vec<i32> = (0..4).filter(|&p| second_times.count(p) == 0).collect();
    assert!(!kept.is_empty() && kept.len() < 4, "cooperative rebalance moved some partitions, kept {kept:?}");
    for &p in &kept {
        let pause = first_times.longest_pause(p, joined, settled);
        eprintln!("partition {p} (kept by the first member): longest pause during the join {pause:?}");
        // Measured 21-34 ms. Without the fetcher wake-up after each
        // rebalance round 0.60-0.62 s: librdkafka pauses every partition
        // for the rebalance callback and resumes them without waking its
        // broker thread (see `RuntimeContext::wake_kept_partitions`).
        assert!(pause < Duration::from_millis(300), "partition {p} paused {pause:?} while another member joined");
    }
    let sent = feeder.join(false);
    wait_all_committed_at(&bootstrap(), &app, &input, 4, Duration::from_secs(60));
    first.stop().expect("the first member stops cleanly");
    second.stop().expect("the second member stops cleanly");
    assert_same_state(&changelog_state_at(&bootstrap(), &app, "s", 4), &model_of(&sent), "the changelogs");
}

#[test]
fn a_second_instance_with_the_same_static_member_id_fences_the_first() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("static", 2);
    let second_state = tempfile::tempdir().unwrap();
    let member = unique("member");
    let (first_times, second_times) = (ProcessedTimes::default(), ProcessedTimes::default());
    let feeder = Feeder::start(&bootstrap(), &input, 2, 32, 200, 100_000);
    let first = start_counting(builder(&app, &input, state.path()).kafka_config("group.instance.id", &member), &first_times);
    wait_until("the first instance to process", TIMEOUT, || first_times.count(0) > 0 && first_times.count(1) > 0);
    // A misconfigured deployment: a second instance reuses the id.
    let second = start_counting(builder(&app, &input, second_state.path()).kafka_config("group.instance.id", &member), &second_times);
    wait_until("the fenced instance to stop", TIMEOUT, || first.is_finished());
    match first.stop() {
        Err(Error::GroupMembership { group, detail }) => {
            assert_eq!(group, app);
            assert!(detail.contains("group.instance.id"), "{detail}");
        }
        other => panic!("expected the fenced instance to stop with Error::GroupMembership, got {other:?}"),
    }
    wait_until("the second instance to process", TIMEOUT, || second_times.count(0) > 0 && second_times.count(1) > 0);
    assert!(!second.is_finished(), "the instance that joined last keeps running");
    feeder.join(true);
    second.stop().expect("the second instance stops cleanly");
}
