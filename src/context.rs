//! What the processing function sees besides the record: the stores of the
//! record's partition and the output producer.

use std::collections::HashMap;

use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::kafka::OutputSink;
use crate::output::Output;
use crate::store::{KeyValueStore, TypedStore};

/// What the processor can reach while handling a record: the stores of the
/// record's partition, and kstate's producer for output records.
pub struct ProcessorContext<'t> {
    partition: i32,
    /// The partition's stores, in definition order.
    stores: &'t mut [KeyValueStore],
    store_index: &'t HashMap<String, usize>,
    outputs: &'t OutputSink,
    /// The input record's timestamp (the outputs' default).
    timestamp: Option<i64>,
}

impl<'t> ProcessorContext<'t> {
    /// The context for one record of `partition`, whose stores are
    /// `stores` (timestamp: the outputs' default).
    pub(crate) fn new(
        partition: i32,
        stores: &'t mut [KeyValueStore],
        store_index: &'t HashMap<String, usize>,
        outputs: &'t OutputSink,
        timestamp: Option<i64>,
    ) -> Self {
        ProcessorContext { partition, stores, store_index, outputs, timestamp }
    }

    /// The partition being processed.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The byte store named `name` for this partition.
    pub fn store(&mut self, name: &str) -> Result<&mut KeyValueStore> {
        let i = *self.store_index.get(name).ok_or_else(|| Error::UnknownStore(name.to_string()))?;
        Ok(&mut self.stores[i])
    }

    /// The store named `name` with key codec `K` and value codec `V`.
    pub fn typed_store<K: Codec, V: Codec>(&mut self, name: &str) -> Result<TypedStore<'_, K, V>> {
        Ok(TypedStore::new(self.store(name)?))
    }

    /// Sends an output record (see [`Output`]). It is part of the commit
    /// of the record being processed: input offsets are committed only once
    /// every output sent before the commit is acknowledged, so a crash may
    /// send an output again but never loses one (at-least-once).
    ///
    /// Fails with [`Error::OutputDelivery`] if the producer refuses the
    /// record at once (larger than `message.max.bytes`, a partition that
    /// does not exist, its queue full for `commit_timeout`); a record the
    /// brokers refuse later (unknown topic, not authorised) makes the next
    /// commit fail with the same error, which ends `run`.
    pub fn send(&mut self, output: Output<'_>) -> Result<()> {
        self.outputs.send(&output, self.timestamp)
    }
}
