//! The platform facade: one set of calls for sharing pages, mapping grants and event channels,
//! whichever platform this process runs on. Code above this crate uses only these types.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use std::time::Duration;
use xenstore_proto::client::{AsyncClient, Client, DEFAULT_SOCKET_PATH, XENSTORED_PATH_ENV};

use crate::detect::{self, PlatformKind};
use crate::error::{Error, Result};
use crate::region::{Mapping, OwnsMapping, PageSpan};
use crate::sim::client::{SimConn, SimEvtchn, SimMapping, SimShare};
use crate::types::{Access, DomId, EvtchnPort, GrantRef, UnmapNotify, PAGE_SIZE};
use crate::xen::evtchn::XenEvtchn;
use crate::xen::gntalloc::{Gntalloc, XenShare};
use crate::xen::gntdev::{Gntdev, XenMapping};
use crate::xen::XENBUS_DEV;

/// Access to grants and event channels on this platform. Cheap to clone; `Send + Sync`.
#[derive(Debug, Clone)]
pub struct Platform {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    kind: PlatformKind,
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    Xen {
        // Opened on first use: a guest that only maps never needs gntalloc, and vice versa.
        gntalloc: OnceLock<Arc<Gntalloc>>,
        gntdev: OnceLock<Arc<Gntdev>>,
    },
    Sim(Arc<SimConn>),
}

impl Platform {
    /// Detect the platform (see [`detect::detect`]) and open it.
    pub fn detect() -> Result<Platform> {
        Platform::open(detect::detect()?)
    }

    /// Open a given platform. On the simulated host this connects to the domain's hypercall
    /// socket (failing clearly if the host or domain is not there); on Xen, devices are opened
    /// on first use.
    pub fn open(kind: PlatformKind) -> Result<Platform> {
        let backend = match &kind {
            PlatformKind::Xen { .. } => Backend::Xen {
                gntalloc: OnceLock::new(),
                gntdev: OnceLock::new(),
            },
            PlatformKind::Sim { dir, domid } => {
                Backend::Sim(Arc::new(SimConn::connect(dir, *domid)?))
            }
        };
        Ok(Platform {
            inner: Arc::new(Inner { kind, backend }),
        })
    }

    /// Which platform this is.
    pub fn kind(&self) -> &PlatformKind {
        &self.inner.kind
    }

    /// This domain's id, when the platform knows it without XenStore (the simulated host
    /// always does; on Xen the control domain is 0, a guest reads `domid` from XenStore).
    pub fn known_domid(&self) -> Option<DomId> {
        match (&self.inner.kind, &self.inner.backend) {
            (_, Backend::Sim(c)) => Some(c.domid()),
            (
                PlatformKind::Xen {
                    control_domain: true,
                },
                _,
            ) => Some(DomId::DOM0),
            _ => None,
        }
    }

    /// Allocate `count` zeroed pages and grant them to `to` with `access`. The pages are mapped
    /// read-write here; see [`SharedPages::region`] for how to touch them.
    pub fn share_pages(&self, to: DomId, count: usize, access: Access) -> Result<SharedPages> {
        if count == 0 {
            return Err(Error::InvalidArgument("cannot share 0 pages".into()));
        }
        let inner = match &self.inner.backend {
            Backend::Xen { gntalloc, .. } => {
                let dev = get_or_open(gntalloc, Gntalloc::open)?;
                SharedInner::Xen(dev.share(to, count, access)?)
            }
            Backend::Sim(c) => SharedInner::Sim(c.share(to, count, access)?),
        };
        Ok(SharedPages {
            inner,
            remote: to,
            access,
        })
    }

    /// Map grants `refs` of domain `from`, contiguously, with `access` (read-only maps succeed on
    /// read-only grants; read-write maps of them are refused).
    pub fn map_grants(
        &self,
        from: DomId,
        refs: &[GrantRef],
        access: Access,
    ) -> Result<ForeignMapping> {
        if refs.is_empty() {
            return Err(Error::InvalidArgument("no grant references to map".into()));
        }
        let inner = match &self.inner.backend {
            Backend::Xen { gntdev, .. } => {
                let dev = get_or_open(gntdev, Gntdev::open)?;
                MappingInner::Xen(dev.map(from, refs, access)?)
            }
            Backend::Sim(c) => MappingInner::Sim(c.map(from, refs, access)?),
        };
        Ok(ForeignMapping {
            inner,
            remote: from,
            refs: refs.to_vec(),
            access,
        })
    }

