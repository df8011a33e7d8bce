//! Crash test: a child process applies a seeded stream of puts and deletes
//! and is killed with SIGKILL at random points, many times. After every kill:
//!
//! * the store equals the changelog replayed up to its checkpoint (local
//!   state is a prefix of the changelog, never ahead of it). Commits skip
//!   RocksDB's WAL, so after a kill the store is at its last flushed commit,
//!   possibly behind the committed input offset;
//! * what a restart restores (the store plus the rest of the changelog)
//!   holds, for every key, a value the key had at some input offset at or
//!   past the committed one: nothing acknowledged is lost, nothing invented.
//!   Checked per key because at-least-once allows more: a commit cut short
//!   by the kill leaves its first keys (in key order) in the changelog, and
//!   a restart replays them before it reprocesses their input, as Kafka
//!   Streams' record cache does under at-least-once.
//!
//! At the end a clean run finishes the input and the store must equal the
//! model of the whole input exactly.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;
type Input = Vec<KeyedRecord>;
/// A changelog record as read back: `(offset, key, value)`.
type Logged = (i64, Vec<u8>, Option<Vec<u8>>);

const PARTITIONS: i32 = 3;
const PER_PARTITION: usize = 4000;
const ROUNDS: usize = 10;

fn seeded_input(seed: u64) -> Input {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for i in 0..PER_PARTITION {
        for p in 0..PARTITIONS {
            let key = format!("p{p}-k{}", rng.random_range(0..300)).into_bytes();
            let value = if rng.random_bool(0.1) { None } else { Some(format!("{i}:{}", rng.random::<u64>()).into_bytes()) };
            out.push((p, key, value));
        }
    }
    out
}

fn builder_for(app: &str, input: &str, state: &Path) -> kstate::AppBuilder {
    builder(app, input, state)
        .store(common::store("s"))
        .commit_interval(Duration::from_millis(30))
        // Static membership: a restarted child takes over the killed one's
        // partitions at once instead of waiting for its session to expire.
        .kafka_config("group.instance.id", format!("{app}-member"))
}

