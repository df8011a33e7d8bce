//! Snapshots in object storage against a real broker and a real
//! S3-compatible server (MinIO from `testing/minio.sh`, which
//! `testing/test.sh` starts; `KSTATE_S3_ENDPOINT`, default
//! http://127.0.0.1:9000) and the local directory backend: a new instance
//! seeded from a snapshot replays only the changelog past it, a corrupt or
//! missing file falls back to the previous snapshot or a full replay,
//! retention deletes only what no kept snapshot names, and a server that
//! dies mid-upload stops nobody.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::*;
use kstate::admin::{list_snapshots, SnapshotStore};
use kstate::{RemoteSnapshot, SnapshotConfig};

const STORE: &str = "s";
const WAIT: Duration = Duration::from_secs(90);

/// Whether a test of RocksDB's own snapshot files (incremental SST uploads,
/// several files per snapshot) does not apply: with in-memory stores a
/// snapshot is one file, uploaded whole every time.
fn rocksdb_only(what: &str) -> bool {
    let skip = common::stores_in_memory();
    if skip {
        eprintln!("skipped with in-memory stores: {what}");
    }
    skip
}

/// A snapshot file holding store data: a RocksDB SST file or an in-memory store's file.
fn data_file(name: &str) -> bool {
    name.ends_with(".sst") || name == "heap.kstate"
}

fn local_dir(dir: &Path) -> (SnapshotConfig, SnapshotStore) {
    let url = format!("file://{}", dir.display());
    (SnapshotConfig::new(&url).interval(Duration::from_secs(3600)), SnapshotStore { url, options: vec![] })
}

/// Each record `k -> v` writes `k -> v` and `k/v -> v` (common::record_writes).
fn app_builder(f: &Fixture, state: &Path, snapshots: SnapshotConfig, restores: &Restores) -> kstate::AppBuilder {
    builder(&f.app, &f.input, state).store(common::store(STORE)).snapshots(snapshots).restore_listener(restores.clone())
}

fn start(f: &Fixture, state: &Path, snapshots: SnapshotConfig, restores: &Restores) -> (Running, kstate::SnapshotHandle) {
    let app = app_builder(f, state, snapshots, restores).build().expect("valid config");
    let handle = app.snapshot_handle();
    let running = Running::start_app(app, |ctx, record| {
        let (Some(k), Some(v)) = (record.key, record.value) else { return Ok(()) };
        let store = ctx.store(STORE)?;
        for (key, value) in record_writes(k, v) {
            store.put(&key, &value)?;
        }
        Ok(())
    });
    (running, handle)
}

fn records(from: usize, n: usize, partitions: i32) -> Vec<KeyedRecord> {
    (from..from + n).map(|i| ((i % partitions as usize) as i32, format!("k{}", i % 300).into_bytes(), Some(format!("v{i}").into_bytes()))).collect()
}

/// The newest snapshot of each partition, once every partition has one
/// whose checkpoint is at least `min_checkpoint[p]`.
fn snapshots_at_least(at: &SnapshotStore, app: &str, min_checkpoint: &BTreeMap<i32, i64>) -> BTreeMap<i32, RemoteSnapshot> {
    let mut found = BTreeMap::new();
    wait_until("snapshots of every partition", WAIT, || {
        found = list_snapshots(at, app, Some(STORE))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| Some((p.partition, p.snapshots.into_iter().max_by_key(|s| s.checkpoint)?)))
            .collect();
        min_checkpoint.iter().all(|(p, c)| found.get(p).is_some_and(|s| s.checkpoint >= *c))
    });
    found
}

/// The changelog's last offset of each partition (its end minus one).
fn changelog_last(app: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let topic = kstate::changelog_topic(app, STORE);
    (0..partitions).map(|p| (p, end_offset_at(&bootstrap(), &topic, p) - 1)).collect()
}

fn stored_state(state: &Path, app: &str, partitions: i32) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut all = BTreeMap::new();
    for p in 0..partitions {
        all.extend(read_store_dir(state, app, STORE, p).0);
    }
    all
}

/// Runs an instance on a fresh state dir until every partition restored,
/// stops it, and returns its restore events and state.
fn fresh_instance(f: &Fixture, snapshots: SnapshotConfig, partitions: i32) -> (Restores, BTreeMap<Vec<u8>, Vec<u8>>) {
    let state = tempfile::tempdir().unwrap();
    let restores = Restores::default();
    let (running, _) = start(f, state.path(), snapshots, &restores);
    wait_until("every partition restored", WAIT, || restores.ended() >= partitions as usize);
    running.stop().unwrap();
    (restores.clone(), stored_state(state.path(), &f.app, partitions))
}

