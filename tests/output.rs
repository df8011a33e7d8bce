//! Output records: what a processor sends with `ProcessorContext::send`
//! reaches its topic with key, value, headers, timestamp and partition;
//! an output that cannot be delivered is a typed error naming its topic;
//! and under at-least-once a crash never loses an output (a child process
//! killed with SIGKILL again and again, then the output topic is compared
//! with the input).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use kstate::{Error, Output, StoreDefinition, TimestampType};
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers as _, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message};

/// Every record of `topic`: (partition, key, value, timestamp, headers).
type OutRecord = (i32, Vec<u8>, Option<Vec<u8>>, Option<i64>, Vec<(String, Option<Vec<u8>>)>);

fn read_all(topic: &str, partitions: i32) -> Vec<OutRecord> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let ends: Vec<i64> = (0..partitions).map(|p| end_offset_at(&bootstrap(), topic, p)).collect();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut next: Vec<i64> = vec![0; partitions as usize];
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while (0..partitions as usize).any(|p| next[p] < ends[p]) {
        assert!(std::time::Instant::now() < deadline, "reading {topic} timed out at {next:?} of {ends:?}");
        let Some(m) = consumer.poll(Duration::from_millis(200)) else { continue };
        let m = m.unwrap();
        let headers = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        next[m.partition() as usize] = m.offset() + 1;
        out.push((m.partition(), m.key().unwrap_or_default().to_vec(), m.payload().map(<[u8]>::to_vec), m.timestamp().to_millis(), headers));
    }
    out
}

