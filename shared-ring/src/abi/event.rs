//! Asynchronous events: 32-byte slots of the event ring (backend → frontend).
//!
//! ```text
//!  0  kind u16     2 reserved u16 (0)
//!  4  handle u32   (the QP, CQ or listener the event is about; 0 for device events)
//!  8  detail u64   (kind-specific: an error code, a peer's QP number, a connection request id)
//! 16  reserved [u8; 16] (0)
//! ```

use super::{check_len, check_zero, AbiError};

/// Size of an event slot.
pub const EVENT_LEN: usize = 32;

/// Byte offsets of the event fields.
pub mod field {
    pub const KIND: usize = 0;
    pub const RESERVED0: usize = 2;
    pub const HANDLE: usize = 4;
    pub const DETAIL: usize = 8;
    pub const RESERVED1: usize = 16;
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum EventKind {
    /// A QP moved to the Error state; its WQEs are flushed.
    QpFatal = 1,
    /// A CQ overflowed: completions were lost; the CQ is in error.
    CqOverrun = 2,
    /// The device (backend) is going away; all QPs are dead.
    DeviceLost = 3,
    /// A connecting QP reached RTS.
    QpEstablished = 4,
    /// A listener has a connection request waiting for `Accept`.
    ConnectRequest = 5,
    /// The peer closed the connection of a QP.
    QpDisconnected = 6,
    /// A connect was refused: the peer rejected it (its private data is in the QP's CM info),
    /// or nothing listens on the port.
    ConnectRejected = 7,
    /// A connect failed without an answer: timeout, TCP refused or reset during setup, or a
    /// protocol error in the peer's reply.
    ConnectUnreachable = 8,
    /// The device saw the first packet on a QP in RTR (ibverbs' `IBV_EVENT_COMM_EST`).
    QpCommEstablished = 9,
    /// A QP in Error has no more receive WQEs to flush (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached = 10,
    /// A QP migrated to its alternate path (`IBV_EVENT_PATH_MIG`).
    QpPathMigrated = 11,
    /// A QP's path migration failed (`IBV_EVENT_PATH_MIG_ERR`).
    QpPathMigrationError = 12,
    /// The device's port became ACTIVE (`IBV_EVENT_PORT_ACTIVE`; handle 0, detail the port).
    PortActive = 13,
    /// The device's port left ACTIVE (`IBV_EVENT_PORT_ERR`; handle 0, detail the port): QPs
    /// keep their state, their requests fail (retry exceeded) until it comes back.
    PortError = 14,
}

impl EventKind {
    pub fn from_u16(v: u16) -> Result<Self, AbiError> {
        Ok(match v {
            1 => Self::QpFatal,
            2 => Self::CqOverrun,
            3 => Self::DeviceLost,
            4 => Self::QpEstablished,
            5 => Self::ConnectRequest,
            6 => Self::QpDisconnected,
            7 => Self::ConnectRejected,
            8 => Self::ConnectUnreachable,
            9 => Self::QpCommEstablished,
            10 => Self::QpLastWqeReached,
            11 => Self::QpPathMigrated,
            12 => Self::QpPathMigrationError,
            13 => Self::PortActive,
            14 => Self::PortError,
            _ => {
                return Err(AbiError::Unknown {
                    what: "event kind",
                    value: v.into(),
                })
            }
        })
    }
}

/// Zero-copy view of an event slot.
#[derive(Debug, Clone)]
pub struct Event<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Event<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Self, AbiError> {
        check_len(buffer.as_ref().len(), EVENT_LEN)?;
        Ok(Self { buffer })
    }
    super::view_getters! {
        kind: u16 @ field::KIND;
        handle: u32 @ field::HANDLE;
        detail: u64 @ field::DETAIL;
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Event<T> {
    super::view_setters! {
        set_kind: u16 @ field::KIND;
        set_handle: u32 @ field::HANDLE;
        set_detail: u64 @ field::DETAIL;
    }
}

/// The meaning of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventRepr {
    pub kind: EventKind,
    pub handle: u32,
    pub detail: u64,
}

impl EventRepr {
    pub fn parse<T: AsRef<[u8]>>(ev: &Event<T>) -> Result<Self, AbiError> {
        let b = ev.buffer.as_ref();
        check_len(b.len(), EVENT_LEN)?;
        check_zero(b, field::RESERVED0..field::HANDLE, "event.reserved0")?;
        check_zero(b, field::RESERVED1..EVENT_LEN, "event.reserved1")?;
        Ok(Self {
            kind: EventKind::from_u16(ev.kind())?,
            handle: ev.handle(),
            detail: ev.detail(),
        })
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, ev: &mut Event<T>) {
        ev.buffer.as_mut()[..EVENT_LEN].fill(0);
        ev.set_kind(self.kind as u16);
        ev.set_handle(self.handle);
        ev.set_detail(self.detail);
    }
    pub fn to_bytes(&self) -> [u8; EVENT_LEN] {
        let mut b = [0u8; EVENT_LEN];
        self.emit(&mut Event::new_unchecked(&mut b[..]));
        b
    }
    pub fn from_bytes(b: &[u8; EVENT_LEN]) -> Result<Self, AbiError> {
        Self::parse(&Event::new_unchecked(&b[..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_bytes_round_trip() {
        let mut b = [0u8; 32];
        b[0] = 2;
        b[4] = 7;
        b[8] = 1;
        let e = EventRepr::from_bytes(&b).unwrap();
        assert_eq!(
            e,
            EventRepr {
                kind: EventKind::CqOverrun,
                handle: 7,
                detail: 1
            }
        );
        assert_eq!(e.to_bytes(), b);
        // The device's events (verbs device): 9..=14; 15 is unknown.
        let mut p = [0u8; 32];
        p[0] = 14;
        p[8] = 1;
        assert_eq!(
            EventRepr::from_bytes(&p).unwrap(),
            EventRepr {
                kind: EventKind::PortError,
                handle: 0,
                detail: 1
            }
        );
        p[0] = 9;
        assert_eq!(
            EventRepr::from_bytes(&p).unwrap().kind,
            EventKind::QpCommEstablished
        );
        p[0] = 15;
        assert!(matches!(
            EventRepr::from_bytes(&p),
            Err(AbiError::Unknown {
                what: "event kind",
                value: 15
            })
        ));
        b[20] = 1;
        assert_eq!(
            EventRepr::from_bytes(&b).err(),
            Some(AbiError::Reserved {
                field: "event.reserved1"
            })
        );
    }
}
