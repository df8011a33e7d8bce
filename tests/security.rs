//! Applications over the test broker's SSL (mutual TLS) and SASL SCRAM
//! listeners, and the typed errors for refused credentials and untrusted
//! certificates. `bash testing/test.sh` starts the broker with these
//! listeners and exports where they are (`testing/kafka.sh env`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use kstate::{App, AppBuilder, Error, StoreDefinition};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the tests with `bash testing/test.sh`, which starts the broker with its SSL and SASL \
             listeners, or load them with `set -a; eval \"$(bash testing/kafka.sh env)\"; set +a`"
        )
    })
}

fn secure_builder(app: &str, input: &str, state: &std::path::Path, bootstrap: &str, settings: &[(&str, String)]) -> AppBuilder {
    let mut b = App::builder()
        .application_id(app)
        .bootstrap_servers(bootstrap)
        .input_topic(input)
        .state_dir(state)
        .store(StoreDefinition::new("s"))
        .startup_timeout(Duration::from_secs(20))
        .kafka_config("session.timeout.ms", "6000")
        .kafka_config("heartbeat.interval.ms", "500");
    for (k, v) in settings {
        b = b.kafka_config(*k, v.clone());
    }
    b
}

fn mutual_tls(ca: &str, cert: &str, key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SSL".into()),
        ("ssl.ca.location", env(ca)),
        ("ssl.certificate.location", env(cert)),
        ("ssl.key.location", env(key)),
    ]
}

fn scram(mechanism: &str, password: &str) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SASL_PLAINTEXT".into()),
        ("sasl.mechanism", mechanism.into()),
        ("sasl.username", env("KSTATE_SASL_USER")),
        ("sasl.password", password.into()),
    ]
}

/// Runs an application over `bootstrap` with `settings` until every input
/// record is committed; its store must equal the model of the input.
fn runs_end_to_end(name: &str, bootstrap: &str, settings: &[(&str, String)]) {
    let Fixture { input, app, state } = fixture(name, 2);
    let records: Vec<KeyedRecord> =
        (0..200).map(|i| (i % 2, format!("p{}k{}", i % 2, i % 7).into_bytes(), Some(i.to_string().into_bytes()))).collect();
    produce(&input, &records);
    let running = Running::start(secure_builder(&app, &input, state.path(), bootstrap, settings), |ctx, r| {
        let s = ctx.store("s")?;
        for (k, v) in record_writes(r.key.unwrap(), r.value.unwrap()) {
            s.put(&k, &v)?;
        }
        Ok(())
    });
    wait_all_committed_at(&bootstrap_plain(), &app, &input, 2, Duration::from_secs(60));
    running.stop().expect("clean stop");
    let mut stores = std::collections::BTreeMap::new();
    for p in 0..2 {
        stores.extend(read_store_dir(state.path(), &app, "s", p).0);
    }
    assert_same_state(&stores, &model_of(&records), "store after a run over a secured listener");
    assert_same_state(&changelog_state_at(&bootstrap_plain(), &app, "s", 2), &model_of(&records), "changelog");
}

fn bootstrap_plain() -> String {
    bootstrap()
}

/// Runs an application that must fail at startup, within `bound`.
fn fails_at_startup(name: &str, bootstrap: &str, settings: &[(&str, String)], bound: Duration) -> Error {
    let Fixture { input, app, state } = fixture(name, 1);
    let app = secure_builder(&app, &input, state.path(), bootstrap, settings).build().expect("valid config");
    let started = Instant::now();
    let error = app.run(|_, _| Ok::<(), Error>(())).expect_err("startup must fail");
    assert!(started.elapsed() < bound, "took {:?} to fail: {error}", started.elapsed());
    error
}

#[test]
fn an_application_runs_over_mutual_tls() {
    let settings = mutual_tls("KSTATE_TLS_CA", "KSTATE_TLS_CLIENT_CERT", "KSTATE_TLS_CLIENT_KEY");
    runs_end_to_end("tls", &env("KSTATE_SSL_BOOTSTRAP"), &settings);
}

#[test]
fn an_application_runs_over_tls_with_an_encrypted_client_key() {
    let mut settings = mutual_tls("KSTATE_TLS_CA", "KSTATE_TLS_CLIENT_CERT", "KSTATE_TLS_CLIENT_KEY_ENCRYPTED");
    settings.push(("ssl.key.password", env("KSTATE_TLS_CLIENT_KEY_PASSWORD")));
    runs_end_to_end("tls-enc", &env("KSTATE_SSL_BOOTSTRAP"), &settings);
}

#[test]
fn an_application_runs_over_sasl_scram() {
    runs_end_to_end("scram256", &env("KSTATE_SASL_BOOTSTRAP"), &scram("SCRAM-SHA-256", &env("KSTATE_SASL_PASSWORD")));
    runs_end_to_end("scram512", &env("KSTATE_SASL_BOOTSTRAP"), &scram("SCRAM-SHA-512", &env("KSTATE_SASL_PASSWORD")));
}

#[test]
fn a_wrong_password_is_an_authentication_error() {
    let broker = env("KSTATE_SASL_BOOTSTRAP");
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] {
        let error = fails_at_startup("badpass", &broker, &scram(mechanism, "not-the-password"), Duration::from_secs(10));
        match &error {
            Error::Authentication { broker: b, mechanism: m, detail } => {
                assert_eq!(b, &broker);
                assert_eq!(*m, mechanism);
                assert!(!detail.is_empty());
            }
            other => panic!("expected Error::Authentication for {mechanism}, got {other:?}"),
        }
        let text = error.to_string();
        assert!(text.contains(&broker) && text.contains(mechanism), "{text}");
    }
}

#[test]
fn an_untrusted_broker_certificate_is_a_tls_error() {
    // The client trusts another CA than the one that signed the broker's certificate.
    let settings = mutual_tls("KSTATE_TLS_UNTRUSTED_CA", "KSTATE_TLS_CLIENT_CERT", "KSTATE_TLS_CLIENT_KEY");
    let broker = env("KSTATE_SSL_BOOTSTRAP");
    match fails_at_startup("untrusted", &broker, &settings, Duration::from_secs(10)) {
        Error::Tls { broker: b, detail } => {
            assert_eq!(b, broker);
            assert!(detail.contains("not trusted"), "{detail}");
        }
        other => panic!("expected Error::Tls, got {other:?}"),
    }
}

#[test]
fn a_client_certificate_the_broker_does_not_trust_is_a_tls_error() {
    let settings = mutual_tls("KSTATE_TLS_CA", "KSTATE_TLS_UNTRUSTED_CLIENT_CERT", "KSTATE_TLS_UNTRUSTED_CLIENT_KEY");
    let broker = env("KSTATE_SSL_BOOTSTRAP");
    match fails_at_startup("refused-cert", &broker, &settings, Duration::from_secs(10)) {
        Error::Tls { broker: b, .. } => assert_eq!(b, broker),
        other => panic!("expected Error::Tls, got {other:?}"),
    }
}

#[test]
fn unsupported_security_settings_are_config_errors() {
    let Fixture { input, app, state } = fixture("badsec", 1);
    let build = |k: &str, v: &str| {
        secure_builder(&app, &input, state.path(), &bootstrap(), &[("security.protocol", "SASL_SSL".into()), (k, v.into())])
            .build()
    };
    assert!(matches!(build("sasl.mechanism", "GSSAPI"), Err(Error::Config(_))));
    assert!(matches!(build("sasl.mechanism", "OAUTHBEARER"), Err(Error::Config(_))));
}
