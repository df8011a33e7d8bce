//! The engine's remote side: opening a store partition's database in
//! object storage ([`remote`]), and a commit's batch as its writes.

use std::path::Path;

use rocksdb::{Options, WriteBatch};

use super::{remote, Engine, EngineResources};
use crate::error::{Error, Result};

impl Engine {
    /// Opens (or creates) the remote database of `store`'s `partition`,
    /// fencing every earlier writer of it; `path` is the store
    /// partition's local directory (nothing is written there).
    pub(crate) fn open_remote(path: &Path, res: &EngineResources, store: &str, partition: i32) -> Result<Engine> {
        let state = res.remote.as_ref().ok_or_else(|| Error::Config(format!("store `{store}` is remote, but the application has no remote_state")))?;
        let db = remote::RemoteDb::open(state, store, partition)?;
        let mut engine = Self::new(path, res, (None, None), Options::default());
        engine.remote = Some(db);
        Ok(engine)
    }

    /// Reads `keys` ahead of their use, where reads are slow (a remote
    /// store: fetched concurrently into its cache); nothing elsewhere.
    pub(crate) fn prefetch(&self, keys: Vec<Vec<u8>>) {
        if let Some(r) = &self.remote {
            r.prefetch(keys);
        }
    }

    /// Whether the store partition lives in object storage.
    pub(crate) fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Deletes every key of a remote store partition (its database and
    /// its fencing stay), before a full restore.
    pub(crate) fn wipe_remote(&self) -> Result<()> {
        match &self.remote {
            Some(r) => r.wipe(),
            None => Ok(()),
        }
    }
}

/// A commit's writes as a remote database's: data keys (deleted where a
/// range deletion covers them, as RocksDB applies ranges after the data)
/// then meta keys, each behind its first byte, one write per key.
pub(super) fn remote_writes(data: WriteBatch, ranges: &[(Vec<u8>, Vec<u8>)], meta: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    struct Collect(std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>);
    impl rocksdb::WriteBatchIterator for Collect {
        fn put(&mut self, key: &[u8], value: &[u8]) {
            self.0.insert(key.to_vec(), Some(value.to_vec()));
        }
        fn delete(&mut self, key: &[u8]) {
            self.0.insert(key.to_vec(), None);
        }
    }
    let mut collected = Collect(Default::default());
    data.iterate(&mut collected);
    let covered = |k: &[u8]| ranges.iter().any(|(from, to)| k >= from.as_slice() && k < to.as_slice());
    let mut out: Vec<_> = collected
        .0
        .into_iter()
        .map(|(k, v)| {
            let v = if covered(&k) { None } else { v };
            (remote::prefixed(remote::DATA, &k), v)
        })
        .collect();
    out.extend(meta.into_iter().map(|(k, v)| (remote::prefixed(remote::META, &k), v)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_becomes_one_write_per_key_with_ranges_applied_after_the_data() {
        let mut data = WriteBatch::default();
        data.put(b"a", b"1");
        data.put(b"k5", b"in the range");
        data.put(b"a", b"2");
        data.delete(b"z");
        let ranges = vec![(b"k0".to_vec(), b"k9".to_vec())];
        let meta = vec![(b"changelog.checkpoint".to_vec(), Some(vec![7]))];
        let writes = remote_writes(data, &ranges, meta);
        assert_eq!(
            writes,
            vec![
                (b"da".to_vec(), Some(b"2".to_vec())),
                (b"dk5".to_vec(), None),
                (b"dz".to_vec(), None),
                (b"mchangelog.checkpoint".to_vec(), Some(vec![7])),
            ]
        );
    }
}
