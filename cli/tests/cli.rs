//! The `kstate` operator CLI against a real broker and real applications
//! run in-process (the root crate's harness, `tests/common`).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use kstate::StoreDefinition;
use serde_json::Value;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// The tests run one at a time: the restore timing of the estimate test
/// must not compete with the others for the two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs the binary; returns (exit code, stdout, stderr).
fn kstate(args: &[&str]) -> (i32, String, String) {
    let out: Output = std::process::Command::new(env!("CARGO_BIN_EXE_kstate"))
        .args(args)
        .env_remove("KSTATE_STATE_DIR")
        .env_remove("KSTATE_BOOTSTRAP")
        .output()
        .expect("run kstate");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().expect("exit code, not a signal"), text(&out.stdout), text(&out.stderr))
}

/// Runs the binary with `--json`, expects `code`, parses stdout.
#[track_caller]
fn kstate_json(code: i32, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (c, out, err) = kstate(&all);
    assert_eq!(c, code, "kstate {args:?}: stdout {out} stderr {err}");
    assert!(!err.contains("panicked"), "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kstate {args:?} printed no JSON ({e}): {out}"))
}

/// Runs the binary and expects it to fail with `code` and `needle` in its error line.
#[track_caller]
fn kstate_fails(code: i32, needle: &str, args: &[&str]) {
    let (c, out, err) = kstate(args);
    assert_eq!(c, code, "kstate {args:?}: stdout {out} stderr {err}");
    assert!(err.starts_with("error: ") && err.contains(needle), "kstate {args:?}: expected `{needle}` in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Input key/value become a put in every store given, a tombstone a delete.
fn writer(stores: &'static [&'static str]) -> impl FnMut(&mut kstate::ProcessorContext<'_>, &kstate::Record<'_>) -> Result<(), kstate::Error> {
    move |ctx, rec| {
        for s in stores {
            let store = ctx.store(s)?;
            match rec.value {
                Some(v) => store.put(rec.key.unwrap(), v)?,
                None => store.delete(rec.key.unwrap())?,
            }
        }
        Ok(())
    }
}

fn model(records: &[KeyedRecord]) -> Model {
    let mut m = Model::new();
    for (_, k, v) in records {
        apply(&mut m, k, v.as_deref());
    }
    m
}

/// Runs the app until the input is committed up to `end` (partition 0).
fn run_until_committed(app: &str, input: &str, state: &Path, stores: &'static [&'static str], end: i64, restores: &Restores) -> Running {
    let mut b = builder(app, input, state).restore_listener(restores.clone()).commit_interval(Duration::from_millis(200));
    for s in stores {
        b = b.store(StoreDefinition::new(*s));
    }
    let running = Running::start(b, writer(stores));
    wait_until("input committed", Duration::from_secs(120), || {
        committed_offset(app, input, 0) == Some(end) || running.is_finished()
    });
    assert!(!running.is_finished(), "the app ended early");
    running
}

fn records(from: usize, to: usize, keys: usize) -> Vec<KeyedRecord> {
    (from..to)
        .map(|i| {
            let value = if i % 17 == 5 { None } else { Some(format!("v{i}").into_bytes()) };
            (0, format!("k{:04}", i % keys).into_bytes(), value)
        })
        .collect()
}

fn sd(state: &Path) -> String {
    state.display().to_string()
}

