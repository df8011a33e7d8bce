//! Several instances of one application as child processes (the test
//! binary started again on its `standby_child` entry, which calls
//! [`child_main`], with its settings in `KSTATE_CHILD`), and the checks the
//! multi-instance tests share: a settled group, committed input, the final
//! state against a model.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kstate::{Error, RestoreEnd, RestoreListener, RestoreStart};

use super::*;

pub const PARTITIONS: i32 = 6;

/// Prints restores as plain lines for the parent to parse.
pub struct PrintRestores;

impl RestoreListener for PrintRestores {
    fn on_restore_start(&self, e: &RestoreStart) {
        println!("KSTATE-RESTORE-START partition={} start={} end={}", e.partition, e.start_offset, e.end_offset);
    }
    fn on_restore_end(&self, e: &RestoreEnd) {
        println!("KSTATE-RESTORE-END partition={} records={}", e.partition, e.records);
    }
}

/// A child instance: runs until its stdin closes, then stops cleanly.
/// Prints `KSTATE-PROCESSED partition=P` the first time it processes a
/// record of a partition since the partition was last (re)assigned to it.
/// The peer links' shared secret of the test instances.
pub const TEST_PEER_SECRET: &str = "kstate-tests-peer-secret-0123";

pub fn child_main() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    let fields: Vec<&str> = settings.split('\t').collect();
    let [bootstrap, app, input, state, instance, standbys, lag, probing_ms, extra]: [&str; 9] = fields
        .try_into()
        .expect("KSTATE_CHILD: bootstrap, app, input, state, instance id, standbys, acceptable lag, probing ms, options");
    // Options: `key=value` pairs separated by `;` (see `Options`).
    let option = |key: &str| extra.split(';').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')).map(str::to_string);
    init_tracing();
    let mut builder = builder(app, input, Path::new(state))
        .bootstrap_servers(bootstrap)
        .store(super::store("s"))
        .num_standby_replicas(standbys.parse().unwrap())
        .acceptable_recovery_lag(lag.parse().unwrap())
        .probing_rebalance_interval(Duration::from_millis(probing_ms.parse().unwrap()))
        .restore_listener(PrintRestores);
    if !instance.is_empty() {
        builder = builder.kafka_config("group.instance.id", instance);
    }
    if let Some(address) = option("peer") {
        // Authenticated links, as a deployment should run them.
        let secret = option("peer_secret").unwrap_or_else(|| TEST_PEER_SECRET.to_string());
        builder = builder.peer_address(address).peer_secret(secret);
    }
    if let Some(previous) = option("peer_previous_secret") {
        builder = builder.peer_previous_secret(previous);
    }
    if let Some(ms) = option("peer_timeout_ms") {
        builder = builder.peer_timeout(Duration::from_millis(ms.parse().unwrap()));
    }
    if let Some(ms) = option("session_ms") {
        builder = builder.kafka_config("session.timeout.ms", &ms);
    }
    if let Some(ms) = option("heartbeat_ms") {
        builder = builder.kafka_config("heartbeat.interval.ms", &ms);
    }
    if option("eos").is_some() {
        builder = builder.processing_guarantee(kstate::ProcessingGuarantee::ExactlyOnce);
    }
    if let Some(prefix) = option("snapshots") {
        builder = builder.snapshots(s3_at(&s3_endpoint(), &prefix).0);
    }
    // A bad deploy: deletes or overwrites what the good code wrote, and
    // writes keys it never would.
    let bad = option("bad").is_some();
    let output = option("out");
    // A count per partition (key `n<partition>`) in store `c`: read and
    // written back by every record, so a stale read shows in the total.
    let count = option("count").is_some();
    if count {
        builder = builder.store(super::store("c"));
    }
    let app = builder.build().expect("valid config");
    let stop = app.shutdown_handle();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stop.shutdown();
    });
    let mut seen: BTreeMap<i32, i64> = BTreeMap::new();
    let mut alive: BTreeMap<i32, u128> = BTreeMap::new();
    let result = app.run(move |ctx, rec| {
        let s = ctx.store("s")?;
        if bad {
            let (k, v) = (rec.key.unwrap(), rec.value.unwrap());
            if rec.offset % 2 == 0 {
                s.delete(k)?;
            } else {
                s.put(k, b"BAD")?;
            }
            s.put(&[k, b"/bad/", v].concat(), b"BAD")?;
        } else {
            for (k, v) in record_writes(rec.key.unwrap(), rec.value.unwrap()) {
                s.put(&k, &v)?;
            }
        }
        if count {
            let c = ctx.store("c")?;
            let key = format!("n{}", rec.partition);
            let n: u64 = c.get(key.as_bytes())?.map_or(0, |v| String::from_utf8(v).unwrap().parse().unwrap());
            c.put(key.as_bytes(), (n + 1).to_string().as_bytes())?;
        }
        // One output per input record, its identity in the value.
        if let Some(topic) = &output {
            let id = format!("{}:{}", rec.partition, rec.offset);
            ctx.send(kstate::Output::to(topic).key(rec.key.unwrap()).value(id.as_bytes()))?;
        }
        // A jump in offsets means the partition came back from elsewhere.
        let last = seen.insert(rec.partition, rec.offset);
        if last.is_none_or(|o| rec.offset != o + 1) {
            println!("KSTATE-PROCESSED partition={} offset={}", rec.partition, rec.offset);
        }
        // Processing times (wall clock, at most one line per 50 ms per
        // partition) for the parent to measure pauses across instances.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
        if alive.get(&rec.partition).is_none_or(|t| now >= t + 50) {
            alive.insert(rec.partition, now);
            println!("KSTATE-ALIVE partition={} ms={now}", rec.partition);
        }
        Ok::<(), Error>(())
    });
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("CHILD RUN FAILED: {e:?}");
            std::process::exit(3)
        }
    }
}

