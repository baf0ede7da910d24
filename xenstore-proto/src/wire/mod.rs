//! The XenStore wire codec, after `io/xs_wire.h` and `docs/misc/xenstore.txt`.
//!
//! Two layers, as smoltcp's `wire` module: a zero-copy [`Packet`] view over a framed message
//! (16-byte header `{type, req_id, tx_id, len}` in host byte order, then `len` payload bytes),
//! and typed representations — [`Request`] and [`Response`] — parsed from a payload and emitted
//! back to the same bytes. Everything that arrives from a peer goes through
//! [`Packet::new_checked`] and `parse`, which return [`WireError`] and never panic.

mod errno;
mod frame;
mod msgtype;
mod path;
mod perms;
mod request;
mod response;
mod strings;

pub use errno::XsErrno;
pub use frame::{encode_frame, FrameDecoder, Header, Packet, HEADER_LEN};
pub use msgtype::MsgType;
pub use path::{check_path, check_watch_path, PathError, PathKind};
pub use perms::{Perm, PermKind, Perms};
pub use request::Request;
pub use response::{DirectoryPart, QuotaReply, Response};

/// Largest payload either side may send (`XENSTORE_PAYLOAD_MAX`).
pub const PAYLOAD_MAX: usize = 4096;
/// Longest absolute path (`XENSTORE_ABS_PATH_MAX`).
pub const ABS_PATH_MAX: usize = 3072;
/// Longest relative path a client should send (`XENSTORE_REL_PATH_MAX`).
pub const REL_PATH_MAX: usize = 2048;
/// `XS_WRITE_NONE`, `XS_WRITE_CREATE`, `XS_WRITE_CREATE_EXCL`: historic write flags.
pub const WRITE_NONE: &str = "NONE";
/// See [`WRITE_NONE`].
pub const WRITE_CREATE: &str = "CREATE";
/// See [`WRITE_NONE`].
pub const WRITE_CREATE_EXCL: &str = "CREATE|EXCL";

/// Why bytes from a peer are not a valid XenStore message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than a header, or than the header's `len` announces.
    #[error("truncated message: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    /// `len` exceeds `XENSTORE_PAYLOAD_MAX`.
    #[error("payload of {0} bytes exceeds XENSTORE_PAYLOAD_MAX (4096)")]
    PayloadTooLong(usize),
    /// A message type this codec does not know (or `XS_RESTRICT`, removed).
    #[error("unknown message type {0}")]
    UnknownType(u32),
    /// A string argument is not nul-terminated.
    #[error("unterminated string in {0} payload")]
    Unterminated(MsgType),
    /// The payload has the wrong number of nul-terminated strings.
    #[error("{ty} payload has {got} arguments, expected {expected}")]
    ArgCount {
        ty: MsgType,
        got: usize,
        expected: &'static str,
    },
    /// A string that must be text is not UTF-8.
    #[error("{0} payload: string is not UTF-8")]
    NotUtf8(MsgType),
    /// A path breaks the syntax rules.
    #[error("bad path: {0}")]
    Path(#[from] PathError),
    /// A decimal number (domid, offset, port, quota value, ...) does not parse.
    #[error("{ty} payload: bad number {text:?}")]
    BadNumber { ty: MsgType, text: String },
    /// A permission string is not `[wrbn]<domid>`.
    #[error("bad permission {0:?}")]
    BadPerm(String),
    /// An ERROR reply names an errno not in `xsd_errors`.
    #[error("unknown error name {0:?}")]
    UnknownErrno(String),
    /// A reply that does not match the shape its type requires.
    #[error("malformed {ty} reply: {why}")]
    BadReply { ty: MsgType, why: &'static str },
    /// This message type is only ever sent by the server, or only by a client.
    #[error("{0} is not valid in this direction")]
    WrongDirection(MsgType),
}

impl WireError {
    /// The errno name a server sends back for this malformed request.
    pub fn errno(&self) -> XsErrno {
        match self {
            WireError::UnknownType(_) => XsErrno::ENOSYS,
            WireError::PayloadTooLong(_) => XsErrno::E2BIG,
            WireError::Path(PathError::TooLong { .. }) => XsErrno::EINVAL,
            _ => XsErrno::EINVAL,
        }
    }
}

#[cfg(test)]
mod tests;
