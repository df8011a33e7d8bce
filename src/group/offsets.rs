//! Offset commits under the member's generation (DESIGN.md §3): the
//! coordinator accepts them only from a current member of the current
//! generation, so a fenced member (a zombie) cannot commit.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::{GroupId, OffsetCommitRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::conn::Connection;
use super::member::Generation;
use crate::error::Result;

/// The coordinator's answer per partition: `None` if committed.
pub(crate) type CommitResults = BTreeMap<(String, i32), Option<ResponseError>>;

/// Commits `offsets` (topic, partition, next offset to read) for `group`
/// under `generation`. I/O failures are errors; refusals come back per
/// partition (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS,
/// NOT_COORDINATOR, ...).
pub(crate) fn commit(
    conn: &mut Connection,
    group: &str,
    generation: &Generation,
    offsets: &[(String, i32, i64)],
) -> Result<CommitResults> {
    let mut by_topic: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
    for (topic, partition, offset) in offsets {
        let mut p = OffsetCommitRequestPartition::default();
        p.partition_index = *partition;
        p.committed_offset = *offset;
        p.committed_leader_epoch = -1;
        by_topic.entry(topic).or_default().push(p);
    }
    let mut request = OffsetCommitRequest::default();
    request.group_id = GroupId(StrBytes::from_string(group.to_string()));
    request.generation_id_or_member_epoch = generation.id;
    request.member_id = StrBytes::from_string(generation.member_id.clone());
    request.group_instance_id = generation.instance_id.clone().map(StrBytes::from_string);
    request.retention_time_ms = -1;
    request.topics = by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            let mut t = OffsetCommitRequestTopic::default();
            t.name = TopicName(StrBytes::from_string(topic.to_string()));
            t.partitions = partitions;
            t
        })
        .collect();
    let (response, _) = conn.send(&request)?;
    let mut results = CommitResults::new();
    for t in response.topics {
        for p in t.partitions {
            results.insert((t.name.to_string(), p.partition_index), ResponseError::try_from_code(p.error_code));
        }
    }
    Ok(results)
}
