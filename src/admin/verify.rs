//! `verify`: does a store partition hold what its changelog says it should?

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

use super::{escape_bytes, escape_cut, store_partition_dir, AdminError, Kafka, ReadOnly, Result};
use crate::store::segments::{Layout, Segments, TIME};

/// Keys listed per kind of difference (the counts are exact).
pub const MAX_LISTED: usize = 100;
/// Bytes of a value shown in a difference.
const VALUE_SHOWN: usize = 64;

/// A key whose store and changelog disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyDifference {
    /// The key, escaped.
    pub key: String,
    /// The store's value (escaped, cut at 64 bytes), if the store has the key.
    pub store_value: Option<String>,
    /// The changelog's value up to the checkpoint, if it has the key.
    pub changelog_value: Option<String>,
}

/// The outcome of [`verify()`].
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// The application.
    pub application_id: String,
    /// The store.
    pub store: String,
    /// The partition (store and changelog).
    pub partition: i32,
    /// The changelog topic.
    pub changelog_topic: String,
    /// The store's checkpoint (its last flush); `None`: nothing committed,
    /// compared with an empty changelog prefix.
    pub checkpoint: Option<i64>,
    /// The changelog's first offset (above 0: records were deleted from its start).
    pub changelog_start_offset: i64,
    /// The changelog's end offset (high watermark) when read.
    pub changelog_end_offset: i64,
    /// Whether the changelog's start offset is above 0 (truncated: keys
    /// whose only records were deleted show up as only in the store).
    pub changelog_truncated: bool,
    /// Committed changelog records read.
    pub records_read: u64,
    /// Keys in the store.
    pub store_keys: u64,
    /// Keys in the changelog up to the checkpoint.
    pub changelog_keys: u64,
    /// Keys with equal values in both.
    pub matching: u64,
    /// Keys with a changelog record past the checkpoint: compaction may
    /// have removed their earlier records, so they are not compared.
    pub unverifiable: u64,
    /// Keys in both with different values.
    pub different_values: u64,
    /// Keys only in the store.
    pub only_in_store: u64,
    /// Keys only in the changelog.
    pub only_in_changelog: u64,
    /// The differing keys (at most [`MAX_LISTED`] of each kind).
    pub differences: Vec<KeyDifference>,
}

impl VerifyReport {
    /// Keys that differ, of every kind.
    pub fn difference_count(&self) -> u64 {
        self.different_values + self.only_in_store + self.only_in_changelog
    }
}

/// A changelog value as `verify` keeps it: its length, a 128-bit hash and
/// the bytes it would show.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Digest {
    len: usize,
    hash: (u64, u64),
    head: Box<[u8]>,
}

impl Digest {
    fn of(value: &[u8]) -> Digest {
        use std::hash::{BuildHasher, Hasher};
        // Two differently keyed SipHashes: a false "matching" needs a
        // 128-bit collision.
        let hash_with = |k: u64| {
            let mut h = std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().build_hasher();
            h.write_u64(k);
            h.write(value);
            h.finish()
        };
        Digest { len: value.len(), hash: (hash_with(1), hash_with(2)), head: value[..value.len().min(VALUE_SHOWN + 1)].into() }
    }

    /// The value as a difference shows it.
    fn shown(&self) -> String {
        escape_cut(&self.head, VALUE_SHOWN)
    }
}

/// Compares a store partition with its changelog: reads the store (as of
/// its last flush) and its checkpoint C, reads the changelog partition
/// `read_committed` from its start to its end, and compares the store with
/// the changelog's records up to C applied in order. Keys with any record
/// past C are counted as unverifiable, not compared. Works while the
/// application runs. Holds the changelog's keys up to C in memory, each
/// with a digest of its value (about 100 bytes beyond the key). A window
/// or session store compares its live windows (sessions) only: an expired
/// one may be gone from either side.
pub fn verify(state_dir: &Path, app: &str, store: &str, partition: i32, kafka: &Kafka) -> Result<VerifyReport> {
    let dir = store_partition_dir(state_dir, app, store, partition)?;
    let topic = super::changelog_topic_of(&state_dir.join(app), app, store);
    let ro = ReadOnly::open(&dir)?;
    let checkpoint = ro.checkpoint(&dir)?;
    let segments = ro.db.segments()?;
    compare(StoreSide { app, store, partition, topic, checkpoint, segments }, ro.db.iter(), kafka)
}

/// [`verify()`] for a remote store partition (`StoreDefinition::remote`):
/// compares what object storage holds (its newest durable state, read
/// without fencing the writer; a running writer's memtable is not in it)
/// with the changelog up to the checkpoint stored beside it. The store's
/// entries are read into memory. Needs the `remote` feature.
pub fn verify_remote(remote: &crate::RemoteStateConfig, app: &str, store: &str, partition: i32, kafka: &Kafka) -> Result<VerifyReport> {
    let durable = crate::store::engine::remote::read_durable(&remote.url, &remote.options, remote.timeout, (app, store, partition))?;
    let side = StoreSide {
        app,
        store,
        partition,
        topic: crate::kafka::changelog_topic(app, store),
        checkpoint: durable.checkpoint,
        segments: durable.segments,
    };
    compare(side, durable.entries.into_iter().map(Ok::<_, crate::Error>), kafka)
}

