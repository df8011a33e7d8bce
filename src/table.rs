//! What a processor hears of a source table ([`AppBuilder::table`](crate::AppBuilder::table)):
//! each record of the table's topic, after it changed the table.

use crate::record::Record;

/// One change of a source table, handed to
/// [`Processor::on_table_update`](crate::Processor::on_table_update)
/// after the table's store has it: a table-table join reads the other
/// side here, a processor that only looks tables up ignores it.
#[derive(Debug, Clone, Copy)]
pub struct TableUpdate<'a> {
    pub(crate) store: &'a str,
    pub(crate) record: &'a Record<'a>,
    pub(crate) old: Option<&'a [u8]>,
}

impl<'a> TableUpdate<'a> {
    /// The table's store.
    pub fn store(&self) -> &'a str {
        self.store
    }

    /// The key that changed.
    pub fn key(&self) -> &'a [u8] {
        self.record.key.unwrap_or_default()
    }

    /// The value before this record (`None`: the key was absent).
    pub fn old(&self) -> Option<&'a [u8]> {
        self.old
    }

    /// The value now (`None`: the record was a tombstone and deleted it).
    pub fn new_value(&self) -> Option<&'a [u8]> {
        self.record.value
    }

    /// The record of the table's topic.
    pub fn record(&self) -> &'a Record<'a> {
        self.record
    }
}
