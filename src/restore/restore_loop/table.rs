//! Source tables in the restore loop (docs/architecture.md §18): a
//! table's topic runs ahead of what the application processed, so a copy
//! applies only records below the application's committed offset of it.
//! An active copy's restore ends there (the task processes the rest as
//! input); a standby stops there and waits until the offset moves.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::{Active, RestoreLoop};
use crate::error::{Error, Result};

/// How often a standby's table copy reads the committed offset again.
const LIMIT_REFRESH: Duration = Duration::from_secs(1);

/// Reads the application's committed offset of a table topic partition
/// (`None`: nothing committed, or not readable now).
pub(crate) type CommittedOffsets = std::sync::Arc<dyn Fn(&str, i32) -> Option<i64> + Send + Sync>;

/// A table copy's state in the restore loop.
pub(super) struct TableCopy {
    /// A standby's limit: the committed offset it applies records below.
    /// `None`: an active copy, whose `end` is the committed offset.
    pub(super) limit: Option<i64>,
    /// A standby stopped at its limit: its partition is paused, to be read
    /// again from this offset once the limit passes it.
    pub(super) parked_at: Option<i64>,
    pub(super) limit_read: Instant,
    /// The timestamp of the last record applied: the topic's records past
    /// it were appended after about then (the copy's age bound).
    pub(super) last_timestamp: Option<i64>,
    /// The table's value check (`table_values`), as processing applies it.
    values: Option<crate::store::table::Values>,
    /// Whether a skipped bad value was logged.
    warned: bool,
}

/// What the restore does with a table's record.
pub(super) enum Gate {
    Apply,
    /// Past the end of an active copy: not applied; the copy is done.
    Finish,
    /// At a standby's limit: not applied; the copy waits.
    Park,
    /// Read before the partition was paused: not applied.
    Drop,
}

/// A table's record is to be applied: notes its timestamp and checks its
/// value as processing does (`Ok(true)`: skip it; `Err`: a bad record
/// under `Fail`).
pub(super) fn applying(a: &mut Active, (topic, offset): (&[u8], i64), timestamp: Option<i64>, value: Option<&[u8]>) -> std::result::Result<bool, String> {
    let partition = a.partition;
    let Some(t) = &mut a.table else { return Ok(false) };
    if timestamp.is_some() {
        t.last_timestamp = timestamp;
    }
    if t.values.is_none() {
        return Ok(false);
    }
    let topic = String::from_utf8_lossy(topic);
    crate::store::table::refused(t.values.as_ref(), value, (&topic, partition, offset), &mut t.warned)
}

/// A table copy's age bound for what it writes: the last applied record's
/// timestamp, no later than now (`None`: not a table, or nothing applied).
pub(super) fn age_bound(a: &Active) -> Option<i64> {
    let ts = a.table.as_ref()?.last_timestamp?;
    Some(ts.min(crate::store::engine::now_ms()))
}

pub(super) fn gate(a: &Active, offset: i64) -> Gate {
    let Some(t) = &a.table else { return Gate::Apply };
    match t.limit {
        None if offset >= a.end => Gate::Finish,
        None => Gate::Apply,
        Some(_) if t.parked_at.is_some() => Gate::Drop,
        Some(limit) if offset >= limit => Gate::Park,
        Some(_) => Gate::Apply,
    }
}

impl RestoreLoop {
    /// A table copy's end and state: an active copy's end is the committed
    /// offset (capped at `high`), a standby's its limit. `None`: not a table.
    pub(super) fn table_copy(&self, topic: &str, partition: i32, index: usize, high: i64) -> Result<Option<(TableCopy, i64)>> {
        let Some(job) = self.jobs.get(&partition) else { return Ok(None) };
        let Some(source) = job.stores[index].source() else { return Ok(None) };
        let now = Instant::now();
        if job.standby {
            let limit = self.committed.as_ref().and_then(|read| read(topic, partition)).unwrap_or(0);
            return Ok(Some((TableCopy { limit: Some(limit), parked_at: None, limit_read: now, last_timestamp: None, values: source.values.clone(), warned: false }, high.min(limit))));
        }
        // (Set by the opener from the committed offsets; 0 would skip the
        // records between the checkpoint and the task's start.)
        let Some(restore_end) = source.restore_end else {
            return Err(Error::Restore { topic: topic.to_string(), partition, detail: "the table's restore end (the committed offset) is not known".into() });
        };
        Ok(Some((TableCopy { limit: None, parked_at: None, limit_read: now, last_timestamp: None, values: source.values.clone(), warned: false }, high.min(restore_end))))
    }

    /// Stops a standby's table copy at its limit: what it applied is
    /// written, its partition paused until the limit passes `offset`.
    pub(super) fn park(&mut self, key: &(String, i32), offset: i64) {
        self.write_batch(key);
        let Some(t) = self.active.get_mut(key).and_then(|a| a.table.as_mut()) else { return };
        t.parked_at = Some(offset);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&key.0, key.1);
        if let Err(e) = self.consumer.pause(&tpl) {
            tracing::warn!(topic = %key.0, partition = key.1, error = %e, "pausing a standby's table topic failed");
        }
    }

    /// Every [`LIMIT_REFRESH`], a standby's table copy reads the committed
    /// offset again; a parked copy whose limit moved reads on from where
    /// it stopped.
    pub(super) fn refresh_table_limits(&mut self) {
        let Some(read) = self.committed.clone() else { return };
        let due: Vec<(String, i32)> = self
            .active
            .iter()
            .filter(|(_, a)| a.table.as_ref().is_some_and(|t| t.limit.is_some() && t.limit_read.elapsed() >= LIMIT_REFRESH))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let limit = read(&key.0, key.1);
            let Some(t) = self.active.get_mut(&key).and_then(|a| a.table.as_mut()) else { continue };
            t.limit_read = Instant::now();
            let Some(limit) = limit else { continue };
            t.limit = Some(limit);
            let Some(at) = t.parked_at.filter(|at| limit > *at) else { continue };
            t.parked_at = None;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&key.0, key.1);
            let resumed = self
                .consumer
                .seek(&key.0, key.1, Offset::Offset(at), Duration::from_secs(5))
                .and_then(|()| self.consumer.resume(&tpl));
            if let Err(e) = resumed {
                tracing::warn!(topic = %key.0, partition = key.1, error = %e, "resuming a standby's table topic failed; restarting it");
                self.restart(std::slice::from_ref(&key));
            }
        }
    }
}
