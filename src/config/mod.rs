//! Application and store configuration, validated before anything connects.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::assignment::AssignmentStrategy;
use crate::error::{Error, Result};
use crate::restore::RestoreListener;
use crate::time::{InvalidTimestamp, TimestampExtractor};
use crate::windows::Shape;
use crate::timers::TIME_STORE;

mod store_definition;
pub use store_definition::StoreDefinition;



/// The host of a `host:port` address (an IPv6 host keeps its brackets), or
/// `None` when there is no host or no valid port.
pub(crate) fn host_of(host_port: &str) -> Option<&str> {
    host_port.rsplit_once(':').filter(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()).map(|(host, _)| host)
}

/// A validated application configuration (built by [`AppBuilder`](crate::AppBuilder)).
#[derive(Clone)]
pub(crate) struct AppConfig {
    pub(crate) application_id: String,
    pub(crate) bootstrap_servers: String,
    pub(crate) input_topics: Vec<String>,
    pub(crate) state_dir: PathBuf,
    pub(crate) stores: Vec<StoreDefinition>,
    pub(crate) commit_interval: Duration,
    /// With several input topics: how long a task waits for an input
    /// partition with no buffered record before it processes the others.
    pub(crate) max_task_idle: Duration,
    /// Threads that process records (the poll thread is one of them).
    pub(crate) num_stream_threads: usize,
    /// Global tables: (name, source topic).
    pub(crate) global_tables: Vec<(String, String)>,
    /// Repartition topics (`AppBuilder::repartition`): once built, each
    /// topic is also the last of `input_topics`.
    pub(crate) repartitions: Vec<Repartition>,
    /// Whether some store is a source table (set by `AppBuilder::finish`).
    pub(crate) has_tables: bool,
    /// How often records of the repartition topics below the committed
    /// offsets are deleted.
    pub(crate) repartition_purge_interval: Duration,
    pub(crate) max_uncommitted_bytes: usize,
    pub(crate) startup_timeout: Duration,
    pub(crate) commit_timeout: Duration,
    pub(crate) lock_timeout: Duration,
    pub(crate) task_timeout: Duration,
    pub(crate) changelog_replication_factor: Option<i32>,
    pub(crate) block_cache_bytes: usize,
    pub(crate) write_buffer_bytes: usize,
    /// `AppBuilder::read_cache_bytes`.
    pub(crate) read_cache_bytes: usize,
    /// One bound for RocksDB's memory (cache + memtables), if set.
    pub(crate) max_state_memory: Option<usize>,
    /// `AppBuilder::in_memory_save_interval`.
    pub(crate) in_memory_save_interval: Duration,
    /// RocksDB statistics per store partition (`AppBuilder::rocksdb_statistics`).
    pub(crate) rocksdb_statistics: bool,
    pub(crate) kafka_overrides: Vec<(String, String)>,
    pub(crate) assignment: AssignmentStrategy,
    pub(crate) restore_listener: Option<Arc<dyn RestoreListener>>,
    pub(crate) processing_exception_handler: Option<Arc<ProcessingExceptionHandler>>,
    pub(crate) num_standby_replicas: usize,
    /// Records of lag up to which a copy counts as caught up.
    pub(crate) acceptable_recovery_lag: u64,
    /// Warmup replicas at a time across the application.
    pub(crate) max_warmup_replicas: usize,
    /// Longest time between probing rebalances while warmups exist.
    pub(crate) probing_rebalance_interval: Duration,
    pub(crate) state_cleanup_delay: Duration,
    pub(crate) application_server: Option<String>,
    /// Where this instance listens for the other instances (failure
    /// detection), if set.
    pub(crate) peer_address: Option<String>,
    /// How long a silent peer holding this instance's lease is given.
    pub(crate) peer_timeout: Duration,
    /// The peer links' shared secret (`peer_secret`), or why it could not
    /// be read (`peer_secret_file`: reported at `build`).
    pub(crate) peer_secret: crate::group::peers::SecretSetting,
    /// The secret `peer_secret` replaces, accepted during a rotation.
    pub(crate) peer_previous_secret: crate::group::peers::SecretSetting,
    /// Peer links without authentication, chosen explicitly.
    pub(crate) peer_plaintext: bool,
    pub(crate) client_tags: std::collections::BTreeMap<String, String>,
    pub(crate) processing_guarantee: ProcessingGuarantee,
    /// `transaction.timeout.ms` of the transactional producer (exactly-once).
    pub(crate) transaction_timeout: Duration,
    /// Whether tasks keep stream time and timers in the time store (the
    /// last of `stores` once built).
    pub(crate) timers: bool,
    /// Reads each record's timestamp (`None`: the record's own).
    pub(crate) timestamp_extractor: Option<TimestampExtractor>,
    pub(crate) invalid_timestamp: InvalidTimestamp,
    /// The store partitions open here and the group's host metadata, as
    /// interactive queries read them (shared with [`crate::Queries`]).
    pub(crate) published: Arc<crate::store::published::Published>,
    /// The input topics' partitioner: queries find a key's partition with
    /// it, and keyed input records are checked against it.
    pub(crate) partitioner: crate::partitioner::Partitioner,
    /// Snapshots in object storage (`None`: none).
    pub(crate) snapshots: Option<crate::snapshot::SnapshotConfig>,
    /// Asks the running application for a snapshot round.
    pub(crate) snapshot_handle: crate::snapshot::SnapshotHandle,
    /// Where remote stores live (`None`: no remote stores).
    pub(crate) remote_state: Option<crate::RemoteStateConfig>,
}