#[test]
fn outputs_reach_their_topic_with_key_value_headers_timestamp_and_partition() {
    let Fixture { input, app, state } = fixture("output", 2);
    let out_topic = unique("output-out");
    // Timestamps from the past below: no time-based retention.
    create_topic(&out_topic, 3, &[("retention.ms", "-1")]);
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 60_000;
    // Input records with headers and a producer timestamp.
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    for i in 0..4i64 {
        let headers = OwnedHeaders::new().insert(Header { key: "trace", value: Some(format!("t{i}").as_bytes()) });
        let key = format!("k{i}");
        let record = BaseRecord::<str, str>::to(&input)
            .partition((i % 2) as i32)
            .key(&key)
            .payload("v")
            .timestamp(base + i)
            .headers(headers);
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(TIMEOUT).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let running = Running::start(builder(&app, &input, state.path()).store(StoreDefinition::new("s")), {
        let (out_topic, seen) = (out_topic.clone(), seen.clone());
        move |ctx, rec| -> Result<(), Error> {
            let trace = rec.headers.last("trace").flatten().unwrap_or_default().to_vec();
            seen.lock().unwrap().push((rec.timestamp, rec.timestamp_type, rec.headers.len()));
            let key = rec.key.unwrap();
            ctx.store("s")?.put(key, b"1")?;
            // Default partition (by key) and timestamp (the input's).
            ctx.send(Output::to(&out_topic).key(key).value(b"by-key").header("trace", &trace).null_header("empty"))?;
            // Explicit partition and timestamp.
            ctx.send(Output::to(&out_topic).key(key).value(b"pinned").partition(2).timestamp(base - 7))?;
            Ok(())
        }
    });
    wait_all_committed_at(&bootstrap(), &app, &input, 2, TIMEOUT);
    running.stop().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    for (ts, kind, headers) in &seen {
        assert!(ts.is_some_and(|t| t >= base) && *kind == TimestampType::CreateTime && *headers == 1, "{seen:?}");
    }
    let out = read_all(&out_topic, 3);
    assert_eq!(out.len(), 8, "{out:?}");
    for i in 0..4i64 {
        let key = format!("k{i}").into_bytes();
        let by_key: Vec<_> = out.iter().filter(|r| r.1 == key && r.2.as_deref() == Some(&b"by-key"[..])).collect();
        assert_eq!(by_key.len(), 1, "{out:?}");
        let (_, _, _, ts, headers) = by_key[0];
        assert_eq!(*ts, Some(base + i), "the input's timestamp");
        assert_eq!(
            headers,
            &vec![("trace".to_string(), Some(format!("t{i}").into_bytes())), ("empty".to_string(), None)],
            "headers in order"
        );
        let pinned: Vec<_> = out.iter().filter(|r| r.1 == key && r.2.as_deref() == Some(&b"pinned"[..])).collect();
        assert_eq!((pinned.len(), pinned[0].0, pinned[0].3), (1, 2, Some(base - 7)), "{out:?}");
    }
    // Records with the same key land in one partition (murmur2 by key).
    let by_key: BTreeMap<&[u8], BTreeSet<i32>> = out.iter().filter(|r| r.2.as_deref() == Some(&b"by-key"[..])).fold(
        BTreeMap::new(),
        |mut m, r| {
            m.entry(r.1.as_slice()).or_default().insert(r.0);
            m
        },
    );
    assert!(by_key.values().all(|p| p.len() == 1));
}

#[test]
fn an_output_that_cannot_be_delivered_ends_run_with_an_error_naming_its_topic() {
    // A topic that does not exist (the test broker does not create topics
    // on demand): the brokers refuse it, and the commit fails.
    let Fixture { input, app, state } = fixture("output-missing", 1);
    produce(&input, &[(0, b"k".to_vec(), Some(b"v".to_vec()))]);
    let missing = unique("no-such-topic");
    let target = missing.clone();
    let running = Running::start(builder(&app, &input, state.path()).kafka_config("message.timeout.ms", "5000"), move |ctx, rec| {
        ctx.send(Output::to(&target).key(rec.key.unwrap()).value(b"x"))
    });
    wait_until("run to end with the output's error", Duration::from_secs(60), || running.is_finished());
    let err = running.stop().unwrap_err();
    match &err {
        Error::OutputDelivery { topic, .. } => assert_eq!(topic, &missing, "{err}"),
        other => panic!("expected OutputDelivery, got {other:?}"),
    }
    assert!(err.to_string().contains(&missing), "{err}");
    assert_eq!(committed_offset(&app, &input, 0), None, "the input was committed without its output");

    // A record larger than the producer allows: refused at `send`; the
    // processor's `?` hands the same typed error to `run`.
    let Fixture { input, app, state } = fixture("output-large", 1);
    let out_topic = unique("output-large-out");
    create_topic(&out_topic, 1, &[]);
    produce(&input, &[(0, b"k".to_vec(), Some(b"v".to_vec()))]);
    let big = vec![0u8; 3 << 20];
    let target = out_topic.clone();
    let running = Running::start(builder(&app, &input, state.path()), move |ctx, _| ctx.send(Output::to(&target).value(&big)));
    wait_until("run to end with the output's error", Duration::from_secs(60), || running.is_finished());
    let err = running.stop().unwrap_err();
    match &err {
        Error::OutputDelivery { topic, .. } => assert_eq!(topic, &out_topic, "{err}"),
        other => panic!("expected OutputDelivery, got {other:?}"),
    }
    // The same when the processor ignores the error of `send` and a handler
    // would skip the record: the commit does not go past the lost output.
    let Fixture { input, app, state } = fixture("output-ignored", 1);
    produce(&input, &[(0, b"k".to_vec(), Some(b"v".to_vec()))]);
    let (big, target) = (vec![0u8; 3 << 20], out_topic.clone());
    let skipping = builder(&app, &input, state.path()).processing_exception_handler(|_, _| kstate::ProcessingDecision::Continue);
    let running = Running::start(skipping, move |ctx, _| {
        let _ = ctx.send(Output::to(&target).value(&big));
        Ok(())
    });
    wait_until("run to end with the output's error", Duration::from_secs(60), || running.is_finished());
    let err = running.stop().unwrap_err();
    match &err {
        Error::OutputDelivery { topic, .. } => assert_eq!(topic, &out_topic, "{err}"),
        other => panic!("expected OutputDelivery, got {other:?}"),
    }
    assert_eq!(committed_offset(&app, &input, 0), None, "the input was committed past a lost output");
}

const PARTITIONS: i32 = 3;
const PER_PARTITION: usize = 3000;
const ROUNDS: usize = 8;

fn crash_builder(app: &str, input: &str, state: &Path) -> kstate::AppBuilder {
    builder(app, input, state)
        .commit_interval(Duration::from_millis(30))
        .kafka_config("group.instance.id", format!("{app}-member"))
        // Outputs linger in the producer until a commit flushes them: a
        // commit that did not wait for them would lose them to a kill.
        .kafka_config("linger.ms", "500")
}

/// Sends every input value to the output topic (no store: a commit has only
/// outputs to wait for).
fn echo(out_topic: String) -> impl FnMut(&mut kstate::ProcessorContext<'_>, &kstate::Record<'_>) -> Result<(), Error> + Send + 'static {
    move |ctx, rec| {
        if rec.offset % 2 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        ctx.send(Output::to(&out_topic).key(rec.key.unwrap()).value(rec.value.unwrap()))
    }
}

