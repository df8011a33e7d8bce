//! Topics in memory, where the [`TestDriver`](crate::TestDriver)'s stores
//! and processors send what kstate's producer would send to Kafka: each
//! store partition's changelog records, and the output records (under
//! exactly-once visible only once their commit is). A store writes its
//! changelog through a [`ChangelogSink`], whichever it is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::delivery::{DeliveryTracker, Padded};
use super::ChangelogProducer;
use crate::error::Result;
use crate::output::{Output, SentRecord};

/// The changelogs and outputs of one test driver.
pub(crate) struct MemoryTopics {
    /// Outputs wait for their commit (exactly-once) or are visible at once.
    exactly_once: bool,
    inner: Mutex<Topics>,
}

#[derive(Default)]
struct Topics {
    changelogs: HashMap<(String, i32), Vec<SentRecord>>,
    /// Exactly-once: outputs sent since the last commit.
    pending: Vec<SentRecord>,
    /// Outputs a `read_committed` consumer sees, in the order sent.
    outputs: Vec<SentRecord>,
}

impl MemoryTopics {
    pub(crate) fn new(exactly_once: bool) -> Self {
        MemoryTopics { exactly_once, inner: Mutex::default() }
    }

    fn topics(&self) -> std::sync::MutexGuard<'_, Topics> {
        self.inner.lock().expect("memory topics lock")
    }

    pub(crate) fn send_output(&self, output: &Output<'_>, default_timestamp: Option<i64>) {
        let record = SentRecord::of_output(output, default_timestamp);
        let mut topics = self.topics();
        if self.exactly_once {
            topics.pending.push(record);
        } else {
            topics.outputs.push(record);
        }
    }

    /// The outputs sent since the last commit become visible.
    pub(crate) fn commit_outputs(&self) {
        let mut topics = self.topics();
        let pending = std::mem::take(&mut topics.pending);
        topics.outputs.extend(pending);
    }

    /// The outputs sent since the last commit are dropped (an aborted
    /// transaction); at-least-once there are none: they were sent.
    pub(crate) fn abort_outputs(&self) {
        self.topics().pending.clear();
    }

    /// Every visible output, in the order sent.
    pub(crate) fn outputs(&self) -> Vec<SentRecord> {
        self.topics().outputs.clone()
    }

    /// Takes out the visible outputs of `topic`.
    pub(crate) fn take_outputs(&self, topic: &str) -> Vec<SentRecord> {
        let mut topics = self.topics();
        let (taken, kept) = std::mem::take(&mut topics.outputs).into_iter().partition(|r| r.topic == topic);
        topics.outputs = kept;
        taken
    }

    /// The records of one changelog partition, from offset 0.
    pub(crate) fn changelog(&self, topic: &str, partition: i32) -> Vec<SentRecord> {
        self.topics().changelogs.get(&(topic.to_string(), partition)).cloned().unwrap_or_default()
    }

    /// Appends records to the tracker's changelog partition and
    /// acknowledges them at once.
    fn append<'a>(
        &self,
        tracker: &DeliveryTracker,
        records: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        (key_skip, header): (usize, Option<(&str, &[u8])>),
        mut after_chunk: impl FnMut(&[(&'a [u8], Option<&'a [u8]>)]),
    ) {
        let chunk: Vec<_> = records.collect();
        let mut topics = self.topics();
        let log = topics.changelogs.entry((tracker.topic.clone(), tracker.partition)).or_default();
        for &(key, value) in &chunk {
            log.push(SentRecord {
                topic: tracker.topic.clone(),
                partition: Some(tracker.partition),
                key: Some(key[key_skip..].to_vec()),
                value: value.map(<[u8]>::to_vec),
                timestamp: Some(crate::time::wall_clock_ms()),
                headers: header.iter().map(|(n, v)| (n.to_string(), Some(v.to_vec()))).collect(),
            });
            let offset = log.len() as i64 - 1;
            tracker.sent.0.fetch_add(1, Ordering::AcqRel);
            tracker.last_acked.fetch_max(offset, Ordering::AcqRel);
            tracker.acked.fetch_add(1, Ordering::AcqRel);
            tracker.delivered.fetch_add(1, Ordering::AcqRel);
        }
        drop(topics);
        after_chunk(&chunk);
    }
}

/// Where a store's commits send its changelog records: kstate's producer,
/// or a test driver's topics in memory.
#[derive(Clone)]
pub(crate) enum ChangelogSink {
    Producer(Arc<ChangelogProducer>),
    Memory(Arc<MemoryTopics>),
}

impl ChangelogSink {
    /// A tracker for the deliveries of one changelog partition's records.
    pub(crate) fn tracker(&self, topic: String, partition: i32) -> Arc<DeliveryTracker> {
        match self {
            ChangelogSink::Producer(p) => p.tracker(topic, partition),
            ChangelogSink::Memory(_) => Arc::new(DeliveryTracker {
                topic,
                partition,
                slot: usize::MAX,
                sent: Padded::default(),
                delivered: AtomicU64::new(0),
                last_acked: AtomicI64::new(-1),
                acked: AtomicU64::new(0),
                failure: Mutex::new(None),
            }),
        }
    }

    /// See [`ChangelogProducer::release`].
    pub(crate) fn release(&self, tracker: &Arc<DeliveryTracker>) {
        if let ChangelogSink::Producer(p) = self {
            p.release(tracker);
        }
    }

    /// Whether the records go out in transactions (exactly-once).
    pub(crate) fn transactional(&self) -> bool {
        match self {
            ChangelogSink::Producer(p) => p.transactions().is_some(),
            ChangelogSink::Memory(_) => false,
        }
    }

    /// See [`ChangelogProducer::send_all`]; in memory the records are
    /// acknowledged as they are appended.
    pub(crate) fn send_all<'a>(
        &self,
        tracker: &DeliveryTracker,
        records: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        skip_and_header: (usize, Option<(&str, &[u8])>),
        after_chunk: impl FnMut(&[(&'a [u8], Option<&'a [u8]>)]),
    ) -> Result<()> {
        match self {
            ChangelogSink::Producer(p) => p.send_all(tracker, records, skip_and_header, after_chunk),
            ChangelogSink::Memory(m) => {
                m.append(tracker, records, skip_and_header, after_chunk);
                Ok(())
            }
        }
    }
}
