//! The changelogs' end (and start) offsets: what the leader measures
//! members' checkpoints against to turn them into lags, and what startup
//! checks for truncated changelogs (Metadata for the partition leaders,
//! then one ListOffsets per leader).

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::assignor::TaskId;
use super::conn::Connection;
use super::coordinator::Brokers;
use crate::error::{Error, Result};

/// How long the committed offsets of table topics may take to read.
const TABLE_LIMIT_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);
/// ListOffsets' timestamp for "the offset the next record will get".
const LATEST: i64 = -1;
/// ListOffsets' timestamp for "the first offset still in the log".
const EARLIEST: i64 = -2;

/// For each task in `tasks`, the sum over `topics` (the application's
/// changelogs) of partition `task`'s end offset, read uncommitted: the same
/// measure as a member's checkpoint sum (each store's checkpoint + 1), so the
/// difference is the records a copy has still to replay. A changelog that
/// does not exist yet counts 0.
///
/// A source table's topic (in `tables`, also in `topics`) counts up to the
/// group's committed offset instead: a copy of a table applies its topic
/// only that far (restores and standbys stop there, docs/architecture.md
/// §18), so a copy at the committed offset is caught up however far the
/// topic runs ahead of the group. Nothing committed counts 0. The
/// committed offsets get [`TABLE_LIMIT_BUDGET`] (the leader waits for them
/// before SyncGroup); without them the tables count to their ends, as before.
pub(crate) fn end_offsets(
    brokers: &Brokers,
    (group, topics, tables): (&str, &[String], &[String]),
    tasks: &[TaskId],
    start: usize,
) -> Result<BTreeMap<TaskId, i64>> {
    let ends = list_offsets(brokers, topics, tasks, start, LATEST)?;
    let mut limits = BTreeMap::new();
    if !tables.is_empty() {
        let partitions: Vec<(String, i32)> = tables.iter().flat_map(|t| tasks.iter().map(move |&p| (t.clone(), p))).collect();
        match super::offsets::fetch_committed(brokers, group, &partitions, TABLE_LIMIT_BUDGET, false) {
            Ok(committed) => limits.extend(committed.into_iter().map(|(key, offset)| (key, offset.unwrap_or(0)))),
            Err(e) => tracing::warn!(group, error = %e, "the group's committed offsets on its table topics could not be read; table copies' lags count to the topics' ends this time"),
        }
    }
    Ok(sum_ends(&ends, &limits, tasks))
}

/// Per task, the sum of its partitions' `ends`, each at most its limit.
fn sum_ends(ends: &BTreeMap<(String, TaskId), i64>, limits: &BTreeMap<(String, TaskId), i64>, tasks: &[TaskId]) -> BTreeMap<TaskId, i64> {
    let mut sums: BTreeMap<TaskId, i64> = tasks.iter().map(|&t| (t, 0)).collect();
    for (key, &end) in ends {
        if let Some(sum) = sums.get_mut(&key.1) {
            *sum += limits.get(key).map_or(end, |&limit| end.min(limit)).max(0);
        }
    }
    sums
}

/// Per changelog partition of `topics` (partitions `tasks`), the first
/// offset still in the log: above 0 in a compacted changelog, records were
/// deleted (DeleteRecords, a retention policy once set). Missing topics are
/// left out.
pub(crate) fn start_offsets(brokers: &Brokers, topics: &[String], tasks: &[TaskId]) -> Result<BTreeMap<(String, TaskId), i64>> {
    list_offsets(brokers, topics, tasks, 0, EARLIEST)
}