#[test]
fn verify_passes_a_good_store_and_reports_an_injected_divergence() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("cli-verify", 1);
    let input_records = records(0, 600, 150);
    produce(&input, &input_records);
    run_until_committed(&app, &input, state.path(), &["s"], 600, &Restores::default()).stop().unwrap();
    let (data, checkpoint) = read_store_dir(state.path(), &app, "s", 0);
    assert_same_state(&data, &model(&input_records), "store after the run");
    let (s, bootstrap) = (sd(state.path()), bootstrap());
    let args = ["--state-dir", &s, "--bootstrap", &bootstrap, "verify", "--app", &app, "--store", "s", "--partition", "0"];

    let r = kstate_json(0, &args);
    assert_eq!(r["checkpoint"], checkpoint.unwrap());
    assert_eq!(r["matching"], data.len() as u64);
    assert_eq!(r["store_keys"], data.len() as u64);
    assert_eq!((r["different_values"].as_u64(), r["only_in_store"].as_u64(), r["only_in_changelog"].as_u64()), (Some(0), Some(0), Some(0)));
    assert_eq!(r["unverifiable"], 0);
    let (code, out, _) = kstate(&args[..]);
    assert_eq!(code, 0);
    assert!(out.contains("OK: the store holds exactly the changelog"), "{out}");

    // The same over the broker's SASL SCRAM listener, its settings given with -X.
    let sasl_env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests with `bash testing/test.sh`"));
    let (sasl_bootstrap, user, password) = (sasl_env("KSTATE_SASL_BOOTSTRAP"), sasl_env("KSTATE_SASL_USER"), sasl_env("KSTATE_SASL_PASSWORD"));
    let sasl = |password: &str| -> Vec<String> {
        [
            "--state-dir", &s, "--bootstrap", &sasl_bootstrap, "--timeout", "5",
            "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=SCRAM-SHA-256",
            "-X", &format!("sasl.username={user}"), "-X", &format!("sasl.password={password}"),
            "verify", "--app", &app, "--store", "s", "--partition", "0",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    let args_sasl = sasl(&password);
    let r = kstate_json(0, &args_sasl.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r["matching"], data.len() as u64);
    let wrong = sasl("not-the-password");
    let (code, _, err) = kstate(&wrong.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 1, "{err}");
    assert!(err.starts_with("error: ") && err.to_lowercase().contains("authentication"), "{err}");

    // A changelog record past the checkpoint (as a new owner would write):
    // its key is unverifiable, not a difference.
    let changelog = kstate::changelog_topic(&app, "s");
    produce(&changelog, &[(0, b"k0001".to_vec(), Some(b"newer".to_vec()))]);
    let r = kstate_json(0, &args);
    assert_eq!(r["unverifiable"], 1);
    assert_eq!(r["matching"], data.len() as u64 - 1);

    // Divergence: one value changed, one key added, one key deleted.
    let mut others = data.keys().filter(|k| k.as_slice() != b"k0001");
    let changed = others.nth(3).unwrap().clone();
    let deleted = others.nth(3).unwrap().clone();
    {
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), store_db_path(state.path(), &app, "s", 0), ["default", "kstate_meta"]).unwrap();
        db.put(&changed, b"tampered").unwrap();
        db.put(b"zz-extra\x01", b"stray").unwrap();
        db.delete(&deleted).unwrap();
        db.flush().unwrap();
    }
    let r = kstate_json(3, &args);
    assert_eq!(r["different_values"], 1);
    assert_eq!(r["only_in_store"], 1);
    assert_eq!(r["only_in_changelog"], 1);
    let diffs: Vec<(String, Value, Value)> = r["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["key"].as_str().unwrap().to_string(), d["store_value"].clone(), d["changelog_value"].clone()))
        .collect();
    let key = |k: &[u8]| String::from_utf8(k.to_vec()).unwrap();
    assert!(diffs.contains(&(key(&changed), "tampered".into(), Value::from(key(&data[&changed])))), "{diffs:?}");
    assert!(diffs.contains(&("zz-extra\\x01".into(), "stray".into(), Value::Null)), "{diffs:?}");
    assert!(diffs.contains(&(key(&deleted), Value::Null, Value::from(key(&data[&deleted])))), "{diffs:?}");
    let (code, out, _) = kstate(&args[..]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("DIFFERENT: 1 keys with different values, 1 only in the store, 1 only in the changelog"), "{out}");
    assert!(out.contains("tampered") && out.contains("zz-extra\\x01"), "{out}");
}

#[test]
fn snapshot_then_wipe_then_import_replays_only_the_changelog_past_the_snapshot() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("cli-snapshot", 1);
    let first = records(0, 400, 120);
    produce(&input, &first);
    run_until_committed(&app, &input, state.path(), &["s"], 400, &Restores::default()).stop().unwrap();
    let s = sd(state.path());
    let snaps = tempfile::tempdir().unwrap();
    let dest = snaps.path().join("snap");
    let dest_s = dest.display().to_string();

    let snap = kstate_json(0, &["--state-dir", &s, "snapshot", "--app", &app, "--store", "s", "--partition", "0", &dest_s]);
    let c = snap["manifest"]["checkpoint"].as_i64().unwrap();
    assert_eq!(Some(c), read_store_dir(state.path(), &app, "s", 0).1, "the snapshot's checkpoint is the store's");
    assert_eq!(snap["manifest"]["changelog_topic"], kstate::changelog_topic(&app, "s"));
    assert!(dest.join("db").is_dir() && dest.join("kstate-snapshot.json").is_file());
    kstate_fails(1, "already exists", &["--state-dir", &s, "snapshot", "--app", &app, "--store", "s", "--partition", "0", &dest_s]);

    // More input after the snapshot.
    let second = records(400, 700, 200);
    produce(&input, &second);
    let restores = Restores::default();
    run_until_committed(&app, &input, state.path(), &["s"], 700, &restores).stop().unwrap();
    assert_eq!(restores.restored_records(), 0);
    let changelog_end = end_offset_at(&bootstrap(), &kstate::changelog_topic(&app, "s"), 0);
    assert!(changelog_end > c + 1 + 50, "the second run wrote to the changelog ({changelog_end} vs {c})");

    // Import over the existing state: refused without --force.
    kstate_fails(1, "import with force", &["--state-dir", &s, "import-snapshot", &dest_s]);
    let w = kstate_json(0, &["--state-dir", &s, "wipe", "--app", &app, "--partition", "0"]);
    assert_eq!(w["deleted"].as_array().unwrap().len(), 1);
    assert!(w["total_bytes"].as_u64().unwrap() > 0);
    assert!(!state.path().join(&app).join("s").join("0").exists());
    kstate_fails(1, "not found", &["--state-dir", &s, "wipe", "--app", &app, "--partition", "0"]);

    let (code, out, err) = kstate(&["--state-dir", &s, "import-snapshot", &dest_s]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains(&format!("at checkpoint {c}")) && out.contains("restores the store in full"), "{out}");
    // Importing again over the imported data needs --force, and works with it.
    kstate_fails(1, "import with force", &["--state-dir", &s, "import-snapshot", &dest_s]);
    let imp = kstate_json(0, &["--state-dir", &s, "import-snapshot", "--force", &dest_s]);
    assert_eq!(imp["replaced_existing"], true);
    assert_eq!(imp["manifest"]["checkpoint"], c);
    let (_, cp) = read_store_dir(state.path(), &app, "s", 0);
    assert_eq!(cp, Some(c));

    // The next start replays exactly the changelog past the snapshot.
    let restores = Restores::default();
    let running = run_until_committed(&app, &input, state.path(), &["s"], 700, &restores);
    wait_until("the restore to end", TIMEOUT, || restores.ended() >= 1);
    running.stop().unwrap();
    assert_eq!(restores.restored_records() as i64, changelog_end - (c + 1), "only the changelog past the snapshot is replayed");
    let all: Vec<KeyedRecord> = first.iter().chain(&second).cloned().collect();
    let (data, _) = read_store_dir(state.path(), &app, "s", 0);
    assert_same_state(&data, &model(&all), "restored from snapshot + tail");
}

