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

/// How long (ms) an answer of `lagging` for an input is reused within one
/// pass over polled records: asking the client (its position and cached
/// high watermark) for every record costs more than the record's
/// processing. A poll or a seek can change the answer, so the runtime
/// forgets every answer at each pass ([`TaskQueues::forget_lags`]); a
/// record of that input coming clears its answer too.
const LAG_RECHECK_MS: i64 = 10;

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
    /// Key and value, one after the other (one allocation per record).
    bytes: Box<[u8]>,
    /// The key's length (`None`: no key); the value is the rest of `bytes`.
    key_len: Option<usize>,
    has_value: bool,
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
            bytes: [record.key.unwrap_or_default(), record.value.unwrap_or_default()].concat().into_boxed_slice(),
            key_len: record.key.map(<[u8]>::len),
            has_value: record.value.is_some(),
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
            key: self.key_len.map(|n| &self.bytes[..n]),
            value: self.has_value.then(|| &self.bytes[self.key_len.unwrap_or(0)..]),
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
    /// Per input topic: the last answer of `lagging` for it, and when.
    checked: Vec<Option<(i64, Option<bool>)>>,
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
            checked: vec![None; topics],
        }
    }

    pub(crate) fn push(&mut self, held: Held) {
        self.next[held.topic] = Some(held.offset + 1);
        self.checked[held.topic] = None;
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
    /// input runs dry. `now` reads a clock in ms that does not go back
    /// (only when a wait needs it: a task whose every input has a record
    /// reads none).
    pub(crate) fn next(&mut self, now: &mut dyn FnMut() -> i64, idle: i64, lagging: &mut dyn FnMut(usize, Option<i64>) -> Option<bool>) -> Option<Held> {
        if self.held == 0 {
            self.waiting_since = None;
            return None;
        }
        if (0..self.queues.len()).all(|t| !self.queues[t].is_empty()) {
            self.waiting_since = None;
        } else {
            let now = now();
            let since = *self.waiting_since.get_or_insert(now);
            let behind = self.behind(None, &mut || now, lagging);
            let wait = if behind { LAG_WAIT_MS.max(idle) } else { idle };
            if now - since < wait && self.held < MAX_HELD {
                return None;
            }
            // An input not known to be behind or not was waited for once.
            for t in 0..self.queues.len() {
                if self.queues[t].is_empty() && self.checked[t].is_some_and(|(_, answer)| answer.is_none()) {
                    self.settled[t] = true;
                }
            }
            self.enforced.increment(1);
        }
        let topic = (0..self.queues.len()).filter(|&t| !self.queues[t].is_empty()).min_by_key(|&t| (self.queues[t][0].order, !self.first[t], t))?;
        self.held -= 1;
        self.held_gauge.set(self.held as f64);
        self.queues[topic].pop_front()
    }

    /// Forgets the answers of `lagging`: records were polled or a
    /// partition sought since they were given.
    pub(crate) fn forget_lags(&mut self) {
        self.checked.iter_mut().for_each(|c| *c = None);
    }

    /// Whether a record of input `topic` at `offset`, just polled, goes to
    /// the processor at once, without being held: the task holds nothing,
    /// and `next` would take it at once if it were held, as no wait applies
    /// to the other inputs (`idle` 0, and none is behind: nothing of them
    /// fetched and not polled yet). The caller makes sure no later record
    /// of the same poll is of the task's other inputs (it could have to go
    /// first). The common case of a stream beside a table that is caught
    /// up, where holding would copy every record for nothing. Counted as
    /// `next` counts it.
    pub(crate) fn goes_at_once(
        &mut self,
        (topic, offset): (usize, i64),
        now: &mut dyn FnMut() -> i64,
        idle: i64,
        lagging: &mut dyn FnMut(usize, Option<i64>) -> Option<bool>,
    ) -> bool {
        if self.held > 0 || idle > 0 || self.behind(Some(topic), now, lagging) {
            return false;
        }
        self.next[topic] = Some(offset + 1);
        self.checked[topic] = None;
        self.enforced.increment(1);
        true
    }

    /// Whether an empty input other than `except` is behind: the broker
    /// holds more of it (`lagging`), or that is not known and it was not
    /// waited for yet. Answers of `lagging` are reused for [`LAG_RECHECK_MS`]
    /// (the clock is read once, if an input is empty).
    fn behind(&mut self, except: Option<usize>, now: &mut dyn FnMut() -> i64, lagging: &mut dyn FnMut(usize, Option<i64>) -> Option<bool>) -> bool {
        let mut behind = false;
        let mut read: Option<i64> = None;
        for t in 0..self.queues.len() {
            if Some(t) == except || !self.queues[t].is_empty() {
                continue;
            }
            let now = *read.get_or_insert_with(&mut *now);
            let answer = match self.checked[t] {
                Some((at, answer)) if (0..LAG_RECHECK_MS).contains(&(now - at)) => answer,
                _ => {
                    let answer = lagging(t, self.next[t]);
                    self.checked[t] = Some((now, answer));
                    answer
                }
            };
            behind |= answer.unwrap_or(!self.settled[t]);
        }
        behind
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

#[cfg(test)]
mod tests {
    use super::*;

    fn queues() -> TaskQueues {
        let config = crate::App::builder().input_topic("stream").input_topic("other").test_config().unwrap();
        TaskQueues::new(&config, 0)
    }

    fn held(topic: usize, offset: i64) -> Held {
        let record = Record {
            topic: "stream",
            partition: 0,
            offset,
            timestamp: Some(offset),
            timestamp_type: TimestampType::CreateTime,
            key: Some(b"k"),
            value: Some(b"v"),
            headers: Headers::empty(),
        };
        Held::of(&record, topic, Some(offset))
    }

    #[test]
    fn a_record_goes_at_once_only_when_nothing_is_held_and_no_other_input_is_waited_for() {
        let mut q = queues();
        let (mut asked, mut lag) = (0, Some(false));
        let at_once = |q: &mut TaskQueues, now: i64, idle: i64, lag: Option<bool>, asked: &mut i32| {
            q.goes_at_once((0, 7), &mut || now, idle, &mut |t, _| {
                assert_eq!(t, 1, "only the other input is asked about");
                *asked += 1;
                lag
            })
        };
        assert!(at_once(&mut q, 0, 0, lag, &mut asked), "the other input is caught up");
        assert!(at_once(&mut q, 5, 0, lag, &mut asked));
        assert_eq!(asked, 1, "the answer is reused for LAG_RECHECK_MS");
        lag = Some(true);
        assert!(at_once(&mut q, 9, 0, lag, &mut asked), "(still the reused answer)");
        assert!(!at_once(&mut q, 10, 0, lag, &mut asked), "asked again: the broker holds more of it");
        assert_eq!(asked, 2);
        assert!(!at_once(&mut q, 30, 0, None, &mut asked), "not known and never waited for");
        assert!(!at_once(&mut q, 31, 500, Some(false), &mut asked), "max_task_idle applies");
        q.push(held(1, 3));
        assert!(!at_once(&mut q, 32, 0, Some(false), &mut asked), "records are held: they go first");
        assert!(q.next(&mut || 32, 0, &mut |_, _| Some(false)).is_some());
        assert!(at_once(&mut q, 33, 0, Some(false), &mut asked), "a push cleared the reused `not known`");
        assert_eq!(asked, 4);
        assert!(at_once(&mut q, 34, 0, Some(true), &mut asked), "(reused)");
        q.forget_lags();
        assert!(!at_once(&mut q, 35, 0, Some(true), &mut asked), "forgotten at a new pass: asked again");
        assert_eq!(asked, 5);
    }

    #[test]
    fn an_input_not_known_to_be_behind_is_waited_for_once_then_records_go_at_once() {
        let mut q = queues();
        q.push(held(0, 1));
        assert!(q.next(&mut || 0, 0, &mut |_, _| None).is_none(), "not known: waited for");
        assert!(q.next(&mut || LAG_WAIT_MS - 1, 0, &mut |_, _| None).is_none());
        assert!(q.next(&mut || LAG_WAIT_MS, 0, &mut |_, _| None).is_some(), "once, for LAG_WAIT_MS");
        q.forget_lags();
        assert!(q.goes_at_once((0, 2), &mut || LAG_WAIT_MS, 0, &mut |_, _| None), "then no more: it was settled");
    }
}
