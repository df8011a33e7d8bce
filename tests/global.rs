//! Global tables against the real broker: read to the end of their topic
//! before any record is processed, followed while the application runs,
//! read from where they stopped after a restart (only what is new),
//! read again from the start when their topic was recreated, and a
//! missing topic refused at startup.

mod common;
#[path = "common/recorded.rs"]
mod recorded;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use recorded::{metric, metrics};
use kstate::{Error, Output};

/// Looks up each input record's key in the global table `countries` and
/// sends `<key> = <value or "missing">` to `out`.
fn start_joining(f: &Fixture, table_topic: &str, out: &str, restores: &Restores) -> Running {
    let out = out.to_string();
    let app = builder(&f.app, &f.input, f.state.path()).global_table("countries", table_topic).restore_listener(restores.clone());
    Running::start(app, move |ctx, record| {
        let key = record.key.unwrap_or_default();
        let value = ctx.global_table("countries")?.get(key)?.unwrap_or_else(|| b"missing".to_vec());
        ctx.send(Output::to(&out).key(key).value(&value))
    })
}

/// The latest output per key.
fn joined(out: &str, partitions: i32) -> BTreeMap<String, String> {
    let mut latest = BTreeMap::new();
    for p in 0..partitions {
        for (_, k, v) in read_partition(out, p) {
            latest.insert(String::from_utf8(k).unwrap(), String::from_utf8(v.unwrap_or_default()).unwrap());
        }
    }
    latest
}

fn table_records(range: std::ops::Range<usize>, value: &str) -> Vec<KeyedRecord> {
    range.map(|i| ((i % 3) as i32, format!("c{i}").into_bytes(), Some(format!("{value}{i}").into_bytes()))).collect()
}

fn restored(restores: &Restores) -> u64 {
    restores.ends.lock().unwrap().iter().filter(|e| e.store == "countries").map(|e| e.records).sum()
}

#[test]
fn a_global_table_is_current_before_processing_and_followed_while_running() {
    let f = fixture("global", 2);
    let (table, out) = (unique("global-table"), unique("global-out"));
    create_topic(&table, 3, &[("cleanup.policy", "compact")]);
    create_topic(&out, 2, &[]);
    produce(&table, &table_records(0..100, "v"));
    let input: Vec<KeyedRecord> = (0..100i32).map(|i| (i % 2, format!("c{i}").into_bytes(), Some(Vec::new()))).collect();
    produce(&f.input, &input);

    metrics();
    let restores = Restores::default();
    let running = start_joining(&f, &table, &out, &restores);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 2, TIMEOUT);
    let seen = joined(&out, 2);
    assert_eq!(seen.len(), 100);
    let table_label = [("table", "countries")];
    assert!(metric("kstate_global_table_records_total", &table_label).is_some_and(|n| n >= 100.0), "records written are counted");
    assert_eq!(metric("kstate_global_table_lag_records", &table_label), Some(0.0), "caught up");
    assert!(seen.iter().all(|(k, v)| v == &format!("v{}", &k[1..])), "every lookup found the table's value: {seen:?}");
    assert_eq!(restored(&restores), 100, "the bootstrap read the whole topic");
    assert_eq!(restores.ends.lock().unwrap().iter().filter(|e| e.store == "countries").count(), 3, "one restore per source partition");

    // Followed while running: a new key, an update and a delete.
    produce(&table, &[(0, b"c100".to_vec(), Some(b"new".to_vec())), (1, b"c1".to_vec(), Some(b"changed".to_vec())), (2, b"c2".to_vec(), None)]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        produce(&f.input, &[(0, b"c100".to_vec(), Some(Vec::new())), (1, b"c1".to_vec(), Some(Vec::new())), (0, b"c2".to_vec(), Some(Vec::new()))]);
        std::thread::sleep(Duration::from_millis(300));
        let seen = joined(&out, 2);
        if seen["c100"] == "new" && seen["c1"] == "changed" && seen["c2"] == "missing" {
            break;
        }
        assert!(Instant::now() < deadline, "the table's changes did not reach the processor: {:?}", (&seen["c100"], &seen["c1"], &seen["c2"]));
    }
    running.stop().unwrap();

    // A restart reads only what came since.
    produce(&table, &[(1, b"c101".to_vec(), Some(b"later".to_vec()))]);
    let restores = Restores::default();
    let running = start_joining(&f, &table, &out, &restores);
    produce(&f.input, &[(1, b"c101".to_vec(), Some(Vec::new()))]);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 2, TIMEOUT);
    running.stop().unwrap();
    assert_eq!(restored(&restores), 1, "only the record produced while it was stopped");
    assert_eq!(joined(&out, 2)["c101"], "later");
    assert!(restores.starts.lock().unwrap().iter().all(|s| s.full_restore_reason.is_none()));

    // A recreated topic: the local copy is discarded and read again.
    delete_topic(&table);
    create_topic(&table, 3, &[("cleanup.policy", "compact")]);
    produce(&table, &[(0, b"c0".to_vec(), Some(b"fresh".to_vec()))]);
    let restores = Restores::default();
    let running = start_joining(&f, &table, &out, &restores);
    produce(&f.input, &[(0, b"c0".to_vec(), Some(Vec::new())), (1, b"c3".to_vec(), Some(Vec::new()))]);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 2, TIMEOUT);
    running.stop().unwrap();
    let seen = joined(&out, 2);
    assert_eq!((seen["c0"].as_str(), seen["c3"].as_str()), ("fresh", "missing"), "the old copy was discarded");
    let reasons: Vec<Option<String>> = restores.starts.lock().unwrap().iter().map(|s| s.full_restore_reason.clone()).collect();
    assert!(reasons.iter().all(|r| r.as_deref().is_some_and(|r| r.contains("recreated"))), "{reasons:?}");
}

#[test]
fn a_global_table_whose_topic_is_missing_is_a_startup_error() {
    let f = fixture("global-missing", 1);
    let app = builder(&f.app, &f.input, f.state.path()).global_table("countries", unique("no-such-topic")).build().unwrap();
    let err = app.run(|_, _| Ok::<(), Error>(())).unwrap_err();
    assert!(matches!(&err, Error::MissingGlobalTableTopic { table, .. } if table == "countries"), "{err}");
}

#[test]
fn a_global_table_written_in_transactions_is_read_to_its_end() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let f = fixture("global-txn", 1);
    let (table, out) = (unique("global-txn-table"), unique("global-txn-out"));
    create_topic(&table, 1, &[]);
    create_topic(&out, 1, &[]);
    // Its last entry is a commit marker: no record's offset + 1 reaches the end.
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", unique("global-txn-producer"))
        .create()
        .unwrap();
    producer.init_transactions(TIMEOUT).unwrap();
    producer.begin_transaction().unwrap();
    for i in 0..10 {
        producer.send(BaseRecord::<str, str>::to(&table).partition(0).key(&format!("c{i}")).payload("txn")).map_err(|(e, _)| e).unwrap();
    }
    producer.commit_transaction(TIMEOUT).unwrap();
    let restores = Restores::default();
    let started = Instant::now();
    let running = start_joining(&f, &table, &out, &restores);
    produce(&f.input, &[(0, b"c3".to_vec(), Some(Vec::new()))]);
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 1, TIMEOUT);
    running.stop().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "startup took {:?}", started.elapsed());
    assert_eq!(restored(&restores), 10);
    assert_eq!(joined(&out, 1)["c3"], "txn");
}
