//! The backend side of the xenbus handshake (docs/split-driver.md): per-device and per-channel
//! state machines, written against xenstore-proto's [`XenbusStore`] so they run against the
//! embedded store in tests (mirage-net-xen's CONFIGURATION idea).
//!
//! - [`XenbusBackend`] owns every device record. The daemon calls it when a watch fires
//!   ([`XenbusBackend::scan`], [`XenbusBackend::on_backend_path`],
//!   [`XenbusBackend::scan_frontend`], [`XenbusBackend::on_release_domain`]), when a channel
//!   fails ([`XenbusBackend::channel_fault`]) and on shutdown. Every call reads XenStore anew
//!   and converges: a watch event only means "look again".
//! - Live channels are opaque [`ChannelLink`]s made by a [`ChannelOpener`] (the control
//!   service in the daemon, a fake in tests). Closing a link reclaims everything it held
//!   (perhaps just after `close` returns: it never waits long on a guest).
//!
//! Modules, each importing only the ones before it: `paths` (XenStore paths and read/write
//! helpers), `channel` (the per-channel handshake of one device, `DeviceChannels`), `backend`
//! (device records and the device-level state machine, which calls `DeviceChannels`).

mod backend;
mod channel;
pub(crate) mod paths;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use backend::{DeviceInfo, StatsSnapshot, StatsSource, XenbusBackend};
pub use paths::{
    backend_root, device_backend_path, device_frontend_path, device_stats_path, stats_root,
};

pub use shared_ring::abi::xenstore::XenbusState;

use crate::device::ChannelMode;
use crate::resources::Account;

/// A guest device: frontend domain and device id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub domid: u32,
    pub devid: u32,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.domid, self.devid)
    }
}

/// What a frontend asked for when its channel reached Initialised, after validation.
#[derive(Debug, Clone)]
pub struct ChannelRequest {
    pub device: DeviceId,
    /// The channel number (`channel/<n>`).
    pub channel: u32,
    /// Grant of the control ring page.
    pub ring_ref: u32,
    /// The frontend's unbound port for us.
    pub event_channel: u32,
    pub version: u32,
    /// The frontend process, for logs.
    pub pid: Option<u32>,
    pub mode: ChannelMode,
    /// The device's resource account (the channel itself is already charged to it).
    pub account: Arc<Account>,
}

/// Why a channel is being closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The frontend asked (state Closing / Closed, or removed its node).
    Frontend,
    /// The process behind the channel died (alive byte cleared).
    ProcessDied,
    /// The frontend broke the protocol; the sentence says how.
    ProtocolError(String),
    /// The toolstack detached the device.
    Detached,
    /// The guest domain is gone.
    DomainGone,
    /// The backend is stopping.
    Shutdown,
}

impl CloseReason {
    /// Whether the frontend should be told its device is lost (event ring `DeviceLost`).
    pub fn device_lost(&self) -> bool {
        matches!(self, CloseReason::Detached | CloseReason::Shutdown)
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::Frontend => f.write_str("closed by the frontend"),
            CloseReason::ProcessDied => f.write_str("the frontend process died"),
            CloseReason::ProtocolError(why) => write!(f, "protocol error: {why}"),
            CloseReason::Detached => f.write_str("device detached"),
            CloseReason::DomainGone => f.write_str("domain released"),
            CloseReason::Shutdown => f.write_str("backend stopped"),
        }
    }
}

/// A live channel. Closing it releases everything the channel held (QPs flushed, MRs
/// unmapped, pages revoked), exactly once. `close` returns within a bounded time whatever the
/// guest does (it runs on the control-plane thread that serves every guest): a channel still
/// busy with a guest request finishes releasing on its own thread after `close` returned.
pub trait ChannelLink: Send {
    fn close(self: Box<Self>, reason: &CloseReason);
}

/// Makes live channels: maps the ring, binds the event channel, starts the control service.
pub trait ChannelOpener: Send {
    /// Opens the channel, or says why not in a sentence a human can act on (it becomes the
    /// channel's `error` node).
    fn open(&mut self, request: ChannelRequest) -> Result<Box<dyn ChannelLink>, String>;
}

/// A problem a channel reports to the daemon after it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelFault {
    /// The process died (alive byte cleared by unmap-notify).
    Died,
    /// A protocol error (e.g. the ring's producer index overflowed); the channel must close.
    Protocol(String),
}
