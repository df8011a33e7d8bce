//! Freed memory goes back to the system while `max_state_memory` bounds
//! RocksDB (architecture.md §16).
//!
//! RocksDB allocates each memtable in blocks (an eighth of the write
//! buffer size: 2 MiB at the default 16 MiB) and frees them when the
//! memtable is flushed. glibc serves blocks that large with `mmap` at
//! first, but raises its mmap threshold to the size of every mapped block
//! it frees (up to 32 MiB), so after the first flushes the blocks come from
//! the heap, and freed blocks stay with the process, fragmented among
//! live allocations: RSS grows far past the bound (the memory test: 166 MiB
//! over an idle instance at a 64 MiB bound). A fixed threshold keeps every
//! allocation of 128 KiB or more mapped, and returned when freed (76 MiB
//! over idle). The price is a `mmap`/`munmap` per such allocation.

/// The mmap threshold set with a memory bound.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
const MMAP_THRESHOLD: i32 = 128 << 10;

/// With glibc, fixes its mmap threshold at [`MMAP_THRESHOLD`] for the whole
/// process (RocksDB's and librdkafka's allocations go through it whatever
/// Rust's global allocator is), unless the user chose one with glibc's
/// `MALLOC_MMAP_THRESHOLD_`. Elsewhere nothing.
pub(crate) fn return_freed_memory() {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        tracing::info!("MALLOC_MMAP_THRESHOLD_ is set; kstate leaves glibc's mmap threshold as it is");
        return;
    }
    set_mmap_threshold();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_mmap_threshold() {
    // SAFETY: mallopt only changes glibc's own tuning parameters.
    let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) } == 1;
    if ok {
        tracing::info!(bytes = MMAP_THRESHOLD, "max_state_memory: glibc's mmap threshold fixed, so that freed memtable blocks return to the system");
    } else {
        tracing::warn!("max_state_memory: setting glibc's mmap threshold failed; freed memory may stay with the process");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold() {}
