//! Store operations through a running application against the real broker:
//! CRUD, range and prefix scans, read-your-writes before commit, typed codecs,
//! and that everything is durable after a clean shutdown.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::*;
use kstate::codec::{Json, U64Be, Utf8};
use kstate::Error;

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn pairs(items: &[(&str, &str)]) -> Pairs {
    items.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
}

#[derive(Debug, Default)]
struct Observed {
    get_a: Option<Vec<u8>>,
    get_b_after_delete: Option<Vec<u8>>,
    get_missing: Option<Vec<u8>>,
    range_a_c: Pairs,
    range_bounds_open: Pairs,
    prefix_a: Pairs,
    all: Pairs,
    approx: u64,
    checkpoint_before_commit: Option<i64>,
    typed_count: Option<u64>,
    json_round_trip: Option<Vec<u32>>,
    codec_error: bool,
    unknown_store_error: bool,
}

#[test]
fn crud_scans_and_read_your_writes_before_commit() {
    init_tracing();
    // The only test in this binary that records metrics: a process-wide recorder.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("first recorder of this test binary");
    let Fixture { input, app, state } = fixture("crud", 1);
    produce(&input, &[(0, b"script".to_vec(), Some(b"go".to_vec()))]);

    let (tx, rx) = mpsc::channel();
    // A long commit interval: every read below happens before any commit.
    let builder = builder(&app, &input, state.path())
        .store(common::store("kv"))
        .store(common::store("typed"))
        .commit_interval(Duration::from_secs(3600));
    let running = Running::start(builder, move |ctx, _rec| {
        let mut o = Observed::default();
        {
            let kv = ctx.store("kv")?;
            for (k, v) in [("a", "1"), ("ab", "2"), ("abc", "3"), ("b", "4"), ("c", "5"), ("d", "6")] {
                kv.put(k.as_bytes(), v.as_bytes())?;
            }
            kv.put(b"a", b"1-new")?; // overwrite
            kv.delete(b"b")?;
            kv.delete(b"never-written")?;
            o.get_a = kv.get(b"a")?;
            o.get_b_after_delete = kv.get(b"b")?;
            o.get_missing = kv.get(b"zzz")?;
            o.range_a_c = kv.range(b"a", b"c").collect::<kstate::Result<_>>()?;
            o.range_bounds_open = kv
                .range_bounds(std::ops::Bound::Excluded(&b"abc"[..]), std::ops::Bound::Included(&b"d"[..]))
                .collect::<kstate::Result<_>>()?;
            o.prefix_a = kv.prefix_scan(b"a").collect::<kstate::Result<_>>()?;
            o.all = kv.all().collect::<kstate::Result<_>>()?;
            o.approx = kv.approximate_num_entries();
            o.checkpoint_before_commit = kv.checkpoint();
        }
        {
            let mut counts = ctx.typed_store::<Utf8, U64Be>("typed")?;
            counts.put(&"apples".to_string(), &41)?;
            let n = counts.get(&"apples".to_string())?.unwrap();
            counts.put(&"apples".to_string(), &(n + 1))?;
            o.typed_count = counts.get(&"apples".to_string())?;
        }
        {
            let mut lists = ctx.typed_store::<Utf8, Json<Vec<u32>>>("typed")?;
            lists.put(&"list".to_string(), &vec![1, 2, 3])?;
            o.json_round_trip = lists.get(&"list".to_string())?;
            // Bytes that are not JSON, read through a JSON codec: a typed error.
            lists.raw().put(b"broken", b"{not json")?;
            o.codec_error = matches!(lists.get(&"broken".to_string()), Err(Error::Codec { codec: "json", .. }));
        }
        o.unknown_store_error = matches!(ctx.store("nope"), Err(Error::UnknownStore(_)));
        tx.send(o).unwrap();
        Ok(())
    });
    let o = rx.recv_timeout(TIMEOUT).expect("processor ran");
    running.stop().unwrap();

    assert_eq!(o.get_a.as_deref(), Some(&b"1-new"[..]));
    assert_eq!(o.get_b_after_delete, None);
    assert_eq!(o.get_missing, None);
    assert_eq!(o.range_a_c, pairs(&[("a", "1-new"), ("ab", "2"), ("abc", "3")]));
    assert_eq!(o.range_bounds_open, pairs(&[("c", "5"), ("d", "6")]));
    assert_eq!(o.prefix_a, pairs(&[("a", "1-new"), ("ab", "2"), ("abc", "3")]));
    assert_eq!(o.all, pairs(&[("a", "1-new"), ("ab", "2"), ("abc", "3"), ("c", "5"), ("d", "6")]));
    assert!(o.approx >= 5, "approximate entries {}", o.approx);
    assert_eq!(o.checkpoint_before_commit, None, "nothing may be checkpointed before the commit");
    assert_eq!(o.typed_count, Some(42));
    assert_eq!(o.json_round_trip, Some(vec![1, 2, 3]));
    assert!(o.codec_error, "decoding garbage must be Error::Codec");
    assert!(o.unknown_store_error);

    // After the clean shutdown the store holds exactly the final state, and
    // it equals the changelog replayed up to the checkpoint.
    let (data, checkpoint) = read_store_dir(state.path(), &app, "kv", 0);
    assert_eq!(
        data.into_iter().collect::<Pairs>(),
        pairs(&[("a", "1-new"), ("ab", "2"), ("abc", "3"), ("c", "5"), ("d", "6")])
    );
    let changelog = read_partition(&kstate::changelog_topic(&app, "kv"), 0);
    // One commit: the latest write of each of the 7 keys written, in key
    // order (the overwritten value of `a` never reaches the changelog).
    let logged: Vec<(String, Option<String>)> = changelog
        .iter()
        .map(|(_, k, v)| (String::from_utf8_lossy(k).into_owned(), v.as_ref().map(|v| String::from_utf8_lossy(v).into_owned())))
        .collect();
    let some = |k: &str, v: &str| (k.to_string(), Some(v.to_string()));
    assert_eq!(
        logged,
        vec![
            some("a", "1-new"),
            some("ab", "2"),
            some("abc", "3"),
            ("b".to_string(), None), // a delete is a tombstone
            some("c", "5"),
            some("d", "6"),
            ("never-written".to_string(), None),
        ]
    );
    assert_eq!(checkpoint, Some(changelog.last().unwrap().0));
    assert_eq!(committed_offset(&app, &input, 0), Some(1), "input offset committed after the store");

    // Metrics through the `metrics` facade, labelled by store and partition.
    let mut seen = std::collections::HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<String> = key.key().labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        seen.insert(format!("{}{{{}}}", key.key().name(), labels.join(",")), value);
    }
    use metrics_util::debugging::DebugValue;
    assert_eq!(seen.get("kstate_store_puts_total{store=kv,partition=0}"), Some(&DebugValue::Counter(7)));
    assert_eq!(seen.get("kstate_store_deletes_total{store=kv,partition=0}"), Some(&DebugValue::Counter(2)));
    assert!(matches!(seen.get("kstate_store_gets_total{store=kv,partition=0}"), Some(DebugValue::Counter(n)) if *n >= 3));
    assert!(
        matches!(seen.get("kstate_commit_seconds{}"), Some(DebugValue::Histogram(h)) if !h.is_empty()),
        "commit latency recorded: {:?}", seen.keys().collect::<Vec<_>>()
    );
}

