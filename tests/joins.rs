//! Joins as building blocks, against the real broker: a stream-table left
//! join of co-partitioned topics (README "Joins"). The table topic is an
//! input too; its records update a store (a tombstone deletes) and stream
//! records look the store up. With several inputs a task processes them in
//! timestamp order, so each stream record sees the table as of its time:
//! the outputs equal a model that merges both inputs by timestamp per
//! partition, with out-of-order stream records and tombstones.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use kstate::{Error, Output};
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

/// Two inputs of a task in the order the task takes them: the head with
/// the lower timestamp first (`second`'s on ties); `true` for `first`'s.
fn merged<'a>(first: &'a [In], second: &'a [In]) -> Vec<(bool, &'a In)> {
    let (mut a, mut b) = (first.iter().peekable(), second.iter().peekable());
    let mut order = Vec::new();
    while a.peek().is_some() || b.peek().is_some() {
        let from_first = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => x.0 < y.0,
            (x, _) => x.is_some(),
        };
        order.push((from_first, if from_first { a.next() } else { b.next() }.unwrap()));
    }
    order
}

/// Event times from an hour ago, in whole seconds (the broker keeps them).
fn hour_ago() -> i64 {
    (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 3_600_000) / 1000 * 1000
}

/// The model: both inputs of a partition merged by timestamp, the table
/// applied, each click joined with the table then.
fn model(clicks: &[In], users: &[In]) -> Vec<(String, String)> {
    let mut table: BTreeMap<String, (i64, String)> = BTreeMap::new();
    let mut out = Vec::new();
    for (user, (ts, key, value)) in merged(users, clicks) {
        if user {
            match value {
                Some(name) => table.insert(key.clone(), (*ts, name.clone())),
                None => table.remove(key),
            };
        } else {
            out.push((key.clone(), enriched(value.as_deref().unwrap(), table.get(key))));
        }
    }
    out
}

#[test]
fn a_stream_table_join_sees_the_table_as_of_each_records_time() {
    let Fixture { input: clicks_topic, app, state } = fixture("join-clicks", PARTITIONS);
    let users_topic = unique("join-users");
    create_topic(&users_topic, PARTITIONS, &[("cleanup.policy", "compact")]);
    let out = unique("join-out");
    create_topic(&out, PARTITIONS, &[]);
    // Odd event times for users and even ones for clicks (no ties).
    let base = hour_ago();
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
        builder(&app, &clicks_topic, state.path()).input_topic(&users_topic).store(common::store("users")),
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

/// The stream-stream join's model: records in processing order, each
/// `(left?, key, timestamp, value)`; results as `key:left|right@ts` (`-`:
/// no partner), sorted (the model does not order closings of one instant).
fn stream_join_model(records: &[(bool, u8, i64, String)], w: kstate::JoinWindows, kind: kstate::JoinKind) -> Vec<String> {
    use kstate::JoinKind;
    struct Buffered {
        left: bool,
        key: u8,
        ts: i64,
        value: String,
        matched: bool,
        closed: bool,
    }
    let close = |left: bool, ts: i64| ts + if left { w.after_ms() } else { w.before_ms() } + 1 + w.grace_ms();
    let (mut buffered, mut out, mut st) = (Vec::<Buffered>::new(), Vec::new(), i64::MIN);
    for (left, key, ts, value) in records {
        st = st.max(*ts);
        for b in buffered.iter_mut().filter(|b| !b.closed && close(b.left, b.ts) <= st) {
            b.closed = true;
            let emits = match kind {
                JoinKind::Inner => false,
                JoinKind::Left => b.left,
                JoinKind::Outer => true,
            };
            if emits && !b.matched {
                let (l, r) = if b.left { (b.value.as_str(), "-") } else { ("-", b.value.as_str()) };
                out.push(format!("{}:{l}|{r}@{}", b.key, b.ts));
            }
        }
        if close(*left, *ts) <= st {
            continue; // late
        }
        let (lo, hi) = if *left { (ts - w.before_ms(), ts + w.after_ms()) } else { (ts - w.after_ms(), ts + w.before_ms()) };
        let mut matched = false;
        // A closed partner pairs no more if its side reports non-matches;
        // one of a side that reports none pairs until its buffer expires
        // (retention: its window size + grace, on the latest start written
        // to its side).
        let reports = |partner_left: bool| match kind {
            JoinKind::Inner => false,
            JoinKind::Left => partner_left,
            JoinKind::Outer => true,
        };
        let latest: std::collections::HashMap<bool, i64> = [true, false]
            .into_iter()
            .map(|side| (side, buffered.iter().filter(|b| b.left == side).map(|b| b.ts).max().unwrap_or(i64::MIN)))
            .collect();
        let expired = |b: &Buffered| latest[&b.left] != i64::MIN && close(b.left, b.ts) <= latest[&b.left];
        for b in buffered.iter_mut().filter(|b| {
            b.left != *left && b.key == *key && (lo..=hi).contains(&b.ts) && !(reports(b.left) && b.closed) && !expired(b)
        }) {
            let (l, r) = if *left { (value.as_str(), b.value.as_str()) } else { (b.value.as_str(), value.as_str()) };
            out.push(format!("{key}:{l}|{r}@{}", ts.max(&b.ts)));
            b.matched = true;
            matched = true;
        }
        buffered.push(Buffered { left: *left, key: *key, ts: *ts, value: value.clone(), matched, closed: false });
    }
    out.sort();
    out
}

/// A processor of the join, its results to topic `out` as the model writes them.
struct Joiner {
    join: kstate::StreamJoin,
    out: String,
}

impl Joiner {
    fn send(out: &str) -> impl FnMut(&mut kstate::ProcessorContext<'_>, kstate::Joined<'_>) -> kstate::Result<()> + '_ {
        move |ctx, j| {
            let text = |v: Option<&[u8]>| v.map_or("-".to_string(), |v| String::from_utf8_lossy(v).into_owned());
            let value = format!("{}:{}|{}@{}", String::from_utf8_lossy(j.key), text(j.left), text(j.right), j.timestamp);
            ctx.send(Output::to(out).key(j.key).value(value.as_bytes()).timestamp(j.timestamp.max(1)))
        }
    }
}

