//! kstate's librdkafka clients: client configuration, changelog topics, the
//! producer with its delivery trackers and transactions, output records on
//! their way out, batch polling and fetch wake-ups.
//!
//! - `client.rs`: librdkafka settings shared by kstate's clients;
//! - `topics.rs`: changelog topic naming, creation and validation;
//! - `repartition.rs`: repartition topics created, checked and purged;
//! - `producer.rs`: the producer of changelog records and outputs, its sends and flushes;
//! - `delivery.rs`: delivery trackers and the callback that counts each delivery;
//! - `transaction.rs`: exactly-once transactions of the producer;
//! - `outputs.rs`: the processor's output records and their tracker;
//! - `memory.rs`: topics in memory for the test driver, and the sink a
//!   store sends its changelog records to (the producer, or memory);
//! - `consumer_batch.rs`: polling a consumer's queue a batch at a time;
//! - `fetch_wake.rs`: waking librdkafka's fetcher after a resume;
//! - `topic_id.rs`: a topic's id, to notice a recreated changelog;
//! - `watermarks.rs`: librdkafka's cached watermarks of a partition.

pub(crate) mod client;
pub(crate) mod consumer_batch;
mod delivery;
pub(crate) mod fetch_wake;
mod memory;
mod outputs;
mod producer;
mod repartition;
mod tables;
pub(crate) mod topic_id;
pub(crate) mod watermarks;
mod topics;
mod transaction;

pub(crate) use delivery::DeliveryTracker;
pub(crate) use memory::{ChangelogSink, MemoryTopics};
pub(crate) use outputs::OutputSink;
pub(crate) use producer::{ChangelogProducer, RECORD_OVERHEAD};
pub use topics::changelog_topic;
pub(crate) use repartition::{ensure_repartition_topics, Purger};
pub(crate) use tables::check_table_topics;
pub(crate) use topics::{ensure_topics, ChangelogInfo, ChangelogSpec};
pub(crate) use transaction::{dooms_transaction_only, TxnError};
