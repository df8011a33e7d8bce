//! Window and session stores against the real broker: hopping-window counts
//! and session counts equal a model after a standby failover and after a
//! restore into an empty state dir; late records are dropped; the
//! changelogs are `compact,delete` with the store's retention plus the
//! additional retention; a restore keeps no wholly expired segment; bad
//! definitions and changelogs that would lose live windows are errors.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kstate::codec::{U64Be, Utf8};
use kstate::{
    ClosedWindow, Error, Output, ProcessingGuarantee, Processor, ProcessorContext, ProcessorError, Record, Session, SessionRecord,
    SessionWindows, StoreDefinition, Windows,
};
use rdkafka::admin::{AdminOptions, ResourceSpecifier};

const SIZE: i64 = 10_000;
const ADVANCE: i64 = 5_000;
const GRACE: i64 = 2_000;
const RETENTION: i64 = 30_000;
const GAP: i64 = 3_000;
const SESSION_GRACE: i64 = 2_000;
const SESSION_RETENTION: i64 = 20_000;
const KEYS: usize = 7;

fn windows() -> Windows {
    Windows::hopping(Duration::from_millis(SIZE as u64), Duration::from_millis(ADVANCE as u64)).grace(Duration::from_millis(GRACE as u64))
}

fn sessions() -> SessionWindows {
    SessionWindows::with_gap(Duration::from_millis(GAP as u64)).grace(Duration::from_millis(SESSION_GRACE as u64))
}

/// What a `dump` record saw: every live window and every key's sessions.
#[derive(Debug, Default, Clone, PartialEq)]
struct Dump {
    windows: Vec<(String, i64, u64)>,
    sessions: Vec<(String, Session, u64)>,
}

#[derive(Default)]
struct Model {
    windows: BTreeMap<(String, i64), u64>,
    sessions: BTreeMap<String, Vec<(Session, u64)>>,
    stream_time: i64,
    window_time: i64,
    session_time: i64,
    late_windows: usize,
}

impl Model {
    fn record(&mut self, key: &str, ts: i64) {
        self.stream_time = self.stream_time.max(ts);
        for start in windows().windows_for(ts) {
            if start + SIZE + GRACE <= self.stream_time {
                self.late_windows += 1;
            } else {
                *self.windows.entry((key.to_string(), start)).or_default() += 1;
                self.window_time = self.window_time.max(start);
            }
        }
        let mine = self.sessions.entry(key.to_string()).or_default();
        let (near, far): (Vec<_>, Vec<_>) = mine.drain(..).partition(|(s, _)| s.end >= ts - GAP && s.start <= ts + GAP);
        let merged = near.iter().fold(Session::at(ts), |m, (s, _)| m.merge(*s));
        *mine = far;
        if merged.end + SESSION_GRACE < self.stream_time {
            mine.extend(near);
        } else {
            mine.push((merged, near.iter().map(|(_, n)| n).sum::<u64>() + 1));
            self.session_time = self.session_time.max(merged.end);
        }
    }

    fn live(&self) -> Dump {
        let mut windows: Vec<(String, i64, u64)> = self
            .windows
            .iter()
            .filter(|((_, s), _)| *s > self.window_time - RETENTION)
            .map(|((k, s), n)| (k.clone(), *s, *n))
            .collect();
        windows.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        let mut sessions = Vec::new();
        for (k, list) in &self.sessions {
            let mut list: Vec<_> = list.iter().filter(|(s, _)| s.end > self.session_time - SESSION_RETENTION).cloned().collect();
            list.sort_by_key(|(s, _)| (s.end, s.start));
            sessions.extend(list.into_iter().map(|(s, n)| (k.clone(), s, n)));
        }
        Dump { windows, sessions }
    }
}

type Dumps = Arc<Mutex<Vec<Dump>>>;

