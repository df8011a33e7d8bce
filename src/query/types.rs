//! What queries take and answer: options, answers with their positions,
//! host metadata, lags, and the typed errors.

use std::time::Duration;

/// Which copy of a store partition answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CopyRole {
    /// The active task's copy: committed state, the freshest there is.
    Active,
    /// A standby's or warmup's copy, following the changelog.
    Standby,
    /// An active task's copy still restoring from the changelog.
    Restoring,
}

/// Where a store partition's state stands: the offset of the last
/// changelog record it reflects (`None`: nothing committed yet). Positions
/// of one store partition only grow (a changelog is only appended to), so
/// "at least this position" is a freshness bound; see
/// [`QueryOptions::at_least`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Position {
    /// The store's name.
    pub store: String,
    /// The store partition (the input partition).
    pub partition: i32,
    /// The changelog offset the state reflects.
    pub offset: Option<i64>,
}

/// How fresh an answer must be, and how long to wait for it.
///
/// The default reads the active copy's committed state and does not wait.
#[derive(Debug, Clone, Default)]
pub struct QueryOptions {
    pub(crate) max_lag: Option<u64>,
    pub(crate) at_least: Option<Position>,
    pub(crate) after_input: Option<(Option<String>, i64)>,
    pub(crate) wait: Option<Duration>,
}

/// How long a read with a freshness bound waits by default.
pub const DEFAULT_QUERY_WAIT: Duration = Duration::from_secs(5);

impl QueryOptions {
    /// Reads of the active copy only (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets a standby, warmup or restoring copy answer when it lags the
    /// changelog's end by at most `records` (the active copy answers when
    /// it is here). The answer says which copy answered and its lag.
    pub fn allow_stale(mut self, records: u64) -> Self {
        self.max_lag = Some(records);
        self
    }

    /// Answers only from state at or past `position` (a position an
    /// earlier answer carried): waits up to [`QueryOptions::wait`], then
    /// fails with [`QueryError::NotYet`].
    pub fn at_least(mut self, position: Position) -> Self {
        self.at_least = Some(position);
        self
    }

    /// Read your own write: answers only once the input record at `offset`
    /// of the key's partition (as the producer's acknowledgement gave it)
    /// is reflected in the active copy's committed state; waits up to
    /// [`QueryOptions::wait`], then fails with [`QueryError::NotYet`]. For
    /// an application with one input topic; see
    /// [`QueryOptions::after_input_of`].
    pub fn after_input(mut self, offset: i64) -> Self {
        self.after_input = Some((None, offset));
        self
    }

    /// [`QueryOptions::after_input`] for the input topic `topic`.
    pub fn after_input_of(mut self, topic: impl Into<String>, offset: i64) -> Self {
        self.after_input = Some((Some(topic.into()), offset));
        self
    }

    /// How long a read with a freshness bound waits for it (default
    /// [`DEFAULT_QUERY_WAIT`], at most an hour).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }
}

/// A value read from one store partition, with the state it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer<T> {
    /// What was read.
    pub value: T,
    /// The state's position: the value is that of the committed state at
    /// exactly this changelog offset.
    pub position: Position,
    /// Which copy answered.
    pub copy: CopyRole,
    /// Records the copy lagged the changelog's end by, as last seen (0
    /// for the active copy).
    pub lag: u64,
}

/// The entries a scan found in the store partitions served here, in key
/// order (by encoded key bytes).
#[derive(Debug)]
pub struct ScanAnswer<K, V> {
    /// Entries, at most the scan's limit.
    pub entries: Vec<(K, V)>,
    /// The partitions read here and the state each was read at.
    pub read: Vec<Answer<()>>,
    /// Partitions not read here, and why (a server forwards these to their
    /// active hosts: [`Queries::active_host`](crate::Queries::active_host)).
    pub skipped: Vec<(i32, QueryError)>,
    /// Whether more entries matched than the limit let through.
    pub truncated: bool,
}

/// Where a key's partition is served, from the group's last assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMetadata {
    /// The key's partition.
    pub partition: i32,
    /// The `application_server` of the instance running it (`None`: none
    /// right now, e.g. while it moves between instances, or no instance
    /// published an endpoint).
    pub active: Option<String>,
    /// The instances keeping a standby or warmup copy.
    pub standbys: Vec<String>,
}

