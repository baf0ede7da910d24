//! iWARP over kernel TCP for the software device: connection setup (MPA request/reply) and the
//! data path (DDP/RDMAP in MPA FPDUs) between this backend and another host — a vrdma backend
//! or any iWARP stack (Linux siw is the reference peer). The wire codec is the `iwarp-proto`
//! crate.
//!
//! The two halves meet at [`Established`]: connection setup ends with a TCP stream in MPA Full
//! Operation and the parameters both ends agreed on; the data path runs a QP over it.

#[cfg(test)]
mod attach_tests;
pub(crate) mod cm;
#[cfg(test)]
mod cm_tests;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

pub(crate) mod qp;
mod rx;
mod tx;

pub use qp::DEFAULT_PEER_PROBE;
pub(crate) use qp::{has_work, process, RemoteQp};

pub use cm::CrcPolicy;

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
    /// Idle time before a silent peer is probed (`[cm] peer-probe-s`; see
    /// [`DEFAULT_PEER_PROBE`]).
    pub peer_probe: std::time::Duration,
}

/// The sockets of an engine's remote QPs, by their `mio` token (the QP number): readiness
/// events become flags on the QP, which the engine's passes act on.
#[derive(Default)]
pub(crate) struct Sockets {
    map: HashMap<mio::Token, Arc<RemoteQp>>,
    /// Events for sockets registered since the map was built (the engine rebuilds it when
    /// it sees the change): kept for the next map, since an edge-triggered event never
    /// comes back.
    orphans: Vec<(mio::Token, qp::Readiness)>,
    /// The engine just dispatched the events of its blocking poll: the next
    /// [`Sockets::poll_now`] has nothing new to find and skips its `epoll_wait` (one system
    /// call less per wake-up; anything that arrives meanwhile is found by the pass after, or
    /// by the next sleep's poll, which returns at once for it).
    fresh: bool,
}

/// Most orphan events kept between two rebuilds.
const MAX_ORPHANS: usize = 4096;

impl Sockets {
    /// Rebuilds the map from the engine's QPs; orphan events go to their QPs now.
    pub(crate) fn rebuild(&mut self, qps: &[Arc<super::objects::Qp>]) {
        self.map = qps
            .iter()
            .filter_map(|q| q.remote.get().map(|r| (r.token, r.clone())))
            .collect();
        for (t, what) in self.orphans.drain(..) {
            if let Some(r) = self.map.get(&t) {
                r.mark(what);
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Marks the QPs whose sockets `events` (of the engine's blocking poll) reported.
    pub(crate) fn dispatch(&mut self, events: &mio::Events) {
        self.fresh = true;
        self.mark(events);
    }

    fn mark(&mut self, events: &mio::Events) {
        for ev in events.iter() {
            let what = qp::Readiness::of(ev);
            match self.map.get(&ev.token()) {
                Some(r) => r.mark(what),
                None if ev.token() != mio::Token(0)
                    && !super::waker::is_kick_token(ev.token())
                    && self.orphans.len() < MAX_ORPHANS =>
                {
                    self.orphans.push((ev.token(), what));
                }
                None => {}
            }
        }
    }

    /// Looks for readiness without blocking (an engine that is spinning); `true` if it
    /// polled (then `events` holds what it found, for the engine's other sources too).
    pub(crate) fn poll_now(&mut self, poll: &mut mio::Poll, events: &mut mio::Events) -> bool {
        if std::mem::take(&mut self.fresh) {
            return false;
        }
        if poll.poll(events, Some(std::time::Duration::ZERO)).is_ok() {
            self.mark(events);
            return true;
        }
        false
    }
}
