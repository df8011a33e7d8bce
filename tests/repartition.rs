//! Repartition topics against the real broker: a word count from a topic of
//! lines (keyed by line, not by word) re-keys each word through a
//! repartition topic to the task that counts it. Under exactly-once, across
//! SIGKILLs of the instance, the counts equal a model of the input (each
//! line counted once), and the repartition topic is purged below the
//! committed offsets. Bad declarations are typed errors.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use kstate::codec::{U64Be, Utf8};
use kstate::{AppBuilder, Error, ProcessingGuarantee, ProcessorContext, Record, StoreDefinition};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

const PARTITIONS: i32 = 3;

/// The word count: lines in, words re-keyed through `words`, counts per word.
fn word_count(app: &str, input: &str, state: &Path) -> AppBuilder {
    builder(app, input, state)
        .store(StoreDefinition::new("counts"))
        .repartition("words")
        .repartition_purge_interval(Duration::from_millis(500))
}

fn count(input: String) -> impl FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> Result<(), Error> + Send + 'static {
    move |ctx, rec| {
        if rec.topic == input {
            for word in rec.value_str().unwrap_or_default().split_whitespace() {
                ctx.repartition("words", word.as_bytes(), b"")?;
            }
            return Ok(());
        }
        // A record of the repartition topic: this task owns the word.
        let word = rec.key_str().expect("a word").to_string();
        let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
        let n = counts.get(&word)?.unwrap_or(0) + 1;
        counts.put(&word, &n)
    }
}

/// The child instance of the crash loop: settings `app \t input \t state`.
#[test]
#[ignore = "child process of the repartition crash loop"]
fn words_child() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    let [app_id, input, state]: [&str; 3] = settings.split('\t').collect::<Vec<_>>().try_into().unwrap();
    init_tracing();
    let app = word_count(app_id, input, Path::new(state))
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
        .commit_interval(Duration::from_millis(50))
        .transaction_timeout(Duration::from_secs(3))
        .kafka_config("group.instance.id", format!("{app_id}-child"))
        .build()
        .unwrap();
    stop_when_stdin_closes(app.shutdown_handle());
    app.run(count(input.to_string())).unwrap();
}

/// Low and high watermarks of a partition.
fn watermarks(topic: &str, partition: i32) -> (i64, i64) {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    consumer.fetch_watermarks(topic, partition, TIMEOUT).unwrap()
}

