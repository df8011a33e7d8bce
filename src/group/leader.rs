//! The leader's assignment step, run between JoinGroup and SyncGroup: read
//! every member's subscription and the changelogs' end offsets, run the
//! assignor, withhold tasks that move until released, and encode each
//! member's tasks for SyncGroup.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::protocol::StrBytes;

use super::assignor::{self, MemberState, TaskId};
use super::end_offsets::end_offsets;
use super::member::Member;
use super::payload::{AssignmentError, HostTasks, MemberTasks, PeerInfo, Subscription, USER_DATA_VERSION};

impl Member {
    /// The leader's part: every member's tasks, encoded for SyncGroup.
    pub(super) fn assign(&self, members: &[kafka_protocol::messages::join_group_response::JoinGroupResponseMember]) -> Vec<SyncGroupRequestAssignment> {
        let mut states = Vec::new();
        let mut version = USER_DATA_VERSION;
        let mut mismatch = false;
        let mut claims: BTreeMap<TaskId, Vec<String>> = BTreeMap::new();
        let mut pending: Vec<(usize, BTreeSet<TaskId>)> = Vec::new();
        let mut endpoints: BTreeMap<String, String> = BTreeMap::new();
        let mut peers: Vec<PeerInfo> = Vec::new();
        for m in members {
            let id = m.member_id.to_string();
            match Subscription::decode(m.metadata.clone()) {
                Ok(s) => {
                    version = version.min(s.info.latest_supported_version);
                    if s.topics != self.settings.topics {
                        tracing::error!(member = %id, topics = ?s.topics, ours = ?self.settings.topics, "a member subscribes to other topics");
                        mismatch = true;
                    }
                    for t in &s.owned {
                        claims.entry(*t).or_default().push(id.clone());
                    }
                    pending.push((states.len(), s.info.pending));
                    if let Some(endpoint) = s.info.endpoint {
                        endpoints.insert(id.clone(), endpoint);
                    }
                    if let Some(address) = s.info.peer {
                        let instance_id = m.group_instance_id.as_ref().map(|i| i.to_string());
                        peers.push(PeerInfo { member_id: id.clone(), instance_id, address });
                    }
                    states.push(MemberState {
                        member_id: id,
                        prev_active: s.owned,
                        prev_standby: s.info.standby,
                        task_offsets: s.info.task_offsets,
                        caught_up: s.info.caught_up,
                        client_tags: s.info.client_tags,
                    });
                }
                Err(e) => {
                    tracing::warn!(member = %id, error = %e, "a member's subscription cannot be read; it gets no tasks");
                    for t in super::payload::owned_tasks(m.metadata.clone()) {
                        claims.entry(t).or_default().push(id.clone());
                    }
                    states.push(MemberState {
                        member_id: id,
                        prev_active: BTreeSet::new(),
                        prev_standby: BTreeSet::new(),
                        task_offsets: BTreeMap::new(),
                        caught_up: BTreeSet::new(),
                        client_tags: BTreeMap::new(),
                    });
                }
            }
        }
        // A task handed over between two rounds counts as its new owner's,
        // unless some member still claims it.
        for (i, tasks) in pending {
            let unclaimed = tasks.into_iter().filter(|t| !claims.contains_key(t));
            states[i].prev_active.extend(unclaimed);
        }
        let config = assignor::AssignorConfig {
            num_standby_replicas: self.settings.num_standby_replicas,
            acceptable_recovery_lag: self.settings.acceptable_recovery_lag,
            max_warmup_replicas: self.settings.max_warmup_replicas,
        };
        let all_tasks: Vec<TaskId> = (0..self.settings.tasks).collect();
        let topics = (self.settings.group.as_str(), &self.settings.changelog_topics[..], &self.settings.table_topics[..]);
        let ends = match end_offsets(&self.brokers, topics, &all_tasks, self.rotate) {
            Ok(ends) => ends,
            Err(e) => {
                // Lags then count from the most caught-up copy reported.
                tracing::warn!(group = %self.settings.group, error = %e,
                    "the changelogs' end offsets could not be read; lags are measured against the most caught-up member");
                BTreeMap::new()
            }
        };
        let assignor::Plan { members: mut plan, deferred } = assignor::assign(self.settings.tasks, &states, &config, &ends);
        // Cooperative: a task that moves is withheld from its new owner
        // until every previous owner gave it up (they rejoin at once).
        let mut withheld: BTreeMap<String, BTreeSet<TaskId>> = BTreeMap::new();
        for (member, tasks) in plan.iter_mut() {
            tasks.active.retain(|t| {
                let others = claims.get(t).is_some_and(|c| c.iter().any(|owner| owner != member));
                if others {
                    withheld.entry(member.clone()).or_default().insert(*t);
                }
                !others
            });
        }
        let summary: BTreeMap<&str, String> = plan
            .iter()
            .map(|(m, a)| {
                let mut s = format!("active {:?}", a.active);
                if !a.standby.is_empty() {
                    s += &format!(" standby {:?}", a.standby);
                }
                if !a.warmup.is_empty() {
                    s += &format!(" warmup {:?}", a.warmup);
                }
                if let Some(w) = withheld.get(m) {
                    s += &format!(" handed over next round {w:?}");
                }
                (m.as_str(), s)
            })
            .collect();
        let waiting: Vec<String> = deferred
            .iter()
            .map(|d| {
                format!(
                    "task {} stays on {} (lag {}) until {} (lag {}) {}",
                    d.task,
                    d.kept_on,
                    d.kept_lag,
                    d.target,
                    d.target_lag,
                    if d.warmup { "warms up" } else { "can warm up" }
                )
            })
            .collect();
        tracing::info!(group = %self.settings.group, generation = self.generation, members = states.len(),
            assignment = ?summary, deferred_moves = ?waiting, "assignment computed");
        // Where every task is served, for interactive queries.
        let hosts: Vec<HostTasks> = endpoints
            .iter()
            .map(|(member, endpoint)| {
                let tasks = plan.get(member).cloned().unwrap_or_default();
                let mut standby: BTreeSet<TaskId> = tasks.standby.union(&tasks.warmup).copied().collect();
                standby.extend(withheld.get(member).into_iter().flatten());
                HostTasks { endpoint: endpoint.clone(), active: tasks.active, standby }
            })
            .collect();
        // The leader's own assignment carries the probing deadline.
        let probe_in_ms = (!deferred.is_empty()).then_some(self.settings.probing_rebalance_interval.as_millis() as u64);
        states
            .iter()
            .map(|m| {
                let tasks = plan.get(&m.member_id).cloned().unwrap_or_default();
                let pending = withheld.get(&m.member_id).cloned().unwrap_or_default();
                // The receiver warms a withheld task up as a standby, so it
                // is promoted in place in the next round.
                let standby = tasks.standby.union(&pending).copied().collect();
                let probe_in_ms = if m.member_id == self.member_id { probe_in_ms } else { None };
                let awaited = deferred
                    .iter()
                    .filter(|d| d.target == m.member_id && (d.warmup || tasks.standby.contains(&d.task)))
                    .map(|d| d.task)
                    .collect();
                let rejoin_now = !withheld.is_empty();
                let mut tasks = MemberTasks {
                    active: tasks.active,
                    standby,
                    pending,
                    warmup: tasks.warmup,
                    awaited,
                    rejoin_now,
                    probe_in_ms,
                    error: 0,
                    hosts: hosts.clone(),
                    peers: peers.clone(),
                };
                if mismatch {
                    tasks = MemberTasks { error: AssignmentError::MismatchedTopics as u16, ..MemberTasks::default() };
                }
                let mut a = SyncGroupRequestAssignment::default();
                a.member_id = StrBytes::from_string(m.member_id.clone());
                a.assignment = tasks.encode(&self.settings.topics, version);
                a
            })
            .collect()
    }
}
