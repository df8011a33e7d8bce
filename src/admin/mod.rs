//! Operator tooling: what the `kstate` command line tool (`cli/`) does,
//! as a library.
//!
//! Every function works on a state directory laid out as kstate writes it,
//! `<state_dir>/<application_id>/<store>/<partition>/` with `.kstate.lock`,
//! `db/` (RocksDB) and `kstate.checkpoint`. Reading functions
//! ([`inspect()`], [`sample()`], [`verify()`], [`estimate_restore()`]) open
//! the databases as RocksDB secondary instances: they take no lock and
//! write nothing in the store directories, so they work while an
//! application runs (they see its last flush, a committed prefix).
//! Writing functions ([`snapshot()`], [`import_snapshot()`], [`wipe()`])
//! take the store partitions' locks without waiting and refuse to touch a
//! store a live instance holds ([`crate::Error::StateDirLocked`], carried
//! as [`AdminError::Kstate`]). To tell whether a store is live,
//! [`inspect()`] takes its lock for an instant; an instance opening it at
//! that moment waits and retries (its `lock_timeout`).
//!
//! Every report is a plain [`serde::Serialize`] struct (the CLI's `--json`).
//! Every function fails with an [`AdminError`] (`error.rs`): its own
//! variants for what only the tooling produces, [`AdminError::Kstate`] for
//! failures of the library's machinery (RocksDB, locks, Kafka, I/O).

mod error;
mod estimate;
mod import;
mod inspect;
mod remote;
mod remote_store;
mod sample;
mod savepoint;
mod snapshot;
mod verify;
mod wipe;

pub use error::{AdminError, Result};
pub use estimate::{
    estimate_restore, EstimateOptions, LocalSizes, PartitionEstimate, RateSource, RestoreEstimate, SnapshotPath, DEFAULT_DOWNLOAD_RATE, DEFAULT_RESTORE_RATE,
    IN_MEMORY_ENTRY_OVERHEAD,
};
pub use import::{import_snapshot, ImportReport};
pub use inspect::{inspect, ApplicationReport, InspectReport, RestoreRateReport, SegmentsReport, StorePartitionReport};
pub use remote_store::{read_remote_store, RemoteStoreContents};
pub use remote::{gc_snapshots, list_snapshots, show_snapshot, PartitionGc, PartitionSnapshots, SnapshotStore};
pub use savepoint::{create_savepoint, delete_savepoint, list_savepoints, restore_savepoint, show_savepoint, RollbackReport, Savepoint, SavepointEntry, SavepointStore, SavepointTask, StoreRollback};
pub use sample::{sample, PrefixRule, PrefixStats, SampleReport, SampledEntry, SegmentStats};
pub use snapshot::{snapshot, SnapshotManifest, SnapshotReport, SNAPSHOT_MANIFEST};
pub use verify::{verify, verify_remote, KeyDifference, VerifyReport, MAX_LISTED};
pub use wipe::{wipe, WipeReport, WipedStore};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer as RdConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::store::engine::{Checkpoint, ReadOnlyDb};
use crate::error::Error;

/// The admin consumer: librdkafka's errors (authentication, TLS, refused
/// connections) arrive through the context's callback, not with the
/// request that failed; the last one is kept to say why.
pub(crate) type BaseConsumer = RdConsumer<AdminContext>;

/// Keeps the (first few distinct) errors librdkafka reported.
#[derive(Default)]
pub(crate) struct AdminContext {
    errors: std::sync::Mutex<Vec<String>>,
}

impl ClientContext for AdminContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let text = if reason.is_empty() { error.to_string() } else { reason.to_string() };
        self.note(text);
    }

    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _log_message: &str) {}
}

impl ConsumerContext for AdminContext {}