    /// The host limits on this domain's grants that can be read here (see
    /// [`crate::xen::limits`]: gntalloc's `limit` on Xen, the domain's grant limit on the
    /// simulated host).
    pub fn grant_limits(&self) -> crate::xen::limits::GrantLimits {
        let grant_pages = match &self.inner.backend {
            Backend::Xen { .. } => crate::xen::limits::gntalloc_limit(),
            Backend::Sim(c) => Some(crate::xen::limits::HostLimit {
                value: u64::from(c.max_grants()),
                knob: format!(
                    "the simulated domain {}'s grant limit (`vrdma-simhost serve --max-grants`)",
                    c.domid()
                ),
            }),
        };
        crate::xen::limits::GrantLimits { grant_pages }
    }

    /// Allocate an unbound event-channel port that `remote` may bind to.
    pub fn alloc_unbound(&self, remote: DomId) -> Result<EventChannel> {
        Ok(EventChannel {
            inner: match &self.inner.backend {
                Backend::Xen { .. } => EvtchnInner::Xen(XenEvtchn::alloc_unbound(remote)?),
                Backend::Sim(c) => EvtchnInner::Sim(c.alloc_unbound(remote)?),
            },
            remote,
        })
    }

    /// Bind to `remote`'s unbound port `remote_port` (which must be offered to this domain).
    pub fn bind_interdomain(&self, remote: DomId, remote_port: EvtchnPort) -> Result<EventChannel> {
        Ok(EventChannel {
            inner: match &self.inner.backend {
                Backend::Xen { .. } => {
                    EvtchnInner::Xen(XenEvtchn::bind_interdomain(remote, remote_port)?)
                }
                Backend::Sim(c) => EvtchnInner::Sim(c.bind_interdomain(remote, remote_port)?),
            },
            remote,
        })
    }
}

/// Where this domain's XenStore is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XenStoreEndpoint {
    /// A xenstored-style Unix socket (dom0's `/run/xenstored/socket`, `$XENSTORED_PATH`, or a
    /// simulated domain's socket, which carries that domain's identity).
    Socket(PathBuf),
    /// The xenbus device of a Xen guest (`/dev/xen/xenbus`).
    Xenbus(PathBuf),
}

impl std::fmt::Display for XenStoreEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XenStoreEndpoint::Socket(p) => write!(f, "socket {}", p.display()),
            XenStoreEndpoint::Xenbus(p) => write!(f, "device {}", p.display()),
        }
    }
}

/// The XenStore endpoint on real Xen: `$XENSTORED_PATH` if set, else the xenstored socket if
/// this is the control domain and the socket exists, else the xenbus device.
pub fn xen_xenstore_endpoint(
    xenstored_path: Option<std::ffi::OsString>,
    control_domain: bool,
    socket_exists: impl Fn(&Path) -> bool,
) -> XenStoreEndpoint {
    if let Some(p) = xenstored_path.filter(|p| !p.is_empty()) {
        return XenStoreEndpoint::Socket(p.into());
    }
    for s in [DEFAULT_SOCKET_PATH, "/var/run/xenstored/socket"] {
        if control_domain && socket_exists(Path::new(s)) {
            return XenStoreEndpoint::Socket(s.into());
        }
    }
    XenStoreEndpoint::Xenbus(XENBUS_DEV.into())
}

impl Platform {
    /// Where this domain's XenStore is.
    pub fn xenstore_endpoint(&self) -> XenStoreEndpoint {
        match &self.inner.kind {
            PlatformKind::Sim { dir, domid } => {
                XenStoreEndpoint::Socket(crate::sim::sock::xenstore_socket(dir, domid.0))
            }
            PlatformKind::Xen { control_domain } => {
                xen_xenstore_endpoint(std::env::var_os(XENSTORED_PATH_ENV), *control_domain, |p| {
                    p.exists()
                })
            }
        }
    }

