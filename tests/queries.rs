//! Interactive queries against the real broker: reads see committed state
//! only, each answer carries its position, a client reads its own write
//! through the input offset its producer got back, every failure is a
//! typed error, the metadata names the hosts, and a standby answers stale
//! reads within a lag bound and then takes over without positions going
//! backwards.

mod common;
#[path = "common/recorded.rs"]
mod recorded;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kstate::codec::{Json, U64Be, Utf8};
use kstate::{CopyRole, Position, ProcessorContext, QueryError, QueryOptions, Record, StoreDefinition};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Counts records per key in `counts`; a record with value `block` sleeps
/// after its write, holding the processing thread (so nothing commits).
fn counter(processed: Arc<AtomicU64>, blocking: Arc<AtomicBool>) -> impl FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> Result<(), kstate::Error> + Send + 'static {
    move |ctx, rec| {
        let key = rec.key_str().unwrap_or_default().to_string();
        let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
        let n = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &n)?;
        processed.fetch_add(1, Ordering::SeqCst);
        if rec.value_str() == Some("block") {
            blocking.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1500));
            blocking.store(false, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A producer partitioning by murmur2 like the Java clients.
fn keyed_producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "0")
        .create()
        .unwrap()
}

/// Sends one keyed record; its (partition, offset).
fn send(producer: &FutureProducer, topic: &str, key: &str, value: &str) -> (i32, i64) {
    let delivery = futures::executor::block_on(producer.send(FutureRecord::to(topic).key(key).payload(value), Duration::from_secs(10)));
    delivery.map(|d| (d.partition, d.offset)).expect("delivered")
}