/// How a child instance places tasks.
#[derive(Clone, Copy)]
pub struct Placement {
    pub standbys: usize,
    pub acceptable_lag: u64,
    pub probing: Duration,
}

/// The standby tests' placement: one standby, Kafka Streams' default lag.
pub const ONE_STANDBY: Placement = Placement { standbys: 1, acceptable_lag: 10_000, probing: Duration::from_secs(600) };

/// A child instance of `standby_child` and its state directory.
pub struct Instance {
    pub process: ChildInstance,
    pub state: PathBuf,
}

impl std::ops::Deref for Instance {
    type Target = ChildInstance;
    fn deref(&self) -> &ChildInstance {
        &self.process
    }
}

impl std::ops::DerefMut for Instance {
    fn deref_mut(&mut self) -> &mut ChildInstance {
        &mut self.process
    }
}

pub fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    // The last occurrence: a log line's own fields follow its spans' (a
    // `rebalance{app=.. generation=..}` span prefixes the assignment line).
    let start = line.rfind(&format!("{name}="))? + name.len() + 1;
    let rest = &line[start..];
    if rest.starts_with('{') {
        Some(&rest[..=rest.find('}')?])
    } else {
        Some(rest.split_whitespace().next().unwrap_or(""))
    }
}

/// The changelog offsets of a `KSTATE-RESTORE-START` line: (start, end).
pub fn restore_span(line: &str) -> (i64, i64) {
    (field(line, "start").unwrap().parse().unwrap(), field(line, "end").unwrap().parse().unwrap())
}

/// The records a `KSTATE-RESTORE-END` line reports.
pub fn restored_records(line: &str) -> u64 {
    field(line, "records").unwrap().parse().unwrap()
}

pub fn set_of(text: &str) -> BTreeSet<i32> {
    text.trim_matches(|c| c == '{' || c == '}').split(',').filter_map(|x| x.trim().parse().ok()).collect()
}

impl Instance {
    /// Starts an instance; a restarted one appends to the same log.
    pub fn start(name: &str, bootstrap: &str, app: &str, input: &str, dir: &Path, instance_id: &str) -> Instance {
        Instance::start_with(name, bootstrap, app, input, dir, instance_id, ONE_STANDBY)
    }

