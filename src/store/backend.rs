//! Where a store's partitions keep their data ([`StoreBackend`]).

/// Where a store's partitions keep their data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum StoreBackend {
    /// One RocksDB instance per partition under the state dir.
    #[default]
    RocksDb,
    /// Ordered maps in memory ([`crate::StoreDefinition::in_memory`]).
    InMemory,
    /// A database in object storage ([`crate::StoreDefinition::remote`]).
    Remote,
    /// A remote store's database opened by a standby task: a reader that
    /// warms this instance's caches and never writes.
    RemoteFollower,
}

impl StoreBackend {
    /// Whether the data lives in object storage.
    pub(crate) fn is_remote(self) -> bool {
        matches!(self, StoreBackend::Remote | StoreBackend::RemoteFollower)
    }
}
