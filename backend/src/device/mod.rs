//! The RDMA device of the backend: the [`Device`] trait the daemon drives, and the software
//! device model ([`SoftDevice`]) that plays an RDMA NIC where the host has none.
//!
//! # Contract with the daemon
//!
//! The daemon owns XenStore, the control ring, quotas, page allocation and the channel's event
//! channel; the device owns everything the data path touches. Every piece of shared memory
//! reaches the device as a [`shared_ring::SharedRegion`] (a bounds-checked window whose
//! `keep_alive` owns the grant mapping or the granted pages), so the device never learns which
//! platform it runs on and tests run on plain memory ([`SharedRegion::alloc`]). `xen_platform`
//! handles become regions with their `into_region()`.
//!
//! * Channel: [`Device::open_channel`] with the channel's doorbell page and event-ring page
//!   (backend-allocated, granted to the guest; the device initialises both) and a
//!   [`Notifier`] that sends the channel's event. The guest notifies the event channel for
//!   control requests and to kick a sleeping engine (only when the doorbell page's sleep word
//!   says the engine sleeps). With a [`ChannelSetup::kick_source`] the software device's engine
//!   watches it itself ([`Device::takes_kicks`]) and hands the daemon, through
//!   [`KickSource::fired`], what was not a kick; otherwise the daemon watches it, serves the
//!   control ring *and* calls [`Device::kick`], which wakes a sleeping engine.
//!   [`Device::close_channel`] frees everything the channel held.
//! * Handles ([`PdId`], [`MrHandle`], [`CqId`], [`QpNum`]) are unique on this device and never 0;
//!   every call checks that the handle belongs to the calling channel, so the daemon may hand
//!   them to the guest as they are. QP numbers are the RC endpoint addresses of this backend.
//!   Handles are not sequential (a keyed permutation of a counter, so one domain's numbers say
//!   nothing about another's), and a live handle is never handed out again, also after the
//!   counter wraps.
//! * Doorbell slots are chosen by the daemon (it returns them to the guest) and checked here:
//!   in range, not in use by another queue of the channel.
//! * Async events (QP fatal, CQ overrun, QP established/disconnected) are written by the device
//!   into the channel's event ring; the daemon adds its own with [`Device::post_event`] (the
//!   ring has a single producer, the device).
//! * Mediated mode ([`ChannelMode::Mediated`]) is a per-channel switch: the device ignores the
//!   guest's producer indexes and CQ words and uses private ones that [`Device::post_mediated`],
//!   [`Device::poll_cq_mediated`] and [`Device::arm_cq`] drive.
//!
//! # RC semantics of the software device
//!
//! * Connection model: intra-host only. [`Device::connect_qp`] pairs two RC QPs of this backend
//!   (any channels, any domains); when both ends have named each other, both go to RTS and each
//!   channel gets a `QpEstablished` event. Until then the connection does not exist: naming a
//!   QP records the name on the caller's QP only (which waits in Rtr), and whether the named QP
//!   exists, belongs to another domain or named a third QP, the answer is the same `Ok` and
//!   wait — QP numbers are no oracle. Destroying a *connected* QP (or closing its channel)
//!   moves its peer to Error (flush) and sends the peer `QpDisconnected`; destroying a QP that
//!   only named another touches nothing but itself.
//! * Per-QP ordering: WQEs execute and complete in SQ order; receives are consumed in RQ order.
//! * No RNR: a SEND (or WRITE with immediate) that finds no posted RECV at the peer waits, with
//!   the sending QP blocked in order, until a RECV is posted — what an RC QP with infinite RNR
//!   retry does. Frontends must use the kick protocol for RQ posts too.
//! * SGE `offset` is relative to the start of the region its `lkey` names; `remote_addr` is an
//!   address in the target region's `iova` space. lkeys must belong to the QP's channel and PD;
//!   rkeys to the *peer* QP's channel and PD (an rkey of another domain is legal, for the region
//!   it names only). Access: gather needs nothing, scatter needs `LOCAL_WRITE`, RDMA WRITE
//!   `REMOTE_WRITE`, RDMA READ `REMOTE_READ` on the target region.
//! * Errors complete the failing WQE with an error status and move the QP to Error; every
//!   outstanding and later WQE of both its queues completes with `WrFlushError` (errors and
//!   flushes always produce a CQE, signaled or not). Statuses:
//!   garbage WQE → `BadWqe`; bad lkey / local bounds / missing local access →
//!   `LocalProtectionError`; bad rkey / remote bounds / missing remote access →
//!   `RemoteAccessError` (the responder QP is not affected); message longer than the RECV →
//!   `LocalLengthError` at the responder and `RemoteInvalidRequest` at the requester (both go
//!   to Error); garbage RECV at the responder → `BadWqe` there and `RemoteOperationError` at the
//!   requester (both to Error); peer QP gone or in Error → `RetryExceeded`.
//! * A CQ that overflows (or whose consumer index is garbage) is in error for good: a
//!   `CqOverrun` event is sent once, completions for it are dropped, and the QP whose completion
//!   was lost goes to Error (`QpFatal`).
//! * Completions to an armed CQ notify the channel once per arm (errors count as solicited).
//!
//! # Modules
//!
//! Each module uses only the ones before it: `mr` (memory keys and copies) and `stats`
//! (counters), `waker` (wakes an engine thread), `peers` (an engine's cache of peer QPs),
//! `objects` (channels, CQs, QPs),
//! `exec` (executes WQEs on the objects), `engine` (the threads that run `exec`), `soft`
//! (the [`Device`] implementation that owns the engines and the tables).

