//! The test driver (`kstate::TestDriver`): the semantics it promises, each
//! without a broker (timers and punctuations on both clocks, TTL and its
//! tombstones, exactly-once output visibility, crashes, typed errors), and
//! one shared scenario run twice, once by the driver and once by `App`
//! against the real broker, whose outputs and stores must be equal.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use kstate::codec::{U64Be, Utf8};
use kstate::{
    App, Error, Output, ProcessingDecision, ProcessingGuarantee, Processor, ProcessorContext, ProcessorError, Punctuation, Record,
    SentRecord, StoreDefinition, TestDriver, TimeDomain, Timer, Windows,
};

/// The shared scenario's processor: a count per key, the last value per
/// key under a stream-time TTL, a count per key and tumbling second, a
/// stream-time timer per record two seconds later, a stream-time
/// punctuation each second; every output goes to the task's own partition
/// of `out`, so that its order is the processing order; `close` dumps the
/// stores as outputs.
struct Scenario {
    out: String,
}

const WINDOW: Duration = Duration::from_secs(1);

fn scenario_app(app: kstate::AppBuilder) -> kstate::AppBuilder {
    app.store(common::store("counts"))
        .store(common::store("recent").ttl(Duration::from_secs(5), TimeDomain::StreamTime))
        .store(StoreDefinition::window("per-second", Windows::tumbling(WINDOW)).retention(Duration::from_secs(60)))
        .timers(true)
}

impl Scenario {
    fn emit(&self, ctx: &mut ProcessorContext<'_>, key: &str, value: String) -> Result<(), ProcessorError> {
        let p = ctx.partition();
        ctx.send(Output::to(&self.out).partition(p).key(key.as_bytes()).value(value.as_bytes()))?;
        Ok(())
    }
}

impl Processor for Scenario {
    fn init(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
        ctx.schedule(TimeDomain::StreamTime, Duration::from_secs(1))?;
        Ok(())
    }

    fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError> {
        let key = record.key_str().unwrap_or_default().to_string();
        let value = record.value_str().unwrap_or_default().to_string();
        let ts = ctx.timestamp().unwrap();
        let n = {
            let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
            let n = counts.get(&key)?.unwrap_or(0) + 1;
            counts.put(&key, &n)?;
            n
        };
        let previous = ctx.typed_store::<Utf8, Utf8>("recent")?.get(&key)?;
        ctx.typed_store::<Utf8, Utf8>("recent")?.put(&key, &value)?;
        let update = ctx.window_store::<Utf8, U64Be>("per-second")?.update(&key, ts, |_, c| c.unwrap_or(0) + 1)?;
        ctx.register_timer(TimeDomain::StreamTime, key.as_bytes(), ts + 2_000)?;
        self.emit(ctx, &key, format!("rec n={n} previous={previous:?} late={}", update.late))
    }

    fn on_timer(&mut self, ctx: &mut ProcessorContext<'_>, timer: &Timer) -> Result<(), ProcessorError> {
        let key = String::from_utf8_lossy(&timer.key).into_owned();
        let n = ctx.typed_store::<Utf8, U64Be>("counts")?.get(&key)?;
        let recent = ctx.typed_store::<Utf8, Utf8>("recent")?.get(&key)?;
        let stream_time = ctx.stream_time();
        self.emit(ctx, &key, format!("timer@{} stream={stream_time:?} n={n:?} recent={recent:?}", timer.timestamp))
    }

    fn punctuate(&mut self, ctx: &mut ProcessorContext<'_>, p: &Punctuation) -> Result<(), ProcessorError> {
        let keys = ctx.typed_store::<Utf8, U64Be>("counts")?.prefix_scan(b"").count();
        let live = ctx.typed_store::<Utf8, Utf8>("recent")?.prefix_scan(b"").count();
        self.emit(ctx, "", format!("punctuate@{} keys={keys} live={live}", p.timestamp))
    }

    fn close(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
        let stream_time = ctx.stream_time().unwrap_or(0);
        let counts: Vec<(String, u64)> =
            ctx.typed_store::<Utf8, U64Be>("counts")?.prefix_scan(b"").collect::<kstate::Result<_>>()?;
        let recent: Vec<(String, String)> =
            ctx.typed_store::<Utf8, Utf8>("recent")?.prefix_scan(b"").collect::<kstate::Result<_>>()?;
        let windows = ctx.window_store::<Utf8, U64Be>("per-second")?.fetch_all(stream_time - 60_000, stream_time)?;
        self.emit(ctx, "", format!("close counts={counts:?} recent={recent:?} windows={windows:?}"))
    }
}