    pub fn start_with(name: &str, bootstrap: &str, app: &str, input: &str, dir: &Path, instance_id: &str, placement: Placement) -> Instance {
        Instance::start_opts(name, bootstrap, app, input, dir, instance_id, placement, "")
    }

    /// [`Instance::start_with`] with options: `key=value` pairs joined by
    /// `;`: `peer` (peer_address), `peer_secret` (instead of
    /// [`TEST_PEER_SECRET`]), `peer_previous_secret`, `peer_timeout_ms`, `session_ms`,
    /// `heartbeat_ms`, `eos` (exactly-once), `out` (an output topic that
    /// gets one record per input record, valued `partition:offset`),
    /// `mute` (a file: while it exists the instance sends its peers no
    /// pings, `KSTATE_PEER_MUTE_FILE`), `freeze_leader` (a file: a leader
    /// that finds it removes it and stops itself with SIGSTOP before its
    /// SyncGroup, `KSTATE_LEADER_FREEZE_FILE`), `snapshots` (snapshots to MinIO
    /// under this prefix, see [`s3_at`]), `bad` (a processor that deletes
    /// and overwrites the good one's keys and writes keys of its own),
    /// `count` (also counts each partition's records in store `c`, key
    /// `n<partition>`, by a read and a write per record).
    #[allow(clippy::too_many_arguments)]
    pub fn start_opts(
        name: &str,
        bootstrap: &str,
        app: &str,
        input: &str,
        dir: &Path,
        instance_id: &str,
        placement: Placement,
        options: &str,
    ) -> Instance {
        let state = dir.join(format!("state-{name}"));
        let Placement { standbys, acceptable_lag, probing } = placement;
        let settings = format!(
            "{bootstrap}\t{app}\t{input}\t{}\t{instance_id}\t{standbys}\t{acceptable_lag}\t{}\t{options}",
            state.display(),
            probing.as_millis()
        );
        let env: Vec<(&str, String)> = options
            .split(';')
            .filter_map(|kv| {
                kv.strip_prefix("mute=")
                    .map(|file| ("KSTATE_PEER_MUTE_FILE", file.to_string()))
                    .or_else(|| kv.strip_prefix("freeze_leader=").map(|file| ("KSTATE_LEADER_FREEZE_FILE", file.to_string())))
            })
            .collect();
        let process = ChildInstance::spawn_env(name, "standby_child", settings, dir.join(format!("{name}.log")), &env);
        Instance { process, state }
    }

    /// The last assignment this instance applied: (generation, active, standby).
    pub fn assignment(&self) -> Option<(i64, BTreeSet<i32>, BTreeSet<i32>)> {
        let text = self.text();
        let line = text.lines().rev().find(|l| l.contains("applying the group's assignment"))?;
        Some((field(line, "generation")?.parse().ok()?, set_of(field(line, "active")?), set_of(field(line, "standby")?)))
    }

    /// Lines starting with `marker` after byte `from` of the log.
    pub fn lines_after(&self, from: usize, marker: &str) -> Vec<String> {
        let text = self.text();
        text.get(from..).unwrap_or("").lines().filter(|l| l.starts_with(marker)).map(String::from).collect()
    }

    pub fn log_len(&self) -> usize {
        self.text().len()
    }

    pub fn kill(self) {
        self.process.kill();
    }

    pub fn stop(self) {
        self.process.stop();
    }
}

/// Waits until the instances agree on one generation that gives every
/// task exactly one active, two actives each, and one standby per task on
/// another instance; returns each instance's (active, standby).
pub fn balanced(instances: &mut [Instance], timeout: Duration) -> Vec<(BTreeSet<i32>, BTreeSet<i32>)> {
    balanced_with(instances, 1, timeout)
}

