//! Failure modes a user can hit, each a typed error: oversize records,
//! mis-shaped changelog topics, missing input topics, bad configuration and
//! unreachable brokers.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use kstate::{App, Error, StoreDefinition};

#[test]
fn oversize_value_fails_before_reaching_store_or_changelog() {
    let Fixture { input, app, state } = fixture("big", 1);
    produce(&input, &[(0, b"go".to_vec(), Some(b"".to_vec()))]);
    let (tx, rx) = mpsc::channel();
    let store = StoreDefinition::new("s").changelog_config("max.message.bytes", "20000");
    let running = Running::start(builder(&app, &input, state.path()).store(store), move |ctx, _| {
        let s = ctx.store("s")?;
        s.put(b"k", b"small")?;
        let too_big = s.put(b"k", &vec![7u8; 30_000]);
        let after = s.get(b"k")?;
        let fits = s.put(b"k2", &vec![1u8; 10_000]);
        tx.send((too_big, after, fits)).unwrap();
        Ok(())
    });
    let (too_big, after, fits) = rx.recv_timeout(TIMEOUT).unwrap();
    running.stop().unwrap();
    match too_big {
        Err(Error::RecordTooLarge { store, size, limit }) => {
            assert_eq!(store, "s");
            assert!(size > 30_000 && limit <= 20_000, "size {size} limit {limit}");
        }
        other => panic!("expected RecordTooLarge, got {other:?}"),
    }
    assert_eq!(after.as_deref(), Some(&b"small"[..]), "the failed put left the store untouched");
    fits.expect("a record under the limit is accepted");

    let changelog = read_partition(&kstate::changelog_topic(&app, "s"), 0);
    // The latest write of each key, in key order: the rejected value never left.
    let logged: Vec<(&[u8], Option<&[u8]>)> = changelog.iter().map(|(_, k, v)| (k.as_slice(), v.as_deref())).collect();
    assert_eq!(logged, vec![(&b"k"[..], Some(&b"small"[..])), (&b"k2"[..], Some(&[1u8; 10_000][..]))]);
    let (data, checkpoint) = read_store_dir(state.path(), &app, "s", 0);
    assert_eq!(data.get(&b"k"[..]).map(Vec::as_slice), Some(&b"small"[..]));
    assert_eq!(data.len(), 2);
    assert_eq!(checkpoint, Some(changelog[1].0));
}

fn run_expecting_error(app: &str, input: &str) -> Error {
    let state = tempfile::tempdir().unwrap();
    let app = builder(app, input, state.path())
        .store(StoreDefinition::new("s"))
        .startup_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    app.run(|_, _| Ok::<(), Error>(())).expect_err("startup must fail")
}

#[test]
fn changelog_with_wrong_partition_count_is_a_startup_error() {
    let Fixture { input, app, .. } = fixture("parts", 2);
    create_topic(&kstate::changelog_topic(&app, "s"), 3, &[("cleanup.policy", "compact")]);
    match run_expecting_error(&app, &input) {
        Error::ChangelogTopicMismatch { problem, .. } => assert!(problem.contains("3 partitions"), "{problem}"),
        e => panic!("unexpected {e:?}"),
    }
}

#[test]
fn changelog_with_delete_policy_is_a_startup_error() {
    let Fixture { input, app, .. } = fixture("policy", 1);
    create_topic(&kstate::changelog_topic(&app, "s"), 1, &[("cleanup.policy", "delete")]);
    match run_expecting_error(&app, &input) {
        Error::ChangelogTopicMismatch { problem, .. } => assert!(problem.contains("cleanup.policy"), "{problem}"),
        e => panic!("unexpected {e:?}"),
    }
}

#[test]
fn missing_input_topic_is_a_startup_error() {
    init_tracing();
    let e = run_expecting_error(&unique("noinput"), &unique("does-not-exist"));
    assert!(matches!(e, Error::MissingInputTopic(_)), "{e:?}");
}

#[test]
fn unreachable_broker_fails_within_the_startup_timeout() {
    init_tracing();
    let state = tempfile::tempdir().unwrap();
    let app = App::builder()
        .application_id("unreachable")
        .bootstrap_servers("127.0.0.1:1")
        .input_topic("t")
        .state_dir(state.path())
        .store(StoreDefinition::new("s"))
        .startup_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let started = Instant::now();
    let e = app.run(|_, _| Ok::<(), Error>(())).unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, Error::BrokerUnreachable { .. }), "{e:?}");
    assert!(e.to_string().contains("127.0.0.1:1"), "the message names the address: {e}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_peer_address_that_cannot_be_bound_is_a_startup_config_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let Fixture { input, app, state } = fixture("peerbind", 1);
    let app = builder(&app, &input, state.path()).store(StoreDefinition::new("s")).peer_address(address.clone()).peer_plaintext().build().unwrap();
    let e = app.run(|_, _| Ok::<(), Error>(())).unwrap_err();
    assert!(matches!(&e, Error::Config(m) if m.contains(&address) && m.contains("cannot listen")), "{e:?}");
}

