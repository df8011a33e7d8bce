//! Exactly-once processing against the real broker: a child process counts
//! per key in two stores and writes each new count as an output record; it
//! is SIGKILLed at random points again and again (and, in another test,
//! frozen past its session timeout while another instance takes over).
//! After every kill the changelogs (read `read_committed`) equal a model of
//! exactly the input below the committed offsets, both stores agree, and
//! the output topic holds each committed input's effect exactly once. The
//! same loop under at-least-once loses no output (duplicates counted).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use kstate::{Error, Output, ProcessingGuarantee};
use rand::{Rng, SeedableRng};

const PARTITIONS: i32 = 3;
const KEYS: usize = 31;

/// The counting application: store `counts` and store `mirror` both hold
/// the number of inputs seen per key; each input sends
/// `<partition>:<offset>:<count>` to the output topic under its key.
fn count_builder(app: &str, input: &str, state: &Path, guarantee: ProcessingGuarantee) -> kstate::AppBuilder {
    builder(app, input, state)
        .store(common::store("counts"))
        .store(common::store("mirror"))
        .processing_guarantee(guarantee)
        .commit_interval(Duration::from_millis(50))
        .kafka_config("session.timeout.ms", "6000")
        .kafka_config("heartbeat.interval.ms", "500")
        // Outputs linger until a commit flushes them.
        .kafka_config("linger.ms", "200")
}

fn count(out_topic: String) -> impl FnMut(&mut kstate::ProcessorContext<'_>, &kstate::Record<'_>) -> Result<(), Error> + Send + 'static {
    move |ctx, rec| {
        // Slow enough that the kills land mid-stream (commits do not
        // stop processing).
        std::thread::sleep(Duration::from_millis(1));
        let key = rec.key.unwrap();
        let n = ctx.store("counts")?.get(key)?.map_or(0, |v| String::from_utf8(v).unwrap().parse::<u64>().unwrap()) + 1;
        ctx.store("counts")?.put(key, n.to_string().as_bytes())?;
        ctx.store("mirror")?.put(key, n.to_string().as_bytes())?;
        let value = format!("{}:{}:{n}", rec.partition, rec.offset);
        ctx.send(Output::to(&out_topic).key(key).value(value.as_bytes()))
    }
}

/// The child instance: settings `app \t input \t output \t state \t
/// guarantee \t name \t transaction timeout (s)` (a static member named
/// `name`: a restarted instance takes its place at once); runs until
/// killed or its stdin closes.
#[test]
#[ignore = "child process of the exactly-once tests"]
fn exactly_once_child() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    let [app, input, out, state, guarantee, name, txn_timeout]: [&str; 7] =
        settings.split('\t').collect::<Vec<_>>().try_into().unwrap();
    init_tracing();
    // `eos+standby`: exactly-once with one standby replica; `+threads`:
    // two processing threads (a processor per task).
    let standbys = usize::from(guarantee.ends_with("+standby"));
    let threads = if guarantee.ends_with("+threads") { 2 } else { 1 };
    let guarantee = if guarantee.starts_with("eos") { ProcessingGuarantee::ExactlyOnce } else { ProcessingGuarantee::AtLeastOnce };
    let app = count_builder(app, input, Path::new(state), guarantee)
        .num_standby_replicas(standbys)
        .num_stream_threads(threads)
        .kafka_config("group.instance.id", format!("{app}-{name}"))
        .transaction_timeout(Duration::from_secs(txn_timeout.parse().unwrap()))
        .build()
        .unwrap();
    stop_when_stdin_closes(app.shutdown_handle());
    if threads > 1 {
        app.run_processor(|_| PerTask(count(out.to_string()))).unwrap();
    } else {
        app.run(count(out.to_string())).unwrap();
    }
}

/// The counting closure as a processor of one task.
struct PerTask<F>(F);

impl<F> kstate::Processor for PerTask<F>
where
    F: FnMut(&mut kstate::ProcessorContext<'_>, &kstate::Record<'_>) -> Result<(), Error> + Send,
{
    fn process(&mut self, ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), kstate::ProcessorError> {
        (self.0)(ctx, rec).map_err(Into::into)
    }
}