/// The child of the crash loop: runs until killed.
#[test]
#[ignore = "child process of the output crash loop"]
fn output_crash_child() {
    let Ok(settings) = std::env::var("KSTATE_OUTPUT_CHILD") else { return };
    let [app, input, out, state]: [&str; 4] = settings.split('\t').collect::<Vec<_>>().try_into().unwrap();
    init_tracing();
    crash_builder(app, input, Path::new(state)).build().unwrap().run(echo(out.to_string())).unwrap();
}

#[test]
fn under_at_least_once_a_crash_never_loses_an_output() {
    let Fixture { input, app, state } = fixture("output-crash", PARTITIONS);
    let out_topic = unique("output-crash-out");
    create_topic(&out_topic, PARTITIONS, &[]);
    let records: Vec<KeyedRecord> = (0..PER_PARTITION * PARTITIONS as usize)
        .map(|i| ((i % PARTITIONS as usize) as i32, format!("k{}", i % 97).into_bytes(), Some(format!("v{i}").into_bytes())))
        .collect();
    produce(&input, &records);
    let exe = std::env::current_exe().unwrap();
    let log = state.path().join("child.log");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut mid_stream = 0;
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .args(["output_crash_child", "--exact", "--ignored", "--nocapture"])
            .env("KSTATE_OUTPUT_CHILD", format!("{app}\t{input}\t{out_topic}\t{}", state.path().display()))
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1500)));
        assert!(child.try_wait().unwrap().is_none(), "child exited on its own; see {}", log.display());
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Every input record below the committed offsets has its output.
        let committed: Vec<i64> = (0..PARTITIONS).map(|p| committed_offset(&app, &input, p).unwrap_or(0)).collect();
        let out: BTreeSet<Vec<u8>> = read_all(&out_topic, PARTITIONS).into_iter().filter_map(|r| r.2).collect();
        for p in 0..PARTITIONS {
            let of_p: Vec<&KeyedRecord> = records.iter().filter(|r| r.0 == p).collect();
            for (offset, r) in of_p.iter().enumerate().take(committed[p as usize] as usize) {
                let value = r.2.as_ref().unwrap();
                assert!(out.contains(value), "round {round}: input {p}@{offset} is committed but its output is missing");
            }
        }
        eprintln!("round {round}: committed {committed:?}");
        if committed.iter().any(|&c| c < PER_PARTITION as i64) {
            mid_stream += 1;
        }
    }
    assert!(mid_stream >= ROUNDS / 2, "only {mid_stream} of {ROUNDS} kills landed before the input was done");
    let running = Running::start(crash_builder(&app, &input, state.path()), echo(out_topic.clone()));
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(120));
    running.stop().unwrap();
    let out = read_all(&out_topic, PARTITIONS);
    let values: Vec<Vec<u8>> = out.into_iter().filter_map(|r| r.2).collect();
    let distinct: BTreeSet<&Vec<u8>> = values.iter().collect();
    let expected: BTreeSet<&Vec<u8>> = records.iter().filter_map(|r| r.2.as_ref()).collect();
    assert_eq!(distinct, expected, "every input has its output, and nothing else is there");
    eprintln!("{} outputs for {} inputs: {} duplicates after {ROUNDS} kills", values.len(), records.len(), values.len() - records.len());
}
