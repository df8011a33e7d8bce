//! The snapshot store: an object store opened from the application's
//! snapshot URL, the key layout under it, and file transfers that are
//! checksummed on the way and limited in bandwidth (architecture.md §10).
//!
//! Layout, under the URL's path:
//!
//! | key | what |
//! |---|---|
//! | `<app>/<store>/<partition>/manifests/<created ms>-<id>.json` | one complete snapshot ([`super::manifest::Manifest`]) |
//! | `<app>/<store>/<partition>/files/<uid>-<name>` | a file of one or more snapshots (an SST file is uploaded once and named by the uploading database's `uid`) |
//! | `<app>/<store>/<partition>/pending/<id>.json` | an upload in progress: the files it may reference ([`super::manifest::Pending`]) |
//! | `<app>/@savepoints/...` | savepoints (`savepoint.rs`) |

use std::path::Path as FsPath;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::io::AsyncWriteExt;

/// Bytes read or written per transfer step (also the multipart part size:
/// above S3's 5 MiB minimum).
const CHUNK: usize = 8 << 20;

/// What went wrong talking to the snapshot store, or with a file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RemoteError {
    /// The object store's own error (unreachable, refused, not found ...).
    #[error("snapshot store: {0}")]
    Store(#[from] object_store::Error),
    /// A local file.
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// A downloaded file is not what the manifest says.
    #[error("{0}")]
    Verify(String),
    /// A manifest that cannot be parsed.
    #[error("{0}")]
    Format(String),
}

impl RemoteError {
    pub(crate) fn io(path: &FsPath, source: std::io::Error) -> Self {
        RemoteError::Io {
            path: path.display().to_string(),
            source,
        }
    }

    /// Whether the object was not there.
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(
            self,
            RemoteError::Store(object_store::Error::NotFound { .. })
        )
    }
}

pub(crate) type RemoteResult<T> = std::result::Result<T, RemoteError>;

/// A shared bandwidth limit: transfers take bytes from it and sleep when
/// they ran ahead of `bytes_per_second`.
pub(crate) struct Limiter {
    bytes_per_second: Option<u64>,
    /// (start of the current window, bytes taken in it).
    window: Mutex<(Instant, u64)>,
}

impl Limiter {
    pub(crate) fn new(bytes_per_second: Option<u64>) -> Self {
        Limiter {
            bytes_per_second,
            window: Mutex::new((Instant::now(), 0)),
        }
    }

    /// How long to wait after moving `bytes` more.
    fn take(&self, bytes: u64) -> Duration {
        let Some(rate) = self.bytes_per_second.filter(|r| *r > 0) else {
            return Duration::ZERO;
        };
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if w.0.elapsed() > Duration::from_secs(10) {
            *w = (Instant::now(), 0);
        }
        w.1 += bytes;
        let due = Duration::from_secs_f64(w.1 as f64 / rate as f64);
        due.saturating_sub(w.0.elapsed())
    }

