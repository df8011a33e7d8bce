//! Hopping-window counts with final results: clicks per user over 10-second
//! windows starting every 5 seconds (event time), one result per window
//! when it closes instead of an update per click (Kafka Streams'
//! `suppress(untilWindowCloses)`), exactly once.
//!
//! ```text
//! bash testing/kafka.sh start          # or any broker; set KSTATE_BOOTSTRAP
//! cargo run --example windowed_counts
//! ```
//!
//! How: the window store is declared with `emit_final_results()`; each
//! click updates its windows, and when stream time passes a window's end
//! plus grace kstate calls `on_window_close` once with the user, the
//! window and its final count. Any later record for that window is late
//! and dropped by the store, so the count cannot change after it was sent;
//! the window's closing and the output are in the same commit, one
//! transaction under exactly-once: a crash before the commit sends it
//! again from the restored state, and `read_committed` readers see each
//! final result once. The example produces its clicks, then a last record
//! far ahead in event time that closes every window, and stops once every
//! final result is out (or on Ctrl-C or SIGTERM).
//!
//! Its unit tests (`cargo test --example windowed_counts`, no broker) run
//! the same processor and configuration in kstate's `TestDriver`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kstate::codec::{U64Be, Utf8};
use kstate::{App, AppBuilder, ClosedWindow, Output, ProcessingGuarantee, Processor, ProcessorContext, ProcessorError, Record, StoreDefinition, Windows};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const INPUT: &str = "kstate-example-clicks";
const OUTPUT: &str = "kstate-example-click-counts";
const STORE: &str = "clicks-per-10s";

fn windows() -> Windows {
    Windows::hopping(Duration::from_secs(10), Duration::from_secs(5)).grace(Duration::from_secs(2))
}

/// The processor of one task.
struct FinalCounts {
    /// Final results sent (to stop the example).
    sent: Arc<AtomicUsize>,
}

impl Processor for FinalCounts {
    fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError> {
        let Some(user) = record.key_str().filter(|u| !u.is_empty()).map(str::to_string) else {
            return Ok(()); // the closing tick: it only moves stream time
        };
        let now = ctx.timestamp().unwrap_or_default();
        ctx.window_store::<Utf8, U64Be>(STORE)?.update(&user, now, |_, n| n.unwrap_or(0) + 1)?;
        Ok(())
    }

    fn on_window_close(&mut self, ctx: &mut ProcessorContext<'_>, closed: &ClosedWindow<'_>) -> Result<(), ProcessorError> {
        let (user, count) = (closed.key_as::<Utf8>()?, closed.value_as::<U64Be>()?);
        let key = format!("{user}@{}", closed.start());
        ctx.send(Output::to(OUTPUT).key(key.as_bytes()).value(count.to_string().as_bytes()))?;
        println!("{user:>6} [{:>3} s, {:>3} s) = {count}", closed.start() / 1000, closed.end() / 1000);
        self.sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The application apart from where it runs (shared with the tests).
fn application() -> AppBuilder {
    App::builder()
        .input_topic(INPUT)
        .store(StoreDefinition::window(STORE, windows()).emit_final_results())
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(std::env::var("KSTATE_LOG").unwrap_or_else(|_| "kstate=warn".into())).init();
    let bootstrap = std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", &bootstrap).create()?;
    let topics = [NewTopic::new(INPUT, 1, TopicReplication::Fixed(1)), NewTopic::new(OUTPUT, 1, TopicReplication::Fixed(1))];
    let _ = futures::executor::block_on(admin.create_topics(&topics, &AdminOptions::new()))?;

    // Clicks of three users over 40 s of event time (one every 700 ms), then
    // a tick at 1000 s that closes every window.
    // Event times from two hours ago (brokers refuse timestamps far in the
    // future), fresh for every run of the example.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let base = (now_ms - 2 * 3_600_000) / 10_000 * 10_000;
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create()?;
    let users = ["ada", "bob", "cy"];
    let mut expected = std::collections::BTreeSet::new();
    for i in 0..58i64 {
        let (user, ts) = (users[(i % 3) as usize], base + i * 700);
        for start in windows().windows_for(ts) {
            expected.insert((user, start));
        }
        producer.send(BaseRecord::to(INPUT).key(user).payload("click").timestamp(ts)).map_err(|(e, _)| e)?;
    }
    producer.send(BaseRecord::to(INPUT).key("").payload("tick").timestamp(base + 1_000_000)).map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(10))?;

    let app = application()
        .application_id("kstate-example-windowed-counts")
        .bootstrap_servers(bootstrap)
        .state_dir(std::env::temp_dir().join("kstate-example-state"))
        .build()?;
    let sent = Arc::new(AtomicUsize::new(0));
    let stop = app.shutdown_handle();
    stop.stop_on_signals();
    let (watch, want) = (sent.clone(), expected.len());
    std::thread::spawn(move || {
        while watch.load(Ordering::Relaxed) < want {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500)); // the last commit
        stop.shutdown();
    });
    let factory_sent = sent.clone();
    app.run_processor(move |_partition| FinalCounts { sent: factory_sent.clone() })?;
    println!("{} final results for {} windows, each sent once (topic {OUTPUT})", sent.load(Ordering::Relaxed), want);
    Ok(())
}

