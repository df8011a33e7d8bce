//! Without the `remote` feature: the remote engine's types exist but are
//! never made (configuration refuses remote stores first, and `open`
//! fails), so the engine's dispatch compiles the same way with and
//! without it.

use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use super::Durable;
use crate::error::Result;

/// First byte of a store's own keys.
pub(crate) const DATA: u8 = b'd';
/// First byte of a meta key.
pub(crate) const META: u8 = b'm';

const NEVER: &str = "remote stores need kstate's `remote` feature";

/// Never built without the feature.
#[derive(Debug)]
pub(crate) struct RemoteState(());

impl RemoteState {
    pub(crate) fn flush_interval(&self) -> Duration {
        unreachable!("{NEVER}")
    }
}

/// Never built without the feature.
pub(crate) struct RemoteDb(());

/// Never built without the feature.
pub(crate) struct Snapshot(());

/// Never built without the feature.
pub(crate) struct RemoteScan(());

impl Iterator for RemoteScan {
    type Item = Result<(Vec<u8>, Vec<u8>)>;
    fn next(&mut self) -> Option<Self::Item> {
        unreachable!("{NEVER}")
    }
}

#[allow(clippy::unused_self)]
impl RemoteDb {
    pub(crate) fn open(_state: &Arc<RemoteState>, _store: &str, _partition: i32) -> Result<RemoteDb> {
        Err(crate::error::Error::Config(NEVER.into()))
    }
    pub(crate) fn open_follower(_state: &Arc<RemoteState>, _store: &str, _partition: i32) -> Result<RemoteDb> {
        Err(crate::error::Error::Config(NEVER.into()))
    }
    pub(crate) fn is_follower(&self) -> bool {
        unreachable!("{NEVER}")
    }
    pub(crate) fn get(&self, _prefix: u8, _key: &[u8]) -> Result<Option<Vec<u8>>> {
        unreachable!("{NEVER}")
    }
    pub(crate) fn write(&self, _ranges: &[(Vec<u8>, Vec<u8>)], _writes: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        unreachable!("{NEVER}")
    }
    pub(crate) fn prefetch(&self, _keys: Vec<Vec<u8>>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        unreachable!("{NEVER}")
    }
    pub(crate) fn wipe(&self) -> Result<()> {
        unreachable!("{NEVER}")
    }
    pub(crate) fn snapshot(&self) -> Result<Arc<Snapshot>> {
        unreachable!("{NEVER}")
    }
    pub(crate) fn snapshot_get(&self, _snapshot: &Arc<Snapshot>, _prefix: u8, _key: &[u8]) -> Result<Option<Vec<u8>>> {
        unreachable!("{NEVER}")
    }
    pub(crate) fn scan(&self, _snapshot: Option<Arc<Snapshot>>, _space: u8, _start: Bound<&[u8]>, _end: Bound<&[u8]>) -> RemoteScan {
        unreachable!("{NEVER}")
    }
    pub(crate) fn scan_meta(&self, _from: &[u8]) -> RemoteScan {
        unreachable!("{NEVER}")
    }
    pub(crate) fn flush(&self, _wait: bool) -> Result<()> {
        unreachable!("{NEVER}")
    }
    pub(crate) fn close(&self) -> Result<()> {
        unreachable!("{NEVER}")
    }
}

/// `key` behind its first byte.
pub(crate) fn prefixed(prefix: u8, key: &[u8]) -> Vec<u8> {
    [&[prefix][..], key].concat()
}

/// Without the feature: `Error::Config`.
pub(crate) fn read_durable(
    _url: &str,
    _options: &[(String, String)],
    _timeout: Duration,
    _which: (&str, &str, i32),
) -> Result<Durable> {
    Err(crate::error::Error::Config(NEVER.into()))
}
