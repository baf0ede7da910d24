//! XenStore key names of the vrdma device class (`docs/split-driver.md`): the device nodes
//! and the channel records, and the xenbus states their `state` nodes hold, spelled once for
//! the backend, the frontend and the toolstack.
//!
//! ```text
//! /local/domain/B/backend/vrdma/D/<devid>/   DeviceKey::{Frontend, FrontendId, Online, State,
//!                                             Versions, Kind, Max*, ...}
//!     channel/<n>/                           ChannelKey::{State, Nonce, Error}
//! /local/domain/D/device/vrdma/<devid>/      DeviceKey::{Backend, BackendId, State}
//!     channel/<n>/                           ChannelKey::{State, RingRef, EventChannel,
//!                                             Version, Pid, Nonce, Mode}
//! ```

use core::fmt;

/// Xenbus states (`io/xenbus.h`): the value of every `state` node, device or channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum XenbusState {
    Unknown = 0,
    Initialising = 1,
    InitWait = 2,
    Initialised = 3,
    Connected = 4,
    Closing = 5,
    Closed = 6,
    Reconfiguring = 7,
    Reconfigured = 8,
}

impl XenbusState {
    /// Parses a `state` node's value; anything else is `None`.
    pub fn parse(value: &[u8]) -> Option<XenbusState> {
        let text = core::str::from_utf8(value).ok()?;
        Some(match text.trim().parse::<u32>().ok()? {
            0 => XenbusState::Unknown,
            1 => XenbusState::Initialising,
            2 => XenbusState::InitWait,
            3 => XenbusState::Initialised,
            4 => XenbusState::Connected,
            5 => XenbusState::Closing,
            6 => XenbusState::Closed,
            7 => XenbusState::Reconfiguring,
            8 => XenbusState::Reconfigured,
            _ => return None,
        })
    }

    /// The node value (`"4"`).
    pub fn value(self) -> String {
        (self as u32).to_string()
    }
}

impl fmt::Display for XenbusState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}({})", self, *self as u32)
    }
}

/// The directory of a device node that holds its channels (`<device>/channel/<n>`).
pub const CHANNEL_DIR: &str = "channel";

/// `<device_path>/channel/<n>`: the node of channel `n` of a device, on either side.
pub fn channel_path(device_path: &str, n: u32) -> String {
    format!("{device_path}/{CHANNEL_DIR}/{n}")
}

/// A key of a channel node (`<device>/channel/<n>/<key>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChannelKey {
    /// The xenbus state of this side's channel node (both sides).
    State,
    /// Grant reference of the control-ring page (frontend).
    RingRef,
    /// The frontend's unbound event channel port for the backend (frontend).
    EventChannel,
    /// The protocol version the frontend speaks (frontend).
    Version,
    /// The frontend process, for logs (frontend, optional).
    Pid,
    /// The channel instance's nonce (frontend; echoed by the backend with every state).
    Nonce,
    /// [`MODE_BYPASS`] (the default) or [`MODE_MEDIATED`] (frontend, optional).
    Mode,
    /// Why the backend closed or refused the channel, a sentence (backend).
    Error,
}

impl ChannelKey {
    /// Every channel key.
    pub const ALL: [ChannelKey; 8] = [
        ChannelKey::State,
        ChannelKey::RingRef,
        ChannelKey::EventChannel,
        ChannelKey::Version,
        ChannelKey::Pid,
        ChannelKey::Nonce,
        ChannelKey::Mode,
        ChannelKey::Error,
    ];

    /// The key's name in XenStore.
    pub const fn as_str(self) -> &'static str {
        match self {
            ChannelKey::State => "state",
            ChannelKey::RingRef => "ring-ref",
            ChannelKey::EventChannel => "event-channel",
            ChannelKey::Version => "version",
            ChannelKey::Pid => "pid",
            ChannelKey::Nonce => "nonce",
            ChannelKey::Mode => "mode",
            ChannelKey::Error => "error",
        }
    }

    /// `<chan_path>/<key>`.
    pub fn path(self, chan_path: &str) -> String {
        format!("{chan_path}/{}", self.as_str())
    }
}

impl fmt::Display for ChannelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// [`ChannelKey::Mode`]: every post and poll through the shared queues (the default).
pub const MODE_BYPASS: &str = "bypass";
/// [`ChannelKey::Mode`]: every post and poll over the control ring.
pub const MODE_MEDIATED: &str = "mediated";

