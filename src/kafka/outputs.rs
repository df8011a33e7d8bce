//! The processor's output records on their way out: kstate's producer and
//! the delivery tracker of the outputs sent since the last commit (or a
//! test driver's topics in memory).

use std::sync::Arc;

use super::{ChangelogProducer, DeliveryTracker, MemoryTopics};
use crate::error::Result;
use crate::output::Output;

/// kstate's producer and the tracker that counts the deliveries of the
/// outputs sent since the last commit. Each commit takes the tracker of its
/// outputs ([`OutputSink::rotate`]) and waits for exactly those records:
/// the producer's own count mixes them with outputs sent meanwhile.
pub(crate) enum OutputSink {
    Producer { producer: Arc<ChangelogProducer>, current: Arc<DeliveryTracker> },
    /// A test driver's: outputs are kept in memory.
    Memory(Arc<MemoryTopics>),
}

impl OutputSink {
    pub(crate) fn new(producer: Arc<ChangelogProducer>) -> Self {
        let current = producer.tracker(OUTPUTS.into(), -1);
        OutputSink::Producer { producer, current }
    }

    /// Queues `output` (timestamp `default_timestamp` unless it has one).
    pub(crate) fn send(&self, output: &Output<'_>, default_timestamp: Option<i64>) -> Result<()> {
        match self {
            OutputSink::Producer { producer, current } => producer.send_output(current, output, default_timestamp),
            OutputSink::Memory(topics) => {
                topics.send_output(output, default_timestamp);
                Ok(())
            }
        }
    }

    /// The outputs sent so far, for a commit: `None` if there were none;
    /// else their tracker, and later outputs go to a fresh one. The commit
    /// settles the tracker, then releases its slot on the producer.
    pub(crate) fn rotate(&mut self) -> Option<Arc<DeliveryTracker>> {
        let OutputSink::Producer { producer, current } = self else { return None };
        if !current.used() {
            return None;
        }
        let fresh = producer.tracker(OUTPUTS.into(), -1);
        Some(std::mem::replace(current, fresh))
    }

    /// Exactly-once, after an abort: later outputs go to a fresh tracker,
    /// so that the aborted outputs' failures (purged from the queue) do
    /// not fail the next commit. The old tracker's slot is freed once its
    /// deliveries are all reported (else it stays registered: they need it).
    pub(crate) fn reset(&mut self) {
        let OutputSink::Producer { producer, current } = self else { return };
        let fresh = producer.tracker(OUTPUTS.into(), -1);
        let old = std::mem::replace(current, fresh);
        producer.release(&old);
    }
}

/// The outputs' trackers' name in logs.
const OUTPUTS: &str = "(output records)";