#[test]
fn a_new_instance_is_seeded_from_an_s3_snapshot_and_replays_only_the_tail() {
    let f = fixture("snap-seed", 2);
    let (config, at) = s3_at(&s3_endpoint(), &unique("seed"));
    let mut input = records(0, 3000, 2);
    produce(&f.input, &input);
    let restores = Restores::default();
    let (running, handle) = start(&f, f.state.path(), config.clone(), &restores);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 2, WAIT);
    let before = changelog_last(&f.app, 2);
    handle.snapshot_now();
    let snaps = snapshots_at_least(&at, &f.app, &before);
    // 1% more after the snapshot: the tail.
    let tail = records(3000, 30, 2);
    produce(&f.input, &tail);
    input.extend(tail);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 2, WAIT);
    running.stop().unwrap();
    let last = changelog_last(&f.app, 2);

    let (restores, state) = fresh_instance(&f, config, 2);
    let starts = restores.starts.lock().unwrap().clone();
    let ends = restores.ends.lock().unwrap().clone();
    for p in 0..2 {
        let start = starts.iter().find(|s| s.partition == p).expect("a restore start");
        let seed = start.snapshot.as_ref().unwrap_or_else(|| panic!("partition {p} not seeded: {:?}", start.snapshots_skipped));
        assert_eq!(seed.snapshot_id, snaps[&p].id, "partition {p}: the newest snapshot");
        assert_eq!(start.start_offset, snaps[&p].checkpoint + 1, "partition {p}: replay starts past the snapshot");
        let replayed: u64 = ends.iter().filter(|e| e.partition == p).map(|e| e.records).sum();
        assert_eq!(replayed as i64, last[&p] - snaps[&p].checkpoint, "partition {p}: only the tail is replayed");
        assert!(replayed > 0 && replayed < 100, "partition {p}: a tail of {replayed} records");
    }
    assert_same_state(&state, &model_of(&input), "the seeded instance's stores");
}

#[test]
fn a_corrupt_or_missing_snapshot_file_falls_back_to_the_previous_snapshot_then_to_a_full_replay() {
    let f = fixture("snap-corrupt", 1);
    let dir = tempfile::tempdir().unwrap();
    let (config, at) = local_dir(dir.path());
    let mut input = records(0, 1000, 1);
    produce(&f.input, &input);
    let restores = Restores::default();
    let (running, handle) = start(&f, f.state.path(), config.clone(), &restores);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    handle.snapshot_now();
    let older = snapshots_at_least(&at, &f.app, &changelog_last(&f.app, 1))[&0].clone();
    let more = records(1000, 500, 1);
    produce(&f.input, &more);
    input.extend(more);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    handle.snapshot_now();
    let newer = snapshots_at_least(&at, &f.app, &changelog_last(&f.app, 1))[&0].clone();
    running.stop().unwrap();
    assert!(newer.checkpoint > older.checkpoint);

    // A file only the newer snapshot has, corrupted with its size kept.
    let older_objects: BTreeSet<_> = older.files.iter().map(|f| f.object.clone()).collect();
    let only_newer = newer.files.iter().find(|f| data_file(&f.name) && !older_objects.contains(&f.object)).expect("a new data file");
    let path = dir.path().join(&f.app).join(STORE).join("0").join(&only_newer.object);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();

    let (restores, state) = fresh_instance(&f, config.clone(), 1);
    let start = restores.starts.lock().unwrap()[0].clone();
    assert_eq!(start.snapshot.as_ref().map(|s| s.snapshot_id.clone()), Some(older.id.clone()), "fell back to the older snapshot: {start:?}");
    assert!(start.snapshots_skipped.iter().any(|why| why.contains(&newer.id) && why.contains("CRC")), "{:?}", start.snapshots_skipped);
    assert_eq!(start.start_offset, older.checkpoint + 1);
    assert_same_state(&state, &model_of(&input), "seeded from the older snapshot");

    // A file of the older one gone too: a full replay.
    let any = &older.files.iter().find(|f| data_file(&f.name)).expect("a data file").object;
    std::fs::remove_file(dir.path().join(&f.app).join(STORE).join("0").join(any)).unwrap();
    let (restores, state) = fresh_instance(&f, config, 1);
    let start = restores.starts.lock().unwrap()[0].clone();
    assert!(start.snapshot.is_none(), "{start:?}");
    assert_eq!(start.snapshots_skipped.len(), 2, "{:?}", start.snapshots_skipped);
    assert_eq!(start.start_offset, 0, "a full replay");
    assert_same_state(&state, &model_of(&input), "restored in full");
}

