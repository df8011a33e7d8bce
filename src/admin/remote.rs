//! `snapshots list|show|gc`: the snapshots an application keeps in its
//! snapshot store (`AppBuilder::snapshots`), read and collected without the
//! application (architecture.md §10).

use std::collections::HashSet;

use serde::Serialize;

use super::{AdminError, Result};
use crate::snapshot::gc::{collect, manifests};
use crate::snapshot::remote::Remote;
use crate::snapshot::{GcReport, RemoteSnapshot};

/// Where an application's snapshots are: the URL and options given to
/// [`SnapshotConfig`](crate::SnapshotConfig) (credentials from the environment).
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    /// `s3://bucket/prefix`, `gs://...`, `az://...` or `file:///dir`.
    pub url: String,
    /// The object store's settings (`aws_endpoint`, ...).
    pub options: Vec<(String, String)>,
}

/// One store partition's snapshots, oldest first.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionSnapshots {
    /// The store.
    pub store: String,
    /// The partition.
    pub partition: i32,
    /// Its complete snapshots, oldest first.
    pub snapshots: Vec<RemoteSnapshot>,
    /// Manifests that could not be read, with the reason.
    pub unreadable: Vec<String>,
}

/// One store partition's collection.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionGc {
    /// The store.
    pub store: String,
    /// The partition.
    pub partition: i32,
    /// What was deleted and kept.
    #[serde(flatten)]
    pub report: GcReport,
}

impl SnapshotStore {
    fn open(&self) -> Result<(Remote, tokio::runtime::Runtime)> {
        let remote = Remote::open(&self.url, &self.options).map_err(AdminError::Admin)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| AdminError::Admin(format!("I/O runtime: {e}")))?;
        Ok((remote, rt))
    }
}

/// The store partitions of `app` that have a folder in the snapshot store
/// (store, partition), sorted.
pub(super) async fn partitions(remote: &Remote, app: &str) -> Result<Vec<(String, i32)>> {
    let dir = remote.app_dir(app);
    let app_dir = dir.as_ref().to_string();
    let listed = remote.list(&dir).await.map_err(remote_error)?;
    let mut out: Vec<(String, i32)> = listed
        .iter()
        .filter_map(|m| {
            let rest = m
                .location
                .as_ref()
                .strip_prefix(&app_dir)?
                .trim_start_matches('/');
            let mut parts = rest.split('/');
            let (store, partition, kind) = (parts.next()?, parts.next()?, parts.next()?);
            matches!(kind, "manifests" | "files" | "pending").then(|| Some((store.to_string(), partition.parse().ok()?)))?
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

fn remote_error(e: crate::snapshot::remote::RemoteError) -> AdminError {
    AdminError::Admin(e.to_string())
}

/// Every snapshot of `app` (optionally of one store), by store partition.
pub fn list_snapshots(
    at: &SnapshotStore,
    app: &str,
    store: Option<&str>,
) -> Result<Vec<PartitionSnapshots>> {
    let (remote, rt) = at.open()?;
    rt.block_on(async {
        let mut out = Vec::new();
        for (s, p) in partitions(&remote, app).await? {
            if store.is_some_and(|want| want != s) {
                continue;
            }
            let mut snapshots = Vec::new();
            let mut unreadable = Vec::new();
            for (_, m) in manifests(&remote, &remote.partition_dir(app, &s, p))
                .await
                .map_err(remote_error)?
            {
                match m {
                    Ok(m) => snapshots.push(m),
                    Err(why) => unreadable.push(why),
                }
            }
            out.push(PartitionSnapshots {
                store: s,
                partition: p,
                snapshots,
                unreadable,
            });
        }
        Ok(out)
    })
}

/// One snapshot by id.
pub fn show_snapshot(at: &SnapshotStore, app: &str, id: &str) -> Result<RemoteSnapshot> {
    let all = list_snapshots(at, app, None)?;
    let known: Vec<String> = all
        .iter()
        .flat_map(|p| p.snapshots.iter().map(|s| s.id.clone()))
        .collect();
    all.into_iter()
        .flat_map(|p| p.snapshots)
        .find(|s| s.id == id)
        .ok_or_else(|| {
            AdminError::Admin(format!(
                "no snapshot `{id}` of application `{app}`; there are: {}",
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ))
        })
}

/// Keeps the newest `retain` snapshots of every store partition of `app`
/// and deletes the rest and every file none of them names (safe while the
/// application uploads: see the rules in architecture.md §10).
pub fn gc_snapshots(at: &SnapshotStore, app: &str, retain: usize) -> Result<Vec<PartitionGc>> {
    if retain == 0 {
        return Err(AdminError::Admin("--retain must be at least 1".into()));
    }
    let (remote, rt) = at.open()?;
    rt.block_on(async {
        let mut out = Vec::new();
        for (store, partition) in partitions(&remote, app).await? {
            let dir = remote.partition_dir(app, &store, partition);
            let report = collect(
                &remote,
                &dir,
                retain,
                &HashSet::new(),
                crate::store::engine::now_ms(),
            )
            .await
            .map_err(remote_error)?;
            out.push(PartitionGc {
                store,
                partition,
                report,
            });
        }
        Ok(out)
    })
}
