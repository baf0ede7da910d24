//! The domain side of the simulated host: what a process in a simulated domain uses instead of
//! `/dev/xen/{gntalloc,gntdev,evtchn}`.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::proto::{self, Control, ControlReply, DomainInfo, Failure, Reply, Request};
use super::sock;
use super::wire::{self, Received};
use crate::error::libc_errno::ENOSPC;
use crate::error::{Error, Result};
use crate::region::Mapping;
use crate::types::{Access, DomId, EvtchnPort, GrantRef, UnmapNotify, PAGE_SIZE};

/// A connection to this domain's hypercall socket. Everything made through it is released by
/// the host when it closes (process exit included).
#[derive(Debug)]
pub(crate) struct SimConn {
    sock: Mutex<OwnedFd>,
    domid: DomId,
    max_grants: u32,
    dir: PathBuf,
}

fn failure_to_error(dir: &Path, what: &str, f: Failure) -> Error {
    match f.errno {
        ENOSPC if f.limit > 0 => Error::GrantLimit {
            knob: format!(
                "the domain's grant limit ({} now; `vrdma-simhost domain create --max-grants N`, \
                 or `vrdma-simhost serve --max-grants N` for the default)",
                f.limit
            ),
            detail: f.message,
        },
        _ => Error::Os {
            op: format!("{what} (simulated host {})", dir.display()),
            source: std::io::Error::from_raw_os_error(f.errno),
        }
        .with_message(f.message),
    }
}

impl Error {
    fn with_message(self, msg: String) -> Error {
        match self {
            Error::Os { op, source } => Error::Os {
                op: format!("{op}: {msg}"),
                source,
            },
            e => e,
        }
    }
}

