//! Where a full restore of a window or session store may start: past every
//! record that is sure to be expired once the restore ends (architecture.md
//! §7). Such a changelog holds mostly expired windows (the broker deletes
//! by wall-clock age, a day after the retention); replaying them costs the
//! fetch even though the restore skips them.
//!
//! The bound, from how the store writes: a put is accepted only if its time
//! `t` is not expired, so the store's time `S` at the put is below
//! `t + retention`. Every record before a put `p` in the changelog was
//! written by an earlier commit (its time at most that commit's `S`, which
//! is at most `S` at `p`) or by the same commit before `p` (sent in RocksDB
//! key order: its segment is at most `p`'s, so its time is below `p`'s
//! segment end). Either way its time is below `t_p + margin`, margin =
//! `max(retention, segment interval)`. A restore's final time is at least
//! `T`, the latest time in the changelog's last records; anything below
//! `T - retention + 1` is expired then. So the restore may start at any put
//! `p` with `t_p + margin <= T - retention + 1`: everything before it is
//! expired at the end, and the store's time comes out the same. Compaction
//! only removes records, and a rewound store is restored (observing every
//! record) before it writes again, so the bound holds for any changelog
//! kstate wrote. A binary search over offsets finds a late such put; where
//! it finds none, the restore starts at the beginning, as before.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::store::segments::Segments;

/// Finds live tails with a consumer of its own (small fetches: a probe
/// reads a few records), created at the first restore that needs it.
pub(crate) struct Prober {
    consumer: Option<BaseConsumer>,
    config: rdkafka::ClientConfig,
}

impl Prober {
    pub(crate) fn new(config: rdkafka::ClientConfig) -> Prober {
        Prober { consumer: None, config }
    }

    /// Where a window or session store's restore from empty starts
    /// ([`start_offset`]); `low` if that cannot be read.
    pub(crate) fn start(&mut self, timeout: Duration, topic: &str, partition: i32, (low, high): (i64, i64), segments: &Segments, written_under: i64) -> i64 {
        if self.consumer.is_none() {
            match self.config.create::<BaseConsumer>() {
                Ok(c) => self.consumer = Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create the consumer that finds a window store's live tail; restoring all of it");
                    return low;
                }
            }
        }
        let consumer = self.consumer.as_ref().expect("created above");
        let started = Instant::now();
        let start = match start_offset(consumer, topic, partition, (low, high), segments, written_under, timeout) {
            Ok(start) => start,
            Err(e) => {
                tracing::warn!(%topic, partition, error = %e, "finding the live tail failed; restoring all of the changelog");
                low
            }
        };
        let _ = consumer.unassign();
        if start > low {
            tracing::info!(%topic, partition, start, low, high, skipped = start - low, seconds = started.elapsed().as_secs_f64(),
                "restoring a window or session store from its live tail: records before it are expired");
        }
        start
    }
}

/// Records read at the end of the changelog for its latest time (at most;
/// a quarter of a shorter changelog).
const TAIL: i64 = 500;
/// Probes of the binary search (the start lands within 1/2^PROBES of the
/// changelog's span from the best start).
const PROBES: u32 = 12;
/// Records one probe reads looking for a put (past tombstones).
const PROBE_RECORDS: usize = 64;
/// The search stops with what it found after this long (it delays the
/// restore it would shorten).
const BUDGET: Duration = Duration::from_millis(500);

