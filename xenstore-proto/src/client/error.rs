//! The client's error type: XenStore errnos, I/O, protocol violations and a lost connection
//! are distinct variants so callers can match what they care about.

use crate::wire::{MsgType, PathError, WireError, XsErrno};

/// What went wrong with a XenStore operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon answered with an `ERROR` reply: match on `errno` (ENOENT, EACCES, EAGAIN, ...).
    #[error("xenstore {op}{}: {errno}", path_suffix(.path))]
    Xs {
        errno: XsErrno,
        op: MsgType,
        /// The node the request named, when it named one.
        path: Option<String>,
    },
    /// Opening or using the transport failed.
    #[error("xenstore I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The connection died (EOF, I/O error, protocol violation) before a reply arrived; every
    /// request in flight and every watch on it fails with this.
    #[error("xenstore connection lost: {reason}")]
    ConnectionLost { reason: String },
    /// The daemon sent a reply this client cannot make sense of.
    #[error("xenstore protocol violation: {0}")]
    Protocol(#[from] WireError),
    /// The reply's type is neither the request's type nor `ERROR`.
    #[error("xenstore protocol violation: {request} answered by {reply}")]
    UnexpectedReply { request: MsgType, reply: MsgType },
    /// A path argument is not a valid XenStore path (checked before sending).
    #[error("invalid xenstore path {path:?}: {source}")]
    BadPath { path: String, source: PathError },
    /// An argument cannot be encoded (an embedded nul, or a payload over 4096 bytes).
    #[error("invalid xenstore argument: {0}")]
    InvalidArgument(String),
    /// A transaction still conflicted (EAGAIN) after the retry policy's last attempt.
    #[error("xenstore transaction still conflicting after {attempts} attempts")]
    RetriesExhausted { attempts: u32 },
    /// The transaction was already committed or aborted.
    #[error("xenstore transaction already ended")]
    TransactionEnded,
    /// The watch was removed (`reset_watches`) or its stream already ended.
    #[error("xenstore watch ended")]
    WatchEnded,
    /// A node's value is not what the caller asked to parse it as.
    #[error("xenstore node {path}: cannot parse value {value:?}")]
    BadValue { path: String, value: String },
}

fn path_suffix(path: &Option<String>) -> String {
    path.as_deref().map(|p| format!(" {p}")).unwrap_or_default()
}

impl Error {
    /// The XenStore errno this error carries: the daemon's, or `EAGAIN` for exhausted retries.
    pub fn errno(&self) -> Option<XsErrno> {
        match self {
            Error::Xs { errno, .. } => Some(*errno),
            Error::RetriesExhausted { .. } => Some(XsErrno::EAGAIN),
            _ => None,
        }
    }

    /// The node does not exist (`ENOENT`).
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(XsErrno::ENOENT)
    }

    /// The caller may not do this (`EACCES`).
    pub fn is_access_denied(&self) -> bool {
        self.errno() == Some(XsErrno::EACCES)
    }

    /// A transaction conflicted and may be retried (`EAGAIN`).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Error::Xs {
                errno: XsErrno::EAGAIN,
                ..
            }
        )
    }

    /// The connection is gone: nothing more will succeed on this client.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Error::ConnectionLost { .. })
    }
}

/// Shorthand for client results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
