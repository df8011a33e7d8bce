//! Applying the membership's events: where an assignment (or the loss of
//! every task) reaches the task manager and the consumer.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::TopicPartitionList;

use crate::store::published::{Hosts, RunState};
use crate::assignment::AssignmentEvent;
use crate::config::AppConfig;
use crate::error::{Error, Result};
use crate::group::{GroupEvent, Membership};
use crate::task::TaskManager;

use super::queues::RecordQueues;
use super::RuntimeContext;

/// Input partitions of `tasks`: partition `p` of every input topic.
fn input_partitions_of(topics: &[String], tasks: impl IntoIterator<Item = i32> + Clone) -> Vec<(String, i32)> {
    topics.iter().flat_map(|t| tasks.clone().into_iter().map(move |p| (t.clone(), p))).collect()
}

fn tpl_of(tps: &[(String, i32)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in tps {
        tpl.add_partition(t, *p);
    }
    tpl
}

/// Applies what the membership reports: a new generation's tasks (revoked
/// ones committed under it and closed, new ones assigned paused until
/// restored), or the loss of every active task (closed without commit).
/// Every event is acknowledged once applied: the membership rejoins only
/// after that.
pub(super) fn apply_group_events(
    membership: &Membership,
    consumer: &BaseConsumer<RuntimeContext>,
    records: &RecordQueues,
    tasks: &mut TaskManager,
    config: &AppConfig,
    before_revoke: &mut dyn FnMut(&mut TaskManager, &[i32]),
) -> Result<()> {
    let topics = config.input_topics.as_slice();
    loop {
        let event = match membership.events.try_recv() {
            Ok(event) => event,
            Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(()),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                return Err(Error::GroupMembership {
                    group: config.application_id.clone(),
                    detail: "the group membership thread stopped unexpectedly".into(),
                })
            }
        };
        match event {
            GroupEvent::Assigned { generation, active, standby, since, hosts } => {
                config.published.set_hosts(Hosts { hosts });
                config.published.set_state(RunState::Running);
                // Revocations, commits and closes of this rebalance log in its span.
                let _in_rebalance = tracing::info_span!("rebalance", app = %tasks.application_id(), generation = generation.id).entered();
                let owned = tasks.partitions();
                tasks.set_generation(Some(generation.clone()));
                // Exactly-once: a commit caught by this rebalance completes
                // under the new generation, before anything is revoked.
                let parked = tasks.complete_parked(consumer);
                tasks.set_standby_target(standby.clone());
                let revoked: Vec<i32> = owned.difference(&active).copied().collect();
                let new: Vec<i32> = active.difference(&owned).copied().collect();
                tracing::info!(generation = generation.id, active = ?active, standby = ?standby, revoked = ?revoked, new = ?new,
                    "applying the group's assignment");
                if !revoked.is_empty() {
                    // The processors' close, before the closing commit takes its writes.
                    before_revoke(tasks, &revoked);
                    records.forget(revoked.iter().copied());
                    let tps = input_partitions_of(topics, revoked);
                    let committed = tasks.on_event(consumer, AssignmentEvent::Revoked(tps.clone()));
                    if let Err(e) = consumer.incremental_unassign(&tpl_of(&tps)) {
                        tracing::warn!(error = %e, "unassigning revoked partitions failed");
                    }
                    committed?;
                }
                if !new.is_empty() {
                    let tps = input_partitions_of(topics, new);
                    // Before the assignment takes effect, so no record of
                    // these partitions reaches the consumer queue first.
                    for (topic, p) in &tps {
                        if !records.forward_partition(consumer, topic, *p) {
                            tracing::warn!(%topic, partition = p, "cannot forward the partition to the record queue; reading it one record at a time");
                        }
                    }
                    let tpl = tpl_of(&tps);
                    consumer.incremental_assign(&tpl)?;
                    // No record of a new partition may be processed before
                    // its restore ends: paused until it runs.
                    consumer.pause(&tpl)?;
                    tasks.on_event(consumer, AssignmentEvent::Assigned(tps))?;
                }
                membership.applied();
                parked?;
                metrics::counter!(crate::metrics::REBALANCES).increment(1);
                metrics::histogram!(crate::metrics::REBALANCE_SECONDS).record(since.elapsed().as_secs_f64());
                metrics::gauge!(crate::metrics::GROUP_GENERATION).set(generation.id as f64);
                metrics::gauge!(crate::metrics::TASKS, "role" => "active").set(active.len() as f64);
                metrics::gauge!(crate::metrics::TASKS, "role" => "standby").set(standby.len() as f64);
            }
            GroupEvent::Lost { reason } => {
                let _in_rebalance = tracing::info_span!("rebalance", app = %tasks.application_id(), lost = true).entered();
                let tps = input_partitions_of(topics, tasks.partitions());
                tracing::warn!(%reason, partitions = ?tps, "tasks lost; closing them without commit");
                tasks.set_generation(None);
                config.published.set_hosts(Hosts::default());
                records.forget(tasks.partitions());
                let closed = tasks.on_event(consumer, AssignmentEvent::Lost(tps.clone()));
                if let Err(e) = consumer.incremental_unassign(&tpl_of(&tps)) {
                    tracing::warn!(error = %e, "unassigning lost partitions failed");
                }
                membership.applied();
                closed?;
            }
            GroupEvent::Failed(e) => return Err(e),
        }
    }
}
