//! Timer keys (`ts ++ key`, see `queue.rs`) in one byte buffer, each with
//! its time and its key's first bytes inline: no allocation per timer, and
//! most comparisons decided without reading the buffer.

use std::cmp::Ordering;

/// Where one timer key sits, and what orders it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    time: u64,
    prefix: u64,
    at: usize,
    len: usize,
}

/// A timer key's time and its key's first 8 bytes (zero-padded), both as
/// big-endian numbers: ordered as the keys are wherever they differ there.
fn order_of(tk: &[u8]) -> (u64, u64) {
    (super::queue::time_of(tk), crate::store::key_prefix(&tk[8..]))
}

/// Timer keys, in the order the user of it keeps (pushed order until
/// [`Keys::settle`]; descending for a `loaded.rs` group).
#[derive(Debug, Default)]
pub(super) struct Keys {
    bytes: Vec<u8>,
    slots: Vec<Slot>,
    /// Bytes of the keys held; the rest of `bytes` is keys removed.
    live: usize,
}

/// Removed keys' bytes are dropped (the buffer rewritten) once they are
/// more than half of a buffer at least this large, so that a group that
/// never empties (timers registered and deleted at one time, over and
/// over) does not grow without bound.
const RECLAIM_FROM: usize = 4096;

impl Keys {
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn slice(&self, s: &Slot) -> &[u8] {
        &self.bytes[s.at..s.at + s.len]
    }

    fn slot(&mut self, tk: &[u8]) -> Slot {
        let (time, prefix) = order_of(tk);
        let at = self.bytes.len();
        self.bytes.extend_from_slice(tk);
        self.live += tk.len();
        Slot { time, prefix, at, len: tk.len() }
    }

    /// The order of slot `s` against the key `tk` whose order is `o`.
    fn cmp(&self, s: &Slot, o: (u64, u64), tk: &[u8]) -> Ordering {
        (s.time, s.prefix).cmp(&o).then_with(|| self.slice(s).cmp(tk))
    }

    /// Appends `tk`.
    pub(super) fn push(&mut self, tk: &[u8]) {
        let s = self.slot(tk);
        self.slots.push(s);
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.slots.iter().map(|s| self.slice(s))
    }

    /// Keeps the keys `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let bytes = &self.bytes;
        self.slots.retain(|s| keep(&bytes[s.at..s.at + s.len]));
        self.recount();
    }

    fn recount(&mut self) {
        self.live = self.slots.iter().map(|s| s.len).sum();
        self.reclaim();
    }

    /// Rewrites the buffer without removed keys' bytes once they are most of it.
    fn reclaim(&mut self) {
        if self.bytes.len() < RECLAIM_FROM || self.bytes.len() <= 2 * self.live {
            return;
        }
        let mut bytes = Vec::with_capacity(self.live);
        for s in self.slots.iter_mut() {
            let at = bytes.len();
            bytes.extend_from_slice(&self.bytes[s.at..s.at + s.len]);
            s.at = at;
        }
        self.bytes = bytes;
    }

    /// Drops the keys at or below `above`, sorts the rest ascending and
    /// keeps each once.
    pub(super) fn settle(&mut self, above: Option<&[u8]>) {
        if let Some(w) = above {
            self.retain(|tk| tk > w); // (fewer to sort)
        }
        let bytes = &self.bytes;
        let slice = |s: &Slot| &bytes[s.at..s.at + s.len];
        self.slots.sort_unstable_by(|a, b| (a.time, a.prefix).cmp(&(b.time, b.prefix)).then_with(|| slice(a).cmp(slice(b))));
        self.slots.dedup_by(|a, b| (a.time, a.prefix) == (b.time, b.prefix) && slice(a) == slice(b));
        self.recount();
    }

    /// Empties it, keeping its memory.
    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.slots.clear();
        self.live = 0;
    }

    /// Where `tk` is (`Ok`) or goes (`Err`) in keys sorted descending.
    pub(super) fn search_descending(&self, tk: &[u8]) -> Result<usize, usize> {
        let o = order_of(tk);
        self.slots.binary_search_by(|s| self.cmp(s, o, tk).reverse())
    }

    pub(super) fn insert(&mut self, i: usize, tk: &[u8]) {
        let s = self.slot(tk);
        self.slots.insert(i, s);
    }

    pub(super) fn remove(&mut self, i: usize) {
        self.live -= self.slots.remove(i).len;
        self.reclaim();
    }

    pub(super) fn last(&self) -> Option<&[u8]> {
        self.slots.last().map(|s| self.slice(s))
    }

    /// Removes the last key into `out` (cleared first); `false` if empty.
    pub(super) fn pop_into(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(s) = self.slots.pop() else { return false };
        out.clear();
        out.extend_from_slice(&self.bytes[s.at..s.at + s.len]);
        self.live -= s.len;
        self.reclaim();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tk(time: u64, key: &[u8]) -> Vec<u8> {
        [&time.to_be_bytes()[..], key].concat()
    }

    #[test]
    fn settle_sorts_by_time_then_key_drops_the_fired_and_keeps_each_once() {
        let mut keys = Keys::default();
        let all = [tk(5, b"b"), tk(2, b"zzzzzzzzz"), tk(5, b"a"), tk(2, b"zzzzzzzza"), tk(5, b"b"), tk(1, b""), tk(9, b"a")];
        for k in &all {
            keys.push(k);
        }
        keys.settle(Some(&tk(1, b"")));
        let got: Vec<Vec<u8>> = keys.iter().map(<[u8]>::to_vec).collect();
        assert_eq!(got, vec![tk(2, b"zzzzzzzza"), tk(2, b"zzzzzzzzz"), tk(5, b"a"), tk(5, b"b"), tk(9, b"a")]);
    }

    #[test]
    fn keys_inserted_and_removed_over_and_over_do_not_grow_the_buffer() {
        let mut keys = Keys::default();
        keys.insert(0, &tk(1, b"stays"));
        for i in 0..100_000u32 {
            let k = tk(1, &i.to_be_bytes());
            let Err(at) = keys.search_descending(&k) else { panic!("{i} is there already") };
            keys.insert(at, &k);
            let Ok(at) = keys.search_descending(&k) else { panic!("{i} is not there") };
            keys.remove(at);
        }
        assert!(keys.bytes.len() < 2 * RECLAIM_FROM, "{} bytes for one key", keys.bytes.len());
        assert_eq!(keys.iter().collect::<Vec<_>>(), vec![&tk(1, b"stays")[..]]);
        let mut out = Vec::new();
        assert!(keys.pop_into(&mut out) && out == tk(1, b"stays") && keys.is_empty());
    }
}
