//! Polling a consumer's queue a batch of messages at a time.
//!
//! `BaseConsumer::poll` hands out one message per call, and each call takes
//! the queue lock, reads the clock several times (rust-rdkafka's deadline
//! and librdkafka's poll bookkeeping) and wraps the message. For a restore,
//! which reads millions of records as fast as it can write them, that was a
//! fifth of the restore thread's CPU (`perf`: `clock_gettime` alone 21%).
//! librdkafka's `rd_kafka_consume_batch_queue` serves up to N messages per
//! call with the same semantics as `rd_kafka_consumer_poll`: outdated
//! messages of a re-assigned partition are dropped, consumer errors come back
//! as messages with `err` set, control records are skipped, and the
//! application position advances past every message handed out.
//!
//! Two uses:
//! - the restore consumer forwards each changelog partition it assigns;
//! - the processing consumer forwards each assigned partition to a queue of
//!   its own ([`QueueHandle::forward_partition`]) and reads that in
//!   batches, while `BaseConsumer::poll` keeps serving the consumer queue's
//!   events (rebalances, errors, logs) through rust-rdkafka.
//!
//! Differences from `poll`:
//! - the position moves past error messages too, so the caller must not
//!   trust a partition's position after an error on it;
//! - only partitions' records and consumer errors reach these queues, never
//!   librdkafka's events: those stay on the consumer queue, where
//!   rust-rdkafka routes them (serving events with librdkafka's callbacks
//!   would print logs to stderr and abort on offset-commit replies).

use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaResult, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;

/// A librdkafka queue reference of ours (released on drop).
pub(crate) struct QueueHandle {
    ptr: NonNull<rdsys::rd_kafka_queue_t>,
}

// SAFETY: librdkafka queues are thread-safe (every operation takes the
// queue's lock); the handle is only a reference count.
unsafe impl Send for QueueHandle {}
unsafe impl Sync for QueueHandle {}

impl QueueHandle {
    /// A new, empty queue that partitions can be forwarded to.
    ///
    /// # Safety
    /// The handle must be dropped before `consumer` is.
    pub(crate) unsafe fn new<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> QueueHandle {
        let ptr = rdsys::rd_kafka_queue_new(consumer.client().native_ptr());
        QueueHandle { ptr: NonNull::new(ptr).expect("rd_kafka_queue_new never returns NULL") }
    }

    /// Routes a partition's fetched records (and its consumer errors) to
    /// this queue instead of the consumer queue. librdkafka drops the
    /// forwarding when the partition's fetcher stops (unassign), so forward
    /// again before every (re-)assignment. `false` if the partition cannot
    /// be forwarded (its records keep coming through the consumer queue).
    pub(crate) fn forward_partition<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
    ) -> bool {
        let Ok(topic) = CString::new(topic) else { return false };
        // SAFETY: live consumer handle; the partition queue reference is
        // released right after forwarding (the forward keeps its own
        // reference to this queue).
        unsafe {
            let partq = rdsys::rd_kafka_queue_get_partition(consumer.client().native_ptr(), topic.as_ptr(), partition);
            if partq.is_null() {
                return false;
            }
            rdsys::rd_kafka_queue_forward(partq, self.ptr.as_ptr());
            rdsys::rd_kafka_queue_destroy(partq);
        }
        true
    }
}

/// Records taken from a queue per batch poll.
pub(crate) const POLL_BATCH: usize = 1024;
/// Most consumer-queue polls per [`serve_consumer_queue`].
const MAX_EVENTS_PER_PASS: usize = 64;

