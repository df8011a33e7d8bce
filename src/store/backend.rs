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
}
