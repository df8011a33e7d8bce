//! Savepoints: a consistent cut of a whole application in the snapshot
//! store, taken online, to roll its state and input offsets back to
//! (architecture.md §10, "savepoints").
//!
//! `kstate savepoint create NAME` writes a request object; the
//! `kstate-snapshots` thread of every instance polls for requests and cuts
//! each task it runs as the active copy: under the [`LandingGate`], so no
//! commit is half in RocksDB, it checkpoints every store of the task and
//! reads the input offsets those stores reflect. It then uploads the
//! checkpoints as snapshots marked with the savepoint's name (retention
//! keeps them) and writes the task's part. The command completes the
//! savepoint once every partition has its part.
//!
//! [`LandingGate`]: crate::store::published::LandingGate

use std::collections::{BTreeMap, HashSet};
use std::path::Path as FsPath;
use std::time::{Duration, Instant};

use object_store::path::Path;
use object_store::ObjectStoreExt;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::remote::Remote;
use super::{Snapshots, StoreInfo};
use crate::store::published::{Published, Role};

/// The folder of an application's savepoints, beside its stores' folders
/// (`@` cannot start a store name, so no store's folder is called that).
pub(crate) const SAVEPOINTS_DIR: &str = "@savepoints";

/// The savepoint format this code writes and reads.
pub const SAVEPOINT_FORMAT_VERSION: u32 = 1;

/// How long a cut waits for a commit that is landing.
const CUT_PATIENCE: Duration = Duration::from_secs(30);

/// How often the instances look for savepoint requests.
pub(crate) const POLL_EVERY: Duration = Duration::from_secs(2);

/// A request to take a savepoint (`@savepoints/requests/<name>.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SavepointRequest {
    pub(crate) name: String,
    pub(crate) requested_at_ms: i64,
}

/// One store partition in a savepoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointStore {
    /// The store.
    pub store: String,
    /// The snapshot holding its state (`None`: nothing was committed to
    /// the store partition yet, it was empty).
    pub snapshot_id: Option<String>,
    /// The changelog offset the state reflects (`None`: empty).
    pub checkpoint: Option<i64>,
}

/// One task (input partition) in a savepoint: its stores and input
/// offsets at the same commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointTask {
    /// The input partition.
    pub partition: i32,
    /// The application's input partition count when the cut was taken.
    pub partitions: i32,
    /// Per input topic, the next offset to process: every record before it
    /// is reflected in the stores, none after.
    pub input: BTreeMap<String, i64>,
    /// Where each input offset came from: `processed` (the last commit the
    /// stores reflect) or `committed` (nothing processed since the task
    /// opened: the group's committed offset, or the log start).
    pub input_source: BTreeMap<String, String>,
    /// Every store partition of the task.
    pub stores: Vec<SavepointStore>,
    /// When the cut was taken (ms since the epoch).
    pub taken_at_ms: i64,
}

/// A complete savepoint (`@savepoints/<name>/savepoint.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Savepoint {
    /// `SAVEPOINT_FORMAT_VERSION` of the writer.
    pub format_version: u32,
    /// Its name.
    pub name: String,
    /// The application.
    pub application_id: String,
    /// When it was requested (ms since the epoch).
    pub requested_at_ms: i64,
    /// When it completed.
    pub completed_at_ms: i64,
    /// The input partition count.
    pub partitions: i32,
    /// One per input partition, by partition.
    pub tasks: Vec<SavepointTask>,
    /// The kstate version that completed it.
    pub kstate_version: String,
}

/// Paths of an application's savepoints.
pub(crate) struct SavepointPaths(pub(crate) Path);

impl SavepointPaths {
    pub(crate) fn of(remote: &Remote, app: &str) -> SavepointPaths {
        SavepointPaths(remote.app_dir(app).join(SAVEPOINTS_DIR))
    }
    pub(crate) fn requests(&self) -> Path {
        self.0.clone().join("requests")
    }
    pub(crate) fn request(&self, name: &str) -> Path {
        self.requests().join(format!("{name}.json"))
    }
    pub(crate) fn tasks(&self, name: &str) -> Path {
        self.0.clone().join(name).join("tasks")
    }
    pub(crate) fn task(&self, name: &str, partition: i32) -> Path {
        self.tasks(name).join(format!("{partition}.json"))
    }
    pub(crate) fn complete(&self, name: &str) -> Path {
        self.0.clone().join(name).join("savepoint.json")
    }
}