impl AdminContext {
    fn note(&self, text: String) {
        let mut errors = self.errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if errors.len() < 3 && !errors.contains(&text) {
            errors.push(text);
        }
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// How to reach the Kafka cluster.
#[derive(Debug, Clone)]
pub struct Kafka {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// Further librdkafka properties (TLS, SASL, ...), applied after the
    /// bootstrap servers.
    pub properties: Vec<(String, String)>,
    /// Bound on each metadata or offsets request (an unreachable broker
    /// fails after this long).
    pub timeout: Duration,
    /// Bound on reading a changelog partition (`verify`, the size sample of
    /// `estimate_restore`).
    pub read_timeout: Duration,
}

impl Kafka {
    /// The cluster at `bootstrap`, no further properties, 5 s request
    /// timeout, 120 s read timeout.
    pub fn new(bootstrap: impl Into<String>) -> Kafka {
        Kafka {
            bootstrap: bootstrap.into(),
            properties: Vec::new(),
            timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(120),
        }
    }

    /// The bootstrap servers, then `defaults`, then the user's properties
    /// (which override the defaults).
    fn client_config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for (k, v) in defaults {
            config.set(*k, *v);
        }
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        config
    }

    /// A consumer reading `read_committed` (changelogs written in
    /// transactions carry aborted records and markers), assign-only.
    pub(crate) fn consumer(&self) -> Result<BaseConsumer> {
        let config = self.client_config(&[
            ("group.id", "kstate-admin"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("isolation.level", "read_committed"),
            ("enable.partition.eof", "true"),
            ("auto.offset.reset", "earliest"),
        ]);
        Ok(config.create_with_context(AdminContext::default()).map_err(|e| match e {
            KafkaError::ClientCreation(msg) => Error::Config(format!("Kafka client properties: {msg}")),
            KafkaError::ClientConfig(_, msg, _, _) => Error::Config(format!("Kafka client properties: {msg}")),
            other => Error::from(other),
        })?)
    }

    /// The topic's `delete.retention.ms`, if the brokers tell it.
    pub(crate) fn tombstone_retention(&self, topic: &str) -> Option<Duration> {
        use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = self.client_config(&[]).create().ok()?;
        let opts = AdminOptions::new().request_timeout(Some(self.timeout));
        let described = futures::executor::block_on(admin.describe_configs([&ResourceSpecifier::Topic(topic)], &opts)).ok()?;
        let resource = described.into_iter().next()?.ok()?;
        resource.get("delete.retention.ms")?.value.as_deref()?.parse().ok().map(Duration::from_millis)
    }

    fn unreachable(&self, consumer: &BaseConsumer, detail: impl ToString) -> Error {
        let mut detail = detail.to_string();
        // Errors are served by polling (to the context, or as results).
        for _ in 0..10 {
            match consumer.poll(Duration::from_millis(20)) {
                Some(Err(e)) => consumer.context().note(e.to_string()),
                Some(Ok(_)) => {}
                None => break,
            }
        }
        let errors = consumer.context().errors();
        if !errors.is_empty() {
            detail = format!("{detail}; the client reported: {}", errors.join("; "));
        }
        Error::BrokerUnreachable { bootstrap: self.bootstrap.clone(), timeout: self.timeout, detail }
    }

    /// The partition count of `topic`, `None` if it does not exist.
    pub(crate) fn partitions(&self, consumer: &BaseConsumer, topic: &str) -> Result<Option<i32>> {
        let md = consumer.fetch_metadata(Some(topic), self.timeout).map_err(|e| self.unreachable(consumer, e))?;
        if md.brokers().is_empty() {
            return Err(self.unreachable(consumer, "the cluster reported no brokers").into());
        }
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else { return Ok(None) };
        match t.error() {
            None => Ok(Some(t.partitions().len() as i32)),
            Some(e) if rdkafka::types::RDKafkaErrorCode::from(e) == rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition => {
                Ok(None)
            }
            Some(e) => Err(AdminError::Changelog {
                topic: topic.to_string(),
                detail: format!("metadata error {:?}", rdkafka::types::RDKafkaErrorCode::from(e)),
            }),
        }
    }

    /// Checks that `topic` exists with `partition`; returns its (low, high)
    /// watermarks.
    pub(crate) fn watermarks(&self, consumer: &BaseConsumer, topic: &str, partition: i32) -> Result<(i64, i64)> {
        match self.partitions(consumer, topic)? {
            None => Err(AdminError::Changelog { topic: topic.to_string(), detail: "topic does not exist".into() }),
            Some(n) if partition >= n => Err(AdminError::Changelog {
                topic: topic.to_string(),
                detail: format!("has {n} partitions, no partition {partition}"),
            }),
            Some(_) => consumer.fetch_watermarks(topic, partition, self.timeout).map_err(|e| self.unreachable(consumer, e).into()),
        }
    }

    /// Reads `topic[partition]` from `from` up to `high` (exclusive) or its
    /// end for a `read_committed` reader, calling `f(offset, key, value)`;
    /// `f` returning `false` stops the read. Bounded by `read_timeout`.
    pub(crate) fn read(
        &self,
        consumer: &BaseConsumer,
        topic: &str,
        partition: i32,
        from: i64,
        high: i64,
        mut f: impl FnMut(i64, &[u8], Option<&[u8]>) -> bool,
    ) -> Result<()> {
        if from >= high {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(from)).map_err(Error::from)?;
        consumer.assign(&tpl).map_err(Error::from)?;
        let started = Instant::now();
        let mut last = from - 1;
        let mut last_error = None;
        let result = loop {
            if started.elapsed() > self.read_timeout {
                let error = last_error.as_ref().map_or(String::new(), |e| format!("; last error: {e}"));
                break Err(AdminError::Changelog {
                    topic: topic.to_string(),
                    detail: format!(
                        "reading partition {partition} timed out after {:?} at offset {} of [{from}, {high}){error}",
                        self.read_timeout,
                        last + 1
                    ),
                });
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if m.topic() != topic || m.partition() != partition => {}
                Some(Ok(m)) => {
                    last = m.offset();
                    // A record without a key is skipped, as the restore skips it.
                    let go_on = m.key().is_none_or(|key| f(m.offset(), key, m.payload()));
                    if !go_on || m.offset() + 1 >= high {
                        break Ok(());
                    }
                }
                Some(Err(KafkaError::PartitionEOF(p))) if p == partition => break Ok(()),
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) if started.elapsed() < self.read_timeout => {
                    // Connections drop and come back; librdkafka retries.
                    tracing::debug!(topic, partition, error = %e, "changelog read error; retrying");
                    last_error = Some(e.to_string());
                }
                Some(Err(e)) => break Err(Error::from(e).into()),
                None => {
                    if let Ok(pos) = consumer.position() {
                        if let Some(Offset::Offset(o)) = pos.find_partition(topic, partition).map(|e| e.offset()) {
                            if o >= high {
                                break Ok(());
                            }
                        }
                    }
                }
            }
        };
        let _ = consumer.unassign();
        result
    }
}

/// Whether `name` can only name a directory directly under its parent
/// (no `/`, `.`, `..`): an application or store name from the command line
/// must never reach outside the state dir.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '\0']) && name != "." && name != ".."
}

