//! Object stores opened from URLs (`s3://`, `gs://`, `az://`, `file://`),
//! shared by snapshots (`snapshot/`) and remote stores (`engine/remote.rs`).

use std::sync::Arc;
#[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
use std::time::Duration;

use object_store::path::Path;
use object_store::ObjectStore;

/// Retries of a failed request: few and short, so that an unreachable
/// snapshot store turns into a logged fallback (a full replay) within
/// seconds instead of holding a task's restore for minutes.
#[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
fn retry() -> object_store::RetryConfig {
    object_store::RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(15), ..Default::default() }
}

/// Opens the store a URL names: `s3://bucket/prefix` (and S3-compatible
/// servers through the `aws_endpoint` option or `AWS_ENDPOINT`),
/// `gs://bucket/prefix`, `az://container/prefix` (and the other Azure
/// schemes), `file:///absolute/dir`, with the path under it everything is
/// written below. Credentials and settings come from the environment
/// (`AWS_*`, `GOOGLE_*`, `AZURE_*`) and `options` (the builders'
/// configuration keys, e.g. `aws_endpoint`, `aws_allow_http`,
/// `aws_region`), options winning. Errors name the URL's use (`what`:
/// "snapshot", "remote state").
pub(crate) fn open_url(what: &str, url: &str, options: &[(String, String)]) -> Result<(Arc<dyn ObjectStore>, Path), String> {
    #[cfg(not(any(feature = "s3", feature = "gcs", feature = "azure")))]
    let _ = options; // (only the cloud backends take options)
    let parsed = url::Url::parse(url).map_err(|e| format!("{what} URL `{url}`: {e}"))?;
    let (store, root): (Arc<dyn ObjectStore>, Path) = match parsed.scheme() {
        "file" => {
            let dir = parsed.to_file_path().map_err(|()| format!("{what} URL `{url}`: not an absolute file path"))?;
            std::fs::create_dir_all(&dir).map_err(|e| format!("{what} directory `{}`: {e}", dir.display()))?;
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(|e| format!("{what} directory `{}`: {e}", dir.display()))?
                .with_automatic_cleanup(true);
            (Arc::new(fs), Path::default())
        }
        #[cfg(feature = "s3")]
        "s3" | "s3a" => {
            let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(url).with_retry(retry());
            for (k, v) in options {
                b = b.with_config(k.parse().map_err(|e| format!("{what} option `{k}`: {e}"))?, v);
            }
            (Arc::new(b.build().map_err(|e| format!("{what} URL `{url}`: {e}"))?), Path::parse(parsed.path()).map_err(|e| e.to_string())?)
        }
        #[cfg(feature = "gcs")]
        "gs" => {
            let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url).with_retry(retry());
            for (k, v) in options {
                b = b.with_config(k.parse().map_err(|e| format!("{what} option `{k}`: {e}"))?, v);
            }
            (Arc::new(b.build().map_err(|e| format!("{what} URL `{url}`: {e}"))?), Path::parse(parsed.path()).map_err(|e| e.to_string())?)
        }
        #[cfg(feature = "azure")]
        "az" | "adl" | "azure" | "abfs" | "abfss" => {
            let mut b = object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url).with_retry(retry());
            for (k, v) in options {
                b = b.with_config(k.parse().map_err(|e| format!("{what} option `{k}`: {e}"))?, v);
            }
            (Arc::new(b.build().map_err(|e| format!("{what} URL `{url}`: {e}"))?), Path::parse(parsed.path()).map_err(|e| e.to_string())?)
        }
        other => {
            let feature = match other {
                "s3" | "s3a" => Some("s3"),
                "gs" => Some("gcs"),
                "az" | "adl" | "azure" | "abfs" | "abfss" => Some("azure"),
                _ => None,
            };
            return Err(match feature {
                Some(feature) => format!(
                    "{what} URL `{url}`: `{other}://` needs kstate's `{feature}` Cargo feature \
                     (features = [\"{feature}\"] on the kstate dependency in your Cargo.toml)"
                ),
                None => format!("{what} URL `{url}`: unsupported scheme `{other}` (use s3://, gs://, az:// or file://)"),
            });
        }
    };
    Ok((store, root))
}

/// Object store options as a `Debug` shows them: values whose keys name
/// a secret, key, token or password are `<redacted>`.
pub(crate) fn redacted(options: &[(String, String)]) -> Vec<(&str, &str)> {
    options
        .iter()
        .map(|(k, v)| {
            let lower = k.to_ascii_lowercase();
            let secret = ["secret", "key", "token", "password", "credential", "sas"].iter().any(|w| lower.contains(w));
            (k.as_str(), if secret { "<redacted>" } else { v.as_str() })
        })
        .collect()
}