mod engine;
mod exec;
pub mod iwarp;
mod mr;
mod objects;
mod peers;
pub mod platform;
mod soft;
mod stats;
pub mod testkit;
pub mod verbs;
mod waker;

#[cfg(test)]
mod tests;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use shared_ring::abi::control::{QpState, Status};
use shared_ring::abi::cqe::CqeRepr;
use shared_ring::abi::event::EventRepr;
use shared_ring::SharedRegion;

pub use iwarp::CrcPolicy;
pub use shared_ring::abi::control::{access, DeviceAttrs};
pub use soft::{default_attrs, CmConfig, EngineDiag, PeerFilter, SoftDevice, MAX_DOORBELL_PAGES};
pub use xen_platform::DomId;

/// A channel of this device (one guest process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChannelId(pub u32);
/// A protection domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PdId(pub u32);
/// A registered memory region (for deregistration; the data path uses the keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MrHandle(pub u32);
/// A completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CqId(pub u32);
/// A queue pair: its number is its handle and its RC endpoint address on this backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QpNum(pub u32);

/// A listening endpoint of the connection manager ([`Device::cm_listen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListenerId(pub u32);
/// A connection request waiting at a listener for [`Device::cm_accept`] or
/// [`Device::cm_reject`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnRequestId(pub u32);

/// An RC peer named by address vector (RoCE and InfiniBand: what `ibv_rc_pingpong` and
/// perftest without `-R` exchange out of band), for [`Device::connect_qp_av`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAv {
    /// The peer port's GID (RoCE: the IPv6 or IPv4-mapped address; all zero on InfiniBand
    /// without a global route).
    pub gid: [u8; 16],
    /// The peer port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The peer QP's number.
    pub qpn: u32,
    /// The peer's first send PSN (24 bits): this QP's expected receive PSN.
    pub psn: u32,
    /// The path MTU, ibverbs' `enum ibv_mtu` (1: 256 … 5: 4096); 0: the device's choice.
    pub mtu: u32,
}

/// This device's own address for address vectors ([`Device::local_av`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalAv {
    pub gid: [u8; 16],
    pub lid: u16,
    pub port: u8,
}

/// Most private data bytes a connect, accept or reject carries (rdma_cm's `private_data_len`
/// is a u8).
pub const MAX_PRIVATE_DATA: usize = 255;

/// What the connection manager knows about a connection (request).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmInfo {
    /// This end's address.
    pub local: SocketAddr,
    /// The peer's address.
    pub peer: SocketAddr,
    /// The peer's private data: its request's (at a listener), or its reply's or reject's (at
    /// the connecting QP). Empty before the peer answered.
    pub private_data: Vec<u8>,
    /// RDMA Reads the peer accepts outstanding (its IRD; the negotiated one once established).
    pub ird: u16,
    /// RDMA Reads the peer may have outstanding (its ORD; the negotiated one once established).
    pub ord: u16,
}