    /// Connect to XenStore as this domain (blocking client; see xenstore-proto's docs).
    pub fn xenstore(&self) -> Result<Client> {
        let ep = self.xenstore_endpoint();
        let r = match &ep {
            XenStoreEndpoint::Socket(p) => Client::connect(p),
            XenStoreEndpoint::Xenbus(p) => Client::open_xenbus(p),
        };
        r.map_err(|source| Error::XenStore {
            what: format!("connecting to {ep}"),
            source,
        })
    }

    /// Connect to XenStore as this domain (tokio client; call inside a tokio runtime).
    pub async fn xenstore_async(&self) -> Result<AsyncClient> {
        let ep = self.xenstore_endpoint();
        let r = match &ep {
            XenStoreEndpoint::Socket(p) => AsyncClient::connect(p).await,
            XenStoreEndpoint::Xenbus(p) => AsyncClient::open_xenbus(p),
        };
        r.map_err(|source| Error::XenStore {
            what: format!("connecting to {ep}"),
            source,
        })
    }

    /// This domain's id: known directly on the simulated host and in dom0, otherwise read from
    /// XenStore (`domid`, relative to the domain's home, as xl writes it).
    pub fn domid(&self) -> Result<DomId> {
        if let Some(d) = self.known_domid() {
            return Ok(d);
        }
        let xs = self.xenstore()?;
        let text = xs.read_string("domid").map_err(|source| Error::XenStore {
            what: "reading domid".into(),
            source,
        })?;
        text.trim()
            .parse::<u16>()
            .map(DomId)
            .map_err(|_| Error::Protocol(format!("XenStore domid {text:?} is not a number")))
    }
}

fn get_or_open<T>(cell: &OnceLock<Arc<T>>, open: fn() -> Result<T>) -> Result<&Arc<T>> {
    if let Some(v) = cell.get() {
        return Ok(v);
    }
    let v = Arc::new(open()?);
    // A racing thread may have won; either device handle is as good.
    Ok(cell.get_or_init(|| v))
}

#[derive(Debug)]
enum SharedInner {
    Xen(XenShare),
    Sim(SimShare),
}

/// Pages this domain allocated and granted to another domain. Dropping it ends the grant (and
/// fires its unmap-notify); pages still mapped by the peer stay valid for the peer until it
/// unmaps them, as with gntalloc.
#[derive(Debug)]
pub struct SharedPages {
    inner: SharedInner,
    remote: DomId,
    access: Access,
}

impl OwnsMapping for SharedPages {
    fn mapping(&self) -> &Mapping {
        match &self.inner {
            SharedInner::Xen(s) => s.mapping(),
            SharedInner::Sim(s) => s.mapping(),
        }
    }
}

impl SharedPages {
    /// The grant references, one per page, in order: what the peer passes to
    /// [`Platform::map_grants`].
    pub fn grant_refs(&self) -> &[GrantRef] {
        match &self.inner {
            SharedInner::Xen(s) => s.grant_refs(),
            SharedInner::Sim(s) => s.grant_refs(),
        }
    }

    /// The pages as a [`shared_ring::SharedRegion`] (read-write for the sharer), which owns
    /// them: the grant ends when the region's last clone is dropped. See [`crate::region`].
    pub fn into_region(
        self,
    ) -> std::result::Result<shared_ring::SharedRegion, shared_ring::MemError> {
        crate::region::into_region(self)
    }

