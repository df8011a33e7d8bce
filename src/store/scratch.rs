//! Scratch stores for unit tests of what is built on stores. With
//! `KSTATE_TEST_STORES=memory` they are in memory (testing/test.sh runs the
//! store tests once per backend).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{KeyValueStore, StoreOpenArgs};
use crate::kafka::ChangelogSink;
use crate::store::engine::EngineResources;
use crate::windows::Shape;

/// A store in `dir` whose changelog producer never connects (unit tests
/// of what is built on stores: nothing is committed).
pub(crate) fn scratch_store(dir: &Path) -> KeyValueStore {
    scratch_store_with(dir, None)
}

/// A scratch store of `segments`' shape (`None`: key-value).
pub(crate) fn scratch_store_with(dir: &Path, segments: Option<(Shape, Duration)>) -> KeyValueStore {
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", "127.0.0.1:1");
    let producer = ChangelogSink::Producer(Arc::new(crate::kafka::ChangelogProducer::new(config, 1_000_000, Duration::from_secs(1)).expect("producer")));
    let resources = EngineResources::new(8 << 20, 4 << 20);
    KeyValueStore::open(StoreOpenArgs {
        seed: None,
        name: "scratch",
        partition: 0,
        dir: dir.to_path_buf(),
        changelog_topic: "scratch-changelog".into(),
        max_record_bytes: 1_000_000,
        producer,
        resources: &resources,
        lock_timeout: Duration::from_secs(1),
        tombstone_retention: None,
        ttl: None,
        segments,
        live_tail_retention: None,
        published: None,
        schema: Default::default(),
        final_results: false,
        backend: if std::env::var("KSTATE_TEST_STORES").is_ok_and(|v| v == "memory") { crate::store::StoreBackend::InMemory } else { crate::store::StoreBackend::RocksDb },
    })
    .expect("scratch store")
}
