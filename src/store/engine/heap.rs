//! The in-memory backend of a store partition ([`StoreDefinition::in_memory`](crate::StoreDefinition::in_memory)).
//!
//! The data and the meta keys (checkpoint, topic id, segments, schema) are
//! two ordered maps of bytes, so range and prefix scans run in RocksDB's
//! bytewise key order. A commit applies its batch and checkpoint under one
//! write lock: the maps always hold exactly the changelog prefix
//! `[0, checkpoint]`, as RocksDB does (docs/architecture.md §1 and §19).
//!
//! Restarts do not replay the whole changelog: the maps are written to
//! [`FILE`] in the store partition's database directory when it closes,
//! and in the background at least every `in_memory_file_interval` while it
//! commits (a temporary file, fsync, rename). An open loads the file and
//! the restore replays only the changelog past its checkpoint. The file is
//! checked (magic, format version, store identity, length, CRC-32); a bad
//! file is deleted and the store restored in full, with the reason.

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};

/// The file holding a closed (or background-saved) in-memory store partition.
pub(crate) const FILE: &str = "heap.kstate";
const MAGIC: &[u8; 8] = b"KSTHEAP\x01";
/// The file's format version.
const FORMAT: u32 = 1;
/// About what one entry costs beyond its key and value (for estimates;
/// the count itself uses [`cost`]): measured 45 to 53 bytes for keys and
/// values of 8 to 1000 bytes (docs/architecture.md §19).
pub(crate) const ENTRY_OVERHEAD: usize = 50;
/// An entry's share of its B-tree node (one boxed slice per slot, nodes
/// partly filled), measured.
const SLOT_SHARE: usize = 29;
/// Entries an iterator copies under one read lock.
const SCAN_CHUNK: usize = 256;

type Map = BTreeMap<Box<[u8]>, Box<[u8]>>;

/// One data entry in one allocation: the key's length (4 bytes), the key,
/// the value. Ordered, compared and looked up by its key
/// ([`Borrow<[u8]>`](std::borrow::Borrow)): one allocation per entry instead
/// of two costs about 40 bytes less and a `malloc` less per write.
#[derive(Debug)]
pub(crate) struct Entry(Box<[u8]>);

impl Entry {
    fn new(k: &[u8], v: &[u8]) -> Entry {
        let mut bytes = Vec::with_capacity(4 + k.len() + v.len());
        // (Kafka's record size limit keeps keys far below 4 GiB.)
        bytes.extend_from_slice(&u32::try_from(k.len()).expect("a key under 4 GiB").to_ne_bytes());
        bytes.extend_from_slice(k);
        bytes.extend_from_slice(v);
        Entry(bytes.into_boxed_slice())
    }

    fn key_len(&self) -> usize {
        u32::from_ne_bytes(self.0[..4].try_into().expect("4 bytes")) as usize
    }

    /// The key.
    pub(crate) fn key(&self) -> &[u8] {
        &self.0[4..4 + self.key_len()]
    }

    /// The value.
    pub(crate) fn value(&self) -> &[u8] {
        &self.0[4 + self.key_len()..]
    }

    fn cost(&self) -> usize {
        chunk(self.0.len()) + SLOT_SHARE
    }
}

impl std::borrow::Borrow<[u8]> for Entry {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Entry) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Entry) -> std::cmp::Ordering {
        self.key().cmp(other.key())
    }
}

/// The data and meta keys of one store partition.
#[derive(Debug, Default)]
pub(crate) struct HeapState {
    pub(crate) data: std::collections::BTreeSet<Entry>,
    pub(crate) meta: Map,
    /// Memory of every data entry ([`cost`]).
    pub(crate) bytes: usize,
    /// Key and value bytes of every data entry.
    pub(crate) data_bytes: usize,
}

/// What glibc's malloc takes for `n` bytes: 8 bytes of header, 16-byte
/// steps, 32 at least.
fn chunk(n: usize) -> usize {
    ((n + 8 + 15) & !15).max(32)
}

/// The bytes an entry of `k` and `v` holds ([`Entry::cost`]): its
/// allocation and its node share. Within 1 byte of the RSS measured for a
/// million entries of 8 to 1000 bytes.
#[cfg(test)]
fn cost(k: &[u8], v: &[u8]) -> usize {
    chunk(4 + k.len() + v.len()) + SLOT_SHARE
}