    /// Where the pages are mapped (read-write for the sharer). See [`crate::region`] for the
    /// access contract: no Rust references into them.
    pub fn span(&self) -> PageSpan<'_> {
        self.mapping().span()
    }

    /// Start of the pages (same as `span().as_ptr()`).
    pub fn as_ptr(&self) -> *mut u8 {
        self.mapping().as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mapping().len()
    }

    /// Never true (zero pages cannot be shared).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of pages.
    pub fn page_count(&self) -> usize {
        self.len() / PAGE_SIZE
    }

    /// The domain the pages are granted to.
    pub fn remote(&self) -> DomId {
        self.remote
    }

    /// What the peer may do with them.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Re-backs the caller's memory `[addr, addr+len())` with these pages, in place: copies its
    /// bytes into the pages, then moves the pages' mapping over those addresses (one
    /// `mremap`). Afterwards the process sees the same bytes at the same addresses, and the
    /// grantee sees them too. Undo with [`SharedPages::release_as_private_copy`].
    ///
    /// # Safety
    /// `addr` must be page-aligned and `[addr, addr+len())` mapped readable and writable,
    /// owned by the caller and not written during the call; the caller must not unmap or
    /// remap that range while these pages are there.
    pub unsafe fn adopt_range(&mut self, addr: *mut u8) -> Result<()> {
        // SAFETY: the caller's obligations are the mapping's.
        unsafe { self.mapping_mut().adopt_range(addr) }
    }

    /// Gives the addresses back as private memory holding the pages' current bytes (after
    /// [`SharedPages::adopt_range`]); dropping the handle then ends the grant without
    /// unmapping anything.
    ///
    /// # Safety
    /// The grantee must no longer write the pages.
    pub unsafe fn release_as_private_copy(&mut self) -> Result<()> {
        // SAFETY: the caller's obligation.
        unsafe { self.mapping_mut().release_as_private_copy() }
    }

    fn mapping_mut(&mut self) -> &mut Mapping {
        match &mut self.inner {
            SharedInner::Xen(s) => s.mapping_mut(),
            SharedInner::Sim(s) => s.mapping_mut(),
        }
    }

    /// When these pages are released (dropped, or the process dies), clear a byte of them and/or
    /// notify a local event channel, so the peer learns the sharer went away.
    pub fn set_unmap_notify(&self, n: UnmapNotify) -> Result<()> {
        check_notify(&n, self.len())?;
        match &self.inner {
            SharedInner::Xen(s) => s.set_unmap_notify(&n),
            SharedInner::Sim(s) => s.set_unmap_notify(&n),
        }
    }
}

fn check_notify(n: &UnmapNotify, len: usize) -> Result<()> {
    match n.clear_byte {
        Some(b) if b >= len => Err(Error::InvalidArgument(format!(
            "unmap-notify byte {b} is outside the {len}-byte region"
        ))),
        _ => Ok(()),
    }
}

#[derive(Debug)]
enum MappingInner {
    Xen(XenMapping),
    Sim(SimMapping),
}

/// Another domain's grants mapped into this process. Dropping it unmaps them (and fires its
/// unmap-notify).
#[derive(Debug)]
pub struct ForeignMapping {
    inner: MappingInner,
    remote: DomId,
    refs: Vec<GrantRef>,
    access: Access,
}

impl OwnsMapping for ForeignMapping {
    fn mapping(&self) -> &Mapping {
        match &self.inner {
            MappingInner::Xen(m) => m.mapping(),
            MappingInner::Sim(m) => m.mapping(),
        }
    }
}

impl ForeignMapping {
    /// The mapped pages as a [`shared_ring::SharedRegion`], which owns the mapping: the pages
    /// are unmapped when the region's last clone is dropped. A read-only mapping
    /// ([`Access::ReadOnly`]) gives a region the caller must only read (writes fault); check
    /// [`Self::access`] first. See [`crate::region`].
    pub fn into_region(
        self,
    ) -> std::result::Result<shared_ring::SharedRegion, shared_ring::MemError> {
        crate::region::into_region(self)
    }

    /// Where the pages are mapped; read-only if mapped so (writes fault). See
    /// [`crate::region`] for the access contract.
    pub fn span(&self) -> PageSpan<'_> {
        self.mapping().span()
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mapping().as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mapping().len()
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The granting domain.
    pub fn remote(&self) -> DomId {
        self.remote
    }

    /// The mapped references, in order.
    pub fn grant_refs(&self) -> &[GrantRef] {
        &self.refs
    }

    /// How it is mapped.
    pub fn access(&self) -> Access {
        self.access
    }

