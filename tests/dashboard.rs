//! The Grafana dashboard (`dashboards/kstate-grafana.json`) against the
//! metrics kstate documents and exports:
//!
//! - every metric a panel queries is documented in the table of the
//!   `src/metrics.rs` module docs, and every documented name is a `pub const`
//!   there (doc and code in sync);
//! - the panels cover each operational topic (state size, restore,
//!   compaction, disk, lag, commit latency, skew) and point to the runbook;
//! - against the broker: an app run in-process with a Prometheus recorder
//!   really exports every metric the dashboard queries.
//!
//! The first three need no broker.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn dashboard() -> Value {
    let path = repo_file("dashboards/kstate-grafana.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every panel, rows and the panels nested in (collapsed) rows included.
fn all_panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for p in panels.as_array().map(Vec::as_slice).unwrap_or_default() {
            out.push(p);
            if let Some(nested) = p.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn title(panel: &Value) -> &str {
    panel["title"].as_str().unwrap_or("<untitled>")
}

/// `(panel title, expr)` of every query of every panel.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in all_panels(dashboard) {
        for t in p.get("targets").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
            if let Some(expr) = t.get("expr").and_then(Value::as_str) {
                out.push((title(p).to_string(), expr.to_string()));
            }
        }
    }
    out
}

/// The tokens of `expr` that look like kstate metric names (`kstate_[a-z0-9_]+`).
fn metric_tokens(expr: &str) -> Vec<String> {
    let bytes = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = expr[i..].find("kstate_").map(|a| a + i) {
        let starts_word = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':');
        let mut end = at + "kstate_".len();
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_') {
            end += 1;
        }
        if starts_word && end > at + "kstate_".len() {
            out.push(expr[at..end].to_string());
        }
        i = end;
    }
    out
}

/// The metric table of the `src/metrics.rs` module docs: name -> kind, from
/// the lines `//! | `kstate_...` | kind | meaning |`.
fn documented() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo_file("src/metrics.rs")).expect("src/metrics.rs");
    let mut table = BTreeMap::new();
    for line in text.lines() {
        let Some(row) = line.trim_start().strip_prefix("//!") else { continue };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // "", "`name`", "kind", "meaning...", ""
        if cells.len() >= 4 && cells[0].is_empty() {
            if let Some(name) = cells[1].strip_prefix("`kstate_").and_then(|n| n.strip_suffix('`')) {
                table.insert(format!("kstate_{name}"), cells[2].to_string());
            }
        }
    }
    assert!(table.len() >= 10, "found only {} rows in the metric table of src/metrics.rs: {table:?}", table.len());
    table
}

/// The string values of the `pub const NAME: &str = "...";` items of src/metrics.rs.
fn constants() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_file("src/metrics.rs")).expect("src/metrics.rs");
    let mut out = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("pub const ") {
            if let Some((_, value)) = rest.split_once("&str = \"") {
                if let Some(value) = value.strip_suffix("\";") {
                    out.insert(value.to_string());
                }
            }
        }
    }
    out
}

/// The metric a series name belongs to: `x_bucket`, `x_sum` and `x_count`
/// are `x` when `x` is a documented histogram, and themselves otherwise.
fn base_metric(name: &str, documented: &BTreeMap<String, String>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if documented.get(base).is_some_and(|kind| kind == "histogram") {
                return base.to_string();
            }
        }
    }
    name.to_string()
}

/// Every metric the dashboard queries (histograms by their base name), with
/// the titles of the panels that query it.
fn dashboard_metrics(documented: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (panel, expr) in queries(&dashboard()) {
        for token in metric_tokens(&expr) {
            out.entry(base_metric(&token, documented)).or_default().insert(panel.clone());
        }
    }
    out
}

