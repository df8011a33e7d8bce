//! Log lines can be told apart per task and per rebalance: kstate's lines
//! about a task (opened, restored, running) and the processor's own
//! lines are inside a `task{app, partition}` span; the lines of applying
//! an assignment inside `rebalance{app, generation}`. Checked on the formatted output of a real
//! run against the broker, including a restore.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use kstate::StoreDefinition;

/// Every formatted log line, kept for the assertions.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap()).lines().map(str::to_string).collect()
    }

    /// The lines that contain `message`.
    fn with(&self, message: &str) -> Vec<String> {
        self.lines().into_iter().filter(|l| l.contains(message)).collect()
    }
}

#[test]
fn task_and_rebalance_lines_carry_their_spans() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_env_filter("kstate=info,logs=info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let Fixture { input, app, state } = fixture("logs", 2);
    let records: Vec<KeyedRecord> = (0..200).map(|i| (i % 2, format!("k{i}").into_bytes(), Some(b"v".to_vec()))).collect();
    produce(&input, &records);
    let run = |what: &str, done: &dyn Fn(usize) -> bool| {
        let processed = Arc::new(Mutex::new(0usize));
        let seen = processed.clone();
        let running = Running::start(builder(&app, &input, state.path()).store(StoreDefinition::new("s")), move |ctx, rec| {
            tracing::info!(target: "logs", "processor saw a record");
            ctx.store("s")?.put(rec.key.unwrap(), rec.value.unwrap())?;
            *seen.lock().unwrap() += 1;
            Ok(())
        });
        wait_until(what, Duration::from_secs(60), || done(*processed.lock().unwrap()));
        running.stop().expect("clean stop");
    };
    run("the first run to process every record", &|processed| processed >= 200);
    // A second run on an empty state dir restores both partitions from the
    // changelog (and has nothing left to process).
    std::fs::remove_dir_all(state.path().join(&app)).unwrap();
    run("the second run's tasks to run", &|_| captured.with("task running").len() >= 4);

    for p in 0..2 {
        let span = format!("task{{app={app} partition={p}}}");
        for message in ["task assigned; restoring its stores", "restore starting", "restore finished", "task running"] {
            let lines = captured.with(message);
            assert!(
                lines.iter().any(|l| l.contains(&span)),
                "no `{message}` line of partition {p} inside `{span}`: {lines:#?}"
            );
        }
        let processor_lines = captured.with("processor saw a record");
        assert!(processor_lines.iter().any(|l| l.contains(&span)), "the processor's lines are not inside `{span}`");
    }
    let processor_lines = captured.with("processor saw a record");
    assert_eq!(processor_lines.len(), 200, "one processor line per record processed");
    assert!(processor_lines.iter().all(|l| l.contains("task{")), "a processor line outside its task's span");
    let applying = captured.with("applying the group's assignment");
    assert!(!applying.is_empty(), "no assignment applied?");
    assert!(
        applying.iter().all(|l| l.contains(&format!("rebalance{{app={app} generation="))),
        "assignment lines outside a rebalance span: {applying:#?}"
    );
}
