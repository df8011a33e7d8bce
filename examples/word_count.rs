//! A word count: lines in (keyed by their first word, spread over three
//! partitions), each word re-keyed through a repartition topic to the task
//! that owns it, counted in a changelog-backed store, each count printed as
//! it changes. Without the repartition topic each task would count the
//! words of its own lines, one count per partition for the same word.
//!
//! ```text
//! bash testing/kafka.sh start          # or any broker; set KSTATE_BOOTSTRAP
//! cargo run --example word_count
//! ```
//! Run it twice: the second run continues from the stored counts. It stops
//! by itself once this run's lines are counted, or cleanly on Ctrl-C or
//! SIGTERM.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kstate::codec::{U64Be, Utf8};
use kstate::{App, StoreDefinition};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "kstate-example-words";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("kstate=info").init();
    let bootstrap = std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());

    // kstate never creates input topics; the example makes its own.
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).create()?;
    let topic = NewTopic::new(TOPIC, 3, TopicReplication::Fixed(1));
    let _ = futures::executor::block_on(admin.create_topics([&topic], &AdminOptions::new()))?;

    let lines = ["the quick brown fox", "jumps over the lazy dog", "the dog sleeps"];
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create()?;
    for line in lines {
        let key = line.split(' ').next().unwrap_or_default();
        producer.send(BaseRecord::to(TOPIC).key(key).payload(line)).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(10))?;
    let expected: usize = lines.iter().map(|l| l.split_whitespace().count()).sum();

    let app = App::builder()
        .application_id("kstate-example-word-count")
        .bootstrap_servers(bootstrap)
        .input_topic(TOPIC)
        .repartition("words")
        .state_dir(std::env::temp_dir().join("kstate-example-state"))
        .store(StoreDefinition::new("counts"))
        .build()?;

    // Stop once this run's lines were counted (a real service runs until told to stop).
    let seen = Arc::new(AtomicUsize::new(0));
    let stop = app.shutdown_handle();
    stop.stop_on_signals();
    let seen_in = seen.clone();
    app.run(move |ctx, record| {
        if record.topic == TOPIC {
            // A line: each word to the task that owns it.
            for word in record.value_str().unwrap_or_default().split_whitespace() {
                ctx.repartition("words", word.to_lowercase().as_bytes(), b"")?;
            }
            return Ok::<(), kstate::Error>(());
        }
        // A word of the repartition topic: counted by its own task.
        let word = record.key_str().unwrap_or_default().to_string();
        let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
        let n = counts.get(&word)?.unwrap_or(0) + 1;
        counts.put(&word, &n)?;
        println!("{word:>8} = {n}  (partition {})", record.partition);
        if seen_in.fetch_add(1, Ordering::Relaxed) + 1 >= expected {
            stop.shutdown();
        }
        Ok(())
    })?;
    println!("counted {} words; counts are committed and survive restarts", seen.load(Ordering::Relaxed));
    Ok(())
}
