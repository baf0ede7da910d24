//! The library's error type: what failed, in Xen and RDMA terms, with the layer below visible
//! (the XenStore errno, the platform's knob, the backend's [`Status`]).

use shared_ring::abi::control::{Op, Status};

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the vrdma frontend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A XenStore operation failed; the client error keeps the errno (`ENOENT`, `EACCES`, ...).
    #[error("xenstore: {0}")]
    XenStore(#[from] xenstore_proto::client::Error),

    /// Grants, event channels or the simulated host failed (grant limits name their knob).
    #[error("xen platform: {0}")]
    Platform(#[from] xen_platform::Error),

    /// No vrdma device is attached to this domain under that id.
    #[error(
        "no vrdma device {devid} in this domain ({path} does not exist): attach one with \
         `vrdmactl attach`"
    )]
    NoDevice { devid: u32, path: String },

    /// The device's XenStore nodes say something this library cannot use.
    #[error("vrdma device {path}: {reason}")]
    BadDevice { path: String, reason: String },

    /// The backend did not reach the state we waited for in time.
    #[error("timed out after {timeout_ms} ms waiting for {what}")]
    Timeout { what: String, timeout_ms: u64 },

    /// The backend refused the channel (its `error` node says why).
    #[error("backend refused channel {channel}: {reason}")]
    ChannelRefused { channel: u32, reason: String },

    /// The backend answered a control request with an error status.
    #[error("{op:?} failed: {status:?}{}", status_hint(*.status))]
    Backend { op: Op, status: Status },

    /// The backend broke the shared-memory protocol (malformed response, bad index, ...).
    /// The channel is unusable afterwards.
    #[error("protocol error from the backend: {0}")]
    Protocol(String),

    /// The channel to the backend is gone (backend closed it, restarted or died; the device
    /// was detached). Open a new [`crate::Context`] to go on.
    #[error("device lost: {0}")]
    DeviceLost(String),

    /// A send or receive queue has no free slot: poll completions first.
    #[error("{queue} is full ({size} work requests outstanding)")]
    QueueFull { queue: &'static str, size: u32 },

    /// The caller passed something that cannot be right.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The peer rejected the connection (its reject message's private data, if any), or
    /// nothing listens on the port.
    #[error("connection to {peer} rejected ({} bytes of private data)", private_data.len())]
    ConnectRejected {
        peer: std::net::SocketAddr,
        private_data: Vec<u8>,
    },

    /// The connection could not be set up: no answer in time, TCP refused or reset, or the
    /// peer's reply did not make sense.
    #[error("{peer} is unreachable")]
    Unreachable { peer: std::net::SocketAddr },

    /// The QP's connection ended (or failed) while waiting for it to be established.
    #[error("QP {qp}: {what}")]
    ConnectionLost { qp: u32, what: String },
}

fn status_hint(s: Status) -> &'static str {
    match s {
        Status::QuotaExceeded => {
            " (a per-domain quota is exhausted: see max-qps, max-cqs, max-mrs, max-mr-pages, \
             max-pds, max-granted-pages in the backend's device directory (the toolstack sets \
             them), or this domain's share of the backend's [host] granted-pages / \
             mapped-pages; the backend's log names which)"
        }
        Status::NoResources => " (the backend is out of memory or grant entries)",
        Status::DeviceLost => " (the device is going away)",
        Status::VersionMismatch => " (frontend and backend speak different protocol versions)",
        Status::NotPermitted => {
            " (the backend's policy forbids it: [cm] allowed-ports / allowed-peers of its \
             configuration, or an address that is not the backend's)"
        }
        Status::AddressInUse => " (the port is taken on the backend's address)",
        _ => "",
    }
}

impl Error {
    /// The backend's status, when the backend refused a request.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Backend { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A per-domain quota is exhausted.
    pub fn is_quota_exceeded(&self) -> bool {
        self.status() == Some(Status::QuotaExceeded)
    }

    /// The backend's policy forbade it (ports, peers).
    pub fn is_not_permitted(&self) -> bool {
        self.status() == Some(Status::NotPermitted)
    }

    /// The channel to the device is gone.
    pub fn is_device_lost(&self) -> bool {
        matches!(self, Error::DeviceLost(_)) || self.status() == Some(Status::DeviceLost)
    }

    pub(crate) fn protocol(what: impl std::fmt::Display) -> Error {
        Error::Protocol(what.to_string())
    }
}

impl From<shared_ring::MemError> for Error {
    fn from(e: shared_ring::MemError) -> Error {
        Error::Protocol(format!("shared memory layout: {e}"))
    }
}

impl From<shared_ring::RingError> for Error {
    fn from(e: shared_ring::RingError) -> Error {
        Error::Protocol(format!("control ring: {e}"))
    }
}

impl From<shared_ring::abi::AbiError> for Error {
    fn from(e: shared_ring::abi::AbiError) -> Error {
        Error::Protocol(format!("malformed slot: {e}"))
    }
}

impl From<shared_ring::doorbell::DoorbellError> for Error {
    fn from(e: shared_ring::doorbell::DoorbellError) -> Error {
        Error::Protocol(format!("doorbell page: {e}"))
    }
}
