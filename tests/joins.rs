//! Joins as building blocks, against the real broker: a stream-table left
//! join of co-partitioned topics (README "Joins"). The table topic is an
//! input too; its records update a store (a tombstone deletes) and stream
//! records look the store up. With several inputs a task processes them in
//! timestamp order, so each stream record sees the table as of its time:
//! the outputs equal a model that merges both inputs by timestamp per
//! partition, with out-of-order stream records and tombstones.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use common::*;
use kstate::{Error, Output, StoreDefinition};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const PARTITIONS: i32 = 2;

/// One input record: (timestamp, key, value; `None`: a tombstone).
type In = (i64, String, Option<String>);

fn produce_all(topic: &str, partition: i32, records: &[In]) {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap()).set("enable.idempotence", "true").create().unwrap();
    for (ts, key, value) in records {
        let mut r = BaseRecord::<str, str>::to(topic).partition(partition).key(key).timestamp(*ts);
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

/// What the join sends for a click: `click|name|time of the name's update`
/// (`-` for no user).
fn enriched(click: &str, user: Option<&(i64, String)>) -> String {
    match user {
        Some((at, name)) => format!("{click}|{name}|{at}"),
        None => format!("{click}|-|-"),
    }
}

/// The model: both inputs of a partition merged by timestamp (the lower
/// head first), the table applied, each click joined with the table then.
fn model(clicks: &[In], users: &[In]) -> Vec<(String, String)> {
    let (mut clicks, mut users): (VecDeque<&In>, VecDeque<&In>) = (clicks.iter().collect(), users.iter().collect());
    let mut table: BTreeMap<String, (i64, String)> = BTreeMap::new();
    let mut out = Vec::new();
    loop {
        let take_user = match (clicks.front(), users.front()) {
            (None, None) => return out,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(c), Some(u)) => u.0 < c.0,
        };
        if take_user {
            let (ts, key, value) = users.pop_front().unwrap();
            match value {
                Some(name) => table.insert(key.clone(), (*ts, name.clone())),
                None => table.remove(key),
            };
        } else {
            let (_, key, click) = clicks.pop_front().unwrap();
            out.push((key.clone(), enriched(click.as_deref().unwrap(), table.get(key))));
        }
    }
}

#[test]
fn a_stream_table_join_sees_the_table_as_of_each_records_time() {
    let Fixture { input: clicks_topic, app, state } = fixture("join-clicks", PARTITIONS);
    let users_topic = unique("join-users");
    create_topic(&users_topic, PARTITIONS, &[("cleanup.policy", "compact")]);
    let out = unique("join-out");
    create_topic(&out, PARTITIONS, &[]);
    // Event times from an hour ago (the broker keeps them), odd for users
    // and even for clicks (no ties).
    let base = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 3_600_000) / 1000 * 1000;
    let mut expected = Vec::new();
    for p in 0..PARTITIONS {
        let user = |i: i64| format!("u{}-{p}", i % 5);
        // Names change, and some users are deleted, every 7 steps.
        let users: Vec<In> = (0..60)
            .map(|i| {
                let value = (i % 7 != 6).then(|| format!("name{i}"));
                (base + i * 20 + 1, user(i), value)
            })
            .collect();
        // Clicks every 13 ms of event time, every 9th one 300 ms late (out of order).
        let clicks: Vec<In> = (0..90)
            .map(|i| {
                let late = if i % 9 == 8 { 300 } else { 0 };
                ((base + i * 13 - late).max(base) / 2 * 2, user(i * 3), Some(format!("click{i}")))
            })
            .collect();
        produce_all(&users_topic, p, &users);
        produce_all(&clicks_topic, p, &clicks);
        expected.push(model(&clicks, &users));
    }
    // Both inputs are there before the application starts: each task takes
    // the lower timestamp of its two inputs' heads.
    let (users_in, out_topic) = (users_topic.clone(), out.clone());
    let running = Running::start(
        builder(&app, &clicks_topic, state.path()).input_topic(&users_topic).store(StoreDefinition::new("users")),
        move |ctx, rec| {
            let Some(key) = rec.key else { return Ok::<(), Error>(()) };
            if rec.topic == users_in {
                let users = ctx.store("users")?;
                return match rec.value {
                    // The table's update time beside its value.
                    Some(name) => users.put(key, &[&rec.timestamp.unwrap_or(0).to_be_bytes()[..], name].concat()),
                    None => users.delete(key),
                };
            }
            let user = ctx.store("users")?.get(key)?.map(|v| (i64::from_be_bytes(v[..8].try_into().unwrap()), String::from_utf8_lossy(&v[8..]).into_owned()));
            let value = enriched(rec.value_str().unwrap_or_default(), user.as_ref());
            // The task's own partition of the output: its order is the processing order.
            ctx.send(Output::to(&out_topic).key(key).value(value.as_bytes()).partition(rec.partition))
        },
    );
    for p in 0..PARTITIONS {
        wait_until("every click joined", TIMEOUT, || read_partition(&out, p).len() >= expected[p as usize].len());
        let got: Vec<(String, String)> = read_partition(&out, p)
            .into_iter()
            .map(|(_, k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v.unwrap()).unwrap()))
            .collect();
        assert_eq!(got, expected[p as usize], "partition {p}: each click joined with the table as of its time");
        assert!(got.iter().any(|(_, v)| v.ends_with("|-|-")), "some clicks found no user (deleted or not yet there)");
    }
    running.stop().unwrap();
}
