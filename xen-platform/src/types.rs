//! Identifiers shared by every platform: domain ids, grant references, event-channel ports.

use std::fmt;

/// Size of a Xen page, the granularity of grants (`XEN_PAGE_SIZE`).
pub const PAGE_SIZE: usize = 4096;

/// A Xen domain id (`domid_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomId(pub u16);

impl DomId {
    /// The control domain.
    pub const DOM0: DomId = DomId(0);
    /// `DOMID_SELF`, as Xen spells "this domain" in hypercalls.
    pub const SELF: DomId = DomId(0x7ff0);
    /// Highest id of a real domain; ids above are Xen's special ids (`DOMID_FIRST_RESERVED`).
    pub const MAX_NORMAL: DomId = DomId(0x7fef);

    /// True for a normal domain id (not one of Xen's reserved ids).
    pub fn is_normal(self) -> bool {
        self <= Self::MAX_NORMAL
    }
}

impl fmt::Display for DomId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A grant reference (`grant_ref_t`): names one granted page in the granting domain's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GrantRef(pub u32);

impl fmt::Display for GrantRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An event-channel port (`evtchn_port_t`), local to the domain that bound it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EvtchnPort(pub u32);

impl fmt::Display for EvtchnPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What the peer may do with granted pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The peer may map the pages read-only only.
    ReadOnly,
    /// The peer may map the pages read-write.
    ReadWrite,
}

impl Access {
    /// True for [`Access::ReadWrite`].
    pub fn is_writable(self) -> bool {
        matches!(self, Access::ReadWrite)
    }
}

/// What to do when the other side of a grant goes away (Linux `UNMAP_NOTIFY_*`).
///
/// For shared pages (gntalloc side) the actions run when the sharer releases the pages or its
/// process dies; for a foreign mapping (gntdev side) when the mapper unmaps or dies. Clearing a
/// byte lets the peer notice by polling the page; the event wakes a peer that waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnmapNotify {
    /// Byte offset (from the start of the region) to set to zero.
    pub clear_byte: Option<usize>,
    /// Local event-channel port to notify (must stay bound until the notification fires).
    pub event: Option<EvtchnPort>,
}

impl UnmapNotify {
    /// Linux's `action` bit for clearing a byte.
    pub const CLEAR_BYTE: u32 = 0x1;
    /// Linux's `action` bit for sending an event.
    pub const SEND_EVENT: u32 = 0x2;

    /// The `action` bit set as the ioctls (and the simulator protocol) carry it.
    pub fn action_bits(&self) -> u32 {
        let mut bits = 0;
        if self.clear_byte.is_some() {
            bits |= Self::CLEAR_BYTE;
        }
        if self.event.is_some() {
            bits |= Self::SEND_EVENT;
        }
        bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_bits_follow_linux() {
        assert_eq!(UnmapNotify::default().action_bits(), 0);
        let n = UnmapNotify {
            clear_byte: Some(3),
            event: Some(EvtchnPort(5)),
        };
        assert_eq!(n.action_bits(), 3);
        let n = UnmapNotify {
            clear_byte: None,
            event: Some(EvtchnPort(5)),
        };
        assert_eq!(n.action_bits(), 2);
    }

    #[test]
    fn reserved_domids() {
        assert!(DomId(0).is_normal());
        assert!(DomId(0x7fef).is_normal());
        assert!(!DomId::SELF.is_normal());
    }
}
