//! iWARP over kernel TCP for the software device: connection setup (MPA request/reply) and the
//! data path (DDP/RDMAP in MPA FPDUs) between this backend and another host — a vrdma backend
//! or any iWARP stack (Linux siw is the reference peer). The wire codec is the `iwarp-proto`
//! crate.
//!
//! The two halves meet at [`Established`]: connection setup ends with a TCP stream in MPA Full
//! Operation and the parameters both ends agreed on; the data path runs a QP over it.

pub(crate) mod cm;

use std::net::{SocketAddr, TcpStream};

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
}
