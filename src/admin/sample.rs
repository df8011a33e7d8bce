//! `sample`: what a store partition's data looks like.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::Path;

use serde::Serialize;

use super::{escape_bytes, store_partition_dir, ReadOnly, Result};

/// Distinct prefixes counted one by one; keys of further prefixes are
/// counted together (`other_prefix_keys`), bounding memory.
const MAX_PREFIXES: usize = 1_000_000;

/// How keys are grouped into prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PrefixRule {
    /// The first N bytes of the key (all of a shorter key).
    Bytes(usize),
    /// The key up to (not including) the first occurrence of this byte
    /// (all of a key without it).
    Delimiter(u8),
}

impl Default for PrefixRule {
    fn default() -> Self {
        PrefixRule::Bytes(8)
    }
}

impl PrefixRule {
    fn prefix<'a>(&self, key: &'a [u8]) -> &'a [u8] {
        match *self {
            PrefixRule::Bytes(n) => &key[..n.min(key.len())],
            PrefixRule::Delimiter(d) => key.iter().position(|&b| b == d).map_or(key, |i| &key[..i]),
        }
    }
}

/// The keys of one segment of a window or session store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentStats {
    /// The segment's first time (ms): window starts (session ends) from here.
    pub from_ms: i64,
    /// Keys (windows, sessions) in it.
    pub keys: u64,
}

/// One key with its sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SampledEntry {
    /// The key, escaped ([`super::escape_bytes`]).
    pub key: String,
    /// Key size in bytes.
    pub key_bytes: u64,
    /// Value size in bytes.
    pub value_bytes: u64,
}

/// Keys sharing one prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrefixStats {
    /// The prefix, escaped.
    pub prefix: String,
    /// Keys with it.
    pub keys: u64,
    /// Their key bytes.
    pub key_bytes: u64,
    /// Their value bytes.
    pub value_bytes: u64,
}

/// The shape of one store partition's data (an exact scan).
#[derive(Debug, Clone, Serialize)]
pub struct SampleReport {
    /// The application.
    pub application_id: String,
    /// The store.
    pub store: String,
    /// The partition.
    pub partition: i32,
    /// The checkpoint of the data scanned (the last flush's).
    pub checkpoint: Option<i64>,
    /// Keys (exact).
    pub keys: u64,
    /// Key bytes (exact).
    pub key_bytes: u64,
    /// Value bytes (exact).
    pub value_bytes: u64,
    /// The largest keys, largest first.
    pub largest_keys: Vec<SampledEntry>,
    /// The keys with the largest values, largest first.
    pub largest_values: Vec<SampledEntry>,
    /// How prefixes were taken.
    pub prefix_rule: PrefixRule,
    /// Distinct prefixes (up to 1,000,000 are told apart).
    pub distinct_prefixes: u64,
    /// Keys whose prefix was past the first 1,000,000 distinct ones.
    pub other_prefix_keys: u64,
    /// The prefixes with the most keys, most first.
    pub top_prefixes: Vec<PrefixStats>,
    /// A window or session store: its keys per segment, oldest first
    /// (keys and prefixes above are then the user's key with the window
    /// (`key@start`) or session (`key@start..end`), without the segment).
    pub segments: Option<Vec<SegmentStats>>,
}

/// A segmented store's key, shown as the user's key with its window or session.
fn show_windowed(layout: u8, key: &[u8]) -> String {
    use crate::store::segments::{decode_time, TIME};
    match layout {
        b'w' if key.len() >= TIME => format!("{}@{}", escape_bytes(&key[..key.len() - TIME]), decode_time(&key[key.len() - TIME..])),
        b's' if key.len() >= 2 * TIME => {
            let n = key.len();
            format!("{}@{}..{}", escape_bytes(&key[..n - 2 * TIME]), decode_time(&key[n - TIME..]), decode_time(&key[n - 2 * TIME..n - TIME]))
        }
        _ => escape_bytes(key),
    }
}

