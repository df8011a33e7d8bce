//! kstate's librdkafka clients: client configuration, changelog topics, the
//! producer with its delivery trackers and transactions, output records on
//! their way out, batch polling and fetch wake-ups.

pub(crate) mod changelog;
pub(crate) mod client;
pub(crate) mod consumer_batch;
pub(crate) mod fetch_wake;
mod outputs;
pub(crate) mod topic_id;

pub use changelog::changelog_topic;
pub(crate) use changelog::{
    dooms_transaction_only, ensure_topics, ChangelogProducer, ChangelogSpec, DeliveryTracker, TxnError, RECORD_OVERHEAD,
};
pub(crate) use outputs::OutputSink;
