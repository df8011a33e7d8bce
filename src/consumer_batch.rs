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
//! Differences that constrain where this is used (the restore consumer):
//! - the consumer needs a `group.id` (without one it has no consumer queue
//!   and `poll` returns nothing at once), must not join the group (no
//!   rebalance events) and must not auto-commit (librdkafka aborts on an
//!   offset-commit reply served this way);
//! - the position moves past error messages too, so the caller must not
//!   trust a partition's position after an error on it;
//! - librdkafka's log lines and client-wide errors are served by librdkafka's
//!   own printer (stderr) instead of rust-rdkafka's context (`tracing`).

use std::ffi::CStr;
use std::marker::PhantomData;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;

/// Messages taken from a consumer in one call; destroyed on [`clear`] and
/// on drop. Borrows the consumer, so it cannot outlive it.
///
/// [`clear`]: PolledBatch::clear
pub(crate) struct PolledBatch<'c> {
    consumer: &'c BaseConsumer,
    messages: Vec<*mut rdsys::rd_kafka_message_t>,
    _not_send: PhantomData<*mut ()>,
}

impl<'c> PolledBatch<'c> {
    /// An empty batch for `consumer`, holding up to `capacity` messages.
    pub(crate) fn new(consumer: &'c BaseConsumer, capacity: usize) -> Self {
        PolledBatch { consumer, messages: Vec::with_capacity(capacity.max(1)), _not_send: PhantomData }
    }

    /// Replaces the batch with what the consumer has queued: returns at once
    /// with every queued message (up to the capacity), or waits up to
    /// `timeout` for the first one if none is queued. Returns how many.
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
        let rk = self.consumer.client().native_ptr();
        // SAFETY: `rk` is a live consumer handle (borrowed for 'c). The
        // consumer queue reference is released before returning. librdkafka
        // writes at most `max` (<= capacity) message pointers into the
        // vector's spare capacity, and each returned message is owned by us
        // until `rd_kafka_message_destroy` in `clear`.
        unsafe {
            let queue = rdsys::rd_kafka_queue_get_consumer(rk);
            if queue.is_null() {
                return 0; // not a group consumer: it has no consumer queue
            }
            let n = rdsys::rd_kafka_consume_batch_queue(queue, timeout_ms, self.messages.as_mut_ptr(), max);
            rdsys::rd_kafka_queue_destroy(queue);
            let n = n.max(0) as usize;
            self.messages.set_len(n);
            n
        }
    }

    /// The messages of the last poll, in queue order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = PolledMessage<'_>> {
        // SAFETY: every pointer came from rd_kafka_consume_batch_queue and
        // stays valid until `clear`, which needs `&mut self`.
        self.messages.iter().map(|&m| PolledMessage { m: unsafe { &*m } })
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
    fn a_consumer_without_group_id_polls_nothing() {
        let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", "127.0.0.1:1").create().unwrap();
        let mut b = PolledBatch::new(&c, 16);
        assert_eq!(b.poll(Duration::from_millis(1)), 0);
        assert_eq!(b.iter().count(), 0);
    }

    #[test]
    fn an_idle_group_consumer_returns_after_the_timeout() {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "kstate-unit")
            .create()
            .unwrap();
        let mut b = PolledBatch::new(&c, 16);
        let t = std::time::Instant::now();
        assert_eq!(b.poll(Duration::from_millis(50)), 0);
        assert!(t.elapsed() >= Duration::from_millis(40), "{:?}", t.elapsed());
    }
}