/// Scans one store partition: exact totals, the `top` largest keys and
/// values, and key counts and bytes by prefix (the `top` prefixes with the
/// most keys). Works while the application runs.
pub fn sample(state_dir: &Path, app: &str, store: &str, partition: i32, top: usize, rule: PrefixRule) -> Result<SampleReport> {
    let dir = store_partition_dir(state_dir, app, store, partition)?;
    let ro = ReadOnly::open(&dir)?;
    let checkpoint = ro.checkpoint(&dir)?;
    // Min-heaps of the `top` largest (size, key, other size).
    let mut by_key: BinaryHeap<Reverse<(u64, Vec<u8>, u64)>> = BinaryHeap::new();
    let mut by_value: BinaryHeap<Reverse<(u64, Vec<u8>, u64)>> = BinaryHeap::new();
    let mut prefixes: HashMap<Vec<u8>, (u64, u64, u64)> = HashMap::new();
    let (mut keys, mut key_bytes, mut value_bytes, mut other) = (0u64, 0u64, 0u64, 0u64);
    // A window or session store: keys without their segment, counted per segment.
    let recorded = ro.db.segments()?;
    let mut segments: std::collections::BTreeMap<i64, u64> = std::collections::BTreeMap::new();
    let offer = |heap: &mut BinaryHeap<Reverse<(u64, Vec<u8>, u64)>>, size: u64, key: &[u8], other: u64| {
        if top == 0 {
            return;
        }
        if heap.len() < top {
            heap.push(Reverse((size, key.to_vec(), other)));
        } else if heap.peek().is_some_and(|Reverse((s, _, _))| size > *s) {
            heap.pop();
            heap.push(Reverse((size, key.to_vec(), other)));
        }
    };
    for entry in ro.db.iter() {
        let (stored, v) = entry?;
        let k = match recorded {
            Some(_) if stored.len() >= crate::store::segments::TIME => {
                let segment = crate::store::segments::decode_time(&stored);
                *segments.entry(segment).or_default() += 1;
                &stored[crate::store::segments::TIME..]
            }
            _ => &stored[..],
        };
        let (kl, vl) = (k.len() as u64, v.len() as u64);
        keys += 1;
        key_bytes += kl;
        value_bytes += vl;
        offer(&mut by_key, kl, k, vl);
        offer(&mut by_value, vl, k, kl);
        // A window's prefix is taken from the user's key, not its time.
        let user_key = match recorded.map(|r| r.layout) {
            Some(b'w') => &k[..k.len().saturating_sub(crate::store::segments::TIME)],
            Some(_) => &k[..k.len().saturating_sub(2 * crate::store::segments::TIME)],
            None => k,
        };
        let prefix = rule.prefix(user_key);
        if let Some(s) = prefixes.get_mut(prefix) {
            *s = (s.0 + 1, s.1 + kl, s.2 + vl);
        } else if prefixes.len() < MAX_PREFIXES {
            prefixes.insert(prefix.to_vec(), (1, kl, vl));
        } else {
            other += 1;
        }
    }
    let sorted = |heap: BinaryHeap<Reverse<(u64, Vec<u8>, u64)>>, key_first: bool| -> Vec<SampledEntry> {
        // into_sorted_vec of Reverse: largest size first.
        heap.into_sorted_vec()
            .into_iter()
            .map(|Reverse((size, key, other))| {
                let (key_bytes, value_bytes) = if key_first { (size, other) } else { (other, size) };
                let key = match recorded {
                    Some(r) => show_windowed(r.layout, &key),
                    None => escape_bytes(&key),
                };
                SampledEntry { key, key_bytes, value_bytes }
            })
            .collect()
    };
    let distinct_prefixes = prefixes.len() as u64;
    let mut top_prefixes: Vec<(Vec<u8>, (u64, u64, u64))> = prefixes.into_iter().collect();
    top_prefixes.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
    top_prefixes.truncate(top);
    Ok(SampleReport {
        application_id: app.to_string(),
        store: store.to_string(),
        partition,
        checkpoint,
        keys,
        key_bytes,
        value_bytes,
        largest_keys: sorted(by_key, true),
        largest_values: sorted(by_value, false),
        prefix_rule: rule,
        distinct_prefixes,
        other_prefix_keys: other,
        top_prefixes: top_prefixes
            .into_iter()
            .map(|(p, (keys, key_bytes, value_bytes))| PrefixStats { prefix: escape_bytes(&p), keys, key_bytes, value_bytes })
            .collect(),
        segments: recorded.map(|r| {
            segments.into_iter().map(|(segment, keys)| SegmentStats { from_ms: segment.saturating_mul(r.interval), keys }).collect()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_rules() {
        assert_eq!(PrefixRule::Bytes(3).prefix(b"abcdef"), b"abc");
        assert_eq!(PrefixRule::Bytes(8).prefix(b"ab"), b"ab");
        assert_eq!(PrefixRule::Delimiter(b':').prefix(b"user:42"), b"user");
        assert_eq!(PrefixRule::Delimiter(b':').prefix(b"plain"), b"plain");
    }
}
