//! Remote stores (`StoreDefinition::remote`) against the real broker and
//! the MinIO server of testing/ (`KSTATE_S3_ENDPOINT`):
//!
//! * a store opens on an instance with an empty state dir and replays only
//!   the changelog past the checkpoint its database holds (nothing after a
//!   clean stop; after a SIGKILL, the tail since its last flush), a store
//!   of a million keys included;
//! * a zombie (SIGSTOP past its session, SIGCONT) lands nothing, and the
//!   state equals a model of the input;
//! * bad settings and an unreachable or refusing object store are typed
//!   errors before anything runs.
//!
//! The store behaviour tests of the other binaries run on remote stores too
//! with `KSTATE_TEST_STORES=remote` (testing/test.sh).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use kstate::{Error, RemoteFailure, RemoteStateConfig, StoreDefinition};

const PARTITIONS: i32 = 2;

fn input(from: usize, n: usize) -> Vec<KeyedRecord> {
    (from..from + n)
        .map(|i| {
            let p = (i % PARTITIONS as usize) as i32;
            let key = format!("p{p}-k{}", (i * 7919) % 1500).into_bytes();
            // One in ten a delete.
            let value = (i % 10 != 3).then(|| format!("v{i}").into_bytes());
            (p, key, value)
        })
        .collect()
}

fn remote_builder(f: &Fixture, state: &std::path::Path) -> kstate::AppBuilder {
    builder(&f.app, &f.input, state)
        .store(StoreDefinition::new("s").remote())
        .remote_state(remote_state())
        .commit_interval(Duration::from_millis(50))
}

fn put_or_delete(ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), kstate::Error> {
    let s = ctx.store("s")?;
    match rec.value {
        Some(v) => s.put(rec.key.unwrap(), v),
        None => s.delete(rec.key.unwrap()),
    }
}

/// The model of `records` for one partition.
fn model(records: &[KeyedRecord], partition: i32) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for (p, k, v) in records.iter().filter(|r| r.0 == partition) {
        let _ = p;
        apply(&mut m, k, v.as_deref());
    }
    m
}

fn read_remote_store(app: &str, store: &str, partition: i32) -> (BTreeMap<Vec<u8>, Vec<u8>>, Option<i64>) {
    read_remote_store_at(&s3_endpoint(), app, store, partition)
}

/// Records in partition `p` of `changelog` (0 before it exists).
fn logged_in(changelog: &str, p: i32) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    consumer.fetch_watermarks(changelog, p, Duration::from_secs(5)).map_or(0, |(_, high)| high)
}

/// Records in every partition of `changelog`.
fn logged(changelog: &str) -> i64 {
    (0..PARTITIONS).map(|p| logged_in(changelog, p)).sum()
}

/// Checks every partition's remote database against the model and the
/// changelog: its checkpoint is the changelog's last offset.
fn assert_remote_equals_model(f: &Fixture, records: &[KeyedRecord]) {
    for p in 0..PARTITIONS {
        let (data, checkpoint) = read_remote_store(&f.app, "s", p);
        assert_same_state(&data, &model(records, p), &format!("remote store partition {p}"));
        let end = end_offset_at(&bootstrap(), &kstate::changelog_topic(&f.app, "s"), p);
        assert_eq!(checkpoint, Some(end - 1), "partition {p}: the checkpoint is the changelog's last record");
    }
}

#[test]
fn a_store_opens_on_an_empty_instance_and_replays_nothing_after_a_clean_stop() {
    let f = fixture("remote-move", PARTITIONS);
    let mut records = input(0, 6000);
    produce(&f.input, &records);
    let first = Running::start(remote_builder(&f, f.state.path()), put_or_delete);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(90));
    first.stop().unwrap();
    assert_remote_equals_model(&f, &records);

    // A new instance with nothing local: its stores open with their
    // checkpoints from object storage and replay nothing.
    let more = input(6000, 1000);
    produce(&f.input, &more);
    records.extend(more);
    let empty = tempfile::tempdir().unwrap();
    let restores = Restores::default();
    let second = Running::start(remote_builder(&f, empty.path()).restore_listener(restores.clone()), put_or_delete);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(90));
    second.stop().unwrap();
    assert_eq!(restores.restored_records(), 0, "a remote store replays nothing after a clean stop: {:?}", restores.starts.lock().unwrap());
    for start in restores.starts.lock().unwrap().iter() {
        assert_eq!(start.full_restore_reason, None, "{start:?}");
    }
    assert_remote_equals_model(&f, &records);
}