#[test]
fn retention_keeps_the_newest_snapshots_and_every_file_they_name() {
    if rocksdb_only("snapshots sharing SST files") {
        return;
    }
    let f = fixture("snap-gc", 1);
    let dir = tempfile::tempdir().unwrap();
    let (config, at) = local_dir(dir.path());
    let config = config.retain(2);
    let restores = Restores::default();
    let (running, handle) = start(&f, f.state.path(), config.clone(), &restores);
    let mut input = Vec::new();
    let mut ids = Vec::new();
    for round in 0..4 {
        let batch = records(round * 400, 400, 1);
        produce(&f.input, &batch);
        input.extend(batch);
        wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
        handle.snapshot_now();
        ids.push(snapshots_at_least(&at, &f.app, &changelog_last(&f.app, 1))[&0].id.clone());
    }
    running.stop().unwrap();
    let kept = list_snapshots(&at, &f.app, Some(STORE)).unwrap();
    let kept: Vec<RemoteSnapshot> = kept.into_iter().flat_map(|p| p.snapshots).collect();
    assert_eq!(kept.iter().map(|s| s.id.clone()).collect::<Vec<_>>(), ids[2..].to_vec(), "the two newest are kept");
    let files_dir = dir.path().join(&f.app).join(STORE).join("0").join("files");
    let on_disk: BTreeSet<String> =
        std::fs::read_dir(&files_dir).unwrap().map(|e| format!("files/{}", e.unwrap().file_name().to_string_lossy())).collect();
    let named: BTreeSet<String> = kept.iter().flat_map(|s| s.files.iter().map(|f| f.object.clone())).collect();
    assert_eq!(on_disk, named, "exactly the files the kept snapshots name");
    // Incremental: the newest reuses SST files of the one before.
    let reused = kept[1].files.iter().filter(|f| kept[0].files.iter().any(|g| g.object == f.object)).count();
    assert!(reused > 0, "the newest snapshot reuses files: {kept:?}");
    let (_, state) = fresh_instance(&f, config, 1);
    assert_same_state(&state, &model_of(&input), "seeded after collection");
}

#[test]
fn the_s3_server_dying_mid_upload_or_mid_download_stops_nobody_and_falls_back() {
    if rocksdb_only("paced uploads of several SST files") {
        return;
    }
    let f = fixture("snap-fault", 1);
    let minio = OwnMinio::start();
    let (config, at) = s3_at(&minio.endpoint(), &unique("fault"));
    // One file at a time, paced after each request: the first SST file is
    // uploaded at once, the next request waits ~8 s, and the server dies
    // in between (an upload cut in the middle: files there, no manifest).
    let slow = config.clone().parallel_transfers(1).max_bytes_per_second(64 << 10);
    // Incompressible values: about 500 KB of SST files.
    let big: Vec<KeyedRecord> = (0..1200).map(|i| (0, format!("k{i}").into_bytes(), Some((0..200).map(|_| rand::random::<u8>()).collect()))).collect();
    produce(&f.input, &big);
    let mut input = big;
    let restores = Restores::default();
    let (running, handle) = start(&f, f.state.path(), slow.clone(), &restores);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    let triggered = std::time::Instant::now();
    handle.snapshot_now();
    std::thread::sleep(Duration::from_millis(1500));
    minio.script("kill");
    // Processing goes on while the snapshot store is gone.
    let more = records(0, 200, 1);
    produce(&f.input, &more);
    input.extend(more);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    assert!(!running.is_finished(), "the application stopped");
    assert!(list_snapshots(&at, &f.app, Some(STORE)).is_err(), "the server is down");
    // Past the paced wait: the upload's next request failed.
    std::thread::sleep(Duration::from_secs(12).saturating_sub(triggered.elapsed()));
    minio.script("restart");
    let listed = list_snapshots(&at, &f.app, Some(STORE)).unwrap();
    assert!(listed.iter().all(|p| p.snapshots.is_empty()), "the cut upload wrote no manifest: {listed:?}");
    handle.snapshot_now();
    let snap = snapshots_at_least(&at, &f.app, &changelog_last(&f.app, 1))[&0].clone();
    running.stop().unwrap();

    // A new instance seeds from it.
    let (restores, state) = fresh_instance(&f, config.clone(), 1);
    let start0 = restores.starts.lock().unwrap()[0].clone();
    assert_eq!(start0.snapshot.as_ref().map(|s| s.snapshot_id.clone()), Some(snap.id.clone()), "{start0:?}");
    assert_same_state(&state, &model_of(&input), "seeded from the snapshot taken after the outage");

    // The server dies while another new instance downloads (one file at a
    // time, the next request ~12 s after the large SST file): it restores
    // in full instead, and nobody stops.
    let state = tempfile::tempdir().unwrap();
    let restores = Restores::default();
    let (running, _) = start(&f, state.path(), slow, &restores);
    std::thread::sleep(Duration::from_secs(2));
    minio.script("kill");
    wait_until("the restore", WAIT, || restores.ended() >= 1);
    running.stop().unwrap();
    let start1 = restores.starts.lock().unwrap()[0].clone();
    assert!(start1.snapshot.is_none(), "{start1:?}");
    assert!(start1.snapshots_skipped.iter().any(|why| why.contains(&snap.id)), "{:?}", start1.snapshots_skipped);
    assert_eq!(start1.start_offset, 0, "a full replay");
    assert_same_state(&stored_state(state.path(), &f.app, 1), &model_of(&input), "restored in full after the failed download");
}

