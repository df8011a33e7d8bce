//! Savepoints end to end, with three instances (child processes, see
//! `common::instances`) holding standbys, a real broker and MinIO: a
//! savepoint taken under load is a consistent cut of every task, a bad
//! deploy is rolled back by restoring it, and the good code then
//! reprocesses from the savepoint's offsets to the model of all input.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::instances::*;
use common::*;
use kstate::admin::{create_savepoint, delete_savepoint, list_savepoints, restore_savepoint, Kafka};

const WAIT: Duration = Duration::from_secs(90);

/// The child instances' entry point (see `common::instances`).
#[test]
#[ignore = "run by the savepoint tests as a child process"]
fn standby_child() {
    child_main();
}

/// The model of the first `offsets[p]` records of each partition of `sent`
/// (the input topic holds exactly `sent`, in order per partition).
fn model_up_to(sent: &[KeyedRecord], offsets: &BTreeMap<i32, i64>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut seen: BTreeMap<i32, i64> = BTreeMap::new();
    let prefix: Vec<KeyedRecord> = sent
        .iter()
        .filter(|(p, _, _)| {
            let n = seen.entry(*p).or_insert(0);
            *n += 1;
            *n <= offsets[p]
        })
        .cloned()
        .collect();
    model_of(&prefix)
}

fn start_all(f: &Fixture, options: &str) -> Vec<Instance> {
    let bootstrap = bootstrap();
    let mut instances: Vec<Instance> = ["a", "b", "c"]
        .iter()
        .map(|n| Instance::start_opts(n, &bootstrap, &f.app, &f.input, f.state.path(), "", ONE_STANDBY, options))
        .collect();
    balanced(&mut instances, WAIT);
    instances
}

/// One multi-process test at a time (2 cores).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn a_savepoint_rolls_a_bad_deploy_back_across_three_instances_with_standbys() {
    roll_back_a_bad_deploy("");
}

#[test]
fn a_savepoint_rolls_a_bad_deploy_back_under_exactly_once() {
    roll_back_a_bad_deploy(";eos=1");
}

/// Savepoint under load, bad deploy, restore, good deploy; `options` are
/// added to every instance's.
fn roll_back_a_bad_deploy(options: &str) {
    let _serial = serial();
    let f = fixture("savepoint", PARTITIONS);
    let (app, input) = (f.app.clone(), f.input.clone());
    let prefix = unique("savepoint");
    let (_, at) = s3_at(&s3_endpoint(), &prefix);
    let good = format!("snapshots={prefix}{options}");
    let mut sent = prefill(&input, 2_000);
    let mut instances = start_all(&f, &good);

    // Taken under load: every task is cut between two of its commits.
    let feeder = Feeder::start(&bootstrap(), &input, PARTITIONS, 60, 300, 1_000_000);
    std::thread::sleep(Duration::from_secs(3));
    let sp = create_savepoint(&at, &app, "before-deploy", Duration::from_secs(120)).expect("savepoint taken");
    sent.extend(feeder.join(true));
    assert_eq!(sp.partitions, PARTITIONS);
    assert_eq!(sp.tasks.iter().map(|t| t.partition).collect::<Vec<_>>(), (0..PARTITIONS).collect::<Vec<_>>());
    for t in &sp.tasks {
        assert_eq!(t.input_source[&input], "processed", "partition {} was processing under load", t.partition);
        assert!(t.stores[0].checkpoint.is_some(), "partition {} has state", t.partition);
    }
    let offsets: BTreeMap<i32, i64> = sp.tasks.iter().map(|t| (t.partition, t.input[&input])).collect();
    eprintln!("savepoint offsets {offsets:?}");
    all_committed(&mut instances, &app, &input, WAIT);
    let listed = list_savepoints(&at, &app).unwrap();
    assert!(listed.iter().any(|e| e.name == "before-deploy" && e.savepoint.is_some()), "{listed:?}");

    // A restore while instances run is refused.
    let kafka = Kafka::new(bootstrap());
    let refused = restore_savepoint(&at, &app, "before-deploy", &kafka).unwrap_err().to_string();
    assert!(refused.contains("member"), "{refused}");
    for i in instances {
        i.stop();
    }

    // The bad deploy: deletes and overwrites good state, adds keys of its own.
    let mut instances = start_all(&f, &format!("{good};bad=1"));
    let more = Feeder::start(&bootstrap(), &input, PARTITIONS, 60, 600, 3_000).join(false);
    sent.extend(more);
    all_committed(&mut instances, &app, &input, WAIT);
    let bad = changelog_state_at(&bootstrap(), &app, "s", PARTITIONS);
    assert!(bad.values().any(|v| v == b"BAD"), "the bad deploy wrote its values");
    for i in instances {
        i.stop();
    }

    // Roll back: the changelogs hold exactly the savepoint's state, the
    // group's offsets are the savepoint's.
    let r = restore_savepoint(&at, &app, "before-deploy", &kafka).expect("restored");
    eprintln!("rollback: {:?}", r.stores);
    assert_eq!(r.stores.len(), PARTITIONS as usize);
    assert!(r.stores.iter().all(|s| s.mode == "tail"), "{:?}", r.stores);
    assert!(r.stores.iter().map(|s| s.puts).sum::<u64>() > 0 && r.stores.iter().map(|s| s.deletes).sum::<u64>() > 0);
    for (p, o) in &offsets {
        assert_eq!(committed_offset(&app, &input, *p), Some(*o), "partition {p}'s committed offset is the savepoint's");
    }
    assert_same_state(&changelog_state_at(&bootstrap(), &app, "s", PARTITIONS), &model_up_to(&sent, &offsets), "the changelogs after the rollback");

    // The good code again, on the same state directories (local stores and
    // standbys hold the bad state and catch up from the changelogs): it
    // reprocesses from the savepoint to the model of all input.
    let instances = start_all(&f, &good);
    stop_and_check(instances, &app, &input, &sent, "a rollback");
    assert!(delete_savepoint(&at, &app, "before-deploy").unwrap() >= PARTITIONS as usize);
    assert!(list_savepoints(&at, &app).unwrap().is_empty());
}

