//! The processor's output records on their way out: kstate's producer and
//! the delivery tracker of the outputs sent since the last commit (or a
//! test driver's topics in memory).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{ChangelogProducer, DeliveryTracker, MemoryTopics};
use crate::error::Result;
use crate::output::Output;

/// kstate's producer and the tracker that counts the deliveries of the
/// outputs sent since the last commit. Each commit takes the tracker of its
/// outputs ([`OutputSink::rotate`]) and waits for exactly those records:
/// the producer's own count mixes them with outputs sent meanwhile.
pub(crate) enum OutputSink {
    Producer { producer: Arc<ChangelogProducer>, current: Arc<DeliveryTracker>, held: Held },
    /// A test driver's: outputs are kept in memory.
    Memory(Arc<MemoryTopics>),
}

impl OutputSink {
    pub(crate) fn new(producer: Arc<ChangelogProducer>) -> Self {
        let current = producer.tracker(OUTPUTS.into(), -1);
        OutputSink::Producer { producer, current, held: Held::default() }
    }

    /// Queues `output` (timestamp `default_timestamp` unless it has one),
    /// or holds it while the previous transaction commits ([`OutputSink::hold`]).
    pub(crate) fn send(&self, output: &Output<'_>, default_timestamp: Option<i64>) -> Result<()> {
        match self {
            OutputSink::Producer { producer, current, held } => {
                if held.holding.load(Ordering::Acquire) {
                    let mut buffer = held.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some(buffer) = buffer.as_mut() {
                        buffer.push(output, default_timestamp);
                        return Ok(());
                    }
                }
                producer.send_output(current, output, default_timestamp)
            }
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
        let OutputSink::Producer { producer, current, .. } = self else { return None };
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
    /// Held outputs are dropped too.
    pub(crate) fn reset(&mut self) {
        self.drop_held();
        let OutputSink::Producer { producer, current, .. } = self else { return };
        let fresh = producer.tracker(OUTPUTS.into(), -1);
        let old = std::mem::replace(current, fresh);
        producer.release(&old);
    }

    /// Exactly-once, as a transaction starts committing off the processing
    /// thread: later outputs are copied into memory instead of sent, since
    /// they belong to the next transaction, which cannot begin before this
    /// one ends (docs/architecture.md, "Under exactly-once", 3a).
    /// [`OutputSink::release`] sends them.
    pub(crate) fn hold(&self) {
        let OutputSink::Producer { held, .. } = self else { return };
        let mut buffer = held.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        buffer.get_or_insert_with(HeldOutputs::default);
        held.holding.store(true, Ordering::Release);
    }

    /// The bytes of the outputs held, if any are.
    pub(crate) fn held(&self) -> Option<usize> {
        let OutputSink::Producer { held, .. } = self else { return None };
        if !held.holding.load(Ordering::Acquire) {
            return None;
        }
        let buffer = held.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        buffer.as_ref().filter(|b| !b.records.is_empty()).map(|b| b.bytes.len() + b.records.len() * std::mem::size_of::<HeldRecord>())
    }

    /// Drops the held outputs (their records are processed again: every
    /// running task is being re-initialised) and stops holding.
    pub(crate) fn drop_held(&self) {
        let OutputSink::Producer { held, .. } = self else { return };
        if let Some(dropped) = held.take().map(|b| b.records.len()).filter(|&n| n > 0) {
            tracing::debug!(outputs = dropped, "outputs held for the next transaction dropped");
        }
    }

    /// Sends the held outputs, in the order they were sent, into the
    /// transaction that begins with them; later outputs are sent at once.
    /// A refused one fails the next commit, as a refused output does (the
    /// processor, long past it, is not told).
    pub(crate) fn release(&self) {
        let OutputSink::Producer { producer, current, held } = self else { return };
        let mut buffer = held.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held.holding.store(false, Ordering::Release);
        let Some(held) = buffer.take() else { return };
        held.for_each(|output| {
            if let Err(e) = producer.send_output(current, output, None) {
                tracing::warn!(topic = %output.topic, error = %e, "a held output was refused; the next commit fails");
            }
        });
    }
}

/// See [`OutputSink::hold`]. `holding` is only ever changed by the thread
/// that commits, between processing passes; the buffer's lock serves
/// several processing threads.
#[derive(Default)]
pub(crate) struct Held {
    holding: AtomicBool,
    buffer: Mutex<Option<HeldOutputs>>,
}

impl Held {
    fn take(&self) -> Option<HeldOutputs> {
        self.holding.store(false, Ordering::Release);
        self.buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// Outputs copied into one buffer, in the order they were sent.
#[derive(Default)]
struct HeldOutputs {
    bytes: Vec<u8>,
    records: Vec<HeldRecord>,
    /// The topics named so far (an application writes to a few).
    topics: Vec<String>,
}

struct HeldRecord {
    topic: usize,
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
    partition: Option<i32>,
    /// Resolved when held: the default is the time of what was processed.
    timestamp: Option<i64>,
    headers: Vec<(String, Option<Range<usize>>)>,
}

impl HeldOutputs {
    fn push(&mut self, output: &Output<'_>, default_timestamp: Option<i64>) {
        let topic = match self.topics.iter().position(|t| t == output.topic) {
            Some(i) => i,
            None => {
                self.topics.push(output.topic.to_string());
                self.topics.len() - 1
            }
        };
        let mut copy = |b: &[u8]| {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(b);
            start..self.bytes.len()
        };
        let key = output.key.map(&mut copy);
        let value = output.value.map(&mut copy);
        let headers = output.headers.iter().map(|(n, v)| (n.to_string(), v.map(&mut copy))).collect();
        let record = HeldRecord { topic, key, value, partition: output.partition, timestamp: output.timestamp.or(default_timestamp), headers };
        self.records.push(record);
    }

    /// Each output held, in the order held.
    fn for_each(&self, mut f: impl FnMut(&Output<'_>)) {
        let slice = |r: &Range<usize>| &self.bytes[r.clone()];
        for record in &self.records {
            f(&Output {
                topic: &self.topics[record.topic],
                key: record.key.as_ref().map(slice),
                value: record.value.as_ref().map(slice),
                partition: record.partition,
                timestamp: record.timestamp,
                headers: record.headers.iter().map(|(n, v)| (n.as_str(), v.as_ref().map(slice))).collect(),
            });
        }
    }
}

/// The outputs' trackers' name in logs.
const OUTPUTS: &str = "(output records)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::SentRecord;

    fn sink() -> OutputSink {
        let mut config = rdkafka::config::ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:1"); // never reached: what is sent stays queued
        OutputSink::new(Arc::new(ChangelogProducer::new(config, 1_000_000, std::time::Duration::from_secs(1)).unwrap()))
    }

    /// Outputs handed to the producer through the current tracker.
    fn sent(sink: &OutputSink) -> u64 {
        let OutputSink::Producer { current, .. } = sink else { unreachable!() };
        current.sent.0.load(Ordering::Acquire)
    }

    #[test]
    fn held_outputs_come_back_as_they_were_sent_in_order() {
        let mut held = HeldOutputs::default();
        let outputs = [
            Output::to("a").key(b"k1").value(b"v1"),
            Output::to("b").value(b"v2").partition(3).timestamp(7).header("h", b"x").null_header("n"),
            Output::to("a").key(b"k3"),
        ];
        for o in &outputs {
            held.push(o, Some(5));
        }
        let mut back = Vec::new();
        held.for_each(|o| back.push(SentRecord::of_output(o, None)));
        let want: Vec<SentRecord> = outputs.iter().map(|o| SentRecord::of_output(o, Some(5))).collect();
        assert_eq!(back, want);
    }

    #[test]
    fn held_outputs_wait_for_the_release_and_an_abort_drops_them() {
        let mut sink = sink();
        sink.send(&Output::to("t").key(b"k").value(b"1"), Some(1)).unwrap();
        assert_eq!(sent(&sink), 1);
        sink.hold();
        assert_eq!(sink.held(), None, "nothing held yet");
        sink.send(&Output::to("t").key(b"k").value(b"2"), Some(2)).unwrap();
        sink.send(&Output::to("u").value(b"3").partition(0), None).unwrap();
        assert_eq!(sent(&sink), 1, "held, not sent");
        assert!(sink.held().is_some_and(|bytes| bytes >= 4));
        sink.release();
        assert_eq!((sent(&sink), sink.held()), (3, None));
        sink.send(&Output::to("t").value(b"4"), None).unwrap();
        assert_eq!(sent(&sink), 4, "sent at once after the release");
        // An abort while holding: the held outputs go with the transaction.
        sink.hold();
        sink.send(&Output::to("t").value(b"5"), None).unwrap();
        sink.reset();
        assert_eq!(sink.held(), None);
        sink.release();
        assert_eq!(sent(&sink), 0, "nothing of the aborted transaction is sent later");
    }
}