#[test]
fn metric_tokens_are_whole_names() {
    assert_eq!(
        metric_tokens(r#"sum(rate(kstate_a_total{x="1"}[5m])) / xkstate_b + kstate_c_bucket"#),
        ["kstate_a_total", "kstate_c_bucket"]
    );
    let doc: BTreeMap<String, String> = [("kstate_h_seconds", "histogram"), ("kstate_g_count", "gauge")]
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .into();
    assert_eq!(base_metric("kstate_h_seconds_bucket", &doc), "kstate_h_seconds");
    assert_eq!(base_metric("kstate_h_seconds_sum", &doc), "kstate_h_seconds");
    assert_eq!(base_metric("kstate_g_count", &doc), "kstate_g_count");
    assert_eq!(base_metric("kstate_other_count", &doc), "kstate_other_count", "not a documented histogram");
}

#[test]
fn dashboard_queries_only_documented_metrics() {
    let documented = documented();
    let used = dashboard_metrics(&documented);
    assert!(used.len() >= 15, "the dashboard queries only {} metrics: {:?}", used.len(), used.keys());
    let unknown: Vec<String> = used
        .iter()
        .filter(|(name, _)| !documented.contains_key(*name))
        .map(|(name, panels)| format!("  {name} (panels: {})", panels.iter().cloned().collect::<Vec<_>>().join("; ")))
        .collect();
    assert!(
        unknown.is_empty(),
        "{} metric(s) queried by dashboards/kstate-grafana.json are not in the metric table of src/metrics.rs:\n{}",
        unknown.len(),
        unknown.join("\n")
    );
}

#[test]
fn documented_metrics_match_the_constants() {
    let documented = documented();
    let constants = constants();
    let undeclared: Vec<&String> = documented.keys().filter(|n| !constants.contains(*n)).collect();
    assert!(
        undeclared.is_empty(),
        "documented in the src/metrics.rs table but no `pub const ... = \"name\";` in src/metrics.rs: {undeclared:?}"
    );
    let undocumented: Vec<&String> = constants.iter().filter(|n| n.starts_with("kstate_") && !documented.contains_key(*n)).collect();
    assert!(undocumented.is_empty(), "`pub const` metric names missing from the src/metrics.rs table: {undocumented:?}");
    let kinds: BTreeSet<&str> = documented.values().map(String::as_str).collect();
    assert!(
        kinds.iter().all(|k| ["counter", "gauge", "histogram"].contains(k)),
        "unexpected kinds in the src/metrics.rs table: {kinds:?}"
    );
}

/// What an operator must be able to see, and the metrics that show it.
const TOPICS: &[(&str, &[&str])] = &[
    ("logical vs physical state bytes", &["kstate_store_logical_bytes", "kstate_store_physical_bytes"]),
    ("keys", &["kstate_rocksdb_estimate_num_keys"]),
    (
        "restore bytes, rate and remaining",
        &["kstate_restore_bytes_total", "kstate_restore_remaining_records", "kstate_restore_remaining_bytes"],
    ),
    ("pending compaction bytes", &["kstate_rocksdb_pending_compaction_bytes"]),
    ("write stalls", &["kstate_rocksdb_write_stalls_total", "kstate_rocksdb_write_stall_micros_total"]),
    ("block-cache hit rate", &["kstate_rocksdb_block_cache_hits_total", "kstate_rocksdb_block_cache_misses_total"]),
    ("local disk", &["kstate_state_dir_used_bytes", "kstate_state_dir_free_bytes"]),
    (
        "changelog lag",
        &["kstate_restore_remaining_records", "kstate_standby_lag_records", "kstate_standby_lag_bytes", "kstate_warmup_lag_records"],
    ),
    ("input lag", &["kstate_input_lag_records"]),
    ("commit latency", &["kstate_commit_seconds"]),
    ("skew by task", &["kstate_records_processed_total", "kstate_store_logical_bytes"]),
    (
        "keys and timers, stream time, TTL",
        &["kstate_stream_time_ms", "kstate_timers_pending", "kstate_timers_fired_total", "kstate_punctuations_total", "kstate_timer_lateness_seconds", "kstate_ttl_expired_total"],
    ),
    (
        "snapshots: age, size, duration, failures, recovery bandwidth",
        &["kstate_snapshot_age_seconds", "kstate_snapshot_delta_bytes", "kstate_snapshot_full_bytes", "kstate_snapshot_seconds", "kstate_snapshots_total", "kstate_snapshot_seed_bytes_per_sec"],
    ),
    (
        "windows",
        &["kstate_window_segments", "kstate_window_oldest_live_ms", "kstate_window_late_records_total", "kstate_window_segments_dropped_total"],
    ),
    (
        "remote stores: requests, bytes, cache hit rate, waits, open time",
        &[
            "kstate_remote_requests_total",
            "kstate_remote_bytes_total",
            "kstate_remote_cache_hits_total",
            "kstate_remote_cache_misses_total",
            "kstate_remote_waiting",
            "kstate_remote_open_seconds",
        ],
    ),
    (
        "failure detection: peers, drops, lease lapses, failover, refused connections",
        &[
            "kstate_peers",
            "kstate_peers_dropped_total",
            "kstate_peer_lease_lapses_total",
            "kstate_peer_failover_seconds",
            "kstate_peer_rejected_total",
            "kstate_peer_previous_secret_links",
        ],
    ),
];

/// The sections of docs/runbook.md the panels' hints point to.
const RUNBOOK_SECTIONS: &[&str] = &[
    "State growth",
    "Slow restore",
    "Compaction stalls",
    "Disk full",
    "Lagging standby",
    "TTL and timer cleanup",
    "Windows: late records and segments",
    "Snapshots",
    "Global tables and several inputs",
    "Remote stores",
];

#[test]
fn dashboard_covers_every_required_topic() {
    let dash = dashboard();
    let documented = documented();
    let used = dashboard_metrics(&documented);
    let exprs: Vec<String> = queries(&dash).into_iter().map(|(_, e)| e.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    let any_expr = |parts: &[&str]| exprs.iter().any(|e| parts.iter().all(|p| e.contains(p)));

    let mut missing = Vec::new();
    for (topic, metrics) in TOPICS {
        for m in metrics.iter().filter(|m| !used.contains_key(**m)) {
            missing.push(format!("{topic}: no panel queries {m}"));
        }
    }
    // Shapes of query the topics need, not just the names.
    let shapes: &[(&str, &[&str])] = &[
        ("restore rate", &["rate(kstate_restore_bytes_total"]),
        ("block-cache hit rate as hits / (hits + misses)", &["kstate_rocksdb_block_cache_hits_total", "/ (", "kstate_rocksdb_block_cache_misses_total"]),
        ("write stall rate", &["rate(kstate_rocksdb_write_stalls_total"]),
        ("write stall time rate", &["rate(kstate_rocksdb_write_stall_micros_total"]),
        ("commit latency p50", &["histogram_quantile(0.5,", "kstate_commit_seconds_bucket", "le"]),
        ("commit latency p99", &["histogram_quantile(0.99,", "kstate_commit_seconds_bucket", "le"]),
        ("records processed per second by partition", &["sum by (partition) (rate(kstate_records_processed_total"]),
        ("state bytes by partition", &["sum by (partition) (kstate_store_logical_bytes"]),
        ("skew as max / avg", &["max(", ") / avg("]),
    ];
    for (what, parts) in shapes {
        if !any_expr(parts) {
            missing.push(format!("no query for {what} (an expr containing all of {parts:?})"));
        }
    }

    // Every panel has a title and a description with a hint into the runbook;
    // every runbook section is referenced by some panel.
    let panels: Vec<&Value> = all_panels(&dash).into_iter().filter(|p| p["type"] != "row").collect();
    for p in &panels {
        let description = p["description"].as_str().unwrap_or_default();
        if p["title"].as_str().unwrap_or_default().is_empty() {
            missing.push(format!("a panel without a title: {}", p["id"]));
        }
        if !(description.contains("What to do") && description.contains("docs/runbook.md")) {
            missing.push(format!("panel {:?}: no \"What to do\" hint into docs/runbook.md in its description", title(p)));
        }
        if p["targets"].as_array().is_none_or(Vec::is_empty) {
            missing.push(format!("panel {:?} has no query", title(p)));
        }
    }
    for section in RUNBOOK_SECTIONS {
        if !panels.iter().any(|p| p["description"].as_str().unwrap_or_default().contains(&format!("\"{section}\""))) {
            missing.push(format!("no panel points to the runbook section \"{section}\""));
        }
    }

    // Importable: a data source input and the template variables.
    if !dash["__inputs"].as_array().is_some_and(|i| i.iter().any(|i| i["name"] == "DS_PROMETHEUS")) {
        missing.push("no DS_PROMETHEUS data source input".to_string());
    }
    if dash["schemaVersion"].as_u64().is_none_or(|v| v < 36) {
        missing.push(format!("schemaVersion {} (expected ~39)", dash["schemaVersion"]));
    }
    let variables: Vec<&Value> = dash["templating"]["list"].as_array().map(|l| l.iter().collect()).unwrap_or_default();
    for name in ["instance", "store", "partition"] {
        let found = variables.iter().find(|v| v["name"] == name);
        if !found.is_some_and(|v| v["definition"].as_str().unwrap_or_default().starts_with("label_values(")) {
            missing.push(format!("no template variable {name} from label_values"));
        }
    }
    assert!(missing.is_empty(), "dashboards/kstate-grafana.json falls short:\n  {}", missing.join("\n  "));
}

// ---------------------------------------------------------------------------
// Against the broker: the metrics are really exported.

/// Dashboard metrics this test does not expect in the render, because only
/// events it does not cause record them.
const NOT_CAUSED: &[(&str, &str)] = &[
    // Recorded only while a task warms up on an instance that is not its
    // owner yet (probing rebalances with an instance that lags); the second
    // instance here may be given plain standbys instead.
    ("kstate_warmup_lag_records", "needs a warmup task"),
    // Stores here never seed from a snapshot (`seed_stores(false)`, so the
    // full restore below stays one); tests/snapshots.rs seeds them.
    ("kstate_snapshot_seed_bytes_per_sec", "needs a store seeded from a snapshot"),
    // The stores here are local; tests/remote.rs checks these.
    ("kstate_remote_requests_total", "needs remote stores"),
    ("kstate_remote_bytes_total", "needs remote stores"),
    ("kstate_remote_cache_hits_total", "needs remote stores"),
    ("kstate_remote_cache_misses_total", "needs remote stores"),
    ("kstate_remote_waiting", "needs remote stores and an outage"),
    ("kstate_remote_open_seconds", "needs remote stores"),
    ("kstate_snapshot_seeds_total", "needs a store seeded from a snapshot"),
    // Failure detection: these instances run without peer links; the peer
    // metrics need instances as processes that are killed, frozen or sent
    // strangers' connections (tests/peers.rs does each).
    ("kstate_peers", "needs peer links"),
    ("kstate_peers_dropped_total", "needs a peer dropped"),
    ("kstate_peer_lease_lapses_total", "needs a peer's lease to run out"),
    ("kstate_peer_failover_seconds", "needs a peer dropped"),
    ("kstate_peer_rejected_total", "needs a refused peer connection"),
    ("kstate_peer_previous_secret_links", "needs a peer secret rotation under way"),
];

/// Series names in a Prometheus text render, with the sum of their values.
fn rendered(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        *out.entry(line[..name_end].to_string()).or_insert(0.0) += value;
    }
    out
}

/// The series a dashboard metric shows up as: `x_bucket` for a histogram
/// (so `histogram_quantile` works), the name itself otherwise.
fn series_of(metric: &str, documented: &BTreeMap<String, String>) -> String {
    match documented.get(metric).map(String::as_str) {
        Some("histogram") => format!("{metric}_bucket"),
        _ => metric.to_string(),
    }
}

fn missing_from(render: &BTreeMap<String, f64>, wanted: &BTreeMap<String, String>) -> Vec<String> {
    wanted.iter().filter(|(_, series)| !render.contains_key(*series)).map(|(metric, _)| metric.clone()).collect()
}

#[test]
fn dashboard_metrics_are_exported() {
    use common::*;
    use kstate::StoreDefinition;
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

    // The only test of this binary that records metrics: a process-wide
    // recorder, with buckets for the `*_seconds` histograms as in
    // examples/prometheus.rs.
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &[0.001, 0.01, 0.1, 1.0, 10.0, 60.0])
        .expect("buckets")
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("first recorder of this test binary");
    // The highest value each series name reached over the run (gauges of
    // closed stores may drop back to 0).
    let peak = std::cell::RefCell::new(BTreeMap::<String, f64>::new());
    let render = || {
        handle.run_upkeep();
        let now = rendered(&handle.render());
        let mut peak = peak.borrow_mut();
        for (name, value) in &now {
            let p = peak.entry(name.clone()).or_insert(*value);
            *p = p.max(*value);
        }
        now
    };
    // Series that must have been above 0 at some point: the app processed,
    // stored, committed and restored records.
    let zero = |names: &[&str]| -> Vec<String> {
        let peak = peak.borrow();
        names.iter().filter(|n| peak.get(**n).is_none_or(|v| *v <= 0.0)).map(|n| n.to_string()).collect()
    };
    const NONZERO: &[&str] = &[
        "kstate_records_processed_total",
        "kstate_store_logical_bytes",
        "kstate_store_physical_bytes",
        "kstate_rocksdb_estimate_num_keys",
        "kstate_state_dir_used_bytes",
        "kstate_state_dir_free_bytes",
        "kstate_commit_seconds_count",
        "kstate_restore_records_total",
        "kstate_restore_bytes_total",
        "kstate_stream_time_ms",
        "kstate_timers_fired_total",
        "kstate_punctuations_total",
        "kstate_ttl_expired_total",
        "kstate_window_segments",
        "kstate_window_late_records_total",
        "kstate_global_table_records_total",
        "kstate_input_enforced_total",
    ];

    let documented = documented();
    let not_caused: BTreeSet<&str> = NOT_CAUSED.iter().map(|(m, _)| *m).collect();
    let wanted: BTreeMap<String, String> = dashboard_metrics(&documented)
        .into_keys()
        .filter(|m| !not_caused.contains(m.as_str()))
        .map(|m| (m.clone(), series_of(&m, &documented)))
        .collect();
    let restore_only = ["kstate_restore_remaining_bytes"];
    let before_restore: BTreeMap<String, String> =
        wanted.iter().filter(|(m, _)| !restore_only.contains(&m.as_str())).map(|(m, s)| (m.clone(), s.clone())).collect();

    // Two instances with a standby each (standby lag), committing often.
    const PARTITIONS: i32 = 2;
    let Fixture { input, app, state } = fixture("dashboard", PARTITIONS);
    // A second input (merged with the first: it stays empty, so records
    // are held and taken with it empty) and a global table.
    let (other, reference) = (unique("dashboard-other"), unique("dashboard-ref"));
    create_topic(&other, PARTITIONS, &[]);
    create_topic(&reference, 1, &[("cleanup.policy", "compact")]);
    produce(&reference, &[(0, b"a".to_vec(), Some(b"1".to_vec())), (0, b"b".to_vec(), Some(b"2".to_vec()))]);
    let second_state = tempfile::tempdir().unwrap();
    let snapshot_dir = tempfile::tempdir().unwrap();
    let snapshots = kstate::SnapshotConfig::new(format!("file://{}", snapshot_dir.path().display()))
        .interval(Duration::from_secs(1))
        .seed_stores(false);
    // Each record: a put into a TTL store (entries expire after 1 s) and
    // a wall-clock timer 100 ms ahead; a stream-time punctuation.
    struct Writer;
    impl kstate::Processor for Writer {
        fn init(&mut self, ctx: &mut kstate::ProcessorContext<'_>) -> Result<(), kstate::ProcessorError> {
            ctx.schedule(kstate::TimeDomain::StreamTime, Duration::from_millis(100))?;
            Ok(())
        }
        fn process(&mut self, ctx: &mut kstate::ProcessorContext<'_>, rec: &kstate::Record<'_>) -> Result<(), kstate::ProcessorError> {
            let _ = ctx.global_table("reference")?.get(b"a")?;
            let s = ctx.store("s")?;
            s.put(rec.key.unwrap_or_default(), rec.value.unwrap_or_default())?;
            let _ = s.get(rec.key.unwrap_or_default())?;
            let at = ctx.wall_clock_time() + 100;
            ctx.register_timer(kstate::TimeDomain::WallClock, rec.key.unwrap_or_default(), at)?;
            // Windows: the record's count, and a write 1 h in the past (late).
            let now = ctx.timestamp().unwrap_or_default();
            let mut w = ctx.window_store::<kstate::codec::RawBytes, kstate::codec::U64Be>("w")?;
            let _ = w.update(&rec.key.unwrap_or_default().to_vec(), now, |_, n| n.unwrap_or(0) + 1)?;
            let _ = w.update(&rec.key.unwrap_or_default().to_vec(), now - 3_600_000, |_, n| n.unwrap_or(0) + 1)?;
            Ok(())
        }
        fn on_timer(&mut self, _: &mut kstate::ProcessorContext<'_>, _: &kstate::Timer) -> Result<(), kstate::ProcessorError> {
            Ok(())
        }
    }
    let start = |dir: &Path| {
        let builder = builder(&app, &input, dir)
            .store(
                StoreDefinition::new("s")
                    .ttl(Duration::from_secs(1), kstate::TimeDomain::WallClock)
                    .ttl_cleanup_interval(Duration::from_secs(1)),
            )
            .store(StoreDefinition::window("w", kstate::Windows::tumbling(Duration::from_secs(1))))
            .input_topic(&other)
            .global_table("reference", &reference)
            .timers(true)
            .num_standby_replicas(1)
            .snapshots(snapshots.clone())
            .commit_interval(Duration::from_millis(200));
        Running::start_processor(builder, |_| Writer)
    };
    let first = start(state.path());
    let second = start(second_state.path());

    // A few thousand records over ~20 s: commits keep coming after the
    // engine gauges' 10 s refresh interval.
    let feeder = Feeder::start(&bootstrap(), &input, PARTITIONS, 500, 200, 4000);
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut missing = missing_from(&render(), &before_restore);
    while !missing.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        missing = missing_from(&render(), &before_restore);
    }
    eprintln!("while processing, not (yet) rendered: {missing:?}");
    let sent = feeder.join(false);
    wait_all_committed_at(&bootstrap(), &app, &input, PARTITIONS, Duration::from_secs(60));
    first.shutdown.shutdown();
    second.shutdown.shutdown();
    second.stop().expect("second instance stopped cleanly");
    first.stop().expect("first instance stopped cleanly");

    // A full restore: the first instance's state is gone; it restores both
    // partitions from their changelogs.
    let restored_before = render().get("kstate_restore_records_total").copied().unwrap_or(0.0);
    std::fs::remove_dir_all(state.path().join(&app)).expect("delete the first instance's state");
    let again = start(state.path());
    produce(&input, &[(0, b"after".to_vec(), Some(b"restore".to_vec())), (1, b"after".to_vec(), Some(b"restore".to_vec()))]);
    let deadline = Instant::now() + Duration::from_secs(40);
    let restored = |r: &BTreeMap<String, f64>| r.get("kstate_restore_records_total").copied().unwrap_or(0.0) > restored_before;
    let mut now = render();
    while !(restored(&now) && missing_from(&now, &wanted).is_empty() && zero(NONZERO).is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        now = render();
    }
    again.stop().expect("restarted instance stopped cleanly");

    let text = handle.render();
    let missing = missing_from(&rendered(&text), &wanted);
    let kstate_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("kstate_")).collect();
    assert!(
        missing.is_empty(),
        "{} metric(s) the dashboard queries were not exported after {} records and a full restore: {missing:?}\n\
         (series looked for: {:?})\nrendered kstate series:\n{}",
        missing.len(),
        sent.len(),
        missing.iter().map(|m| &wanted[m]).collect::<Vec<_>>(),
        kstate_lines.join("\n")
    );
    let zero = zero(NONZERO);
    assert!(zero.is_empty(), "exported but never above 0 during the run: {zero:?}");
    assert!(
        restored(&rendered(&text)),
        "kstate_restore_records_total did not grow with the full restore (before: {restored_before})"
    );
}