/// The scenario's input: `(partition, key, value, timestamp)`, stream time
/// mostly moving forward with some records out of order, gaps that expire
/// TTL entries, and keys that stop early (their timers fire without a
/// later record of theirs).
fn scenario_input(base: i64) -> Vec<(i32, String, String, i64)> {
    let mut input = Vec::new();
    let mut t = base;
    for i in 0..400u64 {
        let key = format!("k{}", (i * 7) % if i < 300 { 23 } else { 5 });
        let partition = (i % 4) as i32;
        t += match i % 50 {
            49 => 9_000, // a gap past the TTL
            13 | 29 => 0,
            _ => 137,
        };
        let ts = if i % 11 == 5 { t - 1_500 } else { t }; // out of order
        input.push((partition, key, format!("v{i}"), ts));
    }
    input
}

#[test]
fn a_processor_gives_the_same_outputs_and_stores_with_the_driver_as_with_a_broker() {
    let f = fixture("driver-same", 4);
    let out = unique("driver-same-out");
    create_topic(&out, 4, &[]);
    // Event times near now: the output topic's retention keeps them.
    let base = kstate_now() - 3_600_000;
    let input = scenario_input(base);

    // The driver's run.
    let app = scenario_app(App::builder().input_topic(&f.input));
    let mut driver = TestDriver::builder(app).partitions(4).processor({
        let out = out.clone();
        move |_| Scenario { out: out.clone() }
    })
    .unwrap();
    let started = Instant::now();
    for (p, k, v, ts) in &input {
        driver.send(Output::to(&f.input).partition(*p).key(k.as_bytes()).value(v.as_bytes()).timestamp(*ts)).unwrap();
    }
    driver.close().unwrap();
    println!("the driver ran {} records in {:?}", input.len(), started.elapsed());
    let driver_counts: BTreeMap<String, u64> = driver.store_entries::<Utf8, U64Be>("counts").unwrap().into_iter().collect();
    let mut by_driver: BTreeMap<i32, Vec<(String, String)>> = BTreeMap::new();
    for r in driver.outputs(&out) {
        by_driver.entry(r.partition.unwrap()).or_default().push((r.key_str(), r.value_str().unwrap_or_default()));
    }

    // The broker's run of the same input.
    produce_timestamped(&f.input, &input);
    let running = Running::start_processor(scenario_app(builder(&f.app, &f.input, f.state.path())), {
        let out = out.clone();
        move |_| Scenario { out: out.clone() }
    });
    wait_all_committed_at(&bootstrap(), &f.app, &f.input, 4, TIMEOUT);
    running.stop().unwrap();
    let mut by_broker: BTreeMap<i32, Vec<(String, String)>> = BTreeMap::new();
    for p in 0..4 {
        let records = read_partition(&out, p);
        let records = records.into_iter().map(|(_, k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v.unwrap()).unwrap()));
        by_broker.insert(p, records.collect());
    }
    let mut broker_counts = BTreeMap::new();
    for p in 0..4 {
        for (k, v) in read_store_dir(f.state.path(), &f.app, "counts", p).0 {
            broker_counts.insert(String::from_utf8(k).unwrap(), u64::from_be_bytes(v.try_into().unwrap()));
        }
    }

    assert_eq!(driver_counts, broker_counts, "the counts stores differ");
    for p in 0..4 {
        let (d, b) = (&by_driver[&p], &by_broker[&p]);
        for (i, (x, y)) in d.iter().zip(b.iter()).enumerate() {
            assert_eq!(x, y, "partition {p}: output {i} differs");
        }
        assert_eq!(d.len(), b.len(), "partition {p}: driver {} outputs, broker {}", d.len(), b.len());
        // The last output of each is the close's dump of every store.
        assert!(d.last().unwrap().1.starts_with("close counts=[("), "{:?}", d.last());
    }
    let kinds = |prefix: &str| by_driver.values().flatten().filter(|(_, v)| v.starts_with(prefix)).count();
    assert!(kinds("timer@") > 100 && kinds("punctuate@") > 50 && kinds("rec ") == 400, "the scenario exercises every callback");
}

fn kstate_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

// ---- The driver's promises, without a broker ----

/// Counts records per key into `counts`, sends `<key>=<count>` to `out`,
/// and registers a stream-time timer 1 s after each record and a
/// wall-clock timer 10 s after the first; timers and punctuations (every
/// second on both clocks) send what they are to `ticks`.
struct Counter {
    buffered: Vec<String>,
}

impl Processor for Counter {
    fn init(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
        ctx.schedule(TimeDomain::WallClock, Duration::from_secs(1))?;
        ctx.schedule(TimeDomain::StreamTime, Duration::from_secs(1))?;
        Ok(())
    }

