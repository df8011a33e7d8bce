//! Repartition topics (`AppBuilder::repartition`): created and checked at
//! start, and purged below the committed offsets while running
//! (architecture.md §17).
//!
//! A repartition topic is an input of the tasks like the declared ones, so
//! it must have their partition count; it keeps everything
//! (`cleanup.policy=delete`, `retention.ms=-1`) until kstate deletes what
//! the group committed past (`DeleteRecords`), never ahead of a commit.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::kafka::topics::topic_partitions;

/// Creates missing repartition topics (`partitions` each) and checks
/// existing ones: the same partition count as the inputs, and a
/// `cleanup.policy` of `delete` only (compaction would drop records not
/// yet processed).
pub(crate) fn ensure_repartition_topics(
    admin: &AdminClient<DefaultClientContext>,
    topics: &[String],
    partitions: i32,
    replication: Option<i32>,
    timeout: Duration,
) -> Result<()> {
    if topics.is_empty() {
        return Ok(());
    }
    let opts = AdminOptions::new().request_timeout(Some(timeout)).operation_timeout(Some(timeout));
    let mut missing = Vec::new();
    for topic in topics {
        match topic_partitions(admin, topic, timeout)? {
            None => missing.push(topic),
            Some(n) if n != partitions => return Err(Error::NotCoPartitioned { topics: vec![(topic.clone(), n)], partitions }),
            Some(_) => {}
        }
    }
    if !missing.is_empty() {
        let new_topics: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|t| {
                // Segments of 10 minutes (as Kafka Streams'): the broker frees
                // the disk of purged records once their segment rolled.
                NewTopic::new(t, partitions, TopicReplication::Fixed(replication.unwrap_or(-1)))
                    .set("cleanup.policy", "delete")
                    .set("retention.ms", "-1")
                    .set("segment.ms", "600000")
                    .set("message.timestamp.type", "CreateTime")
            })
            .collect();
        for result in futures::executor::block_on(admin.create_topics(&new_topics, &opts))? {
            match result {
                Ok(topic) => tracing::info!(%topic, partitions, "created repartition topic"),
                Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => tracing::info!(%topic, "repartition topic was created concurrently"),
                Err((topic, code)) => {
                    return Err(Error::RepartitionTopic { topic, problem: format!("could not create it: {code}") });
                }
            }
        }
        let deadline = Instant::now() + timeout;
        for topic in &missing {
            while topic_partitions(admin, topic, timeout)? != Some(partitions) {
                if Instant::now() > deadline {
                    return Err(Error::RepartitionTopic { topic: topic.to_string(), problem: "created, but its metadata did not appear in time".into() });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let resources: Vec<ResourceSpecifier<'_>> = topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    for (topic, described) in topics.iter().zip(futures::executor::block_on(admin.describe_configs(&resources, &opts))?) {
        let config = described.map_err(|code| Error::RepartitionTopic { topic: topic.clone(), problem: format!("could not describe its configuration: {code}") })?;
        let policy = config.get("cleanup.policy").and_then(|e| e.value.clone()).unwrap_or_default();
        if policy.split(',').any(|p| p.trim() == "compact") {
            return Err(Error::RepartitionTopic {
                topic: topic.clone(),
                problem: format!("cleanup.policy is `{policy}`: compaction would drop re-keyed records before they are processed; it must be `delete`"),
            });
        }
        if config.get("message.timestamp.type").and_then(|e| e.value.as_deref()) == Some("LogAppendTime") {
            tracing::warn!(%topic, "a repartition topic with message.timestamp.type=LogAppendTime: re-keyed records get the broker's time, not their cause's");
        }
        let retention = config.get("retention.ms").and_then(|e| e.value.as_deref()).and_then(|v| v.parse::<i64>().ok());
        if retention.is_some_and(|ms| ms >= 0) {
            tracing::warn!(%topic, retention_ms = ?retention, "a repartition topic deletes by time: records not processed within its retention (an application stopped that long) are lost; kstate creates them with retention.ms=-1 and purges what was committed");
        }
    }
    Ok(())
}

/// Deletes the records of repartition topics below the offsets the group
/// committed, at most once per interval per partition, on a thread of its
/// own: a purge never waits for the processing thread, nor it for a purge.
/// A failed purge is logged and tried again at the next interval.
pub(crate) struct Purger {
    offsets: Option<Sender<Vec<(String, i32, i64)>>>,
    thread: Option<JoinHandle<()>>,
}

impl Purger {
    /// A purger for `topics` (none: no thread).
    pub(crate) fn start(base: &ClientConfig, topics: &[String], interval: Duration, timeout: Duration) -> Result<Purger> {
        if topics.is_empty() {
            return Ok(Purger { offsets: None, thread: None });
        }
        let admin: AdminClient<DefaultClientContext> = base.create()?;
        let (tx, rx) = mpsc::channel();
        let topics = topics.to_vec();
        let thread = std::thread::Builder::new()
            .name("kstate-purge".into())
            .spawn(move || purge_loop(admin, topics, rx, interval, timeout))
            .map_err(|e| Error::Config(format!("could not start the repartition purge thread: {e}")))?;
        Ok(Purger { offsets: Some(tx), thread: Some(thread) })
    }

    /// Offsets the group committed (next offset to read, per input
    /// partition); those of repartition topics become purgeable.
    pub(crate) fn committed(&self, offsets: Vec<(String, i32, i64)>) {
        if let Some(tx) = &self.offsets {
            let _ = tx.send(offsets);
        }
    }
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.offsets.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn purge_loop(admin: AdminClient<DefaultClientContext>, topics: Vec<String>, offsets: Receiver<Vec<(String, i32, i64)>>, interval: Duration, timeout: Duration) {
    // Per partition: the committed offset, and the offset purged up to.
    let mut committed: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut purged: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut next = Instant::now() + interval;
    loop {
        match offsets.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok(batch) => {
                for (topic, partition, offset) in batch {
                    if topics.contains(&topic) {
                        let c = committed.entry((topic, partition)).or_insert(offset);
                        *c = (*c).max(offset);
                    }
                }
                if Instant::now() < next {
                    continue;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        next = Instant::now() + interval;
        let due: Vec<((String, i32), i64)> =
            committed.iter().filter(|(k, o)| purged.get(*k).is_none_or(|p| p < *o)).map(|(k, o)| (k.clone(), *o)).collect();
        if due.is_empty() {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in &due {
            if tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset)).is_err() {
                continue;
            }
        }
        // (bounded: a shutdown joins this thread)
        let bound = timeout.min(interval).min(Duration::from_secs(10));
        let opts = AdminOptions::new().request_timeout(Some(bound)).operation_timeout(Some(bound));
        match futures::executor::block_on(admin.delete_records(&tpl, &opts)) {
            Ok(result) => {
                for e in result.elements() {
                    let key = (e.topic().to_string(), e.partition());
                    match e.error() {
                        Ok(()) => {
                            let offset = due.iter().find(|(k, _)| *k == key).map_or(0, |(_, o)| *o);
                            purged.insert(key, offset);
                            metrics::counter!(crate::metrics::REPARTITION_PURGES, "topic" => e.topic().to_string()).increment(1);
                        }
                        Err(err) => tracing::warn!(topic = e.topic(), partition = e.partition(), error = %err, "purging a repartition topic failed; trying again later"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "purging the repartition topics failed; trying again later"),
        }
    }
}