#[test]
fn reads_see_committed_state_with_positions_read_your_writes_and_typed_errors() {
    let Fixture { input, app, state } = fixture("iq-local", 2);
    let endpoint = "127.0.0.1:7001";
    let app = builder(&app, &input, state.path())
        .store(common::store("counts"))
        .commit_interval(Duration::from_millis(200))
        .application_server(endpoint)
        .build()
        .unwrap();
    let q = app.queries();
    let key = "user-0".to_string();
    assert!(matches!(q.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new()), Err(QueryError::NotStarted)));
    let (processed, blocking) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let running = Running::start_app(app, counter(processed.clone(), blocking.clone()));
    wait_until("both tasks running", TIMEOUT, || q.local_lags().iter().filter(|l| l.copy == CopyRole::Active).count() == 2);

    // Read your own write: each answer reflects the record just written.
    let producer = keyed_producer();
    let mut model: BTreeMap<String, u64> = BTreeMap::new();
    let mut last: BTreeMap<i32, Option<i64>> = BTreeMap::new();
    for i in 0..40 {
        let key = format!("user-{}", i % 7);
        let (partition, offset) = send(&producer, &input, &key, "x");
        *model.entry(key.clone()).or_default() += 1;
        let answer = q
            .get::<Utf8, U64Be>("counts", &key, &QueryOptions::new().after_input(offset).wait(Duration::from_secs(10)))
            .unwrap_or_else(|e| panic!("read of {key} after input offset {offset}: {e}"));
        assert_eq!(answer.value, Some(model[&key]), "{key} after input offset {offset}");
        assert_eq!(answer.position.partition, partition, "queries route {key} to the producer's partition");
        assert_eq!(q.partition_of::<Utf8>("counts", &key).unwrap(), partition);
        assert_eq!(answer.copy, CopyRole::Active);
        let before = last.insert(partition, answer.position.offset).flatten();
        assert!(answer.position.offset >= before, "positions only grow: {before:?} then {:?}", answer.position.offset);
        // The same position as a bound is met at once.
        let again = q.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new().at_least(answer.position.clone())).unwrap();
        assert!(again.position.offset >= answer.position.offset);
    }

    // Uncommitted writes are invisible: while the processor holds the
    // thread after writing, nothing commits and the read sees the old value.
    let held = "held".to_string();
    let (_, offset) = send(&producer, &input, &held, "block");
    wait_until("the blocking record", TIMEOUT, || blocking.load(Ordering::SeqCst));
    let during = q.get::<Utf8, U64Be>("counts", &held, &QueryOptions::new()).unwrap();
    assert!(blocking.load(Ordering::SeqCst), "the read happened while the write was uncommitted");
    assert_eq!(during.value, None, "a read sees committed state only");
    let after = q.get::<Utf8, U64Be>("counts", &held, &QueryOptions::new().after_input(offset)).unwrap();
    assert_eq!(after.value, Some(1));
    model.insert(held.clone(), 1);

    // A bound not reached within the wait is `NotYet`, after the wait.
    let started = Instant::now();
    let e = q.get::<Utf8, U64Be>("counts", &held, &QueryOptions::new().after_input(offset + 1000).wait(Duration::from_millis(300))).unwrap_err();
    assert!(matches!(e, QueryError::NotYet { .. }), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(300) && started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

    // Scans: every partition is here.
    let all = q.range::<Utf8, U64Be>("counts", &String::new(), &"~".to_string(), 1000, &QueryOptions::new()).unwrap();
    assert_eq!(all.entries.into_iter().collect::<BTreeMap<_, _>>(), model);
    assert!(all.skipped.is_empty() && !all.truncated && all.read.len() == 2);
    let some = q.prefix::<Utf8, U64Be>("counts", b"user-", 3, &QueryOptions::new()).unwrap();
    assert_eq!(some.entries.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["user-0", "user-1", "user-2"]);
    assert!(some.truncated);
    let p = q.partition_of::<Utf8>("counts", &key).unwrap();
    let one = q.partition_prefix::<Utf8, U64Be>("counts", p, b"user-", 100, &QueryOptions::new()).unwrap();
    assert!(!one.value.is_empty() && one.value.iter().all(|(k, _)| q.partition_of::<Utf8>("counts", k).unwrap() == p));

    // Metadata: this instance runs both partitions.
    let meta = q.metadata_for_key::<Utf8>("counts", &key).unwrap();
    assert_eq!((meta.active.as_deref(), meta.standbys.len()), (Some(endpoint), 0));
    let instances = q.instances().unwrap();
    assert_eq!(instances.len(), 1);
    assert_eq!((instances[0].endpoint.as_str(), instances[0].active.clone()), (endpoint, vec![0, 1]));
    assert_eq!(instances[0].stores, ["counts"]);
    let lags = q.local_lags();
    assert!(lags.iter().all(|l| l.copy == CopyRole::Active && l.lag == Some(0) && l.position.is_some()), "{lags:?}");

    // Typed errors for bad input.
    let e = q.get::<Utf8, U64Be>("nope", &key, &QueryOptions::new()).unwrap_err();
    assert!(matches!(e, QueryError::UnknownStore { .. }), "{e}");
    let e = q.get::<Utf8, U64Be>(kstate::TIME_STORE, &key, &QueryOptions::new()).unwrap_err();
    assert!(matches!(e, QueryError::UnknownStore { .. }), "an internal store is not queryable: {e}");
    let e = q.get::<Utf8, Json<Vec<String>>>("counts", &key, &QueryOptions::new()).unwrap_err();
    assert!(matches!(e, QueryError::Codec { .. }), "{e}");
    let other = Position { store: "other".into(), partition: p, offset: Some(1) };
    let e = q.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new().at_least(other)).unwrap_err();
    assert!(matches!(e, QueryError::InvalidPosition { .. }), "{e}");
    let e = q.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new().after_input_of("not-an-input", 0)).unwrap_err();
    assert!(matches!(e, QueryError::InvalidPosition { .. }), "{e}");
    let e = q.partition_prefix::<Utf8, U64Be>("counts", 7, b"", 1, &QueryOptions::new()).unwrap_err();
    assert!(matches!(e, QueryError::InvalidPosition { .. }), "{e}");

    running.stop().unwrap();
    let e = q.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new()).unwrap_err();
    assert!(matches!(e, QueryError::ShuttingDown), "{e}");
    assert!(q.local_lags().is_empty(), "every store was withdrawn when it closed");
}

#[test]
fn a_standby_answers_stale_reads_within_its_lag_then_takes_over_without_going_back() {
    standby_answers_within_its_lag(kstate::ProcessingGuarantee::AtLeastOnce);
}