/// ListOffsets at `timestamp` (LATEST or EARLIEST) for partitions `tasks`
/// of every existing topic of `topics`.
fn list_offsets(
    brokers: &Brokers,
    topics: &[String],
    tasks: &[TaskId],
    start: usize,
    timestamp: i64,
) -> Result<BTreeMap<(String, TaskId), i64>> {
    let mut found = BTreeMap::new();
    if topics.is_empty() || tasks.is_empty() {
        return Ok(found);
    }
    let wanted_tasks: std::collections::BTreeSet<TaskId> = tasks.iter().copied().collect();
    let mut conn = brokers.any(start)?;
    let mut request = MetadataRequest::default();
    request.topics = Some(
        topics
            .iter()
            .map(|t| {
                let mut topic = MetadataRequestTopic::default();
                topic.name = Some(TopicName(StrBytes::from_string(t.clone())));
                topic
            })
            .collect(),
    );
    request.allow_auto_topic_creation = false;
    let (metadata, _) = conn.send(&request)?;
    let addresses: BTreeMap<BrokerId, String> = metadata
        .brokers
        .iter()
        .map(|b| {
            let host = b.host.as_str();
            let address = if host.contains(':') { format!("[{host}]:{}", b.port) } else { format!("{host}:{}", b.port) };
            (b.node_id, address)
        })
        .collect();
    // Leader -> topic -> partitions to ask it for.
    let mut by_leader: BTreeMap<BrokerId, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
    for topic in &metadata.topics {
        let name = topic.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
        match ResponseError::try_from_code(topic.error_code) {
            None => {}
            Some(ResponseError::UnknownTopicOrPartition) => continue, // not created yet: nothing to replay
            Some(e) => return Err(unavailable(conn.broker(), format!("metadata of `{name}`: {e}"))),
        }
        for p in &topic.partitions {
            if !wanted_tasks.contains(&p.partition_index) {
                continue;
            }
            if p.error_code != 0 && p.leader_id.0 < 0 {
                return Err(unavailable(conn.broker(), format!("`{name}` partition {} has no leader", p.partition_index)));
            }
            by_leader.entry(p.leader_id).or_default().entry(name.clone()).or_default().push(p.partition_index);
        }
    }
    for (leader, wanted) in by_leader {
        let address = addresses
            .get(&leader)
            .ok_or_else(|| unavailable(conn.broker(), format!("partition leader {} is not among the brokers", leader.0)))?;
        let mut leader_conn;
        let target: &mut Connection = if address == conn.broker() {
            &mut conn
        } else {
            leader_conn = Connection::connect(address, &brokers.security, &brokers.client_id, brokers.timeout)?;
            &mut leader_conn
        };
        let mut request = ListOffsetsRequest::default();
        request.replica_id = BrokerId(-1);
        request.isolation_level = 0;
        request.topics = wanted
            .iter()
            .map(|(name, partitions)| {
                let mut topic = ListOffsetsTopic::default();
                topic.name = TopicName(StrBytes::from_string(name.clone()));
                topic.partitions = partitions
                    .iter()
                    .map(|&p| {
                        let mut partition = ListOffsetsPartition::default();
                        partition.partition_index = p;
                        partition.current_leader_epoch = -1;
                        partition.timestamp = timestamp;
                        partition
                    })
                    .collect();
                topic
            })
            .collect();
        let (response, _) = target.send(&request)?;
        for topic in &response.topics {
            for p in &topic.partitions {
                if let Some(e) = ResponseError::try_from_code(p.error_code) {
                    return Err(unavailable(
                        target.broker(),
                        format!("end offset of `{}` partition {}: {e}", topic.name.0.as_str(), p.partition_index),
                    ));
                }
                found.insert((topic.name.0.to_string(), p.partition_index), p.offset);
            }
        }
    }
    Ok(found)
}

/// A retriable failure (leaders moving, a broker away).
fn unavailable(broker: &str, detail: String) -> Error {
    Error::BrokerUnreachable { bootstrap: broker.to_string(), timeout: std::time::Duration::ZERO, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_topic_counts_up_to_the_committed_offset_only() {
        let key = |t: &str, p| (t.to_string(), p);
        let ends = BTreeMap::from([(key("app-s-changelog", 0), 100), (key("prices", 0), 5000), (key("prices", 1), 70), (key("app-s-changelog", 1), 30)]);
        // The group committed 400 on prices/0 (the topic runs 4600 ahead) and 90 on prices/1.
        let limits = BTreeMap::from([(key("prices", 0), 400), (key("prices", 1), 90)]);
        let sums = sum_ends(&ends, &limits, &[0, 1]);
        assert_eq!(sums, BTreeMap::from([(0, 100 + 400), (1, 30 + 70)]));
        // Without tables, the ends as they are.
        assert_eq!(sum_ends(&ends, &BTreeMap::new(), &[0]), BTreeMap::from([(0, 5100)]));
    }
}
