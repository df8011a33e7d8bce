//! kstate's metrics as this test binary recorded them. A module of its own
//! (`#[path = "common/recorded.rs"] mod recorded;`), not part of `common`:
//! cli/tests compiles `common` without the metrics-util dev-dependency.

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Installs the recording (once per test binary; call it before the
/// metrics of interest are registered) and returns its snapshotter.
pub fn metrics() -> &'static Snapshotter {
    static SNAPSHOTTER: std::sync::OnceLock<Snapshotter> = std::sync::OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder of this test binary");
        snapshotter
    })
}

/// The value of the counter or gauge `name` with exactly these labels, if recorded.
pub fn metric(name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics().snapshot().into_vec().into_iter().find_map(|(key, _, _, value)| {
        let key = key.key();
        let same = key.name() == name && key.labels().count() == labels.len() && key.labels().all(|l| labels.contains(&(l.key(), l.value())));
        match value {
            DebugValue::Counter(n) if same => Some(n as f64),
            DebugValue::Gauge(g) if same => Some(g.into_inner()),
            _ => None,
        }
    })
}