/// Under exactly-once the changelog's last offset is a transaction marker:
/// a caught-up standby still lags 0 records, so `allow_stale(0)` lets it answer.
#[test]
fn under_exactly_once_a_caught_up_standby_lags_zero_records() {
    standby_answers_within_its_lag(kstate::ProcessingGuarantee::ExactlyOnce);
}

fn standby_answers_within_its_lag(guarantee: kstate::ProcessingGuarantee) {
    let Fixture { input, app, state } = fixture("iq-standby", 1);
    let start = |name: &str, endpoint: &str| {
        let app = builder(&app, &input, &state.path().join(name))
            .store(common::store("counts"))
            .processing_guarantee(guarantee)
            .commit_interval(Duration::from_millis(200))
            .num_standby_replicas(1)
            .application_server(endpoint)
            .build()
            .unwrap();
        let q = app.queries();
        (Running::start_app(app, counter(Arc::default(), Arc::default())), q)
    };
    let (a, qa) = start("a", "127.0.0.1:7101");
    wait_until("a running", TIMEOUT, || qa.local_lags().iter().any(|l| l.copy == CopyRole::Active));
    let (b, qb) = start("b", "127.0.0.1:7102");
    wait_until("b following a standby", TIMEOUT, || qb.local_lags().iter().any(|l| l.copy == CopyRole::Standby));
    let producer = keyed_producer();
    let key = "k".to_string();
    let mut last = None;
    for _ in 0..30 {
        last = Some(send(&producer, &input, &key, "x").1);
    }
    let on_a = qa.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new().after_input(last.unwrap())).unwrap();
    assert_eq!(on_a.value, Some(30));
    // b is not the active: a plain read names a.
    match qb.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new()) {
        Err(QueryError::NotHosted { active, .. }) => assert_eq!(active.as_deref(), Some("127.0.0.1:7101")),
        other => panic!("expected NotHosted from the standby, got {other:?}"),
    }
    let meta = qb.metadata_for_key::<Utf8>("counts", &key).unwrap();
    assert_eq!((meta.active.as_deref(), meta.standbys.clone()), (Some("127.0.0.1:7101"), vec!["127.0.0.1:7102".to_string()]));
    // A stale read within its bound: the standby answers, saying so. It
    // catches up within seconds, also under exactly-once (where the
    // changelog ends with a commit marker the checkpoint never reaches: the
    // lag counts from the consumer's position past it, not from the
    // checkpoint's periodic refresh every 30 s).
    wait_until("the standby to catch up", Duration::from_secs(10), || {
        qb.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new().allow_stale(0)).is_ok_and(|a| a.value == Some(30))
    });
    let stale = qb.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new().allow_stale(10)).unwrap();
    assert_eq!((stale.copy, stale.lag), (CopyRole::Standby, 0));
    let standby = qb.local_lags().into_iter().find(|l| l.store == "counts" && l.copy == CopyRole::Standby).expect("b's standby copy");
    assert_eq!(standby.lag, Some(0), "a caught-up standby lags 0 records: {standby:?}");
    assert!(stale.position.offset <= on_a.position.offset.max(stale.position.offset));
    // The active stops: b takes over and answers as the active, never
    // from before a's last answer.
    a.stop().unwrap();
    wait_until("b active", TIMEOUT, || qb.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new()).is_ok());
    let on_b = qb.get::<Utf8, U64Be>("counts", &key, &QueryOptions::new().at_least(on_a.position.clone())).unwrap();
    assert_eq!((on_b.value, on_b.copy), (Some(30), CopyRole::Active));
    assert!(on_b.position.offset >= on_a.position.offset);
    assert_eq!(qb.metadata_for_key::<Utf8>("counts", &key).unwrap().active.as_deref(), Some("127.0.0.1:7102"));
    b.stop().unwrap();
}

