//! A per-key counter: counts words from an input topic in a changelog-backed
//! store and prints each count as it changes.
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
    let expected: usize = lines.len();

    let app = App::builder()
        .application_id("kstate-example-word-count")
        .bootstrap_servers(bootstrap)
        .input_topic(TOPIC)
        .state_dir(std::env::temp_dir().join("kstate-example-state"))
        .store(StoreDefinition::new("counts"))
        .build()?;

    // Stop once this run's lines were counted (a real service runs until told to stop).
    let seen = Arc::new(AtomicUsize::new(0));
    let stop = app.shutdown_handle();
    stop.stop_on_signals();
    let seen_in = seen.clone();
    app.run(move |ctx, record| {
        let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
        for word in record.value_str().unwrap_or_default().split_whitespace() {
            let word = word.to_lowercase();
            let n = counts.get(&word)?.unwrap_or(0) + 1;
            counts.put(&word, &n)?;
            println!("{word:>8} = {n}");
        }
        if seen_in.fetch_add(1, Ordering::Relaxed) + 1 >= expected {
            stop.shutdown();
        }
        Ok::<(), kstate::Error>(())
    })?;
    println!("counted {} lines; counts are committed and survive restarts", seen.load(Ordering::Relaxed));
    Ok(())
}
