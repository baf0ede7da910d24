//! The device context: one channel to the vrdma backend, and the mode posts and polls use.

use std::sync::Arc;
use std::time::Duration;

use shared_ring::abi::control::{ChannelStats, DeviceAttrs, Reply, Request, Status};
use xen_platform::{DomId, Platform};
use xenstore_proto::client::XenbusStore;

use crate::channel::{Channel, ChannelConfig};
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use crate::signal::Signal;
use crate::AsyncEvent;

/// One entry of the device port's GID table ([`Context::query_gids`]): the GID and its type
/// (`GID_TYPE_IB`, `GID_TYPE_ROCE_V1`, `GID_TYPE_ROCE_V2` of the control ABI).
pub type GidEntry = ([u8; 16], u32);

/// Environment variable choosing the data-path mode: `bypass` (default) or `mediated`.
pub const MODE_ENV: &str = "VRDMA_MODE";

/// How posts and polls reach the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Posts write WQEs into granted queue pages and ring the doorbell page; polls read CQEs
    /// from granted CQ pages. No system call, no backend round trip.
    #[default]
    Bypass,
    /// Every post and poll is a control-ring request to the backend (the baseline).
    Mediated,
}

impl Mode {
    /// The mode named by [`MODE_ENV`], if it is set.
    pub fn from_env() -> Result<Option<Mode>> {
        match std::env::var(MODE_ENV) {
            Err(_) => Ok(None),
            Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
                "" | "bypass" => Ok(Some(Mode::Bypass)),
                "mediated" => Ok(Some(Mode::Mediated)),
                other => Err(Error::InvalidArgument(format!(
                    "{MODE_ENV}={other:?}: expected `bypass` or `mediated`"
                ))),
            },
        }
    }
}

pub(crate) struct CtxInner {
    /// The channel's CM page, once a connection-management call needed it (declared before
    /// `chan`: unmapped before the channel closes).
    pub cm: crate::cm::CmPageCell,
    pub chan: Channel,
    pub mode: Mode,
    pub mr_cache_pages: usize,
}

/// An open vrdma device: one channel to the backend. Cheap to clone; every object made from
/// it keeps the channel open, and the channel closes politely when the last one is dropped.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<CtxInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("domid", &self.inner.chan.domid)
            .field("devid", &self.inner.chan.devid)
            .field("channel", &self.inner.chan.index)
            .field("mode", &self.inner.mode)
            .finish()
    }
}

/// Options for opening a [`Context`].
pub struct ContextBuilder {
    devid: u32,
    mode: Option<Mode>,
    timeout: Duration,
    close_timeout: Duration,
    mr_cache_pages: usize,
    store: Option<Arc<dyn XenbusStore>>,
    platform: Option<Platform>,
}

impl Default for ContextBuilder {
    fn default() -> Self {
        ContextBuilder {
            devid: 0,
            mode: None,
            timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(5),
            mr_cache_pages: 4096,
            store: None,
            platform: None,
        }
    }
}

impl ContextBuilder {
    /// The device id (`.../device/vrdma/<devid>`; default 0).
    pub fn devid(mut self, devid: u32) -> Self {
        self.devid = devid;
        self
    }
    /// The data-path mode (default: [`MODE_ENV`], else bypass).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }
    /// How long to wait for the backend (handshake steps, control answers; default 10 s).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// How long closing waits for the backend's Closed (default 5 s).
    pub fn close_timeout(mut self, t: Duration) -> Self {
        self.close_timeout = t;
        self
    }
    /// Pages of freed memory regions kept registered for reuse, per protection domain
    /// (default 4096 = 16 MiB; 0 disables the cache).
    pub fn mr_cache_pages(mut self, pages: usize) -> Self {
        self.mr_cache_pages = pages;
        self
    }
    /// The XenStore connection (default: the platform's, [`Platform::xenstore`]).
    pub fn store(mut self, store: Arc<dyn XenbusStore>) -> Self {
        self.store = Some(store);
        self
    }
    /// The platform (default: [`Platform::detect`]).
    pub fn platform(mut self, platform: Platform) -> Self {
        self.platform = Some(platform);
        self
    }

    /// Opens the device: XenStore handshake, channel, control ring, granted pages.
    pub fn open(self) -> Result<Context> {
        let mode = match self.mode {
            Some(m) => m,
            None => Mode::from_env()?.unwrap_or_default(),
        };
        let platform = match self.platform {
            Some(p) => p,
            None => Platform::detect()?,
        };
        let store: Arc<dyn XenbusStore> = match self.store {
            Some(s) => s,
            None => Arc::new(platform.xenstore()?),
        };
        let chan = Channel::open(
            store,
            platform,
            &ChannelConfig {
                devid: self.devid,
                mode,
                timeout: self.timeout,
                close_timeout: self.close_timeout,
            },
        )?;
        Ok(Context {
            inner: Arc::new(CtxInner {
                cm: Default::default(),
                chan,
                mode,
                mr_cache_pages: self.mr_cache_pages,
            }),
        })
    }
}

impl Context {
    /// Opens device 0 with the defaults (platform detected, XenStore from the environment,
    /// mode from [`MODE_ENV`]).
    pub fn open() -> Result<Context> {
        ContextBuilder::default().open()
    }

    /// Options for opening a device.
    pub fn builder() -> ContextBuilder {
        ContextBuilder::default()
    }