/// Serves what waits in a consumer's own queue: rebalances, errors and logs
/// (rust-rdkafka handles them, one per `poll`, and returns `None`) and
/// records of partitions that could not be forwarded. Hands every `poll`
/// result to `each`, until the queue is empty or after a bounded number of
/// polls; stops at the first error `each` returns.
pub(crate) fn serve_consumer_queue<C: ConsumerContext, E>(
    consumer: &BaseConsumer<C>,
    mut each: impl FnMut(Option<KafkaResult<BorrowedMessage<'_>>>) -> Result<(), E>,
) -> Result<(), E> {
    for _ in 0..MAX_EVENTS_PER_PASS {
        each(consumer.poll(Duration::ZERO))?;
        if pending_events(consumer) == 0 {
            break;
        }
    }
    Ok(())
}

/// Events (and records of unforwarded partitions) waiting in a group
/// consumer's queue; 0 for a consumer without one.
pub(crate) fn pending_events<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> usize {
    // SAFETY: live consumer handle; the queue reference is released at once.
    unsafe {
        let q = rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr());
        if q.is_null() {
            return 0;
        }
        let n = rdsys::rd_kafka_queue_length(q);
        rdsys::rd_kafka_queue_destroy(q);
        n
    }
}

impl Drop for QueueHandle {
    fn drop(&mut self) {
        // SAFETY: our reference, released once.
        unsafe { rdsys::rd_kafka_queue_destroy(self.ptr.as_ptr()) };
    }
}

/// Messages taken from a queue in one call; destroyed on [`clear`] and on
/// drop. Borrows the queue, which cannot outlive its consumer.
///
/// [`clear`]: PolledBatch::clear
pub(crate) struct PolledBatch<'q> {
    queue: &'q QueueHandle,
    messages: Vec<*mut rdsys::rd_kafka_message_t>,
}

impl<'q> PolledBatch<'q> {
    /// An empty batch reading `queue`, holding up to `capacity` messages.
    pub(crate) fn new(queue: &'q QueueHandle, capacity: usize) -> Self {
        PolledBatch { queue, messages: Vec::with_capacity(capacity.max(1)) }
    }

    /// Replaces the batch with what the queue holds: returns at once with
    /// every queued message (up to the capacity), or waits up to `timeout`
    /// for the first one if none is queued. Returns how many.
    pub(crate) fn poll(&mut self, timeout: Duration) -> usize {
        self.clear();
        let capacity = self.messages.capacity();
        // Without waiting: everything queued right now, up to the capacity.
        let mut n = self.consume(0, capacity);
        if n == 0 {
            // Nothing queued: wait for one message only, since a batch call
            // with a timeout waits for the whole batch to fill.
            n = self.consume(timeout.as_millis().min(i32::MAX as u128) as i32, 1);
        }
        n
    }

    fn consume(&mut self, timeout_ms: i32, max: usize) -> usize {
        // SAFETY: the queue is live (borrowed). librdkafka writes at most
        // `max` (<= capacity) message pointers into the vector's spare
        // capacity; each returned message is ours until
        // `rd_kafka_message_destroy` in `clear`.
        unsafe {
            let n = rdsys::rd_kafka_consume_batch_queue(
                self.queue.ptr.as_ptr(),
                timeout_ms,
                self.messages.as_mut_ptr(),
                max,
            );
            let n = n.max(0) as usize;
            self.messages.set_len(n);
            n
        }
    }

    /// Whether the last poll returned nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The messages of the last poll, in queue order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = PolledMessage<'_>> {
        // SAFETY: every pointer came from rd_kafka_consume_batch_queue and
        // stays valid until `clear`, which needs `&mut self`.
        self.messages.iter().map(|&m| PolledMessage { m: unsafe { &*m } })
    }

    /// The messages of the last poll, to be read on another thread (the
    /// poll thread keeps the batch). Borrows the batch mutably: while the
    /// returned value lives, no other reference reads its messages.
    pub(crate) fn lend(&mut self) -> LentMessages<'_> {
        LentMessages { messages: &self.messages }
    }

    /// Destroys the messages of the last poll.
    pub(crate) fn clear(&mut self) {
        for m in self.messages.drain(..) {
            // SAFETY: each message is destroyed exactly once (drained).
            unsafe { rdsys::rd_kafka_message_destroy(m) };
        }
    }
}

