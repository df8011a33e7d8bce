//! The producer shared by every store of a runtime: each commit queues the
//! latest write of each key (a delete: a tombstone) to changelog partition `p`
//! of store partition `p`, and the processor's outputs, then flushes; the
//! offset of the last acknowledged record becomes the store's checkpoint.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::types::RDKafkaRespErr;

use super::delivery::{DeliveryContext, DeliveryTracker, Padded};
use super::transaction::{dooms_transaction_only, Transactions};
use crate::error::{ClientError, Error, Result};

/// A record sent with its tracker's slot as the delivery opaque.
type CountedRecord<'r> = rdkafka::producer::BaseRecord<'r, [u8], [u8], usize>;

/// Room left for record-batch and record headers when checking a record's
/// size against the changelog's `max.message.bytes`.
pub(crate) const RECORD_OVERHEAD: usize = 128;

/// The producer shared by every store of a runtime.
pub(crate) struct ChangelogProducer {
    pub(super) producer: ThreadedProducer<DeliveryContext>,
    /// How long a full local queue is waited out before a write fails.
    queue_timeout: Duration,
    /// librdkafka topic handles by name, for batch produce.
    topics: Mutex<HashMap<String, TopicHandle>>,
    /// Exactly-once: the transactional producer's state.
    pub(super) txn: Option<Transactions>,
}

/// A librdkafka topic handle (thread-safe in librdkafka).
#[derive(Clone, Copy)]
struct TopicHandle(*mut rdsys::rd_kafka_topic_t);

// SAFETY: librdkafka topic handles may be used from any thread.
unsafe impl Send for TopicHandle {}

impl Drop for ChangelogProducer {
    fn drop(&mut self) {
        // Before the producer (a field, dropped after this) destroys the client.
        for (_, h) in self.topics.get_mut().expect("topic handles").drain() {
            // SAFETY: created by `topic_handle` on this producer's client, destroyed once.
            unsafe { rdsys::rd_kafka_topic_destroy(h.0) };
        }
    }
}

impl ChangelogProducer {
    /// Creates the producer; `message_max_bytes` should not exceed any
    /// changelog topic's `max.message.bytes`.
    pub(crate) fn new(mut config: ClientConfig, message_max_bytes: usize, queue_timeout: Duration) -> Result<Self> {
        Self::create(config_for_changelogs(&mut config, message_max_bytes), queue_timeout, None)
    }

    pub(super) fn create(config: &mut ClientConfig, queue_timeout: Duration, txn: Option<Transactions>) -> Result<Self> {
        let producer: ThreadedProducer<DeliveryContext> = config.create_with_context(DeliveryContext::default())?;
        Ok(ChangelogProducer { producer, queue_timeout, topics: Mutex::default(), txn })
    }

    /// A changelog partition as the brokers describe it now: its start and
    /// end offsets and its topic id (if the brokers tell it).
    pub(crate) fn describe_changelog(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
    ) -> std::result::Result<(i64, i64, Option<String>), String> {
        use rdkafka::producer::Producer;
        let client = self.producer.client();
        let (low, high) = client
            .fetch_watermarks(topic, partition, timeout)
            .map_err(|e| format!("{topic}/{partition}: {e}"))?;
        let topic_id = super::topic_id::describe(client.native_ptr(), topic, timeout).ok();
        Ok((low, high, topic_id))
    }

    /// A tracker for the deliveries of one changelog partition's records,
    /// for a store opened on it.
    pub(crate) fn tracker(&self, topic: String, partition: i32) -> Arc<DeliveryTracker> {
        let mut trackers = self.producer.context().trackers.write().expect("tracker registry");
        let slot = trackers.free.pop().unwrap_or_else(|| {
            trackers.slots.push(None);
            trackers.slots.len() - 1
        });
        let tracker = Arc::new(DeliveryTracker {
            topic,
            partition,
            slot,
            sent: Padded::default(),
            delivered: AtomicU64::new(0),
            last_acked: AtomicI64::new(-1),
            acked: AtomicU64::new(0),
            failure: Mutex::new(None),
        });
        trackers.slots[slot] = Some(tracker.clone());
        tracker
    }