/// Sends the channel's event (to the frontend). The daemon implements it with the channel's
/// event channel ([`platform`] has an implementation for `xen_platform::EventChannel`).
pub trait Notifier: Send + Sync {
    /// Notify the frontend: a completion on an armed CQ, or an async event.
    fn notify(&self);
}

impl<F: Fn() + Send + Sync> Notifier for F {
    fn notify(&self) {
        self()
    }
}

/// A channel's event channel as an engine waits on it ([`ChannelSetup::kick_source`]): the
/// file becomes readable when the guest notifies. Every event reported must reach
/// [`KickSource::fired`]: on Xen a delivered port stays masked until it is read and unmasked,
/// so an event nobody consumes silences every later notification of that channel.
pub trait KickSource: std::os::fd::AsFd + Send + Sync {
    /// The file became readable: consume the pending events (re-enabling their delivery) and
    /// pass on to the daemon whatever was not a kick for the engine (control requests, the
    /// frontend's death). Called on the engine thread: must not block.
    fn fired(&self);
}

/// How the frontend posts and polls on a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChannelMode {
    /// The bypass: the frontend writes WQEs and doorbell indexes and polls CQEs itself.
    #[default]
    Bypass,
    /// Every post and poll goes over the control ring ([`Device::post_mediated`],
    /// [`Device::poll_cq_mediated`], [`Device::arm_cq`]); the guest's doorbell indexes are
    /// ignored.
    Mediated,
}

/// What a channel needs.
pub struct ChannelSetup {
    /// The guest domain.
    pub domid: DomId,
    /// The doorbell page(s): backend-allocated, granted to the guest; initialised here
    /// (zeroed, header written with [`shared_ring::PROTOCOL_VERSION`]).
    pub doorbell: SharedRegion,
    /// The event-ring page ([`shared_ring::event_ring::EVENT_RING_LEN`] bytes), zeroed here.
    pub event_ring: SharedRegion,
    /// Sends the channel's event.
    pub notifier: Arc<dyn Notifier>,
    pub mode: ChannelMode,
    /// The guest's event channel, for the engine to wait on, or `None`. A device that takes
    /// it ([`Device::takes_kicks`] says so once the channel is open) watches it itself, so
    /// a guest's kick wakes the engine directly instead of through the daemon's channel
    /// thread; the engine then consumes the events ([`KickSource::fired`]), and the daemon
    /// stops watching the file and leaves it to the source to pass on what is not a kick.
    pub kick_source: Option<Arc<dyn KickSource>>,
}

impl std::fmt::Debug for ChannelSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelSetup")
            .field("domid", &self.domid)
            .field("doorbell", &self.doorbell)
            .field("event_ring", &self.event_ring)
            .field("mode", &self.mode)
            .field("kick_source", &self.kick_source.is_some())
            .finish_non_exhaustive()
    }
}

/// A memory region to register: the guest's granted pages, mapped by the daemon.
#[derive(Debug, Clone)]
pub struct MrSetup {
    pub pd: PdId,
    /// The mapped pages (whole pages; the region starts `first_page_offset` bytes in).
    pub pages: SharedRegion,
    /// Whether `pages` is mapped writable. Registering with `LOCAL_WRITE` or `REMOTE_WRITE`
    /// needs it (the device never writes a read-only mapping, which would fault).
    pub writable: bool,
    /// Offset of the region's first byte in the first page.
    pub first_page_offset: u32,
    /// Length of the region in bytes.
    pub length: u64,
    /// The address the application (and remote peers) use for the region's first byte.
    pub iova: u64,
    /// [`access`] bits.
    pub access: u32,
}

/// Keys of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    pub handle: MrHandle,
    pub lkey: u32,
    pub rkey: u32,
}

/// A completion queue to create.
#[derive(Debug, Clone)]
pub struct CqSetup {
    /// The CQ ring: `2^cqe_log2 * 32` bytes or more, zeroed, backend-allocated (granted to the
    /// guest read-only in bypass mode).
    pub ring: SharedRegion,
    pub cqe_log2: u8,
    /// Doorbell slot for the CQ's arm word and consumer index.
    pub doorbell_slot: u32,
}

