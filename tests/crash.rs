//! Crash test: a child process applies a seeded stream of puts and deletes
//! and is killed with SIGKILL at random points, many times. After every kill:
//!
//! * the store equals the changelog replayed up to its checkpoint (local
//!   state is a prefix of the changelog, never ahead of it);
//! * the store equals the model of the input processed up to some offset at
//!   or past the committed input offset (nothing acknowledged is lost). The
//!   store is checked as RocksDB holds it, at a commit boundary; a commit
//!   cut short by the kill can leave part of its records (the keys sent
//!   first, in key order) in the changelog, which a restart replays before
//!   reprocessing the commit's input, as Kafka Streams' record cache does
//!   under at-least-once.
//!
//! At the end a clean run finishes the input and the store must equal the
//! model of the whole input exactly.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use kstate::StoreDefinition;
use rand::{Rng, SeedableRng};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;
type Input = Vec<KeyedRecord>;

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
        .store(StoreDefinition::new("s"))
        .commit_interval(Duration::from_millis(30))
        // Static membership: a restarted child takes over the killed one's
        // partitions at once instead of waiting for its session to expire.
        .kafka_config("group.instance.id", format!("{app}-member"))
}

fn processor(ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), kstate::Error> {
    if rec.offset % 10 == 0 {
        std::thread::sleep(Duration::from_millis(1)); // spread the work so kills land mid-stream
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
        let (data, checkpoint) = read_store_dir(state, app, "s", p);
        // Prefix of the changelog.
        let mut replayed = Model::new();
        for (off, k, v) in read_partition(&kstate::changelog_topic(app, "s"), p) {
            if Some(off) <= checkpoint {
                apply(&mut replayed, &k, v.as_deref());
            }
        }
        assert_same_state(&data, &replayed, &format!("round {round} p{p}: store vs changelog prefix to {checkpoint:?}"));
        // Reflects the input at least up to the committed offset.
        let committed = committed_offset(app, input_topic, p).unwrap_or(0) as usize;
        let records: Vec<_> = input.iter().filter(|r| r.0 == p).collect();
        let mut model = Model::new();
        for (_, k, v) in &records[..committed] {
            apply(&mut model, k, v.as_deref());
        }
        let mut matched = model == data;
        for (_, k, v) in &records[committed..] {
            if matched {
                break;
            }
            apply(&mut model, k, v.as_deref());
            matched = model == data;
        }
        assert!(matched, "round {round} p{p}: store matches no input prefix at or past committed offset {committed}");
    }
}

#[test]
fn crash_kill_restart_loop_never_loses_or_invents_state() {
    let Fixture { input: input_topic, app, state } = fixture("crash", PARTITIONS);
    let input = seeded_input(2024);
    produce(&input_topic, &input);

    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let log = state.path().join("child.log");
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
    }
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