#[test]
fn bad_snapshot_settings_are_config_errors_at_build() {
    let state = tempfile::tempdir().unwrap();
    let build = |c: SnapshotConfig| {
        builder("snap-config", "in", state.path()).store(common::store(STORE)).snapshots(c).build().err().map(|e| e.to_string())
    };
    let dir = format!("file://{}", state.path().join("snaps").display());
    let cases = [
        (SnapshotConfig::new("ftp://host/x"), "unsupported scheme"),
        (SnapshotConfig::new("not a url"), "snapshot URL"),
        (SnapshotConfig::new("file://relative/dir"), "snapshot"),
        (SnapshotConfig::new("s3://bucket/x").option("aws_no_such_key", "1"), "aws_no_such_key"),
        (SnapshotConfig::new(&dir).interval(Duration::from_millis(500)), "below 1 s"),
        (SnapshotConfig::new(&dir).retain(0), "retain"),
        (SnapshotConfig::new(&dir).parallel_transfers(0), "parallel_transfers"),
        (SnapshotConfig::new(&dir).max_bytes_per_second(0), "max_bytes_per_second"),
    ];
    for (config, needle) in cases {
        let what = format!("{config:?}");
        let err = build(config).unwrap_or_else(|| panic!("{what}: built"));
        assert!(err.contains("configuration") || err.contains("config"), "{what}: {err}");
        assert!(err.contains(needle), "{what}: `{needle}` not in: {err}");
    }
    assert_eq!(build(SnapshotConfig::new(&dir)), None);
}

/// The SST objects of a snapshot and their bytes.
fn sst_objects(s: &RemoteSnapshot) -> BTreeMap<String, u64> {
    s.files.iter().filter(|f| f.name.ends_with(".sst")).map(|f| (f.object.clone(), f.size)).collect()
}

#[test]
fn snapshots_stay_incremental_across_a_restart_and_after_seeding() {
    if rocksdb_only("incremental SST uploads") {
        return;
    }
    let f = fixture("snap-incr", 1);
    let dir = tempfile::tempdir().unwrap();
    let (config, at) = local_dir(dir.path());
    let mut input = records(0, 3000, 1);
    produce(&f.input, &input);
    let snapshot = |state: &Path, restores: &Restores| {
        let (running, handle) = start(&f, state, config.clone(), restores);
        wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
        handle.snapshot_now();
        let s = snapshots_at_least(&at, &f.app, &changelog_last(&f.app, 1))[&0].clone();
        running.stop().unwrap();
        s
    };
    let first = snapshot(f.state.path(), &Restores::default());
    let more = records(3000, 30, 1);
    produce(&f.input, &more);
    input.extend(more);
    // The same state dir after a restart: only the new SST files go up.
    let second = snapshot(f.state.path(), &Restores::default());
    let (a, b) = (sst_objects(&first), sst_objects(&second));
    let new_bytes: u64 = b.iter().filter(|(o, _)| !a.contains_key(*o)).map(|(_, n)| n).sum();
    assert!(b.keys().any(|o| a.contains_key(o)), "the restarted instance reuses uploaded files: {a:?} / {b:?}");
    assert!(new_bytes * 4 < b.values().sum::<u64>(), "uploaded {new_bytes} of {} bytes after a restart", b.values().sum::<u64>());
    // A new instance seeded from it: its first snapshot reuses the seed's files.
    let more = records(3030, 30, 1);
    produce(&f.input, &more);
    input.extend(more);
    let state = tempfile::tempdir().unwrap();
    let restores = Restores::default();
    let third = snapshot(state.path(), &restores);
    assert_eq!(restores.starts.lock().unwrap()[0].snapshot.as_ref().map(|s| s.snapshot_id.clone()), Some(second.id.clone()));
    let c = sst_objects(&third);
    let new_bytes: u64 = c.iter().filter(|(o, _)| !b.contains_key(*o)).map(|(_, n)| n).sum();
    assert!(new_bytes * 4 < c.values().sum::<u64>(), "uploaded {new_bytes} of {} bytes after seeding", c.values().sum::<u64>());
    assert_same_state(&stored_state(state.path(), &f.app, 1), &model_of(&input), "the seeded instance");
}

