//! Source tables (`AppBuilder::table`, README "Tables"), against the real
//! broker: the table's topic is its store's changelog. A table equals its
//! topic's latest values up to the committed offset; a wiped state dir is
//! restored from the topic itself (no `-changelog` topic exists), and the
//! restore stops at the committed offset while the topic runs ahead (the
//! rest is processed as input). A topic that deletes instead of compacting
//! is refused; the processor cannot write a table.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kstate::{Error, Output, ProcessingGuarantee, StoreDefinition};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const PARTITIONS: i32 = 2;

/// One table record: key (`None`: keyless) and value (`None`: tombstone).
type Change = (Option<String>, Option<String>);
/// What the processor heard of the table.
type Heard = Arc<Mutex<Vec<Change>>>;

fn produce_changes(topic: &str, partition: i32, changes: &[Change]) {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap()).set("enable.idempotence", "true").create().unwrap();
    for (key, value) in changes {
        let mut r = BaseRecord::<str, str>::to(topic).partition(partition);
        if let Some(k) = key {
            r = r.key(k);
        }
        if let Some(v) = value {
            r = r.payload(v);
        }
        let mut r = Some(r);
        while let Some(rec) = r.take() {
            if let Err((_, rec)) = producer.send(rec) {
                producer.poll(Duration::from_millis(10));
                r = Some(rec);
            }
        }
    }
    producer.flush(TIMEOUT).unwrap();
}

/// Names change, every 7th change deletes its key. (A compacted topic
/// refuses records without a key.)
fn changes(p: i32, from: usize, n: usize) -> Vec<Change> {
    (from..from + n)
        .map(|i| {
            let key = Some(format!("user{}-{p}", i % 13));
            let value = (i % 7 != 6).then(|| format!("name{i}"));
            (key, value)
        })
        .collect()
}

/// The table the first `n` changes make.
fn table_of(changes: &[Change]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut table = BTreeMap::new();
    for (key, value) in changes {
        if let Some(k) = key {
            apply(&mut table, k.as_bytes(), value.as_deref().map(str::as_bytes));
        }
    }
    table
}

fn topic_exists(topic: &str) -> bool {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    let metadata = consumer.fetch_metadata(None, TIMEOUT).unwrap();
    metadata.topics().iter().any(|t| t.name() == topic && !t.partitions().is_empty())
}

#[test]
fn a_source_table_is_restored_from_its_own_topic_up_to_the_committed_offset() {
    restored_from_its_own_topic(ProcessingGuarantee::AtLeastOnce);
}

#[test]
fn under_exactly_once_a_source_table_is_restored_from_its_own_topic_up_to_the_committed_offset() {
    restored_from_its_own_topic(ProcessingGuarantee::ExactlyOnce);
}