#[test]
fn run_async_processes_and_stops_on_shutdown() {
    let Fixture { input, app, state } = fixture("async", 1);
    produce(&input, &[(0, b"k".to_vec(), Some(b"v".to_vec()))]);
    // Not named `kv`: the metrics assertions of the other test count `kv` puts.
    let app = builder(&app, &input, state.path()).store(common::store("async-kv")).build().unwrap();
    let stop = app.shutdown_handle();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = rt.spawn(app.run_async(move |ctx, rec| {
        ctx.store("async-kv")?.put(rec.key.unwrap(), rec.value.unwrap())?;
        tx.send(rec.offset).unwrap();
        Ok::<(), kstate::Error>(())
    }));
    assert_eq!(rx.recv_timeout(TIMEOUT).unwrap(), 0);
    stop.shutdown();
    rt.block_on(handle).unwrap().expect("clean shutdown");
}

/// Commits are pipelined: a commit's RocksDB write runs in the background
/// while processing goes on, and reads must see its writes meanwhile. A
/// read-modify-write counter with a 1 ms commit interval reads through
/// in-flight commits constantly; every count and every scan must stay exact.
#[test]
fn counts_stay_exact_while_commits_are_in_flight() {
    const PARTITIONS: i32 = 2;
    const PER_PARTITION: usize = 6000;
    const KEYS: usize = 40;
    let Fixture { input, app, state } = fixture("inflight", PARTITIONS);
    let records: Vec<KeyedRecord> = (0..PER_PARTITION * PARTITIONS as usize)
        .map(|i| ((i % 2) as i32, format!("k{:02}", (i / 2) % KEYS).into_bytes(), Some(b"x".to_vec())))
        .collect();
    produce(&input, &records);

    let builder = builder(&app, &input, state.path())
        .store(common::store("counts"))
        .commit_interval(Duration::from_millis(1));
    let mut processed = std::collections::HashMap::<i32, u64>::new();
    let running = Running::start(builder, move |ctx, rec| {
        let p = ctx.partition();
        let store = ctx.store("counts")?;
        let key = rec.key.unwrap();
        let count = store.get(key)?.map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()));
        store.put(key, &(count + 1).to_be_bytes())?;
        let seen = processed.entry(p).or_default();
        *seen += 1;
        if seen.is_multiple_of(97) {
            let mut total = 0;
            for entry in store.all() {
                total += u64::from_be_bytes(entry?.1.try_into().unwrap());
            }
            if total != *seen {
                return Err(kstate::Error::Config(format!("p{p}: scan sums to {total} after {seen} records")));
            }
        }
        Ok(())
    });
    for p in 0..PARTITIONS {
        wait_until("all input committed", TIMEOUT, || {
            running.is_finished() || committed_offset(&app, &input, p) == Some(PER_PARTITION as i64)
        });
    }
    running.stop().expect("no count or scan ever came out wrong");
    for p in 0..PARTITIONS {
        let (data, _) = read_store_dir(state.path(), &app, "counts", p);
        let want: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = (0..KEYS)
            .map(|k| (format!("k{k:02}").into_bytes(), ((PER_PARTITION / KEYS) as u64).to_be_bytes().to_vec()))
            .collect();
        assert_same_state(&data, &want, &format!("p{p}: counts"));
    }
}

