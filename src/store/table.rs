//! Source tables (`AppBuilder::table`): a key-value store whose changelog
//! is a topic the application reads, not one it writes
//! (docs/architecture.md §18). Its records are applied to the store as
//! they are processed; a commit sends nothing and checkpoints the offset of
//! the last record processed, so the store stays a prefix of its topic.

use crate::error::{Error, Result};

use super::KeyValueStore;

/// The meta key naming a source table's topic (its changelog).
pub(crate) const SOURCE_TOPIC_KEY: &[u8] = b"changelog.source_topic";

/// What a table's values must decode as (`StoreDefinition::table_values`).
#[derive(Clone)]
pub(crate) struct ValueCheck(pub(crate) std::sync::Arc<CheckFn>);

/// Decodes a value, or says why it cannot.
pub(crate) type CheckFn = dyn Fn(&[u8]) -> std::result::Result<(), String> + Send + Sync;

impl std::fmt::Debug for ValueCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ValueCheck")
    }
}

/// The value check of a table and whether a refused value is skipped
/// (else it fails).
pub(crate) type Values = (ValueCheck, bool);

/// What became of a table record.
pub(crate) enum Applied {
    /// Applied (or held already): the key's value before it.
    Old(Option<Vec<u8>>),
    /// Skipped: no key.
    Skipped,
    /// Skipped: a value the table's check refused under
    /// `ProcessingDecision::Continue` (counted and logged by the check).
    Refused,
}

/// Whether a table's record is refused (`Err`: fail, `Ok(true)`: skip),
/// checked by processing and the restore alike. A skip is counted in
/// `kstate_skipped_records_total`; `warned` is the caller's flag for the
/// warning, logged for its first skip only (a topic full of bad values
/// must not flood the log).
pub(crate) fn refused(values: Option<&Values>, value: Option<&[u8]>, at: (&str, i32, i64), warned: &mut bool) -> std::result::Result<bool, String> {
    match (values, value) {
        (Some((check, skip)), Some(v)) => match (check.0)(v) {
            Ok(()) => Ok(false),
            Err(why) if *skip => {
                let (topic, partition, offset) = at;
                metrics::counter!(crate::metrics::SKIPPED_RECORDS, "topic" => topic.to_string(), "partition" => partition.to_string()).increment(1);
                if !std::mem::replace(warned, true) {
                    tracing::warn!(topic, partition, offset, reason = %why,
                        "a table record whose value does not decode; skipped (later ones are only counted, in kstate_skipped_records_total)");
                }
                Ok(true)
            }
            Err(why) => Err(why),
        },
        _ => Ok(false),
    }
}

/// A source table's progress through its topic partition.
#[derive(Debug, Default)]
pub(crate) struct SourceTable {
    /// The next offset to process (every record below it was applied or
    /// skipped): a commit checkpoints the one below.
    next: Option<i64>,
    /// The timestamp of the last record processed: records past the
    /// checkpoint were appended after about then (the age bound the
    /// restore checks against the topic's `delete.retention.ms`).
    last_timestamp: Option<i64>,
    /// Where an active copy's restore ends: the application's committed
    /// offset of the topic (the task processes the records from there as
    /// input). `None` until the task knows it, and for standbys.
    pub(crate) restore_end: Option<i64>,
    /// Exactly-once: local state past the committed offset cannot be the
    /// result of a committed transaction (the offsets were reset), and is
    /// rebuilt; at-least-once it is the commit that a crash interrupted
    /// between the store's write and the offsets', and is kept.
    pub(crate) rebuild_if_ahead: bool,
    /// The table's value check, if any.
    pub(crate) values: Option<Values>,
    /// Whether a skipped bad value was logged.
    warned: bool,
}

/// What a commit of a source table writes besides its data: the
/// checkpoint (the last offset processed) and its age bound.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SourceCheckpoint {
    pub(crate) checkpoint: i64,
    pub(crate) appended_after_ms: Option<i64>,
}