/// The child of the SIGKILL and SIGSTOP tests: `KSTATE_CHILD` is
/// `app|input|state_dir`; processes slowly until its stdin closes.
#[test]
#[ignore = "child process of the remote store tests"]
fn remote_child() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    init_tracing();
    let parts: Vec<&str> = settings.split('|').collect();
    let f = Fixture { app: parts[0].into(), input: parts[1].into(), state: tempfile::tempdir().unwrap() };
    let fast = parts[3..].contains(&"fast");
    let standbys = if parts[3..].contains(&"standby") { 1 } else { 0 };
    let app = remote_builder(&f, std::path::Path::new(parts[2])).num_standby_replicas(standbys).build().unwrap();
    stop_when_stdin_closes(app.shutdown_handle());
    app.run(move |ctx, rec| {
        if !fast {
            std::thread::sleep(Duration::from_micros(300));
        }
        put_or_delete(ctx, rec)
    })
    .unwrap();
}

/// Child `a` of `f` in `dir` (see `remote_child`; `fast`: no pause per record).
fn spawn_child(f: &Fixture, dir: &std::path::Path, fast: bool) -> ChildInstance {
    spawn_child_with("a", f, dir, if fast { &["fast"] } else { &[] })
}

/// Child `name` of `f` in `dir`, logging to `<dir>/<name>.log`, with
/// `flags` (`fast`: no pause per record; `standby`: one standby replica).
fn spawn_child_with(name: &str, f: &Fixture, dir: &std::path::Path, flags: &[&str]) -> ChildInstance {
    let settings = [format!("{}|{}|{}", f.app, f.input, dir.display())].into_iter().chain(flags.iter().map(|s| s.to_string())).collect::<Vec<_>>().join("|");
    ChildInstance::spawn(name, "remote_child", settings, dir.join(format!("{name}.log")))
}

/// The `(partition, start, end)` of each "restore starting" line of a
/// child's log (standbys log "standby starting").
fn restores_logged(log: &str) -> Vec<(i32, i64, i64)> {
    let field = |line: &str, name: &str| -> Option<i64> {
        let at = line.find(&format!(" {name}="))? + name.len() + 2;
        line[at..].split(|c: char| !c.is_ascii_digit() && c != '-').next()?.parse().ok()
    };
    log.lines()
        .filter(|l| l.contains("restore starting"))
        .filter_map(|l| Some((field(l, "partition")? as i32, field(l, "start")?, field(l, "end")?)))
        .collect()
}

/// Files under `dir`, recursively (0 if it does not exist).
fn files_under(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().map(|e| if e.path().is_dir() { files_under(&e.path()) } else { 1 }).sum()
}

/// Checks that every partition's restore started at the remote
/// checkpoint (not from the start) and ended at most where the changelog
/// was at the kill; returns (records replayed, records logged at the kill).
#[track_caller]
fn replayed_tail(restores: &Restores, ends_at_kill: &[i64]) -> (i64, i64) {
    let starts = restores.starts.lock().unwrap().clone();
    assert_eq!(starts.len(), PARTITIONS as usize, "{starts:?}");
    for s in &starts {
        // Tail only: it starts at the remote checkpoint, not at the beginning.
        assert!(s.full_restore_reason.is_none() && s.start_offset > 0, "restored from the start: {s:?}");
        assert!(s.end_offset <= ends_at_kill[s.partition as usize], "{s:?}");
    }
    (starts.iter().map(|s| s.end_offset - s.start_offset).sum(), ends_at_kill.iter().sum())
}