fn restored_from_its_own_topic(guarantee: ProcessingGuarantee) {
    let Fixture { input, app, state } = fixture("table", PARTITIONS);
    let users = unique("table-users");
    create_topic(&users, PARTITIONS, &[("cleanup.policy", "compact")]);
    let out = unique("table-out");
    create_topic(&out, PARTITIONS, &[]);
    let mut all: Vec<Vec<Change>> = Vec::new();
    for p in 0..PARTITIONS {
        let c = changes(p, 0, 200);
        produce_changes(&users, p, &c);
        all.push(c);
    }
    // The processor looks clicks up in the table and counts the updates it hears of.
    let updates: Heard = Arc::default();
    let start = |restores: Restores, updates: Heard| {
        let (users_topic, out_topic) = (users.clone(), out.clone());
        Running::start(
            builder(&app, &input, state.path()).table(&users, common::store("users")).restore_listener(restores).commit_interval(Duration::from_millis(200)).processing_guarantee(guarantee),
            move |ctx, rec| {
                if rec.topic == users_topic {
                    // (a table's record: the store has it already)
                    let now = rec.key.map(|k| ctx.store("users")?.get(k)).transpose()?.flatten();
                    assert_eq!(now.as_deref(), rec.value, "the table holds the record's value when the processor hears of it");
                    updates.lock().unwrap().push((rec.key.map(|k| String::from_utf8_lossy(k).into()), rec.value_str().map(Into::into)));
                    return Ok::<(), Error>(());
                }
                let key = rec.key.unwrap_or_default();
                let name = ctx.store("users")?.get(key)?.unwrap_or_else(|| b"-".to_vec());
                ctx.send(Output::to(&out_topic).key(key).value(&name).partition(rec.partition))
            },
        )
    };
    let first = Restores::default();
    let running = start(first.clone(), updates.clone());
    wait_all_committed_at(&bootstrap(), &app, &users, PARTITIONS, TIMEOUT);
    running.stop().unwrap();
    let keyed = |c: &[Change]| c.iter().filter(|(k, _)| k.is_some()).count();
    assert_eq!(updates.lock().unwrap().len(), all.iter().map(|c| keyed(c)).sum::<usize>(), "every keyed record reached the processor once");
    assert!(!topic_exists(&kstate::changelog_topic(&app, "users")), "a table has no -changelog topic");
    for p in 0..PARTITIONS {
        let (data, checkpoint) = read_store_dir(state.path(), &app, "users", p);
        assert_same_state(&data, &table_of(&all[p as usize]), "the table after processing its topic");
        assert_eq!(checkpoint, Some(199), "partition {p}: checkpoint at the last record processed");
        // `kstate verify` compares the table with its own topic.
        let report = kstate::admin::verify(state.path(), &app, "users", p, &kstate::admin::Kafka::new(bootstrap())).unwrap();
        assert_eq!((report.changelog_topic.as_str(), report.difference_count()), (users.as_str(), 0), "{report:?}");
    }

    // A lost disk: the table comes back from its topic. More changes arrive
    // meanwhile: the restore stops at the committed offset, the task
    // processes the rest as input (the processor hears of those only).
    std::fs::remove_dir_all(state.path().join(&app)).unwrap();
    for p in 0..PARTITIONS {
        let c = changes(p, 200, 50);
        produce_changes(&users, p, &c);
        all[p as usize].extend(c);
    }
    // A stream record after them all: joined with the newest table.
    produce_changes(&input, 0, &[(Some("user0-0".into()), Some("click".into()))]);
    let second = Restores::default();
    let updates2: Heard = Arc::default();
    let running = start(second.clone(), updates2.clone());
    wait_until("both partitions restored", TIMEOUT, || second.ended() >= PARTITIONS as usize);
    assert_eq!(second.restored_records(), 2 * 200, "the restore replayed the topic up to the committed offset, not past it");
    for start in second.starts.lock().unwrap().iter() {
        assert_eq!(start.changelog_topic, users, "restored from the table's own topic");
        assert_eq!(start.end_offset, 200, "ends at the committed offset");
    }
    wait_all_committed_at(&bootstrap(), &app, &users, PARTITIONS, TIMEOUT);
    wait_until("the click joined", TIMEOUT, || !read_partition(&out, 0).is_empty());
    running.stop().unwrap();
    let later: usize = all.iter().map(|c| keyed(&c[200..])).sum();
    assert_eq!(updates2.lock().unwrap().len(), later, "only the records past the commit were processed again");
    for p in 0..PARTITIONS {
        let (data, checkpoint) = read_store_dir(state.path(), &app, "users", p);
        assert_same_state(&data, &table_of(&all[p as usize]), "the table after a restore and more changes");
        assert_eq!(checkpoint, Some(249));
    }
    let joined = read_partition(&out, 0);
    let expected = table_of(&all[0]).get(b"user0-0".as_slice()).cloned().unwrap_or_else(|| b"-".to_vec());
    assert_eq!(joined.last().unwrap().2.as_deref(), Some(expected.as_slice()), "the click saw the newest name");
}

