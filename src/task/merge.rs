//! A task's input records held for their turn when it has several input
//! topics (Kafka Streams' partition group, KIP-695): a queue per input
//! topic, and the rule of which record goes next ([`TaskQueues::next`]):
//! the head with the lowest timestamp once every queue has one; an empty
//! queue is waited for while the broker holds more of its partition (at
//! most [`LAG_WAIT_MS`]), else for `max_task_idle` (architecture.md §13).
//! The runtime (`runtime/merge.rs`) and the test driver both use it; a
//! task that starts over reads its held records again
//! (`task/reinit.rs`), a task that closes drops them.

use std::collections::VecDeque;

use rdkafka::message::{Header, OwnedHeaders};

use crate::config::AppConfig;
use crate::record::{Headers, Record, TimestampType};

/// The longest a task waits for an input partition the broker is known to
/// hold more records of (they are being fetched).
pub(crate) const LAG_WAIT_MS: i64 = 1_000;

/// Records a task holds at most before it stops waiting for an empty input
/// (the others' fetches go on meanwhile).
const MAX_HELD: usize = 10_000;

/// An input record held until its turn (a copy: the fetched message is
/// gone by then).
pub(crate) struct Held {
    topic: usize,
    offset: i64,
    /// Its timestamp as the extractor read it when it came (`i64::MIN` if
    /// invalid: first, so that the invalid-timestamp policy applies at once).
    order: i64,
    timestamp: Option<i64>,
    timestamp_type: TimestampType,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Option<OwnedHeaders>,
}

impl Held {
    /// A copy of `record` of input topic number `topic`, ordered by `order`.
    pub(crate) fn of(record: &Record<'_>, topic: usize, order: Option<i64>) -> Held {
        let headers = (!record.headers.is_empty()).then(|| {
            record.headers.iter().fold(OwnedHeaders::new_with_capacity(record.headers.len()), |h, (key, value)| {
                h.insert(Header { key, value })
            })
        });
        Held {
            topic,
            offset: record.offset,
            order: order.filter(|t| *t >= 0).unwrap_or(i64::MIN),
            timestamp: record.timestamp,
            timestamp_type: record.timestamp_type,
            key: record.key.map(<[u8]>::to_vec),
            value: record.value.map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The record again, for its task's processor.
    pub(crate) fn record<'a>(&'a self, topics: &'a [String], partition: i32) -> Record<'a> {
        Record {
            topic: &topics[self.topic],
            partition,
            offset: self.offset,
            timestamp: self.timestamp,
            timestamp_type: self.timestamp_type,
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            headers: self.headers.as_ref().map_or(Headers::empty(), Headers::of_owned),
        }
    }
}

/// The order a record is merged in: its timestamp as the extractor reads
/// it with the task's stream time now.
pub(crate) fn order_of(config: &AppConfig, record: &Record<'_>, stream_time: Option<i64>) -> Option<i64> {
    match &config.timestamp_extractor {
        Some(extract) if !config.is_repartition_topic(record.topic) => Some(extract(record, stream_time)),
        _ => record.timestamp,
    }
}

/// One task's held records, a queue per input topic.
pub(crate) struct TaskQueues {
    queues: Vec<VecDeque<Held>>,
    /// Per input topic, the offset after the last record that came.
    next: Vec<Option<i64>>,
    /// Since when (ms on the caller's clock) an input has been empty while others were not.
    waiting_since: Option<i64>,
    held: usize,
    /// Per input topic: waited for once while it was not known whether the
    /// broker holds more of it (no record of it came yet, no position).
    settled: Vec<bool>,
    /// `kstate_input_held_records` and `kstate_input_enforced_total` of the task.
    held_gauge: metrics::Gauge,
    enforced: metrics::Counter,
    /// Per input topic: a table's, which goes first on equal timestamps
    /// (a record at `t` sees the table's updates at `t`).
    first: Vec<bool>,
}

impl TaskQueues {
    pub(crate) fn new(config: &AppConfig, partition: i32) -> Self {
        let topics = config.input_topics.len();
        TaskQueues {
            first: config.input_topics.iter().map(|t| config.table_store_of(t).is_some()).collect(),
            held_gauge: metrics::gauge!(crate::metrics::INPUT_HELD, "partition" => partition.to_string()),
            enforced: metrics::counter!(crate::metrics::INPUT_ENFORCED, "partition" => partition.to_string()),
            queues: (0..topics).map(|_| VecDeque::new()).collect(),
            next: vec![None; topics],
            waiting_since: None,
            held: 0,
            settled: vec![false; topics],
        }
    }

    pub(crate) fn push(&mut self, held: Held) {
        self.next[held.topic] = Some(held.offset + 1);
        self.queues[held.topic].push_back(held);
        self.held += 1;
        self.held_gauge.set(self.held as f64);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// The record to process now, if the task may process one: the head
    /// with the lowest order (ties: a table's topic, then the first input topic) once every
    /// queue has a head; while one is empty, only once the wait is over:
    /// [`LAG_WAIT_MS`] (or `idle` if longer) if `lagging(topic, next
    /// offset)` says the broker holds more of an empty one (`Some(true)`;
    /// the next offset: after the last record of it that came, if any;
    /// `None`: not known, which is waited for once per input), else `idle`
    /// ms; or once the task holds [`MAX_HELD`] records. The wait starts
    /// when the task holds records again after holding none, or when an
    /// input runs dry. `now` is in ms on any clock that does not go back.
    pub(crate) fn next(&mut self, now: i64, idle: i64, lagging: &mut dyn FnMut(usize, Option<i64>) -> Option<bool>) -> Option<Held> {
        if self.held == 0 {
            self.waiting_since = None;
            return None;
        }
        let empty: Vec<usize> = (0..self.queues.len()).filter(|&t| self.queues[t].is_empty()).collect();
        if empty.is_empty() {
            self.waiting_since = None;
        } else {
            let since = *self.waiting_since.get_or_insert(now);
            let mut unknown = Vec::new();
            let behind = empty.iter().any(|&t| match lagging(t, self.next[t]) {
                Some(lag) => lag,
                None => {
                    unknown.push(t);
                    !self.settled[t]
                }
            });
            let wait = if behind { LAG_WAIT_MS.max(idle) } else { idle };
            if now - since < wait && self.held < MAX_HELD {
                return None;
            }
            for t in unknown {
                self.settled[t] = true;
            }
            self.enforced.increment(1);
        }
        let topic = (0..self.queues.len()).filter(|&t| !self.queues[t].is_empty()).min_by_key(|&t| (self.queues[t][0].order, !self.first[t], t))?;
        self.held -= 1;
        self.held_gauge.set(self.held as f64);
        self.queues[topic].pop_front()
    }

    /// The lowest held offset of each input topic that has any.
    pub(crate) fn lowest_offsets(&self) -> impl Iterator<Item = (usize, i64)> + '_ {
        self.queues.iter().enumerate().filter_map(|(t, q)| Some((t, q.front()?.offset)))
    }
}

impl Drop for TaskQueues {
    fn drop(&mut self) {
        // (The task closed or starts over: it holds nothing here any more.)
        self.held_gauge.set(0.0);
    }
}