    /// Frees the slot of a closing store's tracker for reuse, unless a
    /// commit still holds the tracker or records of it are still in flight
    /// (their deliveries need the slot; it then stays registered).
    pub(crate) fn release(&self, tracker: &Arc<DeliveryTracker>) {
        let mut trackers = self.producer.context().trackers.write().expect("tracker registry");
        let registered = trackers.slots.get(tracker.slot).and_then(Option::as_ref).is_some_and(|t| Arc::ptr_eq(t, tracker));
        // Held only by the registry and the caller; no record undelivered.
        let idle = Arc::strong_count(tracker) == 2
            && tracker.delivered.load(Ordering::Acquire) == tracker.sent.0.load(Ordering::Acquire);
        if registered && idle {
            trackers.slots[tracker.slot] = None;
            trackers.free.push(tracker.slot);
        }
    }

    /// Queues records for the tracker's changelog partition, in order
    /// (`None` value: tombstone).
    ///
    /// Through `rd_kafka_produce_batch`, 1024 records per call: one topic
    /// and partition lookup and one clock read per call rather than per
    /// record (`send` per record was 0.6 µs of the commit thread's time per
    /// record, ahead of everything else it does). `after_chunk` sees each
    /// chunk once it is queued, while its bytes are still in the cache.
    /// Each record's key leaves out the first `key_skip` bytes of its
    /// store key (a segmented store's segment).
    /// With a `header` (a store's schema version other than 1) records go
    /// one by one (`rd_kafka_produce_batch` takes no headers).
    pub(crate) fn send_all<'a>(
        &self,
        tracker: &DeliveryTracker,
        records: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
        (key_skip, header): (usize, Option<(&str, &[u8])>),
        mut after_chunk: impl FnMut(&[(&'a [u8], Option<&'a [u8]>)]),
    ) -> Result<()> {
        const CHUNK: usize = 1024;
        self.begin_or_error()?;
        if let Some(header) = header {
            let mut chunk: Vec<(&'a [u8], Option<&'a [u8]>)> = Vec::with_capacity(CHUNK);
            let mut records = records.peekable();
            while records.peek().is_some() {
                chunk.clear();
                chunk.extend(records.by_ref().take(CHUNK));
                for &(key, value) in &chunk {
                    self.send_with_header(tracker, &key[key_skip..], value, header)?;
                }
                after_chunk(&chunk);
            }
            return Ok(());
        }
        let rkt = self.topic_handle(&tracker.topic)?;
        let mut batch: Vec<rdsys::rd_kafka_message_t> = Vec::with_capacity(CHUNK);
        let mut chunk: Vec<(&'a [u8], Option<&'a [u8]>)> = Vec::with_capacity(CHUNK);
        let mut records = records.peekable();
        while records.peek().is_some() {
            chunk.clear();
            chunk.extend(records.by_ref().take(CHUNK));
            for &(key, value) in &chunk {
                prefetch(key);
                prefetch(value.unwrap_or_default());
            }
            batch.clear();
            batch.extend(chunk.iter().map(|&(key, value)| rdsys::rd_kafka_message_t {
                err: RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
                rkt: std::ptr::null_mut(),
                partition: tracker.partition,
                payload: value.map_or(std::ptr::null_mut(), |v| v.as_ptr() as *mut c_void),
                len: value.map_or(0, <[u8]>::len),
                key: key[key_skip..].as_ptr() as *mut c_void,
                key_len: key.len() - key_skip,
                offset: 0,
                // The delivery opaque (see `DeliveryContext::delivery`).
                _private: tracker.slot as *mut c_void,
            }));
            self.enqueue(rkt.0, tracker, &mut batch)?;
            after_chunk(&chunk);
        }
        Ok(())
    }

    /// Queues one record counted on `tracker` (before the send: its
    /// delivery may be reported at once), waiting out a full local queue
    /// for up to `queue_timeout`; a record never queued is counted
    /// delivered too, so that flushes do not wait for it, and its refusal
    /// returned.
    fn send_counted(&self, tracker: &DeliveryTracker, mut record: CountedRecord<'_>) -> std::result::Result<(), KafkaError> {
        let context = self.producer.context();
        let mut started = None;
        loop {
            tracker.sent.0.fetch_add(1, Ordering::AcqRel);
            context.sent.0.fetch_add(1, Ordering::SeqCst);
            let refused = match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((e, back)) => {
                    record = back;
                    e
                }
            };
            tracker.delivered.fetch_add(1, Ordering::AcqRel);
            context.delivered.0.fetch_add(1, Ordering::SeqCst);
            if matches!(refused, KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
                && started.get_or_insert_with(Instant::now).elapsed() < self.queue_timeout
            {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            return Err(refused);
        }
    }

    /// Queues one changelog record with a header, waiting out a full local
    /// queue for up to `queue_timeout`.
    fn send_with_header(&self, tracker: &DeliveryTracker, key: &[u8], value: Option<&[u8]>, (name, hv): (&str, &[u8])) -> Result<()> {
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::BaseRecord;
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header { key: name, value: Some(hv) });
        let mut record: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&tracker.topic, tracker.slot).partition(tracker.partition).key(key).headers(headers);
        if let Some(v) = value {
            record = record.payload(v);
        }
        self.send_counted(tracker, record).map_err(|refused| Error::ChangelogDelivery {
            topic: tracker.topic.clone(),
            partition: tracker.partition,
            source: ClientError::new(refused),
        })
    }

    /// Queues `batch` in order, waiting out a full local queue for up to
    /// `queue_timeout`.
    fn enqueue(&self, rkt: *mut rdsys::rd_kafka_topic_t, tracker: &DeliveryTracker, batch: &mut [rdsys::rd_kafka_message_t]) -> Result<()> {
        let context = self.producer.context();
        let mut rest = batch;
        let mut started = None;
        loop {
            let n = rest.len() as u64;
            // Counted before: deliveries may be reported at once.
            tracker.sent.0.fetch_add(n, Ordering::AcqRel);
            context.sent.0.fetch_add(n, Ordering::SeqCst);
            // SAFETY: `rkt` is a live topic handle of this producer; every
            // message points at key and value bytes that outlive the call
            // (RD_KAFKA_MSG_F_COPY: librdkafka copies them).
            let queued = unsafe {
                rdsys::rd_kafka_produce_batch(rkt, tracker.partition, rdsys::RD_KAFKA_MSG_F_COPY, rest.as_mut_ptr(), n as c_int)
            } as u64;
            if queued == n {
                return Ok(());
            }
            // Never queued, so never delivered: count them as delivered (not
            // acknowledged) so that flushes do not wait for them.
            tracker.delivered.fetch_add(n - queued, Ordering::AcqRel);
            context.delivered.0.fetch_add(n - queued, Ordering::SeqCst);
            let first = rest.iter().position(|m| m.err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR).unwrap_or(0);
            let queue_full = rest[first..].iter().all(|m| m.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__QUEUE_FULL);
            // A full queue fails a suffix of the batch: retry it, in order.
            if queue_full && started.get_or_insert_with(Instant::now).elapsed() < self.queue_timeout {
                rest = &mut rest[first..];
                for m in rest.iter_mut() {
                    m.err = RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR;
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            return Err(Error::ChangelogDelivery {
                topic: tracker.topic.clone(),
                partition: tracker.partition,
                source: ClientError::new(KafkaError::MessageProduction(RDKafkaErrorCode::from(rest[first].err))),
            });
        }
    }

    /// Queues one output record, counted on `tracker` (the outputs'
    /// tracker), waiting out a full local queue for up to `queue_timeout`.
    /// A record librdkafka refuses at once (too large, unknown partition)
    /// is [`Error::OutputDelivery`].
    pub(crate) fn send_output(&self, tracker: &DeliveryTracker, out: &crate::output::Output<'_>, default_timestamp: Option<i64>) -> Result<()> {
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::BaseRecord;
        if let Err(e) = self.begin_if_needed() {
            // As a refused output below: the next commit aborts (and
            // replaces a fatal producer); the processor need not know.
            if let Some(txn) = &self.txn {
                if !txn.broken.swap(true, Ordering::AcqRel) {
                    tracing::warn!(error = %e, "no transaction could begin; the next commit aborts and retries");
                }
            }
            return Ok(());
        }
        let mut record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(out.topic, tracker.slot);
        if let Some(k) = out.key {
            record = record.key(k);
        }
        if let Some(v) = out.value {
            record = record.payload(v);
        }
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        if let Some(t) = out.timestamp.or(default_timestamp) {
            record = record.timestamp(t);
        }
        if !out.headers.is_empty() {
            let headers = out.headers.iter().fold(OwnedHeaders::new_with_capacity(out.headers.len()), |h, (key, value)| {
                h.insert(Header { key, value: *value })
            });
            record = record.headers(headers);
        }
        let Err(refused) = self.send_counted(tracker, record) else { return Ok(()) };
        if let Some(txn) = self.txn.as_ref().filter(|_| dooms_transaction_only(&refused)) {
            // The transaction is lost anyway: the commit aborts it and the
            // input is processed again; the processor need not know.
            if !txn.broken.swap(true, Ordering::AcqRel) {
                tracing::warn!(topic = %out.topic, error = %refused, "output refused: the open transaction cannot commit; the next commit aborts it");
            }
            return Ok(());
        }
        // Also fails the commit, should the processor (or its exception
        // handler) go on without this output.
        let mut f = tracker.failure.lock().expect("tracker lock");
        if f.is_none() {
            *f = Some((refused.clone(), out.topic.to_string(), out.partition.unwrap_or(-1)));
        }
        Err(Error::OutputDelivery { topic: out.topic.to_string(), partition: out.partition, source: ClientError::new(refused) })
    }

    /// After a flush, waits until none of `trackers` has a record in
    /// flight. The flush counts every record of the producer, and records
    /// queued while it waited (outputs of the next commit) may be
    /// acknowledged before older ones: only the trackers say that exactly
    /// these records were delivered. Same patience as the flush.
    pub(crate) fn settle_trackers(&self, trackers: &[&DeliveryTracker], timeout: Duration, patience: Duration) -> Result<()> {
        let started = Instant::now();
        while trackers.iter().any(|t| t.in_flight()) {
            if started.elapsed() >= patience {
                return Err(Error::CommitTimeout(started.elapsed()));
            }
            self.flush_patiently(timeout, patience.saturating_sub(started.elapsed()))?;
        }
        Ok(())
    }

    /// librdkafka's handle of `topic` (created once, destroyed with the producer).
    fn topic_handle(&self, topic: &str) -> Result<TopicHandle> {
        let mut topics = self.topics.lock().expect("topic handles");
        if let Some(h) = topics.get(topic) {
            return Ok(*h);
        }
        let name = std::ffi::CString::new(topic).map_err(|_| Error::Config(format!("topic name `{topic}` contains NUL")))?;
        // SAFETY: the client handle is live; a NULL conf takes the producer's defaults.
        let rkt = unsafe { rdsys::rd_kafka_topic_new(self.producer.client().native_ptr(), name.as_ptr(), std::ptr::null_mut()) };
        if rkt.is_null() {
            return Err(Error::ChangelogDelivery {
                topic: topic.to_string(),
                partition: -1,
                source: ClientError::new(KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopic)),
            });
        }
        topics.insert(topic.to_string(), TopicHandle(rkt));
        Ok(TopicHandle(rkt))
    }

    /// Flushes, and while records are still unacknowledged after `timeout`
    /// (brokers restarting, a leader moving) keeps waiting, with a warning
    /// each `timeout`, up to `patience` in all; the producer retries them
    /// meanwhile. Fails with [`Error::CommitTimeout`] after that.
    pub(crate) fn flush_patiently(&self, timeout: Duration, patience: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            match self.flush(timeout) {
                Err(Error::CommitTimeout(_)) if started.elapsed() < patience => {
                    tracing::warn!(waited = ?started.elapsed(), ?patience,
                        "changelog acknowledgements are late (brokers unavailable?); still waiting");
                }
                Err(Error::CommitTimeout(_)) => return Err(Error::CommitTimeout(started.elapsed())),
                other => return other,
            }
        }
    }

    /// Waits until every queued record is acknowledged or failed.
    ///
    /// Not `Producer::flush`: with a `ThreadedProducer` its wait loop polls
    /// an event queue that the producer's own thread drains, so every flush
    /// with records in flight took at least 100 ms (measured: 100.0 ms per
    /// commit, most of the write path's time). kstate counts its own
    /// deliveries instead and wakes up when the last one is reported.
    pub(crate) fn flush(&self, timeout: Duration) -> Result<()> {
        let context = self.producer.context();
        let wanted = context.sent.0.load(Ordering::SeqCst);
        if context.delivered.0.load(Ordering::SeqCst) >= wanted {
            return Ok(());
        }
        // A zero-timeout flush makes librdkafka send lingering batches now.
        match self.producer.flush(Duration::ZERO) {
            Ok(()) | Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {}
            Err(e) => return Err(e.into()),
        }
        let deadline = Instant::now() + timeout;
        let mut guard = context.lock.lock().expect("delivery lock");
        context.wanted.0.store(wanted, Ordering::SeqCst);
        while context.delivered.0.load(Ordering::SeqCst) < wanted {
            let now = Instant::now();
            if now >= deadline {
                context.wanted.0.store(u64::MAX, Ordering::SeqCst);
                return Err(Error::CommitTimeout(timeout));
            }
            // Bounded waits: a notification between the check and the wait is never lost for long.
            let wait = (deadline - now).min(Duration::from_millis(5));
            guard = context.settled.wait_timeout(guard, wait).expect("delivery lock").0;
        }
        context.wanted.0.store(u64::MAX, Ordering::SeqCst);
        Ok(())
    }
}