/// Counts per hopping window and per session; `dump` records what is live.
fn counter(dumps: Dumps, late: Arc<AtomicUsize>, misuse: Arc<Mutex<Vec<String>>>) -> impl FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> Result<(), Error> + Send + 'static {
    move |ctx, rec| {
        if rec.value_str() == Some("dump") {
            let windows = ctx.window_store::<Utf8, U64Be>("w")?.fetch_all(0, i64::MAX)?;
            let ss = ctx.session_store::<Utf8, U64Be>("s")?;
            let mut sessions = Vec::new();
            for k in 0..KEYS {
                let key = format!("k{k}");
                sessions.extend(ss.fetch(&key)?.into_iter().map(|(s, n)| (key.clone(), s, n)));
            }
            dumps.lock().unwrap().push(Dump { windows, sessions });
            // A window store is not a key-value store.
            if let Err(e) = ctx.store("w") {
                misuse.lock().unwrap().push(e.to_string());
            }
            return Ok(());
        }
        let ts = ctx.timestamp().expect("extracted");
        let key = rec.key_str().expect("keyed").to_string();
        let done = ctx.window_store::<Utf8, U64Be>("w")?.update(&key, ts, |_, n| n.unwrap_or(0) + 1)?;
        late.fetch_add(done.late, Ordering::SeqCst);
        let _: SessionRecord = ctx.session_store::<Utf8, U64Be>("s")?.record(&key, ts, |found| found.iter().map(|(_, n)| n).sum::<u64>() + 1)?;
        Ok(())
    }
}

fn app(app: &str, input: &str, dir: &std::path::Path, standbys: usize) -> kstate::AppBuilder {
    builder(app, input, dir)
        .store(remote_when_testing_remote(StoreDefinition::window("w", windows()).retention(Duration::from_millis(RETENTION as u64))))
        .store(remote_when_testing_remote(StoreDefinition::session("s", sessions()).retention(Duration::from_millis(SESSION_RETENTION as u64))))
        .num_standby_replicas(standbys)
        // Event time in the value; `dump` records take the stream time.
        .timestamp_extractor(|rec, stream_time| rec.value_str().and_then(|v| v.parse().ok()).or(stream_time).unwrap_or(0))
}

/// The final-results application: one window store with the default
/// retention (size + grace: a window expires as soon as it may close).
fn final_app(app: &str, input: &str, dir: &std::path::Path) -> kstate::AppBuilder {
    builder(app, input, dir)
        .store(remote_when_testing_remote(StoreDefinition::window("w", windows()).emit_final_results()))
        .timestamp_extractor(|rec, stream_time| rec.value_str().and_then(|v| v.parse().ok()).or(stream_time).unwrap_or(0))
}

/// Event `i`: key `k{i % KEYS}` at `i * 500` ms; every 50th event also a
/// record 40 s in the past (late for its windows, mostly for its session).
fn events(range: std::ops::Range<i64>) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for i in range {
        out.push((format!("k{}", i % KEYS as i64), i * 500));
        if i % 50 == 49 {
            out.push((format!("k{}", (i / 50) % KEYS as i64), (i * 500 - 40_000).max(0)));
        }
    }
    out
}

fn send(input: &str, model: &mut Model, events: &[(String, i64)]) {
    for (k, ts) in events {
        model.record(k, *ts);
    }
    let records: Vec<KeyedRecord> = events.iter().map(|(k, ts)| (0, k.clone().into_bytes(), Some(ts.to_string().into_bytes()))).collect();
    produce(input, &records);
}

fn dump(input: &str, dumps: &Dumps) -> Dump {
    let before = dumps.lock().unwrap().len();
    produce(input, &[(0, b"k0".to_vec(), Some(b"dump".to_vec()))]);
    wait_until("the dump record", TIMEOUT, || dumps.lock().unwrap().len() > before);
    dumps.lock().unwrap()[before].clone()
}