#[test]
fn window_and_session_stores_answer_fetches_at_their_position() {
    use kstate::{Session, SessionWindows, Windows};
    let Fixture { input, app, state } = fixture("iq-windows", 2);
    let app = builder(&app, &input, state.path())
        .store(StoreDefinition::window("clicks", Windows::tumbling(Duration::from_secs(10)).grace(Duration::from_secs(60))))
        .store(StoreDefinition::session("visits", SessionWindows::with_gap(Duration::from_secs(5)).grace(Duration::from_secs(60))))
        .store(common::store("counts"))
        .commit_interval(Duration::from_millis(200))
        // The record's value is its timestamp (ms).
        .timestamp_extractor(|rec, stream_time| rec.value_str().and_then(|v| v.parse().ok()).or(stream_time).unwrap_or(0))
        .build()
        .unwrap();
    let q = app.queries();
    let running = Running::start_app(app, |ctx, rec| {
        let (key, ts) = (rec.key_str().unwrap_or_default().to_string(), ctx.timestamp().unwrap_or(0));
        let _ = ctx.window_store::<Utf8, U64Be>("clicks")?.update(&key, ts, |_, n| n.unwrap_or(0) + 1)?;
        let _ = ctx.session_store::<Utf8, U64Be>("visits")?.record(&key, ts, |found| found.iter().map(|(_, n)| n).sum::<u64>() + 1)?;
        Ok(())
    });
    wait_until("both tasks running", TIMEOUT, || q.local_lags().iter().filter(|l| l.copy == CopyRole::Active).count() == 6);
    let producer = keyed_producer();
    // Key a: clicks at 1 s, 2 s, 12 s, 30 s; sessions [1 s, 2 s] (gap 5 s), [12 s], [30 s].
    let mut last = 0;
    for ts in [1_000, 2_000, 12_000, 30_000] {
        last = send(&producer, &input, "a", &ts.to_string()).1;
    }
    let bound = QueryOptions::new().after_input(last).wait(Duration::from_secs(10));
    let key = "a".to_string();
    let windows = q.window_fetch::<Utf8, U64Be>("clicks", &key, 0, 60_000, &bound).unwrap();
    assert_eq!(windows.value, vec![(0, 2), (10_000, 1), (30_000, 1)]);
    assert_eq!(windows.copy, CopyRole::Active);
    assert!(windows.position.offset.is_some());
    let some = q.window_fetch::<Utf8, U64Be>("clicks", &key, 5_000, 20_000, &QueryOptions::new()).unwrap();
    assert_eq!(some.value, vec![(10_000, 1)]);
    let sessions = q.session_fetch::<Utf8, U64Be>("visits", &key, &bound).unwrap();
    let s = |start, end| Session { start, end };
    assert_eq!(sessions.value, vec![(s(1_000, 2_000), 2), (s(12_000, 12_000), 1), (s(30_000, 30_000), 1)]);
    assert_eq!(q.window_fetch::<Utf8, U64Be>("clicks", &"nobody".to_string(), 0, 60_000, &QueryOptions::new()).unwrap().value, vec![]);
    // The async forms answer the same.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        assert_eq!(q.window_fetch_async::<Utf8, U64Be>("clicks", &key, 0, 60_000, &bound).await.unwrap().value, windows.value);
        assert_eq!(q.session_fetch_async::<Utf8, U64Be>("visits", &key, &bound).await.unwrap().value, sessions.value);
        let p = q.partition_of::<Utf8>("counts", &key).unwrap();
        let scan = q.partition_range_async::<Utf8, U64Be>("counts", p, &String::new(), &"~".to_string(), 10, &QueryOptions::new()).await.unwrap();
        assert_eq!(scan.value, q.partition_range::<Utf8, U64Be>("counts", p, &String::new(), &"~".to_string(), 10, &QueryOptions::new()).unwrap().value);
        let all = q.prefix_async::<Utf8, U64Be>("counts", b"", 10, &QueryOptions::new()).await.unwrap();
        assert_eq!(all.entries, q.prefix::<Utf8, U64Be>("counts", b"", 10, &QueryOptions::new()).unwrap().entries);
        let p_all = q.partition_prefix_async::<Utf8, U64Be>("counts", p, b"", 10, &QueryOptions::new()).await.unwrap();
        assert_eq!(p_all.position.partition, p);
        let r = q.range_async::<Utf8, U64Be>("counts", &String::new(), &"~".to_string(), 10, &QueryOptions::new()).await.unwrap();
        assert!(r.skipped.is_empty());
    });
    // Metadata routes every kind of store alike.
    let p = q.partition_of::<Utf8>("counts", &key).unwrap();
    assert_eq!((q.partition_of::<Utf8>("clicks", &key).unwrap(), q.partition_of::<Utf8>("visits", &key).unwrap()), (p, p));
    assert_eq!(q.metadata_for_key::<Utf8>("visits", &key).unwrap().partition, p);
    // Each kind of store answers its own kind of query only.
    for e in [
        q.get::<Utf8, U64Be>("clicks", &key, &QueryOptions::new()).unwrap_err(),
        q.window_fetch::<Utf8, U64Be>("visits", &key, 0, 1, &QueryOptions::new()).unwrap_err(),
        q.session_fetch::<Utf8, U64Be>("counts", &key, &QueryOptions::new()).unwrap_err(),
    ] {
        assert!(matches!(e, QueryError::WrongStoreKind { .. }), "{e}");
    }
    running.stop().unwrap();
}