#[test]
fn a_full_producer_queue_is_waited_out_and_keeps_the_changelog_in_order() {
    // A producer queue of 50 messages and one commit of 3000 keys: sending
    // the commit fills the queue over and over; every record must still
    // reach the changelog once, in key order, and the store must match it.
    let Fixture { input, app, state } = fixture("queuefull", 1);
    produce(&input, &[(0, b"go".to_vec(), Some(b"".to_vec()))]);
    let (tx, rx) = mpsc::channel();
    let builder = builder(&app, &input, state.path())
        .store(common::store("s"))
        .kafka_config("queue.buffering.max.messages", "50")
        .commit_interval(Duration::from_secs(3600));
    let running = Running::start(builder, move |ctx, _| {
        let s = ctx.store("s")?;
        for i in (0..3000u32).rev() {
            s.put(format!("k{i:05}").as_bytes(), &i.to_be_bytes())?;
        }
        tx.send(()).unwrap();
        Ok(())
    });
    rx.recv_timeout(TIMEOUT).unwrap();
    running.stop().unwrap();

    let changelog = read_partition(&kstate::changelog_topic(&app, "s"), 0);
    let logged: Vec<(Vec<u8>, Option<Vec<u8>>)> = changelog.iter().map(|(_, k, v)| (k.clone(), v.clone())).collect();
    let want: Vec<(Vec<u8>, Option<Vec<u8>>)> =
        (0..3000u32).map(|i| (format!("k{i:05}").into_bytes(), Some(i.to_be_bytes().to_vec()))).collect();
    assert!(logged == want, "changelog: {} records, first {:?}", logged.len(), logged.first());
    let (data, checkpoint) = read_store_dir(state.path(), &app, "s", 0);
    assert_eq!(data.len(), 3000);
    assert_eq!(checkpoint, Some(changelog.last().unwrap().0));
    assert_eq!(committed_offset(&app, &input, 0), Some(1));
}

