//! Standbys in the restore loop: a standby that copied its changelog in
//! bulk follows it in normal mode once caught up, and now and then records
//! how fresh it is.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::RestoreLoop;
use crate::store::published::Role;

impl RestoreLoop {
    /// Every [`STANDBY_AGE_REFRESH`], a caught-up standby reads its end
    /// offset from the broker; once its position reaches it, its checkpoint
    /// moves to `end - 1` with the time of that read as its age bound, as a
    /// finished restore's does. Without this a standby that follows a quiet
    /// changelog for longer than its `delete.retention.ms` would keep an old
    /// bound (restored in full when promoted: safe, slow), and one that never
    /// had a bound could not be checked at all.
    pub(super) fn refresh_standby_age(&mut self, positions: &TopicPartitionList) {
        let timeout = Duration::from_secs(2);
        for e in positions.elements() {
            let key = (e.topic().to_string(), e.partition());
            let Some(a) = self.active.get_mut(&key) else { continue };
            let Offset::Offset(position) = e.offset() else { continue };
            if !a.standby || a.bulk || a.table.is_some() || a.age_refreshed.elapsed() < a.age_refresh_every {
                continue;
            }
            // One broker round trip per pass at most: commands (a standby
            // promotion waits on them) are served between passes.
            a.age_refreshed = Instant::now();
            let read_at = crate::store::engine::now_ms();
            let Ok((_, high)) = self.consumer.fetch_watermarks(&key.0, key.1, timeout) else { return };
            a.seen_end = (high, read_at);
            if position < high || high == 0 {
                return; // not caught up: the batch that reaches `high` records it
            }
            self.write_batch(&key);
            let Some((a, store)) = self.store_of(&key) else { continue };
            let partition = a.partition;
            let batch = store.segments_batch();
            match store.engine().commit_with_age_bound(batch, high - 1, read_at) {
                Ok(()) => {
                    store.set_checkpoint(Some(high - 1));
                    let index = a.store_index;
                    self.publish_standby(partition, index, Some(high - 1));
                }
                Err(e) => self.fail(partition, e),
            }
            return;
        }
    }

    /// A standby that copied its changelog in bulk reached the end it saw
    /// when it began: from now on it follows in normal mode.
    pub(super) fn standby_caught_up(&mut self, key: &(String, i32)) {
        let _in_job = self.job_span(key.1).entered();
        let Some((a, store)) = self.store_of(key) else { return };
        if !a.bulk {
            return;
        }
        a.bulk = false;
        let partition = a.partition;
        if let Err(e) = store.engine_mut().finish_bulk_load() {
            self.fail(partition, e);
            return;
        }
        // Readable by queries again (withdrawn for the bulk load).
        store.publish(Role::Standby);
        tracing::info!(store = store.name(), partition, checkpoint = ?store.checkpoint(), "standby caught up");
    }

}
