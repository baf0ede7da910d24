//! `enum xsd_sockmsg_type`.

use std::fmt;

use super::WireError;

/// A XenStore message type, numbered as in `xs_wire.h` (and, for 23–26, as in Xen 4.19+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum MsgType {
    /// `XS_CONTROL` (historically `XS_DEBUG`).
    Control = 0,
    Directory = 1,
    Read = 2,
    GetPerms = 3,
    Watch = 4,
    Unwatch = 5,
    TransactionStart = 6,
    TransactionEnd = 7,
    Introduce = 8,
    Release = 9,
    GetDomainPath = 10,
    Write = 11,
    Mkdir = 12,
    Rm = 13,
    SetPerms = 14,
    WatchEvent = 15,
    Error = 16,
    IsDomainIntroduced = 17,
    Resume = 18,
    SetTarget = 19,
    // 20 was XS_RESTRICT: removed, and invalid.
    ResetWatches = 21,
    DirectoryPart = 22,
    GetFeature = 23,
    SetFeature = 24,
    GetQuota = 25,
    SetQuota = 26,
}

impl MsgType {
    /// Every valid type, in numeric order.
    pub const ALL: [MsgType; 26] = [
        MsgType::Control,
        MsgType::Directory,
        MsgType::Read,
        MsgType::GetPerms,
        MsgType::Watch,
        MsgType::Unwatch,
        MsgType::TransactionStart,
        MsgType::TransactionEnd,
        MsgType::Introduce,
        MsgType::Release,
        MsgType::GetDomainPath,
        MsgType::Write,
        MsgType::Mkdir,
        MsgType::Rm,
        MsgType::SetPerms,
        MsgType::WatchEvent,
        MsgType::Error,
        MsgType::IsDomainIntroduced,
        MsgType::Resume,
        MsgType::SetTarget,
        MsgType::ResetWatches,
        MsgType::DirectoryPart,
        MsgType::GetFeature,
        MsgType::SetFeature,
        MsgType::GetQuota,
        MsgType::SetQuota,
    ];

    /// `XS_INVALID`: guaranteed never to be a valid type.
    pub const INVALID: u32 = 0xffff;

    /// The type for a raw header value.
    pub fn from_u32(raw: u32) -> Result<MsgType, WireError> {
        match raw {
            0..=19 => Ok(Self::ALL[raw as usize]),
            21..=26 => Ok(Self::ALL[raw as usize - 1]),
            _ => Err(WireError::UnknownType(raw)),
        }
    }

    /// The raw header value.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// The name xenstored uses in its logs (`XS_` prefix dropped).
    pub fn name(self) -> &'static str {
        match self {
            MsgType::Control => "CONTROL",
            MsgType::Directory => "DIRECTORY",
            MsgType::Read => "READ",
            MsgType::GetPerms => "GET_PERMS",
            MsgType::Watch => "WATCH",
            MsgType::Unwatch => "UNWATCH",
            MsgType::TransactionStart => "TRANSACTION_START",
            MsgType::TransactionEnd => "TRANSACTION_END",
            MsgType::Introduce => "INTRODUCE",
            MsgType::Release => "RELEASE",
            MsgType::GetDomainPath => "GET_DOMAIN_PATH",
            MsgType::Write => "WRITE",
            MsgType::Mkdir => "MKDIR",
            MsgType::Rm => "RM",
            MsgType::SetPerms => "SET_PERMS",
            MsgType::WatchEvent => "WATCH_EVENT",
            MsgType::Error => "ERROR",
            MsgType::IsDomainIntroduced => "IS_DOMAIN_INTRODUCED",
            MsgType::Resume => "RESUME",
            MsgType::SetTarget => "SET_TARGET",
            MsgType::ResetWatches => "RESET_WATCHES",
            MsgType::DirectoryPart => "DIRECTORY_PART",
            MsgType::GetFeature => "GET_FEATURE",
            MsgType::SetFeature => "SET_FEATURE",
            MsgType::GetQuota => "GET_QUOTA",
            MsgType::SetQuota => "SET_QUOTA",
        }
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
