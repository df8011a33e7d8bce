//! Schema versions against a real broker: code at version 2 upgrades
//! version 1 state (and never converts its own records again), code at
//! version 1 refuses version 2 state with a typed error, and a savepoint
//! rolls a version 2 deploy back to version 1.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use kstate::{SnapshotConfig, StoreDefinition};

const STORE: &str = "s";
const WAIT: Duration = Duration::from_secs(90);

/// Version 1 stores each record's value; version 2 stores `v2:` and the
/// value. Their upgrade functions convert the other version's values.
fn definition(version: u32, upgrade: bool) -> StoreDefinition {
    let def = StoreDefinition::new(STORE).schema_version(version);
    if !upgrade {
        return def;
    }
    def.upgrade(move |from, _key, value| match (version, from) {
        (2, 1) => Ok([b"v2:".as_slice(), value].concat()),
        (1, 2) => value.strip_prefix(b"v2:").map(<[u8]>::to_vec).ok_or_else(|| "not a version 2 value".to_string()),
        (v, f) => Err(format!("version {v} has no conversion from version {f}")),
    })
}

fn start(f: &Fixture, state: &Path, version: u32, upgrade: bool, snapshots: Option<SnapshotConfig>, restores: &Restores) -> Running {
    let mut b = builder(&f.app, &f.input, state).store(definition(version, upgrade)).restore_listener(restores.clone());
    if let Some(s) = snapshots {
        b = b.snapshots(s);
    }
    Running::start(b, move |ctx, rec| {
        let (Some(k), Some(v)) = (rec.key, rec.value) else { return Ok(()) };
        let value = if version == 2 { [b"v2:".as_slice(), v].concat() } else { v.to_vec() };
        ctx.store(STORE)?.put(k, &value)
    })
}

fn records(from: usize, to: usize) -> Vec<KeyedRecord> {
    (from..to).map(|i| (0, format!("k{}", i % 100).into_bytes(), Some(format!("{i}").into_bytes()))).collect()
}

/// The latest value of each key, as version `version` stores it.
fn model(input: &[KeyedRecord], version: u32) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for (_, k, v) in input {
        let v = v.clone().unwrap();
        m.insert(k.clone(), if version == 2 { [b"v2:".as_slice(), &v].concat() } else { v });
    }
    m
}

fn stored(state: &Path, app: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    read_store_dir(state, app, STORE, 0).0
}

fn run_until_committed(f: &Fixture, state: &Path, version: u32, upgrade: bool, snapshots: Option<SnapshotConfig>) -> Restores {
    let restores = Restores::default();
    let app = start(f, state, version, upgrade, snapshots, &restores);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    app.stop().expect("clean run");
    restores
}

#[test]
fn version_2_code_upgrades_version_1_state_and_never_converts_its_own_records() {
    let f = fixture("schema-up", 1);
    let mut input = records(0, 300);
    produce(&f.input, &input);
    run_until_committed(&f, f.state.path(), 1, false, None);
    assert_same_state(&stored(f.state.path(), &f.app), &model(&input, 1), "version 1's store");

    // Version 2 on version 1's local state: rebuilt from the changelog,
    // upgraded (half the keys are not written again).
    let more = records(300, 350);
    produce(&f.input, &more);
    input.extend(more);
    let restores = run_until_committed(&f, f.state.path(), 2, true, None);
    let first = restores.starts.lock().unwrap()[0].clone();
    assert!(first.full_restore_reason.as_deref().is_some_and(|r| r.contains("schema version 1")), "{first:?}");
    assert_same_state(&stored(f.state.path(), &f.app), &model(&input, 2), "version 2's store on version 1's state");

    // A new instance of version 2: the changelog holds both versions; only
    // version 1's records are upgraded (version 2's carry their header).
    let fresh = tempfile::tempdir().unwrap();
    let restores = Restores::default();
    let app = start(&f, fresh.path(), 2, true, None, &restores);
    wait_until("restored", WAIT, || restores.ended() >= 1);
    app.stop().unwrap();
    assert_same_state(&stored(fresh.path(), &f.app), &model(&input, 2), "a new version 2 instance's store");
}

#[test]
fn version_1_code_refuses_version_2_state_with_a_typed_error() {
    let f = fixture("schema-new", 1);
    produce(&f.input, &records(0, 200));
    run_until_committed(&f, f.state.path(), 2, true, None);
    let fresh = tempfile::tempdir().unwrap();
    let app = start(&f, fresh.path(), 1, false, None, &Restores::default());
    wait_until("the app to stop on its own", WAIT, || app.is_finished());
    match app.stop() {
        Err(kstate::Error::SchemaVersion { store, partition: 0, found: 2, expected: 1, .. }) => assert_eq!(store, STORE),
        other => panic!("expected Error::SchemaVersion, got {other:?}"),
    }
    // Given an upgrade function, the same code on the same state reads
    // every key (the refused ones too: the store is rebuilt).
    let restores = Restores::default();
    let app = start(&f, fresh.path(), 1, true, None, &restores);
    wait_until("restored", WAIT, || restores.ended() >= 1);
    app.stop().expect("a clean run");
    assert_same_state(&stored(fresh.path(), &f.app), &model(&records(0, 200), 1), "version 1's store, version 2's values converted");
}

#[test]
fn a_savepoint_rolls_a_version_2_deploy_back_to_version_1() {
    let f = fixture("schema-back", 1);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let at = kstate::admin::SnapshotStore { url: url.clone(), options: vec![] };
    let snapshots = || Some(SnapshotConfig::new(&url).interval(Duration::from_secs(3600)));
    let mut input = records(0, 300);
    produce(&f.input, &input);
    let restores = Restores::default();
    let app = start(&f, f.state.path(), 1, false, snapshots(), &restores);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, WAIT);
    let sp = kstate::admin::create_savepoint(&at, &f.app, "v1", WAIT).expect("savepoint taken");
    app.stop().unwrap();
    assert_eq!(sp.tasks[0].input[&f.input], 300);

    // The version 2 deploy processes more, then is reverted.
    let more = records(300, 500);
    produce(&f.input, &more);
    input.extend(more);
    run_until_committed(&f, f.state.path(), 2, true, snapshots());
    let r = kstate::admin::restore_savepoint(&at, &f.app, "v1", &kstate::admin::Kafka::new(bootstrap())).expect("restored");
    assert_eq!(r.stores[0].mode, "tail", "{r:?}");

    // Version 1 again on version 2's local state: rebuilt from the
    // changelog, whose version 2 records are all replaced by the
    // restore's; then it reprocesses from the savepoint.
    run_until_committed(&f, f.state.path(), 1, false, snapshots());
    assert_same_state(&stored(f.state.path(), &f.app), &model(&input, 1), "version 1's store after the rollback");
}