/// A key of a device node (`.../backend/vrdma/<D>/<devid>/<key>` or
/// `.../device/vrdma/<devid>/<key>`). The quota keys (`max-channels`, ...) are the backend's
/// resource names and live with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKey {
    /// The xenbus state of this side's device node (both sides).
    State,
    /// The frontend node's path (backend node, toolstack).
    Frontend,
    /// The frontend domain (backend node, toolstack).
    FrontendId,
    /// `1` while the device is attached (backend node, toolstack).
    Online,
    /// The backend node's path (frontend node, toolstack).
    Backend,
    /// The backend domain (frontend node, toolstack).
    BackendId,
    /// Protocol versions the backend speaks, space separated (backend).
    Versions,
    /// Device kind, e.g. `soft-iwarp` (backend).
    Kind,
    /// Device limit: work requests per queue (backend).
    MaxQpWr,
    /// Device limit: entries per CQ (backend).
    MaxCqe,
    /// Device limit: scatter/gather entries per work request (backend).
    MaxSge,
    /// Device limit: inline bytes per work request (backend).
    MaxInline,
    /// Device limit: bytes per memory region (backend).
    MaxMrSize,
    /// The backend's network address, IPv6 or IPv4 text (backend node, optional).
    Address,
}

impl DeviceKey {
    /// Every device key.
    pub const ALL: [DeviceKey; 14] = [
        DeviceKey::State,
        DeviceKey::Frontend,
        DeviceKey::FrontendId,
        DeviceKey::Online,
        DeviceKey::Backend,
        DeviceKey::BackendId,
        DeviceKey::Versions,
        DeviceKey::Kind,
        DeviceKey::MaxQpWr,
        DeviceKey::MaxCqe,
        DeviceKey::MaxSge,
        DeviceKey::MaxInline,
        DeviceKey::MaxMrSize,
        DeviceKey::Address,
    ];

    /// The key's name in XenStore.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeviceKey::State => "state",
            DeviceKey::Frontend => "frontend",
            DeviceKey::FrontendId => "frontend-id",
            DeviceKey::Online => "online",
            DeviceKey::Backend => "backend",
            DeviceKey::BackendId => "backend-id",
            DeviceKey::Versions => "versions",
            DeviceKey::Kind => "kind",
            DeviceKey::MaxQpWr => "max-qp-wr",
            DeviceKey::MaxCqe => "max-cqe",
            DeviceKey::MaxSge => "max-sge",
            DeviceKey::MaxInline => "max-inline",
            DeviceKey::MaxMrSize => "max-mr-size",
            DeviceKey::Address => "address",
        }
    }

    /// `<device_path>/<key>`.
    pub fn path(self, device_path: &str) -> String {
        format!("{device_path}/{}", self.as_str())
    }
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the wire contract of docs/split-driver.md: spelled out here once more,
    /// so a rename on one side cannot pass unnoticed.
    #[test]
    fn key_names_are_the_documented_ones() {
        let channel: Vec<&str> = ChannelKey::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            channel,
            [
                "state",
                "ring-ref",
                "event-channel",
                "version",
                "pid",
                "nonce",
                "mode",
                "error"
            ]
        );
        let device: Vec<&str> = DeviceKey::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            device,
            [
                "state",
                "frontend",
                "frontend-id",
                "online",
                "backend",
                "backend-id",
                "versions",
                "kind",
                "max-qp-wr",
                "max-cqe",
                "max-sge",
                "max-inline",
                "max-mr-size",
                "address"
            ]
        );
        assert_eq!((MODE_BYPASS, MODE_MEDIATED), ("bypass", "mediated"));
    }

    #[test]
    fn xenbus_states_are_io_xenbus_h_numbers() {
        for (n, st) in [
            (0, XenbusState::Unknown),
            (1, XenbusState::Initialising),
            (2, XenbusState::InitWait),
            (3, XenbusState::Initialised),
            (4, XenbusState::Connected),
            (5, XenbusState::Closing),
            (6, XenbusState::Closed),
            (7, XenbusState::Reconfiguring),
            (8, XenbusState::Reconfigured),
        ] {
            assert_eq!(st.value(), n.to_string());
            assert_eq!(XenbusState::parse(st.value().as_bytes()), Some(st));
        }
        assert_eq!(XenbusState::parse(b" 4\n"), Some(XenbusState::Connected));
        for bad in [&b""[..], b"9", b"-1", b"four", b"\xff"] {
            assert_eq!(XenbusState::parse(bad), None, "{bad:?}");
        }
        assert_eq!(XenbusState::Closed.to_string(), "Closed(6)");
    }

    #[test]
    fn paths_join_with_slashes() {
        let dev = "/local/domain/5/device/vrdma/0";
        assert_eq!(
            channel_path(dev, 3),
            "/local/domain/5/device/vrdma/0/channel/3"
        );
        assert_eq!(
            ChannelKey::RingRef.path(&channel_path(dev, 3)),
            "/local/domain/5/device/vrdma/0/channel/3/ring-ref"
        );
        assert_eq!(
            DeviceKey::BackendId.path(dev),
            "/local/domain/5/device/vrdma/0/backend-id"
        );
        assert_eq!(ChannelKey::EventChannel.to_string(), "event-channel");
    }
}