/// The settings every changelog producer has.
pub(super) fn config_for_changelogs(config: &mut ClientConfig, message_max_bytes: usize) -> &mut ClientConfig {
    {
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.max.bytes", message_max_bytes.to_string());
        crate::kafka::client::set_default(config, "linger.ms", "5");
        // Output records without an explicit partition: by key, as Java clients.
        crate::kafka::client::set_default(config, "partitioner", "murmur2_random");
        crate::kafka::client::set_default(config, "batch.size", "1000000");
        crate::kafka::client::set_default(config, "queue.buffering.max.messages", "1000000");
    }
    config
}

/// Asks the CPU to load `bytes` into its cache ahead of use.
///
/// A commit's overlay (~15 MB per 100 ms at 1M records/s) was written by
/// the processing thread on another core and is out of the cache by the
/// time librdkafka copies it: one miss after the other, each copy waited
/// for memory. Prefetching a chunk's records first overlaps those misses.
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes.len()).step_by(64).chain(bytes.len().checked_sub(1)) {
        // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes.as_ptr().add(line).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_stores_tracker_slot_is_reused_unless_a_commit_holds_it() {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:1"); // never contacted: nothing is sent
        let producer = ChangelogProducer::new(config, 1_000_000, Duration::from_secs(1)).unwrap();
        let a = producer.tracker("t".into(), 0);
        producer.release(&a);
        let b = producer.tracker("t".into(), 1);
        assert_eq!(b.slot, a.slot, "a released slot is reused");
        let in_commit = b.clone(); // as a sealed commit holds it
        producer.release(&b);
        let c = producer.tracker("t".into(), 2);
        assert_ne!(c.slot, b.slot, "a tracker a commit holds keeps its slot");
        drop(in_commit);
        let a_held = a.clone(); // two holders, as a registered tracker has
        producer.release(&a); // stale: its slot belongs to `b` now
        drop(a_held);
        assert!(producer.producer.context().trackers.read().unwrap().slots[b.slot].is_some());
    }
}