/// A repartition topic: the name the processor sends to
/// (`ProcessorContext::repartition`) and its topic,
/// `<application_id>-<name>-repartition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Repartition {
    pub(crate) name: String,
    pub(crate) topic: String,
}

/// The repartition topic of `name` in application `application_id`
/// ([`AppBuilder::repartition`](crate::AppBuilder::repartition)).
///
/// ```
/// assert_eq!(kstate::repartition_topic("word-counts", "words"), "word-counts-words-repartition");
/// ```
pub fn repartition_topic(application_id: &str, name: &str) -> String {
    format!("{application_id}-{name}-repartition")
}

/// What a crash can do to the effects of processing (Kafka Streams'
/// `processing.guarantee`). See the README's "Guarantees and the data-loss
/// boundary".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProcessingGuarantee {
    /// Each commit sends its changelog and output records, waits for their
    /// acknowledgements, lands the stores, then commits the input offsets.
    /// After a crash the records past the last committed offsets are
    /// processed again, on top of stores restored from the changelog,
    /// which may already hold their writes: an idempotent update (a `put`
    /// of a value derived from the input) ends the same, a counter may
    /// count an input twice, and output records may be duplicated. Nothing
    /// acknowledged is lost.
    #[default]
    AtLeastOnce,
    /// Each commit is one Kafka transaction holding its changelog records,
    /// its output records and its input offsets; the stores land only once
    /// it committed. A crash or a zombie instance leaves nothing of an
    /// unfinished commit visible to `read_committed` readers: every input
    /// record's effect on the stores and on the outputs is there exactly
    /// once. Consumers of the outputs must read with
    /// `isolation.level=read_committed`.
    ExactlyOnce,
}

/// The group membership's timing and identity, read from `kafka_config`
/// under the consumer settings' (and Kafka Streams') names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupTimeouts {
    /// `session.timeout.ms` (default 45 s).
    pub(crate) session: Duration,
    /// `heartbeat.interval.ms` (default 3 s).
    pub(crate) heartbeat: Duration,
    /// `max.poll.interval.ms` (default 5 min): how long the group waits
    /// for a member to rejoin, and for this member to apply an assignment.
    pub(crate) rebalance: Duration,
    /// `group.instance.id`: static membership.
    pub(crate) instance_id: Option<String>,
}

/// Consumer settings the membership uses and librdkafka must not see
/// (its consumers only ever `assign`).
pub(crate) const MEMBERSHIP_KEYS: [&str; 5] =
    ["session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "group.instance.id", "partition.assignment.strategy"];

/// Decides what happens to a record the processor failed on (see
/// [`AppBuilder::processing_exception_handler`](crate::AppBuilder::processing_exception_handler)).
pub(crate) type ProcessingExceptionHandler =
    dyn Fn(&crate::Record<'_>, &(dyn std::error::Error + Send + Sync + 'static)) -> ProcessingDecision + Send + Sync;