/// Whether `name` can name a savepoint (it becomes an object name).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && name != "requests"
        && !name.starts_with('.')
}

/// What the instance needs to cut tasks: the input topics and a Kafka
/// client for the committed offsets of tasks that processed nothing yet.
pub(crate) struct CutContext {
    pub(crate) input_topics: Vec<String>,
    /// The application's client settings with its `group.id`.
    pub(crate) client: ClientConfig,
    consumer: Option<BaseConsumer>,
    /// Parts written (or found written) by this process, by request
    /// (`name@written_ms`: a savepoint deleted and asked for again under
    /// the same name is a new request).
    done: HashSet<(String, i32)>,
    last_poll: Option<Instant>,
}

impl CutContext {
    pub(crate) fn new(input_topics: Vec<String>, client: ClientConfig) -> CutContext {
        CutContext { input_topics, client, consumer: None, done: HashSet::new(), last_poll: None }
    }

    /// The group's committed offset of each input topic of `partition`,
    /// else the topic's log start (nothing committed: the state reflects
    /// none of the partition's records).
    fn committed(&mut self, partition: i32) -> std::result::Result<BTreeMap<String, i64>, String> {
        if self.consumer.is_none() {
            let mut c = self.client.clone();
            c.set("enable.auto.commit", "false").set("isolation.level", "read_committed");
            self.consumer = Some(c.create().map_err(|e| format!("Kafka client for savepoints: {e}"))?);
        }
        let consumer = self.consumer.as_ref().expect("created above");
        let mut tpl = TopicPartitionList::new();
        for t in &self.input_topics {
            tpl.add_partition(t, partition);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .map_err(|e| format!("reading the committed offsets of partition {partition}: {e}"))?;
        let mut out = BTreeMap::new();
        for e in committed.elements() {
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => consumer
                    .fetch_watermarks(e.topic(), partition, Duration::from_secs(10))
                    .map_err(|err| format!("reading the start of {}[{partition}]: {err}", e.topic()))?
                    .0,
            };
            out.insert(e.topic().to_string(), o);
        }
        Ok(out)
    }
}