impl SimConn {
    pub(crate) fn connect(dir: &Path, domid: DomId) -> Result<SimConn> {
        let path = sock::hypercall_socket(dir, domid.0);
        let fd = sock::connect(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                Error::SimHost(format!(
                    "no domain {domid} at {}: {e} (is `vrdma-simhost serve --dir {}` running, and \
                     does `vrdma-simhost domain list` show the domain?)",
                    path.display(),
                    dir.display()
                ))
            }
            std::io::ErrorKind::PermissionDenied => Error::DevicePermission {
                path: path.clone(),
                source: e,
            },
            _ => Error::os(format!("connect {}", path.display()), e),
        })?;
        let mut c = SimConn {
            sock: Mutex::new(fd),
            domid,
            max_grants: 0,
            dir: dir.to_path_buf(),
        };
        match c.call(&Request::Hello, "hello")? {
            (
                Reply::Hello {
                    domid: d,
                    max_grants,
                },
                _,
            ) if d == domid.0 => c.max_grants = max_grants,
            other => {
                return Err(Error::Protocol(format!(
                    "hello to domain {domid} answered {:?}",
                    other.0
                )))
            }
        }
        Ok(c)
    }

    pub(crate) fn domid(&self) -> DomId {
        self.domid
    }

    #[allow(dead_code)]
    pub(crate) fn max_grants(&self) -> u32 {
        self.max_grants
    }

    /// One request, one answer (requests of several threads are serialised).
    fn call(&self, req: &Request, what: &str) -> Result<(Reply, Vec<OwnedFd>)> {
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        wire::send(&*sock, &req.emit(), &[]).map_err(|e| {
            Error::SimHost(format!(
                "{what}: the host hung up (domain {} destroyed, or host stopped): {e}",
                self.domid
            ))
        })?;
        let (msg, fds) = match wire::recv(&*sock) {
            Ok(Received::Message(m, f)) => (m, f),
            Ok(Received::Closed) => {
                return Err(Error::SimHost(format!(
                    "{what}: the host hung up (domain {} destroyed, or host stopped)",
                    self.domid
                )))
            }
            Err(e) => return Err(Error::Protocol(format!("{what}: {e}"))),
        };
        match proto::parse_answer(&msg).map_err(|e| Error::Protocol(format!("{what}: {e}")))? {
            Ok(rep) => Ok((rep, fds)),
            Err(f) => Err(failure_to_error(&self.dir, what, f)),
        }
    }

    /// Fire-and-forget release (used from Drop: errors only logged).
    fn release(&self, req: Request) {
        if let Err(e) = self.call(&req, "release") {
            tracing::debug!("simulated host: release {req:?}: {e}");
        }
    }

    pub(crate) fn share(
        self: &Arc<Self>,
        to: DomId,
        count: usize,
        access: Access,
    ) -> Result<SimShare> {
        let count32 = u32::try_from(count)
            .ok()
            .filter(|&c| c > 0 && (c as usize) <= proto::MAX_REFS_PER_CALL)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "cannot share {count} pages in one call (1..={})",
                    proto::MAX_REFS_PER_CALL
                ))
            })?;
        let req = Request::GrantAlloc {
            domid: to.0,
            writable: access.is_writable(),
            count: count32,
        };
        let (rep, mut fds) =
            self.call(&req, &format!("granting {count} page(s) to domain {to}"))?;
        let (Reply::Granted { handle, grefs }, Some(fd)) = (rep, fds.pop()) else {
            return Err(Error::Protocol("grant answer without pages".into()));
        };
        let mut share = SimShare {
            conn: Arc::clone(self),
            handle,
            grefs: grefs.into_iter().map(GrantRef).collect(),
            map: None,
        };
        if share.grefs.len() != count {
            return Err(Error::Protocol(
                "grant answer with the wrong number of refs".into(),
            ));
        }
        share.map = Some(Mapping::map_fd(&fd, 0, count * PAGE_SIZE, true)?);
        Ok(share)
    }

    pub(crate) fn map(
        self: &Arc<Self>,
        from: DomId,
        refs: &[GrantRef],
        access: Access,
    ) -> Result<SimMapping> {
        if refs.is_empty() || refs.len() > proto::MAX_REFS_PER_CALL {
            return Err(Error::InvalidArgument(format!(
                "cannot map {} grants in one call (1..={})",
                refs.len(),
                proto::MAX_REFS_PER_CALL
            )));
        }
        let req = Request::Map {
            domid: from.0,
            writable: access.is_writable(),
            refs: refs.iter().map(|r| r.0).collect(),
        };
        let what = format!("mapping {} grant(s) of domain {from}", refs.len());
        let (rep, fds) = match self.call(&req, &what) {
            // EPERM (not ours / read-only), EINVAL (no such grant), ESRCH (no such domain).
            Err(Error::Os { op, source }) => {
                return Err(Error::GrantRefused {
                    domid: from,
                    refs: crate::xen::gntdev::refs_for_error(refs),
                    errno: source.raw_os_error().unwrap_or(0),
                    reason: op,
                })
            }
            other => other?,
        };
        let Reply::Mapped { handle, segments } = rep else {
            return Err(Error::Protocol("map answer of the wrong kind".into()));
        };
        // From here on, dropping `m` tells the host to release the mapping.
        let mut m = SimMapping {
            conn: Arc::clone(self),
            handle,
            map: None,
        };
        let mut region = Mapping::reserve(refs.len() * PAGE_SIZE, access.is_writable())?;
        let mut at = 0usize;
        for s in &segments {
            let fd = fds
                .get(s.fd_index as usize)
                .ok_or_else(|| Error::Protocol("segment names a missing descriptor".into()))?;
            let len = s.pages as usize * PAGE_SIZE;
            region.map_fixed(at, fd, s.file_page * PAGE_SIZE as u64, len)?;
            at += len;
        }
        if at != refs.len() * PAGE_SIZE {
            return Err(Error::Protocol("segments do not cover the mapping".into()));
        }
        m.map = Some(region);
        Ok(m)
    }

    pub(crate) fn alloc_unbound(self: &Arc<Self>, remote: DomId) -> Result<SimEvtchn> {
        let what = format!("allocating an event channel for domain {remote}");
        let r = self.call(&Request::EvtchnAllocUnbound { remote: remote.0 }, &what);
        self.evtchn_from(r.map_err(|e| Error::Evtchn(e.to_string()))?)
    }

    pub(crate) fn bind_interdomain(
        self: &Arc<Self>,
        remote: DomId,
        port: EvtchnPort,
    ) -> Result<SimEvtchn> {
        let what = format!("binding to domain {remote} port {port}");
        let r = self.call(
            &Request::EvtchnBind {
                remote: remote.0,
                remote_port: port.0,
            },
            &what,
        );
        self.evtchn_from(r.map_err(|e| Error::Evtchn(e.to_string()))?)
    }

    fn evtchn_from(self: &Arc<Self>, (rep, fds): (Reply, Vec<OwnedFd>)) -> Result<SimEvtchn> {
        let Reply::Port { port } = rep else {
            return Err(Error::Protocol(
                "event-channel answer of the wrong kind".into(),
            ));
        };
        let mut it = fds.into_iter();
        let (Some(recv), Some(send)) = (it.next(), it.next()) else {
            // Still release the port the host made.
            self.release(Request::EvtchnUnbind { port });
            return Err(Error::Protocol(
                "event-channel answer without eventfds".into(),
            ));
        };
        Ok(SimEvtchn {
            conn: Arc::clone(self),
            port: EvtchnPort(port),
            recv,
            send,
        })
    }
}

