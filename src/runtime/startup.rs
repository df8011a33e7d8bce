//! What `run` needs before it starts: the process id kept on disk, the
//! tasks found on disk, the client config, the input partition count, and
//! a warning about changelogs truncated from the start.

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use crate::config::AppConfig;
use crate::error::{Error, Result};
use crate::group::Brokers;
use crate::kafka::ChangelogSpec;

/// The file under `<state_dir>/<application_id>` that holds this instance's process id.
pub(crate) const PROCESS_ID_FILE: &str = "kstate.process-id";

/// A process id that survives restarts, kept in the application's state
/// directory (Kafka Streams keeps one there too): the group tells an
/// instance that restarted apart from a new one.
pub(super) fn process_id(config: &AppConfig) -> Result<String> {
    let dir = config.state_dir.join(&config.application_id);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
    let path = dir.join(PROCESS_ID_FILE);
    if let Ok(id) = std::fs::read_to_string(&path) {
        let id = id.trim();
        if !id.is_empty() {
            return Ok(id.to_string());
        }
    }
    let mut raw = [0u8; 16];
    openssl::rand::rand_bytes(&mut raw).map_err(|e| Error::Config(format!("no random bytes for a process id: {e}")))?;
    let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, &id).map_err(|e| Error::io(path.display().to_string(), e))?;
    Ok(id)
}

/// The tasks whose state is on this instance's disk, with the sum of
/// their stores' checkpoints (+1 each) as of their last clean close, read
/// from the checkpoint hints beside the databases (opening every RocksDB
/// instance would take long); 0 for a store without a hint.
pub(super) fn local_tasks(config: &AppConfig, partitions: i32) -> std::collections::BTreeMap<i32, i64> {
    let mut found = std::collections::BTreeMap::new();
    for store in &config.stores {
        for p in 0..partitions {
            let dir = config.store_dir(store.name(), p);
            if dir.is_dir() {
                let next = crate::store::engine::read_checkpoint_hint(&dir).map_or(0, |c| c + 1);
                *found.entry(p).or_insert(0) += next;
            }
        }
    }
    found
}

pub(super) fn client_config(config: &AppConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers);
    for (k, v) in &config.kafka_overrides {
        c.set(k, v);
    }
    c
}

/// Checks that the brokers answer and returns the input partition count.
pub(super) fn input_partitions(admin: &AdminClient<DefaultClientContext>, config: &AppConfig) -> Result<i32> {
    let md = admin.inner().fetch_metadata(None, config.startup_timeout).map_err(|e| Error::BrokerUnreachable {
        bootstrap: config.bootstrap_servers.clone(),
        timeout: config.startup_timeout,
        detail: e.to_string(),
    })?;
    // The declared inputs (the repartition topics, created after this, follow them).
    let declared = config.input_topics.iter().filter(|t| !config.repartitions.iter().any(|r| r.topic == **t));
    let mut counts = Vec::new();
    for topic in declared {
        match md.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => counts.push((topic.clone(), t.partitions().len() as i32)),
            _ => return Err(Error::MissingInputTopic(topic.clone())),
        }
    }
    let partitions = counts.first().map_or(0, |c| c.1);
    let other: Vec<(String, i32)> = counts.into_iter().filter(|(_, n)| *n != partitions).collect();
    if !other.is_empty() {
        return Err(Error::NotCoPartitioned { topics: other, partitions });
    }
    Ok(partitions)
}

/// Warns about changelogs whose records were deleted from the start
/// (DeleteRecords, or a `delete` retention once set): compaction never moves
/// a compacted topic's start offset, so a start above 0 means a fresh
/// restore misses keys that a store restored earlier still holds. Counted in
/// `kstate_changelog_truncated_partitions{topic}`. Best effort: a failed
/// check is logged and startup goes on.
pub(super) fn warn_truncated_changelogs(brokers: &Brokers, specs: &[ChangelogSpec], partitions: i32) {
    let topics: Vec<String> = specs.iter().map(|s| s.topic.clone()).collect();
    let all: Vec<i32> = (0..partitions).collect();
    match crate::group::start_offsets(brokers, &topics, &all) {
        Ok(starts) => {
            for topic in &topics {
                let truncated: Vec<(i32, i64)> =
                    starts.iter().filter(|((t, _), o)| t == topic && **o > 0).map(|((_, p), o)| (*p, *o)).collect();
                metrics::gauge!(crate::metrics::CHANGELOG_TRUNCATED, "topic" => topic.clone()).set(truncated.len() as f64);
                if !truncated.is_empty() {
                    tracing::warn!(%topic, partitions_and_start_offsets = ?truncated,
                        "the changelog lost records from its start (DeleteRecords or a retention policy): a fresh restore \
                         of these partitions misses keys written before those offsets, which stores restored earlier still hold");
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not check the changelogs' start offsets"),
    }
}

/// Binds `peer_address` (failure detection among the instances), if set;
/// the advertised address carries the port actually bound (port 0 picks one).
pub(super) fn peer_listener(config: &AppConfig) -> Result<Option<crate::group::peers::PeerSettings>> {
    let Some(address) = &config.peer_address else { return Ok(None) };
    let listener = std::net::TcpListener::bind(address.as_str())
        .map_err(|e| Error::Config(format!("peer_address `{address}`: cannot listen there: {e}")))?;
    let port = listener.local_addr().map_err(|e| Error::io("peer listener", e))?.port();
    let host = crate::config::host_of(address).unwrap_or(address);
    let secret = crate::group::peers::Secrets::from_config(&config.peer_secret, &config.peer_previous_secret, config.peer_plaintext)
        .map_err(Error::Config)?;
    if secret.is_none() {
        tracing::warn!(%address, "peer links run unauthenticated (peer_plaintext): anything that reaches the port can speak for an instance");
    }
    Ok(Some(crate::group::peers::PeerSettings {
        listener: std::sync::Arc::new(listener),
        advertised: format!("{host}:{port}"),
        timeout: config.peer_timeout,
        secret,
    }))
}

/// How the snapshot thread sees a store: its name, its definition as
/// manifests record it, its changelog topic.
pub(super) fn snapshot_info(
    application_id: &str,
) -> impl Fn(&crate::config::StoreDefinition) -> crate::snapshot::StoreInfo + '_ {
    move |def| {
        let mut definition = match (def.windows(), def.session_windows()) {
            (Some(w), _) => format!("window {w:?}"),
            (_, Some(s)) => format!("session {s:?}"),
            _ => "key_value".to_string(),
        };
        if def.is_in_memory() {
            definition.push_str(" in_memory");
        }
        if let Some(r) = def.retention_period() {
            definition.push_str(&format!(" retention={}ms", r.as_millis()));
        }
        if let Some((ttl, domain)) = def.time_to_live() {
            definition.push_str(&format!(" ttl={}ms/{domain:?}", ttl.as_millis()));
        }
        crate::snapshot::StoreInfo {
            name: def.name().to_string(),
            schema_version: def.version(),
            definition,
            changelog_topic: def.changelog_topic(application_id),
        }
    }
}
