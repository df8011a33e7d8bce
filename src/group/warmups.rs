//! A member's warmups (KIP-441): the tasks warming up here, how long each
//! took to arrive, and the check that asks for the rebalance that moves
//! them once caught up.

use std::collections::{BTreeMap, BTreeSet};
use std::thread::JoinHandle;
use std::time::Instant;

use super::assignor::TaskId;
use super::end_offsets::end_offsets;
use super::member::Member;
use super::payload::MemberTasks;
use crate::error::Result;

/// A member's warmup state (KIP-441): the warmups of this generation, the
/// tasks that move here once caught up, and the probe of their lag.
#[derive(Default)]
pub(super) struct Warmups {
    /// Warmup tasks of the current generation.
    pub(super) tasks: BTreeSet<TaskId>,
    /// Tasks that move here once this member's copy caught up (warmups and
    /// standbys the balance wants here).
    pub(super) awaited: BTreeSet<TaskId>,
    /// When each task on its way here (warmup or pending) started warming up.
    pub(super) warming_since: BTreeMap<TaskId, Instant>,
    /// When to rejoin for a probing rebalance (the leader's assignment says).
    pub(super) probe_at: Option<Instant>,
    /// This generation's warmups were found caught up and a rebalance asked for.
    pub(super) reported: bool,
    /// The tasks this member last found caught up (told to the leader in
    /// its next subscription).
    pub(super) caught_up: BTreeSet<TaskId>,
    /// End offsets being read for the warmup check.
    pub(super) lag_probe: Option<JoinHandle<Result<BTreeMap<TaskId, i64>>>>,
}

impl Member {
    /// Measures how long each task took to arrive here: from its first
    /// warmup (or pending handover) to the assignment that makes it active.
    pub(super) fn track_moves(&mut self, tasks: &MemberTasks) {
        let now = Instant::now();
        for &t in &tasks.active {
            if let Some(since) = self.warmups.warming_since.remove(&t) {
                let took = now.duration_since(since);
                metrics::histogram!(crate::metrics::TASK_MOVE_SECONDS).record(took.as_secs_f64());
                tracing::info!(group = %self.settings.group, task = t, took = ?took, "task moved here after warming up");
            }
        }
        for &t in tasks.awaited.iter().chain(&tasks.pending) {
            self.warmups.warming_since.entry(t).or_insert(now);
        }
        self.warmups.warming_since.retain(|t, _| tasks.awaited.contains(t) || tasks.pending.contains(t));
        for t in self.warmups.tasks.difference(&tasks.warmup) {
            metrics::gauge!(crate::metrics::WARMUP_LAG, "partition" => t.to_string()).set(0.0);
        }
    }

    /// Whether this member's copy of every task awaited here is within the
    /// acceptable lag: then it asks for the rebalance that moves them
    /// (instead of waiting for the probing interval). `None`: not yet, or
    /// the end offsets are not available now (checked again later).
    pub(super) fn warmups_caught_up(&mut self) -> Option<String> {
        let tasks: Vec<TaskId> = self.warmups.awaited.iter().copied().collect();
        // The end offsets come from a thread of their own: connections to
        // brokers that are away must not hold back this thread's heartbeats.
        let ends = match self.warmups.lag_probe.take() {
            None => {
                let (brokers, wanted, start) = (self.brokers.clone(), tasks.clone(), self.rotate);
                let (group, topics, tables) =
                    (self.settings.group.clone(), self.settings.changelog_topics.clone(), self.settings.table_topics.clone());
                self.warmups.lag_probe = std::thread::Builder::new()
                    .name("kstate-lags".into())
                    .spawn(move || end_offsets(&brokers, (&group, &topics, &tables), &wanted, start))
                    .ok();
                return None;
            }
            Some(probe) if !probe.is_finished() => {
                self.warmups.lag_probe = Some(probe);
                return None;
            }
            Some(probe) => match probe.join() {
                Ok(Ok(ends)) if tasks.iter().all(|t| ends.contains_key(t)) => ends,
                Ok(Ok(_)) => return None, // measured for an earlier set of tasks
                Ok(Err(e)) => {
                    self.rotate += 1;
                    tracing::debug!(group = %self.settings.group, error = %e, "warmup lags not measured this time");
                    return None;
                }
                Err(_) => return None,
            },
        };
        let local = (self.local)();
        let mut lags = BTreeMap::new();
        for &t in &tasks {
            let lag = (ends[&t] - local.get(&t).copied().unwrap_or(0)).max(0) as u64;
            if self.warmups.tasks.contains(&t) {
                metrics::gauge!(crate::metrics::WARMUP_LAG, "partition" => t.to_string()).set(lag as f64);
            }
            lags.insert(t, lag);
        }
        // Half the acceptable lag: the leader measures a moment later, with
        // more input in the changelogs, and must still find the copy caught up.
        if lags.values().all(|&l| l <= self.settings.acceptable_recovery_lag / 2) {
            tracing::info!(group = %self.settings.group, lags = ?lags, "warmups caught up; asking for a rebalance to move their tasks");
            // The leader measures later, with more input in the changelogs:
            // it takes this member's word that these copies are caught up.
            self.warmups.caught_up = lags.keys().copied().collect();
            Some(format!("warmups caught up: {lags:?}"))
        } else {
            tracing::debug!(group = %self.settings.group, lags = ?lags, "warmups not caught up yet");
            None
        }
    }
}