#[test]
fn word_count_through_a_repartition_topic_survives_a_crash_loop_exactly_once() {
    use rand::{Rng, SeedableRng};
    let Fixture { input, app, state } = fixture("repartition-crash", PARTITIONS);
    let words_topic = kstate::repartition_topic(&app, "words");
    let rounds: usize = std::env::var("KSTATE_REPARTITION_CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    // Lines of words from a small vocabulary, spread over the partitions
    // by line: the same word arrives in every partition.
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let vocabulary: Vec<String> = (0..40).map(|i| format!("w{i:02}")).collect();
    let mut model: BTreeMap<String, u64> = BTreeMap::new();
    let lines: Vec<KeyedRecord> = (0..3_000)
        .map(|i| {
            let line: Vec<&str> = (0..rng.random_range(1..6)).map(|_| vocabulary[rng.random_range(0..vocabulary.len())].as_str()).collect();
            for word in &line {
                *model.entry(word.to_string()).or_default() += 1;
            }
            (i % PARTITIONS, format!("line-{i}").into_bytes(), Some(line.join(" ").into_bytes()))
        })
        .collect();
    let log = state.path().join("child.log");
    let spawn = || ChildInstance::spawn("a", "words_child", format!("{app}\t{input}\t{}", state.path().display()), log.clone());
    let chunk = lines.len().div_ceil(rounds);
    for (round, part) in lines.chunks(chunk).enumerate() {
        let child = spawn();
        produce(&input, part);
        std::thread::sleep(Duration::from_millis(rng.random_range(800..2500)));
        child.kill(); // SIGKILL, mid-commit or mid-processing
        eprintln!("round {round}: killed");
    }
    let last = spawn();
    // Every line processed, and every word sent counted: the repartition
    // topic is committed past its last record too (its end is a commit
    // marker: the producer is transactional).
    let last_record = |topic: &str, p: i32| read_partition(topic, p).last().map_or(0, |(offset, _, _)| offset + 1);
    for (topic, within) in [(&input, 120), (&words_topic, 60)] {
        let deadline = Instant::now() + Duration::from_secs(within);
        loop {
            let offsets: Vec<(Option<i64>, i64)> = (0..PARTITIONS).map(|p| (committed_offset(&app, topic, p), last_record(topic, p))).collect();
            if offsets.iter().all(|(committed, end)| committed.is_some_and(|c| c >= *end)) {
                break;
            }
            assert!(Instant::now() < deadline, "{topic}: (committed, after the last record) {offsets:?}; the instance's log ends with:\n{}", last.tail());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The purge follows the committed offsets (every 500 ms here).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let purged: Vec<(i64, Option<i64>)> =
            (0..PARTITIONS).map(|p| (watermarks(&words_topic, p).0, committed_offset(&app, &words_topic, p))).collect();
        if purged.iter().all(|(low, committed)| Some(*low) == *committed) {
            eprintln!("repartition topic purged to the committed offsets: {purged:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the repartition topic was not purged to its committed offsets: (low, committed) {purged:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    last.stop();
    let counts: BTreeMap<String, u64> = changelog_state_at(&bootstrap(), &app, "counts", PARTITIONS)
        .into_iter()
        .map(|(k, v)| (String::from_utf8(k).unwrap(), u64::from_be_bytes(v.try_into().unwrap())))
        .collect();
    assert_eq!(counts, model, "each word counted once per occurrence, across partitions and kills");
    // Each word's count lives in the partition the partitioner gives it.
    let topic = kstate::changelog_topic(&app, "counts");
    for p in 0..PARTITIONS {
        for (_, k, _) in read_partition(&topic, p) {
            assert_eq!(kstate::murmur2_partition(&k, PARTITIONS), p, "{} counted in partition {p}", String::from_utf8_lossy(&k));
        }
    }
}

#[test]
fn repartition_declarations_that_cannot_work_are_typed_errors() {
    let Fixture { input, app, state } = fixture("repartition-bad", 2);
    let build = |b: AppBuilder| b.build().map(|_| ()).unwrap_err();
    let e = build(word_count(&app, &input, state.path()).repartition("words"));
    assert!(matches!(&e, Error::Config(m) if m.contains("declared twice")), "{e}");
    let e = build(word_count(&app, &input, state.path()).repartition("no spaces"));
    assert!(matches!(&e, Error::Config(m) if m.contains("repartition name")), "{e}");
    let e = build(word_count(&app, &input, state.path()).input_topic(kstate::repartition_topic(&app, "words")));
    assert!(matches!(&e, Error::Config(m) if m.contains("also an input topic")), "{e}");
    let e = build(word_count(&app, &input, state.path()).repartition_purge_interval(Duration::ZERO));
    assert!(matches!(&e, Error::Config(m) if m.contains("repartition_purge_interval")), "{e}");
    // An existing repartition topic with another partition count, or compacted.
    let other = unique("repartition-other");
    create_topic(&kstate::repartition_topic(&other, "words"), 3, &[]);
    let app_built = word_count(&other, &input, state.path()).build().unwrap();
    let e = app_built.run(count(input.clone())).unwrap_err();
    assert!(matches!(&e, Error::NotCoPartitioned { topics, partitions: 2 } if topics[0].1 == 3), "{e}");
    let compacted = unique("repartition-compacted");
    create_topic(&kstate::repartition_topic(&compacted, "words"), 2, &[("cleanup.policy", "compact")]);
    let e = word_count(&compacted, &input, state.path()).build().unwrap().run(count(input.clone())).unwrap_err();
    assert!(matches!(&e, Error::RepartitionTopic { problem, .. } if problem.contains("compact")), "{e}");
    // An undeclared name from the processor.
    let mut d = kstate::TestDriver::builder(word_count(&app, &input, state.path()))
        .closure(|ctx, _| ctx.repartition("nope", b"k", b"v"))
        .unwrap();
    let e = d.input(&input, b"l", b"x", 1).unwrap_err();
    assert!(e.to_string().contains("`nope` is not declared"), "{e}");
}

#[test]
fn the_test_driver_feeds_repartition_records_to_the_task_of_their_key() {
    for guarantee in [ProcessingGuarantee::AtLeastOnce, ProcessingGuarantee::ExactlyOnce] {
        let app = kstate::App::builder().input_topic("lines").store(StoreDefinition::new("counts")).repartition("words").processing_guarantee(guarantee);
        let mut d = kstate::TestDriver::builder(app).partitions(4).closure(count("lines".to_string())).unwrap();
        d.input("lines", b"1", b"a b a", 1).unwrap();
        d.input("lines", b"2", b"b c", 2).unwrap();
        d.commit().unwrap();
        let counts: BTreeMap<String, u64> = d.store_entries::<Utf8, U64Be>("counts").unwrap().into_iter().collect();
        assert_eq!(counts, BTreeMap::from([("a".into(), 2), ("b".into(), 2), ("c".into(), 1)]), "{guarantee:?}");
    }
}