impl HeapState {
    pub(crate) fn put(&mut self, k: &[u8], v: &[u8]) {
        let entry = Entry::new(k, v);
        self.bytes += entry.cost();
        self.data_bytes += k.len() + v.len();
        if let Some(old) = self.data.replace(entry) {
            self.bytes -= old.cost();
            self.data_bytes -= old.0.len() - 4;
        }
    }

    pub(crate) fn delete(&mut self, k: &[u8]) {
        if let Some(old) = self.data.take(k) {
            self.bytes -= old.cost();
            self.data_bytes -= old.0.len() - 4;
        }
    }

    /// One key's value.
    pub(crate) fn get(&self, k: &[u8]) -> Option<&[u8]> {
        self.data.get(k).map(Entry::value)
    }

    /// Deletes `[from, to)`.
    pub(crate) fn delete_range(&mut self, from: &[u8], to: &[u8]) {
        if from >= to {
            return;
        }
        let mut dropped = self.data.split_off(from);
        let mut kept = dropped.split_off(to);
        self.bytes -= dropped.iter().map(Entry::cost).sum::<usize>();
        self.data_bytes -= dropped.iter().map(|e| e.0.len() - 4).sum::<usize>();
        self.data.append(&mut kept);
    }

    pub(crate) fn put_meta(&mut self, k: &[u8], v: Option<&[u8]>) {
        match v {
            Some(v) => self.meta.insert(k.into(), v.into()),
            None => self.meta.remove(k),
        };
    }

    /// Entries of the data within the bounds, in key order, from the first
    /// (none if the bounds are empty: `BTreeMap::range` would panic).
    pub(crate) fn range<'a>(&'a self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let empty = match (start, end) {
            (Bound::Included(s), Bound::Included(e)) => s > e,
            (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e)) | (Bound::Excluded(s), Bound::Included(e)) => s >= e,
            _ => false,
        };
        let range = (!empty).then(|| self.data.range::<[u8], _>((start, end)));
        range.into_iter().flatten().map(|e| (e.key(), e.value()))
    }
}

/// The in-memory engine of one store partition.
pub(crate) struct Heap {
    state: Arc<RwLock<HeapState>>,
    /// Where the file goes; `None` in the test driver (no files at all).
    file: Option<PathBuf>,
    /// Which store partition the file must name (`store/partition`).
    identity: String,
    /// A background save under way.
    saving: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The bound on every in-memory store's bytes of this runtime.
    budget: Arc<HeapBudget>,
    /// This partition's bytes as last charged to the budget.
    charged: Mutex<usize>,
}

/// Every in-memory store partition's bytes of one runtime, against
/// `max_state_memory` (docs/architecture.md §19).
#[derive(Default)]
pub(crate) struct HeapBudget {
    used: std::sync::atomic::AtomicUsize,
    pub(crate) bound: Option<usize>,
    /// RocksDB's cache under the same bound: its capacity is what the
    /// in-memory stores leave (at least an eighth of the bound), and the
    /// bytes it was last set for.
    cache: Option<(rocksdb::Cache, Mutex<usize>)>,
}

impl HeapBudget {
    /// A budget of `bound` bytes (`None`: unbounded).
    pub(crate) fn new(bound: Option<usize>) -> HeapBudget {
        HeapBudget { used: Default::default(), bound, cache: None }
    }

    /// Shrinks `cache` as the in-memory stores grow (see `cache`).
    pub(crate) fn sharing(self, cache: rocksdb::Cache) -> HeapBudget {
        HeapBudget { cache: Some((cache, Mutex::new(0))), ..self }
    }

    /// Resizes the shared cache when the bytes moved by 1 MiB or more.
    fn resize_cache(&self, used: usize) {
        let (Some((cache, set_for)), Some(bound)) = (&self.cache, self.bound) else { return };
        let mut set_for = set_for.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if used.abs_diff(*set_for) >= 1 << 20 {
            let mut cache = cache.clone();
            cache.set_capacity(bound.saturating_sub(used).max(bound / 8));
            *set_for = used;
        }
    }

    /// Bytes held by every in-memory store partition.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Moves a partition's charge from `before` to `after` bytes, publishes
    /// the new total and resizes the shared cache; returns the total.
    fn charge(&self, before: usize, after: usize) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        let total = if after >= before {
            self.used.fetch_add(after - before, Relaxed) + (after - before)
        } else {
            self.used.fetch_sub(before - after, Relaxed) - (before - after)
        };
        metrics::gauge!(crate::metrics::IN_MEMORY_BYTES).set(total as f64);
        self.resize_cache(total);
        total
    }
}