/// `<state_dir>/<app>`, checked to exist.
pub(crate) fn app_dir(state_dir: &Path, app: &str) -> Result<PathBuf> {
    if !state_dir.is_dir() {
        return Err(AdminError::StateDirMissing(state_dir.to_path_buf()));
    }
    let dir = state_dir.join(app);
    if !valid_name(app) || !dir.is_dir() {
        return Err(AdminError::StateNotFound {
            what: format!("application `{app}`"),
            path: dir,
            available: subdirs(state_dir),
        });
    }
    Ok(dir)
}

/// `<state_dir>/<app>/<store>/<partition>`, checked to exist.
pub(crate) fn store_partition_dir(state_dir: &Path, app: &str, store: &str, partition: i32) -> Result<PathBuf> {
    let app_dir = app_dir(state_dir, app)?;
    let store_dir = app_dir.join(store);
    if !valid_name(store) || !store_dir.is_dir() {
        return Err(AdminError::StateNotFound {
            what: format!("store `{store}` of application `{app}`"),
            path: store_dir,
            available: stores_of(&app_dir),
        });
    }
    let dir = store_dir.join(partition.to_string());
    if !dir.is_dir() {
        return Err(AdminError::StateNotFound {
            what: format!("partition {partition} of store `{store}`"),
            path: dir,
            available: partitions_of(&store_dir).iter().map(i32::to_string).collect(),
        });
    }
    Ok(dir)
}

/// The store directories of an application directory.
pub(crate) fn stores_of(app_dir: &Path) -> Vec<String> {
    subdirs(app_dir)
}

/// The topic a store's state comes from: a source table's own topic, as
/// its local partitions record it, else `<app>-<store>-changelog`.
pub(crate) fn changelog_topic_of(app_dir: &Path, app: &str, store: &str) -> String {
    let store_dir = app_dir.join(store);
    for p in partitions_of(&store_dir) {
        let Ok(ro) = ReadOnly::open(&store_dir.join(p.to_string())) else { continue };
        if let Ok(Some(topic)) = ro.db.meta_get(crate::store::table::SOURCE_TOPIC_KEY) {
            return String::from_utf8_lossy(&topic).into_owned();
        }
        break; // every partition of a store is alike
    }
    crate::kafka::changelog_topic(app, store)
}

/// A directory of our own under the system's temporary directory, removed
/// on drop.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new(what: &str) -> Result<Scratch> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "kstate-{what}-{}-{}-{}",
            std::process::id(),
            crate::store::engine::now_ms(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).map_err(|e| AdminError::io(&path, e))?;
        Ok(Scratch(path))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A store partition's database opened read-only (a RocksDB secondary
