//! Your first application, as the README's walkthrough builds it: page
//! views per user in one-minute windows with final results sent to a topic,
//! each user's last visit kept for a day and served over HTTP, stopped
//! cleanly on SIGTERM, and unit-tested without a broker.
//!
//! ```text
//! bash testing/kafka.sh start          # or any broker; set KSTATE_BOOTSTRAP
//! cargo run --example first_app -- 127.0.0.1:8080
//! curl -s localhost:8080/last-seen/ada       # {"user":"ada","last_seen":...}
//! ```
//!
//! Input `page-views` (key: user, value: page), output
//! `views-per-minute` (key: `user@window start`, value: the final count).
//! The example produces a few views itself, then serves until Ctrl-C or
//! SIGTERM. Its unit tests: `cargo test --example first_app` (no broker).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use kstate::codec::{U64Be, Utf8, I64};
use kstate::{
    App, AppBuilder, ClosedWindow, Output, Partitioner, ProcessingGuarantee, Processor, ProcessorContext, ProcessorError, Queries, QueryError,
    QueryOptions, Record, StoreDefinition, TimeDomain, Windows,
};

const INPUT: &str = "kstate-first-app-page-views";
const OUTPUT: &str = "kstate-first-app-views-per-minute";

/// The application apart from where it runs (the tests use it too).
fn application() -> AppBuilder {
    App::builder()
        .input_topic(INPUT)
        // Views per user and minute; records up to 10 s late still count.
        // One result per window, when it closes (not one per view).
        .store(
            StoreDefinition::window("views", Windows::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10)))
                .emit_final_results(),
        )
        // Each user's last visit (event time), forgotten a day after it.
        .store(StoreDefinition::new("last-seen").ttl(Duration::from_secs(24 * 3600), TimeDomain::StreamTime))
        // The producers below are rdkafka's with default settings: CRC32.
        .partitioner(Partitioner::Crc32)
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
}

/// One task's processor.
struct PageViews;

impl Processor for PageViews {
    fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError> {
        let Some(user) = record.key_str().map(str::to_string) else { return Ok(()) };
        let now = ctx.timestamp().unwrap_or_default();
        ctx.window_store::<Utf8, U64Be>("views")?.update(&user, now, |_start, n| n.unwrap_or(0) + 1)?;
        ctx.typed_store::<Utf8, I64>("last-seen")?.put(&user, &now)?;
        Ok(())
    }

    fn on_window_close(&mut self, ctx: &mut ProcessorContext<'_>, closed: &ClosedWindow<'_>) -> Result<(), ProcessorError> {
        let (user, views) = (closed.key_as::<Utf8>()?, closed.value_as::<U64Be>()?);
        let key = format!("{user}@{}", closed.start());
        ctx.send(Output::to(OUTPUT).key(key.as_bytes()).value(views.to_string().as_bytes()))?;
        Ok(())
    }
}

