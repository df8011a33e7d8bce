//! How the restore loop writes its batches: through RocksDB's memtable
//! (each with its checkpoint in one write batch), or, for a restore's large
//! batches, as table files (architecture.md §21): full batches go to the
//! file builder thread, and the files it returns are ingested here, in
//! order, each followed by its checkpoint.

use std::path::Path;

use crate::error::{Error, Result};
use crate::restore::file_builder::Built;
use crate::restore::RestoreBatch;
use crate::store::engine::Engine;

use super::{table, RestoreLoop};

/// A restore's last batch is written as a table file from this share of a
/// full one; a smaller one goes through the memtable (one small file more
/// would cost more than it saves).
const LAST_BATCH_FILE_FROM: usize = 4;

/// A batch handed to the file builder, not yet ingested.
pub(super) struct InFlight {
    /// The changelog offset of its last record: the checkpoint it brings.
    last: i64,
    records: u64,
    /// A table copy's age bound (`table::age_bound`) when it was handed over.
    bound: Option<i64>,
}

impl RestoreLoop {
    /// Writes the pending batch with the checkpoint of its last record,
    /// after every batch handed to the file builder.
    pub(super) fn write_batch(&mut self, key: &(String, i32)) {
        self.settle(key);
        if self.ingest_now(key) {
            return;
        }
        let Some((a, store)) = self.store_of(key) else { return };
        if a.batch.len() == 0 && !a.schema.has_changes() {
            return;
        }
        let records = a.batch.len() as u64;
        let last = a.last_offset;
        let mut batch = crate::store::engine::Batch::from(a.batch.take_sorted());
        store.engine().add_refused_changes(&mut batch, a.schema.take_changes());
        if let Some(segments) = &mut a.segments {
            // After the data: records of segments that expired while this
            // batch filled are dropped with them.
            let update = segments.take_update();
            store.engine().add_segments_update(&mut batch, &update);
            store.metrics.segments_dropped.increment(update.dropped);
        }
        // (A table's records past `last` may be older than any read of its
        // end: they were appended after about the last one's timestamp.)
        let bound = if a.standby && a.table.is_none() && last + 1 >= a.seen_end.0 { Some(a.seen_end.1) } else { table::age_bound(a) };
        let result = store.engine().commit_bounded(batch, last, bound);
        if result.is_ok() {
            if let Some(s) = &mut a.segments {
                s.landed();
            }
            store.segments.clone_from(&a.segments);
        }
        self.batch_written(key, result, records, last);
    }

    /// Hands the full batch of `key` to the file builder if it is one to
    /// ingest (true); false: write it with [`RestoreLoop::write_batch`].
    pub(super) fn write_batch_later(&mut self, key: &(String, i32)) -> bool {
        let Some((a, store)) = self.store_of(key) else { return true };
        let Some(file) = ingests(a, 1).then(|| store.engine().table_file()).flatten() else { return false };
        let pending = InFlight { last: a.last_offset, records: a.batch.len() as u64, bound: table::age_bound(a) };
        let (owner, partition, batch) = (a.id, a.partition, std::mem::take(&mut a.batch));
        let max = store.engine().ingest_batch_bytes();
        match self.files.submit(owner, batch, file) {
            Ok(fresh) => {
                if let Some(a) = self.active.get_mut(key) {
                    a.batch = fresh;
                    a.in_flight.push_back(pending);
                    a.ingest_bytes = max.map(|max| batch_limit(a, max));
                }
            }
            Err(detail) => {
                self.files_failed(detail.clone());
                self.fail(partition, Error::Restore { topic: key.0.clone(), partition: key.1, detail });
            }
        }
        true
    }

    /// Writes the remaining batch of `key` as a table file here and now, if
    /// it is one to ingest (true).
    pub(super) fn ingest_now(&mut self, key: &(String, i32)) -> bool {
        let Some((a, store)) = self.store_of(key) else { return true };
        let Some(file) = ingests(a, LAST_BATCH_FILE_FROM).then(|| store.engine().table_file()).flatten() else { return false };
        let (records, last, bound) = (a.batch.len() as u64, a.last_offset, table::age_bound(a));
        let batch = &mut a.batch;
        let written = file.write(|each| batch.drain_sorted(each));
        let result = land(store.engine(), written, file.path(), (last, bound), &mut a.table_files);
        self.batch_written(key, result, records, last);
        true
    }

    /// Ingests the files the builder finished, without waiting.
    pub(super) fn ingest_built(&mut self) {
        loop {
            match self.files.try_next() {
                Ok(Some(built)) => self.ingest_one(built),
                Ok(None) => return,
                Err(detail) => return self.files_failed(detail),
            }
        }
    }

    /// The file builder failed (`detail`): every restore with batches at it
    /// fails, as they are lost or late (a late file finds no owner and is
    /// removed), and none ingests a later file under a lost one's checkpoint.
    fn files_failed(&mut self, detail: String) {
        let hit: Vec<((String, i32), i32)> = self
            .active
            .iter_mut()
            .filter(|(_, a)| !a.in_flight.is_empty())
            .map(|(k, a)| {
                a.in_flight.clear();
                (k.clone(), a.partition)
            })
            .collect();
        for ((topic, p), partition) in hit {
            self.fail(partition, Error::Restore { topic, partition: p, detail: detail.clone() });
        }
    }