/// A slow processor (1 ms a record) gets batches of up to 1024 records that
/// take a second each: commits must keep to the interval inside a batch
/// (the committed offset trails the processed one by about an interval's
/// worth of records, not a batch), and a shutdown must not wait for the
/// batch to end.
#[test]
fn a_slow_processor_commits_on_time_and_stops_promptly() {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;
    let Fixture { input, app, state } = fixture("slow", 1);
    let records: Vec<KeyedRecord> = (0..4000).map(|i| (0, format!("k{i:04}").into_bytes(), Some(b"v".to_vec()))).collect();
    produce(&input, &records);
    let processed = Arc::new(AtomicI64::new(-1));
    let seen = processed.clone();
    let builder = builder(&app, &input, state.path()).store(common::store("s")).commit_interval(Duration::from_millis(50));
    let running = Running::start(builder, move |ctx, rec| {
        ctx.store("s")?.put(rec.key.unwrap(), rec.value.unwrap())?;
        std::thread::sleep(Duration::from_millis(1));
        seen.store(rec.offset, Ordering::Relaxed);
        Ok(())
    });
    wait_until("the first record", TIMEOUT, || processed.load(Ordering::Relaxed) >= 0);
    let mut worst_lag = 0;
    let mut commits = std::collections::BTreeSet::new();
    while processed.load(Ordering::Relaxed) < 2500 {
        let before = processed.load(Ordering::Relaxed);
        let committed = committed_offset(&app, &input, 0).unwrap_or(0);
        worst_lag = worst_lag.max(before + 1 - committed);
        commits.insert(committed);
    }
    assert!(worst_lag < 400, "committed offset trailed the processed one by {worst_lag} records; commits seen: {commits:?}");
    let (asked, at_ask) = (std::time::Instant::now(), processed.load(Ordering::Relaxed));
    running.stop().unwrap();
    let (took, last) = (asked.elapsed(), processed.load(Ordering::Relaxed));
    assert!(last - at_ask < 100, "shutdown waited for the batch to end: asked at {at_ask}, processed up to {last}");
    eprintln!("shutdown took {took:?}");
    // A remote store's close also writes its memtable to object storage
    // (and the side-by-side test passes share two cores): more room.
    let bound = if stores_remote() { Duration::from_secs(6) } else { Duration::from_secs(2) };
    assert!(took < bound, "shutdown took {took:?}");
    assert_eq!(committed_offset(&app, &input, 0), Some(last + 1), "the final commit covers exactly what was processed");
}

