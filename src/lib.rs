//! # kstate
//!
//! Durable, partition-affine local state for Kafka consumer applications:
//! Kafka Streams' state stores, for Rust.
//!
//! Each input partition owns a local RocksDB store per defined store; every
//! commit also sends the latest write of each key (in key order) to a
//! compacted changelog topic (`<application_id>-<store>-changelog`), much
//! as Kafka Streams' record cache does. A store that is missing or behind
//! is rebuilt by replaying its changelog from the checkpoint kept inside the
//! same RocksDB instance.
//!
//! ```no_run
//! use kstate::codec::{U64Be, Utf8};
//! use kstate::{App, ProcessingGuarantee, StoreDefinition};
//!
//! fn main() -> Result<(), kstate::Error> {
//!     let app = App::builder()
//!         .application_id("word-counts") // group id and changelog prefix
//!         .bootstrap_servers("127.0.0.1:9092")
//!         .input_topic("lines")
//!         .repartition("words") // re-keys each word to the task that counts it
//!         .state_dir("/var/lib/word-counts")
//!         .store(StoreDefinition::new("counts"))
//!         // A count is not idempotent: under at-least-once (the default) a
//!         // crash can count an input twice; exactly-once counts it once.
//!         .processing_guarantee(ProcessingGuarantee::ExactlyOnce)
//!         .build()?;
//!     // SIGINT and SIGTERM stop `run` cleanly (so does `shutdown()` on
//!     // `app.shutdown_handle()` from another thread).
//!     app.shutdown_handle().stop_on_signals();
//!     app.run(|ctx, record| {
//!         if record.topic == "lines" {
//!             for word in record.value_str().unwrap_or_default().split_whitespace() {
//!                 ctx.repartition("words", word.as_bytes(), b"")?;
//!             }
//!             return Ok(());
//!         }
//!         let word = record.key_str().unwrap_or_default().to_string();
//!         let mut counts = ctx.typed_store::<Utf8, U64Be>("counts")?;
//!         let n = counts.get(&word)?.unwrap_or(0);
//!         counts.put(&word, &(n + 1))
//!     })
//! }
//! ```
//!
//! ## Guarantees
//!
//! * **Local state is always a prefix of the changelog.** Writes since the
//!   last commit live in memory; a commit sends them to the changelog and
//!   waits until it has acknowledged them, then writes them to RocksDB
//!   together with the changelog offset in one atomic batch (on a background
//!   thread, while processing continues and reads still see them), then
//!   commits the input offsets (under exactly-once the offsets are part of
//!   the commit's transaction, before RocksDB is written).
//!   RocksDB writes skip its write-ahead log (the changelog is the log): a
//!   crash at any point leaves RocksDB at some committed checkpoint (its
//!   last flush); a restart replays the changelog tail past it, then
//!   processes again the input past the last committed offsets.
//! * **At-least-once processing** (the default). Input past the last
//!   committed offsets is processed again after a crash, and the restored
//!   stores may already hold its writes: a commit whose changelog records
//!   were acknowledged but whose offsets were not committed yet, or the
//!   first keys (in key order) of a commit a crash cut short, are restored,
//!   then their input is applied again. An idempotent update (a `put` of a
//!   value derived from the input alone) ends the same; a counter may count
//!   an input twice. Output records ([`ProcessorContext::send`]) are never
//!   lost, may be duplicated.
//! * **Exactly-once processing**
//!   ([`ProcessingGuarantee::ExactlyOnce`]): each commit is one Kafka
//!   transaction of its changelog records, output records and input offsets
//!   (sent under the member's group generation); the stores land in RocksDB
//!   only after it committed. After a crash, a rebalance or a zombie
//!   instance, every input's effect is in the stores and in the outputs
//!   exactly once for `read_committed` readers.
//! * **The data-loss boundary is the changelog**: what the brokers
//!   acknowledged (`acks=all`) survives the loss of local state. A changelog
//!   topic deleted and recreated, or records deleted past a store's
//!   checkpoint, is detected (by its new topic id or its offsets) and leads
//!   to a full restore of what remains; records deleted from the start of a
//!   changelog that a local store already covers are not (startup warns,
//!   `kstate verify` finds the difference).
//! * **Faults stay small.** A rebalance that refuses an offset commit, or a
//!   broker or group coordinator that is away for a while (up to
//!   `task_timeout`), does not stop the application; a fault of one task's
//!   store (another writer in its changelog, a failed restore, a RocksDB
//!   error) re-initialises that task only (under exactly-once, while a
//!   transaction is open, every running task: they share it). See README's
//!   "What happens when".
//!
//! ## Layout
//!
//! | module | concept |
//! |---|---|
//! | [`App`], [`AppBuilder`] | configuring and running an application |
//! | [`ProcessorContext`], [`Record`], [`Output`] | what the processing function sees and sends |
//! | [`TestDriver`] | a processor run without Kafka, for unit tests |
//! | [`KeyValueStore`], [`TypedStore`], [`codec`] | stores and typed access |
//! | [`restore`] | restore listener and events |
//! | [`metrics`] | metric names |
//! | [`admin`] | operator tooling behind the `kstate` CLI: inspect, sample, verify, estimate restores, snapshot, import, wipe |
//!
//! See `examples/` for a word counter, a crash/restore demo, a Prometheus
//! exporter and the failover benchmark's instance.

#![warn(missing_docs)]

pub mod admin;
mod app;
mod assignment;
pub mod codec;
mod config;
mod context;
mod driver;
mod error;
mod global;
mod join;
mod group;
mod kafka;
pub mod metrics;
mod output;
mod partitioner;
mod processor;
mod query;
mod record;
mod remote_state;
pub mod restore;
mod runtime;
mod shutdown;
mod snapshot;
mod store;
mod table;
mod task;
mod time;
mod timers;
mod windows;

pub use app::{App, AppBuilder};
pub use assignment::AssignmentStrategy;
pub use config::{repartition_topic, ProcessingDecision, ProcessingGuarantee, StoreDefinition};
pub use context::{Outputs, ProcessorContext};
pub use error::{ClientError, Error, RemoteFailure, Result, StorageError};
pub use global::GlobalTable;
pub use join::{JoinKind, JoinOutcome, JoinWindows, Joined, StreamJoin};
pub use kafka::changelog_topic;
pub use driver::{TestDriver, TestDriverBuilder};
pub use output::{Output, SentRecord};
pub use partitioner::{murmur2_partition, Partitioner};
pub use processor::{Processor, ProcessorError};
pub use query::{
    Answer, CopyRole, InstanceInfo, KeyMetadata, LocalLag, Position, Queries, QueryError, QueryOptions, ScanAnswer,
    DEFAULT_QUERY_WAIT, MAX_SCAN_LIMIT,
};
pub use record::{Headers, Record, TimestampType};
pub use remote_state::RemoteStateConfig;
pub use restore::{RestoreBatch, RestoreEnd, RestoreListener, RestoreStart};
pub use shutdown::ShutdownHandle;
pub use table::TableUpdate;
pub use snapshot::{GcReport, RemoteSnapshot, RemoteSnapshotFile, SnapshotConfig, SnapshotHandle};
pub use store::{SnapshotSeed, KeyValueStore, SessionRecord, SessionStore, TypedStore, WindowPut, WindowStore, WindowUpdate};
pub use time::{InvalidTimestamp, Punctuation, PunctuationId, TimeDomain, Timer, TimestampExtractor};
pub use timers::{TimersSummary, TIME_STORE};
pub use windows::{ClosedWindow, Session, SessionWindows, Windows};

/// The README's code blocks, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
