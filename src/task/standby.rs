//! Standby tasks: copies of other members' stores, opened like active tasks
//! and followed by the restore thread until promoted, dropped or reopened.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::restore::RestoreJob;
use crate::store::KeyValueStore;

use super::opening::MAX_OPENING;
use super::{standby_span, Task, TaskManager, TaskState};

/// A standby task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standby {
    /// Its stores are being opened (or will be, from `open_at`).
    Opening { incarnation: u64, open_at: Option<Instant> },
    /// The restore thread follows its changelogs.
    Following,
}

/// How long a standby whose follow failed waits before it is reopened.
pub(super) const STANDBY_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The standby tasks of this member.
#[derive(Default)]
pub(super) struct Standbys {
    /// Standby tasks by partition.
    pub(super) tasks: BTreeMap<i32, Standby>,
    /// The standby tasks the current assignment gives this member.
    pub(super) target: BTreeSet<i32>,
}

impl TaskManager {
    /// The standby tasks the current assignment gives this member (applied
    /// by [`TaskManager::update_standbys`]; a task revoked meanwhile that is
    /// among them stays open as a standby).
    pub(crate) fn set_standby_target(&mut self, target: BTreeSet<i32>) {
        self.standbys.target = target;
    }

    /// Brings the standby tasks in line with the target: opens new ones
    /// (off the processing thread, at most [`MAX_OPENING`] at once with the
    /// active tasks), closes those no longer wanted. A task that is active
    /// here is never a standby.
    pub(crate) fn update_standbys(&mut self) -> Result<()> {
        let actives = self.partitions();
        let wanted: BTreeSet<i32> = self.standbys.target.difference(&actives).copied().collect();
        let dropped: Vec<(i32, Standby)> =
            self.standbys.tasks.iter().filter(|(p, _)| !wanted.contains(p) && !actives.contains(p)).map(|(p, s)| (*p, *s)).collect();
        let mut stores = Vec::new();
        for (p, state) in dropped {
            self.standbys.tasks.remove(&p);
            if state == Standby::Following {
                if let Some(job) = self.restorer.cancel(p) {
                    stores.extend(job.stores);
                }
            }
            self.standby_span(p).in_scope(|| tracing::info!(partition = p, "standby task dropped"));
        }
        self.closer.close(stores);
        let now = Instant::now();
        for p in wanted {
            if !self.standbys.tasks.contains_key(&p) {
                let incarnation = self.incarnation();
                self.standbys.tasks.insert(p, Standby::Opening { incarnation, open_at: Some(now) });
            }
        }
        let free = MAX_OPENING.saturating_sub(self.openers.running);
        let due: Vec<(i32, u64)> = self
            .standbys
            .tasks
            .iter_mut()
            .filter_map(|(p, s)| match s {
                Standby::Opening { incarnation, open_at } if open_at.is_some_and(|at| at <= now) => {
                    *open_at = None;
                    Some((*p, *incarnation))
                }
                _ => None,
            })
            .take(free)
            .collect();
        for (p, incarnation) in due {
            self.start_opening(p, incarnation, None)?;
        }
        Ok(())
    }

    /// A new active `task` that is a standby here is promoted in place: its
    /// stores are open and nearly up to date, so the restore replays only
    /// its lag. At-least-once the stores go to the restore at once;
    /// exactly-once, or with a table, they are returned, to be restored
    /// once the committed offsets are read (as an opened task's are).
    pub(super) fn promote_standby(&mut self, task: &mut Task) -> Option<Vec<KeyValueStore>> {
        let p = task.partition;
        if self.standbys.tasks.remove(&p) != Some(Standby::Following) {
            return None;
        }
        let job = self.restorer.cancel(p)?;
        let _in_task = task.span.clone().entered();
        if job.stores.iter().any(|s| s.engine().is_remote_follower()) {
            // Its readers close; the task opens its databases as their
            // writer (fencing the last owner) and replays the changelog
            // past what they hold, with the caches the readers warmed.
            // (Closed here, not by the closer: a reader closes in
            // moments, and the task's opening takes the directory lock next.)
            tracing::info!(partition = p, "standby of remote stores promoted to active; opening its databases for writing");
            drop(job.stores);
            return None;
        }
        tracing::info!(partition = p, "standby promoted to active; restoring only its lag");
        task.open_at = None;
        if self.exactly_once() || self.config.has_tables {
            // Its restore waits for stable offsets, as an opened task's
            // does (a table's restore ends at the committed offset).
            return Some(job.stores);
        }
        task.state = TaskState::Restoring;
        self.restorer.submit(RestoreJob { partition: p, stores: job.stores, standby: false, span: task.span.clone() });
        None
    }

    /// The tracing span of standby task `p` (see [`standby_span`]).
    pub(super) fn standby_span(&self, p: i32) -> tracing::Span {
        standby_span(&self.config.application_id, p)
    }
}