/// A store of a million keys (`KEYS`) moves to an instance with an empty
/// state dir after its owner is killed: the new owner replays only the
/// changelog past the checkpoint its databases hold (the tail since the
/// last flush, not the million), processes new input, and the state
/// equals the model.
#[test]
fn a_store_of_a_million_keys_moves_to_an_empty_instance_and_replays_only_the_tail() {
    const KEYS: usize = 1_000_000;
    let f = fixture("remote-million", PARTITIONS);
    let key = |i: usize| format!("k{i:07}").into_bytes();
    let mut records: Vec<KeyedRecord> =
        (0..KEYS).map(|i| ((i % PARTITIONS as usize) as i32, key(i), Some(format!("v{i}").into_bytes()))).collect();
    produce(&f.input, &records);
    let dir = tempfile::tempdir().unwrap();
    let child = spawn_child(&f, dir.path(), true);
    let changelog = kstate::changelog_topic(&f.app, "s");
    wait_until("the first owner to store the million keys", Duration::from_secs(300), || logged(&changelog) >= KEYS as i64);
    // A last burst, killed as soon as it is in the changelog: most of it
    // is past the last flush.
    let burst: Vec<KeyedRecord> =
        (0..2000).map(|i| ((i % PARTITIONS as usize) as i32, key(i * 37 % KEYS), Some(format!("w{i}").into_bytes()))).collect();
    produce(&f.input, &burst);
    records.extend(burst);
    wait_until("the burst to reach the changelog", Duration::from_secs(60), || logged(&changelog) >= records.len() as i64);
    child.kill();
    let ends_at_kill: Vec<i64> = (0..PARTITIONS).map(|p| end_offset_at(&bootstrap(), &changelog, p)).collect();

    let more: Vec<KeyedRecord> = (0..PARTITIONS).map(|p| (p, format!("new-{p}").into_bytes(), Some(b"x".to_vec()))).collect();
    produce(&f.input, &more);
    records.extend(more);
    let empty = tempfile::tempdir().unwrap();
    let restores = Restores::default();
    let started = std::time::Instant::now();
    let first_new: std::sync::Arc<std::sync::Mutex<Option<Duration>>> = Default::default();
    let seen = first_new.clone();
    let second = Running::start(remote_builder(&f, empty.path()).restore_listener(restores.clone()), move |ctx, rec| {
        if rec.key.is_some_and(|k| k.starts_with(b"new-")) {
            seen.lock().unwrap().get_or_insert(started.elapsed());
        }
        put_or_delete(ctx, rec)
    });
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(120));
    second.stop().unwrap();
    let (tail, logged) = replayed_tail(&restores, &ends_at_kill);
    eprintln!(
        "a million keys moved to an empty instance: {tail} of {logged} changelog records replayed, first new record after {:?} \
         (from start, the group's wait for the killed owner's session included)",
        first_new.lock().unwrap()
    );
    // The tail: what the killed owner had not flushed (its memtable and
    // its flush interval bound it), nowhere near the million.
    assert!(tail < logged / 10, "replayed {tail} of {logged} changelog records: more than a tail");
    assert!(first_new.lock().unwrap().is_some(), "the new owner processed no new record");
    assert_remote_equals_model(&f, &records);
}

#[test]
fn after_a_sigkill_an_empty_instance_replays_only_the_tail() {
    let f = fixture("remote-kill", PARTITIONS);
    let records = input(0, 20_000);
    produce(&f.input, &records);
    let dir = tempfile::tempdir().unwrap();
    let child = spawn_child(&f, dir.path(), false);
    // Killed mid-stream, a few flushes in.
    let changelog = kstate::changelog_topic(&f.app, "s");
    wait_until("the child to process part of each partition's input", Duration::from_secs(90), || {
        (0..PARTITIONS).all(|p| logged_in(&changelog, p) > 2000)
    });
    std::thread::sleep(Duration::from_millis(1500));
    child.kill();
    let ends_at_kill: Vec<i64> = (0..PARTITIONS).map(|p| end_offset_at(&bootstrap(), &changelog, p)).collect();

    let empty = tempfile::tempdir().unwrap();
    let restores = Restores::default();
    let second = Running::start(remote_builder(&f, empty.path()).restore_listener(restores.clone()), put_or_delete);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(120));
    second.stop().unwrap();
    let (tail, logged) = replayed_tail(&restores, &ends_at_kill);
    assert!(tail < logged / 2, "replayed {tail} of {logged} changelog records: more than a tail");
    assert_remote_equals_model(&f, &records);
}