#[test]
fn a_table_topic_that_deletes_instead_of_compacting_is_refused_at_start() {
    let Fixture { input, app, state } = fixture("table-delete", 1);
    let users = unique("table-delete-users");
    create_topic(&users, 1, &[("cleanup.policy", "delete")]);
    let app = builder(&app, &input, state.path()).table(&users, common::store("users")).build().unwrap();
    match app.run(|_, _| Ok::<(), Error>(())) {
        Err(Error::TableTopic { topic, problem }) => {
            assert_eq!(topic, users);
            assert!(problem.contains("compact"), "{problem}");
        }
        other => panic!("expected Error::TableTopic, got {other:?}"),
    }
}

#[test]
fn bad_table_definitions_are_config_errors() {
    let base = || kstate::App::builder().application_id("t").bootstrap_servers("localhost:1").state_dir("/tmp/x").input_topic("in");
    let windowed = StoreDefinition::window("w", kstate::Windows::tumbling(Duration::from_secs(1)));
    let cases = [
        (base().table("users", windowed), "key-value"),
        (base().table("users", common::store("a")).table("users", common::store("b")), "one store per table topic"),
        (base().table("in", common::store("a")), "input topic"),
        (base().table("users", common::store("a")).kafka_config("auto.offset.reset", "latest"), "earliest"),
        (base().table("users", common::store("a").schema_version(2)), "schema"),
    ];
    for (builder, why) in cases {
        match builder.build() {
            Err(Error::Config(msg)) => assert!(msg.contains(why), "{msg} should say {why}"),
            other => panic!("expected a config error about {why}, got {:?}", other.map(|_| ())),
        }
    }
}

/// The test driver runs tables as the runtime does: updates before the
/// processor hears of them, old and new values, tombstones, table first
/// on equal timestamps, no writes by the processor.
#[test]
fn the_driver_applies_table_records_and_refuses_writes_to_a_table() {
    struct Lookup;
    impl kstate::Processor for Lookup {
        fn process(&mut self, ctx: &mut kstate::ProcessorContext<'_>, record: &kstate::Record<'_>) -> Result<(), kstate::ProcessorError> {
            let key = record.key.unwrap_or_default();
            if record.value == Some(b"write".as_slice()) {
                ctx.store("users")?.put(key, b"mine")?;
            }
            let name = ctx.store("users")?.get(key)?.unwrap_or_else(|| b"-".to_vec());
            ctx.send(Output::to("out").key(key).value(&name))?;
            Ok(())
        }
        fn on_table_update(&mut self, ctx: &mut kstate::ProcessorContext<'_>, update: &kstate::TableUpdate<'_>) -> Result<(), kstate::ProcessorError> {
            let change = format!("{:?}->{:?}", update.old().map(String::from_utf8_lossy), update.new_value().map(String::from_utf8_lossy));
            ctx.send(Output::to("changes").key(update.key()).value(change.as_bytes()))?;
            Ok(())
        }
    }
    let app = kstate::App::builder().input_topic("clicks").table("users", common::store("users")).max_task_idle(Duration::from_secs(1));
    let mut d = kstate::TestDriver::builder(app).processor(|_| Lookup).unwrap();
    d.send(Output::to("users").value(b"nobody").partition(0).timestamp(5)).unwrap(); // no key: skipped
    d.input("users", b"u", b"ann", 10).unwrap();
    d.input("users", b"u", b"bob", 20).unwrap();
    // Same timestamp on both: the table's record goes first.
    d.input("clicks", b"u", b"c1", 30).unwrap();
    d.input("users", b"u", b"cy", 30).unwrap();
    d.send(Output::to("users").key(b"u").timestamp(40)).unwrap();
    d.input("clicks", b"u", b"c2", 50).unwrap();
    d.input("users", b"x", b"xa", 60).unwrap(); // (held: c2's turn has come)
    let values = |topic: &str| d.outputs(topic).into_iter().map(|r| String::from_utf8(r.value.unwrap()).unwrap()).collect::<Vec<_>>();
    assert_eq!(values("out"), ["cy", "-"], "each click sees the table as of its time, a tombstone deleted");
    assert_eq!(
        values("changes"),
        ["None->Some(\"ann\")", "Some(\"ann\")->Some(\"bob\")", "Some(\"bob\")->Some(\"cy\")", "Some(\"cy\")->None"]
    );
    d.commit().unwrap();
    d.crash_and_restart().unwrap();
    let users = d.store("users", 0).unwrap();
    assert_eq!(users.checkpoint(), Some(4), "a table's checkpoint is the offset of its last record processed");
    assert_eq!(users.get(b"u").unwrap(), None);
    assert!(d.changelog("users", 0).unwrap().is_empty(), "nothing was sent for the table");
    d.input("clicks", b"u", b"write", 70).unwrap();
    match d.input("users", b"v", b"vic", 80) {
        Err(Error::Processor { source, .. }) => assert!(source.to_string().contains("changes only through its topic"), "{source}"),
        other => panic!("a write to a table must fail, got {other:?}"),
    }
}