/// The offset a restore of `segments`' store from empty may start at
/// (`low` when nothing can be skipped); its records were written under a
/// retention of at most `written_under` ms (a shortened retention leaves
/// records written under the longer one).
pub(crate) fn start_offset(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    (low, high): (i64, i64),
    segments: &Segments,
    written_under: i64,
    timeout: Duration,
) -> Result<i64> {
    let tail = TAIL.min((high - low) / 4);
    if tail < 4 {
        return Ok(low);
    }
    // Known to the client at once (an assignment of a topic it has no
    // metadata for waits for a refresh, up to a second).
    consumer.fetch_metadata(Some(topic), timeout)?;
    // Any record restored is a lower bound of the final time: the last ones
    // are near the top.
    let mut latest = i64::MIN;
    read(consumer, topic, partition, high - tail, high, usize::MAX, timeout, |_, key, _| {
        if let Some(t) = segments.time_of(key) {
            latest = latest.max(t);
        }
        false
    })?;
    tracing::debug!(topic, partition, latest, "live tail: the changelog's latest time read");
    if latest == i64::MIN {
        return Ok(low);
    }
    let margin = segments.retention.max(written_under).max(segments.interval);
    let bound = latest.saturating_sub(segments.retention).saturating_add(1).saturating_sub(margin);
    let (mut lo, mut hi, mut best) = (low, high - tail, low);
    let started = Instant::now();
    for _ in 0..PROBES {
        if lo >= hi || started.elapsed() > BUDGET {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let mut found = None;
        read(consumer, topic, partition, mid, hi, PROBE_RECORDS, timeout, |offset, key, value| {
            if value.is_none() {
                return false; // a tombstone is no witness: deletes are not checked
            }
            found = segments.time_of(key).map(|t| (offset, t));
            true
        })?;
        tracing::debug!(topic, partition, mid, ?found, bound, "live tail: probe");
        match found {
            Some((offset, t)) if t <= bound => {
                best = best.max(offset);
                lo = offset + 1;
            }
            _ => hi = mid,
        }
    }
    Ok(best)
}

/// The longest retention a store's changelog records may have been written
/// under: the store's own, or a longer one it had before, which the
/// changelog's `retention.ms` still shows (kstate creates it with the
/// retention plus the additional retention, refuses to start on one that
/// is shorter, so a raised retention was raised there first, and never
/// lowers it; lowering it by hand after a retention was shortened breaks
/// this). `None` for a changelog kept forever (-1), which bounds nothing.
/// `(retention, created_with)` are the store's retention and the
/// `retention.ms` kstate creates its changelog with.
pub(crate) fn written_under((retention, created_with): (i64, i64), topic_retention_ms: i64) -> Option<i64> {
    (topic_retention_ms >= 0).then(|| retention.max(topic_retention_ms.saturating_sub(created_with - retention)))
}

/// Reads `[from, to)` of the partition (at most `limit` records) until
/// `each` returns true.
#[allow(clippy::too_many_arguments)]
fn read(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    from: i64,
    to: i64,
    limit: usize,
    timeout: Duration,
    mut each: impl FnMut(i64, &[u8], Option<&[u8]>) -> bool,
) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from))?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut seen = 0;
    loop {
        if Instant::now() > deadline {
            return Err(Error::Restore { topic: topic.to_string(), partition, detail: format!("reading offsets {from}..{to} timed out") });
        }
        match consumer.poll(Duration::from_millis(20)) {
            // (Any put is a valid witness wherever it is; a message of an
            // earlier assignment is only skipped to keep the search tidy.)
            Some(Ok(m)) if m.offset() < from || m.partition() != partition || m.topic() != topic => {}
            Some(Ok(m)) => {
                if m.offset() >= to {
                    return Ok(());
                }
                seen += 1;
                if each(m.offset(), m.key().unwrap_or_default(), m.payload()) || seen >= limit || m.offset() + 1 >= to {
                    return Ok(());
                }
            }
            Some(Err(e)) => return Err(Error::Restore { topic: topic.to_string(), partition, detail: format!("reading offsets {from}..{to}: {e}") }),
            None => {
                // Transaction markers and compaction gaps hold no records.
                if let Ok(Offset::Offset(p)) = consumer.position().map(|l| l.find_partition(topic, partition).map_or(Offset::Invalid, |e| e.offset())) {
                    if p >= to {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::written_under;

    #[test]
    fn a_shortened_retention_is_remembered_by_the_changelog() {
        const DAY: i64 = 86_400_000;
        // As created: the store's own retention.
        assert_eq!(written_under((60_000, 60_000 + DAY), 60_000 + DAY), Some(60_000));
        // Shortened from an hour: records may carry the hour's bound.
        assert_eq!(written_under((60_000, 60_000 + DAY), 3_600_000 + DAY), Some(3_600_000));
        // A smaller additional retention than the topic's: the longer bound.
        assert_eq!(written_under((60_000, 60_000 + 1_000), 60_000 + DAY), Some(DAY + 59_000));
        assert_eq!(written_under((60_000, 60_000 + DAY), -1), None);
    }
}