/// A queue pair to create (RC).
#[derive(Debug, Clone)]
pub struct QpSetup {
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    /// Send queue: `2^sq_log2 * 64` bytes or more, backend-allocated, granted to the guest.
    pub sq: SharedRegion,
    /// Receive queue: `2^rq_log2 * 64` bytes or more.
    pub rq: SharedRegion,
    pub sq_log2: u8,
    pub rq_log2: u8,
    /// Doorbell slots of the SQ and RQ indexes.
    pub sq_slot: u32,
    pub rq_slot: u32,
    /// Every successful send WQE gets a CQE, whatever its `SIGNALED` flag.
    pub sq_sig_all: bool,
}

/// Which queue of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    Sq,
    Rq,
}

/// Counters of a channel or a domain.
///
/// `ops`, `bytes`, `errors`, `notifications`, `events` count work (cumulative; for a domain they
/// survive its channels); the other fields are resources held now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeviceStats {
    /// Work requests executed (send and receive WQEs, successful or not, flushes excluded).
    pub ops: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Error completions (flushes excluded) and dropped completions.
    pub errors: u64,
    /// Notifications sent for armed CQs and events.
    pub notifications: u64,
    /// Async events written (or dropped because the event ring was full).
    pub events: u64,
    /// Payload bytes the backend copied through its own memory on the data path. The verbs
    /// device counts the inline data of the sends it relays (copied out of the guest's WQE);
    /// everything else the HCA moves between guest pages itself, so this stays 0 (zero-copy).
    /// The software device does not count here: it copies every byte it moves (`bytes`).
    pub copied_bytes: u64,
    pub channels: u64,
    pub pds: u64,
    pub mrs: u64,
    /// Bytes of registered memory.
    pub mr_bytes: u64,
    pub cqs: u64,
    pub qps: u64,
}

/// Counters of one QP, cumulative since it was created (they go with it).
///
/// They count what the channel's [`DeviceStats`] `ops`/`bytes`/`errors` count, split by QP: a
/// send WQE is counted at the QP that posted it, a RECV at the QP whose receive queue it was
/// consumed from, so the QPs of a channel add up to the channel's work counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpStats {
    pub qp: QpNum,
    /// The QP's state now.
    pub state: QpState,
    /// Work requests executed: send WQEs and RECVs consumed, successful or not (flushes
    /// excluded).
    pub ops: u64,
    /// Payload bytes moved by its successful work requests (sent, read, written or received).
    pub bytes: u64,
    /// Error completions of its work requests (flushes excluded).
    pub errors: u64,
    /// Of `ops`, the RECVs consumed.
    pub recvs: u64,
}

/// Engine configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Engine threads; each channel is served by one (channels are spread round-robin).
    pub threads: usize,
    /// How long an engine with nothing to do keeps polling before it arms the sleep words and
    /// sleeps.
    pub spin: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 1,
            spin: Duration::from_micros(200),
        }
    }
}

