//! [`AdminError`]: what the operator tooling's functions fail with. The
//! failures only `admin` produces have their own variants; those of the
//! library's machinery it calls (RocksDB, directory locks, Kafka clients,
//! I/O, client configuration) are carried as the [`crate::Error`] they are.

use std::path::PathBuf;

/// Result alias of the operator tooling.
pub type Result<T, E = AdminError> = std::result::Result<T, E>;

/// Everything that can go wrong in an operator tooling function.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The state directory does not exist.
    #[error("state directory `{0}` does not exist")]
    StateDirMissing(PathBuf),

    /// An application, store or store partition has no directory under the
    /// state directory.
    #[error("{what} not found (no directory `{path}`){}", if available.is_empty() { String::new() } else { format!("; found: {}", available.join(", ")) })]
    StateNotFound {
        /// What was looked for, e.g. "store `counts` of application `app`".
        what: String,
        /// The directory that does not exist.
        path: PathBuf,
        /// What exists at that level instead.
        available: Vec<String>,
    },

    /// A snapshot's description does not match its data (or is
    /// unreadable); nothing was imported.
    #[error("snapshot `{path}`: {detail}")]
    SnapshotMismatch {
        /// The snapshot directory.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },

    /// A destination that must be new or empty is not (a snapshot
    /// destination that exists, an import over local data without `force`).
    #[error("`{path}` {detail}")]
    TargetNotEmpty {
        /// The destination.
        path: PathBuf,
        /// What is in the way.
        detail: String,
    },

    /// A changelog topic or partition the operation needs does not exist on
    /// the cluster, or cannot be used as asked.
    #[error("changelog `{topic}`: {detail}")]
    Changelog {
        /// The changelog topic.
        topic: String,
        /// What is wrong.
        detail: String,
    },

    /// Any other failure of an admin operation.
    #[error("{0}")]
    Admin(String),

    /// A failure of the library's machinery the operation uses, as the
    /// library reports it: a store partition a live instance holds
    /// ([`crate::Error::StateDirLocked`]), invalid Kafka client properties
    /// ([`crate::Error::Config`]), unreachable brokers
    /// ([`crate::Error::BrokerUnreachable`]), RocksDB, Kafka or I/O errors.
    #[error(transparent)]
    Kstate(#[from] crate::Error),
}

impl AdminError {
    /// A file-system error on `path` ([`crate::Error::Io`]).
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        AdminError::Kstate(crate::Error::io(path, source))
    }
}
