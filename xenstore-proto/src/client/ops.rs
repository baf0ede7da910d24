//! Checking arguments before they are sent and decoding replies into values: the parts of
//! every operation that do not depend on how the reply was awaited.

use super::Error;
use crate::wire::{
    check_path, check_watch_path, MsgType, Packet, Response, HEADER_LEN, PAYLOAD_MAX,
};

/// A node path the daemon would accept (absolute or relative to the caller's domain path).
pub(crate) fn node_path(path: &str) -> Result<(), Error> {
    check_path(path).map(drop).map_err(|source| Error::BadPath {
        path: path.to_owned(),
        source,
    })
}

/// A watch path: a node path or a special `@name`.
pub(crate) fn watch_path(path: &str) -> Result<(), Error> {
    check_watch_path(path)
        .map(drop)
        .map_err(|source| Error::BadPath {
            path: path.to_owned(),
            source,
        })
}

/// A string argument: it is sent nul-terminated, so it may not hold a nul itself.
pub(crate) fn string_arg(what: &str, arg: &[u8]) -> Result<(), Error> {
    if arg.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "{what} contains a nul byte"
        )));
    }
    Ok(())
}

/// Refuses payloads over `XENSTORE_PAYLOAD_MAX` before they reach the daemon.
pub(crate) fn payload_len(op: MsgType, len: usize) -> Result<(), Error> {
    if len > PAYLOAD_MAX {
        return Err(Error::InvalidArgument(format!(
            "{op} payload of {len} bytes exceeds XENSTORE_PAYLOAD_MAX ({PAYLOAD_MAX})"
        )));
    }
    Ok(())
}

/// Decodes a reply frame to request `op`: an `ERROR` reply becomes [`Error::Xs`], any other
/// type than `op` is a protocol violation.
pub(crate) fn decode<'f>(
    frame: &'f [u8],
    op: MsgType,
    path: Option<&str>,
) -> Result<Response<'f>, Error> {
    let packet = Packet::new_checked(frame)?;
    let ty = packet.msg_type()?;
    let payload = &frame[HEADER_LEN..packet.total_len()];
    if ty == MsgType::Error {
        return match Response::parse(ty, payload)? {
            Response::Error(errno) => Err(Error::Xs {
                errno,
                op,
                path: path.map(str::to_owned),
            }),
            _ => unreachable!("ERROR parses to Error"),
        };
    }
    if ty != op {
        return Err(Error::UnexpectedReply {
            request: op,
            reply: ty,
        });
    }
    Ok(Response::parse(ty, payload)?)
}

/// The reply had the right type but not the expected shape (cannot happen with a correct
/// parser; kept as an error rather than a panic since the bytes come from the daemon).
pub(crate) fn shape(op: MsgType) -> Error {
    Error::Protocol(crate::wire::WireError::BadReply {
        ty: op,
        why: "unexpected reply shape",
    })
}
