//! The simulated Xen host: plays the hypervisor's grant tables and event channels for processes
//! on one machine, one hypercall socket per domain (the socket a process connects to is its
//! identity), plus a control socket for creating and destroying domains.
//!
//! Who may use which socket: a process adopted into a guest domain, and every descendant of it,
//! is that domain's (the host learns the connecting pid with `SO_PEERCRED` and walks its
//! ancestry in `/proc`). Such a process may use only its own domain's sockets, and never the
//! control socket; every other process is the host's user (dom0, the toolstack, tests) and may
//! use any socket. See docs/platform.md, "Trust model".
//!
//! The parts: [`grants`] (grant tables: sharing and mapping pages, unmap-notify), [`evtchn`]
//! (event channels), [`domains`] (create, destroy, adopt processes, tell which domain a process
//! is in) and [`serve`] (the sockets: accept, admit or refuse, the hypercall and control loops);
//! this module holds the shared state and dispatches hypercalls.
//!
//! Design: one thread per listening socket and per connection (a simulator serves tens of
//! processes, and blocking code is simple to audit). All state sits behind one mutex. Every
//! resource belongs to the connection that made it, so a process that dies — its socket closes —
//! releases everything it held, firing unmap-notify like the Linux drivers do on close.
//! Granted pages are memfds and event channels are eventfds, handed out with SCM_RIGHTS: once
//! set up, the data path is shared memory and eventfd writes, never this process.

mod domains;
mod evtchn;
mod grants;
mod serve;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use super::proto::{DomainInfo, Failure, Reply, Request};
use super::sock;
use super::xenstore::SimXenStore;
use crate::error::libc_errno::{EINVAL, ENOSPC, EPERM};
use crate::error::{Error, Result};
use crate::types::DomId;

use domains::Adopted;
use evtchn::Port;
use grants::{Alloc, Grant, MapEntry};
use serve::Listening;

pub(crate) use evtchn::masked as evtchn_masked;
pub use evtchn::MAX_PORTS_PER_DOMAIN;

const ESRCH: i32 = 3;
const EEXIST: i32 = 17;
const E2BIG: i32 = 7;

/// Default per-domain grant limit: what a Xen domain's default grant table holds
/// (`max_grant_frames` = 64 frames × 512 v1 entries... kept smaller to catch leaks early).
pub const DEFAULT_MAX_GRANTS: u32 = 16384;

/// How to run a simulated host.
#[derive(Debug, Clone)]
pub struct SimHostConfig {
    /// The host's directory (sockets live here).
    pub dir: PathBuf,
    /// Grant limit of domains created without their own.
    pub default_max_grants: u32,
}

impl SimHostConfig {
    /// Defaults for `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SimHostConfig {
            dir: dir.into(),
            default_max_grants: DEFAULT_MAX_GRANTS,
        }
    }
}

/// A running simulated host (in this process). Dropping it stops it.
pub struct SimHost {
    host: Arc<Host>,
}

struct Host {
    dir: PathBuf,
    default_max_grants: u32,
    state: Mutex<State>,
    ids: AtomicU64,
    stopping: AtomicBool,
    control_listener: OwnedFd,
    /// Control connections and refused domain connections: shut down when the host stops.
    side_conns: Mutex<HashMap<u64, OwnedFd>>,
    /// The host's XenStore: told as domains come and go, serves admitted connections.
    xenstore: SimXenStore,
}

#[derive(Default)]
struct State {
    domains: BTreeMap<u16, Domain>,
    next_domid: u16,
}

struct Domain {
    name: String,
    max_grants: u32,
    grants: HashMap<u32, Grant>,
    next_gref: u32,
    allocs: HashMap<u64, Alloc>,
    maps: HashMap<u64, MapEntry>,
    ports: BTreeMap<u32, Port>,
    conns: HashMap<u64, OwnedFd>,
    /// Adopted processes, by the control connection that adopted them: they and their
    /// descendants are this domain's.
    procs: HashMap<u64, Adopted>,
    listener: OwnedFd,
    xs_listener: OwnedFd,
}

/// The host holds one descriptor per grant allocation and two per event channel: lift the soft
/// descriptor limit to the hard one, as daemons serving many clients do.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        l.current = l.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            tracing::debug!("cannot raise the descriptor limit: {e}");
        }
    }
}

fn fail(errno: i32, msg: impl Into<String>) -> Failure {
    Failure::new(errno, msg)
}

fn io_fail(what: &str, e: std::io::Error) -> Failure {
    let errno = e.raw_os_error().unwrap_or(EINVAL);
    // EMFILE/ENFILE: the host itself ran out of descriptors.
    if errno == 24 || errno == 23 {
        return fail(errno, format!("{what}: the simulated host is out of file descriptors ({e}); raise its `ulimit -n`"));
    }
    fail(errno, format!("{what}: {e}"))
}

impl SimHost {
    /// Start a host in `config.dir`, with its XenStore and dom0 ("Domain-0") created.
    pub fn start(config: SimHostConfig) -> Result<SimHost> {
        raise_fd_limit();
        let xenstore = SimXenStore::new()?;
        let dir = std::path::absolute(&config.dir)
            .map_err(|e| Error::os(format!("{}", config.dir.display()), e))?;
        std::fs::create_dir_all(dir.join("domains"))
            .map_err(|e| Error::os(format!("create {}", dir.display()), e))?;
        let ctl = sock::control_socket(&dir);
        if sock::connect(&ctl).is_ok() {
            return Err(Error::SimHost(format!(
                "a simulated host already serves {} (its control socket answers)",
                dir.display()
            )));
        }
        domains::remove_stale_domains(&dir);
        let control_listener =
            sock::listen(&ctl).map_err(|e| Error::os(format!("listen on {}", ctl.display()), e))?;
        let host = Arc::new(Host {
            dir,
            default_max_grants: config.default_max_grants,
            state: Mutex::new(State::default()),
            ids: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            control_listener,
            side_conns: Mutex::new(HashMap::new()),
            xenstore,
        });
        host.create_domain(0, "Domain-0", config.default_max_grants)
            .map_err(|f| Error::SimHost(f.message))?;
        let h = Arc::clone(&host);
        thread::Builder::new()
            .name("simhost-control".into())
            .spawn(move || h.accept_loop(Listening::Control))
            .map_err(|e| Error::os("spawn control thread", e))?;
        tracing::info!("simulated Xen host serving {}", host.dir.display());
        Ok(SimHost { host })
    }