/// The README's table-table outer join on two source tables: each update
/// of either side sends the key's join result, a tombstone once neither
/// side has the key.
#[test]
fn a_table_table_outer_join_of_two_source_tables_follows_both_sides() {
    let app = kstate::App::builder()
        .table("users", common::store("users"))
        .table("accounts", common::store("accounts"))
        .max_task_idle(Duration::ZERO);
    let mut d = kstate::TestDriver::builder(app)
        .closure(|ctx, record| {
            let Some(key) = record.key else { return Ok(()) };
            let (user, account) = (ctx.store("users")?.get(key)?, ctx.store("accounts")?.get(key)?);
            let output = Output::to("user-accounts").key(key);
            match (user, account) {
                (None, None) => ctx.send(output),
                (u, a) => ctx.send(output.value(&[u.as_deref().unwrap_or(b"-"), b"|", a.as_deref().unwrap_or(b"-")].concat())),
            }
        })
        .unwrap();
    d.input("users", b"k", b"ann", 1).unwrap();
    d.input("accounts", b"k", b"acc1", 2).unwrap();
    d.input("users", b"k", b"bob", 3).unwrap();
    d.send(Output::to("users").key(b"k").timestamp(4)).unwrap();
    d.send(Output::to("accounts").key(b"k").timestamp(5)).unwrap();
    let got: Vec<Option<String>> = d.outputs("user-accounts").into_iter().map(|r| r.value.map(|v| String::from_utf8(v).unwrap())).collect();
    let expected = [Some("ann|-"), Some("ann|acc1"), Some("bob|acc1"), Some("-|acc1"), None];
    assert_eq!(got, expected.map(|e| e.map(String::from)));
}

