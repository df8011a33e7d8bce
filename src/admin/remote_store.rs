//! `read_remote_store`: what a remote store partition's database holds in
//! object storage (docs/architecture.md §22), read without fencing its
//! writer.

use super::Result;
use crate::RemoteStateConfig;

/// A remote store partition's durable state: what a new owner would open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteStoreContents {
    /// Every entry, in key order (a TTL store's values with their stamp).
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// The changelog offset the entries reflect (`None`: nothing committed).
    pub checkpoint: Option<i64>,
}

/// Reads the durable state of `store`'s `partition` of application
/// `application_id` under `remote`'s URL: what object storage holds (a
/// running writer's memtable is not in it). Opens the database as a
/// reader: the writer is not fenced. Needs the `remote` feature (without
/// it: `Error::Config`).
pub fn read_remote_store(remote: &RemoteStateConfig, application_id: &str, store: &str, partition: i32) -> Result<RemoteStoreContents> {
    let durable = crate::store::engine::remote::read_durable(&remote.url, &remote.options, remote.timeout, (application_id, store, partition))?;
    Ok(RemoteStoreContents { entries: durable.entries, checkpoint: durable.checkpoint })
}
