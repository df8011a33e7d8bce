//! Interactive queries over HTTP while instances join, die and come back:
//! three instances as OS processes (this test binary started again on
//! `query_child`, serving through `examples/serve_counts/http.rs`), one
//! standby each; a client reads every key in a loop, through any live
//! instance, while an instance joins, one is SIGKILLed and restarted.
//! Every answer is a value the key had (the store keeps each key's last
//! sequence number), active answers never go back in position, every
//! error is one of the typed ones, and no key goes without an answer for
//! as long as the session timeout (stale reads from standbys bridge the
//! failover).

mod common;

#[path = "../examples/serve_counts/http.rs"]
#[allow(dead_code)]
mod http;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use kstate::codec::{U64Be, Utf8};
use kstate::StoreDefinition;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const KEYS: usize = 24;
/// The session timeout the instances run with (`builder`): a SIGKILLed
/// instance's tasks move after it.
const SESSION: Duration = Duration::from_secs(6);

/// A child instance: the app (each key's last sequence number in store
/// `last`) and its HTTP server, until stdin closes.
#[test]
#[ignore = "run by the query tests as a child process"]
fn query_child() {
    let Ok(settings) = std::env::var("KSTATE_CHILD") else { return };
    let [bootstrap, app, input, state, listen]: [&str; 5] =
        settings.split('\t').collect::<Vec<_>>().try_into().expect("KSTATE_CHILD: bootstrap, app, input, state dir, listen");
    init_tracing();
    let mut app = builder(app, input, Path::new(state))
        .bootstrap_servers(bootstrap)
        .store(StoreDefinition::new("last"))
        .num_standby_replicas(1)
        .application_server(listen);
    if std::env::var("KSTATE_CHILD_PEERS").is_ok() {
        // Kafka's default heartbeat and session, with failure detection
        // among the instances (a clean shutdown's bye nudges the others).
        app = app.kafka_config("session.timeout.ms", "45000").kafka_config("heartbeat.interval.ms", "3000").peer_address("127.0.0.1:0").peer_secret("kstate-tests-peer-secret-0123");
    }
    let app = app.build().expect("valid config");
    let server = Arc::new(http::Server { queries: app.queries(), me: listen.to_string(), client: reqwest::Client::new() });
    let listen = listen.to_string();
    std::thread::spawn(move || {
        if let Err(e) = http::serve_blocking(server, &listen) {
            eprintln!("HTTP SERVER FAILED: {e}");
            std::process::exit(4);
        }
    });
    stop_when_stdin_closes(app.shutdown_handle());
    // SIGTERM: the clean shutdown a container runtime asks for.
    app.shutdown_handle().stop_on_signals();
    let result = app.run(|ctx, rec| {
        let (Some(key), Some(seq)) = (rec.key_str(), rec.value_str().and_then(|v| v.parse::<u64>().ok())) else { return Ok(()) };
        ctx.typed_store::<Utf8, U64Be>("last")?.put(&key.to_string(), &seq)
    });
    if let Err(e) = result {
        eprintln!("CHILD RUN FAILED: {e:?}");
        std::process::exit(3);
    }
}

/// A `query_child` instance of fixture `f` named `name`, serving on
/// `listen`, with extra environment variables `env`.
fn spawn_child(f: &Fixture, name: &str, listen: &str, env: &[(&str, String)]) -> ChildInstance {
    let dir = f.state.path().join(name);
    let settings = [bootstrap(), f.app.clone(), f.input.clone(), dir.display().to_string(), listen.to_string()].join("\t");
    ChildInstance::spawn_env(name, "query_child", settings, f.state.path().join(format!("{name}.log")), env)
}

/// A free local port (bound, then released for the child to take).
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", l.local_addr().unwrap().port())
}

/// A plain HTTP GET: (status, body); `None` if the connection failed.
fn http_get(host: &str, path: &str) -> Option<(u16, String)> {
    http_get_retry_after(host, path).map(|(status, _, body)| (status, body))
}