/// Errors of device calls (control path). Data-path errors are completions, never these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("no {what} {id} on this channel")]
    BadHandle { what: &'static str, id: u32 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0} is in use")]
    Busy(&'static str),
    #[error("device limit reached: {0}")]
    NoResources(&'static str),
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    #[error("the channel is not in mediated mode")]
    NotMediated,
    #[error("QP {0} cannot connect: {1}")]
    ConnectionRefused(u32, &'static str),
    #[error("the device is shutting down")]
    DeviceLost,
}

impl DeviceError {
    /// The control-ring status that reports this error.
    pub fn status(&self) -> Status {
        match self {
            Self::BadHandle { .. } => Status::BadHandle,
            Self::InvalidArgument(_) => Status::InvalidArgument,
            Self::Busy(_) => Status::Busy,
            Self::NoResources(_) => Status::NoResources,
            Self::NotSupported(_) | Self::NotMediated => Status::NotSupported,
            Self::ConnectionRefused(..) => Status::ConnectionRefused,
            Self::DeviceLost => Status::DeviceLost,
        }
    }
}

/// Result of device calls.
pub type DeviceResult<T> = Result<T, DeviceError>;

/// What `modify_qp` does with a QP in state `cur` asked to go to `new`: the state rules every
/// device shares (its own checks, e.g. "not while connecting", come after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QpTransition {
    /// To Error: fail the QP (its WQEs flush).
    ToError,
    /// Already there: nothing to do.
    Stay,
    /// Reset, Init or Rtr before the connection: record the state.
    Set,
}

pub(crate) fn qp_transition(cur: QpState, new: QpState) -> DeviceResult<QpTransition> {
    match new {
        QpState::Error => Ok(QpTransition::ToError),
        QpState::Sqd | QpState::Sqe => Err(DeviceError::NotSupported("SQD/SQE states")),
        _ if cur == new => Ok(QpTransition::Stay),
        _ if cur == QpState::Error => {
            Err(DeviceError::NotSupported("leaving Error (destroy the QP)"))
        }
        QpState::Rts => Err(DeviceError::InvalidArgument(
            "a QP reaches RTS by connect_qp".into(),
        )),
        _ if cur == QpState::Rts => Err(DeviceError::NotSupported("leaving RTS")),
        _ => Ok(QpTransition::Set),
    }
}

/// An RDMA device as the daemon sees it. All calls are cheap control-path operations except
/// where noted; they may be called from any thread.
pub trait Device: Send + Sync {
    /// Limits (published in XenStore and answered to `QueryDevice`).
    fn attrs(&self) -> DeviceAttrs;

    /// Opens a channel: initialises its doorbell page and event ring.
    fn open_channel(&self, setup: ChannelSetup) -> DeviceResult<ChannelId>;
    /// Closes a channel: stops serving it, destroys its QPs (peers go to Error), CQs, MRs and
    /// PDs, and drops its resource counters to zero. Unknown channels are ignored.
    fn close_channel(&self, ch: ChannelId);
    /// Adds a doorbell page to the channel (initialised here, like the first one) and returns
    /// the number of its first slot: slots are numbered across the channel's pages in the
    /// order they were added. At most [`soft::MAX_DOORBELL_PAGES`] pages per channel.
    fn add_doorbell_page(&self, ch: ChannelId, page: SharedRegion) -> DeviceResult<u32>;
    /// The channel's event channel fired: wake the engine if it sleeps (cheap if it does not).
    fn kick(&self, ch: ChannelId);
    /// Whether the engine of channel `ch` watches the channel's [`ChannelSetup::kick_source`]
    /// itself (then the daemon leaves the event channel to it).
    fn takes_kicks(&self, _ch: ChannelId) -> bool {
        false
    }
    /// Writes an async event into the channel's event ring and notifies. A full ring drops the
    /// event (counted); that is not an error.
    fn post_event(&self, ch: ChannelId, event: EventRepr) -> DeviceResult<()>;

    fn alloc_pd(&self, ch: ChannelId) -> DeviceResult<PdId>;
    /// `Busy` while an MR or QP uses the PD.
    fn dealloc_pd(&self, ch: ChannelId, pd: PdId) -> DeviceResult<()>;

    fn reg_mr(&self, ch: ChannelId, setup: MrSetup) -> DeviceResult<MrKeys>;
    /// Work already executing on the region finishes (the mapping stays alive until it does).
    fn dereg_mr(&self, ch: ChannelId, mr: MrHandle) -> DeviceResult<()>;

    fn create_cq(&self, ch: ChannelId, setup: CqSetup) -> DeviceResult<CqId>;
    /// `Busy` while a QP uses the CQ.
    fn destroy_cq(&self, ch: ChannelId, cq: CqId) -> DeviceResult<()>;

    /// Creates an RC QP in state Init.
    fn create_qp(&self, ch: ChannelId, setup: QpSetup) -> DeviceResult<QpNum>;
    /// Reset/Init/Rtr before connection are accepted as bookkeeping; Rts needs a connected peer
    /// (see [`Self::connect_qp`]); Error flushes. Leaving Error, Sqd and Sqe are not supported.
    fn modify_qp(&self, ch: ChannelId, qp: QpNum, state: QpState) -> DeviceResult<()>;
    /// The QP's current state.
    fn qp_state(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<QpState>;
    /// Destroys a QP (its peer goes to Error).
    fn destroy_qp(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()>;
    /// Pairs `qp` with QP `remote` of this backend (any channel or domain). Both ends call it
    /// with each other's number; the second call makes both RTS.
    fn connect_qp(&self, ch: ChannelId, qp: QpNum, remote: QpNum) -> DeviceResult<()>;

    /// This device's address for address vectors (`None`: the device connects QPs only by
    /// [`Self::connect_qp`] or the connection manager).
    fn local_av(&self) -> Option<LocalAv> {
        None
    }
    /// The GID table the guests see (`QueryGid`): (GID, `GID_TYPE_*` of the control ABI),
    /// at most [`shared_ring::abi::control::MAX_GIDS`] entries, [`Self::local_av`]'s GID
    /// first. Empty: the device has none of its own (the software device; the guest library
    /// then makes its one GID from the backend's address).
    fn gid_table(&self) -> Vec<([u8; 16], u32)> {
        Vec::new()
    }
    /// Whether the address vector `remote` names a QP of this device through the device's own
    /// port (another guest's QP on this backend, or the caller's own). Such a connect must be
    /// a pairing ([`Self::connect_qp`]: both ends name each other), never a one-sided RTR:
    /// otherwise a guest could aim its QP at another guest's. Devices without address
    /// vectors: false.
    fn av_names_own_qp(&self, remote: &RemoteAv) -> bool {
        let _ = remote;
        false
    }
    /// Connects `qp` (Init, not connecting) to the RC peer `remote` by address vector, as
    /// `ibv_modify_qp` does: the QP goes RTR at once; with `local_psn` (its first send PSN)
    /// on to RTS, and the channel gets `QpEstablished`. Repeating a step towards the same
    /// peer is no error. Whether the peer is there shows on the data path (retry exceeded).
    /// Devices without address vectors answer `NotSupported`.
    fn connect_qp_av(
        &self,
        ch: ChannelId,
        qp: QpNum,
        remote: RemoteAv,
        local_psn: Option<u32>,
    ) -> DeviceResult<()> {
        let _ = (ch, qp, remote, local_psn);
        Err(DeviceError::NotSupported("address vectors"))
    }

    /// Mediated mode: arms the CQ for one notification. If a completion is already waiting the
    /// notifier is called at once.
    fn arm_cq(&self, ch: ChannelId, cq: CqId, solicited_only: bool) -> DeviceResult<()>;
    /// Mediated mode: WQEs up to producer index `prod` are in the queue (the engine executes them
    /// asynchronously; a `prod` beyond the queue size puts the QP in Error).
    fn post_mediated(
        &self,
        ch: ChannelId,
        qp: QpNum,
        which: WorkQueue,
        prod: u32,
    ) -> DeviceResult<()>;
    /// Mediated mode: the next completion of the CQ, if any.
    fn poll_cq_mediated(&self, ch: ChannelId, cq: CqId) -> DeviceResult<Option<CqeRepr>>;

    /// Counters of a channel (all zero for an unknown or closed channel).
    fn stats(&self, ch: ChannelId) -> DeviceStats;
    /// Counters of a domain: cumulative work counters, resources of its open channels.
    fn domain_stats(&self, domid: DomId) -> DeviceStats;
    /// Counters of every live QP of a channel, by QP number (none for an unknown or closed
    /// channel). A destroyed QP is gone from the list.
    fn qp_stats(&self, ch: ChannelId) -> Vec<QpStats> {
        let _ = ch;
        Vec::new()
    }
    /// Counters of every live QP of a domain's open channels, by QP number.
    fn domain_qp_stats(&self, domid: DomId) -> Vec<QpStats> {
        let _ = domid;
        Vec::new()
    }

    // ---- Connection manager (rdma_cm semantics) ----
    //
    // Every call answers at once; results arrive as events on the channel's event ring:
    //
    // * `ConnectRequest{handle: listener, detail: request id}` at the listening channel: a peer
    //   (of this host or another) asks to connect; answer with `cm_accept` or `cm_reject`,
    //   read its address and private data with `cm_request_info`.
    // * `QpEstablished{handle: qp}` on both ends when the connection is up (the QP is in RTS).
    // * `ConnectRejected{handle: qp}` at the connecting QP when the peer rejected it (its
    //   reject private data in `cm_qp_info`), or nothing listens on the port (intra-host: no
    //   listener; remote: TCP refused the connection — what rdma_cm reports as REJECTED too),
    //   or the listener's backlog is full or its domain may not hear from this peer.
    // * `ConnectUnreachable{handle: qp}` when there is no answer: timeout, TCP reset or closed
    //   during the MPA exchange, a reply that is garbage or breaks the MPA policy (markers,
    //   not revision 2 enhanced, no CRC under `CrcPolicy::Require`), an abandoned connect
    //   (`cm_disconnect`), or a connection the data path could not take over (then also at
    //   an accepting QP).
    //
    // Private data is at most [`MAX_PRIVATE_DATA`] bytes each way. QP numbers are not
    // exchanged: the peer of a connection is its address.
    // * `QpDisconnected{handle: qp}` when an established connection ends (either side's
    //   `cm_disconnect`, the peer's QP destroyed, TCP closed).
    //
    // A QP that got `ConnectRejected` or `ConnectUnreachable` is in Error.

    /// The device's own addresses: a connect to one of them pairs QPs on this host (no TCP).
    fn local_addrs(&self) -> Vec<IpAddr> {
        Vec::new()
    }
    /// Listens on `addr` (one of [`Self::local_addrs`], or unspecified for all of them); port 0
    /// lets the device choose. A port is owned by one channel: `Busy` if another listener has
    /// it. `backlog` bounds the requests waiting for an answer (more are refused).
    fn cm_listen(&self, ch: ChannelId, addr: SocketAddr, backlog: u32) -> DeviceResult<ListenerId> {
        let _ = (ch, addr, backlog);
        Err(DeviceError::NotSupported("connection manager"))
    }
    /// The address a listener listens on (with the chosen port).
    fn cm_listener_addr(&self, ch: ChannelId, l: ListenerId) -> DeviceResult<SocketAddr> {
        let _ = (ch, l);
        Err(DeviceError::NotSupported("connection manager"))
    }
    /// Stops listening; requests waiting at the listener that the guest has not taken are
    /// rejected. The software device keeps those it took (asked their `cm_request_info`)
    /// until they are answered or the channel closes, as rdma_cm keeps a request id it
    /// handed to the program.
    fn cm_close_listener(&self, ch: ChannelId, l: ListenerId) -> DeviceResult<()> {
        let _ = (ch, l);
        Err(DeviceError::NotSupported("connection manager"))
    }
    /// Connects `qp` (in Init or Rtr, not yet connecting) to a listener at `peer` with
    /// `private_data` (at most [`MAX_PRIVATE_DATA`] bytes). The answer is an event. A peer
    /// the administrator did not allow for the channel's domain is `ConnectionRefused` at
    /// once.
    fn cm_connect(
        &self,
        ch: ChannelId,
        qp: QpNum,
        peer: SocketAddr,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        let _ = (ch, qp, peer, private_data);
        Err(DeviceError::NotSupported("connection manager"))
    }
    /// Accepts a connection request on `qp` (in Init or Rtr, not connecting) with the reply's
    /// `private_data`. `QpEstablished` follows on both ends (or `QpFatal`/`QpDisconnected` if
    /// the peer went away meanwhile).
    fn cm_accept(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        qp: QpNum,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        let _ = (ch, req, qp, private_data);
        Err(DeviceError::NotSupported("connection manager"))
    }
    /// Rejects a connection request with `private_data`; the requester gets `ConnectRejected`.
    fn cm_reject(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        let _ = (ch, req, private_data);
        Err(DeviceError::NotSupported("connection manager"))
    }
    /// Ends the connection of `qp` (or abandons its connect): the QP goes to Error (flush), and
    /// both ends get `QpDisconnected` (an abandoned connect: `ConnectUnreachable`).
    fn cm_disconnect(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
        let _ = (ch, qp);
        Err(DeviceError::NotSupported("connection manager"))
    }
    /// The requester's addresses, private data and IRD/ORD of a waiting request.
    fn cm_request_info(&self, ch: ChannelId, req: ConnRequestId) -> DeviceResult<CmInfo> {
        let _ = (ch, req);
        Err(DeviceError::NotSupported("connection manager"))
    }
    /// The connection of a QP that connected or accepted: addresses, and after `QpEstablished`
    /// or `ConnectRejected` the peer's reply or reject private data and the negotiated IRD/ORD.
    fn cm_qp_info(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<CmInfo> {
        let _ = (ch, qp);
        Err(DeviceError::NotSupported("connection manager"))
    }
}
