//! The timers of the loaded pages, in memory, ordered by time then key.
//!
//! Grouped by time: a map from each time to the timers due then, each
//! group kept sorted in one buffer (`keys.rs`). A busy task's timers fall
//! on comparatively few distinct times, so finding a timer's group
//! compares integers and placing it within the group compares a few
//! inline key prefixes; one ordered set of every timer, each its own
//! allocation, compared whole keys behind pointers at every level of a
//! deeper tree, and was the largest cost of registering a timer.

use std::collections::{BTreeMap, BTreeSet};

use super::keys::Keys;
use super::queue::time_of;

/// A group larger than this is kept as a tree: inserting into a sorted
/// vector moves its tail, which is cheap only while the vector is small
/// (small in tests, so that the property test reaches trees).
const SMALL: usize = if cfg!(test) { 16 } else { 512 };
/// Emptied groups kept for the next new ones (their memory reused).
const SPARE: usize = 4;

/// The timers of one time.
#[derive(Debug)]
enum Group {
    /// Sorted in descending order: the earliest is popped from the end.
    Small(Keys),
    Large(BTreeSet<Box<[u8]>>),
}

impl Group {
    fn first(&self) -> Option<&[u8]> {
        match self {
            Group::Small(v) => v.last(),
            Group::Large(s) => s.first().map(|tk| &tk[..]),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Group::Small(v) => v.is_empty(),
            Group::Large(s) => s.is_empty(),
        }
    }

    /// Adds `tk`; `false` if it was there.
    fn insert(&mut self, tk: &[u8]) -> bool {
        match self {
            Group::Small(v) => {
                let Err(at) = v.search_descending(tk) else { return false };
                if v.len() < SMALL {
                    v.insert(at, tk);
                    return true;
                }
                let mut set: BTreeSet<Box<[u8]>> = v.iter().map(Box::from).collect();
                set.insert(Box::from(tk));
                *self = Group::Large(set);
                true
            }
            Group::Large(s) => s.insert(Box::from(tk)),
        }
    }

    fn remove(&mut self, tk: &[u8]) -> bool {
        match self {
            Group::Small(v) => match v.search_descending(tk) {
                Ok(at) => {
                    v.remove(at);
                    true
                }
                Err(_) => false,
            },
            Group::Large(s) => s.remove(tk),
        }
    }

    fn pop_into(&mut self, out: &mut Vec<u8>) -> bool {
        match self {
            Group::Small(v) => v.pop_into(out),
            Group::Large(s) => match s.pop_first() {
                Some(tk) => {
                    out.clear();
                    out.extend_from_slice(&tk);
                    true
                }
                None => false,
            },
        }
    }
}

/// A set of timer keys (`ts ++ key`, see `queue.rs`) in key order, which
/// is time order, then key order.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    by_time: BTreeMap<u64, Group>,
    len: usize,
    spare: Vec<Keys>,
}

impl Loaded {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The earliest timer's time (as it sorts: see `time_of`), read from
    /// the group's key, not the timer's.
    pub(crate) fn first_time(&self) -> Option<u64> {
        self.by_time.first_key_value().map(|(t, _)| *t)
    }

    /// The earliest timer.
    pub(crate) fn first(&self) -> Option<&[u8]> {
        self.by_time.first_key_value().and_then(|(_, g)| g.first())
    }

    /// Adds `tk`; `false` if it was there.
    pub(crate) fn insert(&mut self, tk: &[u8]) -> bool {
        let spare = &mut self.spare;
        let group = self.by_time.entry(time_of(tk)).or_insert_with(|| Group::Small(spare.pop().unwrap_or_default()));
        let added = group.insert(tk);
        self.len += usize::from(added);
        added
    }

    /// Removes `tk`; `false` if it was not there.
    pub(crate) fn remove(&mut self, tk: &[u8]) -> bool {
        let time = time_of(tk);
        let Some(group) = self.by_time.get_mut(&time) else { return false };
        let removed = group.remove(tk);
        if group.is_empty() {
            let group = self.by_time.remove(&time);
            self.keep(group);
        }
        self.len -= usize::from(removed);
        removed
    }

    /// Moves the earliest timer into `out` (cleared first); `false` if
    /// there is none.
    pub(crate) fn pop_first_into(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(mut entry) = self.by_time.first_entry() else { return false };
        let popped = entry.get_mut().pop_into(out);
        if entry.get().is_empty() {
            let group = entry.remove();
            self.keep(Some(group));
        }
        self.len -= usize::from(popped);
        popped
    }

    /// Keeps an emptied group's memory for the next new group.
    fn keep(&mut self, group: Option<Group>) {
        if let Some(Group::Small(mut keys)) = group {
            if self.spare.len() < SPARE {
                keys.clear();
                self.spare.push(keys);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Keys of 0 to 9 bytes, most sharing their first 8: the inline
    /// prefix decides some comparisons, the whole key the others.
    fn tk(time: u64, key: u8) -> Vec<u8> {
        let bytes: Vec<u8> = match key % 3 {
            0 => vec![key],
            1 => [&[7u8; 8][..], &[key]].concat(),
            _ => vec![7u8; (key % 9) as usize],
        };
        [&time.to_be_bytes()[..], &bytes].concat()
    }

    proptest! {
        /// Inserts, removes and pops in any order behave as one ordered
        /// set, in small groups and in groups past the tree threshold.
        #[test]
        fn behaves_as_an_ordered_set(ops in proptest::collection::vec((0u8..3, 0u64..4, any::<u8>()), 0..3000)) {
            let (mut loaded, mut model) = (Loaded::default(), BTreeSet::<Vec<u8>>::new());
            let mut popped = Vec::new();
            for (op, time, key) in ops {
                let t = tk(time, key);
                match op {
                    0 => prop_assert_eq!(loaded.insert(&t), model.insert(t)),
                    1 => prop_assert_eq!(loaded.remove(&t), model.remove(&t)),
                    _ => {
                        let got = loaded.pop_first_into(&mut popped).then(|| popped.clone());
                        prop_assert_eq!(got, model.pop_first());
                    }
                }
                prop_assert_eq!(loaded.len(), model.len());
                prop_assert_eq!(loaded.first(), model.first().map(Vec::as_slice));
                prop_assert_eq!(loaded.first_time(), model.first().map(|t| time_of(t)));
            }
        }
    }

    #[test]
    fn a_large_group_becomes_a_tree_and_keeps_its_order() {
        let mut loaded = Loaded::default();
        for i in (0..(SMALL as u32 * 3)).rev() {
            let t = [&7u64.to_be_bytes()[..], &i.to_be_bytes()].concat();
            assert!(loaded.insert(&t));
            assert!(!loaded.insert(&t));
        }
        assert!(matches!(loaded.by_time.get(&7), Some(Group::Large(_))));
        let (mut last, mut t): (Option<Vec<u8>>, Vec<u8>) = (None, Vec::new());
        while loaded.pop_first_into(&mut t) {
            assert!(last.as_ref().is_none_or(|l| *l < t));
            last = Some(t.clone());
        }
        assert!(loaded.is_empty() && loaded.by_time.is_empty());
    }
}