/// A standby's copy of a table follows the topic only up to the group's
/// committed offset: while the active task stalls and the topic runs
/// ahead, the standby holds exactly the committed prefix, and catches up
/// once the commits move again.
#[test]
fn a_standby_of_a_table_stops_at_the_committed_offset() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use kstate::CopyRole;
    let Fixture { input, app, state } = fixture("table-standby", 1);
    let other_state = tempfile::tempdir().unwrap();
    let users = unique("table-standby-users");
    create_topic(&users, 1, &[("cleanup.policy", "compact")]);
    let stalled = Arc::new(AtomicBool::new(false));
    let start = |dir: &std::path::Path| {
        let app = builder(&app, &input, dir)
            .table(&users, common::store("users"))
            .num_standby_replicas(1)
            .commit_interval(Duration::from_millis(100))
            .build()
            .unwrap();
        let queries = app.queries();
        let stalled = stalled.clone();
        let running = Running::start_app(app, move |_, _| {
            // The active task stalls mid-record (no commit) while asked to.
            while stalled.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok::<(), Error>(())
        });
        (running, queries)
    };
    let (a, qa) = start(state.path());
    wait_until("the active task running", TIMEOUT, || qa.local_lags().iter().any(|l| l.copy == CopyRole::Active));
    let (b, qb) = start(other_state.path());
    let standby_position = || {
        [&qa, &qb].iter().flat_map(|q| q.local_lags()).find(|l| l.copy == CopyRole::Standby && l.store == "users").map(|l| l.position)
    };
    wait_until("a standby copy of the table", TIMEOUT, || standby_position().is_some());
    let first = changes(0, 0, 50);
    produce_changes(&users, 0, &first);
    wait_all_committed_at(&bootstrap(), &app, &users, 1, TIMEOUT);
    wait_until("the standby at the committed offset", TIMEOUT, || standby_position() == Some(Some(49)));

    stalled.store(true, Ordering::Relaxed);
    produce_changes(&users, 0, &changes(0, 50, 50));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(committed_offset_at(&bootstrap(), &app, &users, 0), Some(50), "the active task stalls before committing more");
    assert_eq!(standby_position(), Some(Some(49)), "the standby applied nothing past the committed offset");
    let stale = kstate::QueryOptions::new().allow_stale(u64::MAX);
    let standby = if qa.local_lags().iter().any(|l| l.copy == CopyRole::Standby) { &qa } else { &qb };
    for (key, value) in table_of(&first) {
        let key = String::from_utf8(key).unwrap();
        let answer = standby.get::<kstate::codec::Utf8, kstate::codec::RawBytes>("users", &key, &stale).unwrap();
        assert_eq!(answer.copy, CopyRole::Standby);
        assert_eq!(answer.value, Some(value), "key {key}: the standby holds the committed prefix only");
    }

    stalled.store(false, Ordering::Relaxed);
    wait_all_committed_at(&bootstrap(), &app, &users, 1, TIMEOUT);
    wait_until("the standby caught up with the commits", TIMEOUT, || standby_position() == Some(Some(99)));

    // The active instance leaves right after a burst: its last commit
    // covers records the standby has not applied (its limit is read once
    // a second). The promoted copy restores them from the topic.
    let all: Vec<Change> = changes(0, 0, 150);
    stalled.store(true, Ordering::Relaxed);
    produce_changes(&users, 0, &all[100..]);
    std::thread::sleep(Duration::from_millis(300));
    let a_active = qa.local_lags().iter().any(|l| l.copy == CopyRole::Active);
    let (leaving, staying, q) = if a_active { (a, b, qb) } else { (b, a, qa) };
    stalled.store(false, Ordering::Relaxed);
    wait_all_committed_at(&bootstrap(), &app, &users, 1, TIMEOUT);
    leaving.stop().unwrap();
    wait_until("the standby promoted", TIMEOUT, || q.local_lags().iter().any(|l| l.copy == CopyRole::Active && l.store == "users"));
    for (key, value) in table_of(&all) {
        let key = String::from_utf8(key).unwrap();
        let answer = q.get::<kstate::codec::Utf8, kstate::codec::RawBytes>("users", &key, &kstate::QueryOptions::new()).unwrap();
        assert_eq!(answer.value, Some(value), "key {key}: the promoted copy holds every committed record");
    }
    staying.stop().unwrap();
}

/// The child instance of the tables crash loop: settings
/// `app \t input \t table topic \t state \t eos|alos`. It counts, per key,
/// the table updates the processor hears of.
#[test]
#[ignore = "child process of the tables crash loop"]
fn tables_child() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    let [app_id, input, users, state, guarantee]: [&str; 5] = settings.split('\t').collect::<Vec<_>>().try_into().unwrap();
    init_tracing();
    let guarantee = if guarantee == "eos" { ProcessingGuarantee::ExactlyOnce } else { ProcessingGuarantee::AtLeastOnce };
    let app = builder(app_id, input, std::path::Path::new(state))
        .table(users, common::store("users"))
        .store(common::store("heard"))
        .processing_guarantee(guarantee)
        .commit_interval(Duration::from_millis(50))
        .transaction_timeout(Duration::from_secs(3))
        .kafka_config("group.instance.id", format!("{app_id}-child"))
        .build()
        .unwrap();
    stop_when_stdin_closes(app.shutdown_handle());
    let users = users.to_string();
    app.run(move |ctx, rec| {
        if rec.topic == users {
            let mut heard = ctx.typed_store::<kstate::codec::RawBytes, kstate::codec::U64Be>("heard")?;
            let key = rec.key.unwrap_or_default().to_vec();
            let n = heard.get(&key)?.unwrap_or(0) + 1;
            heard.put(&key, &n)?;
        }
        Ok::<(), Error>(())
    })
    .unwrap();
}

