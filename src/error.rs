//! The crate's error type.
//!
//! Every failure a user can hit has its own variant, so callers can match on
//! what went wrong instead of parsing messages. The operator tooling's own
//! failures are [`crate::admin::AdminError`].

use std::path::PathBuf;
use std::time::Duration;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in kstate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The application configuration is invalid; nothing was started.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The brokers did not answer within the startup timeout.
    #[error("Kafka brokers at `{bootstrap}` unreachable after {timeout:?}: {detail}")]
    BrokerUnreachable {
        /// The bootstrap servers that were tried.
        bootstrap: String,
        /// How long kstate waited.
        timeout: Duration,
        /// The client's last error, if any.
        detail: String,
    },

    /// The TLS handshake with a broker failed: its certificate is not
    /// trusted or does not name the host, or it refused ours. Not retried.
    #[error("TLS with broker `{broker}` failed: {detail}")]
    Tls {
        /// The broker (`host:port`) of the listener.
        broker: String,
        /// Why, as OpenSSL or the broker put it.
        detail: String,
    },

    /// A broker refused the SASL credentials (wrong user or password, or a
    /// mechanism the listener does not enable). Not retried.
    #[error("SASL {mechanism} authentication with broker `{broker}` failed: {detail}")]
    Authentication {
        /// The broker (`host:port`) of the listener.
        broker: String,
        /// The SASL mechanism tried.
        mechanism: &'static str,
        /// The broker's reason.
        detail: String,
    },

    /// A broker does not speak a request kstate needs in any version kstate
    /// knows, or sent a response kstate cannot read.
    #[error("broker `{broker}` is not supported: {detail}")]
    UnsupportedBroker {
        /// The broker (`host:port`).
        broker: String,
        /// What is missing or malformed.
        detail: String,
    },

    /// kstate's membership in the application's group failed in a way
    /// retrying cannot fix: another instance took this one's
    /// `group.instance.id`, the group is used by other clients with another
    /// protocol, or the group is not authorised.
    #[error("group `{group}`: {detail}")]
    GroupMembership {
        /// The group (the application id).
        group: String,
        /// What the coordinator said and what it means.
        detail: String,
    },

    /// An input topic does not exist on the cluster.
    #[error("input topic `{0}` does not exist (kstate never creates input topics)")]
    MissingInputTopic(String),

    /// A global table's source topic does not exist on the cluster.
    #[error("global table `{table}`: its topic `{topic}` does not exist (kstate never creates a global table's topic)")]
    MissingGlobalTableTopic {
        /// The global table.
        table: String,
        /// Its source topic.
        topic: String,
    },

    /// The tasks' topics (input topics, repartition topics) do not all have
    /// the same partition count: task `p` reads partition `p` of each, so
    /// each must have `partitions` (the first input topic's count).
    #[error("the tasks' topics must be co-partitioned ({partitions} partitions each, as the first input topic): {}", topics.iter().map(|(t, n)| format!("`{t}` has {n}")).collect::<Vec<_>>().join(", "))]
    NotCoPartitioned {
        /// The topics with another partition count, and their counts.
        topics: Vec<(String, i32)>,
        /// The partition count of the first input topic.
        partitions: i32,
    },

    /// A repartition topic cannot be created, or an existing one does not
    /// match what kstate needs (see [`AppBuilder::repartition`](crate::AppBuilder::repartition)).
    #[error("repartition topic `{topic}` is unusable: {problem}")]
    RepartitionTopic {
        /// The repartition topic.
        topic: String,
        /// What is wrong with it.
        problem: String,
    },

    /// A record of a table's topic whose value the table's check refuses
    /// ([`StoreDefinition::table_values`](crate::StoreDefinition::table_values)
    /// with [`ProcessingDecision::Fail`](crate::ProcessingDecision::Fail)),
    /// in processing or in a restore.
    #[error("bad record in `{topic}` partition {partition} at offset {offset}: {detail}")]
    BadRecord {
        /// The table's topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// Why its value was refused.
        detail: String,
    },

    /// The in-memory stores of this instance
    /// ([`StoreDefinition::in_memory`](crate::StoreDefinition::in_memory))
    /// hold more bytes than `max_state_memory` allows. The commit or
    /// restore that crossed the bound was applied (state stays a prefix of
    /// the changelog); nothing more is, and `run` ends with this error
    /// instead of the process being killed for lack of memory.
    #[error("in-memory store partition `{store}` holds {store_bytes} bytes; all in-memory stores hold {total_bytes}, over max_state_memory = {bound}")]
    StateMemory {
        /// The store partition (`store/partition`) whose commit crossed the bound.
        store: String,
        /// Its bytes (keys, values, per-entry overhead).
        store_bytes: u64,
        /// Bytes of every in-memory store partition of the instance.
        total_bytes: u64,
        /// `max_state_memory`.
        bound: u64,
    },

    /// A remote store partition's database (see
    /// [`StoreDefinition::remote`](crate::StoreDefinition::remote)) failed:
    /// `kind` says how. A task whose remote store fails is closed without
    /// commit and re-opened (its database then replays the changelog past
    /// its own checkpoint), as for any store fault; a fenced one waits a
    /// session timeout first. At start (`partition` -1, `store` empty):
    /// the remote state's URL or credentials do not work.
    #[error("remote store `{store}` [{partition}] ({kind:?}): {detail}")]
    RemoteStore {
        /// The store (empty: the remote state as a whole).
        store: String,
        /// The partition (-1: the remote state as a whole).
        partition: i32,
        /// What kind of failure.
        kind: RemoteFailure,
        /// What happened, with the object store's own message.
        detail: String,
    },

    /// A source table's topic (see [`AppBuilder::table`](crate::AppBuilder::table))
    /// cannot be a table: its `cleanup.policy` is `delete` only, so a
    /// restore would miss every key whose records aged out.
    #[error("table topic `{topic}` is unusable: {problem}")]
    TableTopic {
        /// The table's topic.
        topic: String,
        /// What is wrong with it.
        problem: String,
    },

    /// An existing changelog topic does not match the shape kstate needs.
    #[error("changelog topic `{topic}` is unusable: {problem}")]
    ChangelogTopicMismatch {
        /// The changelog topic.
        topic: String,
        /// What is wrong with it, e.g. its partition count or cleanup policy.
        problem: String,
    },

    /// A record is larger than its changelog topic accepts; nothing was written.
    #[error(
        "record for store `{store}` is {size} bytes, over the changelog limit of {limit} bytes \
         (topic max.message.bytes / producer message.max.bytes); nothing was written"
    )]
    RecordTooLarge {
        /// The store the write was for.
        store: String,
        /// Encoded key + value size plus record overhead.
        size: usize,
        /// The largest record the changelog accepts.
        limit: usize,
    },

    /// A value or key could not be encoded or decoded by its codec.
    #[error("codec `{codec}` failed: {source}")]
    Codec {
        /// The codec's name.
        codec: &'static str,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// Another process (or another store handle) holds the state directory lock.
    #[error("state directory `{path}` is locked by another process; gave up after {waited:?}")]
    StateDirLocked {
        /// The locked directory.
        path: PathBuf,
        /// How long kstate retried.
        waited: Duration,
    },

    /// The processor asked for a store that was not defined.
    #[error("no store named `{0}` is defined for this application")]
    UnknownStore(String),

    /// A changelog record could not be delivered; the commit was abandoned and
    /// local state stays at the previous checkpoint.
    #[error("changelog delivery to `{topic}` [{partition}] failed: {source}")]
    ChangelogDelivery {
        /// The changelog topic.
        topic: String,
        /// The changelog partition.
        partition: i32,
        /// The producer's error.
        #[source]
        source: ClientError,
    },

    /// An output record could not be delivered (unknown topic, record too
    /// large, not authorised, or the producer gave up after
    /// `message.timeout.ms`). `run` ends; input offsets past the record
    /// were not committed, so a restart processes it again.
    #[error("output record to `{topic}`{} could not be delivered: {source}", partition.map(|p| format!(" [{p}]")).unwrap_or_default())]
    OutputDelivery {
        /// The output topic.
        topic: String,
        /// The partition, if the record had one.
        partition: Option<i32>,
        /// The producer's error.
        #[source]
        source: ClientError,
    },

    /// Records this member did not write appeared in a changelog partition it
    /// owns (e.g. a zombie instance that lost the partition kept producing).
    /// The commit was abandoned; local state stays at its checkpoint and a
    /// restart restores the changelog as it is.
    #[error(
        "changelog `{topic}` [{partition}] has records this instance did not write: expected its last \
         offset at {expected}, found {found} (another instance writing the same partition?); \
         local state kept at the previous checkpoint"
    )]
    ChangelogDiverged {
        /// The changelog topic.
        topic: String,
        /// The changelog partition.
        partition: i32,
        /// Where our last record would be if only we wrote.
        expected: i64,
        /// Where it is.
        found: i64,
    },

    /// A store's changelog holds values of a schema version this code
    /// does not read and the store definition has no
    /// [`upgrade`](crate::StoreDefinition::upgrade) function for it (or the
    /// function refused one). Not retried: deploy code that reads the
    /// version, give an upgrade function, or restore a savepoint.
    #[error(
        "store `{store}` partition {partition}: changelog values of schema version {found} cannot be read by this code \
         (schema version {expected}): {detail}"
    )]
    SchemaVersion {
        /// The store.
        store: String,
        /// The store partition.
        partition: i32,
        /// The version found (`u32::MAX`: an unreadable header).
        found: u32,
        /// This code's version.
        expected: u32,
        /// What was refused (a key, or the upgrade function's error).
        detail: String,
    },

    /// The group coordinator refused an offset commit for a reason retrying
    /// cannot fix (e.g. the group or topic is not authorised).
    #[error("offset commit failed: {0}")]
    OffsetCommit(String),

    /// A commit did not finish in time (producer flush or offset commit).
    #[error("commit timed out after {0:?} waiting for changelog acknowledgements")]
    CommitTimeout(Duration),

    /// The user's processing function failed; the partition's uncommitted
    /// writes were discarded.
    #[error("processor failed on {topic} [{partition}] @ {offset}: {source}")]
    Processor {
        /// Input topic of the failing record.
        topic: String,
        /// Input partition of the failing record.
        partition: i32,
        /// Offset of the failing record.
        offset: i64,
        /// The processor's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A record's extracted timestamp is invalid (negative, or the record
    /// has none) and [`InvalidTimestamp::Fail`](crate::InvalidTimestamp::Fail)
    /// applies: the processing exception handler, if any, decides, else `run` stops.
    #[error("invalid timestamp {timestamp:?} of {topic} [{partition}] @ {offset} (a timestamp extractor or AppBuilder::on_invalid_timestamp can handle it)")]
    InvalidTimestamp {
        /// Input topic of the record.
        topic: String,
        /// Input partition of the record.
        partition: i32,
        /// Offset of the record.
        offset: i64,
        /// The timestamp extracted (`None`: the record has none).
        timestamp: Option<i64>,
    },

    /// A processor callback other than `process` failed (`init`,
    /// `on_timer`, `punctuate`): `run` stops; the task's uncommitted
    /// writes are discarded and a restart runs the callback again.
    #[error("processor's {callback} failed on partition {partition}: {source}")]
    Callback {
        /// Which callback: `init`, `on_timer` or `punctuate`.
        callback: &'static str,
        /// The task's partition.
        partition: i32,
        /// The processor's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A call the arguments or the configuration do not allow: a
    /// punctuation interval of zero, a timer without
    /// [`AppBuilder::timers`](crate::AppBuilder::timers), timers or
    /// punctuations from a closure processor (they need a [`Processor`](crate::Processor)).
    #[error("invalid use: {0}")]
    InvalidUse(String),

    /// Restoring a store from its changelog failed.
    #[error("restore of `{topic}` [{partition}] failed: {detail}")]
    Restore {
        /// The changelog topic.
        topic: String,
        /// The changelog partition.
        partition: i32,
        /// What went wrong.
        detail: String,
    },

    /// A retriable operation (an offset commit while the group coordinator
    /// or the brokers were unavailable) kept failing for longer than
    /// `task_timeout`; processing went on meanwhile, up to the bound on
    /// uncommitted writes.
    #[error("{operation} kept failing for {retried_for:?} ({attempts} attempts, task_timeout {timeout:?}); last error: {last}")]
    RetriesExhausted {
        /// What was retried.
        operation: &'static str,
        /// How long it kept failing.
        retried_for: Duration,
        /// Failed attempts.
        attempts: u32,
        /// The configured `task_timeout`.
        timeout: Duration,
        /// The last attempt's error.
        #[source]
        last: Box<Error>,
    },

    /// One task (input partition) failed again and again: its stores were
    /// re-initialised from their changelogs after each failure, with
    /// backoff, until the limit was reached.
    #[error("task {partition} failed {attempts} times in a row; last error: {last}")]
    TaskFailed {
        /// The task's input partition.
        partition: i32,
        /// Failures in a row.
        attempts: u32,
        /// The last failure.
        #[source]
        last: Box<Error>,
    },

    /// Exactly-once: a transaction of kstate's producer failed in a way
    /// kstate does not retry (the brokers refuse transactions, the producer
    /// was fenced again and again by another process with the same
    /// `transactional.id`, i.e. the same state directory). Nothing of the
    /// unfinished transaction is visible to `read_committed` readers; local
    /// state stays at its last committed checkpoint.
    #[error("transaction of `{transactional_id}` failed during {operation}: {detail}")]
    Transaction {
        /// The producer's `transactional.id`.
        transactional_id: String,
        /// What kstate was doing (`init`, `begin`, `send offsets`, `commit`, `abort`).
        operation: &'static str,
        /// librdkafka's error.
        detail: String,
    },

    /// An error from the Kafka client.
    #[error("kafka: {0}")]
    Kafka(#[source] ClientError),

    /// An error from RocksDB.
    #[error("rocksdb: {0}")]
    RocksDb(#[source] StorageError),

    /// A file-system error.
    #[error("i/o on `{path}`: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The runtime was shut down while an operation was in progress.
    #[error("the runtime is shutting down")]
    ShuttingDown,
}

/// How a remote store failed ([`Error::RemoteStore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemoteFailure {
    /// Another instance opened the store partition for writing since: this
    /// writer is a zombie, and nothing more of it lands.
    Fenced,
    /// The object store did not answer within the remote state's
    /// `timeout`, or answered that it is unavailable.
    Unavailable,
    /// The object store refused the credentials or the request.
    Refused,
    /// An object is missing or does not read as what it should be: the
    /// database is never read as another state; it names the object.
    Corrupt,
    /// Anything else the storage engine reported.
    Other,
}

/// An error of the Kafka client library (librdkafka through rdkafka).
///
/// kstate's own type, so that an upgrade of the client crate is not a
/// breaking change of kstate's API: it displays the client's message, and
/// [`std::error::Error::source`] goes on with the client's own cause.
#[derive(Debug)]
pub struct ClientError(rdkafka::error::KafkaError);

impl ClientError {
    pub(crate) fn new(error: rdkafka::error::KafkaError) -> Self {
        ClientError(error)
    }

    /// The client's error, for kstate's own decisions.
    pub(crate) fn inner(&self) -> &rdkafka::error::KafkaError {
        &self.0
    }

    /// librdkafka's name of the error code, e.g. `"MessageTimedOut"` or
    /// `"TopicAuthorizationFailed"`, if the error carries one.
    pub fn code(&self) -> Option<String> {
        self.0.rdkafka_error_code().map(|c| format!("{c:?}"))
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// An error of the storage engine (RocksDB through rust-rocksdb).
///
/// kstate's own type, like [`ClientError`]: it displays RocksDB's message.
#[derive(Debug)]
pub struct StorageError(rocksdb::Error);

impl StorageError {
    /// Whether RocksDB found its files corrupt (kstate then restores the
    /// store from its changelog).
    pub fn is_corruption(&self) -> bool {
        self.0.kind() == rocksdb::ErrorKind::Corruption
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StorageError {}

// Conversions for `?` inside the crate. They are trait impls and so visible
// to users, but hidden from the docs: users never hold these foreign errors
// for kstate's sake.
#[doc(hidden)]
impl From<rdkafka::error::KafkaError> for Error {
    fn from(e: rdkafka::error::KafkaError) -> Self {
        Error::Kafka(ClientError(e))
    }
}

#[doc(hidden)]
impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Self {
        Error::RocksDb(StorageError(e))
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn codec(
        codec: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Codec { codec, source: source.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    #[test]
    fn client_errors_read_as_the_clients_own_and_name_their_code() {
        let raw = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        let text = raw.to_string();
        let e = Error::from(raw);
        assert_eq!(e.to_string(), format!("kafka: {text}"));
        let Error::Kafka(client) = &e else { panic!("expected Error::Kafka, got {e:?}") };
        assert_eq!(client.to_string(), text);
        assert_eq!(client.code().as_deref(), Some("MessageTimedOut"));
        assert!(matches!(client.inner(), KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)));
        let source = std::error::Error::source(&e).expect("the client error is the source");
        assert_eq!(source.to_string(), text);
    }
}