fn processor(ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), kstate::Error> {
    if rec.offset % 3 != 0 {
        // ~8 s for the whole input: the kills land mid-stream in most rounds
        // (checked below) rather than after everything was processed.
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = ctx.store("s")?;
    match rec.value {
        Some(v) => s.put(rec.key.unwrap(), v),
        None => s.delete(rec.key.unwrap()),
    }
}

/// The child: runs until killed.
#[test]
#[ignore = "child process of crash_kill_restart_loop_never_loses_or_invents_state"]
fn crash_child() {
    let (Ok(app), Ok(input), Ok(state)) =
        (std::env::var("KSTATE_CRASH_APP"), std::env::var("KSTATE_CRASH_INPUT"), std::env::var("KSTATE_CRASH_STATE"))
    else {
        return;
    };
    init_tracing();
    let app = builder_for(&app, &input, Path::new(&state)).build().unwrap();
    app.run(processor).unwrap();
}

fn check_invariants(round: usize, app: &str, input_topic: &str, state: &Path, input: &Input) {
    for p in 0..PARTITIONS {
        if !store_db_path(state, app, "s", p).exists() {
            continue;
        }
        let (data, checkpoint) = read_store_dir_after_kill(state, app, "s", p);
        let changelog = read_partition(&kstate::changelog_topic(app, "s"), p);
        // Prefix of the changelog.
        let mut replayed = Model::new();
        for (off, k, v) in &changelog {
            if Some(*off) <= checkpoint {
                apply(&mut replayed, k, v.as_deref());
            }
        }
        assert_same_state(&data, &replayed, &format!("round {round} p{p}: store vs changelog prefix to {checkpoint:?}"));
        // What a restart restores covers the committed input.
        let mut tail = 0;
        for (off, k, v) in &changelog {
            if Some(*off) > checkpoint {
                apply(&mut replayed, k, v.as_deref());
                tail += 1;
            }
        }
        if tail > 0 {
            eprintln!("round {round} p{p}: the store is {tail} changelog records behind its end");
        }
        let committed = committed_offset(app, input_topic, p).unwrap_or(0) as usize;
        let records: Vec<_> = input.iter().filter(|r| r.0 == p).collect();
        if let Err(e) = check_nothing_acknowledged_lost(&replayed, &records, committed, &changelog) {
            panic!("round {round} p{p}: store + changelog tail vs input committed to {committed}: {e}");
        }
    }
}

/// Every key of `restored` (and every key the input touched) holds a value
/// it had at some input offset at or past `committed`: present with that
/// value, or absent because it was absent at `committed` or because a later
/// delete of it reached the changelog (a tombstone after the record of its
/// value at `committed`; values are unique, so that record is findable).
fn check_nothing_acknowledged_lost(
    restored: &Model,
    records: &[&KeyedRecord],
    committed: usize,
    changelog: &[Logged],
) -> Result<(), String> {
    let mut at_committed = Model::new();
    for (_, k, v) in &records[..committed] {
        apply(&mut at_committed, k, v.as_deref());
    }
    let mut held: BTreeMap<&[u8], Vec<Option<&[u8]>>> =
        at_committed.iter().map(|(k, v)| (k.as_slice(), vec![Some(v.as_slice())])).collect();
    for (_, k, v) in &records[committed..] {
        held.entry(k.as_slice()).or_insert_with(|| vec![None]).push(v.as_deref());
    }
    for k in restored.keys().map(Vec::as_slice).chain(held.keys().copied()) {
        let now = restored.get(k).map(Vec::as_slice);
        let allowed = held.get(k).map_or(&[None][..], Vec::as_slice);
        if !allowed.contains(&now) {
            return Err(format!(
                "key {:?} is {:?}, which it never held at or past the committed offset (held: {:?})",
                String::from_utf8_lossy(k),
                show(now),
                allowed.iter().map(|v| show(*v)).collect::<Vec<_>>()
            ));
        }
        if let (None, Some(before)) = (now, at_committed.get(k)) {
            // Deleted after the committed offset: the delete must have been
            // written to the changelog after the value it replaced.
            let value_at = changelog.iter().rposition(|(_, ck, cv)| ck.as_slice() == k && cv.as_ref() == Some(before));
            let deleted_after = value_at
                .is_some_and(|i| changelog[i + 1..].iter().any(|(_, ck, cv)| ck.as_slice() == k && cv.is_none()));
            if !deleted_after {
                return Err(format!(
                    "key {:?} is gone, but no tombstone follows its value {:?} at the committed offset in the changelog",
                    String::from_utf8_lossy(k),
                    show(Some(before))
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn crash_kill_restart_loop_never_loses_or_invents_state() {
    let Fixture { input: input_topic, app, state } = fixture("crash", PARTITIONS);
    let input = seeded_input(2024);
    produce(&input_topic, &input);

    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let log = state.path().join("child.log");
    let mut mid_stream = 0;
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--ignored", "--nocapture"])
            .env("KSTATE_CRASH_APP", &app)
            .env("KSTATE_CRASH_INPUT", &input_topic)
            .env("KSTATE_CRASH_STATE", state.path())
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(200..2500)));
        assert!(child.try_wait().unwrap().is_none(), "child exited on its own; see {}", log.display());
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        check_invariants(round, &app, &input_topic, state.path(), &input);
        let committed: Vec<_> = (0..PARTITIONS).map(|p| committed_offset(&app, &input_topic, p)).collect();
        eprintln!("round {round}: committed input offsets after the kill: {committed:?}");
        if committed.iter().any(|c| c.unwrap_or(0) < PER_PARTITION as i64) {
            mid_stream += 1;
        }
    }
    assert!(mid_stream >= ROUNDS / 2, "only {mid_stream} of {ROUNDS} kills landed before the input was done");
    let progressed: i64 = (0..PARTITIONS).map(|p| committed_offset(&app, &input_topic, p).unwrap_or(0)).sum();
    assert!(progressed > 0, "the children never committed anything");

    // A clean run finishes the input: the store must equal the full model.
    let running = Running::start(builder_for(&app, &input_topic, state.path()), processor);
    for p in 0..PARTITIONS {
        wait_until("all input committed", Duration::from_secs(120), || {
            committed_offset(&app, &input_topic, p) == Some(PER_PARTITION as i64)
        });
    }
    running.stop().unwrap();
    for p in 0..PARTITIONS {
        let mut model = Model::new();
        for (_, k, v) in input.iter().filter(|r| r.0 == p) {
            apply(&mut model, k, v.as_deref());
        }
        let (data, _) = read_store_dir(state.path(), &app, "s", p);
        assert_same_state(&data, &model, &format!("p{p}: final store vs model of the whole input"));
    }
    check_invariants(ROUNDS, &app, &input_topic, state.path(), &input);
}

fn show(v: Option<&[u8]>) -> Option<String> {
    v.map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The check above is only worth something if it fails: on a write lost
/// before the committed offset, on a value never written, on a resurrected
/// delete, on a key gone without its tombstone in the changelog; and passes
/// a key-ordered cut-short commit and a delete that reached the changelog.
#[test]
fn the_loss_check_fails_on_lost_invented_and_resurrected_values() {
    let r = |k: &str, v: Option<&str>| (0, k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()));
    let input = [r("a", Some("1")), r("b", Some("1")), r("a", Some("2")), r("b", None), r("a", Some("3")), r("c", Some("1")), r("a", None)];
    let records: Vec<_> = input.iter().collect();
    let state = |pairs: &[(&str, &str)]| -> Model { pairs.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect() };
    let log = |entries: &[(&str, Option<&str>)]| -> Vec<Logged> {
        entries.iter().enumerate().map(|(i, (k, v))| (i as i64, k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))).collect()
    };
    // Committed up to offset 4 (a=2, b deleted); the changelog holds those commits.
    let to_commit = log(&[("a", Some("1")), ("b", Some("1")), ("a", Some("2")), ("b", None)]);
    let check = |s: &Model, l: &[Logged]| check_nothing_acknowledged_lost(s, &records, 4, l);
    assert!(check(&state(&[("a", "2")]), &to_commit).is_ok());
    assert!(check(&state(&[("a", "3")]), &to_commit).is_ok(), "a later value is fine");
    assert!(check(&state(&[("a", "3"), ("c", "1")]), &to_commit).is_ok());
    assert!(check(&state(&[("a", "2"), ("c", "1")]), &to_commit).is_ok(), "cut-short commit: c before a");
    assert!(check(&state(&[("a", "1")]), &to_commit).is_err(), "lost a=2");
    assert!(check(&state(&[]), &to_commit).is_err(), "lost a: its later delete never reached the changelog");
    let deleted = log(&[("a", Some("1")), ("b", Some("1")), ("a", Some("2")), ("b", None), ("a", None)]);
    assert!(check(&state(&[]), &deleted).is_ok(), "a deleted later, tombstone in the changelog");
    assert!(check(&state(&[("a", "2"), ("b", "1")]), &to_commit).is_err(), "resurrected b");
    assert!(check(&state(&[("a", "9")]), &to_commit).is_err(), "invented a=9");
    assert!(check(&state(&[("a", "2"), ("z", "1")]), &to_commit).is_err(), "invented key z");
}