/// [`balanced`] with `standbys` standbys per task (and no warmups left).
pub fn balanced_with(instances: &mut [Instance], standbys_per_task: usize, timeout: Duration) -> Vec<(BTreeSet<i32>, BTreeSet<i32>)> {
    let deadline = Instant::now() + timeout;
    loop {
        instances.iter_mut().for_each(|i| i.assert_running());
        let now: Vec<_> = instances.iter().map(Instance::assignment).collect();
        if now.iter().all(Option::is_some) {
            let now: Vec<_> = now.iter().cloned().map(Option::unwrap).collect();
            let same = now.iter().all(|(g, _, _)| *g == now[0].0);
            let actives: BTreeSet<i32> = now.iter().flat_map(|(_, a, _)| a.iter().copied()).collect();
            let standbys: usize = now.iter().map(|(_, _, s)| s.len()).sum();
            let even = now.iter().all(|(_, a, _)| a.len() == PARTITIONS as usize / instances.len());
            if same && even && actives.len() == PARTITIONS as usize && standbys == PARTITIONS as usize * standbys_per_task {
                return now.into_iter().map(|(_, a, s)| (a, s)).collect();
            }
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = instances.iter().map(|i| format!("--- {}:\n{}", i.name, i.tail())).collect();
            panic!("the group did not settle within {timeout:?}: {now:?}\n{}", logs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until every input record is committed; checks committed offsets
/// never go back meanwhile.
pub fn all_committed(instances: &mut [Instance], app: &str, input: &str, timeout: Duration) {
    let ends: Vec<i64> = (0..PARTITIONS).map(|p| end_offset_at(&bootstrap(), input, p)).collect();
    let deadline = Instant::now() + timeout;
    while !(0..PARTITIONS).all(|p| committed_offset(app, input, p) == Some(ends[p as usize])) {
        instances.iter_mut().for_each(|i| i.assert_running());
        assert!(Instant::now() < deadline, "input not fully committed within {timeout:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The state of every partition as its final owner's store holds it
/// (after a clean stop), merged.
pub fn final_stores(owners: &[(PathBuf, BTreeSet<i32>)], app: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut state = BTreeMap::new();
    for (dir, active) in owners {
        for p in active {
            state.extend(read_store_dir(dir, app, "s", *p).0);
        }
    }
    state
}

/// The end of a run: waits until every input record is committed, stops
/// the instances cleanly, and checks the changelogs and the final owners'
/// stores against the model of `sent`.
pub fn stop_and_check(mut instances: Vec<Instance>, app: &str, input: &str, sent: &[KeyedRecord], what: &str) {
    all_committed(&mut instances, app, input, Duration::from_secs(60));
    let owners: Vec<(PathBuf, BTreeSet<i32>)> =
        instances.iter().map(|i| (i.state.clone(), i.assignment().unwrap().1)).collect();
    for i in instances {
        i.stop();
    }
    let model = model_of(sent);
    assert_same_state(&changelog_state_at(&bootstrap(), app, "s", PARTITIONS), &model, &format!("the changelogs after {what}"));
    assert_same_state(&final_stores(&owners, app), &model, &format!("the final owners' stores after {what}"));
}

/// Produces `per_partition` records into each partition at once (state a
/// full restore would have to replay).
pub fn prefill(input: &str, per_partition: usize) -> Vec<KeyedRecord> {
    let records: Vec<KeyedRecord> = (0..per_partition * PARTITIONS as usize)
        .map(|i| {
            let p = (i % PARTITIONS as usize) as i32;
            (p, format!("pre{p}-{i}").into_bytes(), Some(format!("v{i}").into_bytes()))
        })
        .collect();
    produce(input, &records);
    records
}

/// Committed offsets only move forward (a fenced member's late commit
/// would take a partition back).
pub fn check_committed(app: &str, input: &str, highest: &mut [Option<i64>]) {
    for p in 0..PARTITIONS {
        let now = committed_offset(app, input, p);
        assert!(now >= highest[p as usize], "partition {p}: committed offset went back from {:?} to {now:?}", highest[p as usize]);
        highest[p as usize] = now;
    }
}
