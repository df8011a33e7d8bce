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
//! ## Guarantees
//!
//! * **Local state is always a prefix of the changelog.** Writes since the
//!   last commit live in memory; a commit sends them to the changelog and
//!   waits until it has acknowledged them, then writes them to RocksDB
//!   together with the changelog offset in one atomic batch (on a background
//!   thread, while processing continues and reads still see them), then
//!   commits the input offsets.
//!   RocksDB writes skip its write-ahead log (the changelog is the log): a
//!   crash at any point leaves RocksDB at some committed checkpoint (its
//!   last flush), and restart replays only the changelog tail past it.
//! * **At-least-once processing** (the default). Records processed after
//!   the last commit are processed again after a crash; their writes may
//!   then appear twice in the changelog, which is harmless for idempotent
//!   updates (`put` of a computed value). A crash in the middle of a commit
//!   can leave part of its records (the first keys in key order) in the
//!   changelog; a restart replays them, then reprocesses the commit's input.
//!   Output records ([`ProcessorContext::send`]) are never lost, may be
//!   duplicated.
//! * **Exactly-once processing**
//!   ([`ProcessingGuarantee::ExactlyOnce`]): each commit is one Kafka
//!   transaction of its changelog records, output records and input offsets
//!   (sent under the member's group generation); the stores land in RocksDB
//!   only after it committed. After a crash, a rebalance or a zombie
//!   instance, every input's effect is in the stores and in the outputs
//!   exactly once for `read_committed` readers. The data-loss
//!   boundary is the changelog itself: what the brokers acknowledged
//!   (`acks=all`) survives; a changelog topic deleted or truncated behind
//!   kstate's back is detected (by its offsets or its new topic id) and
//!   leads to a full restore of what remains.
//! * **Faults stay small.** A rebalance that refuses an offset commit, or a
//!   broker or group coordinator that is away for a while (up to
//!   `task_timeout`), does not stop the application; a fault of one task's
//!   store (another writer in its changelog, a failed restore, a RocksDB
//!   error) re-initialises that task only. See README's "What happens when".
//!
//! ## Layout
//!
//! | module | concept |
//! |---|---|
//! | [`App`], [`AppBuilder`] | configuring and running an application |
//! | [`ProcessorContext`], [`Record`] | what the processing function sees |
//! | [`KeyValueStore`], [`TypedStore`], [`codec`] | stores and typed access |
//! | [`restore`] | restore listener and events |
//! | [`metrics`] | metric names |
//! | [`admin`] | operator tooling behind the `kstate` CLI: inspect, sample, verify, estimate restores, snapshot, import, wipe |
//!
//! See `examples/` for a word counter and a crash/restore demo.

#![warn(missing_docs)]

pub mod admin;
mod app;
mod assignment;
pub mod codec;
mod config;
mod context;
mod error;
mod group;
mod kafka;
pub mod metrics;
mod output;
mod record;
pub mod restore;
mod runtime;
mod shutdown;
mod store;
mod task;

pub use app::{App, AppBuilder};
pub use assignment::AssignmentStrategy;
pub use config::{ProcessingDecision, ProcessingGuarantee, StoreDefinition};
pub use context::ProcessorContext;
pub use error::{ClientError, Error, Result, StorageError};
pub use kafka::changelog_topic;
pub use output::Output;
pub use record::{Headers, Record, TimestampType};
pub use restore::{RestoreBatch, RestoreEnd, RestoreListener, RestoreStart};
pub use shutdown::ShutdownHandle;
pub use store::{KeyValueStore, TypedStore};
