//! The error names of `xsd_errors[]`, in the header's order.

use std::fmt;

use super::WireError;

/// An errno as XenStore transmits it: by name, in an `ERROR` reply.
#[allow(clippy::upper_case_acronyms)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XsErrno {
    EINVAL,
    EACCES,
    EEXIST,
    EISDIR,
    ENOENT,
    ENOMEM,
    ENOSPC,
    EIO,
    ENOTEMPTY,
    ENOSYS,
    EROFS,
    EBUSY,
    EAGAIN,
    EISCONN,
    E2BIG,
    EPERM,
}

impl XsErrno {
    /// All names, in `xsd_errors[]` order (new ones are only ever appended there).
    pub const ALL: [XsErrno; 16] = [
        XsErrno::EINVAL,
        XsErrno::EACCES,
        XsErrno::EEXIST,
        XsErrno::EISDIR,
        XsErrno::ENOENT,
        XsErrno::ENOMEM,
        XsErrno::ENOSPC,
        XsErrno::EIO,
        XsErrno::ENOTEMPTY,
        XsErrno::ENOSYS,
        XsErrno::EROFS,
        XsErrno::EBUSY,
        XsErrno::EAGAIN,
        XsErrno::EISCONN,
        XsErrno::E2BIG,
        XsErrno::EPERM,
    ];

    /// The name sent on the wire.
    pub fn name(self) -> &'static str {
        match self {
            XsErrno::EINVAL => "EINVAL",
            XsErrno::EACCES => "EACCES",
            XsErrno::EEXIST => "EEXIST",
            XsErrno::EISDIR => "EISDIR",
            XsErrno::ENOENT => "ENOENT",
            XsErrno::ENOMEM => "ENOMEM",
            XsErrno::ENOSPC => "ENOSPC",
            XsErrno::EIO => "EIO",
            XsErrno::ENOTEMPTY => "ENOTEMPTY",
            XsErrno::ENOSYS => "ENOSYS",
            XsErrno::EROFS => "EROFS",
            XsErrno::EBUSY => "EBUSY",
            XsErrno::EAGAIN => "EAGAIN",
            XsErrno::EISCONN => "EISCONN",
            XsErrno::E2BIG => "E2BIG",
            XsErrno::EPERM => "EPERM",
        }
    }

    /// Parses a wire name.
    pub fn from_name(name: &str) -> Result<XsErrno, WireError> {
        Self::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or_else(|| WireError::UnknownErrno(name.to_owned()))
    }

    /// The Linux errno number (what libxenstore puts in `errno`).
    pub fn code(self) -> i32 {
        match self {
            XsErrno::EINVAL => 22,
            XsErrno::EACCES => 13,
            XsErrno::EEXIST => 17,
            XsErrno::EISDIR => 21,
            XsErrno::ENOENT => 2,
            XsErrno::ENOMEM => 12,
            XsErrno::ENOSPC => 28,
            XsErrno::EIO => 5,
            XsErrno::ENOTEMPTY => 39,
            XsErrno::ENOSYS => 38,
            XsErrno::EROFS => 30,
            XsErrno::EBUSY => 16,
            XsErrno::EAGAIN => 11,
            XsErrno::EISCONN => 106,
            XsErrno::E2BIG => 7,
            XsErrno::EPERM => 1,
        }
    }

    /// The name for a Linux errno number, when XenStore can carry it.
    pub fn from_code(code: i32) -> Option<XsErrno> {
        Self::ALL.into_iter().find(|e| e.code() == code)
    }
}

impl fmt::Display for XsErrno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
