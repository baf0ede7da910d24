//! The vrdma shared-memory ABI: slot formats exchanged through shared pages.
//!
//! Each format follows the smoltcp `wire` shape: a zero-copy view over a byte buffer
//! (`new_checked` validates the length once; getters/setters are fixed byte ranges named in a
//! `field` module) and a `Repr`, the parsed meaning, with `parse` (validating) and `emit`.
//! Slots are always copied out of shared memory before they are viewed, so a view never looks
//! at memory the peer can change.
//!
//! All multi-byte fields are little-endian. Byte offsets are documented in `docs/protocol.md`.

pub mod control;
pub mod cqe;
pub mod event;
pub mod page_dir;
pub mod wqe;
pub mod xenstore;

/// Version of the vrdma shared-memory protocol described by this crate. Negotiated in the
/// channel's XenStore `version` key and the `Init` control request; stamped in the doorbell page.
///
/// 2: the CQ consumer index moved to the back line of its doorbell slot; SQ/RQ WQEs carry a
/// phase bit in their owner word (offset 28) that the engine polls.
pub const PROTOCOL_VERSION: u32 = 2;

/// A Xen grant reference.
pub type GrantRef = u32;

/// A malformed slot: what the peer wrote does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AbiError {
    #[error("buffer of {len} bytes is shorter than the {need}-byte slot")]
    Truncated { len: usize, need: usize },
    #[error("unknown {what} {value}")]
    Unknown { what: &'static str, value: u32 },
    #[error("reserved field {field} is not zero")]
    Reserved { field: &'static str },
    #[error("{what} {value} is out of range (max {max})")]
    OutOfRange {
        what: &'static str,
        value: u64,
        max: u64,
    },
}

pub(crate) type Field = core::ops::Range<usize>;

#[inline]
pub(crate) fn get_u8(b: &[u8], f: usize) -> u8 {
    b[f]
}
#[inline]
pub(crate) fn get_u16(b: &[u8], f: usize) -> u16 {
    u16::from_le_bytes([b[f], b[f + 1]])
}
#[inline]
pub(crate) fn get_u32(b: &[u8], f: usize) -> u32 {
    u32::from_le_bytes([b[f], b[f + 1], b[f + 2], b[f + 3]])
}
#[inline]
pub(crate) fn get_u64(b: &[u8], f: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f..f + 8]);
    u64::from_le_bytes(a)
}
#[inline]
pub(crate) fn set_u8(b: &mut [u8], f: usize, v: u8) {
    b[f] = v;
}
#[inline]
pub(crate) fn set_u16(b: &mut [u8], f: usize, v: u16) {
    b[f..f + 2].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn set_u32(b: &mut [u8], f: usize, v: u32) {
    b[f..f + 4].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn set_u64(b: &mut [u8], f: usize, v: u64) {
    b[f..f + 8].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn check_len(len: usize, need: usize) -> Result<(), AbiError> {
    if len < need {
        Err(AbiError::Truncated { len, need })
    } else {
        Ok(())
    }
}

pub(crate) fn check_zero(b: &[u8], f: Field, field: &'static str) -> Result<(), AbiError> {
    if b[f].iter().all(|&x| x == 0) {
        Ok(())
    } else {
        Err(AbiError::Reserved { field })
    }
}

/// Declares getters for little-endian integers at fixed offsets of a view's buffer.
macro_rules! view_getters {
    ($($(#[$m:meta])* $get:ident: $ty:ident @ $off:expr;)*) => {
        $(
            $(#[$m])*
            #[inline]
            pub fn $get(&self) -> $ty {
                let b = self.buffer.as_ref();
                let mut a = [0u8; core::mem::size_of::<$ty>()];
                a.copy_from_slice(&b[$off..$off + core::mem::size_of::<$ty>()]);
                $ty::from_le_bytes(a)
            }
        )*
    };
}
pub(crate) use view_getters;

/// Declares setters for little-endian integers at fixed offsets of a view's buffer.
macro_rules! view_setters {
    ($($(#[$m:meta])* $set:ident: $ty:ident @ $off:expr;)*) => {
        $(
            $(#[$m])*
            #[inline]
            pub fn $set(&mut self, v: $ty) {
                let b = self.buffer.as_mut();
                b[$off..$off + core::mem::size_of::<$ty>()].copy_from_slice(&v.to_le_bytes());
            }
        )*
    };
}
pub(crate) use view_setters;
