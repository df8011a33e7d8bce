//! Standby replicas and state-aware failover, with several instances as
//! child processes (this test binary started again with `standby_child` and
//! its settings in `KSTATE_CHILD`): a killed owner's tasks land on the
//! instances that held their standbys and replay only the standbys' lag; a
//! rolling restart with static membership restores nothing in full; a
//! frozen instance (SIGSTOP past its session) is fenced and rejoins.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::instances::*;
use common::*;
use kstate::Error;

/// One multi-process test at a time (2 cores).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The child instances' entry point (see `common::instances`).
#[test]
#[ignore = "run by the standby tests as a child process"]
fn standby_child() {
    child_main();
}

#[test]
fn a_killed_owner_s_tasks_move_to_their_standbys_and_replay_only_the_lag() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("failover", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let pre = prefill(&input, 5_000);
    let mut instances: Vec<Instance> =
        ["a", "b", "c"].iter().map(|n| Instance::start(n, &bootstrap, &app, &input, dir, "")).collect();
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    let before = balanced(&mut instances, Duration::from_secs(90));
    // Standbys copy the changelogs (10k records per partition) and follow.
    std::thread::sleep(Duration::from_secs(5));
    let victim = instances.pop().unwrap();
    let moved = before[2].0.clone();
    let holder_of = |t: i32| (0..2).find(|i| before[*i].1.contains(&t)).expect("every task has a standby");
    let marks: Vec<usize> = instances.iter().map(Instance::log_len).collect();
    eprintln!("killing c (active {moved:?}); standbys: a {:?}, b {:?}", before[0].1, before[1].1);
    let killed = Instant::now();
    victim.kill();
    // After the session timeout the group moves c's tasks to their standbys.
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        instances.iter_mut().for_each(|i| i.assert_running());
        let now: Vec<_> = instances.iter().map(|i| i.assignment().map(|(_, a, _)| a).unwrap_or_default()).collect();
        if moved.iter().all(|t| now[holder_of(*t)].contains(t)) {
            break now;
        }
        assert!(Instant::now() < deadline, "c's tasks {moved:?} did not reach their standbys: {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("tasks moved {:?} after the kill: a {:?}, b {:?}", killed.elapsed(), after[0], after[1]);
    // Each moved task is processed by its standby's instance, whose restore
    // replayed only the standby's lag.
    for t in &moved {
        let holder = &instances[holder_of(*t)];
        let deadline = Instant::now() + Duration::from_secs(30);
        let prefix = format!("partition={t} ");
        while !holder.lines_after(marks[holder_of(*t)], "KSTATE-PROCESSED").iter().any(|l| l.contains(&prefix)) {
            assert!(Instant::now() < deadline, "task {t} not processed by {} after failover:\n{}", holder.name, holder.tail());
            std::thread::sleep(Duration::from_millis(100));
        }
        let starts = holder.lines_after(marks[holder_of(*t)], "KSTATE-RESTORE-START");
        let ends = holder.lines_after(marks[holder_of(*t)], "KSTATE-RESTORE-END");
        let start = starts.iter().find(|l| l.contains(&prefix)).unwrap_or_else(|| panic!("no restore of {t} on {}", holder.name));
        let end = ends.iter().find(|l| l.contains(&prefix)).unwrap_or_else(|| panic!("no restore end of {t} on {}", holder.name));
        let (from, to) = restore_span(start);
        let restored = restored_records(end) as i64;
        eprintln!("task {t} on {}: restore {from}..{to}, {restored} records replayed", holder.name);
        assert!(to >= 10_000, "the changelog of {t} holds at least the prefill ({to})");
        // The standby was at most a few seconds of input behind (50
        // records/s per partition, two changelog records each), never
        // the whole changelog.
        assert!(restored <= to - from, "replayed {restored} records of a {}-record lag", to - from);
        assert!(to - from < 1_000, "task {t}: the standby lagged {} records of {to}", to - from);
    }
    let mut sent = pre;
    sent.extend(feeder.join(true));
    stop_and_check(instances, &app, &input, &sent, "a failover");
}


#[test]
fn a_rolling_restart_with_static_membership_restores_nothing_in_full() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("rolling", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let pre = prefill(&input, 5_000);
    let names = ["a", "b", "c"];
    let id = |n: &str| format!("{app}-{n}");
    let mut instances: Vec<Instance> =
        names.iter().map(|n| Instance::start(n, &bootstrap, &app, &input, dir, &id(n))).collect();
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    let before = balanced(&mut instances, Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(3));
    // Restores from here on are what the rolling restart caused (the
    // group's start moved tasks to instances without their state).
    let marks: Vec<usize> = instances.iter().map(Instance::log_len).collect();
    let mut highest = vec![None; PARTITIONS as usize];
    for i in 0..instances.len() {
        let mark = instances[i].log_len();
        let old = instances.remove(i);
        old.stop();
        let mut restarted = Instance::start(names[i], &bootstrap, &app, &input, dir, &id(names[i]));
        // Back within the session timeout: it gets its own tasks again and
        // restores only what it did not have (nothing after a clean stop).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            restarted.assert_running();
            instances.iter_mut().for_each(|i| i.assert_running());
            check_committed(&app, &input, &mut highest);
            let processed = restarted.lines_after(mark, "KSTATE-PROCESSED");
            if before[i].0.iter().all(|t| processed.iter().any(|l| l.contains(&format!("partition={t} ")))) {
                break;
            }
            assert!(Instant::now() < deadline, "{} did not get its tasks {:?} back:\n{}", names[i], before[i].0, restarted.tail());
            std::thread::sleep(Duration::from_millis(100));
        }
        for line in restarted.lines_after(mark, "KSTATE-RESTORE-START") {
            let (from, to) = restore_span(&line);
            assert!(to - from < 1_000, "{} restored {from}..{to} after a clean restart: {line}", names[i]);
        }
        eprintln!("{} restarted: {:?}", names[i], restarted.assignment());
        instances.insert(i, restarted);
    }
    // No instance restored a changelog in full during the rolling restart.
    for (instance, mark) in instances.iter().zip(&marks) {
        for line in instance.lines_after(*mark, "KSTATE-RESTORE-END") {
            let records = restored_records(&line);
            assert!(records < 1_000, "{} restored {records} records: {line}", instance.name);
        }
    }
    let mut sent = pre;
    sent.extend(feeder.join(true));
    stop_and_check(instances, &app, &input, &sent, "a rolling restart");
}