impl Heap {
    /// Opens the store partition at `dir`: loads [`FILE`] if there is one.
    /// A file that fails a check is deleted and the store opens empty; the
    /// second value says why.
    pub(crate) fn open(dir: Option<&Path>, identity: &str, budget: Arc<HeapBudget>) -> Result<(Heap, Option<String>)> {
        let mut problem = None;
        let mut state = HeapState::default();
        if let Some(dir) = dir {
            if dir.join("CURRENT").exists() {
                // The store was RocksDB until this start: its data is rebuilt
                // from the changelog.
                tracing::info!(dir = %dir.display(), "store is in memory now; removing its RocksDB files");
                super::Engine::wipe(dir)?;
                problem = Some("the store changed from RocksDB to in memory".to_string());
            }
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            let path = dir.join(FILE);
            let started = std::time::Instant::now();
            let opened = std::fs::File::open(&path).and_then(|f| Ok((f.metadata()?.len(), f)));
            match opened {
                Ok((len, file)) => match decode_from(file, len, Some(identity)) {
                    Ok(loaded) => {
                        tracing::info!(store = identity, entries = loaded.data.len(), bytes = len, seconds = started.elapsed().as_secs_f64(),
                            "in-memory store loaded from its file");
                        state = loaded;
                    }
                    Err(Refused::Bad(why)) => {
                        tracing::warn!(file = %path.display(), reason = %why, "in-memory store file refused; restoring the store in full");
                        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                        problem = Some(format!("in-memory store file refused: {why}"));
                    }
                    Err(Refused::Io(e)) => return Err(Error::io(&path, e)),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&path, e)),
            }
        }
        let heap = Heap {
            state: Arc::new(RwLock::new(state)),
            file: dir.map(|d| d.join(FILE)),
            identity: identity.to_string(),
            saving: Mutex::new(None),
            budget,
            charged: Mutex::new(0),
        };
        heap.charge()?;
        Ok((heap, problem))
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, HeapState> {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, HeapState> {
        self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Charges this partition's bytes to the budget: past its bound,
    /// `Error::StateMemory` naming the store.
    pub(crate) fn charge(&self) -> Result<()> {
        let mut charged = self.charged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = self.read().bytes;
        let total = self.budget.charge(*charged, now);
        *charged = now;
        match self.budget.bound {
            Some(bound) if total > bound => {
                Err(Error::StateMemory { store: self.identity.clone(), store_bytes: now as u64, total_bytes: total as u64, bound: bound as u64 })
            }
            _ => Ok(()),
        }
    }

    /// Entries within the bounds in key order, copied [`SCAN_CHUNK`] at a
    /// time under a read lock (a commit may land between two chunks; the
    /// store's overlays hold its writes until then, so a merged scan reads
    /// the same either way).
    pub(crate) fn scan(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + '_ {
        let mut next: Bound<Vec<u8>> = start.map(<[u8]>::to_vec);
        let end: Bound<Vec<u8>> = end.map(<[u8]>::to_vec);
        let mut chunk = std::collections::VecDeque::new();
        let mut done = false;
        std::iter::from_fn(move || {
            if chunk.is_empty() && !done {
                let state = self.read();
                chunk.extend(state.range(next.as_ref().map(Vec::as_slice), end.as_ref().map(Vec::as_slice)).take(SCAN_CHUNK).map(|(k, v)| (k.to_vec(), v.to_vec())));
                done = chunk.len() < SCAN_CHUNK;
                if let Some((k, _)) = chunk.back() {
                    next = Bound::Excluded(k.clone());
                }
            }
            chunk.pop_front().map(Ok)
        })
    }

    /// Writes the file now (a close, a snapshot), after any background save.
    pub(crate) fn save(&self) -> Result<()> {
        self.wait_for_save();
        let Some(file) = &self.file else { return Ok(()) };
        save_state(&self.state, &self.identity, file)
    }

    /// Writes the file into another directory (a snapshot's), which it creates.
    pub(crate) fn save_to(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        save_state(&self.state, &self.identity, &dir.join(FILE))
    }

    /// Starts writing the file on another thread; `false` if one is under
    /// way (or there are no files). Commits wait while it copies the maps
    /// into the file (the read lock), not while it syncs.
    pub(crate) fn save_in_background(&self) -> bool {
        let Some(file) = self.file.clone() else { return false };
        let mut saving = self.saving.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if saving.as_ref().is_some_and(|h| !h.is_finished()) {
            return false;
        }
        let (state, identity) = (self.state.clone(), self.identity.clone());
        let spawned = std::thread::Builder::new().name("kstate-heap-save".into()).spawn(move || {
            if let Err(e) = save_state(&state, &identity, &file) {
                tracing::warn!(file = %file.display(), error = %e, "saving an in-memory store failed; a crash restores from an older file");
            }
        });
        match spawned {
            Ok(handle) => {
                *saving = Some(handle);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "no thread to save an in-memory store");
                false
            }
        }
    }

    fn wait_for_save(&self) {
        let handle = self.saving.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        self.wait_for_save();
        let bytes = *self.charged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.budget.charge(bytes, 0);
    }
}

/// Writes `state` to `path` atomically: a temporary file written under the
/// read lock, then (the lock released) fsync, rename, fsync of the directory.
fn save_state(state: &RwLock<HeapState>, identity: &str, path: &Path) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let file = {
        let state = state.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        write_unsynced(&state, identity, &tmp)?
    };
    let io = |e| Error::io(path, e);
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))?;
    }
    Ok(())
}