    fn process(&mut self, ctx: &mut ProcessorContext<'_>, record: &Record<'_>) -> Result<(), ProcessorError> {
        let key = record.key_str().unwrap_or_default().to_string();
        if record.value_str() == Some("fail") {
            return Err("a record the processor refuses".into());
        }
        let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
        let n = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &n)?;
        ctx.send(Output::to("out").key(key.as_bytes()).value(n.to_string().as_bytes()))?;
        let ts = ctx.timestamp().unwrap();
        ctx.register_timer(TimeDomain::StreamTime, key.as_bytes(), ts + 1_000)?;
        if n == 1 {
            let at = ctx.wall_clock_time() + 10_000;
            ctx.register_timer(TimeDomain::WallClock, key.as_bytes(), at)?;
        }
        self.buffered.push(key);
        Ok(())
    }

    fn on_timer(&mut self, ctx: &mut ProcessorContext<'_>, timer: &Timer) -> Result<(), ProcessorError> {
        let what = format!("{:?} timer {}@{}", timer.domain, String::from_utf8_lossy(&timer.key), timer.timestamp);
        ctx.send(Output::to("ticks").value(what.as_bytes()))?;
        Ok(())
    }

    fn punctuate(&mut self, ctx: &mut ProcessorContext<'_>, p: &Punctuation) -> Result<(), ProcessorError> {
        let what = format!("{:?} punctuation@{}", p.domain, p.timestamp);
        ctx.send(Output::to("ticks").value(what.as_bytes()))?;
        Ok(())
    }

    fn close(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
        let all = self.buffered.join(",");
        ctx.send(Output::to("closed").value(all.as_bytes()))?;
        Ok(())
    }
}

const T0: i64 = 1_000_000;

fn counter_app() -> kstate::AppBuilder {
    App::builder().input_topic("in").store(common::store("counts")).timers(true)
}

fn counter(app: kstate::AppBuilder) -> TestDriver {
    TestDriver::builder(app).wall_clock(T0).processor(|_| Counter { buffered: Vec::new() }).unwrap()
}

fn values(records: &[SentRecord]) -> Vec<String> {
    records.iter().map(|r| r.value_str().unwrap_or_default()).collect()
}

#[test]
fn stream_time_timers_fire_before_the_record_that_makes_them_due_and_punctuations_after() {
    let mut d = counter(counter_app());
    d.input("in", b"a", b"x", 100).unwrap();
    d.input("in", b"b", b"x", 600).unwrap();
    assert_eq!(values(&d.take_outputs("ticks")), ["StreamTime punctuation@100"]);
    // 1 100 makes a's timer (1 100) due: it fires before the record, the
    // punctuation at 1 000 after it.
    d.input("in", b"c", b"x", 1_100).unwrap();
    assert_eq!(values(&d.take_outputs("ticks")), ["StreamTime timer a@1100", "StreamTime punctuation@1100"]);
    // Out of order: stream time stays at 1 100, nothing fires.
    d.input("in", b"a", b"x", 200).unwrap();
    assert!(d.take_outputs("ticks").is_empty());
    // The timers due at 5 000 run before the record, in time order; a jump
    // over several intervals runs the punctuation once.
    d.input("in", b"d", b"x", 5_000).unwrap();
    assert_eq!(
        values(&d.take_outputs("ticks")),
        ["StreamTime timer a@1200", "StreamTime timer b@1600", "StreamTime timer c@2100", "StreamTime punctuation@5000"]
    );
}

#[test]
fn the_wall_clock_moves_only_with_the_driver_and_runs_what_became_due() {
    let mut d = counter(counter_app());
    assert_eq!(d.wall_clock(), T0);
    d.input("in", b"a", b"x", 100).unwrap();
    d.advance_wall_clock(Duration::from_millis(999)).unwrap();
    assert_eq!(values(&d.take_outputs("ticks")), ["StreamTime punctuation@100"]);
    d.advance_wall_clock(Duration::from_millis(1)).unwrap();
    assert_eq!(values(&d.take_outputs("ticks")), [format!("WallClock punctuation@{}", T0 + 1_000)]);
    // Several intervals in one jump: once, as after a pause.
    d.advance_wall_clock(Duration::from_millis(3_500)).unwrap();
    assert_eq!(values(&d.take_outputs("ticks")), [format!("WallClock punctuation@{}", T0 + 4_500)]);
    // The wall-clock timer registered at T0 + 10 s, after the punctuation
    // due since T0 + 5 s (things due run in the order they became due).
    d.advance_wall_clock(Duration::from_millis(5_500)).unwrap();
    assert_eq!(
        values(&d.take_outputs("ticks")),
        [format!("WallClock punctuation@{}", T0 + 10_000), format!("WallClock timer a@{}", T0 + 10_000)]
    );
}