impl KeyValueStore {
    /// Makes this store partition a source table's (its changelog topic is
    /// the table's topic: set when it was opened).
    /// Records the topic in the store's meta keys, for the admin verbs,
    /// which know a store only by its directory.
    pub(crate) fn make_source_table(&mut self, rebuild_if_ahead: bool, values: Option<Values>) -> Result<()> {
        self.source = Some(SourceTable { rebuild_if_ahead, values, ..Default::default() });
        let engine = self.engine();
        if engine.meta_get(SOURCE_TOPIC_KEY)?.as_deref() != Some(self.changelog_topic.as_bytes()) {
            let mut batch = crate::store::engine::Engine::batch();
            engine.put_meta(&mut batch, SOURCE_TOPIC_KEY, self.changelog_topic.as_bytes());
            engine.write_unlogged(batch)?;
        }
        Ok(())
    }

    /// The table's state, if this store is a source table.
    pub(crate) fn source(&self) -> Option<&SourceTable> {
        self.source.as_ref()
    }

    pub(crate) fn source_mut(&mut self) -> Option<&mut SourceTable> {
        self.source.as_mut()
    }

    /// Uncommitted records were dropped: the table is where its
    /// checkpoint says (its task reprocesses the rest).
    pub(super) fn forget_source_progress(&mut self) {
        if let Some(source) = &mut self.source {
            source.next = None;
        }
    }

    /// Refuses a processor's write to a source table.
    pub(super) fn check_writable(&self) -> Result<()> {
        match &self.source {
            Some(_) => Err(Error::InvalidUse(format!(
                "store `{}` is the table of topic `{}`: it changes only through its topic (the processor reads it)",
                self.name, self.changelog_topic
            ))),
            None => Ok(()),
        }
    }

    /// Applies the table topic's record at `offset`: a value replaces the
    /// key's, a tombstone deletes it; a record without a key, or whose
    /// value the table's check refuses under `Continue`, is skipped (and
    /// still moves the checkpoint); under `Fail` a refused value is
    /// [`Error::BadRecord`]. Returns the key's previous value (for a record
    /// at or below the checkpoint, which the store holds already: its
    /// current value, and nothing is written).
    pub(crate) fn apply_source(&mut self, (partition, offset): (i32, i64), key: Option<&[u8]>, value: Option<&[u8]>, timestamp: Option<i64>) -> Result<Applied> {
        let Some(source) = &mut self.source else {
            return Err(Error::InvalidUse(format!("store `{}` is not a table", self.name)));
        };
        let skip = refused(source.values.as_ref(), value, (&self.changelog_topic, partition, offset), &mut source.warned).map_err(|detail| Error::BadRecord {
            topic: self.changelog_topic.clone(),
            partition,
            offset,
            detail,
        })?;
        source.next = Some(source.next.map_or(offset + 1, |n| n.max(offset + 1)));
        if timestamp.is_some() {
            source.last_timestamp = timestamp;
        }
        if skip {
            return Ok(Applied::Refused);
        }
        let Some(key) = key else { return Ok(Applied::Skipped) };
        let old = self.get(key)?;
        if self.checkpoint.is_some_and(|c| offset <= c) {
            // At-least-once, after a crash between the store's write and the
            // offset commit: the store holds this record already (and
            // later ones); writing it again would take keys back in time.
            return Ok(Applied::Old(old));
        }
        self.overlay.write(key, value);
        match value {
            Some(_) => self.metrics.puts.increment(1),
            None => self.metrics.deletes.increment(1),
        }
        self.metrics.overlay_bytes.set(self.overlay.bytes() as f64);
        Ok(Applied::Old(old))
    }

    /// The checkpoint a commit of this table writes, if its processing
    /// moved past the stored checkpoint.
    pub(super) fn source_checkpoint(&self, sealed_at_ms: i64) -> Option<SourceCheckpoint> {
        let source = self.source.as_ref()?;
        let next = source.next?;
        if next - 1 <= self.checkpoint.unwrap_or(-1) && self.overlay.is_empty() {
            return None;
        }
        Some(SourceCheckpoint {
            checkpoint: (next - 1).max(self.checkpoint.unwrap_or(-1)),
            appended_after_ms: source.last_timestamp.map(|t| t.min(sealed_at_ms)),
        })
    }
}