#[test]
fn window_and_session_counts_survive_a_standby_failover_and_a_restore() {
    let Fixture { input, app: app_id, state } = fixture("windows", 1);
    let (dumps, late, misuse): (Dumps, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) = Default::default();
    let start = |dir: &std::path::Path, standbys: usize| Running::start(app(&app_id, &input, dir, standbys), counter(dumps.clone(), late.clone(), misuse.clone()));
    let mut model = Model::default();
    let (dir_a, dir_b, dir_c) = (state.path().join("a"), state.path().join("b"), state.path().join("c"));
    let a = start(&dir_a, 1);
    let b = start(&dir_b, 1);
    send(&input, &mut model, &events(0..400));
    let first = dump(&input, &dumps);
    assert_eq!(first, model.live(), "live windows and sessions equal the model");
    assert!(model.late_windows > 0 && late.load(Ordering::SeqCst) == model.late_windows, "late records dropped from their windows and counted");
    assert!(misuse.lock().unwrap()[0].contains("is a window store"), "{:?}", misuse.lock().unwrap());
    wait_all_committed_at(&bootstrap(), &app_id, &input, 1, TIMEOUT);
    // One of a and b is the standby: stopping a leaves b active either way.
    std::thread::sleep(Duration::from_secs(2)); // the standby applies the last commit
    a.stop().unwrap();
    send(&input, &mut model, &events(400..600));
    assert_eq!(dump(&input, &dumps), model.live(), "after the failover");
    wait_all_committed_at(&bootstrap(), &app_id, &input, 1, TIMEOUT);
    b.stop().unwrap();

    // A new instance restores from the changelogs alone, the window
    // store from its live tail (the records before it are all expired).
    let restores = Restores::default();
    let c = Running::start(
        app(&app_id, &input, &dir_c, 0).restore_listener(restores.clone()),
        counter(dumps.clone(), late.clone(), misuse.clone()),
    );
    assert_eq!(dump(&input, &dumps), model.live(), "after a restore into an empty state dir");
    c.stop().unwrap();
    let starts = restores.starts.lock().unwrap().clone();
    let window_start = starts.iter().find(|s| s.store == "w").expect("the window store restored");
    eprintln!("window store restored from offset {} of {}", window_start.start_offset, window_start.end_offset);
    assert!(window_start.start_offset > window_start.end_offset / 2, "restored from its live tail: {window_start:?}");
    // The changelog still holds windows from the first segment; the
    // restored store holds none of a wholly expired segment (60 s segments:
    // the oldest live window starts after 265 s, in the segment from 240 s).
    let changelog = read_partition(&kstate::changelog_topic(&app_id, "w"), 0);
    let start_of = |key: &[u8]| i64::from_be_bytes(key[key.len() - 8..].try_into().unwrap()) ^ i64::MIN;
    assert!(changelog.iter().any(|(_, k, _)| start_of(k) < 60_000), "the changelog has windows of expired segments");
    let (restored, _) = read_store_dir(&dir_c, &app_id, "w", 0);
    let oldest = restored.keys().map(|k| start_of(k)).min().unwrap();
    assert!(oldest >= 240_000, "a window starting at {oldest} ms was restored from an expired segment");
    assert!(restored.len() < changelog.len() / 4, "restored {} of {} changelog records", restored.len(), changelog.len());
    // The operator tools read window and session stores.
    let live = model.live();
    for (store, n) in [("w", live.windows.len()), ("s", live.sessions.len())] {
        let report = kstate::admin::verify(&dir_c, &app_id, store, 0, &kstate::admin::Kafka::new(bootstrap())).unwrap();
        assert_eq!((report.matching, report.store_keys, report.differences.len()), (n as u64, n as u64, 0), "verify {store}: {report:?}");
    }
    let sampled = kstate::admin::sample(&dir_c, &app_id, "w", 0, 3, kstate::admin::PrefixRule::Bytes(2)).unwrap();
    let segments = sampled.segments.expect("a window store's segments");
    assert_eq!(segments.iter().map(|s| s.keys).sum::<u64>(), sampled.keys);
    assert!(segments.iter().all(|s| s.from_ms >= 240_000 && s.from_ms % 60_000 == 0), "{segments:?}");
    assert!(sampled.largest_keys.iter().all(|e| e.key.starts_with('k') && e.key.contains('@')), "{:?}", sampled.largest_keys);
    assert_eq!(sampled.top_prefixes.len(), 3, "prefixes of the user's keys (`k0`..`k6`)");
    let inspected = kstate::admin::inspect(&dir_c).unwrap();
    let kinds: Vec<(String, String)> = inspected.applications[0]
        .partitions
        .iter()
        .filter_map(|p| Some((p.store.clone(), p.segments.as_ref()?.kind.clone())))
        .collect();
    assert_eq!(kinds, [("s".to_string(), "session".to_string()), ("w".to_string(), "window".to_string())]);

    // Both changelogs forget: compact,delete and retention + one day.
    for (store, retention) in [("w", RETENTION), ("s", SESSION_RETENTION)] {
        let topic = kstate::changelog_topic(&app_id, store);
        let opts = AdminOptions::new().request_timeout(Some(TIMEOUT));
        let described = futures::executor::block_on(admin().describe_configs(&[ResourceSpecifier::Topic(&topic)], &opts)).unwrap();
        let config = described.into_iter().next().unwrap().unwrap();
        let value = |name: &str| config.get(name).and_then(|e| e.value.clone()).unwrap_or_default();
        assert_eq!(value("cleanup.policy"), "compact,delete", "{topic}");
        assert_eq!(value("retention.ms"), (retention + 86_400_000).to_string(), "{topic}");
    }
}