#[test]
fn exactly_once_outputs_show_once_their_commit_is_and_at_least_once_at_once() {
    let mut d = counter(counter_app().processing_guarantee(ProcessingGuarantee::ExactlyOnce).commit_interval(Duration::from_secs(1)));
    d.input("in", b"a", b"x", 100).unwrap();
    assert!(d.outputs("out").is_empty(), "not committed yet");
    d.advance_wall_clock(Duration::from_millis(999)).unwrap();
    assert!(d.outputs("out").is_empty(), "the commit interval has not passed");
    d.advance_wall_clock(Duration::from_millis(1)).unwrap();
    assert_eq!(values(&d.outputs("out")), ["1"]);
    d.input("in", b"a", b"x", 200).unwrap();
    d.commit().unwrap();
    assert_eq!(values(&d.outputs("out")), ["1", "2"]);

    let mut d = counter(counter_app());
    d.input("in", b"a", b"x", 100).unwrap();
    assert_eq!(values(&d.outputs("out")), ["1"]);
}

#[test]
fn a_crash_loses_what_was_not_committed_and_processes_the_input_again() {
    for guarantee in [ProcessingGuarantee::AtLeastOnce, ProcessingGuarantee::ExactlyOnce] {
        let mut d = counter(counter_app().processing_guarantee(guarantee));
        d.input("in", b"a", b"x", 100).unwrap();
        d.input("in", b"a", b"x", 200).unwrap();
        d.commit().unwrap();
        d.input("in", b"a", b"x", 300).unwrap();
        d.input("in", b"b", b"x", 400).unwrap();
        assert_eq!(d.store_entries::<Utf8, U64Be>("counts").unwrap(), [("a".into(), 3), ("b".into(), 1)]);
        d.crash_and_restart().unwrap();
        // The store came back as committed, then the last two inputs ran again.
        assert_eq!(d.store_entries::<Utf8, U64Be>("counts").unwrap(), [("a".into(), 3), ("b".into(), 1)], "{guarantee:?}");
        d.commit().unwrap();
        let outputs = values(&d.outputs("out"));
        match guarantee {
            // Sent before the crash and again after it.
            ProcessingGuarantee::AtLeastOnce => assert_eq!(outputs, ["1", "2", "3", "1", "3", "1"]),
            _ => assert_eq!(outputs, ["1", "2", "3", "1"]),
        }
        // Timers came back as committed: a's at 1 200 (registered before
        // the commit) fires; stream time is 400 again.
        d.input("in", b"c", b"x", 1_250).unwrap();
        d.commit().unwrap();
        let ticks = values(&d.take_outputs("ticks"));
        assert!(ticks.contains(&"StreamTime timer a@1200".to_string()), "{guarantee:?}: {ticks:?}");
        assert!(!ticks.contains(&"StreamTime timer a@1300".to_string()), "{guarantee:?}: {ticks:?}");
    }
}

#[test]
fn a_crash_processes_the_input_again_in_the_order_it_first_came() {
    let mut d = TestDriver::builder(counter_app()).partitions(2).wall_clock(T0).processor(|_| Counter { buffered: Vec::new() }).unwrap();
    for (p, key) in [(0, "a"), (1, "b"), (0, "c"), (1, "d")] {
        d.send(Output::to("in").partition(p).key(key.as_bytes()).value(b"x").timestamp(100)).unwrap();
    }
    d.take_outputs("out");
    d.crash_and_restart().unwrap();
    let keys: Vec<String> = d.outputs("out").iter().map(SentRecord::key_str).collect();
    assert_eq!(keys, ["a", "b", "c", "d"]);
}

#[test]
fn several_input_topics_are_merged_in_timestamp_order_with_an_idle_wait() {
    let seen = |d: &TestDriver| values(&d.outputs("seen"));
    let app = |idle: u64| App::builder().input_topic("a").input_topic("b").max_task_idle(Duration::from_millis(idle));
    let log = |ctx: &mut ProcessorContext<'_>, record: &Record<'_>| {
        let what = format!("{}@{}", record.topic, record.timestamp.unwrap());
        ctx.send(Output::to("seen").value(what.as_bytes()))
    };
    let mut d = TestDriver::builder(app(1_000)).wall_clock(T0).closure(log).unwrap();
    d.input("a", b"k", b"", 10).unwrap();
    d.input("a", b"k", b"", 30).unwrap();
    assert!(seen(&d).is_empty(), "b has nothing yet: the task waits");
    d.input("b", b"k", b"", 20).unwrap();
    assert_eq!(seen(&d), ["a@10", "b@20"], "the lowest head first, while both have one");
    d.advance_wall_clock(Duration::from_millis(999)).unwrap();
    assert_eq!(seen(&d).len(), 2, "b is empty again: the task waits max_task_idle");
    d.advance_wall_clock(Duration::from_millis(1)).unwrap();
    assert_eq!(seen(&d), ["a@10", "b@20", "a@30"]);
    // A crash processes what was held (after the committed offsets) again, in order.
    d.input("b", b"k", b"", 40).unwrap();
    d.input("a", b"k", b"", 35).unwrap();
    d.take_outputs("seen");
    d.crash_and_restart().unwrap();
    assert_eq!(seen(&d), ["a@30", "a@35"], "replayed from the committed offsets; b@40 waits for a again");

    // max_task_idle 0: no wait for an input with nothing fetched.
    let mut d = TestDriver::builder(app(0)).wall_clock(T0).closure(log).unwrap();
    d.input("a", b"k", b"", 10).unwrap();
    assert_eq!(seen(&d), ["a@10"]);
}