    /// Waits until every batch of `key` handed to the builder is ingested
    /// (or its restore failed).
    pub(super) fn settle(&mut self, key: &(String, i32)) {
        while let Some(a) = self.active.get(key).filter(|a| !a.in_flight.is_empty()) {
            let owner = a.id;
            match self.files.next_of(owner) {
                Ok(built) => self.ingest_one(built),
                // (This restore has batches out: it fails with the others.)
                Err(detail) => return self.files_failed(detail),
            }
        }
    }

    /// Drops the `count` files being written for `owner`, whose restore
    /// ended (failed) before they were ingested.
    pub(super) fn discard_files(&mut self, owner: u64, count: usize) {
        for _ in 0..count {
            match self.files.next_of(owner) {
                Ok(built) => {
                    let _ = crate::store::state_dir::remove_if_present(&built.path);
                }
                Err(detail) => {
                    tracing::warn!(%detail, "a restore's table file was not returned; a file may be left in its store directory until it opens again");
                    return;
                }
            }
        }
    }

    fn ingest_one(&mut self, built: Built) {
        let Some(key) = self.active.iter().find(|(_, a)| a.id == built.owner).map(|(k, _)| k.clone()) else {
            // Its restore ended meanwhile (`discard_files` takes these first).
            let _ = crate::store::state_dir::remove_if_present(&built.path);
            return;
        };
        let Some((a, store)) = self.store_of(&key) else {
            let _ = crate::store::state_dir::remove_if_present(&built.path);
            return;
        };
        let Some(InFlight { last, records, bound }) = a.in_flight.pop_front() else {
            let _ = crate::store::state_dir::remove_if_present(&built.path);
            return;
        };
        let result = land(store.engine(), built.result, &built.path, (last, bound), &mut a.table_files);
        self.batch_written(&key, result, records, last);
    }

    /// Records a batch of `records` records up to offset `last` as written
    /// (`result`): the store's checkpoint, metrics and the listener; or
    /// the restore's failure.
    pub(super) fn batch_written(&mut self, key: &(String, i32), result: Result<()>, records: u64, last: i64) {
        let listener = self.listener.clone();
        let Some((a, store)) = self.store_of(key) else { return };
        a.last_write = std::time::Instant::now();
        match result {
            Ok(()) if a.standby => {
                store.set_checkpoint(Some(last));
                store.metrics.standby_records.increment(records);
                let (partition, index) = (a.partition, a.store_index);
                self.publish_standby(partition, index, Some(last));
            }
            Ok(()) => {
                store.set_checkpoint(Some(last));
                store.metrics.restore_records.increment(records);
                let remaining = (a.end - last - 1).max(0) as u64;
                store.metrics.restore_remaining.set(remaining as f64);
                store.metrics.restore_remaining_bytes.set(a.estimated_bytes(remaining) as f64);
                listener.on_batch_restored(&RestoreBatch {
                    store: store.name().to_string(),
                    partition: key.1,
                    batch_end_offset: last,
                    records,
                });
            }
            Err(e) => {
                let p = a.partition;
                self.fail(p, e);
            }
        }
    }
}

/// The bytes of a restore's next table file: about a
/// [`FILES_PER_RESTORE`]th of the restore (the bytes so far, and the
/// records left at their average size), within half `max` and `max`.
/// Small restores make small files (a shorter wait for the last one);
/// large ones make files of up to a memtable, as flushes did, so that a
/// restore leaves as few L0 files as before (past 16 it compacts before
/// the store goes live).
fn batch_limit(a: &super::Active, max: usize) -> usize {
    let total = a.bytes.saturating_add(a.estimated_bytes((a.end - a.last_offset - 1).max(0) as u64));
    usize::try_from(total / FILES_PER_RESTORE).unwrap_or(usize::MAX).clamp(max / 2, max)
}

/// How many table files a restore aims at (see [`batch_limit`]).
const FILES_PER_RESTORE: u64 = 8;

/// Whether this batch is one to ingest: a restore (not a standby) of a
/// plain key-value store, without refused keys to record, holding at least
/// `1 / share` of a full batch's bytes.
fn ingests(a: &super::Active, share: usize) -> bool {
    a.ingest_bytes.is_some_and(|full| a.batch.bytes() >= full / share) && !a.schema.has_changes()
}

/// Lands a batch written as the table file at `path` (`written`: whether
/// it holds any entry, or why it was not written): ingests it, counted in
/// `files`, then records the checkpoint `last` (with its age `bound`);
/// an empty file records the checkpoint alone.
fn land(engine: &Engine, written: Result<bool>, path: &Path, (last, bound): (i64, Option<i64>), files: &mut u64) -> Result<()> {
    if !written? {
        return engine.commit_bounded(Default::default(), last, bound);
    }
    engine.ingest(path, last, bound)?;
    *files += 1;
    Ok(())
}
