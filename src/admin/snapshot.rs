//! `snapshot`: a consistent copy of one store partition, to seed another
//! machine's state directory ([`super::import_snapshot()`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{dir_bytes, store_partition_dir, AdminError, Result};
use crate::store::engine::{Checkpoint, Engine, EngineResources};
use crate::store::lock::DirLock;

/// The file in a snapshot directory that describes it.
pub const SNAPSHOT_MANIFEST: &str = "kstate-snapshot.json";

/// What a snapshot holds (`kstate-snapshot.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotManifest {
    /// The application the store belongs to.
    pub application_id: String,
    /// The store.
    pub store: String,
    /// The store (and changelog) partition.
    pub partition: i32,
    /// The changelog offset the data reflects (`None`: nothing committed).
    pub checkpoint: Option<i64>,
    /// The changelog topic.
    pub changelog_topic: String,
    /// The changelog topic id the state came from, if recorded.
    pub changelog_topic_id: Option<String>,
    /// When the snapshot was taken (ms since the epoch).
    pub created_at_ms: i64,
    /// The kstate version that took it.
    pub kstate_version: String,
}

/// The outcome of [`snapshot()`].
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotReport {
    /// The snapshot directory.
    pub path: PathBuf,
    /// What it holds.
    pub manifest: SnapshotManifest,
    /// Bytes of its files (SST files are hard links where possible).
    pub bytes: u64,
}

/// Takes a RocksDB checkpoint of one store partition into `dest` (which
/// must not exist): `dest/db` and `dest/kstate-snapshot.json`. Refuses a
/// store a live instance holds; holds its lock meanwhile.
pub fn snapshot(state_dir: &Path, app: &str, store: &str, partition: i32, dest: &Path) -> Result<SnapshotReport> {
    let dir = store_partition_dir(state_dir, app, store, partition)?;
    if dest.exists() {
        return Err(AdminError::TargetNotEmpty { path: dest.to_path_buf(), detail: "already exists; a snapshot needs a new directory".into() });
    }
    let db_dir = dir.join("db");
    let in_memory = db_dir.join(crate::store::engine::HEAP_FILE).is_file();
    if !db_dir.join("CURRENT").is_file() && !in_memory {
        return Err(AdminError::Admin(format!("`{}` holds no RocksDB database and no in-memory store file", db_dir.display())));
    }
    let _lock = DirLock::acquire(&dir, Duration::ZERO)?;
    // An in-memory store's file is checked and copied as it is (an engine
    // would delete a file it refuses); RocksDB is opened for a checkpoint.
    let source = match in_memory {
        true => {
            let file = db_dir.join(crate::store::engine::HEAP_FILE);
            let bytes = std::fs::read(&file).map_err(|e| AdminError::io(&file, e))?;
            let state = crate::store::engine::decode_heap_file(&bytes, Some(&format!("{store}/{partition}")))
                .map_err(|why| AdminError::Admin(format!("`{}`: {why}; no snapshot taken", file.display())))?;
            Source::Heap(crate::store::engine::ReadOnlyDb::Heap(state), bytes)
        }
        false => Source::Rocks(Box::new(Engine::open(&db_dir, &EngineResources::new(8 << 20, 4 << 20))?)),
    };
    let checkpoint = match source.checkpoint()? {
        Checkpoint::None => None,
        Checkpoint::At(c) => Some(c),
        Checkpoint::Corrupt(why) => return Err(AdminError::Admin(format!("`{}`: {why}; no snapshot taken", db_dir.display()))),
    };
    let manifest = SnapshotManifest {
        application_id: app.to_string(),
        store: store.to_string(),
        partition,
        checkpoint,
        changelog_topic: match source.meta_get(crate::store::table::SOURCE_TOPIC_KEY)? {
            Some(topic) => String::from_utf8_lossy(&topic).into_owned(),
            None => crate::kafka::changelog_topic(app, store),
        },
        changelog_topic_id: source.changelog_topic_id()?,
        created_at_ms: crate::store::engine::now_ms(),
        kstate_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    // `create_dir`, not `create_dir_all`: it fails if another snapshot
    // created `dest` since the check above (whose files the cleanup below
    // would otherwise delete).
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| AdminError::io(parent, e))?;
    }
    std::fs::create_dir(dest).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => {
            AdminError::TargetNotEmpty { path: dest.to_path_buf(), detail: "already exists; a snapshot needs a new directory".into() }
        }
        _ => AdminError::io(dest, e),
    })?;
    let copied = match &source {
        Source::Rocks(engine) => engine.create_checkpoint(&dest.join("db")).map_err(AdminError::from),
        Source::Heap(_, bytes) => {
            let file = dest.join("db").join(crate::store::engine::HEAP_FILE);
            std::fs::create_dir(dest.join("db")).and_then(|()| std::fs::write(&file, bytes)).map_err(|e| AdminError::io(file, e))
        }
    };
    let written = copied.and_then(|()| {
        let path = dest.join(SNAPSHOT_MANIFEST);
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| AdminError::Admin(e.to_string()))?;
        std::fs::write(&path, json).map_err(|e| AdminError::io(path, e))
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(dest);
        return Err(e);
    }
    drop(source);
    Ok(SnapshotReport { path: dest.to_path_buf(), bytes: dir_bytes(dest), manifest })
}

/// What a snapshot is taken from: RocksDB opened, or an in-memory store's
/// file read and checked (its state and its bytes).
enum Source {
    Rocks(Box<Engine>),
    Heap(crate::store::engine::ReadOnlyDb, Vec<u8>),
}

impl Source {
    fn checkpoint(&self) -> crate::error::Result<Checkpoint> {
        match self {
            Source::Rocks(e) => e.checkpoint(),
            Source::Heap(db, _) => db.checkpoint(),
        }
    }

    fn meta_get(&self, key: &[u8]) -> crate::error::Result<Option<Vec<u8>>> {
        match self {
            Source::Rocks(e) => e.meta_get(key),
            Source::Heap(db, _) => db.meta_get(key),
        }
    }

    fn changelog_topic_id(&self) -> crate::error::Result<Option<String>> {
        match self {
            Source::Rocks(e) => e.changelog_topic_id(),
            Source::Heap(db, _) => db.changelog_topic_id(),
        }
    }
}