#[test]
fn a_frozen_instance_is_fenced_and_rejoins_while_the_others_go_on() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("zombie", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let mut instances: Vec<Instance> =
        ["a", "b", "c"].iter().map(|n| Instance::start(n, &bootstrap, &app, &input, dir, "")).collect();
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    let before = balanced(&mut instances, Duration::from_secs(90));
    let mut highest = vec![None; PARTITIONS as usize];
    std::thread::sleep(Duration::from_secs(2));
    let mark = instances[2].log_len();
    instances[2].signal("-STOP");
    // Past its session timeout (6 s): a and b take over c's tasks.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for i in &mut instances[..2] {
            i.assert_running();
        }
        check_committed(&app, &input, &mut highest);
        let owned: BTreeSet<i32> =
            instances[..2].iter().flat_map(|i| i.assignment().map(|(_, a, _)| a).unwrap_or_default()).collect();
        if owned.len() == PARTITIONS as usize {
            break;
        }
        assert!(Instant::now() < deadline, "a and b did not take over the frozen instance's tasks {:?}", before[2].0);
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    instances[2].signal("-CONT");
    // c learns it was fenced, drops its tasks without committing, rejoins
    // and gets tasks again; a and b never stop.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        instances.iter_mut().for_each(|i| i.assert_running());
        check_committed(&app, &input, &mut highest);
        let text = instances[2].text();
        let lost = text.get(mark..).unwrap_or("").contains("tasks lost; closing them without commit");
        let back = !instances[2].lines_after(mark, "KSTATE-PROCESSED").is_empty();
        if lost && back {
            break;
        }
        assert!(Instant::now() < deadline, "the frozen instance did not rejoin:\n{}", instances[2].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    balanced(&mut instances, Duration::from_secs(60));
    // The zombie commits only while the coordinator confirms it. A commit
    // it had in flight when it froze still reaches the changelog when it
    // wakes up (at-least-once has no broker-side fence; the README's
    // "zombie instance" row): the new owner of such a task finds records it
    // did not write and re-initialises that task. That is the only failure
    // allowed here, and only for a task the zombie owned.
    for i in &instances[..2] {
        for line in i.text().lines().filter(|l| l.contains("task failed; closing it without commit")) {
            let partition: i32 = field(line, "partition").and_then(|p| p.parse().ok()).unwrap_or(-1);
            assert!(
                line.contains("has records this instance did not write") && before[2].0.contains(&partition),
                "{} re-initialised a task for another reason than the zombie's last commit:\n{}",
                i.name,
                i.around(line)
            );
        }
    }
    let sent = feeder.join(true);
    stop_and_check(instances, &app, &input, &sent, "a zombie");
}