impl kstate::Processor for Joiner {
    fn process(&mut self, ctx: &mut kstate::ProcessorContext<'_>, record: &kstate::Record<'_>) -> Result<(), kstate::ProcessorError> {
        self.join.process(ctx, record, Self::send(&self.out))?;
        Ok(())
    }
    fn on_window_close(&mut self, ctx: &mut kstate::ProcessorContext<'_>, closed: &kstate::ClosedWindow<'_>) -> Result<(), kstate::ProcessorError> {
        assert!(self.join.on_window_close(ctx, closed, Self::send(&self.out))?, "only the join's stores emit final results");
        Ok(())
    }
}

fn join_windows() -> kstate::JoinWindows {
    kstate::JoinWindows::within(Duration::from_millis(10)).after(Duration::from_millis(20)).grace(Duration::from_millis(5))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]

    /// Inner, left and outer joins equal the model for any interleaving of
    /// both sides, out-of-order and late records included: each pair once,
    /// each unmatched record once after its window closed, never both.
    #[test]
    fn stream_stream_joins_equal_the_model(
        records in proptest::collection::vec((proptest::bool::ANY, 0u8..2, 0i64..120), 1..40),
        kind in proptest::prop_oneof![proptest::strategy::Just(kstate::JoinKind::Inner), proptest::strategy::Just(kstate::JoinKind::Left), proptest::strategy::Just(kstate::JoinKind::Outer)],
    ) {
        let records: Vec<(bool, u8, i64, String)> =
            records.into_iter().enumerate().map(|(i, (left, key, ts))| (left, key, ts, format!("{}{i}", if left { "l" } else { "r" }))).collect();
        let join = kstate::StreamJoin::new("j", "L", "R", join_windows(), kind).unwrap();
        let [l, r] = join.stores();
        let app = kstate::App::builder().input_topic("L").input_topic("R").store(l).store(r);
        let mut d = kstate::TestDriver::builder(app).processor(move |_| Joiner { join: join.clone(), out: "out".into() }).unwrap();
        for (left, key, ts, value) in &records {
            d.input(if *left { "L" } else { "R" }, key.to_string().as_bytes(), value.as_bytes(), *ts).unwrap();
        }
        let mut got: Vec<String> = d.outputs("out").iter().map(|r| r.value_str().unwrap()).collect();
        got.sort();
        proptest::prop_assert_eq!(got, stream_join_model(&records, join_windows(), kind));
    }

    /// Under exactly-once, commits and crashes at random points between the
    /// records change nothing: the buffers and their closings come back
    /// from the changelogs, and what a crash dropped is processed again.
    #[test]
    fn stream_stream_joins_survive_crashes_under_exactly_once(
        records in proptest::collection::vec((proptest::bool::ANY, 0u8..2, 0i64..120, 0u8..6), 1..40),
    ) {
        let kind = kstate::JoinKind::Outer;
        let records: Vec<(bool, u8, i64, String, u8)> = records
            .into_iter()
            .enumerate()
            .map(|(i, (left, key, ts, step))| (left, key, ts, format!("{}{i}", if left { "l" } else { "r" }), step))
            .collect();
        let join = kstate::StreamJoin::new("j", "L", "R", join_windows(), kind).unwrap();
        let [l, r] = join.stores();
        let app = kstate::App::builder().input_topic("L").input_topic("R").store(l).store(r)
            .processing_guarantee(kstate::ProcessingGuarantee::ExactlyOnce);
        let mut d = kstate::TestDriver::builder(app).processor(move |_| Joiner { join: join.clone(), out: "out".into() }).unwrap();
        for (left, key, ts, value, step) in &records {
            d.input(if *left { "L" } else { "R" }, key.to_string().as_bytes(), value.as_bytes(), *ts).unwrap();
            match step {
                0 => d.commit().unwrap(),
                1 => d.crash_and_restart().unwrap(),
                _ => {}
            }
        }
        d.commit().unwrap();
        let mut got: Vec<String> = d.outputs("out").iter().map(|r| r.value_str().unwrap()).collect();
        got.sort();
        let plain: Vec<(bool, u8, i64, String)> = records.iter().map(|(l, k, t, v, _)| (*l, *k, *t, v.clone())).collect();
        proptest::prop_assert_eq!(got, stream_join_model(&plain, join_windows(), kind));
    }
}

