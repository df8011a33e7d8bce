//! Several input topics against the real broker: co-partitioned topics
//! merged in timestamp order per task (a backlog in both is processed in
//! order with the default `max_task_idle` of 0, because the broker is known
//! to hold more of the input that ran dry), an idle input waited for
//! `max_task_idle` and no longer, and topics that cannot be co-partitioned
//! refused at startup.

mod common;
#[path = "common/recorded.rs"]
mod recorded;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use recorded::{metric, metrics};
use kstate::Error;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Per partition, the timestamps processed and when.
type Seen = Arc<Mutex<BTreeMap<i32, Vec<(i64, Instant)>>>>;

/// Runs an app over `f.input` and `other` that records what it processed.
fn start_recording(f: &Fixture, other: &str, idle: Duration) -> (Running, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let running = Running::start(builder(&f.app, &f.input, f.state.path()).input_topic(other).max_task_idle(idle), move |ctx, record| {
        log.lock().unwrap().entry(ctx.partition()).or_default().push((record.timestamp.unwrap(), Instant::now()));
        Ok::<(), Error>(())
    });
    (running, seen)
}

#[test]
fn a_backlog_in_two_topics_is_processed_in_timestamp_order_per_task() {
    let f = fixture("merge", 2);
    let other = unique("merge-other");
    create_topic(&other, 2, &[]);
    let base = now_ms() - 3_600_000;
    // Even timestamps in the first topic, odd ones in the other.
    let records = |topic_offset: i64| -> Vec<(i32, String, String, i64)> {
        (0..2_000i64).map(|i| ((i % 2) as i32, format!("k{i}"), String::new(), base + 2 * (i / 2) + topic_offset)).collect()
    };
    produce_timestamped(&f.input, &records(0));
    produce_timestamped(&other, &records(1));
    let (running, seen) = start_recording(&f, &other, Duration::ZERO);
    wait_until("every record processed", Duration::from_secs(60), || seen.lock().unwrap().values().map(Vec::len).sum::<usize>() == 4_000);
    running.stop().unwrap();
    for (partition, processed) in seen.lock().unwrap().iter() {
        let timestamps: Vec<i64> = processed.iter().map(|(t, _)| *t).collect();
        let out_of_order = timestamps.windows(2).filter(|w| w[1] < w[0]).count();
        assert_eq!(out_of_order, 0, "partition {partition}: {out_of_order} records came before a lower timestamp");
        assert_eq!(timestamps.len(), 2_000);
    }
}

#[test]
fn an_idle_input_is_waited_for_max_task_idle_and_no_longer() {
    metrics();
    for idle in [Duration::ZERO, Duration::from_secs(3)] {
        let f = fixture("merge-idle", 1);
        let other = unique("merge-idle-other");
        create_topic(&other, 1, &[]);
        let (running, seen) = start_recording(&f, &other, idle);
        // Let the task start running with both inputs empty.
        std::thread::sleep(Duration::from_secs(3));
        let sent = Instant::now();
        produce_timestamped(&f.input, &[(0, "k".into(), String::new(), now_ms())]);
        wait_until("the record processed", Duration::from_secs(30), || !seen.lock().unwrap().is_empty());
        running.stop().unwrap();
        let waited = seen.lock().unwrap()[&0][0].1 - sent;
        if idle.is_zero() {
            assert!(waited < Duration::from_millis(1_500), "max_task_idle 0: waited {waited:?}");
        } else {
            assert!(waited >= idle - Duration::from_millis(200), "max_task_idle {idle:?}: waited only {waited:?}");
            assert!(waited < idle + Duration::from_secs(3), "max_task_idle {idle:?}: waited {waited:?}");
        }
    }
    // Each record went while the other input had nothing: counted.
    let enforced = metric("kstate_input_enforced_total", &[("partition", "0")]).unwrap_or(0.0);
    assert!(enforced >= 2.0, "kstate_input_enforced_total {enforced}");
    assert_eq!(metric("kstate_input_held_records", &[("partition", "0")]), Some(0.0));
}

#[test]
fn input_topics_that_cannot_be_co_partitioned_are_refused_at_startup() {
    let f = fixture("merge-mismatch", 2);
    let other = unique("merge-mismatch-other");
    create_topic(&other, 3, &[]);
    let app = builder(&f.app, &f.input, f.state.path()).input_topic(&other).build().unwrap();
    let err = app.run(|_, _| Ok::<(), Error>(())).unwrap_err();
    assert!(matches!(&err, Error::NotCoPartitioned { topics, partitions: 2 } if *topics == [(other.clone(), 3)]), "{err}");
    assert!(err.to_string().contains(&format!("`{other}` has 3")), "the error names the topic and its count: {err}");
}