#[test]
fn a_global_table_is_fed_with_global_input_and_read_by_every_task() {
    let mut d = TestDriver::builder(App::builder().input_topic("orders").global_table("countries", "country-names"))
        .partitions(2)
        .closure(|ctx, record| {
            let name = ctx.global_table("countries")?.get(record.value.unwrap_or_default())?;
            ctx.send(Output::to("named").value(&name.unwrap_or_else(|| b"?".to_vec())))
        })
        .unwrap();
    d.global_input("country-names", b"fr", Some(b"France")).unwrap();
    d.send(Output::to("orders").partition(0).value(b"fr").timestamp(1)).unwrap();
    d.send(Output::to("orders").partition(1).value(b"fr").timestamp(1)).unwrap();
    d.global_input("country-names", b"fr", None).unwrap();
    d.send(Output::to("orders").partition(1).value(b"fr").timestamp(2)).unwrap();
    assert_eq!(values(&d.outputs("named")), ["France", "France", "?"]);
    let err = d.global_input("orders", b"k", None).unwrap_err();
    assert!(matches!(&err, Error::InvalidUse(m) if m.contains("not the topic of a global table")), "{err}");
    let err = d.with_context(0, |ctx| ctx.global_table("nope").map(|_| ())).unwrap_err();
    assert!(matches!(err, Error::UnknownStore(_)));
}

#[test]
fn close_runs_each_processors_close_before_a_final_commit() {
    let mut d = counter(counter_app().processing_guarantee(ProcessingGuarantee::ExactlyOnce));
    d.input("in", b"a", b"x", 100).unwrap();
    d.input("in", b"b", b"x", 100).unwrap();
    d.close().unwrap();
    assert_eq!(values(&d.outputs("closed")), ["a,b"]);
    assert_eq!(values(&d.outputs("out")), ["1", "1"], "committed by the close");
    let err = d.input("in", b"a", b"x", 100).unwrap_err();
    assert!(matches!(&err, Error::InvalidUse(m) if m.contains("closed")), "{err}");
}

#[test]
fn a_stream_time_ttl_hides_entries_at_once_and_a_commit_sends_their_tombstones() {
    let app = App::builder().input_topic("in").store(common::store("seen").ttl(Duration::from_secs(1), TimeDomain::StreamTime));
    let mut d = TestDriver::builder(app)
        .closure(|ctx, record| ctx.store("seen")?.put(record.key.unwrap(), record.value.unwrap()))
        .unwrap();
    d.input("in", b"a", b"1", 100).unwrap();
    d.commit().unwrap();
    d.input("in", b"b", b"2", 1_099).unwrap();
    assert_eq!(d.store("seen", 0).unwrap().get(b"a").unwrap(), Some(b"1".to_vec()));
    d.input("in", b"b", b"3", 1_100).unwrap();
    assert_eq!(d.store("seen", 0).unwrap().get(b"a").unwrap(), None, "expired at 100 + 1 000");
    d.commit().unwrap();
    let log: Vec<(String, bool)> = d.changelog("seen", 0).unwrap().iter().map(|r| (r.key_str(), r.value.is_some())).collect();
    assert_eq!(log, [("a".into(), true), ("a".into(), false), ("b".into(), true)], "b's latest write only; a's tombstone");
}

#[test]
fn a_wall_clock_ttl_follows_the_drivers_clock() {
    let app = App::builder().input_topic("in").store(common::store("seen").ttl(Duration::from_secs(10), TimeDomain::WallClock));
    let mut d = TestDriver::builder(app)
        .wall_clock(T0)
        .closure(|ctx, record| ctx.store("seen")?.put(record.key.unwrap(), record.value.unwrap()))
        .unwrap();
    d.input("in", b"a", b"1", 0).unwrap();
    d.advance_wall_clock(Duration::from_millis(9_999)).unwrap();
    assert_eq!(d.store_entries::<Utf8, Utf8>("seen").unwrap(), [("a".into(), "1".into())]);
    d.advance_wall_clock(Duration::from_millis(1)).unwrap();
    assert!(d.store_entries::<Utf8, Utf8>("seen").unwrap().is_empty());
}

