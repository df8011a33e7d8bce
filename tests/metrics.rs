//! The operational metrics against the real broker: per task records
//! processed and input lag, per store partition logical and physical bytes
//! and keys, per instance state-dir disk use and free space. The values are
//! compared with what the test knows (the input, the files on disk), not
//! only checked for presence.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kstate::StoreDefinition;
use metrics::Key;
use metrics_util::registry::{AtomicStorage, Registry};

#[path = "support/keeping.rs"]
mod keeping;
use keeping::Keeping;

/// `name{label=value,...}` → value, for every counter and gauge registered so far.
fn snapshot(registry: &Registry<Key, AtomicStorage>) -> HashMap<String, f64> {
    let name = |key: &Key| {
        let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        format!("{}{{{}}}", key.name(), labels.join(","))
    };
    let mut seen = HashMap::new();
    registry.visit_counters(|key, c| {
        seen.insert(name(key), c.load(Ordering::Relaxed) as f64);
    });
    registry.visit_gauges(|key, g| {
        seen.insert(name(key), f64::from_bits(g.load(Ordering::Relaxed)));
    });
    seen
}

fn number(seen: &HashMap<String, f64>, name: &str) -> Option<f64> {
    seen.get(name).copied()
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let t = e.file_type().unwrap();
                    if t.is_dir() {
                        dir_bytes(&e.path())
                    } else {
                        e.metadata().map_or(0, |m| m.len())
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn operational_metrics_follow_the_input_and_the_disk() {
    const PARTITIONS: i32 = 2;
    const RECORDS: usize = 40_000;
    const KEYS: usize = 4_000;
    const VALUE: usize = 100;
    let registry = Arc::new(Registry::atomic());
    metrics::set_global_recorder(Keeping(registry.clone())).expect("the only recorder of this test binary");
    let Fixture { input, app, state } = fixture("metrics", PARTITIONS);
    let records: Vec<KeyedRecord> = (0..RECORDS)
        .map(|i| ((i % 2) as i32, format!("key-{:05}", i % KEYS).into_bytes(), Some(vec![b'v'; VALUE])))
        .collect();
    produce(&input, &records);

    // Slow (about 1 ms per record) until the test has seen an input lag:
    // the gauges refresh every 10 s.
    let slow = Arc::new(AtomicBool::new(true));
    let slow_in = slow.clone();
    let builder = builder(&app, &input, state.path())
        .store(StoreDefinition::new("m"))
        .commit_interval(Duration::from_millis(200))
        .rocksdb_statistics(true);
    let running = Running::start(builder, move |ctx, rec| {
        if slow_in.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
        ctx.store("m")?.put(rec.key.unwrap(), rec.value.unwrap())?;
        Ok(())
    });
    let lag = |seen: &HashMap<String, f64>, p: i32| number(seen, &format!("kstate_input_lag_records{{topic={input},partition={p}}}"));
    let mut lagging = 0.0;
    wait_until("an input lag reported while the processor is slow", Duration::from_secs(25), || {
        let seen = snapshot(&registry);
        lagging = (0..PARTITIONS).filter_map(|p| lag(&seen, p)).sum();
        lagging > 0.0
    });
    slow.store(false, Ordering::Relaxed);
    assert!(lagging <= RECORDS as f64, "lag {lagging} is at most the input");
    for p in 0..PARTITIONS {
        wait_until("all input committed", TIMEOUT, || committed_offset(&app, &input, p) == Some((RECORDS / 2) as i64));
    }
    // The next refresh after the input is done: no lag, and the store sizes.
    let logical = |seen: &HashMap<String, f64>, p: i32| number(seen, &format!("kstate_store_logical_bytes{{store=m,partition={p}}}"));
    wait_until("input lag back to 0 and store sizes published", Duration::from_secs(25), || {
        let seen = snapshot(&registry);
        (0..PARTITIONS).all(|p| lag(&seen, p) == Some(0.0) && logical(&seen, p).is_some_and(|b| b > 0.0))
    });
    let seen = snapshot(&registry);

    let processed: f64 = (0..PARTITIONS)
        .map(|p| number(&seen, &format!("kstate_records_processed_total{{partition={p}}}")).expect("records processed per task"))
        .sum();
    assert_eq!(processed, RECORDS as f64, "every input record counted once (no crash, no reprocessing)");

    // Each partition holds KEYS / 2 keys of `key-nnnnn` (9 bytes) and a 100-byte value.
    let exact = (KEYS / 2 * (9 + VALUE)) as f64;
    for p in 0..PARTITIONS {
        let logical = logical(&seen, p).unwrap();
        // Each key was written 10 times: overwrites count until compacted.
        assert!(logical >= exact && logical <= 12.0 * exact, "partition {p}: logical bytes {logical} vs exact {exact}");
        let physical = number(&seen, &format!("kstate_store_physical_bytes{{store=m,partition={p}}}")).unwrap();
        assert!(physical > 0.0, "partition {p}: physical bytes {physical}");
        let keys = number(&seen, &format!("kstate_rocksdb_estimate_num_keys{{store=m,partition={p}}}")).unwrap();
        assert!(keys >= (KEYS / 2) as f64 && keys <= (RECORDS / 2) as f64, "partition {p}: keys {keys}");
        // Registered with the store (their counting is tested in the engine's unit tests).
        for counter in [
            "kstate_rocksdb_write_stalls_total",
            "kstate_rocksdb_write_stall_micros_total",
            "kstate_rocksdb_block_cache_hits_total",
            "kstate_rocksdb_block_cache_misses_total",
        ] {
            assert!(number(&seen, &format!("{counter}{{store=m,partition={p}}}")).is_some(), "{counter} for partition {p}");
        }
    }

    // The state dir's disk use is what is on disk (within the files that
    // RocksDB rewrote since the gauge was refreshed), and there is free space.
    let used = number(&seen, "kstate_state_dir_used_bytes{}").expect("state dir used");
    let on_disk = dir_bytes(&state.path().join(&app)) as f64;
    assert!(used > 0.0 && used >= on_disk / 3.0 && used <= on_disk * 3.0, "state dir used {used} vs {on_disk} on disk");
    let free = number(&seen, "kstate_state_dir_free_bytes{}").expect("free space");
    assert!(free > 0.0, "free bytes {free}");
    running.stop().unwrap();
    // Closed tasks report no sizes (their next owner does).
    let seen = snapshot(&registry);
    for p in 0..PARTITIONS {
        assert_eq!(logical(&seen, p), Some(0.0), "partition {p}: sizes cleared when the task closed");
    }
}
