//! Exports kstate's metrics to Prometheus: a word counter (like
//! `word_count`) fed by a background producer, with
//! `metrics-exporter-prometheus` serving every `kstate_*` metric over HTTP.
//!
//! ```text
//! bash testing/kafka.sh start          # or any broker; set KSTATE_BOOTSTRAP
//! cargo run --example prometheus       # runs until Ctrl-C or SIGTERM
//! curl -s http://127.0.0.1:9898/metrics | grep '^kstate_'
//! ```
//!
//! Settings (environment):
//! - `KSTATE_BOOTSTRAP`: the brokers (default `127.0.0.1:9092`);
//! - `KSTATE_METRICS_ADDR`: where the exporter listens (default
//!   `127.0.0.1:9898`; any path answers, `/metrics` by convention);
//! - `KSTATE_EXAMPLE_RATE`: input records per second the background
//!   producer writes (default 200; 0 writes nothing);
//! - `KSTATE_EXAMPLE_SECONDS`: stop after this many seconds (default: run
//!   until Ctrl-C or SIGTERM).
//!
//! A minimal `prometheus.yml` to scrape it:
//!
//! ```yaml
//! global:
//!   scrape_interval: 15s
//! scrape_configs:
//!   - job_name: kstate
//!     static_configs:
//!       - targets: ["127.0.0.1:9898"]   # one entry per application instance
//! ```
//!
//! The dashboard: in Grafana, *Dashboards → New → Import*, upload
//! `dashboards/kstate-grafana.json` and pick your Prometheus data source for
//! `DS_PROMETHEUS`. Its panels link their "what to do" hints to the sections
//! of `docs/runbook.md`.
//!
//! Histograms (`kstate_commit_seconds`, `kstate_rebalance_seconds`,
//! `kstate_task_move_seconds`) are rendered with explicit buckets, so
//! Grafana can take `histogram_quantile` over their `_bucket` series (without
//! buckets the exporter renders summaries, which cannot be aggregated across
//! instances). Disk gauges are set at start and every 10 s; RocksDB gauges
//! every 10 s while the app runs, so they appear a little after it starts.


use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kstate::codec::{U64Be, Utf8};
use kstate::{App, StoreDefinition};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};


const TOPIC: &str = "kstate-example-metrics-words";
const WORDS: [&str; 12] =
    ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "sleeps", "kafka", "state", "store"];

/// Buckets (seconds) for every `*_seconds` histogram: commits take
/// milliseconds, rebalances and task moves seconds to minutes.
const SECONDS_BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("kstate=info").init();
    let bootstrap = std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let addr: SocketAddr = std::env::var("KSTATE_METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".into()).parse()?;
    let rate: u64 = std::env::var("KSTATE_EXAMPLE_RATE").map_or(Ok(200), |v| v.parse())?;
    let run_for = std::env::var("KSTATE_EXAMPLE_SECONDS").ok().map(|v| v.parse().map(Duration::from_secs)).transpose()?;

    // The exporter first, so that every metric kstate registers lands in it.
    // `install` runs the HTTP listener on a thread of its own.
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)?
        .install()?;
    println!("serving Prometheus metrics at http://{addr}/metrics (scrape target {addr})");

    // kstate never creates input topics; the example makes its own.
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).create()?;
    let topic = NewTopic::new(TOPIC, 3, TopicReplication::Fixed(1));
    let _ = futures::executor::block_on(admin.create_topics([&topic], &AdminOptions::new()))?;

    let app = App::builder()
        .application_id("kstate-example-prometheus")
        .bootstrap_servers(bootstrap.clone())
        .input_topic(TOPIC)
        .state_dir(std::env::temp_dir().join("kstate-example-prometheus-state"))
        .store(StoreDefinition::new("counts"))
        .build()?;
    let stop = app.shutdown_handle();

    // Ctrl-C or SIGTERM stops the app cleanly (a final commit, stores closed).
    stop.stop_on_signals();
    if let Some(run_for) = run_for {
        let on_timer = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(run_for);
            on_timer.shutdown();
        });
    }

    // Input at a steady rate, so the dashboard has something to show.
    let producing = Arc::new(AtomicBool::new(true));
    let feeder = (rate > 0).then(|| {
        let (producing, bootstrap) = (producing.clone(), bootstrap.clone());
        std::thread::spawn(move || feed(&bootstrap, rate, &producing))
    });

    let mut processed = 0u64;
    app.run(move |ctx, record| {
        let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
        for word in record.value_str().unwrap_or_default().split_whitespace() {
            let n = counts.get(&word.to_string())?.unwrap_or(0) + 1;
            counts.put(&word.to_string(), &n)?;
        }
        processed += 1;
        if processed.is_multiple_of(10_000) {
            println!("processed {processed} lines");
        }
        Ok::<(), kstate::Error>(())
    })?;
    producing.store(false, Ordering::Relaxed);
    if let Some(feeder) = feeder {
        feeder.join().expect("feeder thread")?;
    }
    println!("stopped; counts are committed and survive restarts");
    Ok(())
}

/// Writes `rate` lines a second of a few words each until `producing` is cleared.
fn feed(bootstrap: &str, rate: u64, producing: &AtomicBool) -> Result<(), rdkafka::error::KafkaError> {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).set("linger.ms", "20").create()?;
    let started = Instant::now();
    let mut i = 0u64;
    while producing.load(Ordering::Relaxed) {
        let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let n = i as usize;
        let line = format!("{} {} {}", WORDS[n % 12], WORDS[(n / 12) % 12], WORDS[(n / 144) % 12]);
        let key = i.to_string();
        if let Err((e, _)) = producer.send(BaseRecord::to(TOPIC).key(&key).payload(&line)) {
            // A full queue: let it drain, then go on (the line is skipped).
            tracing::debug!(error = %e, "producer queue full");
            producer.poll(Duration::from_millis(50));
        }
        producer.poll(Duration::ZERO);
        i += 1;
    }
    producer.flush(Duration::from_secs(10))
}
