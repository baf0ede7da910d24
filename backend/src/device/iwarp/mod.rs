//! iWARP over kernel TCP for the software device: connection setup (MPA request/reply) and the
//! data path (DDP/RDMAP in MPA FPDUs) between this backend and another host — a vrdma backend
//! or any iWARP stack (Linux siw is the reference peer). The wire codec is the `iwarp-proto`
//! crate.
//!
//! The two halves meet at [`Established`]: connection setup ends with a TCP stream in MPA Full
//! Operation and the parameters both ends agreed on; the data path runs a QP over it.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

mod hdr;
pub(crate) mod qp;
mod rx;
mod tx;

pub(crate) use qp::{has_work, process, RemoteQp};

/// Which end of the connection this backend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sent the MPA request (the rdma_cm active side).
    Initiator,
    /// Answered it (the listening side).
    Responder,
}

/// The ready-to-receive message the initiator sends as its first FPDU (RFC 6581 §4), as the
/// enhanced MPA negotiation chose it; `None` when the peers did not negotiate one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rtr {
    None,
    /// A zero-length RDMA Write.
    Write,
    /// A zero-length RDMA Read Request.
    Read,
}

/// A TCP connection that finished MPA negotiation: from here on both ends send FPDUs.
#[derive(Debug)]
pub struct Established {
    pub stream: TcpStream,
    pub role: Role,
    /// Both ends put (and check) a CRC32c in every FPDU.
    pub crc: bool,
    /// RDMA Reads this end accepts outstanding from the peer (inbound, negotiated).
    pub ird: u16,
    /// RDMA Reads this end may have outstanding at the peer (outbound, negotiated).
    pub ord: u16,
    pub rtr: Rtr,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// The peer's private data (after the enhanced IRD/ORD word, if any).
    pub peer_private: Vec<u8>,
}

/// The sockets of an engine's remote QPs, by their `mio` token (the QP number): readiness
/// events become flags on the QP, which the engine's passes act on.
#[derive(Default)]
pub(crate) struct Sockets(HashMap<mio::Token, Arc<RemoteQp>>);

impl Sockets {
    /// The remote QPs among `qps`.
    pub(crate) fn of(qps: &[Arc<super::objects::Qp>]) -> Self {
        Sockets(
            qps.iter()
                .filter_map(|q| q.remote.get().map(|r| (r.token, r.clone())))
                .collect(),
        )
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Marks the QPs whose sockets `events` reported.
    pub(crate) fn dispatch(&self, events: &mio::Events) {
        for ev in events.iter() {
            if let Some(r) = self.0.get(&ev.token()) {
                r.note(ev);
            }
        }
    }

    /// Looks for readiness without blocking (an engine that is spinning).
    pub(crate) fn poll_now(&self, poll: &mut mio::Poll, events: &mut mio::Events) {
        if poll.poll(events, Some(std::time::Duration::ZERO)).is_ok() {
            self.dispatch(events);
        }
    }
}
