//! Changelog topics: naming, creation and validation. Store `S` of
//! application `A` logs to the compacted topic `A-S-changelog` (the same name
//! Kafka Streams uses), one partition per input partition.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;

use crate::error::{Error, Result};

/// The changelog topic name of `store` in application `application_id`.
///
/// ```
/// assert_eq!(kstate::changelog_topic("clicks", "counts"), "clicks-counts-changelog");
/// ```
pub fn changelog_topic(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}

/// What one changelog topic must look like.
#[derive(Debug, Clone)]
pub(crate) struct ChangelogSpec {
    pub(crate) topic: String,
    pub(crate) partitions: i32,
    pub(crate) replication: Option<i32>,
    pub(crate) extra_configs: Vec<(String, String)>,
    /// A window or session store's changelog: the `retention.ms` it must
    /// keep at least (the store's retention) and the one kstate creates it
    /// with (plus the additional retention); it is `compact,delete`.
    /// `None`: a key-value store's, compacted only.
    pub(crate) retention_ms: Option<(i64, i64)>,
}

/// A validated changelog topic.
#[derive(Debug, Clone)]
pub(crate) struct ChangelogInfo {
    /// The topic's `max.message.bytes`.
    pub(crate) max_message_bytes: usize,
    /// The topic's `delete.retention.ms`: how long the broker keeps a
    /// tombstone after cleaning its segment.
    pub(crate) tombstone_retention: Option<Duration>,
    /// The topic's `retention.ms` (-1: forever) if it deletes by time.
    pub(crate) retention_ms: Option<i64>,
}

/// Creates missing changelog topics and checks existing ones: partition count
/// equal to the input's and `cleanup.policy=compact`. Warns when a changelog keeps
/// tombstones for less than ten times `flushed_every` (how often stores flush
/// at least: a restore replays from the last flush).
pub(crate) fn ensure_topics(
    admin: &AdminClient<DefaultClientContext>,
    specs: &[ChangelogSpec],
    timeout: Duration,
    flushed_every: Duration,
) -> Result<HashMap<String, ChangelogInfo>> {
    let opts = AdminOptions::new().request_timeout(Some(timeout)).operation_timeout(Some(timeout));
    let mut missing = Vec::new();
    for spec in specs {
        match topic_partitions(admin, &spec.topic, timeout)? {
            None => missing.push(spec),
            Some(n) if n != spec.partitions => {
                return Err(Error::ChangelogTopicMismatch {
                    topic: spec.topic.clone(),
                    problem: format!(
                        "it has {n} partitions but the input topics have {}; \
                         delete it or fix the input topics",
                        spec.partitions
                    ),
                })
            }
            Some(_) => {}
        }
    }
    if !missing.is_empty() {
        let retention: Vec<Option<String>> = missing.iter().map(|s| s.retention_ms.map(|(_, create)| create.to_string())).collect();
        let new_topics: Vec<NewTopic<'_>> = missing
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let rf = TopicReplication::Fixed(s.replication.unwrap_or(-1));
                let mut t = NewTopic::new(&s.topic, s.partitions, rf);
                t = match &retention[i] {
                    Some(ms) => t.set("cleanup.policy", "compact,delete").set("retention.ms", ms),
                    None => t.set("cleanup.policy", "compact"),
                };
                for (k, v) in &s.extra_configs {
                    t = t.set(k, v);
                }
                t
            })
            .collect();
        for result in futures::executor::block_on(admin.create_topics(&new_topics, &opts))? {
            match result {
                Ok(topic) => tracing::info!(%topic, "created changelog topic"),
                Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    tracing::info!(%topic, "changelog topic was created concurrently")
                }
                Err((topic, code)) => {
                    return Err(Error::ChangelogTopicMismatch {
                        topic,
                        problem: format!("could not create it: {code}"),
                    })
                }
            }
        }
        for spec in &missing {
            wait_for_topic(admin, spec, timeout)?;
        }
    }

    if specs.is_empty() {
        // An application without stores; librdkafka refuses an empty describe.
        return Ok(HashMap::new());
    }
    let resources: Vec<ResourceSpecifier<'_>> =
        specs.iter().map(|s| ResourceSpecifier::Topic(&s.topic)).collect();
    let described = futures::executor::block_on(admin.describe_configs(&resources, &opts))?;
    let mut infos = HashMap::new();
    for (spec, res) in specs.iter().zip(described) {
        let res = res.map_err(|code| Error::ChangelogTopicMismatch {
            topic: spec.topic.clone(),
            problem: format!("could not describe its configuration: {code}"),
        })?;
        let policy = res.get("cleanup.policy").and_then(|e| e.value.clone()).unwrap_or_default();
        let number = |name: &str| res.get(name).and_then(|e| e.value.as_deref()).and_then(|v| v.parse::<u64>().ok());
        match spec.retention_ms {
            None if policy.trim() != "compact" => {
                return Err(Error::ChangelogTopicMismatch {
                    topic: spec.topic.clone(),
                    problem: format!(
                        "cleanup.policy is `{policy}`, but a changelog must be `compact` \
                         (with `delete`, old state would be lost from the changelog)"
                    ),
                });
            }
            None => {}
            Some((least, wanted)) => {
                let signed = |name: &str| res.get(name).and_then(|e| e.value.as_deref()).and_then(|v| v.parse::<i64>().ok());
                check_window_changelog(&spec.topic, &policy, signed("retention.ms"), signed("retention.bytes"), least, wanted)?;
            }
        }
        let delete_retention_ms = number("delete.retention.ms");
        if let Some(ms) = delete_retention_ms.filter(|ms| Duration::from_millis(*ms) < 10 * flushed_every) {
            tracing::warn!(topic = %spec.topic, delete_retention_ms = ms,
                flushed_every_secs = flushed_every.as_secs(),
                "the changelog keeps tombstones only briefly: a store restored after a crash replays from its last \
                 flush, and a delete whose tombstone the broker dropped meanwhile would come back");
        }
        let max_message_bytes = number("max.message.bytes").map_or(1_048_588, |n| n as usize);
        let retention_ms = policy
            .split(',')
            .any(|p| p.trim() == "delete")
            .then(|| res.get("retention.ms").and_then(|e| e.value.as_deref()).and_then(|v| v.parse::<i64>().ok()))
            .flatten();
        infos.insert(
            spec.topic.clone(),
            ChangelogInfo { max_message_bytes, tombstone_retention: delete_retention_ms.map(Duration::from_millis), retention_ms },
        );
    }
    Ok(infos)
}