#[test]
fn inspect_and_sample_read_a_live_store_whose_lock_blocks_snapshot_wipe_and_import() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("cli-live", 1);
    // Unique keys: 300 `user:<i>` and 100 `order:<i>`, one large value.
    let mut input_records: Vec<KeyedRecord> = (0..300).map(|i| (0, format!("user:{i:03}").into_bytes(), Some(vec![b'u'; 10]))).collect();
    input_records.extend((0..100).map(|i| (0, format!("order:{i:03}").into_bytes(), Some(vec![b'o'; 20]))));
    input_records.push((0, b"user:big".to_vec(), Some(vec![b'b'; 5000])));
    produce(&input, &input_records);
    let n = input_records.len() as u64;
    // The first run writes the stores; its close flushes them (a live
    // store is read as of its last flush), the second keeps them open.
    run_until_committed(&app, &input, state.path(), &["s", "t"], n as i64, &Restores::default()).stop().unwrap();
    let s = sd(state.path());
    let snaps = tempfile::tempdir().unwrap();
    let dest = snaps.path().join("snap");
    let dest_s = dest.display().to_string();
    kstate_json(0, &["--state-dir", &s, "snapshot", "--app", &app, "--store", "s", "--partition", "0", &dest_s]);

    // Wipe refuses while any one store of the task is locked, and deletes none.
    {
        let lock = std::fs::File::open(state.path().join(&app).join("t").join("0").join(".kstate.lock")).unwrap();
        lock.try_lock().unwrap();
        kstate_fails(1, "locked", &["--state-dir", &s, "wipe", "--app", &app, "--partition", "0"]);
        assert!(state.path().join(&app).join("s").join("0").join("db").is_dir(), "nothing deleted");
    }

    let restores = Restores::default();
    let running = run_until_committed(&app, &input, state.path(), &["s", "t"], n as i64, &restores);
    wait_until("both stores open", TIMEOUT, || restores.ended() >= 2);
    let r = kstate_json(0, &["--state-dir", &s, "inspect"]);
    let a = r["applications"].as_array().unwrap().iter().find(|a| a["application_id"] == app.as_str()).unwrap().clone();
    let parts = a["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{a}");
    for p in parts {
        assert_eq!(p["locked"], true, "{p}");
        assert_eq!(p["keys"], n, "{p}");
        assert!(p["checkpoint"].as_i64().is_some(), "{p}");
        assert_eq!(p["checkpoint_hint"], Value::Null, "an open store has no hint: {p}");
        assert!(p["logical_bytes"].as_u64().unwrap() >= 5000 && p["disk_bytes"].as_u64().unwrap() > 0, "{p}");
        assert!(p["last_flush_age_secs"].as_f64().is_some(), "{p}");
        assert_eq!(p["problem"], Value::Null);
    }
    assert!(a["process_id"].as_str().is_some_and(|id| !id.is_empty()));
    let (code, out, _) = kstate(&["--state-dir", &s, "inspect"]);
    assert_eq!(code, 0);
    assert!(out.contains(&format!("application {app}")) && out.contains("live"), "{out}");

    let sample = |extra: &[&str]| {
        let mut args = vec!["--state-dir", &s, "sample", "--app", &app, "--store", "s", "--partition", "0", "--top", "3"];
        args.extend_from_slice(extra);
        kstate_json(0, &args)
    };
    let r = sample(&["--delimiter", ":"]);
    assert_eq!(r["keys"], n);
    let key_bytes: usize = input_records.iter().map(|r| r.1.len()).sum();
    let value_bytes: usize = input_records.iter().map(|r| r.2.as_ref().unwrap().len()).sum();
    assert_eq!((r["key_bytes"].as_u64(), r["value_bytes"].as_u64()), (Some(key_bytes as u64), Some(value_bytes as u64)));
    assert_eq!(r["largest_values"][0]["key"], "user:big");
    assert_eq!(r["largest_values"][0]["value_bytes"], 5000);
    assert_eq!(r["largest_keys"][0]["key_bytes"], 9, "order:NNN");
    assert_eq!(r["distinct_prefixes"], 2);
    assert_eq!((r["top_prefixes"][0]["prefix"].as_str(), r["top_prefixes"][0]["keys"].as_u64()), (Some("user"), Some(301)));
    assert_eq!((r["top_prefixes"][1]["prefix"].as_str(), r["top_prefixes"][1]["keys"].as_u64()), (Some("order"), Some(100)));
    let r = sample(&["--prefix-len", "2"]);
    assert_eq!((r["top_prefixes"][0]["prefix"].as_str(), r["top_prefixes"][0]["keys"].as_u64()), (Some("us"), Some(301)));
    let (code, out, _) = kstate(&["--state-dir", &s, "sample", "--app", &app, "--store", "s", "--partition", "0"]);
    assert_eq!(code, 0);
    assert!(out.contains("401 keys") && out.contains("user:big"), "{out}");

    // The live instance's locks: snapshot, wipe and import refuse, touching nothing.
    let dest2 = snaps.path().join("snap2").display().to_string();
    kstate_fails(1, "locked", &["--state-dir", &s, "snapshot", "--app", &app, "--store", "s", "--partition", "0", &dest2]);
    assert!(!snaps.path().join("snap2").exists());
    kstate_fails(1, "locked", &["--state-dir", &s, "wipe", "--app", &app, "--partition", "0", "--store", "t"]);
    kstate_fails(1, "locked", &["--state-dir", &s, "import-snapshot", "--force", &dest_s]);
    running.stop().unwrap();
    let (data, _) = read_store_dir(state.path(), &app, "t", 0);
    assert_eq!(data.len() as u64, n, "the refused wipe deleted nothing");
}