/// What a processing-exception handler decides for a record the processor
/// failed on (Kafka Streams' `ProcessingExceptionHandler` responses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessingDecision {
    /// Skip the record: it counts as processed (its offset is committed),
    /// is logged and counted in `kstate_skipped_records_total`. Writes the
    /// processor made before it failed stay.
    Continue,
    /// Stop: `run` returns [`Error::Processor`] and the uncommitted writes
    /// of every task are discarded.
    Fail,
}

fn check_name(kind: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{kind} `{name}` must be 1-200 characters of ASCII letters, digits, `.`, `_` or `-`"
        )))
    }
}

impl AppConfig {
    /// A closure processor cannot take final results: the first store that
    /// emits them is an [`Error::Config`] (from `App::run` and the test
    /// driver's `closure`).
    pub(crate) fn check_closure(&self) -> Result<()> {
        match self.stores.iter().find(|s| s.final_results) {
            Some(s) => Err(Error::Config(format!(
                "store `{}` emits final results, which a closure processor cannot take: \
                 use App::run_processor with a Processor that implements on_window_close",
                s.name()
            ))),
            None => Ok(()),
        }
    }

    /// Whether `topic` is one of the application's repartition topics.
    pub(crate) fn is_repartition_topic(&self, topic: &str) -> bool {
        self.repartitions.iter().any(|r| r.topic == topic)
    }

    /// Where the time store is among a task's stores, if timers are on.
    pub(crate) fn time_store_index(&self) -> Option<usize> {
        self.timers.then(|| self.stores.len() - 1)
    }

    /// The stores the processor can name (every store but the time store).
    pub(crate) fn user_stores(&self) -> &[StoreDefinition] {
        &self.stores[..self.stores.len() - usize::from(self.timers)]
    }

    /// The source tables (`AppBuilder::table`): key-value stores the
    /// processor only reads, each on a topic of its own that nothing else
    /// of the application reads or writes.
    /// Whether the application's stores are remote.
    pub(crate) fn remote_stores(&self) -> bool {
        self.stores.iter().any(StoreDefinition::is_remote)
    }

    /// The test driver's configuration: remote stores run as its local ones.
    pub(crate) fn run_remote_stores_locally(&mut self) {
        self.stores.iter_mut().for_each(StoreDefinition::local_for_driver);
        self.remote_state = None;
    }

    /// Remote stores need the remote state, and are all or none of the
    /// stores: an instance without a local copy of a task must be as good
    /// a place for it as any (the assignor places no warmups; standbys
    /// open readers that warm their caches, never writers), and
    /// snapshots of a database that is already in object storage are
    /// not built.
    fn validate_remote(&self) -> Result<()> {
        let remote: Vec<&str> = self.stores.iter().filter(|s| s.is_remote()).map(StoreDefinition::name).collect();
        let Some(config) = &self.remote_state else {
            return match remote.first() {
                Some(name) => Err(Error::Config(format!("store `{name}` is remote, but no AppBuilder::remote_state says where remote stores live"))),
                None => Ok(()),
            };
        };
        config.validate().map_err(Error::Config)?;
        if remote.is_empty() {
            // Nothing is started for it (a deploy that moves stores back to
            // local state may keep the setting).
            return Ok(());
        }
        if let Some(local) = self.stores.iter().find(|s| !s.is_remote() && s.name() != TIME_STORE) {
            return Err(Error::Config(format!(
                "store `{}` is not remote while `{}` is: an application's stores are all remote or none (README \"Remote stores\")",
                local.name(),
                remote[0]
            )));
        }
        if self.snapshots.is_some() {
            return Err(Error::Config("snapshots are for local stores: a remote store's database is already in object storage (README \"Remote stores\")".into()));
        }
        if let Some(bound) = self.max_state_memory {
            if config.cache_bytes > bound / 2 {
                return Err(Error::Config(format!(
                    "remote_state cache_bytes ({}) must be at most half of max_state_memory ({bound}), which counts it",
                    config.cache_bytes
                )));
            }
        }
        Ok(())
    }