/// A window or session store's changelog must keep every live window and
/// only window records: `compact,delete` (compact only is a key-value
/// store's changelog), deleting by time no sooner than the store's
/// retention (`least`) and never by size; kstate creates it with `wanted`.
fn check_window_changelog(
    topic: &str,
    policy: &str,
    retention_ms: Option<i64>,
    retention_bytes: Option<i64>,
    least: i64,
    wanted: i64,
) -> Result<()> {
    let policies: Vec<&str> = policy.split(',').map(str::trim).collect();
    if !(policies.contains(&"compact") && policies.contains(&"delete")) {
        return Err(Error::ChangelogTopicMismatch {
            topic: topic.to_string(),
            problem: format!(
                "cleanup.policy is `{policy}`, but a window or session store's changelog must be `compact,delete` \
                 (without compaction a window's older updates would be restored; a compacted-only topic is \
                 a key-value store's changelog, whose records are no windows: use a new store name)"
            ),
        });
    }
    if let Some(bytes) = retention_bytes.filter(|b| *b >= 0) {
        return Err(Error::ChangelogTopicMismatch {
            topic: topic.to_string(),
            problem: format!(
                "retention.bytes is {bytes}: the broker would delete live windows by size; \
                 remove it (kafka-configs --alter --delete-config retention.bytes)"
            ),
        });
    }
    {
        match retention_ms {
            Some(ms) if ms >= 0 && ms < least => {
                return Err(Error::ChangelogTopicMismatch {
                    topic: topic.to_string(),
                    problem: format!(
                        "retention.ms is {ms}, shorter than the store's retention ({least} ms): \
                         the broker would delete windows that are still live; raise it to {wanted} \
                         (kafka-configs --alter --add-config retention.ms={wanted}) or shorten the store's retention"
                    ),
                });
            }
            // Also what a restore from the live tail reads the longest
            // retention the records were written under from
            // (restore/live_tail.rs): a raised retention must show here.
            Some(ms) if ms >= 0 && ms < wanted => {
                return Err(Error::ChangelogTopicMismatch {
                    topic: topic.to_string(),
                    problem: format!(
                        "retention.ms is {ms}, shorter than the store's retention plus the additional retention \
                         ({wanted} ms): if stream time fell behind the wall clock a restore could miss live windows; \
                         raise it to {wanted} (kafka-configs --alter --add-config retention.ms={wanted}), or lower \
                         StoreDefinition::changelog_additional_retention"
                    ),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Partition count of `topic`, or `None` if it does not exist.
pub(crate) fn topic_partitions(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<i32>> {
    let md = admin.inner().fetch_metadata(Some(topic), timeout)?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else { return Ok(None) };
    match t.error() {
        None => Ok(Some(t.partitions().len() as i32)),
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => Ok(None),
        Some(e) => Err(Error::from(KafkaError::MetadataFetch(e.into()))),
    }
}

fn wait_for_topic(
    admin: &AdminClient<DefaultClientContext>,
    spec: &ChangelogSpec,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if topic_partitions(admin, &spec.topic, timeout)? == Some(spec.partitions) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::ChangelogTopicMismatch {
                topic: spec.topic.clone(),
                problem: "created, but its metadata did not appear in time".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
