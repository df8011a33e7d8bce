//! The processing consumer's record queues: one per processing thread.
//! Each task is placed on a thread when its input partitions are assigned
//! here, and every input partition of the task is forwarded to that
//! thread's queue, so one poll of a queue holds records of that thread's
//! tasks only (architecture.md §15). A task stays on its thread until it
//! is revoked or lost; a new task goes to the thread with the fewest.

use std::collections::BTreeMap;
use std::sync::Mutex;

use rdkafka::consumer::BaseConsumer;

use crate::kafka::consumer_batch::QueueHandle;

use super::RuntimeContext;

pub(super) struct RecordQueues {
    queues: Vec<QueueHandle>,
    /// Task partition → its thread (its queue's index).
    placed: Mutex<BTreeMap<i32, usize>>,
}

impl RecordQueues {
    /// `threads` queues of `consumer`.
    ///
    /// # Safety
    /// The queues must be dropped before `consumer` is.
    pub(super) unsafe fn new(consumer: &BaseConsumer<RuntimeContext>, threads: usize) -> Self {
        // SAFETY: passed on to the caller.
        let queues = (0..threads.max(1)).map(|_| unsafe { QueueHandle::new(consumer) }).collect();
        RecordQueues { queues, placed: Mutex::new(BTreeMap::new()) }
    }

    /// The queues, by thread.
    pub(super) fn queues(&self) -> &[QueueHandle] {
        &self.queues
    }

    /// Forwards input partition `partition` of `topic` to the queue of
    /// the thread its task is on, placing the task first if it is new
    /// here; see [`QueueHandle::forward_partition`].
    pub(super) fn forward_partition(&self, consumer: &BaseConsumer<RuntimeContext>, topic: &str, partition: i32) -> bool {
        let thread = {
            let mut placed = self.placed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match placed.get(&partition) {
                Some(t) => *t,
                None => {
                    let mut load = vec![0usize; self.queues.len()];
                    placed.values().for_each(|t| load[*t] += 1);
                    let t = (0..load.len()).min_by_key(|t| load[*t]).unwrap_or(0);
                    placed.insert(partition, t);
                    if self.queues.len() > 1 {
                        tracing::debug!(partition, thread = t, "task placed on a processing thread");
                    }
                    t
                }
            }
        };
        self.queues[thread].forward_partition(consumer, topic, partition)
    }

    /// Tasks no longer here: their threads take new ones.
    pub(super) fn forget(&self, partitions: impl IntoIterator<Item = i32>) {
        let mut placed = self.placed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for p in partitions {
            placed.remove(&p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::ClientConfig;

    #[test]
    fn new_tasks_go_to_the_thread_with_the_fewest() {
        let c: BaseConsumer<RuntimeContext> = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "kstate-unit")
            .create_with_context(RuntimeContext)
            .unwrap();
        let q = unsafe { RecordQueues::new(&c, 2) };
        for p in [0, 2, 4, 6] {
            assert!(q.forward_partition(&c, "in", p));
        }
        // Another input topic of a placed task: the same thread.
        assert!(q.forward_partition(&c, "other", 4));
        let placed = q.placed.lock().unwrap().clone();
        assert_eq!(placed, BTreeMap::from([(0, 0), (2, 1), (4, 0), (6, 1)]));
        q.forget([0, 4]);
        q.forward_partition(&c, "in", 1);
        q.forward_partition(&c, "in", 3);
        assert_eq!(*q.placed.lock().unwrap(), BTreeMap::from([(1, 0), (2, 1), (3, 0), (6, 1)]));
    }
}
