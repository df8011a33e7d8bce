//! What members tell the leader, and the leader each member, inside the
//! classic group protocol's opaque metadata.
//!
//! The outer layer is Kafka's consumer protocol (ConsumerProtocolSubscription
//! and ConsumerProtocolAssignment, protocol type `consumer`), the format
//! Kafka's own tools read for consumer groups (not tested here). kstate's own
//! part travels in their `user_data` as a JSON object with a `version`:
//! a newer member's extra fields are ignored by an older leader, and the
//! leader answers in the lowest version any member speaks.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartitions;
use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition as OwnedPartitions;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use serde::{Deserialize, Serialize};

use super::assignor::TaskId;

/// The version of kstate's user data this code writes.
pub(crate) const USER_DATA_VERSION: u32 = 1;
/// The consumer protocol version used for the outer layer (1: owned
/// partitions, understood by every Kafka since 2.4 and by Redpanda).
const CONSUMER_PROTOCOL_VERSION: i16 = 1;

/// A member's subscription: kstate's part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SubscriptionInfo {
    /// Version of this payload.
    pub(crate) version: u32,
    /// Highest version the member can read (the leader answers in the
    /// lowest of these).
    pub(crate) latest_supported_version: u32,
    /// Identifies the instance across restarts of its member id.
    pub(crate) process_id: String,
    /// `application_server` (host:port), if set: published to the group
    /// (the leader tells every member where tasks run, for queries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) endpoint: Option<String>,
    /// Client tags (rack awareness).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) client_tags: BTreeMap<String, String>,
    /// The member's peer listener (`peer_address`), if set: the leader
    /// tells every member, so that they watch each other (`group::peers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) peer: Option<PeerAddress>,
    /// Standby tasks the member held in the previous generation.
    #[serde(default)]
    pub(crate) standby: BTreeSet<TaskId>,
    /// Tasks the previous assignment gave this member but withheld until
    /// their previous owner released them (see [`AssignmentInfo::pending`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) pending: BTreeSet<TaskId>,
    /// Awaited tasks this member measured within half the acceptable lag
    /// when it asked for this rebalance: the leader counts them caught up.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) caught_up: BTreeSet<TaskId>,
    /// Per task whose state is on this member's disk, the sum of its
    /// stores' changelog checkpoints (a larger sum is more caught up).
    #[serde(default)]
    pub(crate) task_offsets: BTreeMap<TaskId, i64>,
}

/// A member's assignment: kstate's part (the active tasks are the
/// partitions of the outer layer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AssignmentInfo {
    /// Version of this payload.
    pub(crate) version: u32,
    /// Standby tasks of the member.
    #[serde(default)]
    pub(crate) standby: BTreeSet<TaskId>,
    /// Tasks meant for this member that another member still has to give
    /// up: the member reports them in its next subscription, so the next
    /// round (whichever member leads it) hands them over instead of
    /// planning afresh, which could move other tasks and never settle.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) pending: BTreeSet<TaskId>,
    /// Warmup tasks of the member: followed like standbys until caught up,
    /// then moved here by a later rebalance.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) warmup: BTreeSet<TaskId>,
    /// Tasks that move to this member once its copy (a warmup or a standby)
    /// is caught up: the member asks for that rebalance as soon as it is.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) awaited: BTreeSet<TaskId>,
    /// A task is withheld until its previous owner gave it up: every member
    /// rejoins as soon as it applied this assignment (the classic protocol's
    /// next round waits for all members; heartbeats would tell them late).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) rejoin_now: bool,
    /// Set when moves wait for warmups: rejoin after this many milliseconds
    /// at the latest (a probing rebalance; the leader's own assignment only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) probe_in_ms: Option<u64>,
    /// Non-zero when the leader could not assign (see [`AssignmentError`]).
    #[serde(default)]
    pub(crate) error: u16,
    /// Every member with an `application_server` and its tasks in this
    /// generation (interactive queries' metadata).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) hosts: Vec<HostTasks>,
    /// Every member with a peer listener in this generation (failure
    /// detection, `group::peers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) peers: Vec<PeerInfo>,
}

/// Where a member's peer listener is, and which process answers there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PeerAddress {
    /// `host:port` the other instances connect to.
    pub(crate) address: String,
    /// Random per process start: a listener answering with another one is
    /// a restarted process, so the member that advertised it is gone.
    pub(crate) incarnation: u64,
}

/// A member of this generation that other members watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PeerInfo {
    pub(crate) member_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) instance_id: Option<String>,
    #[serde(flatten)]
    pub(crate) address: PeerAddress,
}