#[test]
fn estimate_restore_is_within_2x_of_the_measured_restore_of_a_wiped_store() {
    let _serial = serial();
    const N: usize = 300_000;
    let Fixture { input, app, state } = fixture("cli-estimate", 1);
    let input_records: Vec<KeyedRecord> =
        (0..N).map(|i| (0, format!("key-{i:07}").into_bytes(), Some(format!("value-{i}-{}", "x".repeat(i % 50)).into_bytes()))).collect();
    produce(&input, &input_records);
    run_until_committed(&app, &input, state.path(), &["s"], N as i64, &Restores::default()).stop().unwrap();
    let changelog_end = end_offset_at(&bootstrap(), &kstate::changelog_topic(&app, "s"), 0);
    assert!(changelog_end >= 300_000, "{changelog_end}");
    let (s, bootstrap) = (sd(state.path()), bootstrap());
    let estimate = |code| kstate_json(code, &["--state-dir", &s, "--bootstrap", &bootstrap, "estimate-restore", "--app", &app]);

    // Caught up: nothing to replay; no rate measured yet.
    let r = estimate(0);
    assert_eq!(r["total_records"], 0);
    assert_eq!(r["rate_source"], "assumed");

    // A first full restore measures the rate on this state dir.
    let wipe = || kstate_json(0, &["--state-dir", &s, "wipe", "--app", &app, "--partition", "0"]);
    let full_restore = || {
        let restores = Restores::default();
        let running = run_until_committed(&app, &input, state.path(), &["s"], N as i64, &restores);
        wait_until("the restore to end", Duration::from_secs(120), || restores.ended() >= 1);
        running.stop().unwrap();
        let end = restores.ends.lock().unwrap()[0].clone();
        assert_eq!(end.records as i64, changelog_end);
        end.duration
    };
    wipe();
    let first = full_restore();
    wipe();
    let started = Instant::now();
    let r = estimate(0);
    eprintln!("estimate-restore took {:?}: {r}", started.elapsed());
    assert_eq!(r["rate_source"], "measured");
    assert_eq!(r["total_records"].as_i64(), Some(changelog_end));
    assert_eq!(r["partitions"][0]["local"], false);
    let avg = (input_records.iter().map(|r| r.1.len() + r.2.as_ref().unwrap().len()).sum::<usize>() / N) as f64;
    let bytes = r["total_estimated_bytes"].as_f64().unwrap();
    assert!((bytes / (avg * N as f64) - 1.0).abs() < 0.5, "estimated bytes {bytes} vs about {}", avg * N as f64);
    let predicted = r["estimated_seconds"].as_f64().unwrap();
    let (code, out, _) = kstate(&["--state-dir", &s, "--bootstrap", &bootstrap, "estimate-restore", "--app", &app]);
    assert_eq!(code, 0);
    assert!(out.contains("measured on this state dir") && out.contains("300,000 records"), "{out}");

    let actual = full_restore().as_secs_f64();
    eprintln!("restore: first {first:?}, predicted {predicted:.2} s, actual {actual:.2} s");
    assert!(predicted <= 2.0 * actual && actual <= 2.0 * predicted, "predicted {predicted:.2} s, actual {actual:.2} s");

    // A given rate wins.
    wipe();
    let r = kstate_json(0, &["--state-dir", &s, "--bootstrap", &bootstrap, "estimate-restore", "--app", &app, "--rate", "1000"]);
    assert_eq!(r["rate_source"], "given");
    assert!((r["estimated_seconds"].as_f64().unwrap() - changelog_end as f64 / 1000.0).abs() < 1e-6);
}

