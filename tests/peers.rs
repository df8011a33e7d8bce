//! Failure detection among the instances (`peer_address`), with three
//! instances as child processes and the Kafka clients' default session
//! timeout (45 s): a killed instance is dropped from the group at once and
//! its standbys take over within a couple of seconds, after one rebalance
//! however many instances saw it die; a frozen instance is dropped after
//! `peer_timeout`, writes nothing once dropped (exactly-once outputs hold
//! every input once) and comes back.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::instances::*;
use common::*;

/// One multi-process test at a time (2 cores).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The child instances' entry point (see `common::instances`).
#[test]
#[ignore = "run by the peer tests as a child process"]
fn standby_child() {
    child_main();
}

/// Instances a, b and c of `app`, each with `options(name)` (see
/// `Instance::start_opts`) and one standby per task.
fn three(app: &str, input: &str, dir: &std::path::Path, options: impl Fn(&str) -> String) -> Vec<Instance> {
    let bootstrap = bootstrap();
    ["a", "b", "c"].iter().map(|n| Instance::start_opts(n, &bootstrap, app, input, dir, "", ONE_STANDBY, &options(n))).collect()
}

/// Kafka's default session timeout and heartbeat: what detection beats.
const DEFAULTS: &str = "session_ms=45000;heartbeat_ms=3000";

/// How long after a kill the standbys must be processing the moved
/// tasks. The detection itself takes milliseconds; the margin is for a
/// loaded 2-core machine (the failover benchmark reports the real figure).
const TAKEOVER_BOUND: Duration = Duration::from_millis(2_500);

/// The last 30 lines of an instance's log that are kstate's own (not the
/// child's `KSTATE-` markers).
fn log_lines(instance: &Instance) -> String {
    let text = instance.text();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("KSTATE-")).collect();
    format!("--- {}:\n{}", instance.name, lines[lines.len().saturating_sub(30)..].join("\n"))
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// The wall-clock time (ms) of `instance`'s first `KSTATE-ALIVE` line for
/// `partition` after log byte `mark`, if any.
fn first_alive(instance: &Instance, mark: usize, partition: i32) -> Option<u128> {
    let prefix = format!("KSTATE-ALIVE partition={partition} ");
    instance
        .lines_after(mark, "KSTATE-ALIVE")
        .iter()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit("ms=").next()?.trim().parse().ok())
        .next()
}