/// Records from a librdkafka producer with its default partitioner
/// (`consistent_random`: CRC32) into an application that expects murmur2
/// are counted as misplaced, and queries then look for those keys in the
/// wrong partition; with `Partitioner::Crc32` none is, and every key is
/// found where its record is.
#[test]
fn input_records_are_checked_against_the_partitioner_that_queries_use() {
    use kstate::Partitioner;
    recorded::metrics();
    // (a snapshot takes a counter's increments since the last one: summed here)
    let seen = std::cell::Cell::new(0.0);
    let mismatches = |topic: &str| {
        seen.set(seen.get() + recorded::metric("kstate_input_partition_mismatches_total", &[("topic", topic)]).unwrap_or(0.0));
        seen.get()
    };
    let Fixture { input, app, state } = fixture("iq-partitioner", 4);
    // librdkafka's default partitioner, as a Rust producer has it.
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", bootstrap()).set("linger.ms", "0").create().unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
    let mut placed = BTreeMap::new();
    for key in &keys {
        placed.insert(key.clone(), send(&producer, &input, key, "x"));
    }
    let wrong = keys.iter().filter(|k| kstate::murmur2_partition(k.as_bytes(), 4) != placed[*k].0).count();
    assert!(wrong > 10, "CRC32 and murmur2 place most keys apart ({wrong} of 40)");
    assert!(keys.iter().all(|k| Partitioner::Crc32.partition(k.as_bytes(), 4) == placed[k].0), "Partitioner::Crc32 is librdkafka's default");

    let run = |name: &str, partitioner: Partitioner| {
        let app = builder(&format!("{app}-{name}"), &input, &state.path().join(name))
            .store(common::store("counts"))
            .commit_interval(Duration::from_millis(100))
            .partitioner(partitioner)
            .build()
            .unwrap();
        let q = app.queries();
        (Running::start_app(app, counter(Arc::default(), Arc::default())), q)
    };
    // Murmur2 (the default) against CRC32-placed records.
    let before = mismatches(&input);
    let (running, q) = run("murmur2", Partitioner::Murmur2);
    wait_until("every record processed", TIMEOUT, || mismatches(&input) - before >= wrong as f64);
    let misses = keys.iter().filter(|k| !matches!(q.get::<Utf8, U64Be>("counts", k, &QueryOptions::new()), Ok(a) if a.value == Some(1))).count();
    assert!(misses >= wrong, "{misses} keys not found where queries look, {wrong} misplaced");
    running.stop().unwrap();
    assert_eq!(mismatches(&input) - before, wrong as f64, "each misplaced record counted once");
    // The producers' partitioner: nothing misplaced, every key found.
    let before = mismatches(&input);
    let (running, q) = run("crc32", Partitioner::Crc32);
    wait_until("every task running", TIMEOUT, || q.local_lags().iter().filter(|l| l.copy == CopyRole::Active).count() == 4);
    for key in &keys {
        let after = QueryOptions::new().after_input_of(input.as_str(), placed[key].1).wait(TIMEOUT);
        // (after_input reads the record's own partition: queries must route there)
        let answer = q.get::<Utf8, U64Be>("counts", key, &after);
        assert!(matches!(&answer, Ok(a) if a.value == Some(1) && a.position.partition == placed[key].0), "{key}: {answer:?}");
    }
    running.stop().unwrap();
    assert_eq!(mismatches(&input), before, "no record misplaced under the producers' partitioner");
}