/// A standby of remote stores keeps a reader, not a copy: while the owner
/// runs, the standby reads the keys its changelog changes through its
/// caches (counted, and its disk cache fills), fences no one (the owner
/// never sees a fenced write) and writes nothing to object storage. After
/// a SIGKILL of the owner it takes the task over, opens its databases for
/// writing and replays only the tail past their checkpoints; the state
/// equals the model.
#[test]
fn a_standby_warms_its_cache_fences_no_one_and_takes_over_with_the_tail_only() {
    let f = fixture("remote-standby", PARTITIONS);
    let mut records = input(0, 30_000);
    produce(&f.input, &records);
    let dir = tempfile::tempdir().unwrap();
    let a = spawn_child_with("a", &f, dir.path(), &["standby"]);
    let changelog = kstate::changelog_topic(&f.app, "s");
    wait_until("the first instance to process part of each partition's input", Duration::from_secs(90), || {
        (0..PARTITIONS).all(|p| logged_in(&changelog, p) > 1000)
    });
    let b_dir = tempfile::tempdir().unwrap();
    let b = spawn_child_with("b", &f, b_dir.path(), &["standby"]);
    // Each instance owns one partition and is the standby of the other.
    let cache = b_dir.path().join(&f.app).join(".remote-cache").join("s");
    wait_until("the second instance to own a partition and hold table parts of both", Duration::from_secs(90), || {
        restores_logged(&b.text()).len() == 1 && (0..PARTITIONS).all(|p| files_under(&cache.join(p.to_string())) > 0)
    });
    let standby_of_b = 1 - restores_logged(&b.text())[0].0;
    // The owner keeps committing while the standby follows: nothing fenced it.
    let before = logged_in(&changelog, standby_of_b);
    let more = input(30_000, 6000);
    produce(&f.input, &more);
    records.extend(more);
    wait_until("the first instance to go on writing its partition", Duration::from_secs(30), || logged_in(&changelog, standby_of_b) > before + 500);
    a.kill();
    let a_log = strip_ansi(&std::fs::read_to_string(dir.path().join("a.log")).unwrap_or_default());
    let fenced: Vec<&str> = a_log.lines().filter(|l| l.contains("this writer is fenced") || l.contains("opened by another instance")).collect();
    assert!(fenced.is_empty(), "the owner was fenced while the other instance was its standby:\n{}", fenced.join("\n"));
    let ends_at_kill: Vec<i64> = (0..PARTITIONS).map(|p| end_offset_at(&bootstrap(), &changelog, p)).collect();

    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(120));
    let b_log = b.text();
    b.stop();
    // The standby read what its changelog changed, before its promotion.
    let warm: Vec<&str> = b_log.lines().filter(|l| l.contains("reader of a standby closed") && l.contains(&format!("partition={standby_of_b}"))).collect();
    assert_eq!(warm.len(), 1, "{b_log}");
    let reads: u64 = warm[0].split("warm_reads=").nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(reads > 100, "the standby made {reads} reads to warm its caches: {}", warm[0]);
    // Promoted: a restore of the tail past the remote checkpoint only.
    let promoted: Vec<(i32, i64, i64)> = restores_logged(&b_log).into_iter().filter(|r| r.0 == standby_of_b).collect();
    assert_eq!(promoted.len(), 1, "{promoted:?}");
    let (p, start, end) = promoted[0];
    assert!(start > 0 && end <= ends_at_kill[p as usize], "partition {p}: restore {start}..{end}, the changelog ended at {} at the kill", ends_at_kill[p as usize]);
    eprintln!("the promoted standby of remote stores replayed {} of {} changelog records after {reads} warm reads", end - start, ends_at_kill[p as usize]);
    assert!(end - start < ends_at_kill[p as usize] / 2, "replayed {}: more than a tail", end - start);
    assert_remote_equals_model(&f, &records);
}

/// A partition that moved to another instance leaves nothing behind: its
/// local folder and its disk cache are deleted after `state_cleanup_delay`.
#[test]
fn the_disk_cache_of_a_partition_that_moved_away_is_deleted() {
    let f = fixture("remote-cleanup", PARTITIONS);
    let records = input(0, 4000);
    produce(&f.input, &records);
    let with_cleanup = |dir: &std::path::Path| remote_builder(&f, dir).state_cleanup_delay(Duration::from_secs(2));
    let a = Running::start(with_cleanup(f.state.path()), put_or_delete);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(90));
    let cache = f.state.path().join(&f.app).join(".remote-cache").join("s");
    assert!((0..PARTITIONS).all(|p| files_under(&cache.join(p.to_string())) > 0), "the first instance cached both partitions");
    // A second instance takes one partition: the first's cache of it goes.
    let b_dir = tempfile::tempdir().unwrap();
    let b = Running::start(with_cleanup(b_dir.path()), put_or_delete);
    wait_until("one partition's disk cache to be deleted on the first instance", Duration::from_secs(60), || {
        (0..PARTITIONS).filter(|p| cache.join(p.to_string()).exists()).count() == 1
    });
    let kept = (0..PARTITIONS).find(|p| cache.join(p.to_string()).exists()).unwrap();
    assert!(f.state.path().join(&f.app).join("s").join(kept.to_string()).exists(), "the partition still held keeps its folder");
    produce(&f.input, &input(4000, 1000));
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(90));
    b.stop().unwrap();
    a.stop().unwrap();
}

