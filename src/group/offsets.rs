//! Offset commits under the member's generation (docs/architecture.md §3): the
//! coordinator accepts them only from a current member of the current
//! generation, so a fenced member (a zombie) cannot commit.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::{GroupId, OffsetCommitRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::conn::Connection;
use super::coordinator::Brokers;
use super::session::Generation;
use crate::error::Result;
use crate::group::failure::CommitFailure;

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

/// Committed offsets by (topic, partition); `None`: nothing committed.
pub(crate) type StableOffsets = BTreeMap<(String, i32), Option<i64>>;

/// Waits until the committed offsets of `partitions` (topic, partition)
/// in `group` are stable, i.e. no transaction that sent offsets for them is
/// still open (OffsetFetch with `require_stable`, KIP-447), and returns
/// them (`None`: nothing committed). Retried while UNSTABLE_OFFSET_COMMIT
/// or the coordinator is away, up to `timeout`.
///
/// Exactly-once: a task's new owner restores its changelogs only after
/// this, so that a previous owner's transaction that commits meanwhile
/// cannot leave the restored state behind the committed offsets.
pub(crate) fn fetch_stable(
    brokers: &Brokers,
    group: &str,
    partitions: &[(String, i32)],
    timeout: Duration,
) -> Result<StableOffsets> {
    fetch_committed(brokers, group, partitions, timeout, true)
}