    /// The data-path mode.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }
    /// This domain.
    pub fn domid(&self) -> DomId {
        self.inner.chan.domid
    }
    /// The backend's domain.
    pub fn backend_domid(&self) -> DomId {
        self.inner.chan.backend
    }
    /// The device id.
    pub fn devid(&self) -> u32 {
        self.inner.chan.devid
    }
    /// This channel's number under the device's `channel/` directory.
    pub fn channel(&self) -> u32 {
        self.inner.chan.index
    }

    /// Device limits.
    pub fn query_device(&self) -> Result<DeviceAttrs> {
        self.inner.chan.query_device()
    }

    /// The device port's GID table (`QueryGid`): (GID, type: `GID_TYPE_IB`, `_ROCE_V1`,
    /// `_ROCE_V2`), the backend's own GID first. `Ok(None)` when the backend has no table of
    /// its own (the software device, or a backend older than the op): the guest then takes
    /// the backend's address as its one GID.
    pub fn query_gids(&self) -> Result<Option<Vec<GidEntry>>> {
        let mut out = Vec::new();
        let mut count = 1;
        let mut index = 0;
        while index < count {
            match self.inner.chan.call(Request::QueryGid { port: 1, index }) {
                Ok(Reply::Gid {
                    gid,
                    gid_type,
                    count: n,
                }) => {
                    count = n.min(shared_ring::abi::control::MAX_GIDS);
                    out.push((gid, gid_type));
                }
                Ok(r) => return Err(Error::protocol(format!("QueryGid answered with {r:?}"))),
                Err(Error::Backend {
                    status: Status::NotSupported | Status::BadRequest,
                    ..
                }) if index == 0 => return Ok(None),
                Err(e) => return Err(e),
            }
            index += 1;
        }
        Ok((!out.is_empty()).then_some(out))
    }

    /// The backend's counters for this channel.
    pub fn stats(&self) -> Result<ChannelStats> {
        match self.inner.chan.call(Request::Stats)? {
            Reply::Stats(s) => Ok(s),
            r => Err(Error::protocol(format!("Stats answered with {r:?}"))),
        }
    }

    /// Event-channel notifications this process has sent on the channel (control requests
    /// that needed one, and kicks of a sleeping engine). Posting to a busy engine adds none.
    pub fn notifications_sent(&self) -> u64 {
        self.inner.chan.hub.notifications()
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        ProtectionDomain::alloc(self.inner.clone())
    }

    /// A completion queue with room for at least `min_cqe` completions.
    pub fn create_cq(&self, min_cqe: u32) -> Result<CompletionQueue> {
        CompletionQueue::create(self.inner.clone(), min_cqe)
    }

    /// The backend's address (XenStore `address`): where peers on other hosts connect to
    /// this device's listeners. `None` when the backend publishes none (intra-host only).
    pub fn backend_addr(&self) -> Option<std::net::IpAddr> {
        crate::cm::ip_of(self.inner.chan.backend_addr)
    }

    /// Asynchronous events the backend reported since the last call (no system call).
    /// Connection-management calls that wait (`Listener::get_request`,
    /// `QueuePair::connect_to`, `ConnRequest::accept`, `QueuePair::wait_disconnected`) take
    /// the events they wait for; the others stay here.
    pub fn async_events(&self) -> Result<Vec<AsyncEvent>> {
        self.inner.chan.take_events()
    }

    /// The pending asynchronous events `pred` picks; the others stay for other callers (the
    /// connection-management calls wait for theirs: a watcher of its own events uses this
    /// rather than [`Context::async_events`]).
    pub fn async_events_where(
        &self,
        pred: impl Fn(&AsyncEvent) -> bool,
    ) -> Result<Vec<AsyncEvent>> {
        self.inner.chan.take_events_where(&pred)
    }

    /// Waits up to `timeout` for an asynchronous event `pred` picks, and takes it; `None` when
    /// none came in time.
    pub fn wait_async_event(
        &self,
        pred: impl Fn(&AsyncEvent) -> bool,
        timeout: Duration,
    ) -> Result<Option<AsyncEvent>> {
        self.inner
            .chan
            .wait_event(&pred, Some(std::time::Instant::now() + timeout))
    }

    /// The platform the channel runs on (grants, for callers that bring their own pages:
    /// [`ProtectionDomain::reg_grants`]).
    pub fn platform(&self) -> &Platform {
        &self.inner.chan.platform
    }

    /// The backend's XenStore `address` as 16 bytes (IPv4 as `::ffff:a.b.c.d`), all zero when
    /// it publishes none (the form [`QpEndpoint::addr`](crate::QpEndpoint) uses).
    pub fn backend_addr_raw(&self) -> [u8; 16] {
        self.inner.chan.backend_addr
    }

    /// Waits up to `timeout` for an event-channel notification from the backend (a completion
    /// on an armed CQ, an asynchronous event, a control answer); true if one came. Pending
    /// asynchronous events are then collected for [`Context::async_events`]. For callers
    /// that watch several CQs with [`CompletionQueue::arm`] and [`CompletionQueue::ready`].
    pub fn wait_notification(&self, timeout: Duration) -> Result<bool> {
        let chan = &self.inner.chan;
        let epoch = chan.hub.epoch();
        let got = chan
            .hub
            .wait_after(epoch, Some(std::time::Instant::now() + timeout))?;
        chan.notice_backend();
        chan.pump_events()?;
        chan.check_lost()?;
        Ok(got)
    }

    /// Whether the channel is known to be dead (checks XenStore: a system call).
    pub fn is_lost(&self) -> bool {
        self.inner.chan.notice_backend();
        if !self.inner.chan.is_lost() {
            self.inner.chan.probe_backend();
        }
        self.inner.chan.is_lost()
    }
}
