//! The processor's output records on their way out: kstate's producer and
//! the delivery tracker of the outputs sent since the last commit.

use std::sync::Arc;

use super::{ChangelogProducer, DeliveryTracker};
use crate::error::Result;
use crate::output::Output;

/// kstate's producer and the tracker that counts the deliveries of the
/// outputs sent since the last commit. Each commit takes the tracker of its
/// outputs ([`OutputSink::rotate`]) and waits for exactly those records:
/// the producer's own count mixes them with outputs sent meanwhile.
pub(crate) struct OutputSink {
    producer: Arc<ChangelogProducer>,
    current: Arc<DeliveryTracker>,
}

impl OutputSink {
    pub(crate) fn new(producer: Arc<ChangelogProducer>) -> Self {
        let current = producer.tracker(OUTPUTS.into(), -1);
        OutputSink { producer, current }
    }

    /// Queues `output` (timestamp `default_timestamp` unless it has one).
    pub(crate) fn send(&self, output: &Output<'_>, default_timestamp: Option<i64>) -> Result<()> {
        self.producer.send_output(&self.current, output, default_timestamp)
    }

    /// The outputs sent so far, for a commit: `None` if there were none;
    /// else their tracker, and later outputs go to a fresh one. The commit
    /// settles the tracker, then releases its slot on the producer.
    pub(crate) fn rotate(&mut self) -> Option<Arc<DeliveryTracker>> {
        if !self.current.used() {
            return None;
        }
        let fresh = self.producer.tracker(OUTPUTS.into(), -1);
        Some(std::mem::replace(&mut self.current, fresh))
    }
}

impl OutputSink {
    /// Exactly-once, after an abort: later outputs go to a fresh tracker,
    /// so that the aborted outputs' failures (purged from the queue) do
    /// not fail the next commit. The old tracker's slot is freed once its
    /// deliveries are all reported (else it stays registered: they need it).
    pub(crate) fn reset(&mut self) {
        let fresh = self.producer.tracker(OUTPUTS.into(), -1);
        let old = std::mem::replace(&mut self.current, fresh);
        self.producer.release(&old);
    }
}

/// The outputs' trackers' name in logs.
const OUTPUTS: &str = "(output records)";
