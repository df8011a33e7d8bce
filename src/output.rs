//! Output records: what a processor sends to other topics as part of its
//! work (counts, joins, deduplicated events).
//!
//! Outputs go through kstate's producer (idempotent, `acks=all`) as soon
//! as the processor sends them. A commit waits until every output sent
//! before it was acknowledged, then commits the input offsets: after a
//! crash the records since the last commit are processed again and their
//! outputs sent again (duplicates are possible, loss is not: at-least-once).

use std::sync::Arc;

use crate::changelog::{ChangelogProducer, DeliveryTracker};
use crate::error::Result;

/// An output record, built with [`Output::to`] and sent with
/// [`ProcessorContext::send`](crate::ProcessorContext::send).
///
/// ```
/// # use kstate::Output;
/// let out = Output::to("counts").key(b"apple").value(b"3").header("source", b"kstate");
/// ```
#[derive(Debug, Clone)]
pub struct Output<'a> {
    pub(crate) topic: &'a str,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) value: Option<&'a [u8]>,
    pub(crate) partition: Option<i32>,
    pub(crate) timestamp: Option<i64>,
    pub(crate) headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

impl<'a> Output<'a> {
    /// A record for `topic`, without key or value yet. Its partition is
    /// chosen by the producer's partitioner: the murmur2 hash of the key, as
    /// Java clients and Kafka Streams do (a record without key goes to a
    /// random partition); `partitioner` in `kafka_config` changes it. Its
    /// timestamp is the input record's.
    pub fn to(topic: &'a str) -> Self {
        Output { topic, key: None, value: None, partition: None, timestamp: None, headers: Vec::new() }
    }

    /// The record key.
    pub fn key(mut self, key: &'a [u8]) -> Self {
        self.key = Some(key);
        self
    }

    /// The record value (without one the record is a tombstone).
    pub fn value(mut self, value: &'a [u8]) -> Self {
        self.value = Some(value);
        self
    }

    /// Sends to this partition instead of the partitioner's choice.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// The record timestamp, milliseconds since the epoch (default: the
    /// input record's timestamp, or the time of sending if it has none).
    pub fn timestamp(mut self, millis: i64) -> Self {
        self.timestamp = Some(millis);
        self
    }

    /// Adds a header (several with the same name are kept in order).
    pub fn header(mut self, name: &'a str, value: &'a [u8]) -> Self {
        self.headers.push((name, Some(value)));
        self
    }

    /// Adds a header without a value.
    pub fn null_header(mut self, name: &'a str) -> Self {
        self.headers.push((name, None));
        self
    }
}

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