#[test]
fn bad_configuration_is_rejected_before_connecting() {
    let base = || App::builder().application_id("a").bootstrap_servers("x:1").input_topic("t").state_dir("/tmp/x");
    let eos = || base().processing_guarantee(kstate::ProcessingGuarantee::ExactlyOnce);
    let cases = [
        ("empty application id", base().application_id("")),
        ("bad application id", base().application_id("has space")),
        ("no bootstrap", base().bootstrap_servers(" ")),
        ("duplicate store", base().store(StoreDefinition::new("s")).store(StoreDefinition::new("s"))),
        ("bad store name", base().store(StoreDefinition::new("a/b"))),
        ("zero commit interval", base().commit_interval(Duration::ZERO)),
        ("policy override", base().store(StoreDefinition::new("s").changelog_config("cleanup.policy", "delete"))),
        ("managed kafka key", base().kafka_config("group.id", "other")),
        ("no input", App::builder().application_id("a").bootstrap_servers("x:1").state_dir("/tmp/x")),
        ("heartbeat not below the session timeout", base().kafka_config("heartbeat.interval.ms", "10000").kafka_config("session.timeout.ms", "6000")),
        ("bad session timeout", base().kafka_config("session.timeout.ms", "soon")),
        ("bad application server", base().application_server("no-port")),
        ("empty application server", base().application_server("")),
        ("application server without a host", base().application_server(":8080")),
        ("unsupported SASL mechanism", base().kafka_config("security.protocol", "SASL_SSL").kafka_config("sasl.mechanism", "GSSAPI")),
        ("no warmups", base().max_warmup_replicas(0)),
        ("peer address without a port", base().peer_address("host")),
        ("peer address without a host", base().peer_address(":7070")),
        ("unspecified peer address", base().peer_address("0.0.0.0:7070")),
        ("unspecified IPv6 peer address", base().peer_address("[::]:7070")),
        ("zero peer timeout", base().peer_address("h:7070").peer_plaintext().peer_timeout(Duration::ZERO)),
        ("peer timeout not below the session timeout", base().peer_address("h:7070").peer_plaintext().peer_timeout(Duration::from_secs(45))),
        ("peer address without a secret or plaintext", base().peer_address("h:7070")),
        ("peer secret under 16 bytes", base().peer_address("h:7070").peer_secret("short")),
        ("peer secret file missing", base().peer_address("h:7070").peer_secret_file("/nonexistent/kstate-secret")),
        ("peer secret and plaintext", base().peer_address("h:7070").peer_secret("0123456789abcdef").peer_plaintext()),
        ("previous peer secret without a secret", base().peer_address("h:7070").peer_plaintext().peer_previous_secret("0123456789abcdef")),
        ("previous peer secret under 16 bytes", base().peer_address("h:7070").peer_secret("0123456789abcdef").peer_previous_secret("short")),
        ("previous peer secret the same", base().peer_address("h:7070").peer_secret("0123456789abcdef").peer_previous_secret("0123456789abcdef")),
        ("previous peer secret file missing", base().peer_address("h:7070").peer_secret("0123456789abcdef").peer_previous_secret_file("/nonexistent/k")),
        ("probing interval below 1 s", base().probing_rebalance_interval(Duration::from_millis(10))),
        ("state memory below 16 MiB", base().max_state_memory(1 << 20)),
        ("transactional.id is kstate's", base().kafka_config("transactional.id", "mine")),
        ("transaction.timeout.ms is a builder setting", base().kafka_config("transaction.timeout.ms", "5000")),
        ("transaction timeout below 1 s", eos().transaction_timeout(Duration::from_millis(500))),
        ("transaction timeout above 15 min", eos().transaction_timeout(Duration::from_secs(3600))),
        ("transaction timeout not above the commit interval", eos().commit_interval(Duration::from_secs(20)).transaction_timeout(Duration::from_secs(10))),
    ];
    for (what, b) in cases {
        assert!(matches!(b.build(), Err(Error::Config(_))), "{what} must be Error::Config");
    }
    assert!(base().store(StoreDefinition::new("ok")).build().is_ok());
    assert!(base().store(StoreDefinition::new("ok")).peer_address("[::1]:0").peer_secret("0123456789abcdef").build().is_ok());
    assert!(base().store(StoreDefinition::new("ok")).peer_address("[::1]:0").peer_plaintext().build().is_ok());
    let rotating = base().peer_address("[::1]:0").peer_secret("the-new-secret-4567").peer_previous_secret("the-old-secret-0123");
    assert!(rotating.store(StoreDefinition::new("ok")).build().is_ok());
    // The peer timeout matters only with a peer address.
    assert!(base().store(StoreDefinition::new("ok")).peer_timeout(Duration::ZERO).build().is_ok());
    assert!(eos().store(StoreDefinition::new("ok")).build().is_ok());
    // The transaction timeout matters only under exactly-once.
    assert!(base().transaction_timeout(Duration::from_millis(1)).build().is_ok());
}

#[test]
fn processor_error_stops_the_app_and_keeps_state_at_the_checkpoint() {
    let Fixture { input, app, state } = fixture("fail", 1);
    produce(&input, &[(0, b"a".to_vec(), Some(b"1".to_vec())), (0, b"boom".to_vec(), Some(b"x".to_vec()))]);
    let app_built = builder(&app, &input, state.path())
        .store(StoreDefinition::new("s"))
        .commit_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let e = app_built
        .run(|ctx, rec| {
            ctx.store("s")?.put(rec.key.unwrap(), rec.value.unwrap())?;
            if rec.key == Some(b"boom") {
                return Err("cannot handle boom".into());
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })
        .unwrap_err();
    match e {
        Error::Processor { offset, source, .. } => {
            assert_eq!(offset, 1);
            assert!(source.to_string().contains("boom"));
        }
        e => panic!("unexpected {e:?}"),
    }
    // Nothing was committed: no input offset, and the store has no checkpoint.
    assert_eq!(committed_offset(&app, &input, 0), None);
    let (data, checkpoint) = read_store_dir(state.path(), &app, "s", 0);
    assert!(data.is_empty() && checkpoint.is_none(), "uncommitted writes were discarded");
}
