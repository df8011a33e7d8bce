//! Waking librdkafka's fetcher when a paused partition is resumed.
//!
//! Partitions are paused on assignment; librdkafka starts their fetch
//! (fetch state "active") while they are paused, and a later resume of an
//! active partition only bumps its version without waking the broker
//! thread, which then idles up to 1 s before it fetches
//! (`rd_kafka_max_block_ms` in rdkafka_broker.c;
//! `rd_kafka_toppar_set_fetch_state` returns early on an unchanged state).
//! Measured in the restore demo: a restart ran 0.33 s after start but
//! processed its first record ~1.2 s after start.
//!
//! Any request through the broker thread wakes it: a watermark query per
//! resumed partition (at most 8 per resume) is queued to its leader. The
//! queries run on a thread of their own: a reply queues behind the
//! connection's fetch, which the broker may park for `fetch.wait.max.ms`,
//! and waiting for it on the processing thread stalled all processing
//! (~0.5 s per resume while other tasks ran). They get a normal timeout: a
//! request that times out in flight makes librdkafka drop the connection
//! (`socket.max.fails`), and with it every fetch in flight on it.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::TopicPartitionList;

/// How long one wake-up query may take before it is given up (well past
/// any `fetch.wait.max.ms` a fetch it queues behind is parked for).
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// A wake-up asked for longer ago than this is skipped: the fetcher has
/// woken up on its own by then (and a stopping runtime does not wait for a
/// queue of them).
const STALE_AFTER: Duration = Duration::from_secs(1);

/// Hands partitions to the thread running [`run`].
#[derive(Clone)]
pub(crate) struct FetchWaker(mpsc::Sender<(String, i32, Instant)>);

impl FetchWaker {
    /// A waker and the receiving end for [`run`].
    pub(crate) fn new() -> (FetchWaker, mpsc::Receiver<(String, i32, Instant)>) {
        let (tx, rx) = mpsc::channel();
        (FetchWaker(tx), rx)
    }

    /// Asks for a wake-up of the fetcher of (at most 8 of) these partitions.
    pub(crate) fn wake(&self, tpl: &TopicPartitionList) {
        for e in tpl.elements().iter().take(8) {
            // The thread is gone only when the runtime is stopping.
            let _ = self.0.send((e.topic().to_string(), e.partition(), Instant::now()));
        }
    }
}

/// Sends a watermark query per partition received, until every
/// [`FetchWaker`] is dropped.
pub(crate) fn run<C: ConsumerContext>(consumer: &BaseConsumer<C>, partitions: mpsc::Receiver<(String, i32, Instant)>) {
    for (topic, partition, asked) in partitions {
        if asked.elapsed() > STALE_AFTER {
            continue;
        }
        if let Err(e) = consumer.fetch_watermarks(&topic, partition, QUERY_TIMEOUT) {
            tracing::debug!(%topic, partition, error = %e, "watermark query to wake the fetcher failed");
        }
    }
}