/// A member's endpoint (`application_server`) and its tasks as the leader
/// assigned them, sent to every member so each can tell where a key's
/// partition is served. A task that moves is in no one's `active` until
/// its previous owner released it (it is in its new owner's `standby`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostTasks {
    pub(crate) endpoint: String,
    #[serde(default)]
    pub(crate) active: BTreeSet<TaskId>,
    /// Standby and warmup tasks, and tasks about to move here.
    #[serde(default)]
    pub(crate) standby: BTreeSet<TaskId>,
}

/// Why the leader gave no tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub(crate) enum AssignmentError {
    /// The members subscribe to different input topics.
    MismatchedTopics = 1,
}

/// A whole subscription, as it goes into JoinGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Subscription {
    pub(crate) topics: Vec<String>,
    /// Tasks active on the member in the previous generation.
    pub(crate) owned: BTreeSet<TaskId>,
    pub(crate) info: SubscriptionInfo,
}

/// A whole assignment, as it comes out of SyncGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct MemberTasks {
    pub(crate) active: BTreeSet<TaskId>,
    pub(crate) standby: BTreeSet<TaskId>,
    pub(crate) pending: BTreeSet<TaskId>,
    pub(crate) warmup: BTreeSet<TaskId>,
    pub(crate) awaited: BTreeSet<TaskId>,
    pub(crate) rejoin_now: bool,
    pub(crate) probe_in_ms: Option<u64>,
    pub(crate) error: u16,
    pub(crate) hosts: Vec<HostTasks>,
    pub(crate) peers: Vec<PeerInfo>,
}

fn with_version<T: Encodable>(message: &T, version: i16) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i16(version);
    message.encode(&mut buf, version).expect("consumer protocol payloads encode");
    buf.freeze()
}

fn read_version(bytes: &mut Bytes) -> Result<i16, String> {
    if bytes.remaining() < 2 {
        return Err("empty metadata".into());
    }
    Ok(bytes.get_i16())
}

impl Subscription {
    /// The JoinGroup protocol metadata.
    pub(crate) fn encode(&self) -> Bytes {
        let owned = self
            .topics
            .iter()
            .map(|t| {
                let mut tp = OwnedPartitions::default();
                tp.topic = TopicName(StrBytes::from_string(t.clone()));
                tp.partitions = self.owned.iter().copied().collect();
                tp
            })
            .collect();
        let mut s = ConsumerProtocolSubscription::default();
        s.topics = self.topics.iter().map(|t| StrBytes::from_string(t.clone())).collect();
        s.owned_partitions = if self.owned.is_empty() { Vec::new() } else { owned };
        s.user_data = Some(serde_json::to_vec(&self.info).expect("serialisable").into());
        with_version(&s, CONSUMER_PROTOCOL_VERSION)
    }

    /// Reads a member's JoinGroup metadata. Its owned tasks are the
    /// partitions it owned of every topic.
    pub(crate) fn decode(mut bytes: Bytes) -> Result<Subscription, String> {
        let version = read_version(&mut bytes)?;
        // A newer consumer protocol version starts with the fields this one knows.
        let s = ConsumerProtocolSubscription::decode(&mut bytes, version.min(3))
            .map_err(|e| format!("consumer protocol subscription: {e}"))?;
        let user_data = s.user_data.ok_or("no kstate user data (a member that is not kstate?)")?;
        let info: SubscriptionInfo =
            serde_json::from_slice(&user_data).map_err(|e| format!("kstate user data: {e}"))?;
        let owned = s.owned_partitions.iter().flat_map(|tp| tp.partitions.iter().copied()).collect();
        Ok(Subscription { topics: s.topics.iter().map(|t| t.to_string()).collect(), owned, info })
    }
}

/// The tasks a member owned, from the consumer protocol layer alone (for a
/// member whose kstate user data cannot be read: its claims still count,
/// so no task gets two actives).
pub(crate) fn owned_tasks(mut bytes: Bytes) -> BTreeSet<TaskId> {
    let Ok(version) = read_version(&mut bytes) else { return BTreeSet::new() };
    match ConsumerProtocolSubscription::decode(&mut bytes, version.min(3)) {
        Ok(s) => s.owned_partitions.iter().flat_map(|tp| tp.partitions.iter().copied()).collect(),
        Err(_) => BTreeSet::new(),
    }
}

