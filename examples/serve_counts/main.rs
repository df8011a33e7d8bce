//! Serving state over HTTP: counts records per key of an input topic and
//! answers `GET /stores/counts/keys/{key}` (and ranges) from any instance,
//! forwarding to the instance that runs the key's partition. Each instance
//! keeps a standby of another's partitions, which may answer stale reads
//! (`?max_lag=N`).
//!
//! ```text
//! bash testing/kafka.sh start          # or any broker; set KSTATE_BOOTSTRAP
//! cargo run --example serve_counts -- 127.0.0.1:8080 &
//! cargo run --example serve_counts -- 127.0.0.1:8081 &
//! # write keyed records (murmur2 partitioner, as the Java clients):
//! printf 'a:1\nb:1\na:1\n' | kcat -P -b 127.0.0.1:9092 -t kstate-example-counts -K: -X partitioner=murmur2_random
//! curl -s localhost:8080/stores/counts/keys/a        # {"key":"a","value":2,...}
//! curl -s 'localhost:8081/stores/counts/range?from=a&to=z'
//! curl -s localhost:8080/instances
//! ```
//! Arguments: the HTTP address (also the `application_server`), then
//! optionally the state directory. Stops cleanly on Ctrl-C or SIGTERM.

mod http;

use std::sync::Arc;

use kstate::codec::{U64Be, Utf8};
use kstate::{App, StoreDefinition};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

const TOPIC: &str = "kstate-example-counts";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("kstate=info").init();
    let bootstrap = std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    let port = listen.rsplit(':').next().unwrap_or("8080").to_string();
    let state_dir = args.next().map_or_else(|| std::env::temp_dir().join(format!("kstate-example-serve-{port}")), Into::into);

    // kstate never creates input topics; the example makes its own.
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", &bootstrap).create()?;
    let topic = NewTopic::new(TOPIC, 3, TopicReplication::Fixed(1));
    let _ = futures::executor::block_on(admin.create_topics([&topic], &AdminOptions::new()))?;

    let app = App::builder()
        .application_id("kstate-example-serve-counts")
        .bootstrap_servers(bootstrap)
        .input_topic(TOPIC)
        .state_dir(state_dir)
        .store(StoreDefinition::new("counts"))
        .num_standby_replicas(1)
        // Published to the group: how the other instances reach this one.
        .application_server(listen.clone())
        .build()?;
    let server = Arc::new(http::Server { queries: app.queries(), me: listen.clone(), client: reqwest::Client::new() });
    std::thread::spawn(move || {
        if let Err(e) = http::serve_blocking(server, &listen) {
            eprintln!("the HTTP server on {listen} failed: {e}");
            std::process::exit(2);
        }
    });
    let stop = app.shutdown_handle();
    stop.stop_on_signals();
    app.run(|ctx, record| {
        let Some(key) = record.key_str() else { return Ok::<_, kstate::Error>(()) };
        let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
        let n = counts.get(&key.to_string())?.unwrap_or(0) + 1;
        counts.put(&key.to_string(), &n)
    })?;
    Ok(())
}