#[test]
fn records_reach_their_partition_with_their_headers_and_timestamps() {
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    // Records without a timestamp take the wall clock's.
    let app = App::builder().input_topic("in").input_topic("other").wall_clock_timestamps();
    let mut d = TestDriver::builder(app)
        .partitions(3)
        .closure({
            let seen = seen.clone();
            move |ctx, record| {
                let header = record.headers.last("h").flatten().map(|v| String::from_utf8_lossy(v).into_owned());
                seen.borrow_mut().push((record.topic.to_string(), ctx.partition(), record.offset, record.timestamp, header));
                Ok::<(), Error>(())
            }
        })
        .unwrap();
    d.input("in", b"some key", b"v", 7).unwrap();
    d.send(Output::to("other").key(b"k").value(b"v").header("h", b"hv")).unwrap();
    d.send(Output::to("in").value(b"no key")).unwrap();
    d.send(Output::to("in").value(b"no key")).unwrap();
    d.send(Output::to("in").partition(2).value(b"v")).unwrap();
    let p = |key: &[u8]| kstate::murmur2_partition(key, 3);
    assert_eq!(
        *seen.borrow(),
        [
            ("in".to_string(), p(b"some key"), 0, Some(7), None),
            ("other".to_string(), p(b"k"), 0, None, Some("hv".to_string())),
            ("in".to_string(), 0, if p(b"some key") == 0 { 1 } else { 0 }, None, None),
            ("in".to_string(), 1, if p(b"some key") == 1 { 1 } else { 0 }, None, None),
            ("in".to_string(), 2, if p(b"some key") == 2 { 1 } else { 0 }, None, None),
        ]
    );
}

#[test]
fn window_stores_and_anything_else_read_through_the_tasks_context() {
    let app = App::builder().input_topic("in").store(StoreDefinition::window("w", Windows::tumbling(Duration::from_secs(10))).retention(Duration::from_secs(60)));
    let mut d = TestDriver::builder(app)
        .closure(|ctx, record| {
            let ts = ctx.timestamp().unwrap();
            ctx.window_store::<Utf8, U64Be>("w")?.update(&record.key_str().unwrap().to_string(), ts, |_, n| n.unwrap_or(0) + 1)?;
            Ok::<(), Error>(())
        })
        .unwrap();
    for ts in [1_000, 2_000, 12_000] {
        d.input("in", b"a", b"", ts).unwrap();
    }
    let windows = d.with_context(0, |ctx| ctx.window_store::<Utf8, U64Be>("w")?.fetch(&"a".to_string(), 0, 20_000)).unwrap();
    assert_eq!(windows, [(0, 2), (10_000, 1)]);
    assert_eq!(d.with_context(0, |ctx| Ok(ctx.stream_time())).unwrap(), Some(12_000));
}

#[test]
fn a_failing_record_stops_the_driver_as_it_stops_run_unless_the_handler_skips_it() {
    let mut d = counter(counter_app());
    d.input("in", b"a", b"x", 100).unwrap();
    d.commit().unwrap();
    let err = d.input("in", b"a", b"fail", 200).unwrap_err();
    assert!(matches!(&err, Error::Processor { offset: 1, .. }), "{err}");
    let again = d.input("in", b"a", b"x", 300).unwrap_err();
    assert!(matches!(&again, Error::InvalidUse(m) if m.contains("crash_and_restart")), "{again}");
    // A restart processes the failing record again: it fails again.
    let err = d.crash_and_restart().unwrap_err();
    assert!(matches!(&err, Error::Processor { offset: 1, .. }), "{err}");

    let app = counter_app().processing_exception_handler(|_, _| ProcessingDecision::Continue);
    let mut d = counter(app);
    d.input("in", b"a", b"fail", 100).unwrap();
    d.input("in", b"a", b"x", 200).unwrap();
    assert_eq!(d.store_entries::<Utf8, U64Be>("counts").unwrap(), [("a".into(), 1)]);
}

