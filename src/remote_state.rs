//! Where remote stores live: [`RemoteStateConfig`] (README "Remote stores",
//! docs/architecture.md §22).

use std::time::Duration;

/// The object store that holds the application's remote stores
/// ([`StoreDefinition::remote`](crate::StoreDefinition::remote)), given to
/// [`AppBuilder::remote_state`](crate::AppBuilder::remote_state).
///
/// Each store partition is a database (SlateDB, an LSM tree whose files
/// are objects) under `<url>/<application_id>/<store>/<partition>/`. Its
/// changelog stays the log: a commit lands in the changelog first, then
/// in the database with its checkpoint, and a store that opens anywhere
/// replays only the changelog past the checkpoint it finds there.
///
/// ```
/// use std::time::Duration;
/// let remote = kstate::RemoteStateConfig::new("s3://my-bucket/kstate")
///     .option("aws_endpoint", "http://127.0.0.1:9000")
///     .cache_bytes(256 << 20)
///     .flush_interval(Duration::from_secs(5));
/// ```
#[derive(Clone)]
pub struct RemoteStateConfig {
    pub(crate) url: String,
    pub(crate) options: Vec<(String, String)>,
    pub(crate) cache_bytes: usize,
    pub(crate) disk_cache_bytes: u64,
    pub(crate) memtable_bytes: usize,
    pub(crate) flush_interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) simulated_latency: Duration,
}

impl std::fmt::Debug for RemoteStateConfig {
    /// Option values that may be credentials are not shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStateConfig")
            .field("url", &self.url)
            .field("options", &crate::store::objects::redacted(&self.options))
            .field("cache_bytes", &self.cache_bytes)
            .field("disk_cache_bytes", &self.disk_cache_bytes)
            .field("memtable_bytes", &self.memtable_bytes)
            .field("flush_interval", &self.flush_interval)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RemoteStateConfig {
    /// Remote stores under `url`: `s3://bucket/prefix` (S3, and
    /// S3-compatible servers such as MinIO with the `aws_endpoint`
    /// option), `gs://bucket/prefix`, `az://container/prefix`, or
    /// `file:///absolute/dir`. Credentials come from the environment
    /// (`AWS_ACCESS_KEY_ID`, ...) or [`option`](Self::option), as for
    /// [`SnapshotConfig::new`](crate::SnapshotConfig::new). Needs kstate's
    /// `remote` Cargo feature, and `s3`, `gcs` or `azure` for those URLs.
    pub fn new(url: impl Into<String>) -> Self {
        RemoteStateConfig {
            url: url.into(),
            options: Vec::new(),
            cache_bytes: 64 << 20,
            disk_cache_bytes: 1 << 30,
            memtable_bytes: 64 << 20,
            flush_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(60),
            simulated_latency: Duration::ZERO,
        }
    }

    /// A setting of the object store's builder by its configuration key
    /// (`aws_endpoint`, `aws_allow_http`, `aws_region`, ...); it wins over
    /// the environment. An unknown key fails `build`.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((key.into(), value.into()));
        self
    }

    /// Bytes of blocks, indexes and filters read from object storage that
    /// the instance keeps in memory, shared by all its remote store
    /// partitions (default 64 MiB; at least 1 MiB). Counted in
    /// `max_state_memory` when that is set (it must then be at most half of it).
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Bytes of table files each remote store partition keeps on local
    /// disk, under `<state_dir>/<application_id>/.remote-cache/` (default
    /// 1 GiB per store partition; 0: none). The files this instance writes
    /// (flushes, compactions) land there as they are uploaded, and files
    /// read from object storage are kept there: reads that miss the memory
    /// cache are local reads, not requests, while the task stays here. A
    /// task new to the instance starts with an empty one.
    pub fn disk_cache_bytes(mut self, bytes: u64) -> Self {
        self.disk_cache_bytes = bytes;
        self
    }

    /// Bytes of writes a store partition gathers in memory (its memtable)
    /// before they go to object storage as one table file (default 64
    /// MiB; at least 1 MiB). A memtable is also written every
    /// [`flush_interval`](Self::flush_interval), so it holds at most what
    /// the partition writes in that time. Larger: fewer table files, PUTs
    /// and compactions, faster writes and reads, more memory (not counted
    /// in `max_state_memory`; up to four memtables per store partition
    /// may wait for their upload before writes wait). Replaces
    /// `AppBuilder::write_buffer_bytes`, which sizes RocksDB's memtables.
    pub fn memtable_bytes(mut self, bytes: usize) -> Self {
        self.memtable_bytes = bytes;
        self
    }

    /// The longest a committing store partition's writes stay only in
    /// memory before they are written to object storage as a table file
    /// (default 5 s; at least 100 ms). A crash replays at most about this
    /// much of the changelog (more if the object store was away); a
    /// shorter interval costs more PUT requests. A memtable that reaches
    /// [`memtable_bytes`](Self::memtable_bytes) is written at once.
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval;
        self
    }

    /// How long one call to the object store may wait (reads, a write
    /// held back by unwritten memtables, opening a store) before it fails
    /// its task with [`Error::RemoteStore`](crate::Error::RemoteStore) of
    /// kind `Unavailable` (default 60 s; at least 1 s). Shorter outages
    /// only pause processing.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Adds `latency` before every request to the object store, as a
    /// distant one (S3 from another zone) would: for benchmarks of a
    /// local server (MinIO). Not for production.
    #[doc(hidden)]
    pub fn simulated_latency(mut self, latency: Duration) -> Self {
        self.simulated_latency = latency;
        self
    }

    /// Checks the settings and that the URL names a store this build can
    /// open (no request is made; the first is made when `run` starts).
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !cfg!(feature = "remote") {
            return Err("remote stores need kstate's `remote` Cargo feature (features = [\"remote\"] on the kstate dependency in your Cargo.toml)".into());
        }
        if self.cache_bytes < 1 << 20 {
            return Err(format!("remote_state cache_bytes must be at least 1 MiB, not {}", self.cache_bytes));
        }
        if self.memtable_bytes < 1 << 20 {
            return Err(format!("remote_state memtable_bytes must be at least 1 MiB, not {}", self.memtable_bytes));
        }
        if self.flush_interval < Duration::from_millis(100) {
            return Err(format!("remote_state flush_interval must be at least 100 ms, not {:?}", self.flush_interval));
        }
        if self.timeout < Duration::from_secs(1) {
            return Err(format!("remote_state timeout must be at least 1 s, not {:?}", self.timeout));
        }
        crate::store::objects::open_url("remote state", &self.url, &self.options).map(|_| ())
    }
}