impl MemberTasks {
    /// The SyncGroup assignment for a member reading user data `version`.
    pub(crate) fn encode(&self, topics: &[String], version: u32) -> Bytes {
        let mut a = ConsumerProtocolAssignment::default();
        if !self.active.is_empty() {
            a.assigned_partitions = topics
                .iter()
                .map(|t| {
                    let mut tp = AssignedPartitions::default();
                    tp.topic = TopicName(StrBytes::from_string(t.clone()));
                    tp.partitions = self.active.iter().copied().collect();
                    tp
                })
                .collect();
        }
        let info = AssignmentInfo {
            version,
            standby: self.standby.clone(),
            pending: self.pending.clone(),
            warmup: self.warmup.clone(),
            awaited: self.awaited.clone(),
            rejoin_now: self.rejoin_now,
            probe_in_ms: self.probe_in_ms,
            error: self.error,
            hosts: self.hosts.clone(),
            peers: self.peers.clone(),
        };
        a.user_data = Some(serde_json::to_vec(&info).expect("serialisable").into());
        with_version(&a, CONSUMER_PROTOCOL_VERSION)
    }

    /// Reads this member's SyncGroup assignment (empty bytes: nothing).
    pub(crate) fn decode(mut bytes: Bytes) -> Result<MemberTasks, String> {
        if bytes.is_empty() {
            return Ok(MemberTasks::default());
        }
        let version = read_version(&mut bytes)?;
        let a = ConsumerProtocolAssignment::decode(&mut bytes, version.min(3))
            .map_err(|e| format!("consumer protocol assignment: {e}"))?;
        let info: AssignmentInfo = match &a.user_data {
            Some(data) => serde_json::from_slice(data).map_err(|e| format!("kstate user data: {e}"))?,
            None => return Err("no kstate user data in the assignment".into()),
        };
        let active = a.assigned_partitions.iter().flat_map(|tp| tp.partitions.iter().copied()).collect();
        Ok(MemberTasks {
            active,
            standby: info.standby,
            pending: info.pending,
            warmup: info.warmup,
            awaited: info.awaited,
            rejoin_now: info.rejoin_now,
            probe_in_ms: info.probe_in_ms,
            error: info.error,
            hosts: info.hosts,
            peers: info.peers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_round_trip() {
        let s = Subscription {
            topics: vec!["in".into(), "other".into()],
            owned: BTreeSet::from([1, 4]),
            info: SubscriptionInfo {
                version: USER_DATA_VERSION,
                latest_supported_version: USER_DATA_VERSION,
                process_id: "p1".into(),
                endpoint: Some("host:8080".into()),
                client_tags: BTreeMap::from([("zone".into(), "a".into())]),
                peer: Some(PeerAddress { address: "host:7070".into(), incarnation: 42 }),
                standby: BTreeSet::from([2]),
                pending: BTreeSet::from([5]),
                caught_up: BTreeSet::from([2]),
                task_offsets: BTreeMap::from([(1, 10), (2, 7)]),
            },
        };
        assert_eq!(Subscription::decode(s.encode()).unwrap(), s);
    }

    #[test]
    fn assignment_round_trip_and_unknown_fields() {
        let t = MemberTasks {
            active: BTreeSet::from([0, 3]),
            standby: BTreeSet::from([1]),
            pending: BTreeSet::from([2]),
            warmup: BTreeSet::from([4]),
            awaited: BTreeSet::from([1, 4]),
            rejoin_now: true,
            probe_in_ms: Some(60_000),
            error: 0,
            hosts: vec![HostTasks { endpoint: "a:1".into(), active: BTreeSet::from([0, 3]), standby: BTreeSet::from([1]) }],
            peers: vec![PeerInfo {
                member_id: "m-1".into(),
                instance_id: Some("i-1".into()),
                address: PeerAddress { address: "a:7070".into(), incarnation: 7 },
            }],
        };
        assert_eq!(MemberTasks::decode(t.encode(&["in".into()], 1)).unwrap(), t);
        // A later version's extra fields are ignored.
        let info: AssignmentInfo = serde_json::from_str(r#"{"version":2,"standby":[5],"next_rebalance_ms":9}"#).unwrap();
        assert_eq!(info.standby, BTreeSet::from([5]));
    }

    #[test]
    fn owned_tasks_are_read_without_kstate_user_data() {
        let mut s = ConsumerProtocolSubscription::default();
        s.topics = vec![StrBytes::from_static_str("in")];
        let mut tp = OwnedPartitions::default();
        tp.topic = TopicName(StrBytes::from_static_str("in"));
        tp.partitions = vec![2, 5];
        s.owned_partitions = vec![tp];
        s.user_data = Some(Bytes::from_static(b"not json"));
        let bytes = with_version(&s, 1);
        assert!(Subscription::decode(bytes.clone()).is_err());
        assert_eq!(owned_tasks(bytes), BTreeSet::from([2, 5]));
    }

    #[test]
    fn foreign_metadata_is_an_error() {
        assert!(Subscription::decode(Bytes::from_static(b"")).is_err());
        let mut s = ConsumerProtocolSubscription::default();
        s.topics = vec![StrBytes::from_static_str("in")];
        assert!(Subscription::decode(with_version(&s, 1)).is_err());
    }
}