/// The committed offsets of `partitions` in `group`: with `stable`, as
/// [`fetch_stable`]; without, as they are now (offsets of an open
/// transaction are not shown yet), for a standby's table limit, which must
/// not wait.
pub(crate) fn fetch_committed(
    brokers: &Brokers,
    group: &str,
    partitions: &[(String, i32)],
    timeout: Duration,
    stable: bool,
) -> Result<StableOffsets> {
    use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics};
    use kafka_protocol::messages::OffsetFetchRequest;
    let started = std::time::Instant::now();
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (topic, p) in partitions {
        by_topic.entry(topic).or_default().push(*p);
    }
    let group_id = GroupId(StrBytes::from_string(group.to_string()));
    let mut rotate = 0;
    let mut last = String::new();
    let mut logged = false;
    loop {
        if started.elapsed() >= timeout {
            return Err(crate::error::Error::OffsetCommit(format!(
                "committed offsets of {partitions:?} not stable after {timeout:?}: {last}"
            )));
        }
        if stable && !logged && started.elapsed() >= Duration::from_secs(2) {
            logged = true;
            tracing::info!(?partitions, reason = %last,
                "waiting for a previous owner's open transaction to end before restoring (at most transaction_timeout)");
        }
        rotate += 1;
        // Ok(Err(why)): the coordinator answered, but not yet stable.
        let attempt = (|| -> Result<std::result::Result<StableOffsets, String>> {
            let mut conn = brokers.coordinator(group, rotate)?;
            let version = conn.version::<OffsetFetchRequest>()?;
            if stable && version < 7 {
                return Err(crate::error::Error::UnsupportedBroker {
                    broker: conn.broker().to_string(),
                    detail: "exactly-once needs OffsetFetch v7 (require_stable, Kafka 2.5 or newer)".into(),
                });
            }
            let mut request = OffsetFetchRequest::default();
            request.require_stable = stable;
            if version >= 8 {
                let mut g = OffsetFetchRequestGroup::default();
                g.group_id = group_id.clone();
                g.topics = Some(
                    by_topic
                        .iter()
                        .map(|(t, ps)| {
                            let mut x = OffsetFetchRequestTopics::default();
                            x.name = TopicName(StrBytes::from_string(t.to_string()));
                            x.partition_indexes = ps.clone();
                            x
                        })
                        .collect(),
                );
                request.groups = vec![g];
            } else {
                request.group_id = group_id.clone();
                request.topics = Some(
                    by_topic
                        .iter()
                        .map(|(t, ps)| {
                            let mut x = OffsetFetchRequestTopic::default();
                            x.name = TopicName(StrBytes::from_string(t.to_string()));
                            x.partition_indexes = ps.clone();
                            x
                        })
                        .collect(),
                );
            }
            let (response, version) = conn.send_at_most(&request, 8)?;
            let mut found = BTreeMap::new();
            let mut problem = None;
            let mut note = |topic: &str, p: i32, offset: i64, code: i16| match ResponseError::try_from_code(code) {
                None => {
                    found.insert((topic.to_string(), p), (offset >= 0).then_some(offset));
                }
                Some(e) => problem = Some(format!("{topic} [{p}]: {e}")),
            };
            if version >= 8 {
                for g in &response.groups {
                    if let Some(e) = ResponseError::try_from_code(g.error_code) {
                        return Ok(Err(format!("group {group}: {e}")));
                    }
                    for t in &g.topics {
                        for p in &t.partitions {
                            note(&t.name, p.partition_index, p.committed_offset, p.error_code);
                        }
                    }
                }
            } else {
                if let Some(e) = ResponseError::try_from_code(response.error_code) {
                    return Ok(Err(format!("group {group}: {e}")));
                }
                for t in &response.topics {
                    for p in &t.partitions {
                        note(&t.name, p.partition_index, p.committed_offset, p.error_code);
                    }
                }
            }
            Ok(match problem {
                Some(p) => Err(p),
                None => Ok(found),
            })
        })();
        match attempt {
            Ok(Ok(found)) => return Ok(found),
            Ok(Err(why)) => last = why,
            Err(e @ crate::error::Error::UnsupportedBroker { .. }) => return Err(e),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Why an offset commit failed, and what that means (see [`CommitFailure`]).
#[derive(Debug, Clone)]
pub(crate) struct CommitError {
    pub(crate) kind: CommitFailure,
    pub(crate) detail: String,
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// What a coordinator's refusal means for the offsets it refused.
pub(crate) fn classify(error: ResponseError) -> CommitFailure {
    use ResponseError as R;
    match error {
        R::IllegalGeneration | R::UnknownMemberId | R::RebalanceInProgress | R::FencedInstanceId => {
            CommitFailure::GroupChanged
        }
        R::NotCoordinator
        | R::CoordinatorNotAvailable
        | R::CoordinatorLoadInProgress
        | R::RequestTimedOut
        | R::NetworkException
        | R::NotEnoughReplicas
        | R::NotEnoughReplicasAfterAppend
        | R::UnknownTopicOrPartition => CommitFailure::Retriable,
        _ => CommitFailure::Fatal,
    }
}

/// Offsets as committed: topic, partition, next offset to read.
pub(crate) type Offsets = Vec<(String, i32, i64)>;

struct CommitRequest {
    generation: Arc<Generation>,
    offsets: Offsets,
    /// A synchronous commit's reply goes here instead of the results queue.
    reply: Option<Sender<std::result::Result<(), CommitError>>>,
}

/// Commits offsets on a thread of its own (`kstate-offsets`), over its own
/// coordinator connection: a coordinator that is slow or away never stalls
/// the processing thread, and the membership's JoinGroup (which can wait
/// for the whole group) never holds a commit back.
pub(crate) struct Committer {
    requests: Option<Sender<CommitRequest>>,
    results: Receiver<(Offsets, std::result::Result<(), CommitError>)>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    pub(crate) fn start(brokers: Brokers, group: String) -> Result<Committer> {
        let (requests, request_rx) = mpsc::channel::<CommitRequest>();
        let (result_tx, results) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kstate-offsets".into())
            .spawn(move || {
                let mut conn: Option<Connection> = None;
                let mut rotate = 0;
                for request in request_rx {
                    let result = commit_once(&brokers, &group, &mut conn, &mut rotate, &request.generation, &request.offsets);
                    match request.reply {
                        Some(reply) => drop(reply.send(result)),
                        None => {
                            if result_tx.send((request.offsets, result)).is_err() {
                                return;
                            }
                        }
                    }
                }
            })
            .map_err(|e| crate::error::Error::io("kstate-offsets thread", e))?;
        Ok(Committer { requests: Some(requests), results, thread: Some(thread) })
    }

    /// Starts committing `offsets` under `generation`; the result comes
    /// from [`Committer::result`].
    pub(crate) fn send(&self, generation: Arc<Generation>, offsets: Offsets) {
        if let Some(r) = &self.requests {
            let _ = r.send(CommitRequest { generation, offsets, reply: None });
        }
    }

    /// The result of an asynchronous commit, if one arrived.
    pub(crate) fn result(&self) -> Option<(Offsets, std::result::Result<(), CommitError>)> {
        self.results.try_recv().ok()
    }

    /// Whether the committer thread ended (it only does when dropped, or
    /// when it panicked).
    pub(crate) fn is_dead(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Commits and waits for the result, at most `timeout` (after the
    /// asynchronous commits sent before it).
    pub(crate) fn commit_sync(
        &self,
        generation: Arc<Generation>,
        offsets: Offsets,
        timeout: Duration,
    ) -> std::result::Result<(), CommitError> {
        let (tx, rx) = mpsc::channel();
        if let Some(r) = &self.requests {
            let _ = r.send(CommitRequest { generation, offsets, reply: Some(tx) });
        }
        rx.recv_timeout(timeout).unwrap_or_else(|_| {
            Err(CommitError { kind: CommitFailure::Retriable, detail: format!("offset commit timed out after {timeout:?}") })
        })
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            // A request in flight ends within the connection's timeout.
            let _ = thread.join();
        }
    }
}

fn commit_once(
    brokers: &Brokers,
    group: &str,
    conn: &mut Option<Connection>,
    rotate: &mut usize,
    generation: &Generation,
    offsets: &[(String, i32, i64)],
) -> std::result::Result<(), CommitError> {
    let failed = |e: crate::error::Error| {
        // TLS and SASL passed the startup check: a refusal now is most
        // likely a broker restarting (retried up to task_timeout).
        let kind = match e {
            crate::error::Error::BrokerUnreachable { .. }
            | crate::error::Error::Tls { .. }
            | crate::error::Error::Authentication { .. } => CommitFailure::Retriable,
            _ => CommitFailure::Fatal,
        };
        CommitError { kind, detail: e.to_string() }
    };
    if conn.is_none() {
        *rotate += 1;
        *conn = Some(brokers.coordinator(group, *rotate).map_err(failed)?);
    }
    let results = match commit(conn.as_mut().expect("connected"), group, generation, offsets) {
        Ok(r) => r,
        Err(e) => {
            *conn = None;
            return Err(failed(e));
        }
    };
    let refused = results.iter().find_map(|((topic, p), e)| e.map(|e| (topic, p, e)));
    match refused {
        None => Ok(()),
        Some((topic, p, e)) => {
            if matches!(e, ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) {
                *conn = None;
            }
            Err(CommitError {
                kind: classify(e),
                detail: format!("offset commit of {topic} [{p}] refused under generation {}: {e}", generation.id),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_changes_retriable_and_fatal_refusals_are_told_apart() {
        use ResponseError as R;
        for e in [R::IllegalGeneration, R::UnknownMemberId, R::RebalanceInProgress, R::FencedInstanceId] {
            assert_eq!(classify(e), CommitFailure::GroupChanged, "{e:?}");
        }
        for e in [R::NotCoordinator, R::CoordinatorNotAvailable, R::CoordinatorLoadInProgress, R::RequestTimedOut] {
            assert_eq!(classify(e), CommitFailure::Retriable, "{e:?}");
        }
        for e in [R::GroupAuthorizationFailed, R::TopicAuthorizationFailed, R::OffsetMetadataTooLarge] {
            assert_eq!(classify(e), CommitFailure::Fatal, "{e:?}");
        }
    }
}