    /// The host directory.
    pub fn dir(&self) -> &Path {
        &self.host.dir
    }

    /// Create a domain; returns its id.
    pub fn create_domain(&self, name: Option<&str>, max_grants: Option<u32>) -> Result<DomId> {
        let max = max_grants.unwrap_or(self.host.default_max_grants);
        self.host
            .create(name.unwrap_or(""), max)
            .map(DomId)
            .map_err(|f| Error::SimHost(f.message))
    }

    /// Destroy a domain: kill its processes, release all it held.
    pub fn destroy_domain(&self, domid: DomId) -> Result<()> {
        self.host
            .destroy(domid.0)
            .map_err(|f| Error::SimHost(f.message))
    }

    /// One row per domain.
    pub fn list_domains(&self) -> Vec<DomainInfo> {
        self.host.list()
    }

    /// The embedded XenStore server (for in-process dom0 clients: `server.connect(0)`).
    pub fn xenstore_server(&self) -> &xenstore_proto::server::Server {
        self.host.xenstore.server()
    }

    /// Stop serving: close every socket (processes see their host hang up).
    pub fn stop(&self) {
        self.host.stop();
    }
}

impl Drop for SimHost {
    fn drop(&mut self) {
        self.host.stop();
    }
}

impl Host {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock must not take the whole host down with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    fn stop(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        sock::shutdown(&self.control_listener);
        for c in self
            .side_conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            sock::shutdown(c);
        }
        let domids: Vec<u16> = self.lock().domains.keys().copied().collect();
        for d in domids.into_iter().rev() {
            let _ = self.destroy_inner(d, true);
        }
        let _ = std::fs::remove_file(sock::control_socket(&self.dir));
    }

    // ---- hypercalls ----

    fn hypercall(
        &self,
        domid: u16,
        conn: u64,
        req: Request,
    ) -> (Result<Reply, Failure>, Vec<Arc<OwnedFd>>) {
        let mut st = self.lock();
        let mut out_fds = Vec::new();
        let r = match req {
            Request::Hello => st
                .domains
                .get(&domid)
                .map(|d| Reply::Hello {
                    domid,
                    max_grants: d.max_grants,
                })
                .ok_or_else(|| fail(ESRCH, "domain is gone")),
            Request::GrantAlloc {
                domid: to,
                writable,
                count,
            } => grants::alloc(&mut st, self.next_id(), domid, conn, to, writable, count).map(
                |(rep, fd)| {
                    out_fds.push(fd);
                    rep
                },
            ),
            Request::GrantDealloc { handle } => grants::dealloc(&mut st, domid, conn, handle),
            Request::GrantNotify {
                handle,
                action,
                offset,
                port,
            } => grants::set_alloc_notify(&mut st, domid, conn, handle, action, offset, port),
            Request::Map {
                domid: from,
                writable,
                refs,
            } => grants::map(&mut st, self.next_id(), domid, conn, from, writable, &refs).map(
                |(rep, fds)| {
                    out_fds = fds;
                    rep
                },
            ),
            Request::Unmap { handle } => grants::unmap(&mut st, domid, conn, handle),
            Request::MapNotify {
                handle,
                action,
                offset,
                port,
            } => grants::set_map_notify(&mut st, domid, conn, handle, action, offset, port),
            Request::EvtchnAllocUnbound { remote } => {
                evtchn::alloc_unbound(&mut st, domid, conn, remote).map(|(rep, fds)| {
                    out_fds = fds;
                    rep
                })
            }
            Request::EvtchnBind {
                remote,
                remote_port,
            } => evtchn::bind(&mut st, domid, conn, remote, remote_port).map(|(rep, fds)| {
                out_fds = fds;
                rep
            }),
            Request::EvtchnUnbind { port } => evtchn::unbind(&mut st, domid, conn, port),
        };
        (r, out_fds)
    }
}

/// Release everything connection `conn` of `domid` held: grants and mappings first (their
/// unmap-notify may use the connection's ports), then the ports.
fn release_conn(st: &mut State, domid: u16, conn: u64) {
    let Some(d) = st.domains.get(&domid) else {
        return;
    };
    let allocs: Vec<u64> = d
        .allocs
        .iter()
        .filter(|(_, a)| a.owner == conn)
        .map(|(h, _)| *h)
        .collect();
    let maps: Vec<u64> = d
        .maps
        .iter()
        .filter(|(_, m)| m.owner == conn)
        .map(|(h, _)| *h)
        .collect();
    let ports: Vec<u32> = d
        .ports
        .iter()
        .filter(|(_, p)| p.owner == conn)
        .map(|(n, _)| *n)
        .collect();
    for h in allocs {
        grants::release_alloc(st, domid, h);
    }
    for h in maps {
        grants::release_map(st, domid, h);
    }
    for p in ports {
        evtchn::unbind_port(st, domid, p);
    }
    if let Some(d) = st.domains.get_mut(&domid) {
        d.conns.remove(&conn);
    }
}
