//! Maps keyed by input topic name, looked up once or twice per record
//! (`mark_processed`): std's SipHash of the name was about 4% of the
//! processing thread, so they use a multiply-rotate hash instead (names
//! are chosen by the application, not by an attacker).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from topic name to `V` with [`TopicHasher`].
pub(crate) type TopicMap<V> = HashMap<String, V, BuildHasherDefault<TopicHasher>>;

/// FxHash's mixing step, eight bytes at a time.
#[derive(Default, Clone, Copy)]
pub(crate) struct TopicHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl TopicHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for TopicHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last));
        }
    }

    #[inline]
    fn write_u8(&mut self, b: u8) {
        self.add(u64::from(b));
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_differ_in_any_byte_or_length_are_told_apart() {
        let mut m: TopicMap<i64> = TopicMap::default();
        let names = ["orders", "orders-", "orders\0", "ordersx", "a-very-long-topic-name-0", "a-very-long-topic-name-1", ""];
        for (i, n) in names.iter().enumerate() {
            m.insert(n.to_string(), i as i64);
        }
        for (i, n) in names.iter().enumerate() {
            assert_eq!(m.get(*n), Some(&(i as i64)));
        }
        assert_eq!(m.len(), names.len());
    }
}
