//! The TTL sweep of running tasks' stores (architecture.md §6): a step
//! each second per store with a TTL, sized so that a full pass over the
//! store takes at most its `ttl_cleanup_interval`.

use std::time::{Duration, Instant};

use crate::error::Result;

use super::{TaskManager, TaskState};

/// How often each store takes a sweep step.
const STEP_EVERY: Duration = Duration::from_secs(1);
/// Entries a step reads at least.
const MIN_STEP: usize = 1_000;

impl TaskManager {
    /// Runs the TTL sweep steps that are due. A store failing here fails
    /// its task only, as any store fault.
    pub(crate) fn sweep_expired<C: rdkafka::consumer::ConsumerContext>(
        &mut self,
        consumer: &rdkafka::consumer::BaseConsumer<C>,
    ) -> Result<()> {
        // Nothing is written while an exactly-once commit waits for the
        // group's new generation (back-pressure says so too) or at the
        // bound on uncommitted bytes.
        if !self.config.stores.iter().any(|s| s.time_to_live().is_some()) || self.last_sweep.elapsed() < STEP_EVERY || self.backpressure() {
            return Ok(());
        }
        self.last_sweep = Instant::now();
        let mut failed = Vec::new();
        for task in self.tasks.values_mut().filter(|t| t.state == TaskState::Running) {
            for (store, def) in task.stores.iter_mut().zip(&self.config.stores) {
                if !store.has_ttl() {
                    continue;
                }
                let steps = (def.cleanup_interval().as_secs_f64() / STEP_EVERY.as_secs_f64()).max(1.0);
                let budget = ((store.approximate_num_entries() as f64 / steps).ceil() as usize).max(MIN_STEP);
                if let Err(e) = store.sweep_expired(budget) {
                    failed.push((task.partition, e));
                    break;
                }
            }
        }
        // One at a time: under exactly-once re-initialising one task
        // re-initialises every running task; another failing store fails
        // again at its next step.
        if let Some((partition, e)) = failed.into_iter().next() {
            self.reinitialise(consumer, partition, e)?;
        }
        Ok(())
    }
}