/// SIGKILLs at random points while the table's topic is written: the
/// table ends equal to its topic, checkpointed at its end, `kstate verify`
/// finds no difference, and the processor heard of each update once under
/// exactly-once (at least once otherwise).
fn tables_survive_a_crash_loop(guarantee: &str) {
    use rand::{Rng, SeedableRng};
    let Fixture { input, app, state } = fixture("table-crash", PARTITIONS);
    let users = unique("table-crash-users");
    create_topic(&users, PARTITIONS, &[("cleanup.policy", "compact")]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let all: Vec<Vec<Change>> = (0..PARTITIONS).map(|p| changes(p, 0, 2_000)).collect();
    let log = state.path().join("child.log");
    let settings = format!("{app}\t{input}\t{users}\t{}\t{guarantee}", state.path().display());
    let spawn = || ChildInstance::spawn("t", "tables_child", settings.clone(), log.clone());
    for round in 0..4 {
        let child = spawn();
        for p in 0..PARTITIONS {
            produce_changes(&users, p, &all[p as usize][round * 500..(round + 1) * 500]);
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(600..2000)));
        child.kill(); // SIGKILL, mid-commit or mid-restore
        eprintln!("round {round}: killed");
    }
    let last = spawn();
    // One more record each, which only this instance can commit: it ran
    // (restored) before the check.
    let mut all = all;
    for p in 0..PARTITIONS {
        let more = changes(p, 2_000, 1);
        produce_changes(&users, p, &more);
        all[p as usize].extend(more);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !(0..PARTITIONS).all(|p| committed_offset(&app, &users, p) == Some(2_001)) {
        assert!(std::time::Instant::now() < deadline, "not every table record committed; the instance's log ends with:\n{}", last.tail());
        std::thread::sleep(Duration::from_millis(200));
    }
    last.stop();
    let kafka = kstate::admin::Kafka::new(bootstrap());
    for p in 0..PARTITIONS {
        let (data, checkpoint) = read_store_dir(state.path(), &app, "users", p);
        assert_same_state(&data, &table_of(&all[p as usize]), "the table after the crash loop");
        assert_eq!(checkpoint, Some(2_000), "partition {p}: checkpointed at the topic's end");
        let report = kstate::admin::verify(state.path(), &app, "users", p, &kafka).unwrap();
        assert_eq!(report.difference_count(), 0, "{report:?}");
    }
    let heard = changelog_state_at(&bootstrap(), &app, "heard", PARTITIONS);
    let mut expected: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for (key, _) in all.iter().flatten() {
        *expected.entry(key.clone().unwrap().into_bytes()).or_default() += 1;
    }
    for (key, n) in expected {
        let got = heard.get(&key).map_or(0, |v| u64::from_be_bytes(v.as_slice().try_into().unwrap()));
        match guarantee {
            "eos" => assert_eq!(got, n, "{}: each update heard once", String::from_utf8_lossy(&key)),
            _ => assert!(got >= n, "{}: every update heard ({got} < {n})", String::from_utf8_lossy(&key)),
        }
    }
}

#[test]
fn tables_survive_a_crash_loop_exactly_once() {
    tables_survive_a_crash_loop("eos");
}

#[test]
fn tables_survive_a_crash_loop_at_least_once() {
    tables_survive_a_crash_loop("alos");
}

/// `table_values`: a value the table's codec refuses is skipped under
/// `Continue` (the key keeps its value, the processor does not hear of it)
/// and stops the driver under `Fail`.
#[test]
fn the_driver_skips_or_fails_on_a_table_value_its_codec_refuses() {
    use kstate::codec::U64Be;
    use kstate::ProcessingDecision;
    for on_bad in [ProcessingDecision::Continue, ProcessingDecision::Fail] {
        let app = kstate::App::builder()
            .input_topic("clicks")
            .table("prices", common::store("prices").table_values::<U64Be>(on_bad))
            .max_task_idle(Duration::ZERO);
        let heard = Arc::new(Mutex::new(0));
        let h = heard.clone();
        let mut d = kstate::TestDriver::builder(app)
            .closure(move |_, rec| {
                if rec.topic == "prices" {
                    *h.lock().unwrap() += 1;
                }
                Ok::<(), Error>(())
            })
            .unwrap();
        d.input("prices", b"p", &7u64.to_be_bytes(), 1).unwrap();
        let bad = d.input("prices", b"p", b"not a u64", 2);
        match on_bad {
            ProcessingDecision::Continue => {
                bad.unwrap();
                d.input("prices", b"q", &9u64.to_be_bytes(), 3).unwrap();
                let prices = d.store_entries::<kstate::codec::Utf8, U64Be>("prices").unwrap();
                assert_eq!(prices, [("p".to_string(), 7), ("q".to_string(), 9)], "the bad value was skipped");
                assert_eq!(*heard.lock().unwrap(), 2, "the processor did not hear of the bad record");
            }
            _ => {
                match bad {
                    Err(Error::BadRecord { topic, offset, .. }) => assert_eq!((topic.as_str(), offset), ("prices", 1)),
                    other => panic!("expected Error::BadRecord, got {other:?}"),
                }
                assert_eq!(*heard.lock().unwrap(), 1, "the processor did not hear of the bad record");
            }
        }
    }
}

/// A bad table value on the broker, skipped under `Continue` in processing
/// and again in the restore from the topic after the state dir is lost.
#[test]
fn a_bad_table_value_is_skipped_in_processing_and_in_the_restore() {
    use kstate::codec::U64Be;
    let Fixture { input, app, state } = fixture("table-bad", 1);
    let prices = unique("table-bad-prices");
    create_topic(&prices, 1, &[("cleanup.policy", "compact")]);
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    // A tombstone passes the check; the bad value is the last record.
    for (key, value) in [("a", Some(1u64.to_be_bytes().to_vec())), ("b", Some(2u64.to_be_bytes().to_vec())), ("d", Some(4u64.to_be_bytes().to_vec())), ("d", None), ("c", Some(3u64.to_be_bytes().to_vec())), ("a", Some(b"bad".to_vec()))] {
        let record = BaseRecord::<str, [u8]>::to(&prices).partition(0).key(key);
        producer.send(match &value {
            Some(v) => record.payload(v),
            None => record,
        }).unwrap();
    }
    producer.flush(TIMEOUT).unwrap();
    let start = |restores: Restores| {
        let table = common::store("prices").table_values::<U64Be>(kstate::ProcessingDecision::Continue);
        Running::start(builder(&app, &input, state.path()).table(&prices, table).restore_listener(restores), |_, _| Ok::<(), Error>(()))
    };
    let expected: BTreeMap<Vec<u8>, Vec<u8>> =
        [("a", 1u64), ("b", 2), ("c", 3)].into_iter().map(|(k, v)| (k.as_bytes().to_vec(), v.to_be_bytes().to_vec())).collect();
    let running = start(Restores::default());
    wait_all_committed_at(&bootstrap(), &app, &prices, 1, TIMEOUT);
    running.stop().unwrap();
    let (data, checkpoint) = read_store_dir(state.path(), &app, "prices", 0);
    assert_same_state(&data, &expected, "processing skipped the bad value");
    assert_eq!(checkpoint, Some(5), "the skipped record moved the checkpoint");
    std::fs::remove_dir_all(state.path().join(&app)).unwrap();
    let restores = Restores::default();
    let running = start(restores.clone());
    wait_until("the restore", TIMEOUT, || restores.ended() >= 1);
    running.stop().unwrap();
    assert_eq!(restores.restored_records(), 6);
    let (data, checkpoint) = read_store_dir(state.path(), &app, "prices", 0);
    assert_same_state(&data, &expected, "the restore skipped the bad value too");
    assert_eq!(checkpoint, Some(5));
}
