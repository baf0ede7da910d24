//! The device's asynchronous events, forwarded to the guests: what each `ibv_event_type`
//! becomes on the event ring (docs/protocol.md, "Event ring"). Pure (tested without a
//! device); `device.rs` reads the events (`Context::next_async_event`, a thread on the
//! non-blocking async fd) and applies the actions.

use shared_ring::abi::event::EventKind;

use super::abi::*;
use super::{AsyncElement, AsyncEvent};

/// What to do with one event of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Post `kind` with `detail` for QP `qpn` to its channel (if a guest owns it); with
    /// `fail`, move the QP to Error first (the HCA QP too: its WQEs flush, and the relay
    /// flushes the guest's).
    Qp {
        qpn: u32,
        kind: EventKind,
        detail: u64,
        fail: bool,
    },
    /// The HCA CQ with kernel handle `handle` is in error (an overrun: completions are
    /// lost): the guest's CQ gets `CqOverrun`, the QPs that complete into it fail
    /// (`QpFatal`).
    Cq { handle: u32 },
    /// Every channel gets `kind` with `detail` (port and device events); with `fail`, every
    /// QP fails first.
    All {
        kind: EventKind,
        detail: u64,
        fail: bool,
    },
    /// Nothing a guest is told (logged).
    Ignore,
}

/// The action for `ev` on a device whose port (the one the guests use) is `port`.
///
/// - `QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`: the QP failed — `QpFatal` (detail: the
///   `ibv_event_type`, 1, 2 or 3), the QP in Error with flushes.
/// - `COMM_EST`, `QP_LAST_WQE_REACHED`, `PATH_MIG`, `PATH_MIG_ERR`: the kinds of the same
///   name, detail 0; the QP's state is the HCA's business (an RTR QP that receives moves
///   on by itself).
/// - `CQ_ERR`: [`Action::Cq`].
/// - `PORT_ACTIVE`, `PORT_ERR` of our port: `PortActive`, `PortError` (detail: the port)
///   to every channel. Other ports, and LID, P_Key, SM, client-reregister and GID changes,
///   are ignored (a GID change does not change the address the backend published).
/// - `DEVICE_FATAL`: `DeviceLost` to every channel, every QP in Error.
/// - `SQ_DRAINED` (vrdma has no SQD), SRQ and WQ events (it creates none), unknown types:
///   ignored.
pub(crate) fn action(ev: &AsyncEvent, port: u8) -> Action {
    let qp = |kind, detail, fail| match ev.element {
        AsyncElement::Qp(qpn) => Action::Qp {
            qpn,
            kind,
            detail,
            fail,
        },
        _ => Action::Ignore,
    };
    let ours = matches!(ev.element, AsyncElement::Port(p) if p == i32::from(port));
    match ev.kind {
        IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR => {
            qp(EventKind::QpFatal, u64::from(ev.kind), true)
        }
        IBV_EVENT_COMM_EST => qp(EventKind::QpCommEstablished, 0, false),
        IBV_EVENT_QP_LAST_WQE_REACHED => qp(EventKind::QpLastWqeReached, 0, false),
        IBV_EVENT_PATH_MIG => qp(EventKind::QpPathMigrated, 0, false),
        IBV_EVENT_PATH_MIG_ERR => qp(EventKind::QpPathMigrationError, 0, false),
        IBV_EVENT_CQ_ERR => match ev.element {
            AsyncElement::Cq(handle) => Action::Cq { handle },
            _ => Action::Ignore,
        },
        IBV_EVENT_PORT_ACTIVE if ours => Action::All {
            kind: EventKind::PortActive,
            detail: u64::from(port),
            fail: false,
        },
        IBV_EVENT_PORT_ERR if ours => Action::All {
            kind: EventKind::PortError,
            detail: u64::from(port),
            fail: false,
        },
        IBV_EVENT_DEVICE_FATAL => Action::All {
            kind: EventKind::DeviceLost,
            detail: 0,
            fail: true,
        },
        _ => Action::Ignore,
    }
}