    /// When this mapping goes away (dropped, or the process dies), clear a byte of the pages
    /// and/or notify a local event channel, so the granting domain learns the mapper went away.
    pub fn set_unmap_notify(&self, n: UnmapNotify) -> Result<()> {
        check_notify(&n, self.len())?;
        if n.clear_byte.is_some() && !self.access.is_writable() {
            return Err(Error::InvalidArgument(
                "unmap-notify cannot clear a byte of a read-only mapping".into(),
            ));
        }
        match &self.inner {
            MappingInner::Xen(m) => m.set_unmap_notify(&n),
            MappingInner::Sim(m) => m.set_unmap_notify(&n),
        }
    }
}

#[derive(Debug)]
enum EvtchnInner {
    Xen(XenEvtchn),
    Sim(SimEvtchn),
}

/// One bound event channel with its own pollable descriptor (readable when an event is
/// pending), so it plugs into mio (`SourceFd`) or tokio (`AsyncFd`). Dropping it unbinds.
///
/// Events are level-less and may coalesce or be spurious: after a wakeup, call
/// [`EventChannel::consume`] and then look at the shared state for work, as Xen drivers do.
#[derive(Debug)]
pub struct EventChannel {
    inner: EvtchnInner,
    remote: DomId,
}

impl EventChannel {
    /// This end's port (publish it in XenStore for the peer).
    pub fn local_port(&self) -> EvtchnPort {
        match &self.inner {
            EvtchnInner::Xen(e) => e.port(),
            EvtchnInner::Sim(e) => e.port(),
        }
    }

    /// The peer domain.
    pub fn remote(&self) -> DomId {
        self.remote
    }

    /// Send an event to the peer.
    pub fn notify(&self) -> Result<()> {
        match &self.inner {
            EvtchnInner::Xen(e) => e.notify(),
            EvtchnInner::Sim(e) => e.notify(),
        }
    }

    /// Consume pending events without blocking (and re-enable delivery); true if any were.
    pub fn consume(&self) -> Result<bool> {
        match &self.inner {
            EvtchnInner::Xen(e) => e.try_consume(),
            EvtchnInner::Sim(e) => e.try_consume(),
        }
    }

    /// Block until an event arrives, then consume it.
    pub fn wait(&self) -> Result<()> {
        while !self.wait_timeout(None)? {}
        Ok(())
    }

    /// Wait up to `timeout` (forever if `None`); true if an event was consumed.
    pub fn wait_timeout(&self, timeout: Option<Duration>) -> Result<bool> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if self.consume()? {
                return Ok(true);
            }
            let ts = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    Some(Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: left.subsec_nanos() as i64,
                    })
                }
            };
            let fd = self.as_fd();
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            match poll(&mut fds, ts.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(Error::os("poll event channel", e.into())),
            }
        }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.inner {
            EvtchnInner::Xen(e) => e.fd(),
            EvtchnInner::Sim(e) => e.fd(),
        }
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl mio::event::Source for EventChannel {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> std::io::Result<()> {
        mio::unix::SourceFd(&self.as_raw_fd()).register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> std::io::Result<()> {
        mio::unix::SourceFd(&self.as_raw_fd()).reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &mio::Registry) -> std::io::Result<()> {
        mio::unix::SourceFd(&self.as_raw_fd()).deregister(registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xenstore_endpoint_on_xen() {
        let none = |_: &Path| false;
        let all = |_: &Path| true;
        assert_eq!(
            xen_xenstore_endpoint(None, false, all),
            XenStoreEndpoint::Xenbus("/dev/xen/xenbus".into()),
            "a guest uses the xenbus device even if a socket path exists"
        );
        assert_eq!(
            xen_xenstore_endpoint(None, true, all),
            XenStoreEndpoint::Socket(DEFAULT_SOCKET_PATH.into())
        );
        assert_eq!(
            xen_xenstore_endpoint(None, true, none),
            XenStoreEndpoint::Xenbus("/dev/xen/xenbus".into()),
            "dom0 without xenstored socket falls back to xenbus"
        );
        assert_eq!(
            xen_xenstore_endpoint(Some("/tmp/xs".into()), false, none),
            XenStoreEndpoint::Socket("/tmp/xs".into())
        );
    }
}