/// The same join against the broker, under exactly-once: both inputs
/// produced first, so each task takes them in timestamp order; the results
/// equal the model over that order (every result once: committed readers).
#[test]
fn an_outer_stream_stream_join_on_the_broker_equals_the_model() {
    use rand::{Rng, SeedableRng};
    let Fixture { input: left_topic, app, state } = fixture("join-ss-left", 1);
    let right_topic = unique("join-ss-right");
    create_topic(&right_topic, 1, &[]);
    let out = unique("join-ss-out");
    create_topic(&out, 1, &[]);
    let base = hour_ago();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Even timestamps on the left, odd on the right (no ties across the
    // inputs); every 8th record 40 ms back in time.
    let side = |left: bool, rng: &mut rand::rngs::StdRng| -> Vec<In> {
        (0..150i64)
            .map(|i| {
                let back = if i % 8 == 7 { 40 } else { 0 };
                let ts = (i * 6 - back + rng.random_range(0..3i64) * 2).max(0) + i64::from(!left);
                (base + ts, rng.random_range(0..4u8).to_string(), Some(format!("{}{i}", if left { "l" } else { "r" })))
            })
            .collect()
    };
    let (mut lefts, rights) = (side(true, &mut rng), side(false, &mut rng));
    // A last left record far ahead closes every window before it.
    lefts.push((base + 10_000, "9".into(), Some("end".into())));
    produce_all(&left_topic, 0, &lefts);
    produce_all(&right_topic, 0, &rights);
    // The processing order: the lower timestamp of the two heads first.
    let order: Vec<(bool, u8, i64, String)> = merged(&lefts, &rights)
        .into_iter()
        .map(|(left, (ts, key, value))| (left, key.parse::<u8>().unwrap(), ts - base, value.clone().unwrap()))
        .collect();
    // (the model's timestamps are relative to `base`: shift the results back)
    let want: Vec<String> = stream_join_model(&order, join_windows(), kstate::JoinKind::Outer);
    let join = kstate::StreamJoin::new("j", left_topic.clone(), right_topic.clone(), join_windows(), kstate::JoinKind::Outer).unwrap();
    let [ls, rs] = join.stores();
    let builder = builder(&app, &left_topic, state.path())
        .input_topic(&right_topic)
        .store(ls)
        .store(rs)
        .processing_guarantee(kstate::ProcessingGuarantee::ExactlyOnce);
    let out_topic = out.clone();
    let running = Running::start_processor(builder, move |_| Joiner { join: join.clone(), out: out_topic.clone() });
    let read = || -> Vec<String> {
        let mut got: Vec<String> = read_partition(&out, 0)
            .into_iter()
            .map(|(_, _, v)| {
                // key:left|right@ts, with ts made relative to `base`
                let v = String::from_utf8(v.unwrap()).unwrap();
                let (head, ts) = v.rsplit_once('@').unwrap();
                format!("{head}@{}", ts.parse::<i64>().unwrap() - base)
            })
            .collect();
        got.sort();
        got
    };
    wait_until("every join result", TIMEOUT, || read().len() >= want.len());
    running.stop().unwrap();
    let got = read();
    assert_eq!(got, want, "an outer join: every pair once, every unmatched record once after its window closed");
    assert!(got.iter().any(|v| v.contains("|-@")) && got.iter().any(|v| v.contains(":-|")), "unmatched records of both sides: {got:?}");
}

/// A table-table outer join (README "Joins: table-table"): each table
/// topic is an input kept in a store; an update of either side sends the
/// key's new join result (`left|right`, `-` for a missing side), or a
/// tombstone once both sides are gone. The model merges both inputs by
/// timestamp and applies the same rule.
#[test]
fn a_table_table_outer_join_emits_on_changes_of_either_side() {
    let Fixture { input: left_topic, app, state } = fixture("join-tt-left", PARTITIONS);
    let right_topic = unique("join-tt-right");
    create_topic(&right_topic, PARTITIONS, &[("cleanup.policy", "compact")]);
    let out = unique("join-tt-out");
    create_topic(&out, PARTITIONS, &[]);
    let base = hour_ago();
    let mut expected = Vec::new();
    for p in 0..PARTITIONS {
        let key = |i: i64| format!("k{}-{p}", i % 4);
        // Left: even timestamps, a tombstone every 5th; right: odd, every 4th.
        let lefts: Vec<In> = (0..40).map(|i| (base + i * 10, key(i), (i % 5 != 4).then(|| format!("L{i}")))).collect();
        let rights: Vec<In> = (0..40).map(|i| (base + i * 10 + 3, key(i * 3), (i % 4 != 3).then(|| format!("R{i}")))).collect();
        produce_all(&left_topic, p, &lefts);
        produce_all(&right_topic, p, &rights);
        // The model.
        let (mut lt, mut rt): (BTreeMap<String, String>, BTreeMap<String, String>) = Default::default();
        let mut results = Vec::new();
        for (left, (_, k, v)) in merged(&lefts, &rights) {
            let table = if left { &mut lt } else { &mut rt };
            match v {
                Some(v) => table.insert(k.clone(), v.clone()),
                None => table.remove(k),
            };
            results.push((k.clone(), outer_result(lt.get(k).map(String::as_str), rt.get(k).map(String::as_str))));
        }
        expected.push(results);
    }
    let (left_in, out_topic) = (left_topic.clone(), out.clone());
    let running = Running::start(
        builder(&app, &left_topic, state.path()).input_topic(&right_topic).store(common::store("left")).store(common::store("right")),
        move |ctx, rec| {
            let Some(key) = rec.key else { return Ok::<(), Error>(()) };
            let ([left, right], outputs) = ctx.split(["left", "right"])?;
            let changed = if rec.topic == left_in { &mut *left } else { &mut *right };
            match rec.value {
                Some(v) => changed.put(key, v)?,
                None => changed.delete(key)?,
            }
            let (l, r) = (left.get(key)?, right.get(key)?);
            let text = |v: &Option<Vec<u8>>| v.as_deref().map(|v| String::from_utf8_lossy(v).into_owned());
            let result = outer_result(text(&l).as_deref(), text(&r).as_deref());
            let output = Output::to(&out_topic).key(key).partition(rec.partition);
            // (a tombstone once both sides are gone)
            outputs.send(match &result {
                Some(value) => output.value(value.as_bytes()),
                None => output,
            })
        },
    );
    for p in 0..PARTITIONS {
        wait_until("every update joined", TIMEOUT, || read_partition(&out, p).len() >= expected[p as usize].len());
        let got: Vec<(String, Option<String>)> =
            read_partition(&out, p).into_iter().map(|(_, k, v)| (String::from_utf8(k).unwrap(), v.map(|v| String::from_utf8(v).unwrap()))).collect();
        assert_eq!(got, expected[p as usize], "partition {p}: a result per update of either side");
        assert!(got.iter().any(|(_, v)| v.is_none()), "a key gone from both sides ends with a tombstone");
    }
    running.stop().unwrap();
}

/// An outer join's result for one key: `left|right` (`-`: missing), or
/// `None` (a tombstone) when both are missing.
fn outer_result(left: Option<&str>, right: Option<&str>) -> Option<String> {
    (left.is_some() || right.is_some()).then(|| format!("{}|{}", left.unwrap_or("-"), right.unwrap_or("-")))
}

#[test]
fn join_windows_of_zero_size_and_self_joins_are_refused() {
    use kstate::{JoinKind, JoinWindows, StreamJoin};
    let e = StreamJoin::new("j", "a", "b", JoinWindows::within(Duration::ZERO), JoinKind::Inner).unwrap_err();
    assert!(matches!(&e, Error::Config(m) if m.contains("zero size")), "{e}");
    let e = StreamJoin::new("j", "a", "a", JoinWindows::within(Duration::from_secs(1)), JoinKind::Inner).unwrap_err();
    assert!(matches!(&e, Error::Config(m) if m.contains("both sides")), "{e}");
    assert!(StreamJoin::new("j", "a", "b", JoinWindows::within(Duration::ZERO).after(Duration::from_millis(1)), JoinKind::Inner).is_ok());
}