/// Pages this domain shares (a memfd mapped here).
#[derive(Debug)]
pub(crate) struct SimShare {
    conn: Arc<SimConn>,
    handle: u64,
    grefs: Vec<GrantRef>,
    map: Option<Mapping>,
}

impl SimShare {
    pub(crate) fn grant_refs(&self) -> &[GrantRef] {
        &self.grefs
    }
    pub(crate) fn mapping(&self) -> &Mapping {
        self.map.as_ref().expect("mapped until drop")
    }
    pub(crate) fn mapping_mut(&mut self) -> &mut Mapping {
        self.map.as_mut().expect("mapped until drop")
    }
    pub(crate) fn set_unmap_notify(&self, n: &UnmapNotify) -> Result<()> {
        self.conn
            .call(
                &Request::GrantNotify {
                    handle: self.handle,
                    action: n.action_bits(),
                    offset: n.clear_byte.unwrap_or(0) as u64,
                    port: n.event.map_or(0, |p| p.0),
                },
                "set unmap-notify",
            )
            .map(drop)
    }
}

impl Drop for SimShare {
    fn drop(&mut self) {
        self.map.take();
        self.conn.release(Request::GrantDealloc {
            handle: self.handle,
        });
    }
}

/// Another domain's grants mapped here.
#[derive(Debug)]
pub(crate) struct SimMapping {
    conn: Arc<SimConn>,
    handle: u64,
    map: Option<Mapping>,
}

impl SimMapping {
    pub(crate) fn mapping(&self) -> &Mapping {
        self.map.as_ref().expect("mapped until drop")
    }
    pub(crate) fn set_unmap_notify(&self, n: &UnmapNotify) -> Result<()> {
        self.conn
            .call(
                &Request::MapNotify {
                    handle: self.handle,
                    action: n.action_bits(),
                    offset: n.clear_byte.unwrap_or(0) as u64,
                    port: n.event.map_or(0, |p| p.0),
                },
                "set unmap-notify",
            )
            .map(drop)
    }
}

impl Drop for SimMapping {
    fn drop(&mut self) {
        self.map.take();
        self.conn.release(Request::Unmap {
            handle: self.handle,
        });
    }
}

/// An event channel: an eventfd we wait on and the peer's eventfd we notify.
#[derive(Debug)]
pub(crate) struct SimEvtchn {
    conn: Arc<SimConn>,
    port: EvtchnPort,
    recv: OwnedFd,
    send: OwnedFd,
}