/// Every output record, read `read_committed`: (key, partition, offset, count).
fn outputs(topic: &str) -> Vec<(Vec<u8>, i32, i64, u64)> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        // read_partition reads read_committed (librdkafka's default).
        for (_, k, v) in read_partition(topic, p) {
            let v = String::from_utf8(v.unwrap()).unwrap();
            let [ip, io, n]: [&str; 3] = v.split(':').collect::<Vec<_>>().try_into().unwrap();
            out.push((k, ip.parse().unwrap(), io.parse().unwrap(), n.parse().unwrap()));
        }
    }
    out
}

/// A state entry's key in the models below: `<partition>/<key>` (each
/// store partition counts the keys of its own input partition).
fn scoped(p: i32, key: &[u8]) -> Vec<u8> {
    [format!("{p}/").as_bytes(), key].concat()
}

/// A store's changelog, read `read_committed` partition by partition.
fn changelog(app: &str, store: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let topic = kstate::changelog_topic(app, store);
    let mut state = BTreeMap::new();
    for p in 0..PARTITIONS {
        for (_, k, v) in read_partition(&topic, p) {
            apply(&mut state, &scoped(p, &k), v.as_deref());
        }
    }
    state
}

/// The inputs below `committed` per partition, in offset order per partition.
fn committed_inputs(records: &[KeyedRecord], committed: &[i64]) -> Vec<(i32, i64, Vec<u8>)> {
    let mut next = vec![0i64; PARTITIONS as usize];
    let mut out = Vec::new();
    for r in records {
        let o = next[r.0 as usize];
        next[r.0 as usize] += 1;
        if o < committed[r.0 as usize] {
            out.push((r.0, o, r.1.clone()));
        }
    }
    out
}

/// Per input (partition, offset): the count it produced.
type Effects = BTreeMap<(i32, i64), u64>;

/// Counts per (partition, key) over `inputs`, and the count each input produced.
fn model(inputs: &[(i32, i64, Vec<u8>)]) -> (BTreeMap<Vec<u8>, Vec<u8>>, Effects) {
    let mut counts: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut effects = BTreeMap::new();
    for (p, o, k) in inputs {
        let n = counts.entry(scoped(*p, k)).or_default();
        *n += 1;
        effects.insert((*p, *o), *n);
    }
    (counts.into_iter().map(|(k, n)| (k, n.to_string().into_bytes())).collect(), effects)
}

fn input_records(total: usize) -> Vec<KeyedRecord> {
    (0..total)
        .map(|i| ((i % PARTITIONS as usize) as i32, format!("k{}", i % KEYS).into_bytes(), Some(format!("v{i}").into_bytes())))
        .collect()
}

fn committed(app: &str, input: &str) -> Vec<i64> {
    (0..PARTITIONS).map(|p| committed_offset(app, input, p).unwrap_or(0)).collect()
}

/// Exactly-once checks at a quiet moment: the changelogs of both stores
/// equal the model of the committed input, and the outputs hold exactly
/// one record per committed input, with the count the model gives it.
fn assert_exact(what: &str, app: &str, input: &str, out_topic: &str, records: &[KeyedRecord]) -> Vec<i64> {
    let committed = committed(app, input);
    let (state, effects) = model(&committed_inputs(records, &committed));
    let counts = changelog(app, "counts");
    let mirror = changelog(app, "mirror");
    assert_same_state(&counts, &mirror, &format!("{what}: the two stores' changelogs (one transaction holds both)"));
    assert_same_state(&counts, &state, &format!("{what}: changelog vs the model of the input below the committed offsets {committed:?}"));
    let mut seen: BTreeMap<(i32, i64), u64> = BTreeMap::new();
    for (_, p, o, n) in outputs(out_topic) {
        if let Some(before) = seen.insert((p, o), n) {
            panic!("{what}: input {p}@{o} has two outputs (counts {before} and {n}): a duplicate under exactly-once");
        }
    }
    for ((p, o), n) in &effects {
        match seen.get(&(*p, *o)) {
            Some(m) => assert_eq!(m, n, "{what}: output of input {p}@{o} says count {m}, the model {n}"),
            None => panic!("{what}: input {p}@{o} is committed but has no output"),
        }
    }
    let beyond: Vec<&(i32, i64)> = seen.keys().filter(|k| !effects.contains_key(k)).collect();
    assert!(beyond.is_empty(), "{what}: outputs of inputs that are not committed are visible: {:?}", &beyond[..beyond.len().min(5)]);
    committed
}

/// A fixture named `name` and a fresh output topic with as many partitions.
fn with_output(name: &str) -> (Fixture, String) {
    let out_topic = unique(&format!("{name}-out"));
    create_topic(&out_topic, PARTITIONS, &[]);
    (fixture(name, PARTITIONS), out_topic)
}

