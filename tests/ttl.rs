//! TTL stores against the real broker: an expired entry is invisible at
//! once (get and scans), its tombstone reaches the changelog within the
//! cleanup interval, a standby drops it too, and neither a restore from
//! the changelog nor a restart brings it back; on stream time, expiry
//! follows the task's stream time and survives a restart.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use kstate::{ProcessorContext, Record, TimeDomain};

/// What the probe saw at each `check` record: (key → value) via `get` of
/// every key written so far, and the number of entries a full scan returned.
type Checks = Arc<Mutex<Vec<(BTreeMap<Vec<u8>, Vec<u8>>, usize)>>>;

/// Input `put <key>` writes `<key> -> v`; input `check` records what is visible.
fn probe(checks: Checks, keys: Vec<Vec<u8>>) -> impl FnMut(&mut ProcessorContext<'_>, &Record<'_>) -> Result<(), kstate::Error> + Send + 'static {
    move |ctx, rec| {
        let value = rec.value_str().unwrap_or_default().to_string();
        let store = ctx.store("s")?;
        if let Some(key) = value.split(' ').nth(1).filter(|_| value.starts_with("put")) {
            store.put(key.as_bytes(), b"v")?;
        } else if value.starts_with("check") {
            let mut visible = BTreeMap::new();
            for k in &keys {
                if let Some(v) = store.get(k)? {
                    visible.insert(k.clone(), v);
                }
            }
            let scanned = store.all().count();
            checks.lock().unwrap().push((visible, scanned));
        }
        Ok(())
    }
}

fn send(input: &str, values: &[String]) {
    produce(input, &values.iter().map(|v| (0, b"k".to_vec(), Some(v.clone().into_bytes()))).collect::<Vec<_>>());
}

fn check(input: &str, checks: &Checks, value: &str) -> (BTreeMap<Vec<u8>, Vec<u8>>, usize) {
    let before = checks.lock().unwrap().len();
    send(input, &[value.to_string()]);
    wait_until("the check record", TIMEOUT, || checks.lock().unwrap().len() > before);
    checks.lock().unwrap()[before].clone()
}

#[test]
fn expired_entries_are_invisible_at_once_tombstoned_and_never_restored_or_kept_by_a_standby() {
    const TTL: Duration = Duration::from_secs(3);
    let Fixture { input, app, state } = fixture("ttl-wall", 1);
    let keys: Vec<Vec<u8>> = (0..100).map(|i| format!("k{i:03}").into_bytes()).collect();
    let checks: Checks = Arc::default();
    let store = || common::store("s").ttl(TTL, TimeDomain::WallClock).ttl_cleanup_interval(Duration::from_secs(1));
    let start = |dir: &std::path::Path, standbys: usize| {
        Running::start(
            builder(&app, &input, dir).store(store()).num_standby_replicas(standbys),
            probe(checks.clone(), keys.clone()),
        )
    };
    let (dir_a, dir_b) = (state.path().join("a"), state.path().join("b"));
    let a = start(&dir_a, 1);
    // b joins and follows the task as a standby (its probe sees no records).
    let b = start(&dir_b, 1);
    let written = Instant::now();
    send(&input, &keys.iter().map(|k| format!("put {}", String::from_utf8_lossy(k))).collect::<Vec<_>>());
    let (visible, scanned) = check(&input, &checks, "check");
    assert!(written.elapsed() < TTL, "the first check came too late to test anything ({:?})", written.elapsed());
    assert_eq!((visible.len(), scanned), (100, 100), "live entries are visible");
    // From now: the puts were processed (and timestamped) before this
    // check, though maybe well after `written` (the first send after the
    // topic was created can wait for its metadata).
    std::thread::sleep(TTL + Duration::from_millis(200));
    // Expired: invisible at once to get and scans, before any sweep ran.
    let (visible, scanned) = check(&input, &checks, "check");
    assert_eq!((visible.len(), scanned), (0, 0), "expired entries are invisible");
    // Their tombstones reach the changelog within the cleanup interval.
    let expired_at = Instant::now();
    wait_until("the tombstones in the changelog", Duration::from_secs(20), || {
        changelog_state_at(&bootstrap(), &app, "s", 1).is_empty()
    });
    eprintln!("changelog tombstoned {:?} after the entries expired", expired_at.elapsed());
    std::thread::sleep(Duration::from_secs(1)); // b applies them
    a.stop().unwrap();
    b.stop().unwrap();
    let topic = kstate::changelog_topic(&app, "s");
    let tombstones = read_partition(&topic, 0).iter().filter(|(_, _, v)| v.is_none()).count();
    assert_eq!(tombstones, 100, "one tombstone per expired key");
    let end = end_offset_at(&bootstrap(), &topic, 0);
    for (who, dir) in [("the active", &dir_a), ("the standby", &dir_b)] {
        let (data, checkpoint) = read_store_dir(dir, &app, "s", 0);
        assert_eq!(checkpoint, Some(end - 1), "{who} applied the whole changelog, puts and tombstones");
        assert!(data.is_empty(), "{who}'s RocksDB still holds {} expired entries", data.len());
    }
    // A restore from the changelog into an empty state dir brings none back.
    let dir_c = state.path().join("c");
    let c = start(&dir_c, 0);
    let (visible, scanned) = check(&input, &checks, "check");
    c.stop().unwrap();
    assert_eq!((visible.len(), scanned), (0, 0), "nothing expired came back with the restore");
    assert!(read_store_dir(&dir_c, &app, "s", 0).0.is_empty());
}