    fn validate_tables(&self) -> Result<()> {
        let mut topics = std::collections::HashSet::new();
        if let Some(s) = self.stores.iter().find(|s| s.table_values.is_some() && s.source_topic.is_none()) {
            return Err(Error::Config(format!("store `{}`: table_values is for a table (AppBuilder::table)", s.name())));
        }
        for s in self.stores.iter() {
            let Some(topic) = &s.source_topic else { continue };
            let name = s.name();
            check_name("table topic", topic)?;
            let problem = if s.shape.is_some() {
                Some("a table is a key-value store, not a window or session store".to_string())
            } else if s.ttl.is_some() {
                Some("a table holds what its topic holds: it has no TTL".into())
            } else if s.schema.version != 1 || s.schema.upgrade.is_some() {
                Some("a table holds its topic's values as they are: it has no schema version".into())
            } else if !s.changelog_configs.is_empty() {
                Some("kstate never configures a table's topic (no changelog_config)".into())
            } else if !topics.insert(topic.as_str()) {
                Some(format!("topic `{topic}` is read by another table too; one store per table topic"))
            } else if self.input_topics.contains(topic) {
                Some(format!("`{topic}` is an input topic; a table's topic is read only as the table"))
            } else if self.global_tables.iter().any(|(_, t)| t == topic) {
                Some(format!("`{topic}` is a global table's topic too"))
            } else if self.repartitions.iter().any(|r| repartition_topic(&self.application_id, &r.name) == *topic) {
                Some(format!("`{topic}` is a repartition topic, which kstate creates and purges"))
            } else if topic.ends_with("-changelog") && topic.starts_with(&format!("{}-", self.application_id)) {
                Some(format!("`{topic}` looks like one of this application's changelogs"))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(Error::Config(format!("table `{name}`: {problem}")));
            }
        }
        if !topics.is_empty() {
            let reset = self.kafka_overrides.iter().rev().find(|(k, _)| k == "auto.offset.reset").map(|(_, v)| v.trim());
            if reset.is_some_and(|r| r != "earliest" && r != "smallest" && r != "beginning") {
                return Err(Error::Config(
                    "auto.offset.reset must be `earliest` with a table (AppBuilder::table): a partition with no committed \
                     offset would otherwise start without the table's history"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// The position among a task's stores of the table reading `topic`.
    pub(crate) fn table_store_of(&self, topic: &str) -> Option<usize> {
        if !self.has_tables {
            return None;
        }
        self.stores.iter().position(|s| s.source_topic.as_deref() == Some(topic))
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(snapshots) = &self.snapshots {
            snapshots.validate().map_err(Error::Config)?;
        }
        check_name("application_id", &self.application_id)?;
        if self.bootstrap_servers.trim().is_empty() {
            return Err(Error::Config("bootstrap_servers is empty".into()));
        }
        if self.input_topics.is_empty() && !self.stores.iter().any(|s| s.source_topic.is_some()) {
            return Err(Error::Config("at least one input topic (or a table, AppBuilder::table) is required".into()));
        }
        for t in &self.input_topics {
            check_name("input topic", t)?;
        }
        if self.state_dir.as_os_str().is_empty() {
            return Err(Error::Config("state_dir is empty".into()));
        }
        if self.num_stream_threads == 0 {
            return Err(Error::Config("num_stream_threads is 0; at least one thread processes records".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for (name, topic) in &self.global_tables {
            check_name("global table name", name)?;
            check_name("global table topic", topic)?;
            if name == TIME_STORE || !seen.insert(name.as_str()) || self.stores.iter().any(|s| s.name() == name) {
                return Err(Error::Config(format!("global table `{name}`: the name is taken (by another global table, a store or kstate's time store)")));
            }
            if self.input_topics.contains(topic) {
                return Err(Error::Config(format!("global table `{name}`: `{topic}` is an input topic; a global table reads a topic of its own")));
            }
        }
        let mut names = std::collections::HashSet::new();
        for r in &self.repartitions {
            check_name("repartition name", &r.name)?;
            if !names.insert(r.name.as_str()) {
                return Err(Error::Config(format!("repartition `{}` is declared twice", r.name)));
            }
            let topic = repartition_topic(&self.application_id, &r.name);
            if topic.len() > 249 {
                return Err(Error::Config(format!("repartition topic name `{topic}` is longer than Kafka's 249")));
            }
            let input = self.input_topics.iter().any(|t| *t == topic && !self.repartitions.iter().any(|o| o.topic == *t));
            let global = self.global_tables.iter().any(|(_, t)| *t == topic);
            if input || global {
                return Err(Error::Config(format!(
                    "repartition `{}`: its topic `{topic}` is also {}; kstate creates and purges it",
                    r.name,
                    if input { "an input topic" } else { "a global table's topic" }
                )));
            }
        }
        for s in &self.stores {
            check_name("store name", s.name())?;
            if s.name() == TIME_STORE {
                return Err(Error::Config(format!("store name `{TIME_STORE}` is kstate's own (the time store of AppBuilder::timers)")));
            }
            if !seen.insert(s.name()) {
                return Err(Error::Config(format!("store `{}` is defined twice", s.name())));
            }
            let topic = crate::kafka::changelog_topic(&self.application_id, s.name());
            if s.source_topic.is_none() && topic.len() > 249 {
                return Err(Error::Config(format!("changelog topic name `{topic}` is longer than Kafka's 249")));
            }
            if s.schema.version == 0 {
                return Err(Error::Config(format!("store `{}`: schema versions start at 1", s.name())));
            }
            if let Some((ttl, _)) = s.ttl {
                if ttl < Duration::from_millis(1) {
                    return Err(Error::Config(format!("store `{}`: a TTL must be at least 1 ms, not {ttl:?}", s.name())));
                }
                if s.ttl_cleanup_interval < Duration::from_secs(1) {
                    return Err(Error::Config(format!(
                        "store `{}`: ttl_cleanup_interval must be at least 1 s, not {:?}",
                        s.name(),
                        s.ttl_cleanup_interval
                    )));
                }
            }
            if s.changelog_configs().iter().any(|(k, _)| k == "cleanup.policy") {
                return Err(Error::Config(format!(
                    "store `{}`: cleanup.policy of a changelog is always `compact` (`compact,delete` for a window or session store) and cannot be set",
                    s.name()
                )));
            }
            if let Some(shape) = s.shape {
                let check = match shape {
                    Shape::Window(w) => w.check(),
                    Shape::Session(x) => x.check(),
                };
                check.map_err(|why| Error::Config(format!("store `{}`: {why}", s.name())))?;
                if s.ttl.is_some() {
                    return Err(Error::Config(format!(
                        "store `{}`: a {} store has a retention, not a TTL",
                        s.name(),
                        shape.kind()
                    )));
                }
                let retention = s.retention_period().expect("a shape");
                if (retention.as_millis() as i64) < shape.min_retention_ms() {
                    return Err(Error::Config(format!(
                        "store `{}`: retention {retention:?} is shorter than {} ({} ms): windows would expire before they close",
                        s.name(),
                        match shape {
                            Shape::Window(_) => "the window size plus grace",
                            Shape::Session(_) => "the session gap plus grace",
                        },
                        shape.min_retention_ms()
                    )));
                }
                if let Some((k, _)) = s.changelog_configs().iter().find(|(k, _)| k == "retention.ms" || k == "retention.bytes") {
                    return Err(Error::Config(format!(
                        "store `{}`: {k} of a {} store's changelog cannot be set: it follows the store's retention \
                         (StoreDefinition::retention, changelog_additional_retention), and a size limit would delete live windows",
                        s.name(),
                        shape.kind()
                    )));
                }
            } else if s.final_results {
                return Err(Error::Config(format!(
                    "store `{}`: only window and session stores emit final results (StoreDefinition::emit_final_results)",
                    s.name()
                )));
            } else if s.retention.is_some() {
                return Err(Error::Config(format!(
                    "store `{}`: only window and session stores have a retention (use a TTL for a key-value store)",
                    s.name()
                )));
            }
        }
        self.validate_tables()?;
        if self.commit_interval.is_zero() {
            return Err(Error::Config("commit_interval must be greater than zero".into()));
        }
        if self.task_timeout.is_zero() {
            return Err(Error::Config("task_timeout must be greater than zero".into()));
        }
        if self.max_state_memory.is_some_and(|m| m < 16 << 20) {
            return Err(Error::Config(format!(
                "max_state_memory must be at least 16 MiB (got {} bytes)",
                self.max_state_memory.unwrap_or_default()
            )));
        }
        if self.max_warmup_replicas == 0 {
            return Err(Error::Config(
                "max_warmup_replicas must be at least 1 (warmups are how a task reaches a new instance without a long restore)".into(),
            ));
        }
        if self.probing_rebalance_interval < Duration::from_secs(1) {
            return Err(Error::Config(format!(
                "probing_rebalance_interval must be at least 1 s (got {:?})",
                self.probing_rebalance_interval
            )));
        }
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce {
            if self.transaction_timeout < Duration::from_secs(1) || self.transaction_timeout > Duration::from_secs(900) {
                return Err(Error::Config(format!(
                    "transaction_timeout must be between 1 s and 15 min (the brokers' default \
                     transaction.max.timeout.ms), got {:?}",
                    self.transaction_timeout
                )));
            }
            if self.transaction_timeout <= self.commit_interval {
                return Err(Error::Config(format!(
                    "transaction_timeout ({:?}) must be longer than commit_interval ({:?}): every commit is one transaction",
                    self.transaction_timeout, self.commit_interval
                )));
            }
        }
        if self.max_uncommitted_bytes == 0 {
            return Err(Error::Config("max_uncommitted_bytes must be greater than zero".into()));
        }
        for (k, _) in &self.kafka_overrides {
            if matches!(
                k.as_str(),
                "group.id" | "enable.auto.commit" | "enable.idempotence" | "bootstrap.servers" | "transactional.id" | "transaction.timeout.ms"
            ) {
                return Err(Error::Config(format!("kafka config `{k}` is managed by kstate and cannot be overridden")));
            }
        }
        // kstate's own connections must be able to honour the security settings.
        crate::group::Security::from_kafka_config(&self.kafka_overrides)?;
        let timeouts = self.group_timeouts()?;
        if let Some(address) = &self.peer_address {
            match host_of(address).map(|host| host.trim_matches(['[', ']'])) {
                None | Some("") => return Err(Error::Config(format!("peer_address must be host:port, not `{address}`"))),
                Some("0.0.0.0" | "::") => {
                    return Err(Error::Config(format!(
                        "peer_address `{address}` is published to the other instances, which cannot connect to an unspecified \
                         address: give this host's name or IP address"
                    )))
                }
                Some(_) => {}
            }
            crate::group::peers::Secrets::from_config(&self.peer_secret, &self.peer_previous_secret, self.peer_plaintext)
                .map_err(Error::Config)?;
            let session = timeouts.session;
            if self.peer_timeout < Duration::from_millis(100) || self.peer_timeout >= session {
                return Err(Error::Config(format!(
                    "peer_timeout must be at least 100 ms and below `session.timeout.ms` ({session:?}), got {:?}",
                    self.peer_timeout
                )));
            }
        }
        if let Some(server) = &self.application_server {
            if host_of(server).is_none() {
                return Err(Error::Config(format!("application_server must be host:port, not `{server}`")));
            }
        }
        self.validate_remote()
    }

    /// The membership's settings from `kafka_config` (checked by `validate`).
    pub(crate) fn group_timeouts(&self) -> Result<GroupTimeouts> {
        let get = |key: &str| self.kafka_overrides.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.trim());
        let millis = |key: &str, default: u64| -> Result<Duration> {
            match get(key) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => match v.parse::<u64>() {
                    Ok(ms) if ms > 0 && ms <= i32::MAX as u64 => Ok(Duration::from_millis(ms)),
                    _ => Err(Error::Config(format!("`{key}` must be a positive number of milliseconds, not `{v}`"))),
                },
            }
        };
        let t = GroupTimeouts {
            session: millis("session.timeout.ms", 45_000)?,
            heartbeat: millis("heartbeat.interval.ms", 3_000)?,
            rebalance: millis("max.poll.interval.ms", 300_000)?,
            instance_id: get("group.instance.id").filter(|v| !v.is_empty()).map(String::from),
        };
        if t.heartbeat >= t.session {
            return Err(Error::Config(format!(
                "`heartbeat.interval.ms` ({:?}) must be lower than `session.timeout.ms` ({:?})",
                t.heartbeat, t.session
            )));
        }
        Ok(t)
    }

    pub(crate) fn store_dir(&self, store: &str, partition: i32) -> PathBuf {
        self.state_dir.join(&self.application_id).join(store).join(partition.to_string())
    }
}