/// The event type's name, as `ibv_event_type_str` gives it.
pub(crate) fn name(kind: u32) -> &'static str {
    match kind {
        IBV_EVENT_CQ_ERR => "CQ error",
        IBV_EVENT_QP_FATAL => "local work queue catastrophic error",
        IBV_EVENT_QP_REQ_ERR => "invalid request local work queue error",
        IBV_EVENT_QP_ACCESS_ERR => "local access violation work queue error",
        IBV_EVENT_COMM_EST => "communication established",
        IBV_EVENT_SQ_DRAINED => "send queue drained",
        IBV_EVENT_PATH_MIG => "path migrated",
        IBV_EVENT_PATH_MIG_ERR => "path migration request error",
        IBV_EVENT_DEVICE_FATAL => "local catastrophic error",
        IBV_EVENT_PORT_ACTIVE => "port active",
        IBV_EVENT_PORT_ERR => "port error",
        IBV_EVENT_LID_CHANGE => "LID change",
        IBV_EVENT_PKEY_CHANGE => "P_Key change",
        IBV_EVENT_SM_CHANGE => "SM change",
        IBV_EVENT_SRQ_ERR => "SRQ catastrophic error",
        IBV_EVENT_SRQ_LIMIT_REACHED => "SRQ limit reached",
        IBV_EVENT_QP_LAST_WQE_REACHED => "last WQE reached",
        IBV_EVENT_CLIENT_REREGISTER => "client reregistration",
        IBV_EVENT_GID_CHANGE => "GID table change",
        IBV_EVENT_WQ_FATAL => "WQ fatal",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: u32, element: AsyncElement) -> AsyncEvent {
        AsyncEvent { kind, element }
    }

    #[test]
    fn qp_events_go_to_the_qp_and_fatal_ones_fail_it() {
        for (k, detail) in [
            (IBV_EVENT_QP_FATAL, 1),
            (IBV_EVENT_QP_REQ_ERR, 2),
            (IBV_EVENT_QP_ACCESS_ERR, 3),
        ] {
            assert_eq!(
                action(&ev(k, AsyncElement::Qp(0x11)), 1),
                Action::Qp {
                    qpn: 0x11,
                    kind: EventKind::QpFatal,
                    detail,
                    fail: true
                }
            );
        }
        for (k, kind) in [
            (IBV_EVENT_COMM_EST, EventKind::QpCommEstablished),
            (IBV_EVENT_QP_LAST_WQE_REACHED, EventKind::QpLastWqeReached),
            (IBV_EVENT_PATH_MIG, EventKind::QpPathMigrated),
            (IBV_EVENT_PATH_MIG_ERR, EventKind::QpPathMigrationError),
        ] {
            assert_eq!(
                action(&ev(k, AsyncElement::Qp(7)), 1),
                Action::Qp {
                    qpn: 7,
                    kind,
                    detail: 0,
                    fail: false
                }
            );
        }
        // A QP event without its QP (a null element) is nobody's.
        assert_eq!(
            action(&ev(IBV_EVENT_QP_FATAL, AsyncElement::Other), 1),
            Action::Ignore
        );
        assert_eq!(
            action(&ev(IBV_EVENT_SQ_DRAINED, AsyncElement::Qp(7)), 1),
            Action::Ignore
        );
    }

    #[test]
    fn cq_port_and_device_events() {
        assert_eq!(
            action(&ev(IBV_EVENT_CQ_ERR, AsyncElement::Cq(5)), 1),
            Action::Cq { handle: 5 }
        );
        assert_eq!(
            action(&ev(IBV_EVENT_PORT_ERR, AsyncElement::Port(1)), 1),
            Action::All {
                kind: EventKind::PortError,
                detail: 1,
                fail: false
            }
        );
        assert_eq!(
            action(&ev(IBV_EVENT_PORT_ACTIVE, AsyncElement::Port(2)), 2),
            Action::All {
                kind: EventKind::PortActive,
                detail: 2,
                fail: false
            }
        );
        // Another port's events, and changes of LID, GID, SM: not the guests' business.
        assert_eq!(
            action(&ev(IBV_EVENT_PORT_ERR, AsyncElement::Port(2)), 1),
            Action::Ignore
        );
        for k in [
            IBV_EVENT_LID_CHANGE,
            IBV_EVENT_GID_CHANGE,
            IBV_EVENT_SM_CHANGE,
            IBV_EVENT_PKEY_CHANGE,
            IBV_EVENT_CLIENT_REREGISTER,
        ] {
            assert_eq!(action(&ev(k, AsyncElement::Port(1)), 1), Action::Ignore);
        }
        assert_eq!(
            action(&ev(IBV_EVENT_DEVICE_FATAL, AsyncElement::Device), 1),
            Action::All {
                kind: EventKind::DeviceLost,
                detail: 0,
                fail: true
            }
        );
        assert_eq!(action(&ev(99, AsyncElement::Other), 1), Action::Ignore);
    }
}