#[test]
fn restoring_a_savepoint_of_an_application_with_a_table_or_a_repartition_topic_is_refused_before_anything_is_written() {
    let _serial = serial();
    for kind in ["table", "repartition"] {
        let f = fixture(&format!("sp-{kind}"), 2);
        let (app, input) = (f.app.clone(), f.input.clone());
        let (config, at) = s3_at(&s3_endpoint(), &unique("savepoint-refused"));
        let users = unique("sp-users");
        create_topic(&users, 2, &[("cleanup.policy", "compact")]);
        let records: Vec<KeyedRecord> =
            (0..400).map(|i| (i % 2, format!("k{i}").into_bytes(), Some(format!("v{}", i % 7).into_bytes()))).collect();
        produce(&input, &records);
        produce(&users, &records[..40]);
        let mut b = builder(&app, &input, f.state.path()).store(common::store("s")).snapshots(config).commit_interval(Duration::from_millis(200));
        b = if kind == "table" { b.table(&users, common::store("users")) } else { b.repartition("by-value") };
        let (own, by_value) = (input.clone(), kstate::repartition_topic(&app, "by-value"));
        let running = Running::start(b, move |ctx, rec| {
            if kind == "repartition" && rec.topic == own {
                return ctx.repartition("by-value", rec.value.unwrap_or_default(), b"");
            }
            if rec.topic == own || rec.topic == by_value {
                ctx.store("s")?.put(rec.key.unwrap_or_default(), b"seen")?;
            }
            Ok(())
        });
        wait_all_committed_at(&bootstrap(), &app, &input, 2, WAIT);
        create_savepoint(&at, &app, "cut", Duration::from_secs(120)).expect("savepoint taken");
        running.stop().unwrap();
        let committed: Vec<Option<i64>> = (0..2).map(|p| committed_offset(&app, &input, p)).collect();
        let changelog_ends: Vec<i64> = (0..2).map(|p| end_offset_at(&bootstrap(), &kstate::changelog_topic(&app, "s"), p)).collect();
        let refused = restore_savepoint(&at, &app, "cut", &Kafka::new(bootstrap())).unwrap_err().to_string();
        let why = if kind == "table" { "restoring savepoints of applications with tables is not supported" } else { "applications with repartition topics" };
        assert!(refused.contains(why), "{kind}: {refused}");
        // Nothing was rolled back: neither the offsets nor the changelog.
        assert_eq!((0..2).map(|p| committed_offset(&app, &input, p)).collect::<Vec<_>>(), committed, "{kind}: offsets");
        let ends: Vec<i64> = (0..2).map(|p| end_offset_at(&bootstrap(), &kstate::changelog_topic(&app, "s"), p)).collect();
        assert_eq!(ends, changelog_ends, "{kind}: the changelog of `s` was written");
        delete_savepoint(&at, &app, "cut").unwrap();
    }
}