#[test]
fn definitions_and_changelogs_that_would_lose_live_windows_are_refused() {
    let Fixture { input, app: app_id, state } = fixture("windows-bad", 1);
    let w = Windows::tumbling(Duration::from_secs(10)).grace(Duration::from_secs(5));
    let build = |def: StoreDefinition| builder(&app_id, &input, state.path()).store(def).build().map(|_| ());
    let short = build(StoreDefinition::window("w", w).retention(Duration::from_secs(12))).unwrap_err();
    assert!(matches!(&short, Error::Config(m) if m.contains("shorter than the window size plus grace")), "{short}");
    let hop = build(StoreDefinition::window("w", Windows::hopping(Duration::from_secs(1), Duration::from_secs(2)))).unwrap_err();
    assert!(matches!(&hop, Error::Config(m) if m.contains("advance")), "{hop}");
    let ttl = build(StoreDefinition::session("s", SessionWindows::with_gap(Duration::from_secs(1))).ttl(Duration::from_secs(1), kstate::TimeDomain::WallClock)).unwrap_err();
    assert!(matches!(&ttl, Error::Config(m) if m.contains("retention, not a TTL")), "{ttl}");
    let kv = build(common::store("kv").retention(Duration::from_secs(1))).unwrap_err();
    assert!(matches!(&kv, Error::Config(m) if m.contains("only window and session stores")), "{kv}");
    let bytes = build(StoreDefinition::window("w", w).changelog_config("retention.bytes", "1000000")).unwrap_err();
    assert!(matches!(&bytes, Error::Config(m) if m.contains("retention.bytes")), "{bytes}");
    let session = build(StoreDefinition::session("s", SessionWindows::with_gap(Duration::from_secs(10))).retention(Duration::from_secs(10))).unwrap_err();
    assert!(matches!(&session, Error::Config(m) if m.contains("gap plus grace")), "{session}");

    // An existing key-value changelog (compacted only) under a window store's name.
    create_topic(&kstate::changelog_topic(&app_id, "kv"), 1, &[("cleanup.policy", "compact")]);
    let app = builder(&app_id, &input, state.path()).store(StoreDefinition::window("kv", w)).build().unwrap();
    let err = app.run(|_, _| Ok::<(), Error>(())).unwrap_err();
    assert!(matches!(&err, Error::ChangelogTopicMismatch { problem, .. } if problem.contains("must be `compact,delete`")), "{err}");

    // An existing changelog that deletes sooner than the store's retention.
    create_topic(&kstate::changelog_topic(&app_id, "w"), 1, &[("cleanup.policy", "compact,delete"), ("retention.ms", "5000")]);
    let app = builder(&app_id, &input, state.path()).store(StoreDefinition::window("w", w).retention(Duration::from_secs(60))).build().unwrap();
    let err = app.run(|_, _| Ok::<(), Error>(())).unwrap_err();
    assert!(matches!(&err, Error::ChangelogTopicMismatch { problem, .. } if problem.contains("retention.ms is 5000")), "{err}");
    // Long enough for the retention, not for the additional retention (a
    // raised retention must be raised on the topic first).
    create_topic(&kstate::changelog_topic(&app_id, "w2"), 1, &[("cleanup.policy", "compact,delete"), ("retention.ms", "120000")]);
    let app = builder(&app_id, &input, state.path()).store(StoreDefinition::window("w2", w).retention(Duration::from_secs(60))).build().unwrap();
    let err = app.run(|_, _| Ok::<(), Error>(())).unwrap_err();
    assert!(matches!(&err, Error::ChangelogTopicMismatch { problem, .. } if problem.contains("plus the additional retention")), "{err}");
}

