//! Figures of a store partition's engine: RocksDB's tickers and sizes, or
//! an in-memory store's exact count and bytes.

use rocksdb::{Options, DB};

use super::heap;

/// Cumulative RocksDB ticker counts of one store partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tickers {
    pub(crate) block_cache_hits: u64,
    pub(crate) block_cache_misses: u64,
    pub(crate) stall_micros: u64,
    /// Writes delayed or stopped (a property, not a ticker; carried the same way).
    pub(crate) write_stalls: u64,
}

impl Tickers {
    /// `statistics`: whether the database keeps RocksDB's tickers (else
    /// only the write stalls, a property, are counted).
    pub(super) fn of(options: &Options, db: &DB, statistics: bool) -> Tickers {
        use rocksdb::statistics::Ticker;
        let ticker = |t| if statistics { options.get_ticker_count(t) } else { 0 };
        Tickers {
            block_cache_hits: ticker(Ticker::BlockCacheHit),
            block_cache_misses: ticker(Ticker::BlockCacheMiss),
            stall_micros: ticker(Ticker::StallMicros),
            write_stalls: write_stalls(db),
        }
    }

    /// How far each count moved since `before`; a count below its value
    /// in `before` started again from 0 (a new engine: a wiped or reopened
    /// store).
    pub(crate) fn since(self, before: Tickers) -> Tickers {
        let moved = |now: u64, then: u64| if now >= then { now - then } else { now };
        Tickers {
            block_cache_hits: moved(self.block_cache_hits, before.block_cache_hits),
            block_cache_misses: moved(self.block_cache_misses, before.block_cache_misses),
            stall_micros: moved(self.stall_micros, before.stall_micros),
            write_stalls: moved(self.write_stalls, before.write_stalls),
        }
    }

    pub(super) fn plus(self, other: Tickers) -> Tickers {
        Tickers {
            block_cache_hits: self.block_cache_hits + other.block_cache_hits,
            block_cache_misses: self.block_cache_misses + other.block_cache_misses,
            stall_micros: self.stall_micros + other.stall_micros,
            write_stalls: self.write_stalls + other.write_stalls,
        }
    }
}

/// Sizes of one store partition's data from RocksDB's properties (no scan).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DataStats {
    /// `rocksdb.estimate-num-keys`.
    pub(crate) keys: u64,
    /// Key + value bytes: the raw sizes of every SST entry plus the
    /// memtables. An estimate from above: overwritten and deleted entries
    /// count until compaction drops them.
    pub(crate) logical_bytes: u64,
    /// SST files plus memtables.
    pub(crate) physical_bytes: u64,
    /// `rocksdb.live-sst-files-size`.
    pub(crate) sst_bytes: u64,
    /// `rocksdb.estimate-pending-compaction-bytes`.
    pub(crate) pending_compaction_bytes: u64,
}

impl DataStats {
    /// An in-memory store's: its exact count and bytes (memory, no files).
    pub(super) fn of_heap(state: &heap::HeapState) -> DataStats {
        DataStats {
            keys: state.data.len() as u64,
            logical_bytes: state.data_bytes as u64,
            physical_bytes: state.bytes as u64,
            sst_bytes: 0,
            pending_compaction_bytes: 0,
        }
    }

    pub(super) fn of(db: &DB) -> DataStats {
        let int = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0);
        let text = |name: &str| db.property_value(name).ok().flatten().unwrap_or_default();
        let table = text("rocksdb.aggregated-table-properties");
        let memtables = int("rocksdb.cur-size-all-mem-tables");
        let sst_bytes = int("rocksdb.live-sst-files-size");
        DataStats {
            keys: int("rocksdb.estimate-num-keys"),
            logical_bytes: stat_field(&table, "raw key size", ';') + stat_field(&table, "raw value size", ';') + memtables,
            physical_bytes: sst_bytes + memtables,
            sst_bytes,
            pending_compaction_bytes: int("rocksdb.estimate-pending-compaction-bytes"),
        }
    }
}

/// Stall conditions RocksDB entered (`total-delays` + `total-stops` of
/// `rocksdb.cf-write-stall-stats`).
fn write_stalls(db: &DB) -> u64 {
    let stalls = db.property_value("rocksdb.cf-write-stall-stats").ok().flatten().unwrap_or_default();
    stat_field(&stalls, "total-delays", ',') + stat_field(&stalls, "total-stops", ',')
}

/// The integer after `name` in a RocksDB property text of the form
/// `a=1; b=2` or `a: 1, b: 2` (0 if absent).
fn stat_field(text: &str, name: &str, separator: char) -> u64 {
    text.split(separator)
        .filter_map(|part| part.trim().split_once(['=', ':']))
        .find(|(k, _)| k.trim().ends_with(name))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}