/// A child instance; its transactions time out after 3 s.
fn spawn(name: &str, app: &str, input: &str, out: &str, state: &Path, guarantee: &str, log: &Path) -> ChildInstance {
    spawn_with(name, app, input, out, state, guarantee, log, 3)
}

#[allow(clippy::too_many_arguments)]
fn spawn_with(name: &str, app: &str, input: &str, out: &str, state: &Path, guarantee: &str, log: &Path, txn_timeout_secs: u64) -> ChildInstance {
    ChildInstance::spawn(
        name,
        "exactly_once_child",
        format!("{app}\t{input}\t{out}\t{}\t{guarantee}\t{name}\t{txn_timeout_secs}", state.display()),
        log.to_path_buf(),
    )
}

#[test]
fn under_exactly_once_a_crash_loop_leaves_stores_and_outputs_exact() {
    crash_loop("eos-crash", "eos", 8);
}

/// The same with two processing threads for the three tasks.
#[test]
fn under_exactly_once_with_two_processing_threads_a_crash_loop_leaves_stores_and_outputs_exact() {
    crash_loop("eos-threads", "eos+threads", 5);
}

fn crash_loop(name: &str, mode: &str, rounds: usize) {
    let (Fixture { input, app, state }, out_topic) = with_output(name);
    let records = input_records(9000);
    produce(&input, &records);
    let log = state.path().join("child.log");
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut mid_stream = 0;
    for round in 0..rounds {
        let child = spawn("eos", &app, &input, &out_topic, state.path(), mode, &log);
        std::thread::sleep(Duration::from_millis(rng.random_range(1500..3500)));
        child.kill(); // SIGKILL, mid-commit or mid-processing
        // Its open transaction, if any, is aborted by the brokers after the
        // transaction timeout (3 s) or by the next instance's start; the
        // committed offsets are read stable (they wait for it).
        let committed = assert_exact(&format!("after kill {round}"), &app, &input, &out_topic, &records);
        eprintln!("round {round}: committed {committed:?}");
        if committed.iter().any(|&c| c < (records.len() / PARTITIONS as usize) as i64 - 100) {
            mid_stream += 1;
        }
    }
    assert!(mid_stream >= rounds / 2, "only {mid_stream} of {rounds} kills landed before the input was done");
    let before = std::fs::read_to_string(&log).unwrap_or_default().len();
    let last = spawn("eos", &app, &input, &out_topic, state.path(), mode, &log);
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    // Every task restored and running (the input may have been committed
    // in full before this run), so the local stores are complete.
    wait_until("every task of the last run to run", Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let run = strip_ansi(&String::from_utf8_lossy(&text.as_bytes()[before..]));
        (0..PARTITIONS).all(|p| run.contains(&format!("task running partition={p}")))
    });
    last.stop();
    let committed = assert_exact("at the end", &app, &input, &out_topic, &records);
    assert_eq!(committed.iter().sum::<i64>(), records.len() as i64);
    if let Ok(keep) = std::env::var("KSTATE_KEEP_LOG") {
        std::fs::copy(&log, keep).unwrap();
    }
    // The local stores, restored and committed by the last run, equal the model too.
    let (expected, _) = model(&committed_inputs(&records, &committed));
    for store in ["counts", "mirror"] {
        let mut local = BTreeMap::new();
        for p in 0..PARTITIONS {
            local.extend(read_store_dir(state.path(), &app, store, p).0.into_iter().map(|(k, v)| (scoped(p, &k), v)));
        }
        assert_same_state(&local, &expected, &format!("local store {store} at the end"));
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    eprintln!("restores after kills: {}", text.matches("restore starting").count());
    // Two threads' first outputs of a transaction both begin it: one must
    // wait for the other, or librdkafka refuses it and the commit aborts.
    assert!(!text.contains("no transaction could begin"), "a transaction failed to begin: {}", tail(&strip_ansi(&text)));
}