// ---------------------------------------------------------------------------
// A SIGKILL loop with snapshots running, half the restarts on a lost disk.

const CRASH_PARTITIONS: i32 = 2;
const CRASH_PER_PARTITION: usize = 3000;

fn crash_input() -> Vec<KeyedRecord> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut out = Vec::new();
    for i in 0..CRASH_PER_PARTITION {
        for p in 0..CRASH_PARTITIONS {
            let key = format!("p{p}-k{}", rng.random_range(0..400)).into_bytes();
            let value = if rng.random_bool(0.1) { None } else { Some(format!("{i}:{}", rng.random::<u64>()).into_bytes()) };
            out.push((p, key, value));
        }
    }
    out
}

fn crash_builder(app: &str, input: &str, state: &Path, url: &str) -> kstate::AppBuilder {
    builder(app, input, state)
        .store(common::store(STORE))
        .commit_interval(Duration::from_millis(30))
        .snapshots(SnapshotConfig::new(url).interval(Duration::from_secs(1)).retain(2))
        .kafka_config("group.instance.id", format!("{app}-member"))
}

fn crash_processor(ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), kstate::Error> {
    if rec.offset % 2 == 0 {
        // About 6 s for the whole input: most kills land mid-stream.
        std::thread::sleep(Duration::from_millis(2));
    }
    let s = ctx.store(STORE)?;
    match rec.value {
        Some(v) => s.put(rec.key.unwrap(), v),
        None => s.delete(rec.key.unwrap()),
    }
}

#[test]
#[ignore = "child process of a_kill_loop_with_snapshots_and_lost_disks_restores_exactly_the_changelog"]
fn snapshot_crash_child() {
    let (Ok(app), Ok(input), Ok(state), Ok(url)) = (
        std::env::var("KSTATE_SNAP_APP"),
        std::env::var("KSTATE_SNAP_INPUT"),
        std::env::var("KSTATE_SNAP_STATE"),
        std::env::var("KSTATE_SNAP_URL"),
    ) else {
        return;
    };
    init_tracing();
    crash_builder(&app, &input, Path::new(&state), &url).build().unwrap().run(crash_processor).unwrap();
}

/// The changelog replayed up to `checkpoint` (inclusive).
fn changelog_prefix(app: &str, p: i32, checkpoint: Option<i64>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for (off, k, v) in read_partition(&kstate::changelog_topic(app, STORE), p) {
        if Some(off) <= checkpoint {
            apply(&mut m, &k, v.as_deref());
        }
    }
    m
}

/// Every kept snapshot names only files that exist, and holds exactly the
/// changelog up to its checkpoint. Returns how many were checked.
fn check_kept_snapshots(dir: &Path, at: &SnapshotStore, app: &str, what: &str) -> usize {
    let mut checked = 0;
    for p in list_snapshots(at, app, Some(STORE)).unwrap() {
        assert!(p.unreadable.is_empty(), "{what}: {:?}", p.unreadable);
        for s in &p.snapshots {
            let scratch = tempfile::tempdir().unwrap();
            let db = store_db_path(scratch.path(), app, STORE, p.partition);
            std::fs::create_dir_all(&db).unwrap();
            for f in &s.files {
                let from = dir.join(app).join(STORE).join(p.partition.to_string()).join(&f.object);
                let bytes = std::fs::read(&from).unwrap_or_else(|e| panic!("{what}: snapshot {} names {} which is gone: {e}", s.id, f.object));
                assert_eq!(bytes.len() as u64, f.size, "{what}: {}", f.object);
                std::fs::write(db.join(&f.name), bytes).unwrap();
            }
            let (data, checkpoint) = read_store_dir(scratch.path(), app, STORE, p.partition);
            assert_eq!(checkpoint, Some(s.checkpoint), "{what}: snapshot {}", s.id);
            assert_same_state(&data, &changelog_prefix(app, p.partition, checkpoint), &format!("{what}: snapshot {} of p{}", s.id, p.partition));
            checked += 1;
        }
    }
    checked
}