/// Final results (`StoreDefinition::emit_final_results`): counts per
/// window; kstate calls `on_window_close` once per closed window, which
/// sends its count to the output topic.
struct Final(String);

impl Processor for Final {
    fn process(&mut self, ctx: &mut ProcessorContext<'_>, rec: &Record<'_>) -> Result<(), ProcessorError> {
        let (key, now) = (rec.key_str().unwrap().to_string(), ctx.timestamp().unwrap());
        ctx.window_store::<Utf8, U64Be>("w")?.update(&key, now, |_, n| n.unwrap_or(0) + 1)?;
        Ok(())
    }
    fn on_window_close(&mut self, ctx: &mut ProcessorContext<'_>, closed: &ClosedWindow<'_>) -> Result<(), ProcessorError> {
        let (key, count) = (closed.key_as::<Utf8>()?, closed.value_as::<U64Be>()?);
        assert_eq!((closed.store(), closed.end() - closed.start()), ("w", SIZE));
        // Stamped now: the event times here are near 1970, and the
        // broker's retention would delete records stamped then.
        let now = ctx.wall_clock_time();
        ctx.send(Output::to(&self.0).key(format!("{key}@{}", closed.start()).as_bytes()).value(count.to_string().as_bytes()).timestamp(now))?;
        Ok(())
    }
}

/// Final results (`emit_final_results`, as `examples/windowed_counts.rs`):
/// each window's count is sent once when it closes; under exactly-once, across a restart mid-way, every window's
/// final result reaches `read_committed` readers exactly once and equals
/// the model.
#[test]
fn final_results_are_sent_once_per_window_under_exactly_once() {
    let Fixture { input, app: app_id, state } = fixture("windows-final", 1);
    let output = unique("windows-final-out");
    create_topic(&output, 1, &[]);
    let run = || {
        let out = output.clone();
        Running::start_processor(
            final_app(&app_id, &input, state.path()).processing_guarantee(ProcessingGuarantee::ExactlyOnce),
            move |_| Final(out.clone()),
        )
    };
    let mut model = Model::default();
    let all = events(0..600);
    let r = run();
    send(&input, &mut model, &all[..300]);
    wait_all_committed_at(&bootstrap(), &app_id, &input, 1, TIMEOUT);
    r.stop().unwrap();
    let r = run();
    send(&input, &mut model, &all[300..]);
    wait_all_committed_at(&bootstrap(), &app_id, &input, 1, TIMEOUT);
    r.stop().unwrap();
    // Every window closed by the final stream time, with its count.
    let want: BTreeMap<String, String> = model
        .windows
        .iter()
        .filter(|((_, start), _)| start + SIZE + GRACE <= model.stream_time)
        .map(|((k, start), n)| (format!("{k}@{start}"), n.to_string()))
        .collect();
    let sent = read_partition(&output, 0);
    let mut got = BTreeMap::new();
    for (_, k, v) in &sent {
        let k = String::from_utf8(k.clone()).unwrap();
        assert!(got.insert(k.clone(), String::from_utf8(v.clone().unwrap()).unwrap()).is_none(), "{k} sent twice");
    }
    assert!(want.len() > 300, "{} windows closed", want.len());
    assert_eq!(got, want, "one final result per closed window, equal to the model");
}