/// A plain HTTP GET: (status, whether it carried `Retry-After`, body);
/// `None` if the connection failed.
fn http_get_retry_after(host: &str, path: &str) -> Option<(u16, bool, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&host.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((status, head.to_ascii_lowercase().contains("\r\nretry-after:"), body.to_string()))
}

/// Writes each key's sequence numbers in turn, 200 records a second, until
/// `writing` is cleared; returns what it wrote per key.
fn writer(input: String, writing: Arc<AtomicBool>) -> std::thread::JoinHandle<BTreeMap<String, Vec<u64>>> {
    std::thread::spawn(move || {
        let producer: BaseProducer =
            ClientConfig::new().set("bootstrap.servers", bootstrap()).set("partitioner", "murmur2_random").set("linger.ms", "5").create().unwrap();
        let (mut seq, mut written) = (0u64, BTreeMap::<String, Vec<u64>>::new());
        while writing.load(Ordering::SeqCst) {
            for _ in 0..20 {
                seq += 1;
                let key = format!("k{:02}", seq as usize % KEYS);
                let value = seq.to_string();
                while producer.send(BaseRecord::to(&input).key(&key).payload(&value)).is_err() {
                    producer.poll(Duration::from_millis(10));
                }
                written.entry(key).or_default().push(seq);
            }
            producer.poll(Duration::ZERO);
            std::thread::sleep(Duration::from_millis(100));
        }
        producer.flush(TIMEOUT).unwrap();
        written
    })
}

