//! Glue between `xen_platform` handles and the device's inputs.
//!
//! The device takes every piece of shared memory as a [`shared_ring::SharedRegion`] that owns
//! its mapping: `xen_platform`'s `SharedPages::into_region` and `ForeignMapping::into_region`
//! make them. This module lets an event channel be the channel's [`Notifier`].

use xen_platform::EventChannel;

use super::Notifier;

impl Notifier for EventChannel {
    fn notify(&self) {
        if let Err(e) = EventChannel::notify(self) {
            tracing::warn!(port = %self.local_port(), "event channel notify failed: {e}");
        }
    }
}