/// The child instance of the crash loop: settings `app \t input \t output
/// \t state`; counts with final results under exactly-once until killed or
/// its stdin closes.
#[test]
#[ignore = "child process of the window crash loop"]
fn windows_child() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    let [app_id, input, out, state]: [&str; 4] = settings.split('\t').collect::<Vec<_>>().try_into().unwrap();
    init_tracing();
    let built = final_app(app_id, input, std::path::Path::new(state))
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
        .commit_interval(Duration::from_millis(50))
        .kafka_config("group.instance.id", format!("{app_id}-child"))
        .transaction_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    stop_when_stdin_closes(built.shutdown_handle());
    let out = out.to_string();
    built.run_processor(move |_| Final(out.clone())).unwrap();
}

/// Windowed counts with final results, SIGKILLed again and again under
/// load: every window's final result reaches `read_committed` readers
/// exactly once and equals a model of the input (per partition: late
/// records dropped on each partition's own stream time).
#[test]
fn final_results_survive_a_crash_loop_exactly_once() {
    use rand::{Rng, SeedableRng};
    const PARTITIONS: i32 = 2;
    let Fixture { input, app: app_id, state } = fixture("windows-crash", PARTITIONS);
    let out = unique("windows-crash-out");
    create_topic(&out, PARTITIONS, &[]);
    let rounds: usize = std::env::var("KSTATE_WINDOW_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    // Key k{i} lives in partition i % PARTITIONS; each partition its own model.
    let mut models: Vec<Model> = (0..PARTITIONS).map(|_| Model::default()).collect();
    let partition_of = |key: &str| key[1..].parse::<i32>().unwrap() % PARTITIONS;
    let all = events(0..6_000);
    let records: Vec<KeyedRecord> = all
        .iter()
        .map(|(k, ts)| {
            models[partition_of(k) as usize].record(k, *ts);
            (partition_of(k), k.clone().into_bytes(), Some(ts.to_string().into_bytes()))
        })
        .collect();
    let log = state.path().join("child.log");
    let spawn = || ChildInstance::spawn("a", "windows_child", format!("{app_id}\t{input}\t{out}\t{}", state.path().display()), log.clone());
    // The input arrives while the instance runs and dies.
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let chunk = records.len().div_ceil(rounds);
    for (round, part) in records.chunks(chunk).enumerate() {
        let child = spawn();
        produce(&input, part);
        std::thread::sleep(Duration::from_millis(rng.random_range(800..2500)));
        child.kill(); // SIGKILL, mid-commit or mid-processing
        eprintln!("round {round}: {} final results visible", read_partition(&out, 0).len() + read_partition(&out, 1).len());
    }
    // The last instance runs to the end; a record far ahead closes every window.
    let ends: Vec<KeyedRecord> = (0..PARTITIONS).map(|p| (p, format!("end{p}").into_bytes(), Some(b"100000000".to_vec()))).collect();
    produce(&input, &ends);
    let want: BTreeMap<String, String> = models
        .iter()
        .flat_map(|m| m.windows.iter().map(|((k, start), n)| (format!("{k}@{start}"), n.to_string())))
        .collect();
    let last = spawn();
    let read = || -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        (0..PARTITIONS).flat_map(|p| read_partition(&out, p)).map(|(_, k, v)| (k, v)).collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while read().len() < want.len() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for every final result; the instance's log ends with:\n{}", last.tail());
        std::thread::sleep(Duration::from_millis(200));
    }
    last.stop();
    let mut got = BTreeMap::new();
    for (k, v) in read() {
        let k = String::from_utf8(k).unwrap();
        let previous = got.insert(k.clone(), String::from_utf8(v.unwrap()).unwrap());
        assert!(previous.is_none(), "{k} sent twice under exactly-once");
    }
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want, "one final result per window, equal to the model");
    let text = strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
    eprintln!("{} final results after {rounds} kills ({} restores)", want.len(), text.matches("restore starting").count());
}
