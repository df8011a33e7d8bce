//! `kstate savepoint create|list|show|delete|restore`: savepoints of an
//! application in its snapshot store (architecture.md §10, "savepoints").
//!
//! Create is online: a request object that the running instances answer
//! with each task's consistent cut. Restore is offline (the group empty):
//! per store partition it writes to the changelog the differences between
//! the state now and the savepoint's (the keys written since the
//! savepoint's checkpoint, put back to their savepoint value or deleted),
//! then commits the savepoint's input offsets. Every copy of the state
//! (local stores, standbys, snapshots taken since) then converges to the
//! savepoint by replaying the changelog's tail, as after any commit.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::remote::SnapshotStore;
use super::{AdminError, Kafka, Result};
use crate::restore::ChangelogState;
use crate::snapshot::savepoint::{valid_name, SavepointPaths, SavepointRequest, SAVEPOINT_FORMAT_VERSION};
use crate::snapshot::{RemoteSnapshot, SnapshotConfig, SnapshotHandle, Snapshots};
use crate::store::engine::{now_ms, ReadOnlyDb};

pub use crate::snapshot::savepoint::{Savepoint, SavepointStore, SavepointTask};

/// A savepoint as `list` shows it: complete, or requested and in progress.
#[derive(Debug, Clone, Serialize)]
pub struct SavepointEntry {
    /// Its name.
    pub name: String,
    /// The complete savepoint, if it is.
    pub savepoint: Option<Savepoint>,
    /// Requested and not complete yet: the partitions with their part.
    pub parts: Vec<i32>,
}

/// What a restore wrote for one store partition.
#[derive(Debug, Clone, Serialize)]
pub struct StoreRollback {
    /// The store.
    pub store: String,
    /// The partition.
    pub partition: i32,
    /// The savepoint's checkpoint of it (`None`: it was empty).
    pub savepoint_checkpoint: Option<i64>,
    /// The changelog's end offset before the restore wrote to it.
    pub changelog_end: i64,
    /// `tail`: only keys written since the savepoint's checkpoint were
    /// compared; `full` (the changelog no longer holds everything since,
    /// or was recreated): every key.
    pub mode: String,
    /// Records read from the changelog.
    pub records_read: u64,
    /// Keys put back to their savepoint value.
    pub puts: u64,
    /// Keys deleted (tombstones).
    pub deletes: u64,
}

/// What `restore_savepoint` did.
#[derive(Debug, Clone, Serialize)]
pub struct RollbackReport {
    /// The savepoint.
    pub name: String,
    /// The application.
    pub application_id: String,
    /// Every store partition.
    pub stores: Vec<StoreRollback>,
    /// The input offsets committed for the group (topic, partition, offset).
    pub offsets: Vec<(String, i32, i64)>,
}

fn service(at: &SnapshotStore, app: &str) -> Result<Snapshots> {
    let mut config = SnapshotConfig::new(&at.url);
    config.options = at.options.clone();
    Snapshots::new(config, app, &SnapshotHandle::default()).map_err(AdminError::Admin)
}

fn check_name(name: &str) -> Result<()> {
    if valid_name(name) {
        return Ok(());
    }
    Err(AdminError::Admin(format!(
        "savepoint name `{name}`: use 1-200 ASCII letters, digits, `.`, `_` or `-` (not starting with `.`, not `requests`)"
    )))
}

fn remote_error(e: impl std::fmt::Display) -> AdminError {
    AdminError::Admin(e.to_string())
}

/// The complete savepoint `name`, if there is one.
fn read_complete(s: &Snapshots, paths: &SavepointPaths, name: &str) -> Result<Option<Savepoint>> {
    match s.block_on(s.remote.get_bytes(&paths.complete(name))) {
        Ok(bytes) => {
            let sp: Savepoint = serde_json::from_slice(&bytes).map_err(|e| AdminError::Admin(format!("savepoint `{name}` unreadable: {e}")))?;
            if sp.format_version > SAVEPOINT_FORMAT_VERSION {
                return Err(AdminError::Admin(format!(
                    "savepoint `{name}` has format {} and this kstate reads up to {SAVEPOINT_FORMAT_VERSION}: use a newer kstate",
                    sp.format_version
                )));
            }
            Ok(Some(sp))
        }
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(remote_error(e)),
    }
}