/// SIGTERM to one of two instances under load, each keeping a standby of
/// the other's partitions, with Kafka's default heartbeat (3 s) and
/// `peer_address`: a client reading every key with fresh reads only,
/// through either instance (the other one when a connection is refused),
/// gets an answer for every key at least once a second, and every error
/// it sees on the way is a typed 503 with `Retry-After`. (Without the
/// bye's nudge the other instance learns of the rebalance at its next
/// heartbeat, up to 3 s later.)
#[test]
fn a_clean_shutdown_under_load_leaves_no_key_unanswered_for_a_second() {
    let f = fixture("iq-term", 4);
    let spawn = |name: &str, listen: &str| spawn_child(&f, name, listen, &[("KSTATE_CHILD_PEERS", "1".into())]);
    let input = &f.input;
    let (la, lb) = (free_port(), free_port());
    let a = spawn("a", &la);
    let mut b = spawn("b", &lb);
    wait_until("every partition active and with a standby", Duration::from_secs(60), || {
        let body = http_get(&la, "/instances").map(|(_, b)| b).unwrap_or_default();
        let Ok(instances) = serde_json::from_str::<Vec<http::Instance>>(&body) else { return false };
        let active: BTreeSet<i32> = instances.iter().flat_map(|i| i.active.clone()).collect();
        let standby: BTreeSet<i32> = instances.iter().flat_map(|i| i.standby.clone()).collect();
        instances.len() == 2 && active.len() == 4 && standby.len() == 4
    });
    let writing = Arc::new(AtomicBool::new(true));
    let written = writer(input.clone(), writing.clone());

    let reading = Arc::new(AtomicBool::new(true));
    // Per key: when it was answered; per error kind: (count, statuses without Retry-After).
    type Errors = BTreeMap<String, (usize, Vec<u16>)>;
    let answered: Arc<Mutex<BTreeMap<String, Vec<Instant>>>> = Arc::default();
    let errors: Arc<Mutex<Errors>> = Arc::default();
    let client = {
        let (reading, answered, errors, hosts) = (reading.clone(), answered.clone(), errors.clone(), [la.clone(), lb.clone()]);
        std::thread::spawn(move || {
            let mut round = 0usize;
            while reading.load(Ordering::SeqCst) {
                round += 1;
                for k in 0..KEYS {
                    let key = format!("k{k:02}");
                    let first = (round + k) % 2;
                    // A client with a list of instances: the next one when a connection fails.
                    let reply = http_get_retry_after(&hosts[first], &format!("/stores/last/keys/{key}"))
                        .or_else(|| http_get_retry_after(&hosts[1 - first], &format!("/stores/last/keys/{key}")));
                    let Some((status, retry_after, body)) = reply else { continue };
                    if status == 200 {
                        answered.lock().unwrap().entry(key).or_default().push(Instant::now());
                        continue;
                    }
                    let e: http::ErrorBody = serde_json::from_str(&body).unwrap_or_else(|e| panic!("status {status}, not a typed error ({e}): {body}"));
                    let mut errors = errors.lock().unwrap();
                    let entry = errors.entry(e.error).or_default();
                    entry.0 += 1;
                    if status != 503 || !retry_after {
                        entry.1.push(status);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    std::thread::sleep(Duration::from_secs(4));
    let terminated = Instant::now();
    a.signal("-TERM");
    a.expect_clean_exit();
    let exited = terminated.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    reading.store(false, Ordering::SeqCst);
    client.join().unwrap();
    writing.store(false, Ordering::SeqCst);
    written.join().unwrap();
    b.assert_running();

    let answered = answered.lock().unwrap();
    let errors = errors.lock().unwrap();
    let mut longest = (Duration::ZERO, String::new());
    for k in 0..KEYS {
        let key = format!("k{k:02}");
        let times: Vec<Instant> = answered.get(&key).map(|t| t.iter().copied().filter(|t| *t + Duration::from_secs(1) >= terminated).collect()).unwrap_or_default();
        assert!(times.first().is_some_and(|t| *t < terminated + Duration::from_secs(1)), "{key}: no answer around the SIGTERM");
        let gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
        if gap > longest.0 {
            longest = (gap, key);
        }
    }
    println!(
        "SIGTERM: instance a exited after {exited:?}; longest time without an answer for a key {:?} ({}); errors {:?}",
        longest.0,
        longest.1,
        errors.iter().map(|(k, (n, _))| (k.as_str(), *n)).collect::<Vec<_>>()
    );
    for (kind, (_, wrong)) in errors.iter() {
        assert!(wrong.is_empty(), "`{kind}` answered with statuses {wrong:?}, not 503 with Retry-After");
    }
    assert!(longest.0 < Duration::from_secs(1), "key {} went {:?} without an answer across a clean shutdown", longest.1, longest.0);
    b.stop();
}

/// A successful answer as the client saw it.
struct Reply {
    at: Instant,
    value: Option<u64>,
    offset: Option<i64>,
    copy: String,
    served_by: String,
}

/// What the client saw for one key.
#[derive(Default)]
struct Seen {
    answers: Vec<Reply>,
    errors: BTreeMap<String, usize>,
}

#[test]
fn queries_answer_through_joins_kills_and_restarts_within_a_failover() {
    let f = fixture("iq-http", 6);
    let spawn = |name: &str, listen: &str| spawn_child(&f, name, listen, &[]);
    let input = &f.input;
    let (la, lb, lc) = (free_port(), free_port(), free_port());
    let mut a = spawn("a", &la);
    let b = spawn("b", &lb);
    let live: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(vec![la.clone(), lb.clone()]));
    wait_until("every partition active on a or b", Duration::from_secs(60), || {
        let body = http_get(&la, "/instances").map(|(_, b)| b).unwrap_or_default();
        let Ok(instances) = serde_json::from_str::<Vec<http::Instance>>(&body) else { return false };
        instances.iter().flat_map(|i| i.active.clone()).collect::<BTreeSet<_>>().len() == 6
    });

    // The writer: each record's value is a sequence number, one key after another.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = writer(input.clone(), writing.clone());

    // The client: every key in turn, through the live instances in turn,
    // every other round allowing a standby to answer.
    let reading = Arc::new(AtomicBool::new(true));
    let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
    let client = {
        let (reading, seen, live) = (reading.clone(), seen.clone(), live.clone());
        std::thread::spawn(move || {
            let mut round = 0usize;
            while reading.load(Ordering::SeqCst) {
                round += 1;
                for k in 0..KEYS {
                    let key = format!("k{k:02}");
                    let hosts = live.lock().unwrap().clone();
                    let host = &hosts[(round / 2 + k) % hosts.len()];
                    let path = if round.is_multiple_of(2) { format!("/stores/last/keys/{key}?max_lag=100000") } else { format!("/stores/last/keys/{key}") };
                    let Some((status, body)) = http_get(host, &path) else { continue }; // (an instance just killed)
                    let mut seen = seen.lock().unwrap();
                    let entry = seen.entry(key.clone()).or_default();
                    if status == 200 {
                        let a: http::KeyAnswer = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
                        entry.answers.push(Reply { at: Instant::now(), value: a.value, offset: a.offset, copy: a.copy, served_by: a.served_by });
                    } else {
                        let e: http::ErrorBody = serde_json::from_str(&body).unwrap_or_else(|e| panic!("status {status}, not a typed error ({e}): {body}"));
                        *entry.errors.entry(e.error).or_default() += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    std::thread::sleep(Duration::from_secs(3));
    let mut c = spawn("c", &lc);
    wait_until("c serving", Duration::from_secs(60), || http_get(&lc, "/instances").is_some_and(|(s, _)| s == 200));
    live.lock().unwrap().push(lc.clone());
    std::thread::sleep(Duration::from_secs(5));
    live.lock().unwrap().retain(|h| *h != lb);
    let killed_at = Instant::now();
    b.kill();
    std::thread::sleep(SESSION + Duration::from_secs(6));
    let mut b = spawn("b2", &lb);
    wait_until("b serving again", Duration::from_secs(60), || http_get(&lb, "/instances").is_some_and(|(s, _)| s == 200));
    live.lock().unwrap().push(lb.clone());
    std::thread::sleep(Duration::from_secs(6));
    writing.store(false, Ordering::SeqCst);
    let written = writer.join().unwrap();
    // Every key ends at its last write, through any instance.
    wait_until("every key's last write answered", Duration::from_secs(60), || {
        written.iter().all(|(key, seqs)| {
            let (_, body) = http_get(&la, &format!("/stores/last/keys/{key}")).unwrap_or_default();
            serde_json::from_str::<http::KeyAnswer>(&body).is_ok_and(|a| a.value == seqs.last().copied())
        })
    });
    reading.store(false, Ordering::SeqCst);
    client.join().unwrap();
    for child in [&mut a, &mut b, &mut c] {
        child.assert_running();
    }

    let seen = seen.lock().unwrap();
    let typed: BTreeSet<&str> = ["not_hosted", "restoring", "too_stale", "not_yet", "not_started", "shutting_down", "forward_failed"].into();
    let mut longest = Duration::ZERO;
    let mut answers = 0;
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for (key, s) in seen.iter() {
        let values: BTreeSet<u64> = written[key].iter().copied().collect();
        let mut last_active: Option<i64> = None;
        for Reply { value, offset, copy, served_by, .. } in &s.answers {
            assert!(value.is_none_or(|v| values.contains(&v)), "{key}: answer {value:?} (from {served_by}) was never written");
            if copy == "active" {
                assert!(*offset >= last_active, "{key}: active answers went back from {last_active:?} to {offset:?} ({served_by})");
                last_active = *offset;
            }
            *copies.entry(copy.clone()).or_default() += 1;
        }
        for kind in s.errors.keys() {
            assert!(typed.contains(kind.as_str()), "{key}: unexpected error kind {kind}");
        }
        let gaps = s.answers.windows(2).map(|w| w[1].at - w[0].at).max().unwrap_or_default();
        longest = longest.max(gaps);
        answers += s.answers.len();
    }
    let errors: BTreeMap<&str, usize> = seen.values().flat_map(|s| s.errors.iter()).fold(BTreeMap::new(), |mut m, (k, n)| {
        *m.entry(k.as_str()).or_default() += n;
        m
    });
    println!("answers {answers}, by copy {copies:?}, errors {errors:?}, longest time without an answer for a key {longest:?} (killed at +{:?})", killed_at.elapsed());
    assert_eq!(seen.len(), KEYS, "every key was answered at least once");
    assert!(copies.get("standby").copied().unwrap_or(0) > 0, "standbys answered stale reads");
    // Stale reads (a standby, when the active is unreachable) bridge the
    // failover: no key waits for the group to notice the dead instance.
    assert!(longest < SESSION, "a key went {longest:?} without an answer: as long as the session timeout");
    a.stop();
    b.stop();
    c.stop();
}