#[test]
fn a_panicking_processor_is_the_handlers_case() {
    let app = || App::builder().input_topic("in").store(common::store("s"));
    let process = |ctx: &mut ProcessorContext<'_>, record: &Record<'_>| {
        assert_ne!(record.value_str(), Some("panic"), "a bug in the processor");
        ctx.store("s")?.put(record.key.unwrap(), record.value.unwrap())
    };
    let mut d = TestDriver::builder(app()).closure(process).unwrap();
    let err = d.input("in", b"a", b"panic", 1).unwrap_err();
    assert!(matches!(&err, Error::Processor { offset: 0, source, .. } if source.to_string().contains("panicked: assertion")), "{err}");

    let mut d = TestDriver::builder(app().processing_exception_handler(|_, _| ProcessingDecision::Continue)).closure(process).unwrap();
    d.input("in", b"a", b"panic", 1).unwrap();
    d.input("in", b"b", b"fine", 2).unwrap();
    assert_eq!(d.store_entries::<Utf8, Utf8>("s").unwrap(), [("b".into(), "fine".into())]);
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut d = counter(counter_app());
    let err = d.input("nope", b"a", b"x", 1).unwrap_err();
    assert!(matches!(&err, Error::InvalidUse(m) if m.contains("not an input topic")), "{err}");
    let err = d.send(Output::to("in").partition(1).value(b"x")).unwrap_err();
    assert!(matches!(&err, Error::InvalidUse(m) if m.contains("partition 1")), "{err}");
    assert!(matches!(d.store("nope", 0), Err(Error::UnknownStore(_))));
    assert!(matches!(d.store("counts", 5), Err(Error::InvalidUse(_))));
    assert!(matches!(d.changelog("nope", 0), Err(Error::UnknownStore(_))));
    // Bad input does not stop the driver.
    d.input("in", b"a", b"x", 1).unwrap();

    let err = TestDriver::builder(counter_app()).partitions(0).processor(|_| Counter { buffered: Vec::new() }).err().unwrap();
    assert!(matches!(&err, Error::Config(m) if m.contains("at least 1 partition")), "{err}");
    let err = TestDriver::builder(App::builder().store(common::store("s"))).closure(|_, _| Ok::<(), Error>(())).err().unwrap();
    assert!(matches!(&err, Error::Config(m) if m.contains("input topic")), "{err}");
    let app = App::builder().input_topic("in").store(common::store("s").ttl(Duration::ZERO, TimeDomain::StreamTime));
    assert!(matches!(TestDriver::builder(app).closure(|_, _| Ok::<(), Error>(())), Err(Error::Config(_))));
}

#[test]
fn a_driver_starts_and_runs_in_milliseconds() {
    let started = Instant::now();
    let mut d = TestDriver::builder(scenario_app(App::builder().input_topic("in")))
        .partitions(4)
        .processor(|_| Scenario { out: "out".into() })
        .unwrap();
    let opened = started.elapsed();
    for (p, k, v, ts) in scenario_input(T0) {
        d.send(Output::to("in").partition(p).key(k.as_bytes()).value(v.as_bytes()).timestamp(ts)).unwrap();
    }
    d.close().unwrap();
    println!("16 store partitions opened in {opened:?}; 400 records, timers and punctuations, closed, in {:?}", started.elapsed());
}

/// Session counts with final results: merged sessions report once, as
/// one session, when it closes; a session deleted before it closes and
/// one merged into a larger one report nothing.
struct Visits;

impl Processor for Visits {
    fn process(&mut self, ctx: &mut ProcessorContext<'_>, rec: &Record<'_>) -> Result<(), ProcessorError> {
        let (user, now) = (rec.key_str().unwrap_or_default().to_string(), ctx.timestamp().unwrap());
        let mut visits = ctx.session_store::<Utf8, U64Be>("visits")?;
        if rec.value_str() == Some("forget") {
            for (session, _) in visits.fetch(&user)? {
                visits.remove(&user, session)?;
            }
            return Ok(());
        }
        let _ = visits.record(&user, now, |merged| merged.iter().map(|(_, n)| n).sum::<u64>() + 1)?;
        Ok(())
    }
    fn on_window_close(&mut self, ctx: &mut ProcessorContext<'_>, closed: &kstate::ClosedWindow<'_>) -> Result<(), ProcessorError> {
        let session = closed.session().expect("a session store");
        let text = format!("{}:[{},{}]={}", closed.key_as::<Utf8>()?, session.start, session.end, closed.value_as::<U64Be>()?);
        ctx.send(Output::to("visits-out").value(text.as_bytes()))?;
        Ok(())
    }
}

fn visits_app() -> kstate::AppBuilder {
    use kstate::SessionWindows;
    // Gap 1 s, grace 2 s: a session is final 3 s (+1 ms) after its last record.
    let sessions = SessionWindows::with_gap(Duration::from_secs(1)).grace(Duration::from_secs(2));
    App::builder().input_topic("in").store(StoreDefinition::session("visits", sessions).emit_final_results())
}