#[test]
fn errors_are_clear_and_never_panics() {
    let _serial = serial();
    init_tracing();
    let state = tempfile::tempdir().unwrap();
    let s = sd(state.path());
    let missing = state.path().join("nope").display().to_string();
    let bootstrap = bootstrap();
    // A store partition with a database but no changelog topic.
    let app = unique("cli-ghost");
    {
        let path = store_db_path(state.path(), &app, "s", 0);
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let db = rocksdb::DB::open_cf(&opts, &path, ["default", "kstate_meta"]).unwrap();
        db.put(b"k", b"v").unwrap();
        db.put_cf(db.cf_handle("kstate_meta").unwrap(), b"changelog.checkpoint", 0i64.to_be_bytes()).unwrap();
        db.flush().unwrap();
    }
    let sp = ["--app", app.as_str(), "--store", "s", "--partition", "0"];
    let with = |head: &[&str], tail: &[&str]| -> Vec<String> { head.iter().chain(tail).map(|s| s.to_string()).collect() };
    let run_fails = |code, needle: &str, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kstate_fails(code, needle, &args);
    };

    // Missing state dir, for every verb.
    for verb in [
        with(&["inspect"], &[]),
        with(&["sample"], &sp),
        with(&["--bootstrap", &bootstrap, "verify"], &sp),
        with(&["--bootstrap", &bootstrap, "estimate-restore", "--app", &app], &[]),
        with(&["snapshot"], &[&sp[..], &["/tmp/x-kstate-never"][..]].concat()),
        with(&["import-snapshot", &s], &[]),
        with(&["wipe", "--app", &app, "--partition", "0"], &[]),
    ] {
        run_fails(1, "does not exist", with(&["--state-dir", &missing], &verb.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    // No state dir at all, no bootstrap for a Kafka verb: usage errors.
    kstate_fails(2, "--state-dir", &["inspect"]);
    kstate_fails(2, "--bootstrap", &[&["--state-dir", &s, "verify"][..], &sp].concat());
    kstate_fails(2, "KEY=VALUE", &[&["--state-dir", &s, "-X", "novalue", "--bootstrap", &bootstrap, "verify"][..], &sp].concat());
    kstate_fails(2, "ASCII", &[&["--state-dir", &s, "sample"][..], &sp, &["--delimiter", "ab"]].concat());
    kstate_fails(2, "cannot be used with", &[&["--state-dir", &s, "sample"][..], &sp, &["--delimiter", ":", "--prefix-len", "2"]].concat());

    // Unknown application, store, partition.
    kstate_fails(1, "application `other` not found", &["--state-dir", &s, "sample", "--app", "other", "--store", "s", "--partition", "0"]);
    kstate_fails(1, "store `t` of application", &["--state-dir", &s, "sample", "--app", &app, "--store", "t", "--partition", "0"]);
    kstate_fails(1, "partition 3 of store `s` not found", &["--state-dir", &s, "sample", "--app", &app, "--store", "s", "--partition", "3"]);
    kstate_fails(1, "partition 3 of store `s`", &["--state-dir", &s, "snapshot", "--app", &app, "--store", "s", "--partition", "3", "/tmp/x-kstate-never"]);
    kstate_fails(1, "local state of partition 3", &["--state-dir", &s, "wipe", "--app", &app, "--partition", "3"]);
    kstate_fails(1, "store `t`", &["--state-dir", &s, "wipe", "--app", &app, "--partition", "0", "--store", "t"]);
    kstate_fails(1, "partition 3", &["--state-dir", &s, "--bootstrap", &bootstrap, "verify", "--app", &app, "--store", "s", "--partition", "3"]);

    // Kafka: a changelog that does not exist, a bad property, an unreachable broker.
    kstate_fails(1, "topic does not exist", &[&["--state-dir", &s, "--bootstrap", &bootstrap, "verify"][..], &sp].concat());
    kstate_fails(1, "topic does not exist", &["--state-dir", &s, "--bootstrap", &bootstrap, "estimate-restore", "--app", &app]);
    kstate_fails(2, "no.such.property", &[&["--state-dir", &s, "--bootstrap", &bootstrap, "-X", "no.such.property=1", "verify"][..], &sp].concat());
    let started = Instant::now();
    kstate_fails(1, "unreachable", &[&["--state-dir", &s, "--bootstrap", "127.0.0.1:1", "--timeout", "2", "verify"][..], &sp].concat());
    assert!(started.elapsed() < Duration::from_secs(15), "an unreachable broker is bounded: {:?}", started.elapsed());

    // Snapshots: not a snapshot; a good one, then a corrupted description.
    kstate_fails(1, "kstate-snapshot.json", &["--state-dir", &s, "import-snapshot", &s]);
    let snaps = tempfile::tempdir().unwrap();
    let dest = snaps.path().join("snap");
    let dest_s = dest.display().to_string();
    let snap = kstate_json(0, &[&["--state-dir", &s, "snapshot"][..], &sp, &[&dest_s]].concat());
    assert_eq!(snap["manifest"]["checkpoint"], 0);
    kstate_fails(1, "import with force", &["--state-dir", &s, "import-snapshot", &dest_s]);
    let manifest = dest.join("kstate-snapshot.json");
    let text = std::fs::read_to_string(&manifest).unwrap().replace("\"checkpoint\": 0", "\"checkpoint\": 99");
    std::fs::write(&manifest, text).unwrap();
    kstate_fails(1, "checkpoint is Some(0), its description says Some(99)", &["--state-dir", &s, "import-snapshot", "--force", &dest_s]);
    assert!(!state.path().join(&app).join("s").join("0").join("db.importing").exists(), "a failed import leaves nothing behind");
    std::fs::write(&manifest, "{").unwrap();
    kstate_fails(1, "not a kstate snapshot description", &["--state-dir", &s, "import-snapshot", &dest_s]);
    let r = kstate_json(0, &["--state-dir", &s, "inspect"]);
    assert_eq!(r["applications"][0]["partitions"][0]["keys"], 1, "the store is untouched: {r}");

    // A changelog that is behind the store's checkpoint (recreated, empty).
    create_topic(&kstate::changelog_topic(&app, "s"), 1, &[]);
    kstate_fails(1, "past the changelog's end offset 0", &[&["--state-dir", &s, "--bootstrap", &bootstrap, "verify"][..], &sp].concat());
    let r = kstate_json(0, &["--state-dir", &s, "--bootstrap", &bootstrap, "estimate-restore", "--app", &app]);
    assert!(r["partitions"][0]["note"].as_str().is_some_and(|n| n.contains("full restore")), "{r}");
}

#[test]
fn inspect_shows_a_tasks_stream_time_and_pending_timers() {
    use kstate::{Processor, ProcessorContext, ProcessorError, Record, TimeDomain, Timer};
    let _serial = serial();
    let Fixture { input, app, state } = fixture("cli-timers", 1);
    // Value `i` (record timestamp 1000 + i): a stream-time timer at
    // 1000 + i + 5 and a wall-clock timer far ahead, for key `i`.
    struct Timers;
    impl Processor for Timers {
        fn process(&mut self, ctx: &mut ProcessorContext<'_>, rec: &Record<'_>) -> Result<(), ProcessorError> {
            let (key, ts) = (rec.value.unwrap(), ctx.timestamp().unwrap());
            ctx.register_timer(TimeDomain::StreamTime, key, ts + 5)?;
            ctx.register_timer(TimeDomain::WallClock, key, 4_000_000_000_000 + ts)?;
            Ok(())
        }
        fn on_timer(&mut self, _: &mut ProcessorContext<'_>, _: &Timer) -> Result<(), ProcessorError> {
            Ok(())
        }
    }
    produce(&input, &(0..10).map(|i| (0, b"k".to_vec(), Some(i.to_string().into_bytes()))).collect::<Vec<_>>());
    let built = builder(&app, &input, state.path())
        .timers(true)
        .timestamp_extractor(|rec, _| 1000 + rec.value_str().unwrap().parse::<i64>().unwrap())
        .build()
        .unwrap();
    let stop = built.shutdown_handle();
    let thread = std::thread::spawn(move || built.run_processor(|_| Timers));
    wait_all_committed_at(&bootstrap(), &app, &input, 1, TIMEOUT);
    stop.shutdown();
    thread.join().unwrap().unwrap();
    let r = kstate_json(0, &["--state-dir", &sd(state.path()), "inspect"]);
    let a = r["applications"].as_array().unwrap().iter().find(|a| a["application_id"] == app.as_str()).unwrap().clone();
    let time = a["partitions"].as_array().unwrap().iter().find(|p| p["store"] == kstate::TIME_STORE).unwrap().clone();
    let t = &time["timers"];
    // Stream time 1009: the timers of values 0..=4 (due by 1009) fired.
    assert_eq!(t["stream_time"], 1009, "{time}");
    assert_eq!((t["stream_time_timers"].as_u64(), t["earliest_stream_time_timer"].as_i64()), (Some(5), Some(1010)), "{time}");
    assert_eq!((t["wall_clock_timers"].as_u64(), t["earliest_wall_clock_timer"].as_i64()), (Some(10), Some(4_000_000_001_000)), "{time}");
    let (code, out, _) = kstate(&["--state-dir", &sd(state.path()), "inspect"]);
    assert_eq!(code, 0);
    assert!(out.contains("stream time 1009; 5 stream-time timers (earliest 1010); 10 wall-clock timers"), "{out}");
}

/// `verify --remote-url` compares what object storage holds of a remote
/// store partition with its changelog, without a state dir.
#[test]
fn verify_reads_a_remote_store_from_object_storage() {
    let _serial = serial();
    let f = fixture("cli-remote", 1);
    let objects = tempfile::tempdir().unwrap();
    let url = format!("file://{}", objects.path().display());
    let input = records(0, 900, 120);
    produce(&f.input, &input);
    let app = builder(&f.app, &f.input, f.state.path())
        .store(StoreDefinition::new("a").remote())
        .remote_state(kstate::RemoteStateConfig::new(&url))
        .commit_interval(Duration::from_millis(200));
    let running = Running::start(app, writer(&["a"]));
    wait_until("input committed", Duration::from_secs(120), || committed_offset(&f.app, &f.input, 0) == Some(900));
    running.stop().unwrap();

    let b = bootstrap();
    let args = ["--bootstrap", &b, "verify", "--app", &f.app, "--store", "a", "--partition", "0", "--remote-url", &url];
    let v = kstate_json(0, &args);
    let end = end_offset_at(&b, &kstate::changelog_topic(&f.app, "a"), 0);
    assert_eq!(v["checkpoint"].as_i64(), Some(end - 1), "{v}");
    assert_eq!(v["matching"].as_u64(), Some(model(&input).len() as u64), "{v}");
    assert_eq!(v["store_keys"].as_u64(), v["matching"].as_u64(), "{v}");
    let (code, text, _) = kstate(&args);
    assert_eq!(code, 0, "{text}");
    // A URL that does not work: a clear error, no panic.
    kstate_fails(2, "remote state", &["--bootstrap", &b, "verify", "--app", &f.app, "--store", "a", "--partition", "0", "--remote-url", "nope://x"]);
}

#[test]
fn snapshots_list_show_and_gc_read_the_snapshot_store_without_a_state_dir() {
    let _serial = serial();
    let f = fixture("cli-snaps", 1);
    let snaps = tempfile::tempdir().unwrap();
    let url = format!("file://{}", snaps.path().display());
    let input = records(0, 600, 50);
    produce(&f.input, &input);
    let app = builder(&f.app, &f.input, f.state.path())
        .store(StoreDefinition::new("a"))
        .snapshots(kstate::SnapshotConfig::new(&url).interval(Duration::from_secs(3600)))
        .build()
        .unwrap();
    let handle = app.snapshot_handle();
    let running = Running::start_app(app, writer(&["a"]));
    let listed = |n: usize| {
        let v = kstate_json(0, &["snapshots", "--url", &url, "list", "--app", &f.app]);
        v.as_array().unwrap().iter().map(|p| p["snapshots"].as_array().unwrap().len()).sum::<usize>() >= n
    };
    for (round, end) in [(1, 600), (2, 900), (3, 1200)] {
        if round > 1 {
            produce(&f.input, &records(end - 300, end, 50));
        }
        wait_until("input committed", Duration::from_secs(60), || committed_offset(&f.app, &f.input, 0) == Some(end as i64));
        handle.snapshot_now();
        wait_until("a snapshot listed", Duration::from_secs(60), || listed(round));
    }
    running.stop().unwrap();

    let v = kstate_json(0, &["snapshots", "--url", &url, "list", "--app", &f.app, "--store", "a"]);
    let partition = &v.as_array().unwrap()[0];
    assert_eq!((partition["store"].as_str(), partition["partition"].as_i64()), (Some("a"), Some(0)));
    let all = partition["snapshots"].as_array().unwrap();
    assert_eq!(all.len(), 3, "{v}");
    let newest = all.last().unwrap();
    let id = newest["id"].as_str().unwrap();
    assert_eq!(newest["checkpoint"].as_i64(), Some(end_offset_at(&bootstrap(), &kstate::changelog_topic(&f.app, "a"), 0) - 1));

    let shown = kstate_json(0, &["snapshots", "--url", &url, "show", "--app", &f.app, id]);
    assert_eq!(shown["id"], newest["id"]);
    assert!(shown["files"].as_array().unwrap().iter().any(|f| f["name"].as_str().unwrap().ends_with(".sst")), "{shown}");
    let (code, text, _) = kstate(&["snapshots", "--url", &url, "show", "--app", &f.app, id]);
    assert_eq!(code, 0);
    assert!(text.contains("checkpoint") && text.contains("CRC32"), "{text}");
    kstate_fails(1, "no snapshot `nope`", &["snapshots", "--url", &url, "show", "--app", &f.app, "nope"]);
    kstate_fails(1, "unsupported scheme", &["snapshots", "--url", "ftp://x/y", "list", "--app", &f.app]);

    let gc = kstate_json(0, &["snapshots", "--url", &url, "gc", "--app", &f.app, "--retain", "1"]);
    assert_eq!(gc[0]["manifests_deleted"].as_u64(), Some(2), "{gc}");
    assert!(gc[0]["files_deleted"].as_u64().unwrap() > 0, "{gc}");
    let v = kstate_json(0, &["snapshots", "--url", &url, "list", "--app", &f.app]);
    assert_eq!(v[0]["snapshots"].as_array().unwrap().len(), 1);
    assert_eq!(v[0]["snapshots"][0]["id"].as_str(), Some(id), "the newest is kept");

    // estimate-restore prices both paths for a state dir without the store.
    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(empty.path().join(&f.app)).unwrap();
    let mut k = vec!["--state-dir".to_string(), sd(empty.path()), "--bootstrap".into(), bootstrap()];
    k.extend(["estimate-restore", "--app", &f.app, "--store", "a", "--rate", "1000", "--snapshot-url", &url, "--download-rate", "1"].map(String::from));
    let e = kstate_json(0, &k.iter().map(String::as_str).collect::<Vec<_>>());
    let p0 = &e["partitions"][0];
    let end = p0["end_offset"].as_i64().unwrap();
    assert_eq!(p0["records"].as_i64(), Some(end), "{e}");
    assert_eq!(p0["snapshot"]["snapshot_id"].as_str(), Some(id), "{e}");
    assert_eq!(p0["snapshot"]["tail_records"].as_i64(), Some(end - 1 - newest["checkpoint"].as_i64().unwrap()), "{e}");
    let full = e["estimated_seconds"].as_f64().unwrap();
    let with = e["estimated_seconds_with_snapshots"].as_f64().unwrap();
    let download = p0["snapshot"]["bytes"].as_f64().unwrap() / 1e6;
    assert!((with - download).abs() < 0.01 && (full - end as f64 / 1000.0).abs() < 0.01, "{e}");

    // What is left still seeds a new instance to the same state.
    let state = tempfile::tempdir().unwrap();
    let restores = Restores::default();
    let b = builder(&f.app, &f.input, state.path())
        .store(StoreDefinition::new("a"))
        .restore_listener(restores.clone())
        .snapshots(kstate::SnapshotConfig::new(&url));
    let running = Running::start(b, writer(&["a"]));
    wait_until("restored", Duration::from_secs(60), || restores.ended() >= 1);
    running.stop().unwrap();
    assert_eq!(restores.starts.lock().unwrap()[0].snapshot.as_ref().map(|s| s.snapshot_id.as_str()), Some(id));
    let mut all_input = input;
    all_input.extend(records(600, 1200, 50));
    assert_same_state(&read_store_dir(state.path(), &f.app, "a", 0).0, &model(&all_input), "seeded after gc");
}

#[test]
fn savepoint_create_list_show_restore_and_delete_from_the_command_line() {
    let _serial = serial();
    let f = fixture("cli-savepoint", 1);
    let snaps = tempfile::tempdir().unwrap();
    let url = format!("file://{}", snaps.path().display());
    let boot = bootstrap();
    let sp = |args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = ["--bootstrap", boot.as_str(), "savepoint", "--url", url.as_str()].map(String::from).to_vec();
        all.extend(args.iter().map(|s| s.to_string()));
        all
    };
    let run_json = |args: &[&str]| {
        let v = sp(args);
        kstate_json(0, &v.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let fails = |code: i32, needle: &str, args: &[&str]| {
        let v = sp(args);
        kstate_fails(code, needle, &v.iter().map(String::as_str).collect::<Vec<_>>());
    };
    // No instance answers: the request stays and the error says so.
    fails(1, "no instance answered", &["create", "--app", &f.app, "early", "--wait", "1"]);
    fails(1, "savepoint name", &["create", "--app", &f.app, "../x"]);

    produce(&f.input, &records(0, 300, 50));
    let app = builder(&f.app, &f.input, f.state.path())
        .store(StoreDefinition::new("a"))
        .snapshots(kstate::SnapshotConfig::new(&url).interval(Duration::from_secs(3600)))
        .build()
        .unwrap();
    let running = Running::start_app(app, writer(&["a"]));
    wait_until("input committed", Duration::from_secs(60), || committed_offset(&f.app, &f.input, 0) == Some(300));
    let created = run_json(&["create", "--app", &f.app, "v1", "--wait", "60"]);
    assert_eq!(created["partitions"].as_i64(), Some(1), "{created}");
    assert_eq!(created["tasks"][0]["input"][&f.input].as_i64(), Some(300), "{created}");
    fails(1, "exists already", &["create", "--app", &f.app, "v1"]);
    // Deleted and asked for again under the same name: a new savepoint.
    run_json(&["delete", "--app", &f.app, "v1"]);
    let again = run_json(&["create", "--app", &f.app, "v1", "--wait", "60"]);
    assert_eq!(again["tasks"][0]["input"][&f.input].as_i64(), Some(300), "{again}");
    let listed = run_json(&["list", "--app", &f.app]);
    let names: Vec<(&str, bool)> = listed.as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap(), e["savepoint"].is_object())).collect();
    assert!(names.contains(&("v1", true)) && names.contains(&("early", false)), "{listed}");
    fails(1, "member", &["restore", "--app", &f.app, "v1"]);
    produce(&f.input, &records(300, 600, 50));
    wait_until("input committed", Duration::from_secs(60), || committed_offset(&f.app, &f.input, 0) == Some(600));
    running.stop().unwrap();

    let v = sp(&["show", "--app", &f.app, "v1"]);
    let (code, text, _) = kstate(&v.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0);
    assert!(text.contains("INPUT OFFSETS") && text.contains("@300 (processed)"), "{text}");
    let restored = run_json(&["restore", "--app", &f.app, "v1"]);
    assert_eq!(restored["stores"][0]["mode"].as_str(), Some("tail"), "{restored}");
    assert_eq!(committed_offset(&f.app, &f.input, 0), Some(300));
    let deleted = run_json(&["delete", "--app", &f.app, "v1"]);
    assert_eq!(deleted["deleted_snapshots"].as_u64(), Some(1), "{deleted}");
    run_json(&["delete", "--app", &f.app, "early"]);
    assert_eq!(run_json(&["list", "--app", &f.app]).as_array().map(Vec::len), Some(0));
}