#[test]
fn bad_remote_settings_are_typed_errors() {
    let f = fixture("remote-config", 1);
    let build = |b: kstate::AppBuilder| b.build().map(|_| ()).unwrap_err();
    // (Not `common::builder`: under KSTATE_TEST_STORES=remote it sets a remote state.)
    let base = || kstate::App::builder().application_id(&f.app).bootstrap_servers(bootstrap()).input_topic(&f.input).state_dir(f.state.path());
    let cases: Vec<(&str, Error, &str)> = vec![
        ("remote store without remote_state", build(base().store(StoreDefinition::new("s").remote())), "no AppBuilder::remote_state"),
        (
            "mixed stores",
            build(base().store(StoreDefinition::new("s").remote()).store(StoreDefinition::new("t")).remote_state(remote_state())),
            "all remote or none",
        ),
        (
            "a tiny memtable",
            build(base().store(StoreDefinition::new("s").remote()).remote_state(remote_state().memtable_bytes(1000))),
            "memtable_bytes",
        ),
        (
            "a scheme without its feature",
            build(base().store(StoreDefinition::new("s").remote()).remote_state(RemoteStateConfig::new("ftp://x/y"))),
            "unsupported scheme",
        ),
        (
            "an unknown option",
            build(base().store(StoreDefinition::new("s").remote()).remote_state(remote_state().option("aws_no_such_key", "1"))),
            "aws_no_such_key",
        ),
        (
            "a tiny flush interval",
            build(base().store(StoreDefinition::new("s").remote()).remote_state(remote_state().flush_interval(Duration::from_millis(1)))),
            "flush_interval",
        ),
    ];
    for (what, err, needle) in cases {
        match err {
            Error::Config(msg) => assert!(msg.contains(needle), "{what}: {msg}"),
            other => panic!("{what}: expected Error::Config, got {other:?}"),
        }
    }
}

#[test]
fn wrong_credentials_or_an_unreachable_server_fail_run_at_start() {
    let f = fixture("remote-denied", 1);
    produce(&f.input, &input(0, 10));
    let denied = remote_state().option("aws_secret_access_key", "not-the-secret");
    // A port nobody listens on.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = format!("http://{}", nobody.local_addr().unwrap());
    drop(nobody);
    let unreachable = remote_state_at(&gone).timeout(Duration::from_secs(3));
    for (what, config) in [("wrong credentials", denied), ("no server", unreachable)] {
        let app = builder(&f.app, &f.input, f.state.path()).store(StoreDefinition::new("s").remote()).remote_state(config).build().unwrap();
        let started = std::time::Instant::now();
        let err = app.run(put_or_delete).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(60), "{what}: took {:?}", started.elapsed());
        match err {
            Error::RemoteStore { kind, partition: -1, .. } => {
                assert!(matches!(kind, RemoteFailure::Refused | RemoteFailure::Unavailable), "{what}: {kind:?}")
            }
            other => panic!("{what}: expected Error::RemoteStore at start, got {other:?}"),
        }
    }
}

#[test]
fn a_frozen_owner_is_fenced_and_nothing_of_it_lands() {
    let f = fixture("remote-zombie", PARTITIONS);
    let mut records = input(0, 4000);
    produce(&f.input, &records);
    let dir = tempfile::tempdir().unwrap();
    let mut zombie = spawn_child(&f, dir.path(), false);
    let changelog = kstate::changelog_topic(&f.app, "s");
    wait_until("the first owner to process some input", Duration::from_secs(90), || {
        zombie.assert_running();
        logged(&changelog) > 500
    });
    zombie.signal("-STOP");

    // The group gives its tasks to a new instance after its session
    // (6 s): that instance opens the databases, fencing the frozen one.
    let empty = tempfile::tempdir().unwrap();
    let second = Running::start(remote_builder(&f, empty.path()), put_or_delete);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(120));
    let more = input(4000, 2000);
    produce(&f.input, &more);
    records.extend(more);

    // Thawed: it processes what it had fetched, but nothing of it lands;
    // it learns it is out and rejoins.
    zombie.signal("-CONT");
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(120));
    let more = input(6000, 1000);
    produce(&f.input, &more);
    records.extend(more);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(120));
    zombie.stop();
    second.stop().unwrap();
    assert_remote_equals_model(&f, &records);
    assert_same_state(&changelog_state_at(&bootstrap(), &f.app, "s", PARTITIONS), &records.iter().fold(BTreeMap::new(), |mut m, (_, k, v)| {
        apply(&mut m, k, v.as_deref());
        m
    }), "the changelog");
}

