//! The engine's remote side: opening a store partition's database in
//! object storage ([`remote`]), and a commit's batch as its writes.

use std::path::Path;

use rocksdb::{Options, WriteBatch};

use super::{remote, Engine, EngineResources};
use crate::error::{Error, Result};

impl Engine {
    /// Opens (or creates) the remote database of `store`'s `partition`,
    /// fencing every earlier writer of it, or (`follower`, a standby task)
    /// as a reader that fences no one and writes nothing; `path` is the
    /// store partition's local directory (nothing is written there).
    pub(crate) fn open_remote(path: &Path, res: &EngineResources, store: &str, partition: i32, follower: bool) -> Result<Engine> {
        let state = res.remote.as_ref().ok_or_else(|| Error::Config(format!("store `{store}` is remote, but the application has no remote_state")))?;
        let db = if follower { remote::RemoteDb::open_follower(state, store, partition)? } else { remote::RemoteDb::open(state, store, partition)? };
        let mut engine = Self::new(path, res, (None, None), Options::default());
        engine.remote = Some(db);
        Ok(engine)
    }

    /// Reads `keys` ahead of their use where reads are slow (a remote
    /// store: concurrently) and returns what each holds; nothing elsewhere.
    pub(crate) fn prefetch(&self, keys: Vec<Vec<u8>>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        match &self.remote {
            Some(r) if !keys.is_empty() => r.prefetch(keys),
            _ => Vec::new(),
        }
    }

    /// Whether the store partition lives in object storage.
    pub(crate) fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Whether this is a standby's reader of a remote store partition.
    pub(crate) fn is_remote_follower(&self) -> bool {
        self.remote.as_ref().is_some_and(|r| r.is_follower())
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

/// A commit's writes as a remote database's, in order: data keys
/// (deleted where a range deletion covers them, as RocksDB applies ranges
/// after the data) then meta keys, each behind its first byte. A key may
/// come more than once; the database's batch keeps the last.
pub(super) fn remote_writes(data: WriteBatch, ranges: &[(Vec<u8>, Vec<u8>)], meta: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    struct Collect<'r> {
        out: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        ranges: &'r [(Vec<u8>, Vec<u8>)],
    }
    impl Collect<'_> {
        fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
            let covered = self.ranges.iter().any(|(from, to)| key >= from.as_slice() && key < to.as_slice());
            let value = if covered { None } else { value.map(<[u8]>::to_vec) };
            self.out.push((remote::prefixed(remote::DATA, key), value));
        }
    }
    impl rocksdb::WriteBatchIterator for Collect<'_> {
        fn put(&mut self, key: &[u8], value: &[u8]) {
            self.push(key, Some(value));
        }
        fn delete(&mut self, key: &[u8]) {
            self.push(key, None);
        }
    }
    let mut collected = Collect { out: Vec::with_capacity(data.len() + meta.len()), ranges };
    data.iterate(&mut collected);
    let mut out = collected.out;
    out.extend(meta.into_iter().map(|(k, v)| (remote::prefixed(remote::META, &k), v)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_becomes_its_writes_in_order_with_ranges_applied_after_the_data() {
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
                (b"da".to_vec(), Some(b"1".to_vec())),
                (b"dk5".to_vec(), None),
                (b"da".to_vec(), Some(b"2".to_vec())),
                (b"dz".to_vec(), None),
                (b"mchangelog.checkpoint".to_vec(), Some(vec![7])),
            ]
        );
    }
}