#[test]
fn a_task_demoted_to_a_standby_and_promoted_again_reads_what_the_other_owner_wrote() {
    // a owns every task and reads its counts back (its read cache holds
    // them); b joins and takes half, which a keeps as standbys in the same
    // process and follows; b dies and a takes them back. Each count must
    // go on from what b committed, not from what a last read.
    let _serial = serial();
    let Fixture { input, app, state } = fixture("demoted", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let options = "eos=1;count=1";
    let pre = prefill(&input, 2_000);
    let mut instances = vec![Instance::start_opts("a", &bootstrap, &app, &input, dir, "", ONE_STANDBY, options)];
    wait_all_committed_at(&bootstrap, &app, &input, PARTITIONS, Duration::from_secs(120));
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    instances.push(Instance::start_opts("b", &bootstrap, &app, &input, dir, "", ONE_STANDBY, options));
    let after = balanced(&mut instances, Duration::from_secs(120));
    let moved = after[1].0.clone();
    assert!(
        instances[0].text().contains("active task demoted to standby"),
        "a kept none of b's tasks as a standby in its own process:\n{}",
        instances[0].tail()
    );
    // b counts on; a's standbys follow its changelog.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !moved.iter().all(|t| instances[1].lines_after(0, "KSTATE-PROCESSED").iter().any(|l| l.contains(&format!("partition={t} ")))) {
        assert!(Instant::now() < deadline, "b does not process {moved:?}:\n{}", instances[1].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    let mark = instances[0].log_len();
    instances.pop().unwrap().kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !moved.iter().all(|t| instances[0].lines_after(mark, "KSTATE-PROCESSED").iter().any(|l| l.contains(&format!("partition={t} ")))) {
        instances[0].assert_running();
        assert!(Instant::now() < deadline, "a did not take {moved:?} back:\n{}", instances[0].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let mut sent = pre;
    sent.extend(feeder.join(true));
    let a_state = instances[0].state.clone();
    stop_and_check(instances, &app, &input, &sent, "a demotion and a promotion back");
    for p in 0..PARTITIONS {
        let expected = sent.iter().filter(|r| r.0 == p).count();
        let (counts, _) = read_store_dir(&a_state, &app, "c", p);
        let found = counts.get(format!("n{p}").as_bytes()).map(|v| String::from_utf8_lossy(v).to_string());
        assert_eq!(found, Some(expected.to_string()), "partition {p}'s count (moved: {moved:?})");
    }
}

#[test]
fn the_state_of_a_task_that_moved_away_is_deleted_after_the_cleanup_delay() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("cleanup", 2);
    produce(&input, &[(0, b"a".to_vec(), Some(b"1".to_vec())), (1, b"b".to_vec(), Some(b"1".to_vec()))]);
    let second_state = tempfile::tempdir().unwrap();
    let counting = |dir: &Path| {
        builder(&app, &input, dir).store(common::store("s")).state_cleanup_delay(Duration::from_secs(2))
    };
    let put = |ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>| -> Result<(), Error> {
        ctx.store("s")?.put(rec.key.unwrap(), rec.value.unwrap())
    };
    let first = Running::start(counting(state.path()), put);
    let dir = |p: i32| state.path().join(&app).join("s").join(p.to_string());
    wait_until("both tasks on the first instance", TIMEOUT, || dir(0).is_dir() && dir(1).is_dir());
    wait_all_committed_at(&bootstrap(), &app, &input, 2, TIMEOUT);
    let second = Running::start(counting(second_state.path()), put);
    // One task moves to the second instance; its directory on the first
    // goes once it has been unowned for 2 s; the other stays.
    let moved_away = || !dir(0).exists() || !dir(1).exists();
    wait_until("the moved task's directory to be deleted", Duration::from_secs(40), moved_away);
    let kept = if dir(0).exists() { 0 } else { 1 };
    std::thread::sleep(Duration::from_secs(3));
    assert!(dir(kept).is_dir(), "the task still held was deleted");
    first.stop().unwrap();
    second.stop().unwrap();
}

#[test]
fn a_processor_stuck_past_max_poll_interval_gives_its_tasks_away() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("stuck", 2);
    let second_state = tempfile::tempdir().unwrap();
    let (first_times, second_times) = (ProcessedTimes::default(), ProcessedTimes::default());
    let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = |dir: &Path, times: &ProcessedTimes, stall: bool| {
        let (times, stalled) = (times.clone(), stalled.clone());
        let builder = builder(&app, &input, dir).store(common::store("s")).kafka_config("max.poll.interval.ms", "8000");
        Running::start(builder, move |ctx, rec| {
            if stall && rec.value_str() == Some("stall") && !stalled.swap(true, std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(14));
            }
            let s = ctx.store("s")?;
            for (k, v) in record_writes(rec.key.unwrap(), rec.value.unwrap()) {
                s.put(&k, &v)?;
            }
            times.record(rec.partition);
            Ok(())
        })
    };
    let mut sent: Vec<KeyedRecord> = (0..20).map(|i| (i % 2, format!("k{}", i % 2).into_bytes(), Some(format!("{i}").into_bytes()))).collect();
    produce(&input, &sent);
    let first = start(state.path(), &first_times, true);
    wait_until("the first instance to process", TIMEOUT, || first_times.count(0) > 0 && first_times.count(1) > 0);
    let second = start(second_state.path(), &second_times, false);
    // Records for both partitions until the second instance processes some.
    let mut next = 20;
    wait_until("the second instance to get a partition", TIMEOUT, || {
        let batch: Vec<KeyedRecord> =
            (next..next + 2).map(|i| (i % 2, format!("k{}", i % 2).into_bytes(), Some(format!("{i}").into_bytes()))).collect();
        next += 2;
        produce(&input, &batch);
        sent.extend(batch);
        std::thread::sleep(Duration::from_millis(200));
        second_times.count(0) + second_times.count(1) > 0
    });
    let theirs = if second_times.count(0) > 0 { 1 } else { 0 };
    // The first instance's processor gets stuck for 14 s on this record.
    let stall = vec![(theirs, format!("k{theirs}").into_bytes(), Some(b"stall".to_vec()))];
    produce(&input, &stall);
    sent.extend(stall);
    let stuck_at = Instant::now();
    wait_until("the stuck instance's partition to move", Duration::from_secs(30), || second_times.count(theirs) > 0);
    let moved_after = stuck_at.elapsed();
    eprintln!("partition {theirs} moved {moved_after:?} after the processor got stuck");
    assert!(moved_after < Duration::from_secs(14), "it waited for the stuck processor ({moved_after:?})");
    let more: Vec<KeyedRecord> = (next..next + 20).map(|i| (i % 2, format!("k{}", i % 2).into_bytes(), Some(format!("{i}").into_bytes()))).collect();
    produce(&input, &more);
    sent.extend(more);
    wait_all_committed_at(&bootstrap(), &app, &input, 2, Duration::from_secs(60));
    assert!(!first.is_finished() && !second.is_finished(), "both instances keep running");
    first.stop().expect("the stuck instance comes back and stops cleanly");
    second.stop().expect("clean stop");
    assert_same_state(&changelog_state_at(&bootstrap(), &app, "s", 2), &model_of(&sent), "the changelogs");
}

#[test]
fn a_standby_that_followed_longer_than_the_tombstone_retention_is_still_promoted_warm() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("retention", PARTITIONS);
    // A changelog whose tombstones may be dropped 15 s after cleaning: local
    // state whose age bound is older than that is wiped before use.
    let changelog = kstate::changelog_topic(&app, "s");
    create_topic(&changelog, PARTITIONS, &[("cleanup.policy", "compact"), ("delete.retention.ms", "15000")]);
    let dir = state.path();
    let bootstrap = bootstrap();
    let pre = prefill(&input, 2_000);
    // a runs every task first (its commits record how fresh its stores
    // are); when b joins, half of them move and stay on a as standbys,
    // with the age bound of their last active commit.
    let mut instances = vec![Instance::start("a", &bootstrap, &app, &input, dir, "")];
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 200, 1_000_000);
    let deadline = Instant::now() + Duration::from_secs(60);
    while instances[0].lines_after(0, "KSTATE-PROCESSED").len() < PARTITIONS as usize {
        instances[0].assert_running();
        assert!(Instant::now() < deadline, "a did not process every partition:\n{}", instances[0].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    instances.push(Instance::start("b", &bootstrap, &app, &input, dir, ""));
    let before = balanced(&mut instances, Duration::from_secs(90));
    // The standbys follow for longer than the retention: unless they record
    // how fresh they are as they go, their bound is older than it when
    // promoted, and they are wiped and restored in full.
    std::thread::sleep(Duration::from_secs(22));
    let mark = instances[0].log_len();
    instances.pop().unwrap().kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !before[1].0.iter().all(|t| instances[0].assignment().is_some_and(|(_, a, _)| a.contains(t))) {
        instances[0].assert_running();
        assert!(Instant::now() < deadline, "b's tasks did not move to a:\n{}", instances[0].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while instances[0].lines_after(mark, "KSTATE-RESTORE-END").len() < before[1].0.len() {
        assert!(Instant::now() < deadline, "the promoted standbys did not finish restoring:\n{}", instances[0].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = instances[0].text();
    assert!(!text[mark..].contains("wiping it for a full restore"), "a promoted standby was wiped:\n{}", instances[0].tail());
    for line in instances[0].lines_after(mark, "KSTATE-RESTORE-START") {
        let (from, to) = restore_span(&line);
        assert!(to >= 4_000 && to - from < 1_000, "not a lag-only restore: {line}");
    }
    let mut sent = pre;
    sent.extend(feeder.join(true));
    stop_and_check(instances, &app, &input, &sent, "following past the tombstone retention");
}

/// The longest gap between two processed records of any partition, over
/// every instance's `KSTATE-ALIVE` lines between `from_ms` and `to_ms`
/// (wall clock): (gap, partition).
fn longest_pause(instances: &[&Instance], from_ms: u128, to_ms: u128) -> (Duration, i32) {
    let mut times: BTreeMap<i32, Vec<u128>> = BTreeMap::new();
    for i in instances {
        for line in i.lines_after(0, "KSTATE-ALIVE") {
            let (p, ms): (i32, u128) = (field(&line, "partition").unwrap().parse().unwrap(), field(&line, "ms").unwrap().parse().unwrap());
            if (from_ms..=to_ms).contains(&ms) {
                times.entry(p).or_default().push(ms);
            }
        }
    }
    let mut worst = (Duration::ZERO, -1);
    for p in 0..PARTITIONS {
        let mut t = times.remove(&p).unwrap_or_default();
        assert!(!t.is_empty(), "partition {p} was not processed between {from_ms} and {to_ms}");
        t.sort_unstable();
        let edges = std::iter::once(from_ms).chain(t.iter().copied()).chain(std::iter::once(to_ms)).collect::<Vec<_>>();
        for w in edges.windows(2) {
            let gap = Duration::from_millis((w[1] - w[0]) as u64);
            if gap > worst.0 {
                worst = (gap, p);
            }
        }
    }
    worst
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// Scale-out settings: no standbys (warmups do the moving), Kafka Streams'
/// acceptable lag and warmup count, a probing interval the early requests
/// of caught-up warmups must beat.
const WARMUPS_ONLY: Placement = Placement { standbys: 0, acceptable_lag: 10_000, probing: Duration::from_secs(60) };

/// The longest processing pause of any partition a scale-out may cause
/// (a cooperative handover of a caught-up task: revoke and commit on the
/// giver, one more rebalance round, the receiver's lag-only restore), with
/// room for a debug build on a busy 2-core machine.
const SCALE_OUT_PAUSE: Duration = Duration::from_secs(5);

#[test]
fn scaling_out_never_moves_a_partition_to_a_cold_instance_and_scaling_in_loses_nothing() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("scaleout", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    // 85k input records per partition, two store records each: 1.02M
    // changelog records, 170k per task (a cold move would replay them).
    let pre = prefill(&input, 85_000);
    let mut instances = vec![Instance::start_with("a", &bootstrap, &app, &input, dir, "", WARMUPS_ONLY)];
    wait_all_committed_at(&bootstrap, &app, &input, PARTITIONS, Duration::from_secs(240));
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 600, 300, 1_000_000);
    std::thread::sleep(Duration::from_secs(2));
    let (started, started_ms) = (Instant::now(), wall_ms());
    let generation_before = instances[0].assignment().unwrap().0;
    for name in ["b", "c"] {
        instances.push(Instance::start_with(name, &bootstrap, &app, &input, dir, "", WARMUPS_ONLY));
    }
    let after = balanced_with(&mut instances, 0, Duration::from_secs(150));
    // Balanced means running: each instance processes its tasks.
    let deadline = Instant::now() + Duration::from_secs(120);
    for (i, (active, _)) in instances.iter_mut().zip(&after) {
        while !active.iter().all(|t| i.lines_after(0, "KSTATE-PROCESSED").iter().any(|l| l.contains(&format!("partition={t} ")))) {
            i.assert_running();
            assert!(Instant::now() < deadline, "{} does not process its tasks {active:?}:\n{}", i.name, i.tail());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (took, balanced_ms) = (started.elapsed(), wall_ms());
    let generations = instances[0].assignment().unwrap().0 - generation_before;
    let asked: usize = instances.iter().map(|i| i.text().matches("asking for a rebalance to move their tasks").count()).sum();
    let probes: usize = instances.iter().map(|i| i.text().matches("probing rebalance: moves wait for warmups").count()).sum();
    eprintln!("balanced {took:?} after b and c started: {after:?}; {generations} generations, {asked} early rebalance requests, {probes} probing-interval rebalances");
    // Four tasks move, two warmups at a time: two rounds of warmups, each
    // ended by the warmups' own requests (b's and c's: up to four, and room
    // for one repeat each when the leader measured a moment later and found
    // a copy not yet caught up), never by the probing interval.
    assert!(asked <= 6 && probes == 0, "{asked} requests, {probes} interval probes");
    assert!(took < WARMUPS_ONLY.probing, "balanced only after {took:?}");
    // No partition went to an instance whose copy lagged more than the
    // acceptable lag: every restore b and c ran replayed at most that.
    for i in &instances[1..] {
        for line in i.lines_after(0, "KSTATE-RESTORE-END") {
            let records = restored_records(&line);
            assert!(records <= WARMUPS_ONLY.acceptable_lag, "{} ran a task after replaying {records} records: {line}", i.name);
        }
    }
    // A balanced group without warmups stays as it is.
    let settled = instances[0].assignment().unwrap().0;
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(instances[0].assignment().unwrap().0, settled, "a balanced group rebalanced again");
    let (pause, partition) = longest_pause(&instances.iter().collect::<Vec<_>>(), started_ms, balanced_ms + 2_000);
    eprintln!("longest processing pause during the scale-out: {pause:?} (partition {partition})");
    assert!(pause < SCALE_OUT_PAUSE, "partition {partition} paused {pause:?}");

    // Scale in 3 -> 1: b and c stop; a takes their tasks back from the
    // copies it kept on disk (state_cleanup_delay), replaying only what
    // changed since, and nothing is lost.
    let mark = instances[0].log_len();
    let moved: BTreeSet<i32> = after[1].0.union(&after[2].0).copied().collect();
    for i in instances.drain(1..) {
        i.stop();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while instances[0].assignment().is_none_or(|(_, a, _)| a.len() != PARTITIONS as usize)
        || instances[0].lines_after(mark, "KSTATE-RESTORE-END").len() < moved.len()
    {
        instances[0].assert_running();
        assert!(Instant::now() < deadline, "a did not take every task back:\n{}", instances[0].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    for line in instances[0].lines_after(mark, "KSTATE-RESTORE-START") {
        let (from, to) = restore_span(&line);
        assert!(from > 100_000 && to - from < 100_000, "a replayed more than its copy lagged: {line}");
    }
    let mut sent = pre;
    sent.extend(feeder.join(true));
    stop_and_check(instances, &app, &input, &sent, "scaling out and in");
}

#[test]
fn an_instance_back_after_a_while_gets_warmups_before_its_tasks() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("comeback", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let pre = prefill(&input, 5_000);
    // A small acceptable lag, so that 10 s away is far behind.
    let placement = Placement { standbys: 0, acceptable_lag: 1_000, probing: Duration::from_secs(60) };
    let mut instances: Vec<Instance> =
        ["a", "b", "c"].iter().map(|n| Instance::start_with(n, &bootstrap, &app, &input, dir, "", placement)).collect();
    // 100 input records/s per partition: 200 changelog records/s per task.
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 6_000, 600, 1_000_000);
    balanced_with(&mut instances, 0, Duration::from_secs(120));
    let victim = instances.pop().unwrap();
    let mark = victim.log_len();
    victim.kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    while instances.iter().map(|i| i.assignment().map_or(0, |(_, a, _)| a.len())).sum::<usize>() < PARTITIONS as usize {
        instances.iter_mut().for_each(|i| i.assert_running());
        assert!(Instant::now() < deadline, "a and b did not take c's tasks");
        std::thread::sleep(Duration::from_millis(100));
    }
    // c's copies fall ~2,000 records behind.
    std::thread::sleep(Duration::from_secs(10));
    let mut c = Instance::start_with("c", &bootstrap, &app, &input, dir, "", placement);
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        c.assert_running();
        let text = c.text();
        if let Some(line) = text.get(mark..).unwrap_or("").lines().find(|l| l.contains("assignment received")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "c got no assignment:\n{}", c.tail());
        std::thread::sleep(Duration::from_millis(100));
    };
    // Warmups: not tasks handed over at once (a cooperative handover would
    // give them after one round whatever c's lag).
    let (active, warmup) = (set_of(field(&first, "active").unwrap()), set_of(field(&first, "warmup").unwrap()));
    assert!(active.is_empty() && !warmup.is_empty(), "c's first assignment is not warmups only: {first}");
    instances.push(c);
    balanced_with(&mut instances, 0, Duration::from_secs(50));
    for line in instances[2].lines_after(mark, "KSTATE-RESTORE-END") {
        let records = restored_records(&line);
        assert!(records <= placement.acceptable_lag, "c ran a task after replaying {records} records: {line}");
    }
    let mut sent = pre;
    sent.extend(feeder.join(true));
    stop_and_check(instances, &app, &input, &sent, "a comeback");
}