/// Writes `state` into a new file at `tmp`, not yet synced.
fn write_unsynced(state: &HeapState, identity: &str, tmp: &Path) -> Result<std::fs::File> {
    let io = |e| Error::io(tmp, e);
    let file = std::fs::File::create(tmp).map_err(io)?;
    let mut out = Checked { inner: std::io::BufWriter::with_capacity(1 << 20, file), crc: crc32fast::Hasher::new() };
    out.write_all(MAGIC).map_err(io)?;
    out.write_all(&FORMAT.to_be_bytes()).map_err(io)?;
    out.write_all(&(identity.len() as u32).to_be_bytes()).map_err(io)?;
    out.write_all(identity.as_bytes()).map_err(io)?;
    write_entries(&mut out, state.meta.len(), state.meta.iter().map(|(k, v)| (&k[..], &v[..]))).map_err(io)?;
    write_entries(&mut out, state.data.len(), state.data.iter().map(|e| (e.key(), e.value()))).map_err(io)?;
    let crc = out.crc.clone().finalize();
    out.inner.write_all(&crc.to_be_bytes()).map_err(io)?;
    out.inner.into_inner().map_err(|e| io(e.into_error()))
}

/// A map's entry count, then each entry: key length, value length, key, value.
fn write_entries<'a>(out: &mut impl Write, count: usize, entries: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> std::io::Result<()> {
    out.write_all(&(count as u64).to_be_bytes())?;
    for (k, v) in entries {
        out.write_all(&(k.len() as u32).to_be_bytes())?;
        out.write_all(&(v.len() as u32).to_be_bytes())?;
        out.write_all(k)?;
        out.write_all(v)?;
    }
    Ok(())
}