impl SimEvtchn {
    pub(crate) fn port(&self) -> EvtchnPort {
        self.port
    }
    pub(crate) fn notify(&self) -> Result<()> {
        // The peer's port is masked while it has an unconsumed event: nothing new is raised.
        if super::host::evtchn_masked(&self.send) {
            return Ok(());
        }
        match rustix::io::write(&self.send, &1u64.to_ne_bytes()) {
            // The counter is saturated: the peer has events pending anyway.
            Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
            Err(e) => Err(Error::os(format!("notify port {}", self.port), e.into())),
        }
    }
    pub(crate) fn try_consume(&self) -> Result<bool> {
        let mut v = [0u8; 8];
        match rustix::io::read(&self.recv, &mut v) {
            Ok(_) => Ok(true),
            Err(rustix::io::Errno::AGAIN) => Ok(false),
            Err(e) => Err(Error::os(
                format!("read events of port {}", self.port),
                e.into(),
            )),
        }
    }
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.recv.as_fd()
    }
}

impl Drop for SimEvtchn {
    fn drop(&mut self) {
        self.conn
            .release(Request::EvtchnUnbind { port: self.port.0 });
    }
}

/// A client of a simulated host's control socket (`vrdma-simhost domain ...`).
#[derive(Debug)]
pub struct SimControl {
    sock: OwnedFd,
    dir: PathBuf,
}

impl SimControl {
    /// Connect to the host serving `dir`.
    pub fn connect(dir: impl AsRef<Path>) -> Result<SimControl> {
        let dir = dir.as_ref();
        let path = sock::control_socket(dir);
        let sock = sock::connect(&path).map_err(|e| {
            Error::SimHost(format!(
                "no simulated host at {}: {e} (start one with `vrdma-simhost serve --dir {}`)",
                dir.display(),
                dir.display()
            ))
        })?;
        Ok(SimControl {
            sock,
            dir: dir.to_path_buf(),
        })
    }

    fn call(&self, c: &Control) -> Result<ControlReply> {
        wire::send(&self.sock, &c.emit(), &[])
            .map_err(|e| Error::SimHost(format!("control: {e}")))?;
        let msg = match wire::recv(&self.sock) {
            Ok(Received::Message(m, _)) => m,
            Ok(Received::Closed) => return Err(Error::SimHost("control: the host hung up".into())),
            Err(e) => return Err(Error::Protocol(format!("control: {e}"))),
        };
        match proto::parse_control_answer(&msg).map_err(|e| Error::Protocol(e.to_string()))? {
            Ok(r) => Ok(r),
            Err(f) => Err(Error::SimHost(format!(
                "{} ({})",
                f.message,
                std::io::Error::from_raw_os_error(f.errno)
            ))),
        }
    }

    /// Create a domain (`max_grants` 0: the host's default).
    pub fn create_domain(&self, name: &str, max_grants: u32) -> Result<DomId> {
        match self.call(&Control::Create {
            name: name.to_string(),
            max_grants,
        })? {
            ControlReply::Created { domid } => Ok(DomId(domid)),
            r => Err(Error::Protocol(format!("create answered {r:?}"))),
        }
    }

    /// Destroy a domain.
    pub fn destroy_domain(&self, domid: DomId) -> Result<()> {
        self.call(&Control::Destroy { domid: domid.0 }).map(drop)
    }

    /// List domains.
    pub fn list(&self) -> Result<Vec<DomainInfo>> {
        match self.call(&Control::List)? {
            ControlReply::Domains(v) => Ok(v),
            r => Err(Error::Protocol(format!("list answered {r:?}"))),
        }
    }

    /// Put process group `pid` into `domid`; it is killed if the domain is destroyed while this
    /// connection is open. Use one connection per adopted process.
    pub fn adopt(&self, domid: DomId, pid: u32) -> Result<()> {
        self.call(&Control::Adopt {
            domid: domid.0,
            pid,
        })
        .map(drop)
    }

    /// The host directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