/// The processor's unit tests: kstate's `TestDriver` runs it with the
/// application's own configuration, no broker, in milliseconds.
#[cfg(test)]
mod tests {
    use super::*;
    use kstate::TestDriver;

    fn driver() -> TestDriver {
        TestDriver::builder(application()).processor(|_| FinalCounts { sent: Arc::default() }).unwrap()
    }

    /// Event time 100 s: the windows of a click start 5 s apart.
    const T: i64 = 100_000;

    fn click(d: &mut TestDriver, user: &str, ts: i64) {
        d.input(INPUT, user.as_bytes(), b"click", ts).unwrap();
    }

    /// `(key, count)` of the committed final results.
    fn results(d: &TestDriver) -> Vec<(String, String)> {
        d.outputs(OUTPUT).iter().map(|r| (r.key_str(), r.value_str().unwrap())).collect()
    }

    fn result(key: &str, count: u64) -> (String, String) {
        (key.to_string(), count.to_string())
    }

    #[test]
    fn a_window_sends_its_count_once_it_closes_and_not_before() {
        let mut d = driver();
        click(&mut d, "ada", T + 1_000); // windows [95 s, 105 s) and [100 s, 110 s)
        click(&mut d, "ada", T + 6_000);
        click(&mut d, "bob", T + 9_000);
        // [100 s, 110 s) closes at 112 s (grace 2 s): not yet at 111.999 s.
        click(&mut d, "cy", T + 11_999);
        d.commit().unwrap();
        assert_eq!(results(&d), [result("ada@95000", 1)]);
        click(&mut d, "cy", T + 12_000);
        d.commit().unwrap();
        assert_eq!(&results(&d)[1..], [result("ada@100000", 2), result("bob@100000", 1)]);
    }

    #[test]
    fn a_click_after_its_window_closed_changes_nothing() {
        let mut d = driver();
        click(&mut d, "ada", T + 1_000);
        click(&mut d, "bob", T + 30_000);
        click(&mut d, "ada", T + 2_000); // late for both of its windows
        d.commit().unwrap();
        assert_eq!(results(&d), [result("ada@95000", 1), result("ada@100000", 1)]);
    }

    #[test]
    fn a_crash_before_the_commit_sends_each_final_result_once() {
        let mut d = driver();
        click(&mut d, "ada", T + 1_000);
        d.commit().unwrap();
        click(&mut d, "bob", T + 20_000); // closes ada's windows
        d.crash_and_restart().unwrap(); // their results were not committed
        d.commit().unwrap();
        assert_eq!(results(&d), [result("ada@95000", 1), result("ada@100000", 1)]);
    }
}