    async fn pace(&self, bytes: u64) {
        let wait = self.take(bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The size and CRC-32 of a file as transferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sum {
    pub(crate) size: u64,
    pub(crate) crc32: u32,
}

/// An object store opened from a snapshot URL, with the path the URL names.
#[derive(Clone, Debug)]
pub(crate) struct Remote {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The URL's path: everything kstate writes is under it.
    root: Path,
    /// The URL, for logs (no credentials: those come from options or the environment).
    pub(crate) url: String,
}

impl Remote {
    /// Opens the store a URL names: `s3://bucket/prefix` (and S3-compatible
    /// servers through the `aws_endpoint` option or `AWS_ENDPOINT`),
    /// `gs://bucket/prefix`, `az://container/prefix` (and the other Azure
    /// schemes), `file:///absolute/dir`. Credentials and settings come from
    /// the environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`) and `options`
    /// (the builders' configuration keys, e.g. `aws_endpoint`,
    /// `aws_allow_http`, `aws_region`), options winning.
    pub(crate) fn open(url: &str, options: &[(String, String)]) -> Result<Remote, String> {
        Self::open_as("snapshot", url, options)
    }

    /// [`Remote::open`], its errors naming the URL's use (`what`: "snapshot", "remote state").
    pub(crate) fn open_as(what: &str, url: &str, options: &[(String, String)]) -> Result<Remote, String> {
        let (store, root) = crate::store::objects::open_url(what, url, options)?;
        Ok(Remote {
            store,
            root,
            url: url.to_string(),
        })
    }

    /// The folder of one store partition.
    pub(crate) fn partition_dir(&self, app: &str, store: &str, partition: i32) -> Path {
        self.root
            .clone()
            .join(app)
            .join(store)
            .join(partition.to_string())
    }

    /// The folder of an application.
    pub(crate) fn app_dir(&self, app: &str) -> Path {
        self.root.clone().join(app)
    }

    /// Every object under `prefix` (name, size, last modified ms).
    pub(crate) async fn list(&self, prefix: &Path) -> RemoteResult<Vec<object_store::ObjectMeta>> {
        let mut out = Vec::new();
        let mut s = self.store.list(Some(prefix));
        while let Some(m) = s.next().await {
            out.push(m?);
        }
        Ok(out)
    }

    /// A small object, whole.
    pub(crate) async fn get_bytes(&self, path: &Path) -> RemoteResult<bytes::Bytes> {
        Ok(self.store.get(path).await?.bytes().await?)
    }

    /// Writes a small object.
    pub(crate) async fn put_bytes(&self, path: &Path, data: Vec<u8>) -> RemoteResult<()> {
        self.store.put(path, PutPayload::from(data)).await?;
        Ok(())
    }

    /// Deletes an object; one already gone is no error.
    pub(crate) async fn delete(&self, path: &Path) -> RemoteResult<()> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Uploads a local file, returning its size and CRC-32 as read.
    pub(crate) async fn upload(
        &self,
        local: &FsPath,
        to: &Path,
        limiter: &Limiter,
    ) -> RemoteResult<Sum> {
        let mut file = tokio::fs::File::open(local)
            .await
            .map_err(|e| RemoteError::io(local, e))?;
        let mut crc = crc32fast::Hasher::new();
        let mut size = 0u64;
        let mut first = vec![0u8; CHUNK];
        let n = read_full(&mut file, &mut first)
            .await
            .map_err(|e| RemoteError::io(local, e))?;
        first.truncate(n);
        crc.update(&first);
        size += n as u64;
        // Paced after each request: a limit delays the next one.
        if n < CHUNK {
            self.store.put(to, PutPayload::from(first)).await?;
            limiter.pace(n as u64).await;
            return Ok(Sum { size, crc32: crc.finalize() });
        }
        let mut upload = self.store.put_multipart(to).await?;
        let mut part = first;
        let result: RemoteResult<()> = async {
            loop {
                let len = part.len() as u64;
                upload.put_part(PutPayload::from(std::mem::take(&mut part))).await?;
                limiter.pace(len).await;
                let mut next = vec![0u8; CHUNK];
                let n = read_full(&mut file, &mut next).await.map_err(|e| RemoteError::io(local, e))?;
                if n == 0 {
                    break;
                }
                next.truncate(n);
                crc.update(&next);
                size += n as u64;
                part = next;
            }
            upload.complete().await?;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            let _ = upload.abort().await;
            return Err(e);
        }
        Ok(Sum {
            size,
            crc32: crc.finalize(),
        })
    }

    /// Downloads an object into a new local file and checks it against
    /// `expect` (size and CRC-32).
    pub(crate) async fn download(&self, from: &Path, local: &FsPath, expect: Sum, limiter: &Limiter) -> RemoteResult<()> {
        let mut file = tokio::fs::File::create(local).await.map_err(|e| RemoteError::io(local, e))?;
        let mut crc = crc32fast::Hasher::new();
        let mut offset = 0u64;
        // In ranges of CHUNK bytes, each its own request: a request's
        // timeout and retries cover a bounded transfer, whatever the file's
        // size and the bandwidth limit (paced between requests).
        loop {
            let options = if expect.size == 0 {
                object_store::GetOptions { head: true, ..Default::default() }
            } else {
                object_store::GetOptions::default().with_range(Some(offset..(offset + CHUNK as u64).min(expect.size)))
            };
            let got = self.store.get_opts(from, options).await?;
            if got.meta.size != expect.size {
                return Err(RemoteError::Verify(format!("{from}: {} bytes, the manifest says {}", got.meta.size, expect.size)));
            }
            if expect.size == 0 {
                break;
            }
            let want = got.range.end - got.range.start;
            // Streamed to the file as it arrives (no range held in memory).
            let mut stream = got.into_stream();
            let mut read = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                read += chunk.len() as u64;
                if read > want {
                    return Err(RemoteError::Verify(format!("{from}: a range of {want} bytes came back longer")));
                }
                crc.update(&chunk);
                file.write_all(&chunk).await.map_err(|e| RemoteError::io(local, e))?;
            }
            if read != want {
                return Err(RemoteError::Verify(format!("{from}: a range of {want} bytes came back with {read}")));
            }
            offset += want;
            limiter.pace(want).await;
            if offset >= expect.size {
                break;
            }
        }
        // On disk before the database is put in place (its MANIFEST names
        // these files; commits skip the WAL).
        file.sync_all().await.map_err(|e| RemoteError::io(local, e))?;
        let got = Sum { size: offset, crc32: crc.finalize() };
        if got != expect {
            return Err(RemoteError::Verify(format!(
                "{from}: {} bytes with CRC-32 {:08x}, the manifest says {} bytes with {:08x}",
                got.size, got.crc32, expect.size, expect.crc32
            )));
        }
        Ok(())
    }
}

/// The object at `relative` (a `/`-separated path such as `files/x.sst`)
/// under `dir`: each part joined on its own (joining the whole string
/// would encode its `/`).
pub(crate) fn object_at(dir: &Path, relative: &str) -> Path {
    relative.split('/').filter(|p| !p.is_empty()).fold(dir.clone(), |path, part| path.join(part))
}

/// Reads until `buf` is full or the file ends.
async fn read_full(file: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    use tokio::io::AsyncReadExt;
    let mut n = 0;
    while n < buf.len() {
        let r = file.read(&mut buf[n..]).await?;
        if r == 0 {
            break;
        }
        n += r;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_paces_and_none_does_not() {
        assert_eq!(Limiter::new(None).take(1 << 30), Duration::ZERO);
        let l = Limiter::new(Some(1 << 20));
        let wait = l.take(2 << 20);
        assert!(
            wait > Duration::from_millis(1500) && wait <= Duration::from_secs(2),
            "{wait:?}"
        );
    }

    #[test]
    fn debug_output_hides_credentials() {
        let c = crate::SnapshotConfig::new("s3://b/p")
            .option("aws_endpoint", "http://minio:9000")
            .option("aws_secret_access_key", "s3cr3t")
            .option("aws_access_key_id", "AKIAEXAMPLE");
        let shown = format!("{c:?}");
        assert!(shown.contains("http://minio:9000") && shown.contains("<redacted>"), "{shown}");
        assert!(!shown.contains("s3cr3t") && !shown.contains("AKIAEXAMPLE"), "{shown}");
    }

    #[test]
    fn urls_open_or_say_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("snaps").display());
        let r = Remote::open(&url, &[]).unwrap();
        assert_eq!(r.partition_dir("app", "counts", 3).as_ref(), "app/counts/3");
        assert_eq!(object_at(&r.partition_dir("app", "counts", 3), "files/a-1.sst").as_ref(), "app/counts/3/files/a-1.sst");
        assert!(Remote::open("ftp://x/y", &[])
            .unwrap_err()
            .contains("unsupported scheme"));
        assert!(Remote::open("not a url", &[])
            .unwrap_err()
            .contains("snapshot URL"));
        let s3 = Remote::open("s3://bucket/p", &[("no_such_option".into(), "1".into())]).unwrap_err();
        if cfg!(feature = "s3") {
            assert!(s3.contains("no_such_option"), "{s3}");
        } else {
            assert!(s3.contains("`s3` Cargo feature"), "{s3}");
        }
        if !cfg!(feature = "gcs") {
            assert!(Remote::open("gs://bucket/p", &[]).unwrap_err().contains("`gcs` Cargo feature"));
        }
    }
}