/// The parts written so far for savepoint `name`, by partition.
fn read_parts(s: &Snapshots, paths: &SavepointPaths, name: &str) -> Result<Vec<SavepointTask>> {
    let listed = s.block_on(s.remote.list(&paths.tasks(name))).map_err(remote_error)?;
    let mut out = Vec::new();
    for meta in listed {
        match s.block_on(s.remote.get_bytes(&meta.location)) {
            Ok(bytes) => out.push(serde_json::from_slice::<SavepointTask>(&bytes).map_err(|e| AdminError::Admin(format!("{}: {e}", meta.location)))?),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(remote_error(e)),
        }
    }
    out.sort_by_key(|t| t.partition);
    Ok(out)
}

/// Asks the running instances of `app` for a savepoint `name` and waits up
/// to `timeout` until every input partition has its part, then completes
/// it. Running it again with the same name goes on waiting for the same
/// request; a name that is complete already is refused.
pub fn create_savepoint(at: &SnapshotStore, app: &str, name: &str, timeout: Duration) -> Result<Savepoint> {
    check_name(name)?;
    let s = service(at, app)?;
    let paths = SavepointPaths::of(&s.remote, app);
    if read_complete(&s, &paths, name)?.is_some() {
        return Err(AdminError::Admin(format!("savepoint `{name}` of `{app}` exists already; delete it first or pick another name")));
    }
    let request = match s.block_on(s.remote.get_bytes(&paths.request(name))) {
        Ok(bytes) => serde_json::from_slice::<SavepointRequest>(&bytes).map_err(remote_error)?,
        Err(e) if e.is_not_found() => {
            let r = SavepointRequest { name: name.to_string(), requested_at_ms: now_ms() };
            s.block_on(s.remote.put_bytes(&paths.request(name), serde_json::to_vec(&r).map_err(remote_error)?)).map_err(remote_error)?;
            r
        }
        Err(e) => return Err(remote_error(e)),
    };
    let started = Instant::now();
    loop {
        let parts = read_parts(&s, &paths, name)?;
        let partitions = parts.iter().map(|t| t.partitions).max().unwrap_or(0);
        if partitions > 0 && parts.iter().any(|t| t.partitions != partitions) {
            return Err(AdminError::Admin(format!(
                "the input partition count changed while savepoint `{name}` was taken; delete it and take another"
            )));
        }
        let have: BTreeSet<i32> = parts.iter().map(|t| t.partition).collect();
        if partitions > 0 && (0..partitions).all(|p| have.contains(&p)) {
            let sp = Savepoint {
                format_version: SAVEPOINT_FORMAT_VERSION,
                name: name.to_string(),
                application_id: app.to_string(),
                requested_at_ms: request.requested_at_ms,
                completed_at_ms: now_ms(),
                partitions,
                tasks: parts,
                kstate_version: env!("CARGO_PKG_VERSION").to_string(),
            };
            let json = serde_json::to_vec_pretty(&sp).map_err(remote_error)?;
            s.block_on(s.remote.put_bytes(&paths.complete(name), json)).map_err(remote_error)?;
            s.block_on(s.remote.delete(&paths.request(name))).map_err(remote_error)?;
            return Ok(sp);
        }
        if started.elapsed() >= timeout {
            let missing: Vec<String> = if partitions == 0 {
                vec!["all (no instance answered: is the application running with snapshots to this URL?)".into()]
            } else {
                (0..partitions).filter(|p| !have.contains(p)).map(|p| p.to_string()).collect()
            };
            return Err(AdminError::Admin(format!(
                "savepoint `{name}` not complete after {timeout:?}; partitions without their part: {}. The request stays: \
                 run the same command again to wait longer, or `kstate savepoint delete {name}` to drop it",
                missing.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every savepoint of `app`, complete or in progress, by name.
pub fn list_savepoints(at: &SnapshotStore, app: &str) -> Result<Vec<SavepointEntry>> {
    let s = service(at, app)?;
    let paths = SavepointPaths::of(&s.remote, app);
    let listed = s.block_on(s.remote.list(&paths.0)).map_err(remote_error)?;
    let root = format!("{}/", paths.0);
    let mut names: BTreeSet<String> = BTreeSet::new();
    for m in &listed {
        let Some(rest) = m.location.as_ref().strip_prefix(&root) else { continue };
        let mut parts = rest.split('/');
        match (parts.next(), parts.next()) {
            (Some("requests"), Some(file)) => {
                names.insert(file.trim_end_matches(".json").to_string());
            }
            (Some(name), Some(_)) => {
                names.insert(name.to_string());
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for name in names {
        let savepoint = read_complete(&s, &paths, &name)?;
        let parts = if savepoint.is_some() { Vec::new() } else { read_parts(&s, &paths, &name)?.iter().map(|t| t.partition).collect() };
        out.push(SavepointEntry { name, savepoint, parts });
    }
    Ok(out)
}

/// The complete savepoint `name` of `app`.
pub fn show_savepoint(at: &SnapshotStore, app: &str, name: &str) -> Result<Savepoint> {
    check_name(name)?;
    let s = service(at, app)?;
    let paths = SavepointPaths::of(&s.remote, app);
    read_complete(&s, &paths, name)?.ok_or_else(|| {
        AdminError::Admin(format!("no complete savepoint `{name}` of `{app}` (`kstate savepoint list` shows those there are)"))
    })
}

/// Deletes savepoint `name` (complete or in progress): its request, its
/// parts and its snapshots' manifests; the next collection deletes the
/// files no other snapshot names. Returns the manifests deleted.
pub fn delete_savepoint(at: &SnapshotStore, app: &str, name: &str) -> Result<usize> {
    check_name(name)?;
    let s = service(at, app)?;
    let paths = SavepointPaths::of(&s.remote, app);
    // The request first: the instances stop adding parts.
    s.block_on(s.remote.delete(&paths.request(name))).map_err(remote_error)?;
    let mut deleted = 0;
    for (store, partition) in s.block_on(super::remote::partitions(&s.remote, app))? {
        let dir = s.remote.partition_dir(app, &store, partition);
        for (path, m) in s.block_on(crate::snapshot::gc::manifests(&s.remote, &dir)).map_err(remote_error)? {
            if m.is_ok_and(|m| m.savepoint.as_deref() == Some(name)) {
                s.block_on(s.remote.delete(&path)).map_err(remote_error)?;
                deleted += 1;
            }
        }
    }
    for meta in s.block_on(s.remote.list(&paths.0.clone().join(name))).map_err(remote_error)? {
        s.block_on(s.remote.delete(&meta.location)).map_err(remote_error)?;
    }
    Ok(deleted)
}

/// Puts `app`'s state and input offsets back to savepoint `name`. The
/// application must be stopped (its group has no members). Safe to run
/// again after a failure: it rewrites the same differences.
pub fn restore_savepoint(at: &SnapshotStore, app: &str, name: &str, kafka: &Kafka) -> Result<RollbackReport> {
    let sp = show_savepoint(at, app, name)?;
    let s = service(at, app)?;
    let consumer = kafka.consumer()?;
    let group = consumer.fetch_group_list(Some(app), kafka.timeout).map_err(|e| AdminError::Admin(format!("describing group `{app}`: {e}")))?;
    if let Some(g) = group.groups().iter().find(|g| g.name() == app) {
        if !g.members().is_empty() {
            return Err(AdminError::Admin(format!(
                "group `{app}` has {} member(s) (state {}): stop every instance of the application before restoring a savepoint",
                g.members().len(),
                g.state()
            )));
        }
    }
    let mut report = RollbackReport { name: name.to_string(), application_id: app.to_string(), stores: Vec::new(), offsets: Vec::new() };
    let producer: BaseProducer<Deliveries> = kafka
        .client_config(&[("enable.idempotence", "true"), ("acks", "all"), ("linger.ms", "5")])
        .create_with_context(Deliveries::default())
        .map_err(|e| AdminError::Admin(format!("Kafka producer: {e}")))?;
    let uncommitted = kafka.client_config(&[("group.id", "kstate-admin"), ("isolation.level", "read_uncommitted")]);
    let uncommitted: rdkafka::consumer::BaseConsumer = uncommitted.create().map_err(|e| AdminError::Admin(format!("Kafka consumer: {e}")))?;
    // Records in flight through a repartition topic at the cut belong to no
    // task's cut: a restore would lose or count them twice.
    if let Some(topic) = sp.tasks.iter().flat_map(|t| t.input.keys()).find(|t| t.ends_with("-repartition")) {
        return Err(AdminError::Admin(format!(
            "savepoint `{name}` covers the repartition topic `{topic}`: restoring savepoints of applications with repartition topics is not supported (records re-keyed but not yet processed at the cut would be lost or counted twice)"
        )));
    }
    if let Some(n) = sp.tasks.iter().map(|t| t.partitions).find(|n| *n != sp.partitions) {
        return Err(AdminError::Admin(format!("savepoint `{name}` mixes partition counts {n} and {}", sp.partitions)));
    }
    // Offsets and state per partition only mean the same with as many partitions.
    for topic in sp.tasks.iter().flat_map(|t| t.input.keys()).collect::<BTreeSet<_>>() {
        let now = kafka.partitions(&consumer, topic)?;
        if now != Some(sp.partitions) {
            return Err(AdminError::Admin(format!(
                "input topic `{topic}` has {} partitions now, the savepoint was taken with {}: it cannot be restored",
                now.map_or_else(|| "no".to_string(), |n| n.to_string()),
                sp.partitions
            )));
        }
    }
    // Every snapshot found and supported before anything is written.
    let mut plan = Vec::new();
    for task in &sp.tasks {
        for store in &task.stores {
            let snapshot = savepoint_snapshot(&s, app, task.partition, store)?;
            // A table's changelog is a topic of the user's, which kstate never writes.
            if let Some(table) = snapshot.as_ref().map(|m| &m.changelog_topic).filter(|t| **t != crate::kafka::changelog_topic(app, &store.store)) {
                return Err(AdminError::Admin(format!(
                    "savepoint `{name}` holds store `{}`, the table of topic `{table}`: restoring savepoints of applications with tables is not supported (rolling a table back would mean writing its topic)",
                    store.store
                )));
            }
            plan.push((task.partition, store, snapshot));
        }
    }
    for (partition, store, manifest) in plan {
        report.stores.push(roll_back_store(&s, kafka, (&consumer, &uncommitted, &producer), app, partition, store, manifest)?);
    }
    // The changelogs agree with the savepoint: now the input offsets.
    let mut tpl = TopicPartitionList::new();
    for task in &sp.tasks {
        for (topic, offset) in &task.input {
            tpl.add_partition_offset(topic, task.partition, Offset::Offset(*offset)).map_err(crate::Error::from)?;
            report.offsets.push((topic.clone(), task.partition, *offset));
        }
    }
    let committer: rdkafka::consumer::BaseConsumer = kafka
        .client_config(&[("group.id", app), ("enable.auto.commit", "false")])
        .create()
        .map_err(|e| AdminError::Admin(format!("Kafka consumer: {e}")))?;
    committer.commit(&tpl, CommitMode::Sync).map_err(|e| {
        AdminError::Admin(format!(
            "the stores were rolled back but committing the input offsets of group `{app}` failed ({e}); run the restore again"
        ))
    })?;
    Ok(report)
}

/// The snapshot a savepoint names for a store partition (`None`: it was
/// empty), checked to be there and of a store kind restores support.
fn savepoint_snapshot(s: &Snapshots, app: &str, partition: i32, store: &SavepointStore) -> Result<Option<RemoteSnapshot>> {
    let manifest = match &store.snapshot_id {
        None => None,
        Some(id) => {
            let dir = s.remote.partition_dir(app, &store.store, partition);
            let found = s
                .block_on(crate::snapshot::gc::manifests(&s.remote, &dir))
                .map_err(remote_error)?
                .into_iter()
                .filter_map(|(_, m)| m.ok())
                .find(|m| &m.id == id);
            Some(found.ok_or_else(|| {
                AdminError::Admin(format!("the snapshot {id} of {}/{partition} that the savepoint names is gone from the snapshot store", store.store))
            })?)
        }
    };
    if let Some(m) = &manifest {
        if !m.definition.starts_with("key_value") {
            return Err(AdminError::Admin(format!(
                "store `{}` is a {} store: restoring savepoints of window and session stores is not supported yet; nothing was written",
                store.store, m.definition
            )));
        }
    }
    Ok(manifest)
}

/// Writes to one store partition's changelog what differs between its
/// state now and the savepoint's (`manifest`).
fn roll_back_store(
    s: &Snapshots,
    kafka: &Kafka,
    (consumer, uncommitted, producer): (&super::BaseConsumer, &rdkafka::consumer::BaseConsumer, &BaseProducer<Deliveries>),
    app: &str,
    partition: i32,
    store: &SavepointStore,
    manifest: Option<RemoteSnapshot>,
) -> Result<StoreRollback> {
    let topic = crate::kafka::changelog_topic(app, &store.store);
    // No transaction may be open on the changelog (an instance killed
    // mid-commit under exactly-once): its records would be decided after
    // the differences are computed.
    let started = Instant::now();
    let (low, high) = loop {
        let (low, high) = kafka.watermarks(consumer, &topic, partition)?;
        let (_, all) = uncommitted.fetch_watermarks(&topic, partition, kafka.timeout).map_err(|e| AdminError::Admin(e.to_string()))?;
        if all <= high {
            break (low, high);
        }
        if started.elapsed() > kafka.read_timeout {
            return Err(AdminError::Changelog {
                topic,
                detail: format!("partition {partition} has an open transaction (committed end {high}, end {all}); wait for the transaction timeout and run the restore again"),
            });
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let topic_id = crate::kafka::topic_id::describe(consumer.client().native_ptr(), &topic, kafka.timeout).ok();
    let changelog = ChangelogState { low, high, topic_id, tombstone_retention: kafka.tombstone_retention(&topic) };
    // Tail: keys written since the savepoint's checkpoint are the only ones
    // that can differ (the state is the changelog's prefix). Unless the
    // changelog no longer holds all of them: then every key.
    let unusable = manifest.as_ref().and_then(|m| m.unusable_for(&changelog, now_ms()));
    let (from, full) = match (&manifest, &unusable) {
        (Some(m), None) => (m.checkpoint + 1, false),
        (Some(_), Some(why)) => {
            tracing::warn!(store = %store.store, partition, reason = %why, "comparing every key of the changelog with the savepoint");
            (low, true)
        }
        (None, _) => (low, false),
    };
    let mut keys: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut records_read = 0u64;
    kafka.read(consumer, &topic, partition, from, high, |_, key, _| {
        records_read += 1;
        keys.insert(key.to_vec());
        true
    })?;
    let mut out = StoreRollback {
        store: store.store.clone(),
        partition,
        savepoint_checkpoint: store.checkpoint,
        changelog_end: high,
        mode: if full { "full".into() } else { "tail".into() },
        records_read,
        puts: 0,
        deletes: 0,
    };
    // The savepoint's values are of its snapshot's schema version.
    let header = manifest.as_ref().map(|m| m.schema_version).filter(|v| *v != 1).map(|v| v.to_string());
    let send = |key: &[u8], value: Option<&[u8]>| -> Result<()> {
        let mut record = BaseRecord::<[u8], [u8]>::to(&topic).partition(partition).key(key);
        if let Some(v) = value {
            record = record.payload(v);
        }
        if let Some(h) = &header {
            use rdkafka::message::{Header, OwnedHeaders};
            record = record.headers(OwnedHeaders::new().insert(Header { key: crate::store::schema::SCHEMA_HEADER, value: Some(h.as_bytes()) }));
        }
        let mut record = record;
        loop {
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(AdminError::Admin(format!("writing to {topic}[{partition}]: {e}"))),
            }
        }
    };
    if let Some(m) = &manifest {
        let tmp = std::env::temp_dir().join(format!("kstate-savepoint-{}-{}", m.id, std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let db_dir = tmp.join("db");
        std::fs::create_dir_all(&tmp).map_err(|e| crate::Error::io("savepoint scratch dir", e))?;
        let result = (|| -> Result<()> {
            s.block_on(s.download_into(m, &db_dir)).map_err(remote_error)?;
            let db = ReadOnlyDb::open_read_only(&db_dir)?;
            for entry in db.iter() {
                let (k, v) = entry?;
                if full || keys.contains(&k[..]) {
                    keys.remove(&k[..]);
                    send(&k, Some(&v))?;
                    out.puts += 1;
                }
            }
            Ok(())
        })();
        let _ = std::fs::remove_dir_all(&tmp);
        result?;
    }
    for k in &keys {
        send(k, None)?;
        out.deletes += 1;
    }
    producer.flush(kafka.read_timeout).map_err(|e| AdminError::Admin(format!("writing to {topic}[{partition}]: {e}")))?;
    if producer.in_flight_count() > 0 {
        return Err(AdminError::Admin(format!("writing to {topic}[{partition}]: records still unacknowledged")));
    }
    if let Some(e) = producer.context().failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(AdminError::Admin(format!("writing to {topic}[{partition}]: {e}; run the restore again")));
    }
    Ok(out)
}

/// Keeps the first delivery failure of the restore's producer.
#[derive(Default)]
struct Deliveries {
    failed: std::sync::Mutex<Option<String>>,
}

impl rdkafka::ClientContext for Deliveries {}

impl rdkafka::producer::ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| e.to_string());
        }
    }
}