impl Snapshots {
    /// Looks for savepoint requests (every [`POLL_EVERY`]) and cuts each
    /// task this instance runs that has no part in them yet.
    pub(crate) fn savepoint_round(&self, stores: &[StoreInfo], published: &Published, scratch_root: &FsPath, cx: &mut CutContext) {
        if cx.last_poll.is_some_and(|at| at.elapsed() < POLL_EVERY) || stores.is_empty() {
            return;
        }
        cx.last_poll = Some(Instant::now());
        let paths = SavepointPaths::of(&self.remote, &self.app);
        let requests = match self.block_on_unless_stopped(self.remote.list(&paths.requests())) {
            None => return,
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                tracing::debug!(error = %e, "cannot list savepoint requests");
                return;
            }
        };
        for meta in requests {
            let Some(name) = meta.location.filename().and_then(|f| f.strip_suffix(".json")).map(str::to_string) else { continue };
            if !valid_name(&name) {
                continue;
            }
            let request = format!("{name}@{}", meta.last_modified.timestamp_millis());
            // The tasks active here, by the first store's slots.
            let partitions: Vec<i32> = published
                .slots_of(&stores[0].name)
                .into_iter()
                .filter(|(p, slot)| slot.role() == Role::Active && !cx.done.contains(&(request.clone(), *p)))
                .map(|(p, _)| p)
                .collect();
            for partition in partitions {
                let part = paths.task(&name, partition);
                match self.block_on_unless_stopped(self.remote.store.head(&part)) {
                    None => return,
                    Some(Ok(_)) => {
                        cx.done.insert((request.clone(), partition));
                        continue;
                    }
                    Some(Err(object_store::Error::NotFound { .. })) => {}
                    Some(Err(e)) => {
                        tracing::warn!(savepoint = %name, partition, error = %e, "cannot check the savepoint's part; retrying");
                        continue;
                    }
                }
                match self.cut_task(&name, partition, stores, published, scratch_root, cx) {
                    Ok(task) => {
                        tracing::info!(savepoint = %name, partition, input = ?task.input, stores = task.stores.len(), "savepoint part written");
                        cx.done.insert((request.clone(), partition));
                    }
                    Err(why) => tracing::warn!(savepoint = %name, partition, reason = %why, "savepoint part not taken yet; retrying"),
                }
            }
        }
    }

    /// Cuts one task: checkpoints of all its stores and the input offsets
    /// they reflect, at one commit; uploads them and writes its part.
    fn cut_task(
        &self,
        name: &str,
        partition: i32,
        stores: &[StoreInfo],
        published: &Published,
        scratch_root: &FsPath,
        cx: &mut CutContext,
    ) -> std::result::Result<SavepointTask, String> {
        // Before the cut: any offset this instance commits for the task
        // later is published first, so a task whose input is unknown at
        // the cut had no commit since it opened, and this is its offset.
        let committed = cx.committed(partition)?;
        let slots = stores
            .iter()
            .map(|s| published.find(&s.name, partition).ok_or_else(|| format!("store `{}` is not open here", s.name)))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        let scratches: Vec<_> = stores.iter().map(|s| self.scratch(scratch_root, &s.name, partition)).collect();
        let taken_at_ms = crate::store::engine::now_ms();
        let stop = || self.wake.0.lock().unwrap_or_else(|p| p.into_inner()).stop;
        let cut = published.landing.cut(CUT_PATIENCE, &stop, || -> std::result::Result<_, String> {
            let mut taken = Vec::new();
            for (slot, scratch) in slots.iter().zip(&scratches) {
                if slot.role() != Role::Active {
                    return Err("the task is not active here (moved, or restoring)".into());
                }
                if slot.input_is_behind() {
                    return Err("the task's last commit landed without its offsets; waiting for it to reopen".into());
                }
                taken.push(Self::checkpoint(slot, scratch, None)?);
            }
            let input: Vec<Option<i64>> = cx.input_topics.iter().map(|t| slots[0].input_reflected(t)).collect();
            Ok((taken, input))
        })??;
        let (taken, reflected) = cut;
        // A task re-opened between the read of the committed offsets and
        // the cut could have committed meanwhile: read them again.
        if reflected.iter().any(Option::is_none) && cx.committed(partition)? != committed {
            return Err("the group's committed offsets moved during the cut".into());
        }
        let mut input = BTreeMap::new();
        let mut input_source = BTreeMap::new();
        for (topic, reflected) in cx.input_topics.iter().zip(reflected) {
            let (offset, source) = match (reflected, committed.get(topic)) {
                (Some(o), _) => (o, "processed"),
                (None, Some(o)) => (*o, "committed"),
                (None, None) => return Err(format!("no offset known for {topic}[{partition}]")),
            };
            input.insert(topic.clone(), offset);
            input_source.insert(topic.clone(), source.to_string());
        }
        let mut parts = Vec::new();
        let mut manifests = Vec::new();
        for ((store, scratch), taken) in stores.iter().zip(&scratches).zip(taken) {
            let Some(taken) = taken else { return Err(format!("store `{}` closed during the cut", store.name)) };
            let uploaded = self.upload_checkpoint(store, partition, scratch, taken, Some(name))?;
            parts.push(SavepointStore {
                store: store.name.clone(),
                snapshot_id: uploaded.as_ref().map(|t| t.manifest.id.clone()),
                checkpoint: uploaded.as_ref().map(|t| t.manifest.checkpoint),
            });
            manifests.extend(uploaded.map(|t| self.dir_of(&store.name, partition).join("manifests").join(t.manifest.object_name())));
        }
        // Deleted meanwhile (`kstate savepoint delete`): its snapshots would
        // be kept forever (retention never deletes a savepoint's).
        let paths = SavepointPaths::of(&self.remote, &self.app);
        if let Some(Err(object_store::Error::NotFound { .. })) = self.block_on_unless_stopped(self.remote.store.head(&paths.request(name))) {
            for m in &manifests {
                let _ = self.block_on_unless_stopped(self.remote.delete(m));
            }
            return Err("the savepoint was deleted during the cut".into());
        }
        let task = SavepointTask { partition, partitions: published.partitions(), input, input_source, stores: parts, taken_at_ms };
        let json = serde_json::to_vec_pretty(&task).map_err(|e| e.to_string())?;
        let path = paths.task(name, partition);
        match self.block_on_unless_stopped(self.remote.put_bytes(&path, json)) {
            None => Err("stopped while writing the savepoint's part".into()),
            Some(r) => r.map(|()| task).map_err(|e| e.to_string()),
        }
    }
}
