//! Small file-system helpers: the bytes under a directory and the free
//! space on its file system (the state dir's gauges, the operator CLI's
//! reports), the store and partition directories under an application's
//! directory, and replacing a small file atomically.

use std::path::Path;

/// Bytes of every file under `path` (or of `path` itself if it is a file);
/// symbolic links are not followed, files that vanish meanwhile are skipped.
pub(crate) fn dir_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.is_dir() {
        return 0;
    }
    std::fs::read_dir(path).into_iter().flatten().flatten().map(|e| dir_bytes(&e.path())).sum()
}

/// Bytes available to this process on the file system holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: valid C string and a zeroed out struct for statvfs to fill.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    (rc == 0).then(|| stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// Replaces the file at `path` with `bytes` through a temporary file and a
/// rename, so that a reader sees the old content or the new, never a part.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Removes the file at `path` if it is there.
pub(crate) fn remove_if_present(path: &Path) -> crate::error::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(crate::error::Error::io(path, e)),
    }
}

/// Names of the directories in `dir`, sorted.
pub(crate) fn subdirs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        // Hidden folders are kstate's own (a remote store's disk cache),
        // never an application or a store.
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

/// The partition directories (numeric names) of a store directory, sorted.
pub(crate) fn partitions_of(store_dir: &Path) -> Vec<i32> {
    let mut ps: Vec<i32> = subdirs(store_dir).iter().filter_map(|n| n.parse().ok()).filter(|p| *p >= 0).collect();
    ps.sort_unstable();
    ps
}