#[test]
fn stream_time_ttl_follows_the_tasks_stream_time_across_a_restart() {
    let Fixture { input, app, state } = fixture("ttl-stream", 1);
    let keys: Vec<Vec<u8>> = vec![b"a".to_vec(), b"b".to_vec()];
    let checks: Checks = Arc::default();
    // Value `<event time> <op> ...`.
    let run = || {
        Running::start(
            builder(&app, &input, state.path())
                .store(common::store("s").ttl(Duration::from_millis(100), TimeDomain::StreamTime))
                .timers(true)
                .timestamp_extractor(|rec, _| rec.value_str().and_then(|v| v.split(' ').next()?.parse().ok()).unwrap_or(-1)),
            {
                let mut inner = probe(checks.clone(), keys.clone());
                move |ctx: &mut ProcessorContext<'_>, rec: &Record<'_>| {
                    // Drop the event time: `<time> put a` → `put a`.
                    let value = rec.value_str().unwrap().split_once(' ').unwrap().1.to_string();
                    let stripped = Record { value: Some(value.as_bytes()), ..*rec };
                    inner(ctx, &stripped)
                }
            },
        )
    };
    let r = run();
    send(&input, &["1000 put a".into(), "1050 put b".into()]);
    let visible = |c: (BTreeMap<Vec<u8>, Vec<u8>>, usize)| (c.0.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect::<Vec<_>>(), c.1);
    assert_eq!(visible(check(&input, &checks, "1099 check")), (vec!["a".into(), "b".into()], 2), "both live at 1099");
    assert_eq!(visible(check(&input, &checks, "1100 check")), (vec!["b".into()], 1), "a expired at 1000 + 100");
    assert_eq!(visible(check(&input, &checks, "1150 check")), (vec![], 0), "b expired at 1150");
    // An earlier event time does not move stream time back.
    assert_eq!(visible(check(&input, &checks, "900 check")), (vec![], 0));
    wait_all_committed_at(&bootstrap(), &app, &input, 1, TIMEOUT);
    r.stop().unwrap();
    // Restarted: stream time (1150) and the expiry come back with the task.
    let r = run();
    assert_eq!(visible(check(&input, &checks, "950 check")), (vec![], 0), "still expired after a restart");
    r.stop().unwrap();
}

#[test]
fn a_stream_time_ttl_store_refuses_writes_before_the_first_record_and_turns_timers_on() {
    use kstate::{Processor, ProcessorError};
    let Fixture { input, app, state } = fixture("ttl-early", 1);
    struct Early(Arc<Mutex<Vec<String>>>);
    impl Processor for Early {
        fn init(&mut self, ctx: &mut ProcessorContext<'_>) -> Result<(), ProcessorError> {
            let e = ctx.store("s")?.put(b"k", b"v").unwrap_err();
            self.0.lock().unwrap().push(e.to_string());
            Ok(())
        }
        fn process(&mut self, ctx: &mut ProcessorContext<'_>, _: &Record<'_>) -> Result<(), ProcessorError> {
            ctx.store("s")?.put(b"k", b"v")?;
            self.0.lock().unwrap().push("written".into());
            Ok(())
        }
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let b = builder(&app, &input, state.path()).store(common::store("s").ttl(Duration::from_secs(60), TimeDomain::StreamTime));
    let r = Running::start_processor(b, move |_| Early(l.clone()));
    produce(&input, &[(0, b"k".to_vec(), Some(b"v".to_vec()))]);
    wait_until("the record", TIMEOUT, || log.lock().unwrap().len() == 2);
    r.stop().unwrap();
    let log = log.lock().unwrap();
    assert!(log[0].contains("has no stream time yet"), "{}", log[0]);
    assert_eq!(log[1], "written", "after the first record the store takes writes");
    // The time store exists: stream time is durable for the TTL.
    assert!(state.path().join(&app).join(kstate::TIME_STORE).is_dir(), "a stream-time TTL keeps stream time in the time store");
}
