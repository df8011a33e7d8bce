//! How a record key maps to a partition: the [`Partitioner`] that
//! produced the input topics, which queries use to find a key's partition
//! and the runtime checks input records against.

use std::sync::Arc;

mod murmur;

pub use murmur::murmur2_partition;

/// The function that chose the input records' partitions from their keys
/// ([`AppBuilder::partitioner`](crate::AppBuilder::partitioner)). kstate
/// uses it to find a key's partition for interactive queries (and the test
/// driver to place keyed inputs), and checks every keyed input record
/// against it: a record in another partition than the one predicted is
/// counted (`kstate_input_partition_mismatches_total`) and logged, since
/// queries would look for its key on the wrong instance.
///
/// ```
/// use kstate::Partitioner;
/// // The Java clients' default, and librdkafka's `murmur2_random`.
/// assert_eq!(Partitioner::Murmur2.partition(b"user-42", 6), kstate::murmur2_partition(b"user-42", 6));
/// // librdkafka's default (`consistent_random`) for keyed records: CRC32.
/// assert_eq!(Partitioner::Crc32.partition(b"123456789", 7), (0xcbf4_3926u32 % 7) as i32);
/// let own = Partitioner::custom(|key, n| key.first().map_or(0, |b| i32::from(*b) % n));
/// assert_eq!(own.partition(b"a", 4), 1);
/// ```
#[derive(Clone, Default)]
#[allow(clippy::type_complexity)] // the function's type, spelled out in the docs
pub enum Partitioner {
    /// murmur2 of the key, made positive, modulo the partition count: the
    /// Java producer's default and librdkafka's `murmur2_random` (the
    /// default here).
    #[default]
    Murmur2,
    /// CRC32 of the key modulo the partition count: librdkafka's
    /// `consistent_random` (its default, and so the default of Rust, C,
    /// Go, Python and .NET producers built on it) and `consistent`. (For
    /// an empty key `consistent_random` picks a partition at random, so
    /// input records with empty keys are not checked against it.)
    Crc32,
    /// 32-bit FNV-1a of the key, made positive, modulo the partition
    /// count: librdkafka's `fnv1a_random` and `fnv1a` (Sarama's hash
    /// partitioner).
    Fnv1a,
    /// A function of the key and the partition count returning a partition
    /// in `0..count`.
    Custom(Arc<dyn Fn(&[u8], i32) -> i32 + Send + Sync>),
}

impl Partitioner {
    /// A partitioner of your own: `f(key, partition count)`.
    pub fn custom(f: impl Fn(&[u8], i32) -> i32 + Send + Sync + 'static) -> Partitioner {
        Partitioner::Custom(Arc::new(f))
    }

    /// The partition of `key` among `partitions` (positive; -1 otherwise).
    pub fn partition(&self, key: &[u8], partitions: i32) -> i32 {
        if partitions <= 0 {
            return -1;
        }
        match self {
            Partitioner::Murmur2 => murmur2_partition(key, partitions),
            Partitioner::Crc32 => (crc32fast::hash(key) % partitions as u32) as i32,
            Partitioner::Fnv1a => (fnv1a(key) % partitions as u32) as i32,
            Partitioner::Custom(f) => f(key, partitions),
        }
    }

    /// [`partition`](Self::partition), refused (with why) when outside
    /// `0..partitions`, as a custom function's may be.
    pub(crate) fn checked(&self, key: &[u8], partitions: i32) -> std::result::Result<i32, String> {
        let partition = self.partition(key, partitions);
        if (0..partitions).contains(&partition) {
            Ok(partition)
        } else {
            Err(format!("the partitioner gave partition {partition} of {partitions}"))
        }
    }

    /// Its name in logs, and the librdkafka `partitioner` setting that
    /// matches it.
    pub fn name(&self) -> &'static str {
        match self {
            Partitioner::Murmur2 => "murmur2_random",
            Partitioner::Crc32 => "consistent_random",
            Partitioner::Fnv1a => "fnv1a_random",
            Partitioner::Custom(_) => "custom",
        }
    }
}

impl std::fmt::Debug for Partitioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// librdkafka's `rd_fnv1a`: 32-bit FNV-1a, as a signed value made
/// positive (Sarama's hash partitioner does the same).
fn fnv1a(key: &[u8]) -> u32 {
    let h = key.iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)) as i32;
    h.wrapping_abs() as u32
}