/// Several stores and the outputs in one scope (`ProcessorContext::split`),
/// typed through `KeyValueStore::typed`, scanned with typed iterators.
#[test]
fn split_reads_one_store_writes_another_and_sends_outputs_in_one_scope() {
    let Fixture { input, app, state } = fixture("split", 1);
    let out_topic = unique("split-out");
    create_topic(&out_topic, 1, &[]);
    let users = ["ann", "bob", "ann", "cid", "ann", "bob"];
    let records: Vec<KeyedRecord> = users.iter().map(|u| (0, u.as_bytes().to_vec(), Some(b"click".to_vec()))).collect();
    produce(&input, &records);
    let builder = builder(&app, &input, state.path()).store(common::store("clicks")).store(common::store("totals"));
    let (tx, rx) = mpsc::channel();
    let topic = out_topic.clone();
    let running = Running::start(builder, move |ctx, rec| {
        let twice = matches!(ctx.split(["clicks", "clicks"]), Err(Error::InvalidUse(_)));
        let unknown = matches!(ctx.split(["clicks", "nope"]), Err(Error::UnknownStore(_)));
        let ([clicks, totals], out) = ctx.split(["clicks", "totals"])?;
        let (mut clicks, mut totals) = (clicks.typed::<Utf8, U64Be>(), totals.typed::<Utf8, U64Be>());
        let user = String::from_utf8_lossy(rec.key.unwrap()).into_owned();
        let n = clicks.get(&user)?.unwrap_or(0) + 1;
        clicks.put(&user, &n)?;
        // Read one store while the other is held, then send in the same scope.
        let all = totals.get(&"all".to_string())?.unwrap_or(0) + 1;
        totals.put(&"all".to_string(), &all)?;
        out.send(kstate::Output::to(&topic).key(user.as_bytes()).value(&n.to_be_bytes()))?;
        let scanned: Vec<(String, u64)> = clicks.prefix_scan(b"").collect::<kstate::Result<_>>()?;
        let ranged = clicks.range(&"ann".to_string(), &"c".to_string())?.count();
        tx.send((twice, unknown, scanned, ranged, all)).unwrap();
        Ok(())
    });
    let seen: Vec<_> = (0..users.len()).map(|_| rx.recv_timeout(TIMEOUT).expect("processed")).collect();
    running.stop().unwrap();
    assert!(seen.iter().all(|(twice, unknown, ..)| *twice && *unknown), "split refuses a store named twice and an unknown one");
    let (_, _, scanned, ranged, all) = seen.last().unwrap();
    assert_eq!(scanned, &vec![("ann".to_string(), 3), ("bob".to_string(), 2), ("cid".to_string(), 1)]);
    assert_eq!(*ranged, 2, "ann and bob are in [ann, c)");
    assert_eq!(*all, 6);
    let counts = |store: &str| read_store_dir(state.path(), &app, store, 0).0;
    assert_eq!(counts("clicks").len(), 3);
    assert_eq!(counts("totals").get(&b"all"[..]).map(|v| v.as_slice()), Some(&6u64.to_be_bytes()[..]));
    let outputs: Vec<(Vec<u8>, u64)> = read_partition(&out_topic, 0)
        .into_iter()
        .map(|(_, k, v)| (k, u64::from_be_bytes(v.unwrap().try_into().unwrap())))
        .collect();
    let expected: Vec<(Vec<u8>, u64)> = [("ann", 1), ("bob", 1), ("ann", 2), ("cid", 1), ("ann", 3), ("bob", 2)]
        .iter()
        .map(|(u, n)| (u.as_bytes().to_vec(), *n))
        .collect();
    assert_eq!(outputs, expected);
}

/// Buffers its task's records in memory and writes them only in `close`.
struct Buffering {
    partition: i32,
    buffer: Vec<(Vec<u8>, Vec<u8>)>,
    events: mpsc::Sender<(&'static str, i32, usize)>,
}

impl kstate::Processor for Buffering {
    fn process(&mut self, _ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), kstate::ProcessorError> {
        self.buffer.push((rec.key.unwrap().to_vec(), rec.value.unwrap().to_vec()));
        self.events.send(("processed", self.partition, self.buffer.len())).unwrap();
        Ok(())
    }