#[test]
fn under_at_least_once_the_same_loop_loses_no_output() {
    const ROUNDS: usize = 5;
    let (Fixture { input, app, state }, out_topic) = with_output("alo-crash");
    let records = input_records(6000);
    produce(&input, &records);
    let log = state.path().join("child.log");
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    for round in 0..ROUNDS {
        let child = spawn("alo", &app, &input, &out_topic, state.path(), "alo", &log);
        std::thread::sleep(Duration::from_millis(rng.random_range(1500..3500)));
        child.kill();
        let committed = committed(&app, &input);
        let seen: std::collections::BTreeSet<(i32, i64)> = outputs(&out_topic).into_iter().map(|(_, p, o, _)| (p, o)).collect();
        for (p, o, _) in committed_inputs(&records, &committed) {
            assert!(seen.contains(&(p, o)), "round {round}: input {p}@{o} is committed but its output is missing");
        }
    }
    let last = spawn("alo", &app, &input, &out_topic, state.path(), "alo", &log);
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    last.stop();
    let all = outputs(&out_topic);
    let distinct: std::collections::BTreeSet<(i32, i64)> = all.iter().map(|(_, p, o, _)| (*p, *o)).collect();
    assert_eq!(distinct.len(), records.len(), "every input has an output");
    eprintln!("at-least-once: {} outputs for {} inputs: {} duplicates after {ROUNDS} kills", all.len(), records.len(), all.len() - records.len());
}

#[test]
fn under_exactly_once_a_zombie_is_fenced_by_the_group_generation() {
    // a's transactions outlive its freeze: woken, its open transaction
    // would still commit, were it not fenced by the group generation.
    zombie("eos-zombie", 30, Duration::from_secs(1));
}

#[test]
fn under_exactly_once_a_zombie_whose_transaction_timed_out_rejoins() {
    // a stays frozen past its transaction timeout: the brokers abort its
    // transaction and fence its producer epoch; woken, it must replace
    // its producer and go on.
    zombie("eos-zombie-timeout", 3, Duration::from_secs(6));
}

/// SIGSTOPs instance a (transaction timeout `txn_timeout_secs`) past its
/// session timeout, lets b take every task, wakes a `after_takeover`
/// later; then both run on, and the result must be exact.
fn zombie(name: &str, txn_timeout_secs: u64, after_takeover: Duration) {
    let (Fixture { input, app, state }, out_topic) = with_output(name);
    let (dir_a, dir_b) = (state.path().join("a"), state.path().join("b"));
    let (log_a, log_b) = (state.path().join("a.log"), state.path().join("b.log"));
    let feeder = Feeder::start(&bootstrap(), &input, PARTITIONS, KEYS, 400, 12_000);
    let mut a = spawn_with("a", &app, &input, &out_topic, &dir_a, "eos", &log_a, txn_timeout_secs);
    wait_until("a to process", Duration::from_secs(60), || committed(&app, &input).iter().any(|&c| c > 0));
    let mut b = spawn("b", &app, &input, &out_topic, &dir_b, "eos", &log_b);
    wait_until("b to get tasks", Duration::from_secs(60), || b.text().contains("task running"));
    std::thread::sleep(Duration::from_secs(2));
    a.signal("-STOP");
    let frozen = Instant::now();
    // Past a's session timeout (6 s): b takes all tasks.
    wait_until("b to run every task", Duration::from_secs(60), || {
        b.text().lines().rfind(|l| l.contains("applying the group's assignment")).is_some_and(|l| l.contains("active={0, 1, 2}"))
    });
    eprintln!("b owns every task {:?} after a froze", frozen.elapsed());
    std::thread::sleep(after_takeover);
    a.signal("-CONT");
    let woke = frozen.elapsed();
    let timed_out = woke > Duration::from_secs(txn_timeout_secs + 2);
    assert_eq!(timed_out, txn_timeout_secs < 10, "a woke {woke:?} after it froze, transaction timeout {txn_timeout_secs} s");
    // a rejoins and gets tasks again.
    wait_until("a to run a task again", Duration::from_secs(60), || a.text()[a.text().find("kstate started").unwrap_or(0)..].matches("task running").count() > 3);
    std::thread::sleep(Duration::from_secs(3));
    a.assert_running();
    b.assert_running();
    let fed = feeder.join(false);
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    a.stop();
    b.stop();
    if let Ok(keep) = std::env::var("KSTATE_KEEP_LOG") {
        std::fs::copy(&log_a, format!("{keep}.a")).unwrap();
        std::fs::copy(&log_b, format!("{keep}.b")).unwrap();
    }
    let committed = assert_exact("after the zombie", &app, &input, &out_topic, &fed);
    assert_eq!(committed.iter().sum::<i64>(), fed.len() as i64);
    let text_a = strip_ansi(&a_text(&log_a));
    assert!(
        text_a.contains("transaction aborted") || text_a.contains("was fenced") || text_a.contains("closing without commit") || text_a.contains("tasks lost"),
        "the zombie logs how it found out; its log ends with:\n{}",
        tail(&text_a)
    );
    let found_out: Vec<&str> = text_a.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).take(6).collect();
    eprintln!("a found out:\n{}", found_out.join("\n"));
}

