//! The membership against a real broker (`KSTATE_BOOTSTRAP`, default
//! 127.0.0.1:9092; `bash testing/test.sh` starts one): several members in
//! one process, each with a thread playing the runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;

use super::assignor::TaskId;
use super::coordinator::Brokers;
use super::member::{GroupEvent, GroupSettings, Membership};
use super::offsets;
use super::security::Security;
use super::session::Generation;

fn bootstrap() -> String {
    std::env::var("KSTATE_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn create_topic(name: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let r = rt.block_on(admin.create_topics([&topic], &AdminOptions::new())).unwrap();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
}

fn brokers() -> Brokers {
    Brokers::new(&bootstrap(), Security::plaintext(), "kstate-test".into(), Duration::from_secs(10))
}

fn settings(group: &str, topic: &str, instance: Option<&str>, offsets_of: &str) -> GroupSettings {
    GroupSettings {
        group: group.into(),
        topics: vec![topic.into()],
        tasks: 6,
        session_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_millis(300),
        rebalance_timeout: Duration::from_secs(20),
        instance_id: instance.map(String::from),
        num_standby_replicas: 1,
        acceptable_recovery_lag: 10_000,
        max_warmup_replicas: 2,
        probing_rebalance_interval: Duration::from_secs(600),
        changelog_topics: Vec::new(),
        table_topics: Vec::new(),
        process_id: offsets_of.into(),
        endpoint: None,
        peer: None,
        client_tags: BTreeMap::new(),
        give_up_after: Duration::from_secs(60),
    }
}

/// What a simulated runtime saw.
#[derive(Default, Debug)]
struct Seen {
    generation: Option<Arc<Generation>>,
    active: BTreeSet<TaskId>,
    standby: BTreeSet<TaskId>,
    lost: u32,
    failed: Option<String>,
    /// Tasks this member held (as active or standby) at any time: its "disk".
    disk: BTreeSet<TaskId>,
}

/// One member and the thread that applies its events.
struct Sim {
    seen: Arc<Mutex<Seen>>,
    freeze: Arc<Mutex<Option<Duration>>>,
    stop: Arc<AtomicBool>,
    leave: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sim {
    fn start(group: &str, topic: &str, name: &str, instance: Option<&str>) -> Sim {
        Sim::start_with(settings(group, topic, instance, name), 100)
    }

    /// A member whose copies of every task it ever held report checkpoint
    /// sum `offset`.
    fn start_with(settings: GroupSettings, offset: i64) -> Sim {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let disk = seen.clone();
        let local = Box::new(move || disk.lock().unwrap().disk.iter().map(|t| (*t, offset)).collect());
        let membership = Membership::start(brokers(), settings, local).unwrap();
        let (stop, leave) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(true)));
        let freeze = Arc::new(Mutex::new(None));
        let thread = std::thread::spawn({
            let (seen, stop, leave, freeze) = (seen.clone(), stop.clone(), leave.clone(), freeze.clone());
            move || {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(pause) = freeze.lock().unwrap().take() {
                        membership.freeze(pause);
                    }
                    match membership.events.recv_timeout(Duration::from_millis(50)) {
                        Ok(GroupEvent::Assigned { generation, active, standby, .. }) => {
                            let mut s = seen.lock().unwrap();
                            s.disk.extend(active.iter().chain(&standby));
                            s.generation = Some(generation);
                            s.active = active;
                            s.standby = standby;
                            drop(s);
                            membership.applied();
                        }
                        Ok(GroupEvent::Lost { .. }) => {
                            let mut s = seen.lock().unwrap();
                            s.lost += 1;
                            s.active.clear();
                            drop(s);
                            membership.applied();
                        }
                        Ok(GroupEvent::Failed(e)) => {
                            seen.lock().unwrap().failed = Some(e.to_string());
                            return;
                        }
                        Err(_) => {}
                    }
                }
                if leave.load(Ordering::SeqCst) {
                    membership.leave(Duration::from_secs(10));
                } else {
                    membership.crash();
                }
            }
        });
        Sim { seen, freeze, stop, leave, thread: Some(thread) }
    }

    fn stop(mut self, leave: bool) {
        self.leave.store(leave, Ordering::SeqCst);
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until the members' current assignments are one generation, give
/// every task exactly one active and satisfy `also`.
fn settled(sims: &[&Sim], timeout: Duration, also: impl Fn(&[BTreeSet<TaskId>], &[BTreeSet<TaskId>]) -> bool) -> Vec<(BTreeSet<TaskId>, BTreeSet<TaskId>, i32)> {
    let deadline = Instant::now() + timeout;
    loop {
        let now: Vec<(BTreeSet<TaskId>, BTreeSet<TaskId>, i32)> = sims
            .iter()
            .map(|s| {
                let s = s.seen.lock().unwrap();
                assert!(s.failed.is_none(), "member failed: {:?}", s.failed);
                (s.active.clone(), s.standby.clone(), s.generation.as_ref().map_or(-1, |g| g.id))
            })
            .collect();
        let same_generation = now.iter().all(|(_, _, g)| *g == now[0].2 && *g >= 0);
        let mut all: Vec<TaskId> = now.iter().flat_map(|(a, _, _)| a.iter().copied()).collect();
        all.sort();
        let actives: Vec<_> = now.iter().map(|n| n.0.clone()).collect();
        let standbys: Vec<_> = now.iter().map(|n| n.1.clone()).collect();
        if same_generation && all == (0..6).collect::<Vec<_>>() && also(&actives, &standbys) {
            return now;
        }
        assert!(Instant::now() < deadline, "group did not settle in {timeout:?}: {now:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn members_share_tasks_with_standbys_and_a_leaver_s_tasks_go_to_their_standbys() {
    let (group, topic) = (unique("kstate-group"), unique("kstate-group-in"));
    create_topic(&topic, 6);
    let a = Sim::start(&group, &topic, "a", None);
    let b = Sim::start(&group, &topic, "b", None);
    let c = Sim::start(&group, &topic, "c", None);
    let balanced = |act: &[BTreeSet<TaskId>], stb: &[BTreeSet<TaskId>]| {
        act.iter().all(|x| x.len() == 2) && stb.iter().map(BTreeSet::len).sum::<usize>() == 6
    };
    let three = settled(&[&a, &b, &c], Duration::from_secs(60), balanced);
    for (i, (active, standby, _)) in three.iter().enumerate() {
        assert!(active.is_disjoint(standby), "member {i}: a standby beside its active: {three:?}");
    }
    // c leaves cleanly: its tasks go to the members holding their standbys.
    let c_active = three[2].0.clone();
    c.stop(true);
    let two = settled(&[&a, &b], Duration::from_secs(30), |act, _| act.iter().all(|x| x.len() == 3));
    for t in &c_active {
        let holder = if three[0].1.contains(t) { 0 } else { 1 };
        assert!(three[holder].1.contains(t), "task {t} had no standby: {three:?}");
        assert!(two[holder].0.contains(t), "task {t} of the leaver did not go to its standby: before {three:?}, after {two:?}");
    }
    a.stop(true);
    b.stop(true);
}

#[test]
fn commits_of_an_older_generation_are_refused() {
    let (group, topic) = (unique("kstate-group"), unique("kstate-group-in"));
    create_topic(&topic, 6);
    let a = Sim::start(&group, &topic, "a", None);
    settled(&[&a], Duration::from_secs(30), |_, _| true);
    let first = a.seen.lock().unwrap().generation.clone().unwrap();
    let mut conn = brokers().coordinator(&group, 0).unwrap();
    let ok = offsets::commit(&mut conn, &group, &first, &[(topic.clone(), 0, 5)]).unwrap();
    assert_eq!(ok.values().collect::<Vec<_>>(), vec![&None], "{ok:?}");
    // A second member joins: a new generation.
    let b = Sim::start(&group, &topic, "b", None);
    settled(&[&a, &b], Duration::from_secs(30), |act, _| act.iter().all(|x| x.len() == 3));
    let second = a.seen.lock().unwrap().generation.clone().unwrap();
    assert!(second.id > first.id);
    let stale = offsets::commit(&mut conn, &group, &first, &[(topic.clone(), 0, 9)]).unwrap();
    assert_eq!(stale.values().collect::<Vec<_>>(), vec![&Some(ResponseError::IllegalGeneration)], "{stale:?}");
    let stranger = Generation { id: second.id, member_id: "not-a-member".into(), instance_id: None };
    let unknown = offsets::commit(&mut conn, &group, &stranger, &[(topic.clone(), 0, 9)]).unwrap();
    assert_eq!(unknown.values().collect::<Vec<_>>(), vec![&Some(ResponseError::UnknownMemberId)], "{unknown:?}");
    let current = offsets::commit(&mut conn, &group, &second, &[(topic.clone(), 0, 7)]).unwrap();
    assert_eq!(current.values().collect::<Vec<_>>(), vec![&None], "{current:?}");
    a.stop(true);
    b.stop(true);
}

#[test]
fn a_static_member_that_restarts_gets_its_tasks_back_without_a_rebalance() {
    let (group, topic) = (unique("kstate-group"), unique("kstate-group-in"));
    create_topic(&topic, 6);
    let a = Sim::start(&group, &topic, "a", Some("instance-a"));
    let b = Sim::start(&group, &topic, "b", Some("instance-b"));
    let before = settled(&[&a, &b], Duration::from_secs(30), |act, _| act.iter().all(|x| x.len() == 3));
    // b crashes (no LeaveGroup; static members never send one) and comes
    // back within the session timeout.
    b.stop(false);
    let b2 = Sim::start(&group, &topic, "b", Some("instance-b"));
    let after = settled(&[&a, &b2], Duration::from_secs(30), |act, _| act.iter().all(|x| x.len() == 3));
    assert_eq!(before[1].0, after[1].0, "the restarted static member's tasks changed");
    assert_eq!(before[0].2, after[0].2, "a static member's restart caused a rebalance");
    assert_eq!(a.seen.lock().unwrap().lost, 0);
    a.stop(true);
    b2.stop(true);
}

#[test]
fn a_second_instance_with_the_same_static_id_fences_the_first() {
    let (group, topic) = (unique("kstate-group"), unique("kstate-group-in"));
    create_topic(&topic, 6);
    let a = Sim::start(&group, &topic, "a", Some("same"));
    settled(&[&a], Duration::from_secs(30), |_, _| true);
    let a2 = Sim::start(&group, &topic, "a2", Some("same"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(f) = &a.seen.lock().unwrap().failed {
            assert!(f.contains("group.instance.id"), "{f}");
            break;
        }
        assert!(Instant::now() < deadline, "the first instance was not fenced");
        std::thread::sleep(Duration::from_millis(50));
    }
    a2.stop(true);
}

#[test]
fn a_crashed_member_s_tasks_move_to_their_standbys_after_the_session_timeout() {
    let (group, topic) = (unique("kstate-group"), unique("kstate-group-in"));
    create_topic(&topic, 6);
    let a = Sim::start(&group, &topic, "a", None);
    let b = Sim::start(&group, &topic, "b", None);
    let c = Sim::start(&group, &topic, "c", None);
    let three = settled(&[&a, &b, &c], Duration::from_secs(60), |act, stb| {
        act.iter().all(|x| x.len() == 2) && stb.iter().map(BTreeSet::len).sum::<usize>() == 6
    });
    let crashed = Instant::now();
    c.stop(false);
    let two = settled(&[&a, &b], Duration::from_secs(30), |act, _| act.iter().all(|x| x.len() == 3));
    let moved_after = crashed.elapsed();
    // Not before the session timeout (6 s): a crash sends no LeaveGroup.
    assert!(moved_after >= Duration::from_secs(5), "tasks moved after {moved_after:?}");
    for t in &three[2].0 {
        let holder = if three[0].1.contains(t) { 0 } else { 1 };
        assert!(two[holder].0.contains(t), "task {t} did not go to its standby: {three:?} -> {two:?}");
    }
    a.stop(true);
    b.stop(true);
}

#[test]
fn a_frozen_member_is_fenced_loses_its_tasks_and_rejoins() {
    let (group, topic) = (unique("kstate-group"), unique("kstate-group-in"));
    create_topic(&topic, 6);
    let a = Sim::start(&group, &topic, "a", None);
    let b = Sim::start(&group, &topic, "b", None);
    let before = settled(&[&a, &b], Duration::from_secs(30), |act, _| act.iter().all(|x| x.len() == 3));
    // Past the session timeout: the group moves b's tasks to a.
    *b.freeze.lock().unwrap() = Some(Duration::from_secs(9));
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.seen.lock().unwrap().active.len() < 6 {
        assert!(Instant::now() < deadline, "b's tasks never moved to a");
        std::thread::sleep(Duration::from_millis(50));
    }
    let frozen_generation = before[1].2;
    // b wakes, learns it was fenced, closes its tasks without commit and rejoins.
    let after = settled(&[&a, &b], Duration::from_secs(40), |act, _| act.iter().all(|x| x.len() == 3));
    assert_eq!(b.seen.lock().unwrap().lost, 1, "b was not told its tasks were lost");
    assert_eq!(a.seen.lock().unwrap().lost, 0);
    assert!(after[1].2 > frozen_generation);
    a.stop(true);
    b.stop(true);
}

/// Produces `records` records into each of `partitions` partitions of `topic`.
fn fill(topic: &str, partitions: i32, records: usize) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    for p in 0..partitions {
        for i in 0..records {
            let key = i.to_string();
            producer.send(BaseRecord::<str, str>::to(topic).partition(p).key(&key).payload("v")).unwrap();
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

#[test]
fn moves_waiting_for_warmups_happen_at_the_probing_rebalance() {
    let (group, topic, changelog) = (unique("kstate-group"), unique("kstate-group-in"), unique("kstate-group-changelog"));
    create_topic(&topic, 6);
    create_topic(&changelog, 6);
    fill(&changelog, 6, 100);
    let lagged = |name: &str| GroupSettings {
        num_standby_replicas: 0,
        acceptable_recovery_lag: 10,
        max_warmup_replicas: 6,
        probing_rebalance_interval: Duration::from_secs(4),
        changelog_topics: vec![changelog.clone()],
        table_topics: Vec::new(),
        ..settings(&group, &topic, None, name)
    };
    let a = Sim::start_with(lagged("a"), 100);
    settled(&[&a], Duration::from_secs(30), |act, _| act[0].len() == 6);
    // b's copies lag 8 records once it holds them: caught up for the leader
    // (<= 10) but not enough for b to ask for the rebalance itself (> 5),
    // so only the probing rebalance moves its tasks.
    let joined = Instant::now();
    let b = Sim::start_with(lagged("b"), 92);
    let warming = settled(&[&a, &b], Duration::from_secs(30), |act, stb| act[1].is_empty() && stb[1].len() == 3);
    assert_eq!(warming[0].0.len(), 6, "a task moved to b before it warmed up: {warming:?}");
    let moved = settled(&[&a, &b], Duration::from_secs(30), |act, _| act.iter().all(|x| x.len() == 3));
    let took = joined.elapsed();
    assert!(took >= Duration::from_secs(4), "moved after {took:?}, before the probing interval");
    assert!(b.seen.lock().unwrap().standby.is_empty(), "b still warms up: {moved:?}");
    // Balanced and without warmups: no more probing rebalances.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(a.seen.lock().unwrap().generation.as_ref().unwrap().id, moved[0].2, "a balanced group rebalanced again");
    a.stop(true);
    b.stop(true);
}