/// `GET /last-seen/{user}`: the user's last visit, from the instance that
/// holds it (a real service forwards to `QueryError::NotHosted`'s host:
/// see `examples/serve_counts`).
async fn last_seen(State(queries): State<Arc<Queries>>, Path(user): Path<String>) -> Response {
    match queries.get_async::<Utf8, I64>("last-seen", &user, &QueryOptions::new()).await {
        Ok(answer) => Json(serde_json::json!({ "user": user, "last_seen": answer.value })).into_response(),
        Err(e) if e.is_retriable() => (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")], e.to_string()).into_response(),
        Err(e @ QueryError::UnknownStore { .. }) => (StatusCode::NOT_FOUND, e.to_string()).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A few views of three users, keyed by user (rdkafka's default partitioner).
fn produce(bootstrap: &str) -> Result<(), Box<dyn std::error::Error>> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let topics = [NewTopic::new(INPUT, 3, TopicReplication::Fixed(1)), NewTopic::new(OUTPUT, 3, TopicReplication::Fixed(1))];
    let _ = futures::executor::block_on(admin.create_topics(&topics, &AdminOptions::new()))?;
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    for (i, user) in ["ada", "bob", "cy", "ada", "ada", "bob"].iter().enumerate() {
        let record = BaseRecord::to(INPUT).key(*user).payload("/index.html").timestamp(now - 120_000 + i as i64 * 1_000);
        producer.send(record).map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(10))?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(std::env::var("KSTATE_LOG").unwrap_or_else(|_| "kstate=info".into())).init();
    let bootstrap = std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let listen = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8080".into());
    produce(&bootstrap)?;

    let app = application()
        .application_id("kstate-first-app")
        .bootstrap_servers(bootstrap)
        .state_dir(std::env::temp_dir().join("kstate-first-app"))
        .application_server(listen.clone())
        .build()?;
    // SIGINT or SIGTERM: final commit, stores closed, the group left.
    app.shutdown_handle().stop_on_signals();
    let router = Router::new().route("/last-seen/{user}", get(last_seen)).with_state(Arc::new(app.queries()));
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    app.run_processor_async(|_partition| PageViews).await?;
    Ok(())
}

/// Unit tests: the same processor and configuration in kstate's
/// `TestDriver`, no broker, in milliseconds.
#[cfg(test)]
mod tests {
    use super::*;
    use kstate::TestDriver;

    const MINUTE: i64 = 60_000;

    fn driver() -> TestDriver {
        TestDriver::builder(application()).processor(|_| PageViews).unwrap()
    }

    fn view(d: &mut TestDriver, user: &str, ts: i64) {
        d.input(INPUT, user.as_bytes(), b"/", ts).unwrap();
    }

    fn results(d: &TestDriver) -> Vec<(String, String)> {
        d.outputs(OUTPUT).iter().map(|r| (r.key_str(), r.value_str().unwrap())).collect()
    }

    #[test]
    fn one_final_count_per_user_and_minute() {
        let mut d = driver();
        view(&mut d, "ada", 10 * MINUTE + 1_000);
        view(&mut d, "ada", 10 * MINUTE + 59_000);
        view(&mut d, "bob", 10 * MINUTE + 30_000);
        // The minute closes at 11:10 (grace 10 s): nothing before.
        view(&mut d, "cy", 11 * MINUTE + 9_999);
        d.commit().unwrap();
        assert!(results(&d).is_empty(), "{:?}", results(&d));
        view(&mut d, "cy", 11 * MINUTE + 10_000);
        d.commit().unwrap();
        assert_eq!(results(&d), [("ada@600000".to_string(), "2".to_string()), ("bob@600000".to_string(), "1".to_string())]);
    }

    #[test]
    fn last_seen_is_the_latest_visit_and_expires_a_day_later() {
        let mut d = driver();
        view(&mut d, "ada", 10 * MINUTE);
        view(&mut d, "ada", 12 * MINUTE);
        assert_eq!(d.store_entries::<Utf8, I64>("last-seen").unwrap(), [("ada".to_string(), 12 * MINUTE)]);
        let a_day_later = 12 * MINUTE + 24 * 60 * MINUTE + 1;
        view(&mut d, "bob", a_day_later);
        assert_eq!(d.store_entries::<Utf8, I64>("last-seen").unwrap(), [("bob".to_string(), a_day_later)]);
    }

    #[test]
    fn a_late_view_changes_no_final_count() {
        let mut d = driver();
        view(&mut d, "ada", MINUTE + 1_000);
        view(&mut d, "bob", 2 * MINUTE + 10_000); // closes ada's minute
        view(&mut d, "ada", MINUTE + 2_000); // late: its minute is closed
        view(&mut d, "bob", 4 * MINUTE);
        d.commit().unwrap();
        assert_eq!(results(&d), [("ada@60000".to_string(), "1".to_string()), ("bob@120000".to_string(), "1".to_string())]);
    }

    #[test]
    fn a_crash_before_the_commit_sends_each_final_count_once() {
        let mut d = driver();
        view(&mut d, "ada", MINUTE);
        d.commit().unwrap();
        view(&mut d, "bob", 5 * MINUTE); // closes ada's minute
        d.crash_and_restart().unwrap(); // its result was not committed
        d.commit().unwrap();
        assert_eq!(results(&d), [("ada@60000".to_string(), "1".to_string())]);
    }
}