#[test]
fn a_kill_loop_with_snapshots_and_lost_disks_restores_exactly_the_changelog() {
    use rand::{Rng, SeedableRng};
    let f = fixture("snap-crash", CRASH_PARTITIONS);
    let dir = tempfile::tempdir().unwrap();
    let (_, at) = local_dir(dir.path());
    let url = at.url.clone();
    let input = crash_input();
    produce(&f.input, &input);
    // Longer in soak runs: KSTATE_SNAPSHOT_CRASH_ROUNDS=50.
    let rounds: usize = std::env::var("KSTATE_SNAPSHOT_CRASH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(6);
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let log = dir.path().join("child.log");
    let state_root = tempfile::tempdir().unwrap();
    let mut state = state_root.path().join("0");
    let mut checked = 0;
    for round in 0..rounds {
        if round % 2 == 1 {
            // The disk is lost: the next child starts on an empty state dir.
            state = state_root.path().join(round.to_string());
        }
        let mut child = std::process::Command::new(&exe)
            .args(["snapshot_crash_child", "--exact", "--ignored", "--nocapture"])
            .env("KSTATE_SNAP_APP", &f.app)
            .env("KSTATE_SNAP_INPUT", &f.input)
            .env("KSTATE_SNAP_STATE", &state)
            .env("KSTATE_SNAP_URL", &url)
            // The test writer of the child's logs prints to stdout.
            .stdout(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(1500..3500)));
        assert!(child.try_wait().unwrap().is_none(), "the child exited on its own; see {}", log.display());
        child.kill().unwrap();
        child.wait().unwrap();
        // Local state is a prefix of the changelog, seeded or not.
        for p in 0..CRASH_PARTITIONS {
            if store_db_path(&state, &f.app, STORE, p).exists() {
                let (data, checkpoint) = read_store_dir(&state, &f.app, STORE, p);
                assert_same_state(&data, &changelog_prefix(&f.app, p, checkpoint), &format!("round {round} p{p}: local state"));
            }
        }
        checked += check_kept_snapshots(dir.path(), &at, &f.app, &format!("round {round}"));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let seeded = text.matches("store seeded from a snapshot").count();
    let about_snapshots: Vec<&str> = text.lines().filter(|l| l.contains("snapshot")).collect();
    assert!(seeded >= 1, "no restart was seeded from a snapshot; the children's log about snapshots:\n{}", about_snapshots.join("\n"));
    assert!(checked >= rounds, "only {checked} snapshots checked in {rounds} rounds");
    eprintln!("{rounds} rounds: {seeded} stores seeded from snapshots, {checked} kept snapshots checked against the changelog");

    // A clean run on a lost disk finishes the input: the stores equal the model.
    let state = state_root.path().join("final");
    let restores = Restores::default();
    let running = Running::start(crash_builder(&f.app, &f.input, &state, &url).restore_listener(restores.clone()), crash_processor);
    // (The children may have committed all the input already: wait for the
    // restores too.)
    wait_until("the final run restored", WAIT, || restores.ended() >= CRASH_PARTITIONS as usize);
    for p in 0..CRASH_PARTITIONS {
        wait_until("all input committed", Duration::from_secs(120), || {
            committed_offset(&f.app, &f.input, p) == Some(CRASH_PER_PARTITION as i64)
        });
    }
    running.stop().unwrap();
    let starts = restores.starts.lock().unwrap().clone();
    assert!(starts.iter().any(|s| s.snapshot.is_some()), "the final run was not seeded: {starts:?}");
    for p in 0..CRASH_PARTITIONS {
        let mut model = BTreeMap::new();
        for (_, k, v) in input.iter().filter(|r| r.0 == p) {
            apply(&mut model, k, v.as_deref());
        }
        assert_same_state(&read_store_dir(&state, &f.app, STORE, p).0, &model, &format!("p{p}: final store vs model"));
    }
    check_kept_snapshots(dir.path(), &at, &f.app, "at the end");
}

#[test]
fn a_snapshot_of_a_changelog_since_recreated_is_passed_over_even_when_refilled_past_it() {
    let f = fixture("snap-recreated", 1);
    let dir = tempfile::tempdir().unwrap();
    let (config, at) = local_dir(dir.path());
    produce(&f.input, &records(0, 1000, 1));
    let restores = Restores::default();
    let (running, handle) = start(&f, f.state.path(), config.clone(), &restores);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    handle.snapshot_now();
    let snap = snapshots_at_least(&at, &f.app, &changelog_last(&f.app, 1))[&0].clone();
    running.stop().unwrap();

    // The changelog deleted and recreated, then refilled past the snapshot's checkpoint.
    let changelog = kstate::changelog_topic(&f.app, STORE);
    delete_topic(&changelog);
    create_topic(&changelog, 1, &[("cleanup.policy", "compact")]);
    let refill: Vec<KeyedRecord> = (0..(snap.checkpoint as usize + 500)).map(|i| (0, format!("r{}", i % 700).into_bytes(), Some(format!("n{i}").into_bytes()))).collect();
    produce(&changelog, &refill);

    let (restores, state) = fresh_instance(&f, config, 1);
    let start = restores.starts.lock().unwrap()[0].clone();
    assert!(start.snapshot.is_none(), "{start:?}");
    assert!(start.snapshots_skipped.iter().any(|why| why.contains(&snap.id) && why.contains("recreated")), "{:?}", start.snapshots_skipped);
    assert_eq!(start.start_offset, 0, "a full replay of the new changelog");
    let mut model = BTreeMap::new();
    for (_, k, v) in &refill {
        apply(&mut model, k, v.as_deref());
    }
    assert_same_state(&state, &model, "the recreated changelog, not the snapshot");
}

#[test]
fn a_new_instance_seeds_its_standbys_from_snapshots_too() {
    let f = fixture("snap-standby", 2);
    let dir = tempfile::tempdir().unwrap();
    let (config, at) = local_dir(dir.path());
    produce(&f.input, &records(0, 2000, 2));
    let with_standbys = |state: &Path, restores: &Restores| {
        let app = app_builder(&f, state, config.clone(), restores).num_standby_replicas(1).build().unwrap();
        let handle = app.snapshot_handle();
        let running = Running::start_app(app, |ctx, record| {
            let (Some(k), Some(v)) = (record.key, record.value) else { return Ok(()) };
            for (key, value) in record_writes(k, v) {
                ctx.store(STORE)?.put(&key, &value)?;
            }
            Ok(())
        });
        (running, handle)
    };
    let (a, handle) = with_standbys(f.state.path(), &Restores::default());
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 2, WAIT);
    handle.snapshot_now();
    let snaps = snapshots_at_least(&at, &f.app, &changelog_last(&f.app, 2));
    // A second instance with no local state: one partition active, the other a standby.
    let b_state = tempfile::tempdir().unwrap();
    let (b, _) = with_standbys(b_state.path(), &Restores::default());
    // (A standby is never snapshotted, so only seeding gives it a database
    // id; the instance holds both partitions, at least one as a standby.)
    let seeded = |p: i32| store_db_path(b_state.path(), &f.app, STORE, p).join("kstate-snapshot-id").exists();
    wait_until("both of the new instance's copies seeded", WAIT, || seeded(0) && seeded(1));
    b.stop().unwrap();
    a.stop().unwrap();
    // Each copy (the standby may lag) is a prefix of its changelog at or past the snapshot.
    for p in 0..2 {
        let (data, checkpoint) = read_store_dir(b_state.path(), &f.app, STORE, p);
        assert!(checkpoint >= Some(snaps[&p].checkpoint), "p{p}: {checkpoint:?} before the snapshot's {}", snaps[&p].checkpoint);
        assert_same_state(&data, &changelog_prefix(&f.app, p, checkpoint), &format!("p{p} on the new instance"));
    }
}