#[test]
fn a_session_store_reports_each_closed_session_once_with_its_final_value() {
    let mut d = TestDriver::builder(visits_app()).processor(|_| Visits).unwrap();
    for (user, ts) in [("ada", 1_000), ("bob", 1_500), ("ada", 1_800), ("ada", 2_600), ("cy", 3_000)] {
        d.input("in", user.as_bytes(), b"view", ts).unwrap();
    }
    // cy's only session is forgotten before it closes: no result.
    d.input("in", b"cy", b"forget", 3_100).unwrap();
    // ada's three records are one session [1000, 2600]. A session is final
    // once stream time passes its end + gap + grace: bob's [1500, 1500] at
    // 4501 (not at 3501, when a record within the gap could still extend
    // it), ada's at 5601.
    d.input("in", b"dan", b"view", 4_500).unwrap();
    d.commit().unwrap();
    assert_eq!(values(&d.outputs("visits-out")), Vec::<String>::new());
    d.input("in", b"dan", b"view", 4_501).unwrap();
    d.commit().unwrap();
    assert_eq!(values(&d.outputs("visits-out")), ["bob:[1500,1500]=1"]);
    // A late record for bob's closed session is dropped: nothing reopens.
    d.input("in", b"bob", b"view", 1_600).unwrap();
    d.input("in", b"dan", b"view", 10_000).unwrap();
    d.commit().unwrap();
    assert_eq!(values(&d.outputs("visits-out")), ["bob:[1500,1500]=1", "ada:[1000,2600]=3", "dan:[4500,4501]=2"]);
}

#[test]
fn final_results_need_a_window_store_and_a_processor_that_takes_them() {
    let kv = App::builder().input_topic("in").store(common::store("counts").emit_final_results());
    let e = TestDriver::builder(kv).processor(|_| Visits).err().expect("a key-value store emits no final results");
    assert!(matches!(&e, Error::Config(m) if m.contains("only window and session stores")), "{e}");
    let e = TestDriver::builder(visits_app()).closure(|_, _| Ok::<(), Error>(())).err().expect("a closure takes no final results");
    assert!(matches!(&e, Error::Config(m) if m.contains("run_processor")), "{e}");
    // A processor without on_window_close: the first closing window stops it.
    struct Forgetful;
    impl Processor for Forgetful {
        fn process(&mut self, ctx: &mut ProcessorContext<'_>, rec: &Record<'_>) -> Result<(), ProcessorError> {
            let now = ctx.timestamp().unwrap();
            let _ = ctx.session_store::<Utf8, U64Be>("visits")?.record(&rec.key_str().unwrap().to_string(), now, |_| 1)?;
            Ok(())
        }
    }
    let mut d = TestDriver::builder(visits_app()).processor(|_| Forgetful).unwrap();
    d.input("in", b"ada", b"view", 1_000).unwrap();
    let e = d.input("in", b"ada", b"view", 9_000).unwrap_err();
    assert!(matches!(&e, Error::Callback { callback: "on_window_close", .. }), "{e}");
    // kstate's own timer keys are reserved.
    let mut d = TestDriver::builder(visits_app()).processor(|_| Visits).unwrap();
    let e = d.with_context(0, |ctx| ctx.register_timer(TimeDomain::StreamTime, b"\xffkstate.close\x00x", 5)).unwrap_err();
    assert!(matches!(&e, Error::InvalidUse(m) if m.contains("kstate's own")), "{e}");
}

/// More windows than the timer cap per pass (10,000) close at the same
/// record: each one reports before that record's writes expire them
/// (retention size + grace: the record's window start expires the older
/// windows at once).
#[test]
fn more_windows_than_the_firing_cap_close_at_once_and_each_reports() {
    struct Counts;
    impl Processor for Counts {
        fn process(&mut self, ctx: &mut ProcessorContext<'_>, rec: &Record<'_>) -> Result<(), ProcessorError> {
            let now = ctx.timestamp().unwrap();
            let _ = ctx.window_store::<Utf8, U64Be>("per-second")?.update(&rec.key_str().unwrap().to_string(), now, |_, n| n.unwrap_or(0) + 1)?;
            Ok(())
        }
        fn on_window_close(&mut self, ctx: &mut ProcessorContext<'_>, closed: &kstate::ClosedWindow<'_>) -> Result<(), ProcessorError> {
            ctx.send(Output::to("closed").key(closed.key()).value(closed.value()))?;
            Ok(())
        }
    }
    let app = App::builder()
        .input_topic("in")
        .store(StoreDefinition::window("per-second", Windows::tumbling(Duration::from_secs(1))).emit_final_results());
    let mut d = TestDriver::builder(app).processor(|_| Counts).unwrap();
    const KEYS: usize = 10_050;
    for k in 0..KEYS {
        d.input("in", format!("k{k}").as_bytes(), b"", 500).unwrap();
    }
    d.input("in", b"tick", b"", 1_000).unwrap();
    d.commit().unwrap();
    assert_eq!(d.outputs("closed").len(), KEYS, "every window of the first second reported");
}