/// An instance of the application, from the group's last assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    /// Its `application_server`.
    pub endpoint: String,
    /// The partitions it runs.
    pub active: Vec<i32>,
    /// The partitions it keeps standby or warmup copies of.
    pub standby: Vec<i32>,
    /// The stores (every instance holds every store of its partitions).
    pub stores: Vec<String>,
}

/// One store partition held here, for routing decisions (Kafka Streams'
/// `allLocalStorePartitionLags`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLag {
    /// The store's name.
    pub store: String,
    /// The store partition.
    pub partition: i32,
    /// Which copy this instance holds.
    pub copy: CopyRole,
    /// The changelog offset the copy reflects.
    pub position: Option<i64>,
    /// The changelog's end offset as last seen (`None`: not known; the
    /// active copy's is not tracked, its lag is 0).
    pub end_offset: Option<i64>,
    /// `None` when the end offset is not known.
    pub lag: Option<u64>,
}

/// Why a query could not be answered. Each is distinct so a server can act
/// on it: retry, forward to the active host, or report. Fields: `store`
/// and `partition` name the store partition asked for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // the fields are named in the enum's docs and each variant's
pub enum QueryError {
    /// The application has not joined its group yet.
    #[error("the application has not started yet")]
    NotStarted,
    /// The application is shutting down or stopped, and the copy asked for
    /// is no longer open here: another instance serves it once the group
    /// moved it (retriable there: ask another instance).
    #[error("the application is shutting down")]
    ShuttingDown,
    /// No store of that name (or an internal one).
    #[error("unknown store `{store}`")]
    UnknownStore { store: String },
    /// The query does not fit the store (`kind`: what the store is;
    /// `detail`: what to do instead).
    #[error("store `{store}` is a {kind} store: {detail}")]
    WrongStoreKind { store: String, kind: &'static str, detail: &'static str },
    /// A key failed its codec, or a stored value failed to decode (`source`).
    #[error("store `{store}`: {source}")]
    Codec { store: String, source: Box<crate::Error> },
    /// The partition's active copy is not here; `active` is the instance
    /// running it, when known (forward the request there).
    #[error("store `{store}` partition {partition} is not served here (active: {})", active.as_deref().unwrap_or("unknown"))]
    NotHosted { store: String, partition: i32, active: Option<String> },
    /// The copy here is still restoring (`lag`: records behind, when known).
    #[error("store `{store}` partition {partition} is restoring here (lag {lag:?})")]
    Restoring { store: String, partition: i32, lag: Option<u64> },
    /// The `copy` here lags `lag` records, more than the `max_lag` allowed.
    #[error("store `{store}` partition {partition}: the {copy:?} copy here lags {lag:?} records, more than {max_lag}")]
    TooStale { store: String, partition: i32, copy: CopyRole, lag: Option<u64>, max_lag: u64 },
    /// The state (at changelog offset `position`) has not reached the
    /// `wanted` bound within the wait.
    #[error("store `{store}` partition {partition} has not reached {wanted} yet (at changelog offset {position:?})")]
    NotYet { store: String, partition: i32, position: Option<i64>, wanted: String },
    /// The position bound does not belong to this store partition, the
    /// input topic is not one of the application's, or a partition is out
    /// of range (`detail` says which).
    #[error("invalid position: {detail}")]
    InvalidPosition { detail: String },
    /// RocksDB failed to read (`source`).
    #[error("store `{store}` partition {partition}: {source}")]
    Storage { store: String, partition: i32, source: Box<crate::Error> },
}

impl QueryError {
    /// Whether the same query may succeed soon, here or at another
    /// instance: `NotHosted`'s active host, or any other while this one
    /// shuts down (rebalances, restores, positions not reached yet, a
    /// clean shutdown moving the partition).
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            QueryError::NotStarted
                | QueryError::ShuttingDown
                | QueryError::NotHosted { .. }
                | QueryError::Restoring { .. }
                | QueryError::TooStale { .. }
                | QueryError::NotYet { .. }
        )
    }
}