#[test]
fn local_state_the_changelog_cannot_continue_is_replaced_by_a_snapshot() {
    let f = fixture("snap-replace", 1);
    let dir = tempfile::tempdir().unwrap();
    let (config, at) = local_dir(dir.path());
    // Instance A stops with local state at c1.
    let mut input = records(0, 500, 1);
    produce(&f.input, &input);
    let (a, _) = start(&f, f.state.path(), config.clone(), &Restores::default());
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    a.stop().unwrap();
    let c1 = changelog_last(&f.app, 1)[&0];
    // Instance B goes on and snapshots at c2.
    let b_state = tempfile::tempdir().unwrap();
    let (b, handle) = start(&f, b_state.path(), config.clone(), &Restores::default());
    let more = records(500, 500, 1);
    produce(&f.input, &more);
    input.extend(more);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    handle.snapshot_now();
    let snap = snapshots_at_least(&at, &f.app, &changelog_last(&f.app, 1))[&0].clone();
    b.stop().unwrap();
    // Records past A's checkpoint deleted from the changelog (an operator's
    // DeleteRecords): A's state cannot be brought up to date by replaying it.
    let changelog = kstate::changelog_topic(&f.app, STORE);
    delete_compacted_records_before(&changelog, 0, c1 + 11);

    // A again, on its own state: replaced by B's snapshot, only the tail replayed.
    let restores = Restores::default();
    let (a, _) = start(&f, f.state.path(), config, &restores);
    wait_until("A restored", WAIT, || restores.ended() >= 1);
    a.stop().unwrap();
    let start = restores.starts.lock().unwrap()[0].clone();
    assert_eq!(start.snapshot.as_ref().map(|s| s.snapshot_id.clone()), Some(snap.id.clone()), "{start:?}");
    assert_eq!(start.full_restore_reason, None, "{start:?}");
    assert_eq!(start.start_offset, snap.checkpoint + 1);
    assert_same_state(&stored_state(f.state.path(), &f.app, 1), &model_of(&input), "A's store after the replacement");
}