/// A writer that checksums what it writes.
struct Checked<W> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for Checked<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Why a file was not loaded: it could not be read (`Io`: kept, the error
/// returned), or it is not a good file (`Bad`: refused with the reason).
pub(crate) enum Refused {
    Io(std::io::Error),
    Bad(String),
}

impl From<String> for Refused {
    fn from(why: String) -> Refused {
        Refused::Bad(why)
    }
}

impl From<&str> for Refused {
    fn from(why: &str) -> Refused {
        Refused::Bad(why.to_string())
    }
}

/// Reads a file written by [`save_state`]; `Err` says what is wrong with it.
/// `identity`: the store partition the file must name (`None`: any, for
/// operator tooling reading a directory it was pointed at).
pub(crate) fn decode(bytes: &[u8], identity: Option<&str>) -> std::result::Result<HeapState, String> {
    decode_from(bytes, bytes.len() as u64, identity).map_err(|e| match e {
        Refused::Bad(why) => why,
        Refused::Io(e) => e.to_string(),
    })
}

/// [`decode`] of a file of `len` bytes read from `input` in chunks (a
/// store's load never holds the file's bytes and its entries at once). The
/// checksum is checked at the end; a file refused earlier is read to its
/// end anyway, so that a damaged one is reported as such.
pub(crate) fn decode_from(input: impl std::io::Read, len: u64, identity: Option<&str>) -> std::result::Result<HeapState, Refused> {
    let header = (MAGIC.len() + 4 + 4 + 4) as u64;
    if len < header {
        return Err(format!("not an in-memory store file ({len} bytes, shorter than a header)").into());
    }
    let body = len - 4;
    let hashing = Hashing { inner: input, crc: crc32fast::Hasher::new(), left: body };
    let mut r = Stream { input: std::io::BufReader::with_capacity(1 << 20, hashing), left: body };
    let parsed = parse(&mut r, identity);
    // The rest of the body, then the checksum (not hashed).
    let checked = (|| -> std::result::Result<bool, Refused> {
        let rest = r.left;
        let copied = std::io::copy(&mut std::io::Read::take(&mut r.input, rest), &mut std::io::sink()).map_err(Refused::Io)?;
        let mut crc = [0u8; 4];
        if copied < rest || !read_full(&mut r.input, &mut crc).map_err(Refused::Io)? {
            return Ok(false);
        }
        Ok(u32::from_be_bytes(crc) == r.input.get_ref().crc.clone().finalize())
    })()?;
    if !checked {
        let detail = match &parsed {
            Err(Refused::Bad(why)) => format!(": {why}"),
            _ => String::new(),
        };
        return Err(format!("checksum mismatch ({len} bytes: truncated or corrupted){detail}").into());
    }
    parsed
}

/// Header, meta and data of a file; `r` is left after the last entry.
fn parse<R: std::io::Read>(r: &mut Stream<R>, identity: Option<&str>) -> std::result::Result<HeapState, Refused> {
    if r.bytes(MAGIC.len())? != MAGIC {
        return Err("not an in-memory store file (bad magic)".into());
    }
    let format = r.u32()?;
    if format != FORMAT {
        return Err(format!("file format {format}, this build reads {FORMAT}").into());
    }
    let len = r.u32()? as usize;
    let named = r.bytes(len)?;
    if let Some(identity) = identity.filter(|i| named != i.as_bytes()) {
        return Err(format!("the file is of store partition {:?}, not {identity:?}", String::from_utf8_lossy(&named)).into());
    }
    let mut state = HeapState::default();
    let mut meta = Vec::new();
    for _ in 0..r.u64()? {
        let (kl, vl) = r.lengths()?;
        let (k, v) = (r.bytes(kl)?, r.bytes(vl)?);
        if meta.last().is_some_and(|(last, _): &(Box<[u8]>, Box<[u8]>)| **last >= *k) {
            return Err("keys out of order".into());
        }
        meta.push((Box::<[u8]>::from(k), Box::<[u8]>::from(v)));
    }
    let count = r.u64()?;
    // (At most what the bytes left can hold: 8 header bytes per entry.)
    let mut data: Vec<Entry> = Vec::with_capacity(count.min(r.left / 8) as usize);
    for _ in 0..count {
        let (kl, vl) = r.lengths()?;
        let mut bytes = Vec::with_capacity(4 + kl + vl);
        bytes.extend_from_slice(&(kl as u32).to_ne_bytes());
        bytes.resize(4 + kl + vl, 0);
        r.fill(&mut bytes[4..])?;
        let entry = Entry(bytes.into_boxed_slice());
        if data.last().is_some_and(|last| last.key() >= entry.key()) {
            return Err("keys out of order".into());
        }
        state.bytes += entry.cost();
        state.data_bytes += kl + vl;
        data.push(entry);
    }
    if r.left != 0 {
        return Err(format!("{} bytes after the last entry", r.left).into());
    }
    state.meta = meta.into_iter().collect();
    state.data = data.into_iter().collect();
    Ok(state)
}

/// Reads `buf` full; `false` if the input ends first.
fn read_full(input: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<bool> {
    match input.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// A reader that checksums the first `left` bytes it reads.
struct Hashing<R> {
    inner: R,
    crc: crc32fast::Hasher,
    left: u64,
}

impl<R: std::io::Read> std::io::Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let hashed = (n as u64).min(self.left) as usize;
        self.crc.update(&buf[..hashed]);
        self.left -= hashed as u64;
        Ok(n)
    }
}

/// The body of a file, read within its length (`left` bytes to go).
struct Stream<R> {
    input: std::io::BufReader<Hashing<R>>,
    left: u64,
}

impl<R: std::io::Read> Stream<R> {
    fn fill(&mut self, buf: &mut [u8]) -> std::result::Result<(), Refused> {
        if buf.len() as u64 > self.left || !read_full(&mut self.input, buf).map_err(Refused::Io)? {
            return Err("truncated entry".into());
        }
        self.left -= buf.len() as u64;
        Ok(())
    }

    fn bytes(&mut self, n: usize) -> std::result::Result<Vec<u8>, Refused> {
        if n as u64 > self.left {
            return Err("truncated entry".into());
        }
        let mut out = vec![0; n];
        self.fill(&mut out)?;
        Ok(out)
    }

    fn u32(&mut self) -> std::result::Result<u32, Refused> {
        let mut b = [0; 4];
        self.fill(&mut b)?;
        Ok(u32::from_be_bytes(b))
    }

    fn u64(&mut self) -> std::result::Result<u64, Refused> {
        let mut b = [0; 8];
        self.fill(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }

    /// An entry's key and value lengths, checked against the bytes left.
    fn lengths(&mut self) -> std::result::Result<(usize, usize), Refused> {
        let (kl, vl) = (self.u32()? as u64, self.u32()? as u64);
        if kl + vl > self.left {
            return Err("truncated entry".into());
        }
        Ok((kl as usize, vl as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> Arc<HeapBudget> {
        Arc::new(HeapBudget::new(None))
    }

    #[test]
    fn a_saved_store_loads_back_and_a_damaged_file_is_refused_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let (heap, problem) = Heap::open(Some(&db), "s/0", budget()).unwrap();
        assert!(problem.is_none());
        {
            let mut s = heap.write();
            s.put(b"a", b"1");
            s.put(b"b", b"22");
            s.put_meta(b"changelog.checkpoint", Some(&7i64.to_be_bytes()));
        }
        heap.save().unwrap();
        drop(heap);
        let (heap, problem) = Heap::open(Some(&db), "s/0", budget()).unwrap();
        assert!(problem.is_none());
        assert_eq!(heap.read().data.len(), 2);
        assert_eq!((heap.read().bytes, heap.read().data_bytes), (2 * (32 + SLOT_SHARE), 5));
        drop(heap);

        // Another store's file, a truncated file, a flipped byte.
        let bytes = std::fs::read(db.join(FILE)).unwrap();
        assert!(decode(&bytes, Some("s/1")).unwrap_err().contains("store partition"));
        assert!(decode(&bytes[..bytes.len() - 3], Some("s/0")).unwrap_err().contains("checksum"));
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        assert!(decode(&flipped, Some("s/0")).unwrap_err().contains("checksum"));
        std::fs::write(db.join(FILE), &bytes[..bytes.len() / 2]).unwrap();
        let (heap, problem) = Heap::open(Some(&db), "s/0", budget()).unwrap();
        assert!(problem.unwrap().contains("checksum"), "a truncated file is refused");
        assert!(heap.read().data.is_empty());
        assert!(!db.join(FILE).exists(), "a refused file is deleted");
    }

    #[test]
    fn range_deletes_and_bounds_keep_bytes_and_order() {
        let mut s = HeapState::default();
        for k in [b"a", b"b", b"c", b"d"] {
            s.put(k, b"v");
        }
        s.put(b"b", b"vv");
        s.delete_range(b"b", b"d");
        let keys: Vec<&[u8]> = s.range(Bound::Unbounded, Bound::Unbounded).map(|(k, _)| k).collect();
        assert_eq!(keys, vec![&b"a"[..], b"d"]);
        assert_eq!((s.bytes, s.data_bytes), (2 * cost(b"a", b"v"), 4));
        assert_eq!(s.range(Bound::Excluded(b"a"), Bound::Excluded(b"a")).count(), 0);
        assert_eq!(s.range(Bound::Included(b"d"), Bound::Excluded(b"a")).count(), 0);
        assert_eq!(s.range(Bound::Excluded(b"a"), Bound::Included(b"d")).count(), 1);
        s.delete(b"a");
        s.delete(b"d");
        assert_eq!((s.bytes, s.data_bytes), (0, 0));
        assert_eq!(cost(&[0; 24], &[0; 100]), 144 + SLOT_SHARE, "as glibc sizes the chunk");
        s.put(b"k", b"");
        assert_eq!(s.get(b"k"), Some(&b""[..]));
        s.put(b"k", b"new");
        assert_eq!((s.get(b"k"), s.data.len()), (Some(&b"new"[..]), 1), "a put replaces the value");
    }

    #[test]
    fn bytes_past_the_bound_are_a_typed_error_naming_the_store() {
        let budget = Arc::new(HeapBudget::new(Some(1000)));
        let (heap, _) = Heap::open(None, "counts/3", budget.clone()).unwrap();
        heap.write().put(&[0; 500], b"");
        heap.charge().unwrap();
        heap.write().put(&[1; 500], b"");
        let err = heap.charge().unwrap_err();
        assert!(matches!(&err, Error::StateMemory { store, .. } if store == "counts/3"), "{err}");
        drop(heap);
        assert_eq!(budget.used(), 0, "a closed store gives its bytes back");
    }
}