/// A topic's records in other partitions than the partitioner predicts.
struct Mismatches {
    topic: String,
    counter: metrics::Counter,
    /// When the last warning was logged.
    logged: Option<std::time::Instant>,
}

/// Counts and logs (at most once a minute per topic) keyed input records
/// that sit in another partition than the partitioner predicts.
pub(crate) fn check_input(partitioner: &Partitioner, topic: &str, partition: i32, partitions: i32, key: &[u8]) {
    // (librdkafka's `consistent_random` places empty keys at random)
    if partitions <= 0 || (key.is_empty() && matches!(partitioner, Partitioner::Crc32)) {
        return;
    }
    let predicted = partitioner.partition(key, partitions);
    if predicted == partition {
        return;
    }
    // Every record of a topic produced with another partitioner can land
    // here: its counter is resolved once per topic, not per record.
    static SEEN: std::sync::Mutex<Vec<Mismatches>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let at = match seen.iter().position(|m| m.topic == topic) {
        Some(at) => at,
        None => {
            let counter = metrics::counter!(crate::metrics::INPUT_PARTITION_MISMATCHES, "topic" => topic.to_string());
            seen.push(Mismatches { topic: topic.to_string(), counter, logged: None });
            seen.len() - 1
        }
    };
    let m = &mut seen[at];
    m.counter.increment(1);
    let now = std::time::Instant::now();
    if m.logged.is_some_and(|at| now.duration_since(at) < std::time::Duration::from_secs(60)) {
        return;
    }
    m.logged = Some(now);
    drop(seen);
    tracing::warn!(
        topic,
        partition,
        predicted,
        partitioner = partitioner.name(),
        "an input record's key belongs to another partition under the configured partitioner: interactive queries look \
         for such keys on the wrong instance. Produce with the same partitioner (librdkafka producers: \
         partitioner={}), or set AppBuilder::partitioner to the producers' (counted in \
         kstate_input_partition_mismatches_total; logged once a minute per topic)",
        partitioner.name()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashes are the ones librdkafka's `rd_crc32` (CRC-32, ISO-HDLC)
    /// and `rd_fnv1a` (32-bit FNV-1a, made positive) compute.
    #[test]
    fn hashes_match_librdkafka() {
        // CRC-32 (ISO-HDLC) check value.
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
        // FNV-1a of "" is its offset basis, negative as an i32: made positive.
        assert_eq!(fnv1a(b""), (0x811c_9dc5u32 as i32).wrapping_abs() as u32);
        assert_eq!(Partitioner::Murmur2.partition(b"x", 0), -1);
    }

    /// Every partitioner gives the partition librdkafka's own function
    /// (the one its producers call) gives, for keys of every length and
    /// partition counts.
    #[test]
    fn partitions_equal_librdkafkas() {
        use rdkafka::bindings::{rd_kafka_msg_partitioner_consistent, rd_kafka_msg_partitioner_fnv1a, rd_kafka_msg_partitioner_murmur2};
        let keys: Vec<Vec<u8>> = (0..2_000u32).map(|i| format!("key-{i}-{}", "x".repeat((i % 37) as usize)).into_bytes())
            .chain([b"kafka".to_vec(), b"giberish123456789".to_vec(), b"a".to_vec(), b"foobar".to_vec(), vec![0xff; 9]])
            .collect();
        for n in [1, 2, 3, 6, 7, 64, 1000] {
            for key in &keys {
                let native = |f: unsafe extern "C" fn(*const _, *const std::ffi::c_void, usize, i32, *mut std::ffi::c_void, *mut std::ffi::c_void) -> i32| {
                    // SAFETY: these partitioners read only `key` and `keylen`.
                    unsafe { f(std::ptr::null(), key.as_ptr().cast(), key.len(), n, std::ptr::null_mut(), std::ptr::null_mut()) }
                };
                assert_eq!(Partitioner::Murmur2.partition(key, n), native(rd_kafka_msg_partitioner_murmur2), "murmur2 {key:?} {n}");
                assert_eq!(Partitioner::Crc32.partition(key, n), native(rd_kafka_msg_partitioner_consistent), "crc32 {key:?} {n}");
                assert_eq!(Partitioner::Fnv1a.partition(key, n), native(rd_kafka_msg_partitioner_fnv1a), "fnv1a {key:?} {n}");
            }
        }
    }
}