#[test]
fn a_killed_instance_is_dropped_at_once_once_and_its_standbys_take_over() {
    let _serial = serial();
    // KSTATE_TEST_NO_PEERS: the mutation check (the takeover then waits
    // for the 45 s session timeout and the test fails on time).
    let detection = std::env::var("KSTATE_TEST_NO_PEERS").is_err();
    let Fixture { input, app, state } = fixture("peerkill", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let pre = prefill(&input, 2_000);
    let options = if detection { format!("{DEFAULTS};peer=127.0.0.1:0") } else { DEFAULTS.to_string() };
    let mut instances = three(&app, &input, dir, |_| options.clone());
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    let before = balanced(&mut instances, Duration::from_secs(90));
    let generation = instances[0].assignment().unwrap().0;
    std::thread::sleep(Duration::from_secs(3));
    let victim = instances.pop().unwrap();
    let moved = before[2].0.clone();
    let holder_of = |t: i32| (0..2).find(|i| before[*i].1.contains(&t)).expect("every task has a standby");
    let marks: Vec<usize> = instances.iter().map(Instance::log_len).collect();
    let killed_ms = wall_ms();
    victim.kill();
    eprintln!("killed at {killed_ms} ms (the process was gone {} ms later)", wall_ms() - killed_ms);
    // Each moved task runs on its standby's instance within the bound.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut took = BTreeMap::new();
    while took.len() < moved.len() {
        instances.iter_mut().for_each(|i| i.assert_running());
        for &t in &moved {
            if let Some(ms) = first_alive(&instances[holder_of(t)], marks[holder_of(t)], t) {
                took.entry(t).or_insert(Duration::from_millis((ms.saturating_sub(killed_ms)) as u64));
            }
        }
        assert!(Instant::now() < deadline, "the killed instance's tasks {moved:?} were not taken over: {took:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("kill -> first record on the standbys' instances: {took:?}");
    for (i, mark) in instances.iter().zip(&marks) {
        let text = i.text();
        let steps = ["peer process gone", "dropped a peer", "already out of the group", "assignment received", "after dropping a peer", "task running"];
        for line in text.get(*mark..).unwrap_or("").lines().filter(|l| steps.iter().any(|s| l.contains(s))) {
            eprintln!("{}: {line}", i.name);
        }
    }
    for (t, d) in &took {
        assert!(*d <= TAKEOVER_BOUND, "task {t} ran again {d:?} after the kill (bound {TAKEOVER_BOUND:?}): {took:?}");
    }
    // One rebalance for the death, however many survivors noticed it: the
    // first assignment each applied after the kill is the next generation,
    // and it runs every task.
    let after = balanced_with(&mut instances, 1, Duration::from_secs(60));
    let mut actives = BTreeSet::new();
    for (i, mark) in instances.iter().zip(&marks) {
        let text = i.text();
        let line = text[*mark..].lines().find(|l| l.contains("applying the group's assignment")).expect("an assignment after the kill");
        let g: i64 = field(line, "generation").unwrap().parse().unwrap();
        assert_eq!(g, generation + 1, "{}: the first assignment after the kill (from generation {generation}): {line}", i.name);
        actives.extend(set_of(field(line, "active").unwrap()));
    }
    assert_eq!(actives.len(), PARTITIONS as usize, "the first assignment after the kill runs every task");
    // The survivors' links broke at once: usually both find the process
    // gone and both try to drop it (the second finds it out already).
    let noticed = |what: &str| instances.iter().zip(&marks).filter(|(i, m)| i.text().get(**m..).unwrap_or("").contains(what)).count();
    let (gone, dropped) = (noticed("peer process gone"), noticed("dropped a peer from the group"));
    eprintln!("{gone} survivors found the process gone, {dropped} dropped it");
    assert!(dropped >= 1, "no survivor dropped the killed instance");
    eprintln!("after the kill: a {:?}, b {:?}", after[0], after[1]);
    let mut sent = pre;
    sent.extend(feeder.join(true));
    stop_and_check(instances, &app, &input, &sent, "a killed instance dropped by its peers");
}

#[test]
fn an_instance_cut_off_from_its_peers_stops_writing_before_they_drop_it() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("peerlease", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let peer_timeout = Duration::from_millis(1_000);
    let mute = dir.join("mute-c");
    let options = |name: &str| {
        let mut o = format!("{DEFAULTS};peer=127.0.0.1:0;peer_timeout_ms={}", peer_timeout.as_millis());
        if name == "c" {
            o += &format!(";mute={}", mute.display());
        }
        o
    };
    let mut instances = three(&app, &input, dir, options);
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    let before = balanced(&mut instances, Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(2));
    let marks: Vec<usize> = instances.iter().map(Instance::log_len).collect();
    // c stops pinging (a one-way cut) but keeps processing and reaching the
    // broker: a and b drop it after peer_timeout and take its tasks over,
    // while c learns it is out only at its next heartbeat (up to 3 s
    // later). Its lease ran out before they dropped it: c, committing every
    // 100 ms, writes nothing into the changelogs they now own.
    std::fs::write(&mute, b"").unwrap();
    wait_until("a and b own every task", peer_timeout * 4, || {
        let owned: BTreeSet<i32> =
            instances[..2].iter().flat_map(|i| i.assignment().map(|(_, a, _)| a).unwrap_or_default()).collect();
        owned.len() == PARTITIONS as usize
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !instances[2].text()[marks[2]..].contains("tasks lost; closing them without commit") {
        instances.iter_mut().for_each(|i| i.assert_running());
        assert!(Instant::now() < deadline, "c did not find itself out:\n{}", instances[2].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    let c_log = &instances[2].text()[marks[2]..];
    assert!(c_log.contains("peers' acks stopped: this instance writes nothing"), "c's lease did not run out:\n{}", instances[2].tail());
    // Back in the group (unarmed while muted), then heard again.
    std::fs::remove_file(&mute).unwrap();
    balanced(&mut instances, Duration::from_secs(60));
    if let Ok(keep) = std::env::var("KSTATE_TEST_KEEP_LOGS") {
        for i in &instances {
            std::fs::write(format!("{keep}/{}.log", i.name), i.text()).unwrap();
        }
    }
    for (i, m) in instances[..2].iter().zip(&marks) {
        let failed = "task failed; closing it without commit";
        assert!(!i.text()[*m..].contains(failed), "{} found records it did not write (c's):\n{}", i.name, i.around(failed));
    }
    let dropped_c = instances[..2].iter().zip(&marks).filter(|(i, m)| i.text()[**m..].contains("reason=\"timeout\"")).count();
    assert!(dropped_c >= 1, "neither a nor b dropped c for silence");
    eprintln!("c's tasks before the cut: {:?}", before[2].0);
    let sent = feeder.join(true);
    stop_and_check(instances, &app, &input, &sent, "an instance cut off from its peers");
}

/// Every output record (read `read_committed`): the `partition:offset`
/// of the input record it came from.
fn outputs(topic: &str, partitions: i32) -> Vec<String> {
    (0..partitions)
        .flat_map(|p| read_partition(topic, p))
        .map(|(_, _, v)| String::from_utf8(v.unwrap_or_default()).unwrap())
        .collect()
}

#[test]
fn a_frozen_instance_is_dropped_after_peer_timeout_writes_nothing_after_and_comes_back() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("peerfreeze", PARTITIONS);
    let output = format!("{input}-out");
    create_topic(&output, PARTITIONS, &[]);
    let dir = state.path();
    let bootstrap = bootstrap();
    let peer_timeout = Duration::from_millis(1_000);
    // KSTATE_TEST_NO_PEERS: the mutation check (the takeover then waits
    // for the 45 s session timeout and the test fails on time).
    let peers = if std::env::var("KSTATE_TEST_NO_PEERS").is_err() { ";peer=127.0.0.1:0" } else { "" };
    let options = format!("{DEFAULTS}{peers};peer_timeout_ms={};eos=1;out={output}", peer_timeout.as_millis());
    let mut instances = three(&app, &input, dir, |_| options.clone());
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    let before = balanced(&mut instances, Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(2));
    let mark = instances[2].log_len();
    let survivor_marks: Vec<usize> = instances[..2].iter().map(Instance::log_len).collect();
    instances[2].signal("-STOP");
    let frozen = Instant::now();
    // Within 3x peer_timeout (not the 45 s session) a and b own everything.
    let deadline = frozen + peer_timeout * 3;
    loop {
        let owned: BTreeSet<i32> =
            instances[..2].iter().flat_map(|i| i.assignment().map(|(_, a, _)| a).unwrap_or_default()).collect();
        if owned.len() == PARTITIONS as usize {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a and b did not take over the frozen instance's tasks {:?} within {:?}:\n{}",
            before[2].0,
            peer_timeout * 3,
            instances[0].tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("a and b own every task {:?} after the freeze", frozen.elapsed());
    std::thread::sleep((peer_timeout * 3).saturating_sub(frozen.elapsed()));
    instances[2].signal("-CONT");
    // c finds itself out, closes its tasks without commit, rejoins and
    // gets tasks again; a and b never stop.
    woken_comes_back(&mut instances, 2, mark);
    balanced(&mut instances, Duration::from_secs(60));
    for (i, m) in instances[..2].iter().zip(&survivor_marks) {
        let text = i.text();
        assert!(!text[*m..].contains("task failed; closing it without commit"), "{} re-initialised a task:\n{}", i.name, i.tail());
    }
    let sent = feeder.join(true);
    stop_and_check(instances, &app, &input, &sent, "a frozen instance dropped by its peers");
    // Exactly once: every input record has one committed output, so the
    // frozen instance committed nothing once its tasks were elsewhere.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for id in outputs(&output, PARTITIONS) {
        *seen.entry(id).or_default() += 1;
    }
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(duplicated.is_empty(), "outputs committed twice: {duplicated:?}");
    let mut next = vec![0i64; PARTITIONS as usize];
    for (p, _, _) in &sent {
        let id = format!("{p}:{}", next[*p as usize]);
        next[*p as usize] += 1;
        assert!(seen.contains_key(&id), "no output for input {id}");
    }
}

#[test]
fn a_static_member_that_stops_cleanly_is_not_dropped_and_one_that_is_killed_is() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("peerstatic", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let id = |n: &str| format!("{app}-{n}");
    let options = format!("{DEFAULTS};peer=127.0.0.1:0");
    let start = |n: &str| Instance::start_opts(n, &bootstrap, &app, &input, dir, &id(n), ONE_STANDBY, &options);
    let mut instances: Vec<Instance> = ["a", "b", "c"].iter().map(|n| start(n)).collect();
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    let before = balanced(&mut instances, Duration::from_secs(90));
    let generation = instances[0].assignment().unwrap().0;
    // A clean stop: c says bye and keeps its place (static membership);
    // its peers drop no one, the group does not rebalance, and c back
    // within its session gets its tasks again.
    let marks: Vec<usize> = instances[..2].iter().map(Instance::log_len).collect();
    instances.pop().unwrap().stop();
    std::thread::sleep(Duration::from_secs(3));
    for (i, m) in instances.iter().zip(&marks) {
        assert!(!i.text()[*m..].contains("dropped a peer from the group"), "{} dropped a member that stopped cleanly:\n{}", i.name, i.tail());
        assert_eq!(i.assignment().unwrap().0, generation, "{} rebalanced for a clean stop of a static member", i.name);
    }
    instances.push(start("c"));
    let again = balanced(&mut instances, Duration::from_secs(60));
    assert_eq!(again[2].0, before[2].0, "c came back to its own tasks");
    // A kill: its peers drop it by its instance id at once, its standbys
    // take over, and its restart rejoins.
    std::thread::sleep(Duration::from_secs(2));
    let marks: Vec<usize> = instances[..2].iter().map(Instance::log_len).collect();
    let moved = again[2].0.clone();
    let killed = Instant::now();
    instances.pop().unwrap().kill();
    loop {
        let owned: BTreeSet<i32> =
            instances.iter().flat_map(|i| i.assignment().map(|(_, a, _)| a).unwrap_or_default()).collect();
        if moved.iter().all(|t| owned.contains(t)) {
            break;
        }
        assert!(
            killed.elapsed() < TAKEOVER_BOUND,
            "a and b do not run the killed static member's tasks {moved:?} after {TAKEOVER_BOUND:?}:\n{}\n{}",
            log_lines(&instances[0]),
            log_lines(&instances[1])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("the killed static member's tasks {moved:?} moved after {:?}", killed.elapsed());
    let dropped = instances.iter().zip(&marks).filter(|(i, m)| i.text()[**m..].contains("dropped a peer from the group")).count();
    assert!(dropped >= 1, "no survivor dropped the killed static member");
    instances.push(start("c"));
    balanced(&mut instances, Duration::from_secs(90));
    let sent = feeder.join(true);
    stop_and_check(instances, &app, &input, &sent, "a static member stopped, then killed");
}

/// A stranger on the peer port: connections without the shared secret
/// that say `Bye` for an instance (its incarnation learnt from its own
/// listener's `Welcome`), `Nudge`, garbage or an endless line are refused
/// and logged, and change nothing: a SIGKILL of that instance afterwards
/// is detected at once as usual (an accepted `Bye` would have made the
/// others stop watching it: detection only at the 45 s session timeout).
#[test]
fn a_stranger_without_the_secret_is_refused_and_detection_still_works() {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;
    let _serial = serial();
    let Fixture { input, app, state } = fixture("peerauth", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let options = format!("{DEFAULTS};peer=127.0.0.1:0");
    let mut instances: Vec<Instance> =
        ["a", "b"].iter().map(|n| Instance::start_opts(n, &bootstrap, &app, &input, dir, "", ONE_STANDBY, &options)).collect();
    balanced_with(&mut instances, 1, Duration::from_secs(90));
    let address = |i: &Instance| {
        let text = i.text();
        let line = text.lines().find(|l| l.contains("watching the other instances")).expect("a peer listener").to_string();
        field(&line, "address").expect("its address").to_string()
    };
    let (victim, watcher) = (address(&instances[0]), address(&instances[1]));
    let connect = |at: &str| {
        let s = TcpStream::connect(at).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    };
    // The victim's incarnation, from its listener's welcome (sent before any proof).
    let mut s = connect(&victim);
    writeln!(s, r#"{{"t":"Hello","nonce":"00","group":"{app}","incarnation":7}}"#).unwrap();
    let mut line = String::new();
    BufReader::new(s.try_clone().unwrap()).read_line(&mut line).unwrap();
    let welcome: serde_json::Value = serde_json::from_str(&line).unwrap();
    let incarnation = welcome["incarnation"].as_u64().expect("an incarnation in the welcome");
    assert!(welcome["proof"].as_str().is_some_and(|p| p.len() == 64), "the listener proves the secret: {line}");
    // Its `Bye`, said to the watcher by a stranger: after a wrong proof,
    // and before any proof.
    let mark = instances[1].log_len();
    for proof_first in [true, false] {
        let mut s = connect(&watcher);
        writeln!(s, r#"{{"t":"Hello","nonce":"00","group":"{app}","incarnation":{incarnation},"member":"x"}}"#).unwrap();
        let mut welcome = String::new();
        BufReader::new(s.try_clone().unwrap()).read_line(&mut welcome).unwrap();
        if proof_first {
            let _ = writeln!(s, r#"{{"t":"Proof","proof":"{}"}}"#, "0".repeat(64));
        }
        let _ = writeln!(s, r#"{{"t":"Bye"}}"#);
    }
    // A line without end, sent without pause: cut at 16 KiB.
    let mut s = connect(&watcher);
    let _ = s.write_all(&vec![b'x'; 1 << 20]);
    let mut byte = [0u8; 1];
    match std::io::Read::read(&mut s, &mut byte) {
        Ok(0) => {}
        Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) => {}
        other => panic!("the listener must close a connection whose line never ends: {other:?}"),
    }
    for attack in [r#"{"t":"Nudge"}"#.to_string(), "garbage".into(), "x".repeat(40_000)] {
        let mut s = connect(&watcher);
        let _ = writeln!(s, "{attack}");
    }
    // Something on the network path, after a genuine handshake (played
    // here with the secret): a line without a valid seal (an injected
    // `Bye`, or a sealed line replayed) is refused and changes nothing.
    for replay in [false, true] {
        let mut s = connect(&watcher);
        let mut reader = BufReader::new(s.try_clone().unwrap());
        writeln!(s, r#"{{"t":"Hello","nonce":"c0ffee","group":"{app}","incarnation":{incarnation},"member":"x"}}"#).unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let welcome: serde_json::Value = serde_json::from_str(&line).unwrap();
        let (theirs, listener_incarnation) = (welcome["nonce"].as_str().unwrap(), welcome["incarnation"].as_u64().unwrap());
        let text = |role: &str| format!("kstate-peer-v1\n{role}\n{app}\nc0ffee\n{theirs}\n{incarnation}\n{listener_incarnation}");
        writeln!(s, r#"{{"t":"Proof","proof":"{}"}}"#, hmac_hex(TEST_PEER_SECRET.as_bytes(), &text("caller"))).unwrap();
        if replay {
            let key = hmac_hex(TEST_PEER_SECRET.as_bytes(), &text("session"));
            let nudge = r#"{"t":"Nudge"}"#;
            let sealed = format!("{nudge}\t{}", hmac_hex(key.as_bytes(), &format!("caller\n0\n{nudge}")));
            writeln!(s, "{sealed}").unwrap(); // genuine: counts
            writeln!(s, "{sealed}").unwrap(); // the same line again: refused
        } else {
            writeln!(s, r#"{{"t":"Bye"}}"#).unwrap();
        }
        let mut rest = String::new();
        match reader.read_line(&mut rest) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("the listener must close a link whose line fails its seal (replay: {replay}): {other:?} {rest}"),
        }
    }
    wait_until("the watcher to log the refusal", Duration::from_secs(10), || {
        instances[1].text().get(mark..).unwrap_or("").contains("a connection to the peer listener was refused")
    });
    std::thread::sleep(Duration::from_millis(500));
    // A flood from sixteen other loopback addresses (more than the listener
    // takes before authentication, 16 per address and 128 in all): silent
    // connections (half-open handshakes) renewed as soon as the listener
    // gives up on them, and from one more address garbage, kept up through
    // the kill below. Processing and commits go on meanwhile, nobody is
    // dropped, a new address is turned away, and a peer's address (one
    // that authenticated before) still gets a handshake.
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    let flooding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let marks: Vec<usize> = instances.iter().map(Instance::log_len).collect();
    let mut flooders: Vec<_> = (2..18).map(|ip| flood(&watcher, [127, 0, 0, ip], false, flooding.clone())).collect();
    flooders.push(flood(&watcher, [127, 0, 0, 18], true, flooding.clone()));
    let committed = || (0..PARTITIONS).map(|p| committed_offset(&app, &input, p).unwrap_or(0)).sum::<i64>();
    std::thread::sleep(Duration::from_secs(1));
    let before = committed();
    let (mut strangers_in, mut peer_refused) = (0, 0);
    for _ in 0..5 {
        strangers_in += usize::from(welcomed_from(&watcher, [127, 0, 0, 99], &app));
        peer_refused += usize::from(!welcomed_from(&watcher, [127, 0, 0, 1], &app));
        std::thread::sleep(Duration::from_millis(700));
    }
    let during = committed();
    assert!(during > before + 300, "commits went on under the flood: {before} -> {during} in 4 s at 300 records/s");
    assert!(strangers_in <= 2, "a new address got a handshake {strangers_in} of 5 times through a full listener:\n{}", log_lines(&instances[1]));
    assert_eq!(peer_refused, 0, "a peer's address was turned away {peer_refused} of 5 times");
    for (i, mark) in instances.iter().zip(&marks) {
        assert!(!i.text()[*mark..].contains("dropped a peer from the group"), "nobody is dropped under a flood:\n{}", log_lines(i));
    }
    // Detection is unaffected: the victim's kill is found at once.
    kill_first_and_see_it_dropped_at_once(instances);
    flooding.store(false, std::sync::atomic::Ordering::SeqCst);
    let opened: u64 = flooders.into_iter().map(|t| t.join().unwrap()).sum();
    eprintln!("flood: {opened} connections opened");
    feeder.join(true);
}

/// Whether a connection to `at` from the loopback address `from` gets a
/// `Welcome` to its `Hello` (else the listener closed it at once).
fn welcomed_from(at: &str, from: [u8; 4], app: &str) -> bool {
    use std::io::{BufRead, Write};
    let Ok(s) = connect_from(at, from) else { return false };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    if writeln!(w, r#"{{"t":"Hello","nonce":"c0ffee","group":"{app}","incarnation":1}}"#).is_err() {
        return false;
    }
    let mut line = String::new();
    let _ = std::io::BufReader::new(s).read_line(&mut line);
    line.contains("Welcome")
}

/// A TCP connection to `at` from the loopback address `from`.
fn connect_from(at: &str, from: [u8; 4]) -> std::io::Result<std::net::TcpStream> {
    let to: std::net::SocketAddr = at.parse().map_err(std::io::Error::other)?;
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&std::net::SocketAddr::from((from, 0)).into())?;
    socket.connect_timeout(&to.into(), Duration::from_secs(2))?;
    Ok(socket.into())
}

/// Until `flooding` ends, keeps 20 connections from the loopback address
/// `from` open at `at`: silent ones (half-open handshakes, each replaced
/// as soon as the listener closes it), or with `garbage`, ones that send a
/// garbage line, one after another; returns how many it opened.
fn flood(at: &str, from: [u8; 4], garbage: bool, flooding: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<u64> {
    use std::io::Write;
    let at = at.to_string();
    std::thread::spawn(move || {
        let (mut open, mut opened) = (Vec::<std::net::TcpStream>::new(), 0u64);
        while flooding.load(std::sync::atomic::Ordering::SeqCst) {
            // Those the listener closed (refused, or gave up on) go.
            open.retain(|s| {
                let _ = s.set_nonblocking(true);
                matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            if open.len() >= 20 {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let Ok(mut s) = connect_from(&at, from) else { continue };
            opened += 1;
            if garbage {
                let _ = s.write_all(b"garbage\n");
                std::thread::sleep(Duration::from_millis(1));
            } else {
                open.push(s);
            }
        }
        opened
    })
}

/// HMAC-SHA256 of `text` under `key`, in hex (the peer links' proofs and seals).
fn hmac_hex(key: &[u8], text: &str) -> String {
    let key = openssl::pkey::PKey::hmac(key).unwrap();
    let mut signer = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), &key).unwrap();
    signer.update(text.as_bytes()).unwrap();
    signer.sign_to_vec().unwrap().iter().map(|b| format!("{b:02x}")).collect()
}

/// Kills the first of two instances and waits (10 s at most, against the
/// 45 s session timeout) for the other to drop it from the group; then
/// stops the other.
fn kill_first_and_see_it_dropped_at_once(mut instances: Vec<Instance>) {
    assert_eq!(instances.len(), 2);
    let mark = instances[1].log_len();
    let killed = Instant::now();
    instances.remove(0).kill();
    wait_until("the other instance to drop the killed one at once", Duration::from_secs(10), || {
        let text = instances[0].text();
        let after = text.get(mark..).unwrap_or("");
        after.contains("dropped a peer from the group") || after.contains("already out of the group")
    });
    eprintln!("kill -> dropped: {:?}", killed.elapsed());
    for i in instances {
        i.stop();
    }
}

/// A peer frozen *during a rebalance* (a fourth instance joins; c is
/// stopped just after, while the others rejoin) is judged as in a settled
/// generation: its peers drop it after `peer_timeout` of silence, which
/// ends the coordinator's wait for it, far inside the session timeout
/// (20 s here). When c wakes it finds itself out, closes its tasks
/// without commit and rejoins; the final state equals the model.
#[test]
fn a_peer_frozen_during_a_rebalance_is_dropped_after_peer_timeout() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("peerfreezejoin", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let session = Duration::from_millis(20_000);
    let peer_timeout = Duration::from_millis(2_000);
    // The others learn of the round (heartbeat 500 ms) before c's silence
    // reaches peer_timeout: c is frozen in the round, not before it.
    let options =
        format!("session_ms={};heartbeat_ms=500;peer=127.0.0.1:0;peer_timeout_ms={}", session.as_millis(), peer_timeout.as_millis());
    let mut instances = three(&app, &input, dir, |_| options.clone());
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    balanced(&mut instances, Duration::from_secs(90));
    let mark = instances[2].log_len();
    instances.push(Instance::start_opts("d", &bootstrap, &app, &input, dir, "", ONE_STANDBY, &options));
    wait_until("d to start (its JoinGroup follows and starts the round)", Duration::from_secs(30), || {
        instances[3].text().contains("kstate started")
    });
    std::thread::sleep(Duration::from_millis(300));
    instances[2].signal("-STOP");
    let frozen = Instant::now();
    // peer_timeout (the drop), then a round without c: well inside the session.
    let bound = peer_timeout * 3 + Duration::from_secs(3);
    let what = format!("a, b and d did not own every task within {bound:?} of c's freeze during the rebalance (session timeout {session:?})");
    others_own_every_task(&instances, &[0, 1, 3], frozen, bound, &what);
    eprintln!("frozen during a rebalance -> the others own every task: {:?} (peer_timeout {peer_timeout:?})", frozen.elapsed());
    instances[2].signal("-CONT");
    woken_comes_back(&mut instances, 2, mark);
    // d leaves again (6 tasks balance over three instances, not four).
    instances.pop().expect("d").stop();
    balanced(&mut instances, Duration::from_secs(60));
    let sent = feeder.join(true);
    stop_and_check(instances, &app, &input, &sent, "a peer frozen during a rebalance");
}

/// The leader frozen between its JoinGroup and its SyncGroup (a fourth
/// instance joins; the leader stops itself there, `freeze_leader`): the
/// others wait in SyncGroup under a generation they have not applied yet.
/// They still judge the silent leader (the coordinator holds them in the
/// generation they joined) and drop it after `peer_timeout`, far inside
/// the session timeout.
#[test]
fn a_leader_frozen_before_its_sync_is_dropped_after_peer_timeout() {
    let _serial = serial();
    let Fixture { input, app, state } = fixture("peerfreezesync", PARTITIONS);
    let dir = state.path();
    let bootstrap = bootstrap();
    let session = Duration::from_millis(20_000);
    let peer_timeout = Duration::from_millis(2_000);
    let trap = dir.join("freeze-leader");
    let options = format!(
        "session_ms={};heartbeat_ms=500;peer=127.0.0.1:0;peer_timeout_ms={};freeze_leader={}",
        session.as_millis(),
        peer_timeout.as_millis(),
        trap.display()
    );
    let mut instances = three(&app, &input, dir, |_| options.clone());
    let feeder = Feeder::start(&bootstrap, &input, PARTITIONS, 60, 300, 1_000_000);
    balanced(&mut instances, Duration::from_secs(90));
    let marks: Vec<usize> = instances.iter().map(Instance::log_len).collect();
    std::fs::write(&trap, b"").unwrap();
    instances.push(Instance::start_opts("d", &bootstrap, &app, &input, dir, "", ONE_STANDBY, &options));
    const FROZE: &str = "fault injection: the leader stops itself before its SyncGroup";
    let mut frozen_at = None;
    wait_until("the leader of the round d starts to stop itself before its SyncGroup", Duration::from_secs(30), || {
        frozen_at = (0..4).find(|&i| instances[i].text().get(*marks.get(i).unwrap_or(&0)..).unwrap_or("").contains(FROZE));
        frozen_at.is_some()
    });
    let frozen = Instant::now();
    let leader = frozen_at.expect("found");
    let others: Vec<usize> = (0..4).filter(|&i| i != leader).collect();
    let bound = peer_timeout * 3 + Duration::from_secs(3);
    let what = format!("the others did not own every task within {bound:?} of the leader's freeze before its SyncGroup (session timeout {session:?})");
    others_own_every_task(&instances, &others, frozen, bound, &what);
    eprintln!("leader frozen before its SyncGroup -> the others own every task: {:?} (peer_timeout {peer_timeout:?})", frozen.elapsed());
    instances[leader].signal("-CONT");
    let mark = marks.get(leader).copied().unwrap_or(0);
    wait_until("the woken leader to find itself out and rejoin", Duration::from_secs(60), || {
        instances.iter_mut().for_each(|i| i.assert_running());
        instances[leader].text().get(mark..).unwrap_or("").contains("this member was fenced")
    });
    // Back to three instances (6 tasks balance over three, not four).
    instances.remove(3).stop();
    balanced(&mut instances, Duration::from_secs(60));
    let sent = feeder.join(true);
    stop_and_check(instances, &app, &input, &sent, "a leader frozen before its SyncGroup");
}

/// Waits until `instances[others]` own every task between them (judged by
/// their assignments); fails with `what` and two of their logs once
/// `bound` has passed since `frozen`.
fn others_own_every_task(instances: &[Instance], others: &[usize], frozen: Instant, bound: Duration, what: &str) {
    loop {
        let owned: BTreeSet<i32> =
            others.iter().flat_map(|&i| instances[i].assignment().map(|(_, a, _)| a).unwrap_or_default()).collect();
        if owned.len() == PARTITIONS as usize {
            return;
        }
        assert!(frozen.elapsed() < bound, "{what}:\n{}\n{}", log_lines(&instances[others[0]]), log_lines(&instances[others[others.len() - 1]]));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (60 s at most) until the woken `instances[woken]` found itself out
/// after log byte `mark` (closed its tasks without commit) and processes
/// again; every instance must keep running meanwhile.
fn woken_comes_back(instances: &mut [Instance], woken: usize, mark: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        instances.iter_mut().for_each(|i| i.assert_running());
        let text = instances[woken].text();
        let lost = text.get(mark..).unwrap_or("").contains("tasks lost; closing them without commit");
        let back = !instances[woken].lines_after(mark, "KSTATE-PROCESSED").is_empty();
        if lost && back {
            return;
        }
        assert!(Instant::now() < deadline, "the frozen instance did not come back:\n{}", instances[woken].tail());
        std::thread::sleep(Duration::from_millis(100));
    }
}