/// instance with a scratch directory of its own).
pub(crate) struct ReadOnly {
    // Declared first: dropped before its scratch directory goes.
    pub(crate) db: ReadOnlyDb,
    _scratch: Scratch,
}

impl ReadOnly {
    /// Opens `<store_partition_dir>/db`.
    pub(crate) fn open(store_partition_dir: &Path) -> Result<ReadOnly> {
        Self::open_db(&store_partition_dir.join("db"))
    }

    /// Opens the database at `db_path`.
    pub(crate) fn open_db(db_path: &Path) -> Result<ReadOnly> {
        if !db_path.join("CURRENT").is_file() && !db_path.join(crate::store::engine::HEAP_FILE).is_file() {
            return Err(AdminError::Admin(format!("`{}` holds no RocksDB database and no in-memory store file", db_path.display())));
        }
        let scratch = Scratch::new("secondary")?;
        let db = ReadOnlyDb::open(db_path, scratch.path())?;
        Ok(ReadOnly { db, _scratch: scratch })
    }

    /// What the restore checks of local state: checkpoint (a corrupt one is
    /// an error), changelog topic id, age bound.
    pub(crate) fn local_checkpoint(&self, what: &Path) -> Result<crate::restore::LocalCheckpoint> {
        Ok(crate::restore::LocalCheckpoint {
            checkpoint: self.checkpoint(what)?,
            topic_id: self.db.changelog_topic_id()?,
            appended_after_ms: self.db.appended_after_ms()?,
        })
    }

    /// The checkpoint, `None` if nothing was committed; a corrupt one is an error.
    pub(crate) fn checkpoint(&self, what: &Path) -> Result<Option<i64>> {
        match self.db.checkpoint()? {
            Checkpoint::None => Ok(None),
            Checkpoint::At(c) => Ok(Some(c)),
            Checkpoint::Corrupt(why) => Err(AdminError::Admin(format!("`{}`: {why}", what.display()))),
        }
    }
}

pub(crate) use crate::store::state_dir::{dir_bytes, partitions_of, subdirs};

/// A key or value for display: printable ASCII as is, `\\` and other bytes
/// as `\xNN`.
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// [`escape_bytes`] of at most `max` bytes, with `…` when cut.
pub(crate) fn escape_cut(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max {
        escape_bytes(bytes)
    } else {
        format!("{}…", escape_bytes(&bytes[..max]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_shows_printable_bytes_and_hex_for_the_rest() {
        assert_eq!(escape_bytes(b"ab c"), "ab c");
        assert_eq!(escape_bytes(b"a\x00\xff\\"), "a\\x00\\xff\\\\");
        assert_eq!(escape_cut(b"abcdef", 3), "abc…");
    }

    #[test]
    fn missing_state_dir_and_unknown_names_are_typed_errors() {
        let dir = std::env::temp_dir().join("kstate-admin-test-does-not-exist");
        assert!(matches!(app_dir(&dir, "a"), Err(AdminError::StateDirMissing(_))));
        let scratch = Scratch::new("test").unwrap();
        std::fs::create_dir_all(scratch.path().join("app/s/0")).unwrap();
        assert!(matches!(app_dir(scratch.path(), "b"), Err(AdminError::StateNotFound { .. })));
        // Names that would reach outside the state dir (`wipe --app ..`).
        for name in ["..", ".", "app/s", ""] {
            assert!(matches!(app_dir(&scratch.path().join("app"), name), Err(AdminError::StateNotFound { .. })), "{name}");
            assert!(matches!(store_partition_dir(scratch.path(), "app", name, 0), Err(AdminError::StateNotFound { .. })), "{name}");
        }
        assert!(matches!(store_partition_dir(scratch.path(), "app", "t", 0), Err(AdminError::StateNotFound { .. })));
        let e = store_partition_dir(scratch.path(), "app", "s", 1).unwrap_err();
        assert!(e.to_string().contains("found: 0"), "{e}");
        assert!(store_partition_dir(scratch.path(), "app", "s", 0).is_ok());
        assert!(!crate::store::lock::is_held(&scratch.path().join("app/s/0")).unwrap());
        let lock = crate::store::lock::DirLock::acquire(&scratch.path().join("app/s/0"), Duration::ZERO).unwrap();
        assert!(crate::store::lock::is_held(&scratch.path().join("app/s/0")).unwrap());
        drop(lock);
        assert!(!crate::store::lock::is_held(&scratch.path().join("app/s/0")).unwrap());
    }
}
