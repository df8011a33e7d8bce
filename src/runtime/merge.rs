//! Several input topics merged in timestamp order: the runtime's side of
//! `task/merge.rs` (records held in their running task, the next one
//! taken when its turn has come, the broker's cached high watermarks for
//! the wait on an input with none held; architecture.md §13).

use std::time::Instant;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::AppConfig;
use crate::kafka::consumer_batch::PolledBatch;
use crate::record::Record;
use crate::task::merge::{order_of, Held, TaskQueues};
use crate::task::{TaskManager, TaskState};

use super::RuntimeContext;

/// The runtime's merge of several input topics.
pub(super) struct InputMerge {
    topics: Vec<String>,
    idle_ms: i64,
    /// The clock of `TaskQueues::next` (read only when a wait needs it).
    started: Instant,
}

impl InputMerge {
    /// `None` with one input topic: nothing to merge.
    pub(super) fn new(config: &AppConfig) -> Option<Self> {
        (config.input_topics.len() > 1).then(|| InputMerge {
            topics: config.input_topics.clone(),
            idle_ms: i64::try_from(config.max_task_idle.as_millis()).unwrap_or(i64::MAX),
            started: Instant::now(),
        })
    }

    /// A new pass over polled records (a poll, a seek): the answers of
    /// whether an input is behind are asked again.
    pub(super) fn new_pass(&self, tasks: &mut TaskManager) {
        tasks.tasks.values_mut().filter_map(|t| t.held.as_mut()).for_each(TaskQueues::forget_lags);
    }

    /// For each record of a polled batch, whether a later record of the
    /// batch is of the same partition (task) and another input: then it
    /// may not go at once (that one may have to go first).
    pub(super) fn later_other_inputs(&self, batch: &PolledBatch<'_>) -> Vec<bool> {
        let records: Vec<(i32, u64)> = batch
            .iter()
            .map(|m| {
                let topic = self.topics.iter().position(|t| t.as_bytes() == m.topic());
                (m.partition(), topic.map_or(0, |t| 1u64 << t.min(63)))
            })
            .collect();
        let mut seen: std::collections::HashMap<i32, u64> = std::collections::HashMap::new();
        let mut later = vec![false; records.len()];
        for (i, (partition, bit)) in records.into_iter().enumerate().rev() {
            let after = seen.entry(partition).or_default();
            later[i] = *after & !bit != 0;
            *after |= bit;
        }
        later
    }

    /// Holds `record` in its task if the task is running and takes it;
    /// `false`: hand it to `process_one` at once (which sets aside a record
    /// of a task that does not run), also when its turn has come already
    /// (`TaskQueues::goes_at_once`: nothing held, no other input to wait
    /// for, and `later_other`, a later record of the same poll of another
    /// input of the task, false).
    pub(super) fn hold(
        &self,
        config: &AppConfig,
        tasks: &mut TaskManager,
        (record, later_other): (&Record<'_>, bool),
        consumer: &BaseConsumer<RuntimeContext>,
    ) -> bool {
        let Some(task) = tasks.tasks.get_mut(&record.partition) else { return false };
        let Some(topic) = self.topics.iter().position(|t| t == record.topic) else { return false };
        if task.state != TaskState::Running || !task.topics.contains(record.topic) {
            return false;
        }
        let queues = task.held.get_or_insert_with(|| TaskQueues::new(config, record.partition));
        let now = &mut || self.now_ms();
        let (topics, partition) = (&self.topics, record.partition);
        if !later_other && queues.goes_at_once((topic, record.offset), now, self.idle_ms, &mut |t, next| lagging(consumer, &topics[t], partition, next)) {
            return false;
        }
        let order = order_of(config, record, task.time.stream_time());
        queues.push(Held::of(record, topic, order));
        true
    }

    /// The running tasks holding records, in partition order.
    pub(super) fn partitions(&self, tasks: &TaskManager) -> Vec<i32> {
        let holding = |t: &&crate::task::Task| t.state == TaskState::Running && t.held.as_ref().is_some_and(|h| !h.is_empty());
        tasks.tasks.values().filter(holding).map(|t| t.partition).collect()
    }

    /// Task `partition`'s next record to process now, if any.
    pub(super) fn next(&self, partition: i32, tasks: &mut TaskManager, consumer: &BaseConsumer<RuntimeContext>) -> Option<Held> {
        let now = &mut || self.now_ms();
        let task = tasks.tasks.get_mut(&partition)?;
        let topics = &self.topics;
        task.held.as_mut()?.next(now, self.idle_ms, &mut |t, next| lagging(consumer, &topics[t], partition, next))
    }

    /// The merge's clock: ms since it started.
    fn now_ms(&self) -> i64 {
        self.started.elapsed().as_millis() as i64
    }

    /// The topics, by index.
    pub(super) fn topics(&self) -> &[String] {
        &self.topics
    }
}

/// Whether the broker is known to hold records of `topic`/`partition` not
/// fetched yet: the consumer's position (past control records too), else
/// `next` (after the last record that came), below the high watermark of
/// the last fetch response (librdkafka's cached values, no request).
/// `None`: not known (no fetch response yet, or a partition with records
/// of which none came and no position).
fn lagging(consumer: &BaseConsumer<RuntimeContext>, topic: &str, partition: i32, next: Option<i64>) -> Option<bool> {
    let rk = consumer.client().native_ptr();
    let (low, high) = crate::kafka::watermarks::cached(rk, topic, partition)?;
    let mut tpl = TopicPartitionList::with_capacity(1);
    tpl.add_partition(topic, partition);
    // SAFETY: a live client handle and a list this function owns; the
    // call writes the partition's position into the list.
    let err = unsafe { rdsys::rd_kafka_position(rk, tpl.ptr()) };
    let position = match (err, tpl.find_partition(topic, partition).map(|e| e.offset())) {
        (rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR, Some(Offset::Offset(p))) => Some(p),
        _ => None,
    };
    match position.or(next) {
        Some(at) => Some(at < high),
        None if low >= high => Some(false), // (empty)
        None => None,
    }
}