#[test]
fn object_storage_away_for_20_s_pauses_processing_and_loses_nothing() {
    let minio = OwnMinio::start();
    let f = fixture("remote-outage", PARTITIONS);
    let mut records = input(0, 3000);
    produce(&f.input, &records);
    let config = remote_state_at(&minio.endpoint()).timeout(Duration::from_secs(120));
    let build = |state: &std::path::Path| {
        builder(&f.app, &f.input, state).store(StoreDefinition::new("s").remote()).remote_state(config.clone()).commit_interval(Duration::from_millis(50))
    };
    let app = Running::start(build(f.state.path()), put_or_delete);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(90));

    minio.script("kill");
    let more = input(3000, 3000);
    produce(&f.input, &more);
    records.extend(more);
    std::thread::sleep(Duration::from_secs(20));
    assert!(!app.is_finished(), "an outage shorter than the timeout stops nothing");
    minio.script("restart");
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(120));
    app.stop().unwrap();
    for p in 0..PARTITIONS {
        let (data, checkpoint) = read_remote_store_at(&minio.endpoint(), &f.app, "s", p);
        assert_same_state(&data, &model(&records, p), &format!("remote store partition {p} after the outage"));
        let end = end_offset_at(&bootstrap(), &kstate::changelog_topic(&f.app, "s"), p);
        assert_eq!(checkpoint, Some(end - 1), "partition {p}");
    }
}

#[path = "support/keeping.rs"]
mod keeping;

mod recorded {
    use std::collections::HashMap;
    use std::sync::atomic::Ordering;

    use metrics::Key;
    use metrics_util::registry::{AtomicStorage, Registry};

    pub use super::keeping::Keeping;

    /// `name{label=value,...}` → value of every counter; histograms by
    /// name → samples recorded.
    pub fn snapshot(registry: &Registry<Key, AtomicStorage>) -> HashMap<String, f64> {
        let name = |key: &Key| {
            let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            format!("{}{{{}}}", key.name(), labels.join(","))
        };
        let mut seen = HashMap::new();
        registry.visit_counters(|key, c| {
            seen.insert(name(key), c.load(Ordering::Relaxed) as f64);
        });
        registry.visit_histograms(|key, h| {
            let mut n = 0;
            h.data_with(|d| n += d.len());
            *seen.entry(key.name().to_string()).or_insert(0.0) += n as f64;
        });
        seen
    }
}

#[test]
fn remote_stores_count_requests_bytes_cache_hits_and_open_time() {
    let registry = std::sync::Arc::new(metrics_util::registry::Registry::atomic());
    metrics::set_global_recorder(recorded::Keeping(registry.clone())).expect("the only recorder of this test binary");
    let f = fixture("remote-metrics", PARTITIONS);
    let records = input(0, 4000);
    produce(&f.input, &records);
    // Reads and writes every record; the second instance reads what the
    // first wrote from object storage, through the cache.
    let read_and_write = |ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>| {
        let s = ctx.store("s")?;
        let _ = s.get(rec.key.unwrap())?;
        put_or_delete(ctx, rec)
    };
    let app = Running::start(remote_builder(&f, f.state.path()), read_and_write);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(90));
    app.stop().unwrap();
    produce(&f.input, &input(4000, 2000));
    let empty = tempfile::tempdir().unwrap();
    let app = Running::start(remote_builder(&f, empty.path()), read_and_write);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, PARTITIONS, Duration::from_secs(90));
    app.stop().unwrap();
    let seen = recorded::snapshot(&registry);
    let get = |name: &str| seen.get(name).copied().unwrap_or(0.0);
    assert!(get("kstate_remote_requests_total{kind=PUT}") >= 2.0, "{seen:?}");
    assert!(get("kstate_remote_requests_total{kind=GET}") >= 1.0, "{seen:?}");
    assert!(get("kstate_remote_requests_total{kind=LIST}") >= 1.0, "{seen:?}");
    assert!(get("kstate_remote_bytes_total{direction=up}") > 4000.0, "{seen:?}");
    assert!(get("kstate_remote_bytes_total{direction=down}") > 0.0, "{seen:?}");
    assert!(get("kstate_remote_open_seconds") >= PARTITIONS as f64, "one open time per store partition: {seen:?}");
    assert!(get("kstate_remote_cache_hits_total{}") + get("kstate_remote_cache_misses_total{}") > 0.0, "{seen:?}");
}