    fn close(&mut self, ctx: &mut kstate::ProcessorContext<'_>) -> Result<(), kstate::ProcessorError> {
        let store = ctx.store("buffered")?;
        for (k, v) in self.buffer.drain(..) {
            store.put(&k, &v)?;
        }
        let _ = self.events.send(("closed", self.partition, 0));
        Ok(())
    }
}

/// `Processor::close` runs before a task's final commit, on a revocation
/// and on a clean shutdown: what it writes is committed.
#[test]
fn close_writes_are_committed_when_a_task_is_revoked_and_at_shutdown() {
    let Fixture { input, app, state } = fixture("close", 2);
    let records: Vec<KeyedRecord> = (0..20).map(|i| (i % 2, format!("k{i}").into_bytes(), Some(format!("v{i}").into_bytes()))).collect();
    produce(&input, &records);
    let (tx, rx) = mpsc::channel();
    let start = |dir: &std::path::Path, tx: mpsc::Sender<(&'static str, i32, usize)>| {
        let b = builder(&app, &input, dir).store(common::store("buffered"));
        Running::start_processor(b, move |partition| Buffering { partition, buffer: Vec::new(), events: tx.clone() })
    };
    let a = start(state.path(), tx.clone());
    let mut processed = 0;
    while processed < 20 {
        let (what, ..) = rx.recv_timeout(TIMEOUT).expect("A processes every record");
        processed += usize::from(what == "processed");
    }
    assert!(read_partition(&kstate::changelog_topic(&app, "buffered"), 0).is_empty(), "nothing written before close");
    // B joins: one of A's tasks is revoked, closed, and its buffer committed.
    let b_state = tempfile::tempdir().unwrap();
    let b = start(b_state.path(), tx.clone());
    let revoked = loop {
        match rx.recv_timeout(Duration::from_secs(60)).expect("a task revoked from A") {
            ("closed", p, _) => break p,
            _ => continue,
        }
    };
    let changelog = |p: i32| read_partition(&kstate::changelog_topic(&app, "buffered"), p).len();
    wait_until("the revoked task's writes in its changelog", TIMEOUT, || changelog(revoked) == 10);
    assert_eq!(changelog(1 - revoked), 0, "the task A kept has not closed yet");
    a.stop().unwrap();
    b.stop().unwrap();
    assert_eq!(changelog(1 - revoked), 10, "A's shutdown closed and committed its other task");
    let model: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = records.iter().map(|(_, k, v)| (k.clone(), v.clone().unwrap())).collect();
    assert_same_state(&changelog_state_at(&bootstrap(), &app, "buffered", 2), &model, "the changelogs after close");
}

/// A processor waiting for async code longer than a session timeout keeps
/// its tasks: heartbeats do not come from the processing thread.
#[test]
fn an_async_lookup_longer_than_the_session_timeout_keeps_the_tasks() {
    let Fixture { input, app: app_id, state } = fixture("lookup", 1);
    produce(&input, &[(0, b"a".to_vec(), Some(b"1".to_vec())), (0, b"b".to_vec(), Some(b"2".to_vec()))]);
    let restores = Restores::default();
    // The session timeout is 6 s (common::builder); each lookup takes 7 s.
    let app = builder(&app_id, &input, state.path()).store(common::store("profiles")).restore_listener(restores.clone()).build().unwrap();
    let stop = app.shutdown_handle();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = rt.spawn(app.run_async(move |ctx, rec| {
        let key = rec.key.unwrap().to_vec();
        let profile = tokio::runtime::Handle::current().block_on(async move {
            tokio::time::sleep(Duration::from_secs(7)).await;
            [b"profile of ".as_slice(), &key].concat()
        });
        ctx.store("profiles")?.put(rec.key.unwrap(), &profile)?;
        tx.send(rec.offset).unwrap();
        Ok::<(), kstate::Error>(())
    }));
    assert_eq!(rx.recv_timeout(Duration::from_secs(40)).unwrap(), 0);
    assert_eq!(rx.recv_timeout(Duration::from_secs(40)).unwrap(), 1);
    stop.shutdown();
    rt.block_on(handle).unwrap().expect("clean shutdown");
    assert_eq!(restores.ended(), 1, "the task was never lost and reassigned (one restore, at the start)");
    let stored = read_store_dir(state.path(), &app_id, "profiles", 0).0;
    assert_eq!(stored.get(&b"b"[..]).map(Vec::as_slice), Some(&b"profile of b"[..]));
}

/// In-memory stores past `max_state_memory`: `run` ends with
/// `Error::StateMemory` naming the store partition (never an OOM kill), and
/// what was committed before is a prefix of the changelog.
#[test]
fn in_memory_stores_past_the_memory_bound_end_run_with_a_typed_error() {
    init_tracing();
    let Fixture { input, app, state } = fixture("heap-bound", 1);
    // 24 MiB of values against the smallest bound (16 MiB).
    let records: Vec<KeyedRecord> = (0..24_000).map(|i| (0, format!("k{i:06}").into_bytes(), Some(vec![b'x'; 1024]))).collect();
    produce(&input, &records);
    let builder = builder(&app, &input, state.path())
        .store(kstate::StoreDefinition::new("big").in_memory())
        .max_state_memory(16 << 20);
    let running = Running::start(builder, |ctx, rec| {
        ctx.store("big")?.put(rec.key.unwrap_or_default(), rec.value.unwrap_or_default())
    });
    wait_until("run to end", TIMEOUT, || running.is_finished());
    match running.stop() {
        Err(Error::StateMemory { store, bound, total_bytes, .. }) => {
            assert_eq!((store.as_str(), bound), ("big/0", 16 << 20));
            assert!(total_bytes > bound, "{total_bytes}");
        }
        other => panic!("expected Error::StateMemory, got {other:?}"),
    }
}