fn a_text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[test]
fn under_exactly_once_instances_joining_and_leaving_abort_no_transaction() {
    let (Fixture { input, app, state }, out_topic) = with_output("eos-rebalance");
    let names = ["a", "b", "c"];
    let logs: Vec<std::path::PathBuf> = names.iter().map(|n| state.path().join(format!("{n}.log"))).collect();
    let feeder = Feeder::start(&bootstrap(), &input, PARTITIONS, KEYS, 400, 8_000);
    let start = |i: usize| spawn(names[i], &app, &input, &out_topic, &state.path().join(names[i]), "eos", &logs[i]);
    let running_here = |c: &ChildInstance| c.text().matches("task running").count();
    let a = start(0);
    wait_until("a to process", Duration::from_secs(60), || committed(&app, &input).iter().any(|&c| c > 0));
    let b = start(1);
    wait_until("b to run a task", Duration::from_secs(60), || running_here(&b) > 0);
    std::thread::sleep(Duration::from_secs(2));
    let c = start(2);
    wait_until("c to run a task", Duration::from_secs(60), || running_here(&c) > 0);
    std::thread::sleep(Duration::from_secs(2));
    b.stop(); // leaves the group: its tasks move to a and c
    std::thread::sleep(Duration::from_secs(3));
    let fed = feeder.join(false);
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    a.stop();
    c.stop();
    assert_exact("after joins and a leave", &app, &input, &out_topic, &fed);
    for (name, log) in names.iter().zip(&logs) {
        let text = strip_ansi(&std::fs::read_to_string(log).unwrap_or_default());
        let aborted: Vec<&str> = text.lines().filter(|l| l.contains("transaction aborted")).collect();
        assert!(aborted.is_empty(), "instance {name} aborted a transaction at a rebalance:\n{}", aborted.join("\n"));
        eprintln!("{name}: {} commits completed under a new generation", text.matches("completes under the new generation").count());
    }
}

#[test]
fn under_exactly_once_a_standby_takes_over_a_crashed_instance_with_a_short_restore() {
    let (Fixture { input, app, state }, out_topic) = with_output("eos-standby");
    let (log_a, log_b) = (state.path().join("a.log"), state.path().join("b.log"));
    let feeder = Feeder::start(&bootstrap(), &input, PARTITIONS, KEYS, 400, 8_000);
    let a = spawn("a", &app, &input, &out_topic, &state.path().join("a"), "eos+standby", &log_a);
    wait_until("a to process", Duration::from_secs(60), || committed(&app, &input).iter().any(|&c| c > 0));
    let b = spawn("b", &app, &input, &out_topic, &state.path().join("b"), "eos+standby", &log_b);
    // b runs some tasks and follows the others as standbys.
    wait_until("b to follow a standby", Duration::from_secs(60), || b.text().contains("standby task opened"));
    std::thread::sleep(Duration::from_secs(4));
    let before = b.text().len();
    a.kill(); // its open transaction stays until the brokers abort it (3 s)
    wait_until("b to run every task", Duration::from_secs(60), || {
        b.text().lines().rfind(|l| l.contains("applying the group's assignment")).is_some_and(|l| l.contains("active={0, 1, 2}"))
    });
    wait_until("b's promoted tasks to run", Duration::from_secs(60), || b.text()[before..].matches("task running").count() >= 1);
    let fed = feeder.join(false);
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    b.stop();
    assert_exact("after the failover", &app, &input, &out_topic, &fed);
    let text = strip_ansi(&std::fs::read_to_string(&log_b).unwrap_or_default());
    let after = &text[text.find("standby promoted to active").expect("b promoted a standby")..];
    // A promoted standby restores only its lag: what a wrote in the last
    // moments, up to its last committed transaction.
    for line in after.lines().filter(|l| l.contains("restore finished")) {
        let records: u64 = line.split("records=").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|r| r.parse().ok()).unwrap_or(0);
        assert!(records < 1000, "a promoted standby replayed {records} records: {line}");
    }
    eprintln!("{}", after.lines().filter(|l| l.contains("restore finished") || l.contains("stable")).collect::<Vec<_>>().join("\n"));
}
