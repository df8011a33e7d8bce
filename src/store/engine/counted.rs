//! An object store that counts what remote stores ask of it: requests by
//! kind (`GET`, `PUT`, `LIST`, `DELETE`, `HEAD`, `COPY`) and bytes each
//! way, as the metrics `kstate_remote_requests_total{kind}` and
//! `kstate_remote_bytes_total{direction}`. Object storage is billed per
//! request, so these are what a remote store costs.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    Result, UploadPart,
};

use crate::metrics::{REMOTE_BYTES, REMOTE_REQUESTS};

fn request(kind: &'static str) {
    metrics::counter!(REMOTE_REQUESTS, "kind" => kind).increment(1);
}

fn bytes(direction: &'static str, n: u64) {
    metrics::counter!(REMOTE_BYTES, "direction" => direction).increment(n);
}

/// `inner`, counted.
#[derive(Debug)]
pub(crate) struct Counted {
    inner: Arc<dyn ObjectStore>,
}

impl Counted {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Counted { inner }
    }
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Counted {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        request("PUT");
        bytes("up", payload.content_length() as u64);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        request("PUT");
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(CountedUpload { inner }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        request(if options.head { "HEAD" } else { "GET" });
        let got = self.inner.get_opts(location, options).await?;
        bytes("down", got.range.end.saturating_sub(got.range.start));
        Ok(got)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let got = self.inner.get_ranges(location, ranges).await?;
        request("GET");
        bytes("down", got.iter().map(|b| b.len() as u64).sum());
        Ok(got)
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations.inspect(|_| request("DELETE")).boxed())
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        request("LIST");
        self.inner.list(prefix)
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        request("LIST");
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        request("LIST");
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        request("COPY");
        self.inner.copy_opts(from, to, options).await
    }
}

/// A multipart upload whose parts count as PUTs.
#[derive(Debug)]
struct CountedUpload {
    inner: Box<dyn MultipartUpload>,
}

#[async_trait]
impl MultipartUpload for CountedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        request("PUT");
        bytes("up", data.content_length() as u64);
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        request("PUT");
        self.inner.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        request("DELETE");
        self.inner.abort().await
    }
}

/// A block cache that counts its hits and misses
/// (`kstate_remote_cache_hits_total`, `kstate_remote_cache_misses_total`).
pub(crate) struct CountedCache {
    inner: Arc<dyn slatedb::db_cache::DbCache>,
}

impl CountedCache {
    pub(crate) fn new(inner: Arc<dyn slatedb::db_cache::DbCache>) -> Self {
        CountedCache { inner }
    }
}

fn looked_up(found: &std::result::Result<Option<CachedEntry>, slatedb::Error>) {
    match found {
        Ok(Some(_)) => metrics::counter!(crate::metrics::REMOTE_CACHE_HITS).increment(1),
        Ok(None) => metrics::counter!(crate::metrics::REMOTE_CACHE_MISSES).increment(1),
        Err(_) => {}
    }
}

use slatedb::db_cache::{CachedEntry, CachedKey};

#[async_trait]
impl slatedb::db_cache::DbCache for CountedCache {
    async fn get_block(&self, key: &CachedKey) -> std::result::Result<Option<CachedEntry>, slatedb::Error> {
        let found = self.inner.get_block(key).await;
        looked_up(&found);
        found
    }

    async fn get_index(&self, key: &CachedKey) -> std::result::Result<Option<CachedEntry>, slatedb::Error> {
        let found = self.inner.get_index(key).await;
        looked_up(&found);
        found
    }

    async fn get_filter(&self, key: &CachedKey) -> std::result::Result<Option<CachedEntry>, slatedb::Error> {
        let found = self.inner.get_filter(key).await;
        looked_up(&found);
        found
    }

    async fn get_stats(&self, key: &CachedKey) -> std::result::Result<Option<CachedEntry>, slatedb::Error> {
        self.inner.get_stats(key).await
    }

    async fn insert(&self, key: CachedKey, value: CachedEntry) {
        self.inner.insert(key, value).await
    }

    async fn remove(&self, key: &CachedKey) {
        self.inner.remove(key).await
    }

    fn entry_count(&self) -> u64 {
        self.inner.entry_count()
    }

    async fn close(&self) -> std::result::Result<(), slatedb::Error> {
        self.inner.close().await
    }
}
