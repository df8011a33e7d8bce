//! An exclusive lock on a store directory, so two processes never open the
//! same RocksDB store.
//!
//! The lock is an OS file lock (`flock`) on `<dir>/.kstate.lock`: it is
//! released when the process dies, so a crash never leaves a stale lock
//! behind. A lock that is held is retried with exponential backoff up to a
//! deadline and then reported as [`Error::StateDirLocked`].

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

const LOCK_FILE: &str = ".kstate.lock";

/// A held directory lock; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Locks `dir` (created if missing), retrying for up to `wait`.
    pub(crate) fn acquire(dir: &Path, wait: Duration) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let open = || {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(|e| Error::io(&path, e))
        };
        let mut file = open()?;
        let started = Instant::now();
        let mut backoff = Duration::from_millis(20);
        let mut warned = false;
        loop {
            match file.try_lock() {
                // The holder we waited for may have deleted the directory
                // (the cleanup of an unowned task, `kstate wipe`): a lock on
                // that unlinked file locks nothing. Only the file at `path`
                // counts; otherwise open it again and retry.
                Ok(()) if still_at(&file, &path) => return Ok(DirLock { _file: file, path }),
                Ok(()) => file = open()?,
                Err(TryLockError::WouldBlock) => {
                    let waited = started.elapsed();
                    if waited >= wait {
                        return Err(Error::StateDirLocked { path: dir.to_path_buf(), waited });
                    }
                    if !warned {
                        tracing::warn!(dir = %dir.display(),
                            "state directory is locked (by another process, or by this one's previous use of it still closing); retrying");
                        warned = true;
                    }
                    std::thread::sleep(backoff.min(wait - waited));
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(TryLockError::Error(e)) => return Err(Error::io(&path, e)),
            }
        }
    }

    /// The lock file's path.
    #[allow(dead_code)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether a live process holds the lock of `dir` (without creating the
/// lock file; the lock is taken for an instant and released at once, so an
/// instance acquiring it at that moment retries).
pub(crate) fn is_held(dir: &Path) -> Result<bool> {
    let path = dir.join(LOCK_FILE);
    let file = match OpenOptions::new().read(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(path, e)),
    };
    match file.try_lock() {
        Ok(()) => Ok(false),
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(e)) => Err(Error::io(path, e)),
    }
}

/// Whether `file` is (still) the file at `path`.
fn still_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_fails_with_typed_error_then_succeeds_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), Duration::ZERO).unwrap();
        let started = Instant::now();
        let err = DirLock::acquire(dir.path(), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, Error::StateDirLocked { .. }), "{err}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        drop(first);
        DirLock::acquire(dir.path(), Duration::ZERO).unwrap();
    }

    /// A waiter whose holder deletes the directory (as the cleanup of an
    /// unowned task and `kstate wipe` do) must not end up holding a lock on
    /// the deleted file: it takes the lock of the directory as it is now.
    #[test]
    fn a_lock_whose_file_was_deleted_by_its_holder_is_taken_again_on_the_new_file() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("store/0");
        let holder = DirLock::acquire(&dir, Duration::ZERO).unwrap();
        let waiter = {
            let dir = dir.clone();
            std::thread::spawn(move || DirLock::acquire(&dir, Duration::from_secs(10)).unwrap())
        };
        std::thread::sleep(Duration::from_millis(200)); // the waiter has opened the old file
        std::fs::remove_dir_all(&dir).unwrap();
        drop(holder);
        let held = waiter.join().unwrap();
        assert!(still_at(&held._file, &dir.join(LOCK_FILE)), "the waiter locks the file that is there now");
        let err = DirLock::acquire(&dir, Duration::ZERO).unwrap_err();
        assert!(matches!(err, Error::StateDirLocked { .. }), "a third party sees it locked: {err}");
    }
}