#[test]
fn a_savepoint_restore_rewrites_every_key_when_the_changelog_cannot_continue_its_snapshot() {
    let f = fixture("savepoint-full", 1);
    let dir = tempfile::tempdir().unwrap();
    let (config, at) = local_dir(dir.path());
    let mut input = records(0, 500, 1);
    produce(&f.input, &input);
    let (app, _) = start(&f, f.state.path(), config.clone(), &Restores::default());
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    let sp = kstate::admin::create_savepoint(&at, &f.app, "sp", WAIT).expect("savepoint taken");
    assert_eq!(sp.tasks[0].input[&f.input], 500);
    let more = records(500, 500, 1);
    produce(&f.input, &more);
    input.extend(more);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    app.stop().unwrap();
    // Records past the savepoint's checkpoint deleted from the changelog:
    // the keys written since it can no longer all be known.
    let changelog = kstate::changelog_topic(&f.app, STORE);
    delete_compacted_records_before(&changelog, 0, sp.tasks[0].stores[0].checkpoint.unwrap() + 101);

    let r = kstate::admin::restore_savepoint(&at, &f.app, "sp", &kstate::admin::Kafka::new(bootstrap())).expect("restored");
    assert_eq!(r.stores[0].mode, "full", "{r:?}");
    assert_eq!(committed_offset(&f.app, &f.input, 0), Some(500));
    let at_savepoint = model_of(&input[..500]);
    assert_same_state(&changelog_state_at(&bootstrap(), &f.app, STORE, 1), &at_savepoint, "the changelog after the rollback");
    // The application again: its local state cannot continue the changelog
    // either; it restores, then reprocesses from the savepoint's offset.
    let restores = Restores::default();
    let (app, _) = start(&f, f.state.path(), config, &restores);
    wait_until("restored", WAIT, || restores.ended() >= 1);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    app.stop().unwrap();
    assert_same_state(&stored_state(f.state.path(), &f.app, 1), &model_of(&input), "the store after reprocessing");
}

/// MinIO settings with the given credentials, bucket and prefix.
fn s3_with(access: &str, secret: &str, bucket: &str, prefix: &str) -> (SnapshotConfig, SnapshotStore) {
    let url = format!("s3://{bucket}/{prefix}");
    let options: Vec<(String, String)> = [
        ("aws_endpoint", s3_endpoint().as_str()),
        ("aws_allow_http", "true"),
        ("aws_access_key_id", access),
        ("aws_secret_access_key", secret),
        ("aws_region", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut config = SnapshotConfig::new(&url).interval(Duration::from_secs(3600));
    for (k, v) in &options {
        config = config.option(k, v);
    }
    (config, SnapshotStore { url, options })
}

#[test]
fn wrong_credentials_or_a_missing_bucket_are_reported_and_stop_nobody() {
    let f = fixture("snap-denied", 1);
    let input = records(0, 300, 1);
    produce(&f.input, &input);
    let cases = [
        ("wrong credentials", s3_with("kstate", "not-the-secret", &s3_bucket(), &unique("denied"))),
        ("a missing bucket", s3_with("kstate", "kstate-secret", "no-such-bucket-kstate", &unique("denied"))),
    ];
    for (what, (config, at)) in cases {
        // The tools: a typed error, not a panic or an empty list.
        let listed = list_snapshots(&at, &f.app, None);
        assert!(listed.is_err(), "{what}: listing gave {listed:?}");
        eprintln!("{what}: {}", listed.unwrap_err());
        // The application processes, its snapshots fail, nothing stops.
        let state = tempfile::tempdir().unwrap();
        let (running, handle) = start(&f, state.path(), config.clone(), &Restores::default());
        wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
        handle.snapshot_now();
        std::thread::sleep(Duration::from_secs(2));
        assert!(!running.is_finished(), "{what}: the application stopped");
        running.stop().expect("a clean stop");
        assert_same_state(&stored_state(state.path(), &f.app, 1), &model_of(&input), what);
        // A new instance cannot seed: it says why and replays the changelog.
        let (restores, state) = fresh_instance(&f, config, 1);
        let start = restores.starts.lock().unwrap()[0].clone();
        assert!(start.snapshot.is_none() && start.snapshots_skipped.iter().any(|s| s.contains("could not be listed")), "{what}: {start:?}");
        assert_same_state(&state, &model_of(&input), what);
    }
}
