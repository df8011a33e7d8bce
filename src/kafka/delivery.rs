//! Delivery bookkeeping: each changelog partition's (and the outputs')
//! tracker, and the librdkafka delivery callback that counts every report
//! on its tracker and wakes a waiting flush.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::ProducerContext;
use rdkafka::{ClientContext, Message};

use crate::error::{ClientError, Error, Result};

/// Delivery bookkeeping of one changelog partition, or of the output
/// records sent since a commit (partition -1, any topics).
///
/// The sending thread and the delivery thread each write their own
/// counters, so that a record costs no cache line passed between cores.
#[derive(Debug)]
pub(crate) struct DeliveryTracker {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    /// Its slot in [`DeliveryContext`]'s registry: the delivery opaque.
    pub(super) slot: usize,
    /// Records sent (by the one thread that commits at a time).
    pub(super) sent: Padded<AtomicU64>,
    /// Records acknowledged or failed (by the delivery thread; records that
    /// could not be queued, by the sender).
    pub(super) delivered: AtomicU64,
    pub(super) last_acked: AtomicI64,
    /// Acknowledgements since the last [`DeliveryTracker::take_acked_count`].
    pub(super) acked: AtomicU64,
    /// The first delivery failure: the error, and the record's topic and
    /// partition (an output tracker's records go to many).
    pub(super) failure: Mutex<Option<(KafkaError, String, i32)>>,
}

/// Trackers by slot, and the slots free for reuse.
#[derive(Default)]
pub(super) struct Registry {
    pub(super) slots: Vec<Option<Arc<DeliveryTracker>>>,
    pub(super) free: Vec<usize>,
}

/// Keeps a value on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

impl DeliveryTracker {
    /// After a flush: the offset of the last acknowledged record (or `None`
    /// if nothing was ever acknowledged), or the first delivery failure.
    pub(crate) fn settle(&self) -> Result<Option<i64>> {
        if let Some((e, _, _)) = self.failure.lock().expect("tracker lock").clone() {
            return Err(Error::ChangelogDelivery {
                topic: self.topic.clone(),
                partition: self.partition,
                source: ClientError::new(e),
            });
        }
        if self.delivered.load(Ordering::Acquire) != self.sent.0.load(Ordering::Acquire) {
            return Err(Error::CommitTimeout(Duration::ZERO));
        }
        let last = self.last_acked.load(Ordering::Acquire);
        Ok((last >= 0).then_some(last))
    }

    /// After a flush, for the outputs' tracker: the first output that could
    /// not be delivered, as [`Error::OutputDelivery`].
    pub(crate) fn settle_outputs(&self) -> Result<()> {
        match self.failure.lock().expect("tracker lock").clone() {
            Some((source, topic, partition)) => {
                Err(Error::OutputDelivery { topic, partition: (partition >= 0).then_some(partition), source: ClientError::new(source) })
            }
            None => Ok(()),
        }
    }

    /// Whether records of this tracker are queued and not yet delivered.
    pub(crate) fn in_flight(&self) -> bool {
        self.delivered.load(Ordering::Acquire) != self.sent.0.load(Ordering::Acquire)
    }

    /// Whether any record was sent through this tracker (or refused).
    pub(crate) fn used(&self) -> bool {
        self.sent.0.load(Ordering::Acquire) > 0
    }

    /// How many records were acknowledged since the last call.
    pub(crate) fn take_acked_count(&self) -> u64 {
        self.acked.swap(0, Ordering::AcqRel)
    }
}

/// Routes delivery reports back to their partition's tracker (the opaque of
/// each record is its tracker's slot) and counts deliveries, so that a
/// commit can wait for exactly the records sent before it.
pub(crate) struct DeliveryContext {
    /// The trackers of open stores, by slot.
    pub(super) trackers: RwLock<Registry>,
    /// Records sent (by the one thread that commits at a time).
    pub(super) sent: Padded<AtomicU64>,
    /// Records acknowledged or failed (as the tracker's `delivered`).
    pub(super) delivered: Padded<AtomicU64>,
    /// The `delivered` count a flush waits for (`u64::MAX`: none waits).
    pub(super) wanted: Padded<AtomicU64>,
    pub(super) lock: Mutex<()>,
    pub(super) settled: std::sync::Condvar,
}

impl Default for DeliveryContext {
    fn default() -> Self {
        DeliveryContext {
            trackers: RwLock::default(),
            sent: Padded::default(),
            delivered: Padded::default(),
            wanted: Padded(AtomicU64::new(u64::MAX)),
            lock: Mutex::default(),
            settled: std::sync::Condvar::default(),
        }
    }
}

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, slot: usize) {
        {
            let trackers = self.trackers.read().expect("tracker registry");
            // A slot is freed only once all its records were delivered.
            let tracker = trackers.slots[slot].as_ref().expect("a delivery for a registered tracker");
            match result {
                Ok(msg) => {
                    tracker.last_acked.fetch_max(msg.offset(), Ordering::AcqRel);
                    tracker.acked.fetch_add(1, Ordering::AcqRel);
                }
                Err((e, msg)) => {
                    let mut f = tracker.failure.lock().expect("tracker lock");
                    if f.is_none() {
                        tracing::error!(topic = %msg.topic(), partition = msg.partition(), error = %e,
                            "record not delivered; the next commit will fail");
                        *f = Some((e.clone(), msg.topic().to_string(), msg.partition()));
                    }
                }
            }
            tracker.delivered.fetch_add(1, Ordering::AcqRel);
        }
        // SeqCst pairs with `flush`: either it sees this delivery, or this
        // sees what it waits for and wakes it (under the lock it waits with).
        let delivered = self.delivered.0.fetch_add(1, Ordering::SeqCst) + 1;
        if delivered >= self.wanted.0.load(Ordering::SeqCst) {
            let _guard = self.lock.lock().expect("delivery lock");
            self.settled.notify_all();
        }
    }
}