/// The store side of a comparison.
struct StoreSide<'a> {
    app: &'a str,
    store: &'a str,
    partition: i32,
    topic: String,
    checkpoint: Option<i64>,
    segments: Option<crate::store::engine::RecordedSegments>,
}

/// Reads the changelog and compares `entries` (the store's, in any order)
/// with it up to the checkpoint.
fn compare<K, V, E>(side: StoreSide<'_>, entries: impl Iterator<Item = std::result::Result<(K, V), E>>, kafka: &Kafka) -> Result<VerifyReport>
where
    K: AsRef<[u8]>,
    V: AsRef<[u8]>,
    AdminError: From<E>,
{
    let StoreSide { app, store, partition, topic, checkpoint, segments } = side;
    let consumer = kafka.consumer()?;
    let (low, high) = kafka.watermarks(&consumer, &topic, partition)?;
    let c = checkpoint.unwrap_or(-1);
    if c >= high {
        return Err(AdminError::Changelog {
            topic,
            detail: format!(
                "partition {partition}: the store's checkpoint {c} is past the changelog's end offset {high} \
                 (changelog truncated or recreated?); kstate would restore this store in full"
            ),
        });
    }

    // Per key, a digest of its value, not the value: memory grows with the
    // keys, not with the store's size.
    let mut model: BTreeMap<Vec<u8>, Digest> = BTreeMap::new();
    let mut later: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut records = 0u64;
    kafka.read(&consumer, &topic, partition, low, high, |offset, key, value| {
        records += 1;
        if offset <= c {
            match value {
                Some(v) => {
                    model.insert(key.to_vec(), Digest::of(v));
                }
                None => {
                    model.remove(key);
                }
            }
        } else {
            later.insert(key.to_vec());
        }
        true
    })?;

    let mut report = VerifyReport {
        application_id: app.to_string(),
        store: store.to_string(),
        partition,
        changelog_topic: topic,
        checkpoint,
        changelog_start_offset: low,
        changelog_end_offset: high,
        changelog_truncated: low > 0,
        records_read: records,
        store_keys: 0,
        changelog_keys: model.len() as u64,
        matching: 0,
        unverifiable: later.len() as u64,
        different_values: 0,
        only_in_store: 0,
        only_in_changelog: 0,
        differences: Vec::new(),
    };
    // A window or session store: RocksDB keys start with their segment,
    // which the changelog key leaves out, and only live windows are
    // compared (an expired one may be gone from either side).
    let segments = segments.map(|r| {
        let layout = if r.layout == Layout::Window.byte() { Layout::Window } else { Layout::Session };
        let mut s = Segments::new(layout, std::time::Duration::from_millis(r.retention.max(0) as u64));
        s.reset(r.time);
        s
    });
    let live = |changelog_key: &[u8]| segments.as_ref().is_none_or(|s| s.time_of(changelog_key).is_some_and(|t| !s.expired(t)));
    model.retain(|k, _| live(k));
    let (mut listed_diff, mut listed_store, mut listed_changelog) = (0, 0, 0);
    let show = |v: &[u8]| Some(escape_cut(v, VALUE_SHOWN));
    for entry in entries {
        let (stored, v) = entry?;
        let (stored, v) = (stored.as_ref(), v.as_ref());
        let k = if segments.is_some() { &stored[TIME.min(stored.len())..] } else { stored };
        if !live(k) {
            continue;
        }
        report.store_keys += 1;
        if later.contains(k) {
            model.remove(k);
            continue;
        }
        match model.remove(k) {
            Some(m) if m == Digest::of(v) => report.matching += 1,
            Some(m) => {
                report.different_values += 1;
                if listed_diff < MAX_LISTED {
                    listed_diff += 1;
                    report.differences.push(KeyDifference { key: escape_bytes(k), store_value: show(v), changelog_value: Some(m.shown()) });
                }
            }
            None => {
                report.only_in_store += 1;
                if listed_store < MAX_LISTED {
                    listed_store += 1;
                    report.differences.push(KeyDifference { key: escape_bytes(k), store_value: show(v), changelog_value: None });
                }
            }
        }
    }
    for (k, m) in model {
        if later.contains(&k) {
            continue;
        }
        report.only_in_changelog += 1;
        if listed_changelog < MAX_LISTED {
            listed_changelog += 1;
            report.differences.push(KeyDifference { key: escape_bytes(&k), store_value: None, changelog_value: Some(m.shown()) });
        }
    }
    Ok(report)
}
