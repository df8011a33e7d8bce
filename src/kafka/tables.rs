//! The topics of source tables (`AppBuilder::table`): kstate never creates
//! or configures them, only checks at start that they can be a table's
//! changelog (docs/architecture.md §18).

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

use super::ChangelogInfo;

/// Kafka's default `delete.retention.ms`: assumed for a topic whose
/// configuration cannot be read, so that local state older than that is
/// still restored in full (a tombstone may have been dropped meanwhile).
const DEFAULT_DELETE_RETENTION: Duration = Duration::from_secs(24 * 3600);
use crate::error::{Error, Result};

/// Checks each table topic's `cleanup.policy` and reads what its restore
/// needs (`delete.retention.ms`, `max.message.bytes`, `retention.ms`).
/// `delete` only is [`Error::TableTopic`]: a restore would miss every key
/// whose records aged out. `compact,delete` is a warning (keys whose last
/// record aged out are gone from a restore). A topic whose configuration
/// cannot be read (no `DescribeConfigs` permission) is a warning, and its
/// restore runs without those settings. The topics exist: the partition
/// counts were checked before.
pub(crate) fn check_table_topics(admin: &AdminClient<DefaultClientContext>, topics: &[String], timeout: Duration) -> Result<HashMap<String, ChangelogInfo>> {
    if topics.is_empty() {
        return Ok(HashMap::new());
    }
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let resources: Vec<ResourceSpecifier<'_>> = topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    let described = futures::executor::block_on(admin.describe_configs(&resources, &opts))?;
    let mut infos = HashMap::new();
    for (topic, described) in topics.iter().zip(described) {
        let config = match described {
            Ok(c) => c,
            Err(code) => {
                tracing::warn!(%topic, error = %code,
                    "cannot read a table topic's configuration; assuming it is compacted, with Kafka's default delete.retention.ms (1 day)");
                let info = ChangelogInfo { max_message_bytes: 1_048_588, tombstone_retention: Some(DEFAULT_DELETE_RETENTION), retention_ms: None };
                infos.insert(topic.clone(), info);
                continue;
            }
        };
        let policy = config.get("cleanup.policy").and_then(|e| e.value.clone()).unwrap_or_default();
        if let Some(problem) = policy_problem(&policy) {
            return Err(Error::TableTopic { topic: topic.clone(), problem });
        }
        if policy.split(',').any(|p| p.trim() == "delete") {
            tracing::warn!(%topic, %policy, "a table topic that also deletes by time or size: a key whose last record was deleted is missing from a restored table");
        }
        let number = |name: &str| config.get(name).and_then(|e| e.value.as_deref()).and_then(|v| v.parse::<i64>().ok());
        infos.insert(
            topic.clone(),
            ChangelogInfo {
                max_message_bytes: number("max.message.bytes").map_or(1_048_588, |n| n.max(0) as usize),
                tombstone_retention: number("delete.retention.ms").filter(|ms| *ms >= 0).map(|ms| Duration::from_millis(ms as u64)),
                retention_ms: policy.split(',').any(|p| p.trim() == "delete").then(|| number("retention.ms")).flatten(),
            },
        );
    }
    Ok(infos)
}

/// Why a topic with this `cleanup.policy` cannot hold a table, if it cannot.
fn policy_problem(policy: &str) -> Option<String> {
    let compacts = policy.split(',').any(|p| p.trim() == "compact");
    (!compacts).then(|| {
        format!(
            "cleanup.policy is `{policy}`: a table's topic must be compacted (`compact`), or a restore misses every key \
             whose records the broker deleted"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::policy_problem;

    #[test]
    fn only_a_compacted_topic_holds_a_table() {
        assert!(policy_problem("compact").is_none());
        assert!(policy_problem("compact,delete").is_none());
        assert!(policy_problem("delete, compact").is_none());
        assert!(policy_problem("delete").unwrap().contains("must be compacted"));
        assert!(policy_problem("").is_some());
    }
}