impl Drop for PolledBatch<'_> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The messages of a [`PolledBatch`] lent to one thread ([`PolledBatch::lend`]).
pub(crate) struct LentMessages<'b> {
    messages: &'b [*mut rdsys::rd_kafka_message_t],
}

// SAFETY: librdkafka messages are not tied to a thread, and only this
// value reads them while it lives (it holds the batch's only borrow, and
// it is not `Sync` or `Clone`: one thread at a time). Reading a message
// parses its headers on first access, which is why two threads must
// never read the same batch.
unsafe impl Send for LentMessages<'_> {}

impl LentMessages<'_> {
    /// The messages, in queue order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = PolledMessage<'_>> {
        // SAFETY: as for `PolledBatch::iter`: valid until the batch is
        // cleared, which needs the borrow this value holds.
        self.messages.iter().map(|&m| PolledMessage { m: unsafe { &*m } })
    }
}

/// One message of a [`PolledBatch`].
pub(crate) struct PolledMessage<'b> {
    m: &'b rdsys::rd_kafka_message_t,
}

impl<'b> PolledMessage<'b> {
    /// The consumer error this message reports instead of a record.
    pub(crate) fn error(&self) -> Option<RDKafkaErrorCode> {
        (self.m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| self.m.err.into())
    }

    /// Topic name (bytes as the broker sent them).
    pub(crate) fn topic(&self) -> &'b [u8] {
        if self.m.rkt.is_null() {
            return b"";
        }
        // SAFETY: librdkafka keeps the topic handle, and its name, alive
        // while a message references it.
        unsafe { CStr::from_ptr(rdsys::rd_kafka_topic_name(self.m.rkt)).to_bytes() }
    }

    /// Partition.
    pub(crate) fn partition(&self) -> i32 {
        self.m.partition
    }

    /// Offset.
    pub(crate) fn offset(&self) -> i64 {
        self.m.offset
    }

    /// Key; `None` for a record without one.
    pub(crate) fn key(&self) -> Option<&'b [u8]> {
        bytes(self.m.key as *const u8, self.m.key_len)
    }

    /// Timestamp in milliseconds since the epoch, if the record has one.
    pub(crate) fn timestamp(&self) -> Option<i64> {
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: reads the message's own fields.
        let ts = unsafe { rdsys::rd_kafka_message_timestamp(self.m, &mut kind) };
        (kind != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && ts >= 0).then_some(ts)
    }

    /// What the timestamp means.
    pub(crate) fn timestamp_type(&self) -> crate::record::TimestampType {
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: reads the message's own fields.
        unsafe { rdsys::rd_kafka_message_timestamp(self.m, &mut kind) };
        crate::record::TimestampType::from_native(kind)
    }

    /// Headers.
    pub(crate) fn headers(&self) -> crate::record::Headers<'b> {
        // SAFETY: the message lives as long as 'b (the batch holds it).
        unsafe { crate::record::Headers::of_message(self.m) }
    }

    /// Value; `None` for a tombstone.
    pub(crate) fn payload(&self) -> Option<&'b [u8]> {
        bytes(self.m.payload as *const u8, self.m.len)
    }
}

fn bytes<'b>(ptr: *const u8, len: usize) -> Option<&'b [u8]> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: librdkafka's key/payload pointer and length describe one
        // buffer owned by the message, which outlives 'b.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::ClientConfig;

    #[test]
    fn an_idle_queue_returns_after_the_timeout() {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "kstate-unit")
            .create()
            .unwrap();
        let queue = unsafe { QueueHandle::new(&c) };
        assert!(queue.forward_partition(&c, "some-topic", 0));
        let mut b = PolledBatch::new(&queue, 16);
        let t = std::time::Instant::now();
        assert_eq!(b.poll(Duration::from_millis(50)), 0);
        assert!(t.elapsed() >= Duration::from_millis(40), "{:?}", t.elapsed());
        assert_eq!(b.iter().count(), 0);
    }
}
