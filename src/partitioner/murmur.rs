//! The Java clients' default partitioner for keyed records: murmur2 of the
//! key bytes, made positive, modulo the partition count (librdkafka's
//! `murmur2_random` does the same for records with a key).

/// Kafka's `Utils.murmur2`.
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, b) in tail.iter().enumerate().rev() {
            h ^= u32::from(*b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a record with key `key` among `partitions`, as the
/// Java producer's and librdkafka's `murmur2_random` partitioners choose
/// it (`partitions` must be positive).
pub fn murmur2_partition(key: &[u8], partitions: i32) -> i32 {
    if partitions <= 0 {
        return -1;
    }
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_kafkas_test_vectors() {
        // clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java
        for (key, hash) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(murmur2(key), hash, "{}", String::from_utf8_lossy(key));
        }
        assert_eq!(murmur2_partition(b"foobar", 6), (-790_332_482i32 & 0x7fff_ffff) % 6);
        assert_eq!(murmur2_partition(b"x", 0), -1);
    }
}
