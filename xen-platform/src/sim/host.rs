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
//! Design: one thread per listening socket and per connection (a simulator serves tens of
//! processes, and blocking code is simple to audit). All state sits behind one mutex. Every
//! resource belongs to the connection that made it, so a process that dies — its socket closes —
//! releases everything it held, firing unmap-notify like the Linux drivers do on close.
//! Granted pages are memfds and event channels are eventfds, handed out with SCM_RIGHTS: once
//! set up, the data path is shared memory and eventfd writes, never this process.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};

use super::peer;
use super::proto::{self, Control, ControlReply, DomainInfo, Failure, Reply, Request, Segment};
use super::sock;
use super::wire::{self, Received, MAX_FDS};
use super::xenstore::SimXenStore;
use crate::error::libc_errno::{EINVAL, ENOSPC, EPERM};
use crate::error::{Error, Result};
use crate::types::{DomId, UnmapNotify, PAGE_SIZE};

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

/// Pages of one allocation: one memfd (read-only views are reopened on demand, so the host
/// holds one descriptor per allocation).
struct PageFile {
    rw: OwnedFd,
    pages: u32,
}

struct Grant {
    page: u32,
    to: u16,
    writable: bool,
    file: Arc<PageFile>,
}

struct Alloc {
    owner: u64,
    grefs: Vec<u32>,
    file: Arc<PageFile>,
    notify: Option<Notify>,
}

struct MapEntry {
    owner: u64,
    pages: Vec<(Arc<PageFile>, u32)>,
    notify: Option<Notify>,
}

#[derive(Clone, Copy)]
struct Notify {
    action: u32,
    offset: u64,
    port: u32,
}

struct Port {
    owner: u64,
    remote: u16,
    peer: Option<(u16, u32)>,
    recv: Arc<OwnedFd>,
    send: Arc<OwnedFd>,
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

/// An adopted process: its pid and start time, so a reused pid is not taken for it.
#[derive(Clone, Copy)]
struct Adopted {
    pid: u32,
    started: u64,
}

impl Adopted {
    /// Whether the adopted process still runs (the pid was not reused by another).
    fn lives(&self) -> bool {
        peer::start_time(self.pid) == Some(self.started)
    }
}

/// Which socket a connection came in on.
enum Listening {
    Control,
    Hypercall(u16, OwnedFd),
    XenStore(u16, OwnedFd),
}

/// Who connected, as far as the simulator's domains go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// Not in any guest domain: the host's user (dom0, the toolstack, tests), trusted with
    /// every socket.
    Host { pid: u32 },
    /// A process of guest domain `domid`: it, or its nearest adopted ancestor, was adopted into
    /// the domain.
    Guest { pid: u32, domid: u16 },
}

/// Xen reserves the first grant references (`GNTTAB_NR_RESERVED_ENTRIES`).
const FIRST_GREF: u32 = 8;

/// A host that died leaves its domains' sockets behind; nobody serves them any more.
fn remove_stale_domains(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("domains")) else {
        return;
    };
    for e in entries.flatten() {
        let Some(domid) = e.file_name().to_str().and_then(|n| n.parse::<u16>().ok()) else {
            continue;
        };
        let _ = std::fs::remove_file(sock::hypercall_socket(dir, domid));
        let _ = std::fs::remove_file(sock::xenstore_socket(dir, domid));
        let _ = std::fs::remove_dir(e.path());
    }
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
        remove_stale_domains(&dir);
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

    // ---- domains ----

    fn create(self: &Arc<Self>, name: &str, max_grants: u32) -> Result<u16, Failure> {
        let domid = {
            let st = self.lock();
            let mut d = st.next_domid.max(1);
            while st.domains.contains_key(&d) {
                d = d
                    .checked_add(1)
                    .filter(|&d| DomId(d).is_normal())
                    .ok_or_else(|| fail(ENOSPC, "no free domain id"))?;
            }
            d
        };
        let name = if name.is_empty() {
            format!("sim-guest-{domid}")
        } else {
            name.to_string()
        };
        self.create_domain(domid, &name, max_grants)?;
        Ok(domid)
    }

    fn create_domain(
        self: &Arc<Self>,
        domid: u16,
        name: &str,
        max_grants: u32,
    ) -> Result<(), Failure> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(fail(EINVAL, "host is stopping"));
        }
        if name.contains('/') || name.len() > 64 {
            return Err(fail(EINVAL, format!("bad domain name {name:?}")));
        }
        {
            let st = self.lock();
            if st.domains.values().any(|d| d.name == name) {
                return Err(fail(EEXIST, format!("a domain named {name:?} exists")));
            }
            if st.domains.contains_key(&domid) {
                return Err(fail(EEXIST, format!("domain {domid} exists")));
            }
        }
        let ddir = sock::domain_dir(&self.dir, domid);
        std::fs::create_dir_all(&ddir)
            .map_err(|e| fail(EINVAL, format!("create {}: {e}", ddir.display())))?;
        let path = sock::hypercall_socket(&self.dir, domid);
        let listener = sock::listen(&path)
            .map_err(|e| fail(EINVAL, format!("listen on {}: {e}", path.display())))?;
        let keep = sock::dup(&listener).map_err(|e| fail(EINVAL, format!("dup: {e}")))?;
        let xs_path = sock::xenstore_socket(&self.dir, domid);
        let xs_listener = sock::listen_stream(&xs_path)
            .map_err(|e| fail(EINVAL, format!("listen on {}: {e}", xs_path.display())))?;
        let xs_keep = sock::dup(&xs_listener).map_err(|e| fail(EINVAL, format!("dup: {e}")))?;
        {
            let mut st = self.lock();
            if st.domains.contains_key(&domid) || st.domains.values().any(|d| d.name == name) {
                // Lost a race with another create of the same name or id.
                drop(st);
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(&xs_path);
                let _ = std::fs::remove_dir(&ddir);
                return Err(fail(
                    EEXIST,
                    format!("domain {domid} or name {name:?} exists"),
                ));
            }
            st.domains.insert(
                domid,
                Domain {
                    name: name.to_string(),
                    max_grants,
                    grants: HashMap::new(),
                    next_gref: FIRST_GREF,
                    allocs: HashMap::new(),
                    maps: HashMap::new(),
                    ports: BTreeMap::new(),
                    conns: HashMap::new(),
                    procs: HashMap::new(),
                    listener: keep,
                    xs_listener: xs_keep,
                },
            );
            st.next_domid = st.next_domid.max(domid.saturating_add(1));
        }
        if let Err(e) = self.xenstore.domain_created(DomId(domid), name) {
            let _ = self.destroy_inner(domid, true);
            return Err(fail(EINVAL, format!("domain {domid}: {e}")));
        }
        for (name, listening) in [
            (
                format!("simhost-dom{domid}"),
                Listening::Hypercall(domid, listener),
            ),
            (
                format!("simhost-xs{domid}"),
                Listening::XenStore(domid, xs_listener),
            ),
        ] {
            let h = Arc::clone(self);
            thread::Builder::new()
                .name(name)
                .spawn(move || h.accept_loop(listening))
                .map_err(|e| fail(EINVAL, format!("spawn: {e}")))?;
        }
        tracing::info!("domain {domid} ({name}) created, max {max_grants} grants");
        Ok(())
    }

    fn destroy(&self, domid: u16) -> Result<(), Failure> {
        if domid == 0 {
            return Err(fail(
                EPERM,
                "domain 0 cannot be destroyed (stop the host instead)",
            ));
        }
        self.destroy_inner(domid, false)
    }

    fn destroy_inner(&self, domid: u16, stopping: bool) -> Result<(), Failure> {
        let mut st = self.lock();
        let Some(dom) = st.domains.get(&domid) else {
            return Err(fail(ESRCH, format!("no domain {domid}")));
        };
        // Kill first, so nothing in the domain runs on while its resources go away.
        let roots: Vec<u32> = dom
            .procs
            .values()
            .filter(|a| a.lives())
            .map(|a| a.pid)
            .collect();
        kill_domain_processes(&roots);
        sock::shutdown(&dom.listener);
        sock::shutdown(&dom.xs_listener);
        for c in dom.conns.values() {
            sock::shutdown(c);
        }
        let conns: Vec<u64> = dom.conns.keys().copied().collect();
        for c in conns {
            release_conn(&mut st, domid, c);
        }
        let dom = st.domains.remove(&domid).expect("present above");
        drop(st);
        drop(dom);
        self.xenstore.domain_destroyed(DomId(domid));
        let ddir = sock::domain_dir(&self.dir, domid);
        let _ = std::fs::remove_file(sock::hypercall_socket(&self.dir, domid));
        let _ = std::fs::remove_file(sock::xenstore_socket(&self.dir, domid));
        let _ = std::fs::remove_dir(&ddir);
        if !stopping {
            tracing::info!("domain {domid} destroyed");
        }
        Ok(())
    }

    fn list(&self) -> Vec<DomainInfo> {
        self.lock()
            .domains
            .iter()
            .map(|(&domid, d)| DomainInfo {
                domid,
                name: d.name.clone(),
                max_grants: d.max_grants,
                grants: d.grants.len() as u32,
                mappings: d.maps.len() as u32,
                ports: d.ports.len() as u32,
                connections: d.conns.len() as u32,
                processes: d.procs.len() as u32,
            })
            .collect()
    }

    // ---- sockets ----

    /// Accept connections on the control socket or a domain's hypercall or XenStore socket.
    fn accept_loop(self: Arc<Self>, on: Listening) {
        let listener = match &on {
            Listening::Control => self.control_listener.as_fd(),
            Listening::Hypercall(_, l) | Listening::XenStore(_, l) => l.as_fd(),
        };
        loop {
            let conn = match sock::accept(listener) {
                Ok(c) => c,
                Err(e) => {
                    if !self.stopping.load(Ordering::SeqCst) {
                        tracing::debug!("an accept loop ends: {e}");
                    }
                    return;
                }
            };
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let id = self.next_id();
            let h = Arc::clone(&self);
            let spawned = match &on {
                Listening::Control => thread::Builder::new()
                    .name(format!("simhost-ctl-c{id}"))
                    .spawn(move || h.serve_control(id, conn)),
                Listening::Hypercall(domid, _) => {
                    let domid = *domid;
                    if let Err(why) = self.admit(&conn, domid, "hypercall") {
                        self.refuse(id, conn, why, Refusal::Hypercall);
                        continue;
                    }
                    let keep = match sock::dup(&conn) {
                        Ok(k) => k,
                        Err(e) => {
                            tracing::warn!("dup: {e}");
                            continue;
                        }
                    };
                    match self.lock().domains.get_mut(&domid) {
                        Some(d) => {
                            d.conns.insert(id, keep);
                        }
                        None => return,
                    }
                    thread::Builder::new()
                        .name(format!("simhost-d{domid}-c{id}"))
                        .spawn(move || h.serve_hypercalls(domid, id, conn))
                }
                Listening::XenStore(domid, _) => {
                    let domid = *domid;
                    if let Err(why) = self.admit(&conn, domid, "XenStore") {
                        self.refuse(id, conn, why, Refusal::XenStore);
                        continue;
                    }
                    if let Err(e) = self
                        .xenstore
                        .serve(DomId(domid), std::os::unix::net::UnixStream::from(conn))
                    {
                        tracing::warn!("XenStore connection to domain {domid}: {e}");
                    }
                    continue;
                }
            };
            if let Err(e) = spawned {
                tracing::warn!("cannot spawn a connection thread: {e}");
            }
        }
    }

    // ---- who is connecting ----

    /// Which domain the process at the other end of `conn` belongs to.
    fn identify(&self, conn: &OwnedFd) -> Result<Peer, String> {
        let (pid, uid) = peer::peer_cred(conn).ok_or_else(|| {
            "the kernel gives no pid for the connecting process (another pid namespace?)"
                .to_string()
        })?;
        let me = rustix::process::geteuid().as_raw();
        if uid != me && uid != 0 {
            return Err(format!(
                "process {pid} runs as uid {uid}; this simulated host serves only its own user \
                 (uid {me}) and root"
            ));
        }
        self.identify_pid(pid)
    }

    fn identify_pid(&self, pid: u32) -> Result<Peer, String> {
        if pid == std::process::id() {
            return Ok(Peer::Host { pid });
        }
        let roots = self.adopted();
        // An ancestor that exits while we walk reparents the chain: walk again.
        let mut last = 0;
        for _ in 0..3 {
            match peer::ancestry(pid) {
                Ok(chain) => {
                    return Ok(chain
                        .iter()
                        .find_map(|p| roots.get(p).map(|&domid| Peer::Guest { pid, domid }))
                        .unwrap_or(Peer::Host { pid }))
                }
                Err(p) => last = p,
            }
        }
        Err(format!(
            "cannot tell which domain process {pid} is in (process {last} exited while the host \
             walked its ancestry)"
        ))
    }

    /// Adopted processes of the guest domains (dom0's adoptions do not confine: dom0 is the
    /// host's user).
    fn adopted(&self) -> HashMap<u32, u16> {
        let all: Vec<(Adopted, u16)> = self
            .lock()
            .domains
            .iter()
            .filter(|(&domid, _)| domid != 0)
            .flat_map(|(&domid, d)| d.procs.values().map(move |&a| (a, domid)))
            .collect();
        all.into_iter()
            .filter(|(a, _)| a.lives())
            .map(|(a, domid)| (a.pid, domid))
            .collect()
    }

    /// May the process at the other end of `conn` use domain `domid`'s `what` socket?
    fn admit(&self, conn: &OwnedFd, domid: u16, what: &str) -> Result<(), String> {
        match self.identify(conn) {
            Ok(Peer::Host { .. }) => Ok(()),
            Ok(Peer::Guest { domid: d, .. }) if d == domid => Ok(()),
            Ok(Peer::Guest { pid, domid: d }) => Err(format!(
                "process {pid} belongs to domain {d}: it may not use domain {domid}'s {what} \
                 socket"
            )),
            Err(why) => Err(format!("{why}: refused on domain {domid}'s {what} socket")),
        }
    }

    /// Keep a refused connection open only to answer each of its requests with `EPERM` and
    /// the reason (XenStore: `EACCES`, all its protocol can say), so the process sees why.
    fn refuse(self: &Arc<Self>, id: u64, conn: OwnedFd, why: String, kind: Refusal) {
        tracing::warn!("{why}");
        if let Ok(keep) = sock::dup(&conn) {
            self.side_conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, keep);
        }
        let h = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name(format!("simhost-refused-c{id}"))
            .spawn(move || {
                match kind {
                    Refusal::Hypercall => refuse_hypercalls(&conn, &why),
                    Refusal::XenStore => refuse_xenstore(&conn),
                }
                h.side_conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot spawn a connection thread: {e}");
        }
    }

    /// May `caller` (a host process) put `pid` into domain `domid`? Only its own child or
    /// descendant, not the host or its ancestors, and not a process already in another domain.
    /// Returns the process's start time.
    fn check_adopt(&self, caller: u32, domid: u16, pid: u32) -> Result<u64, Failure> {
        if pid == 0 || pid > i32::MAX as u32 {
            return Err(fail(EINVAL, format!("bad pid {pid}")));
        }
        let started =
            peer::start_time(pid).ok_or_else(|| fail(ESRCH, format!("no process {pid}")))?;
        let chain = peer::ancestry(pid).map_err(|_| fail(ESRCH, format!("no process {pid}")))?;
        if !chain[1..].contains(&caller) {
            return Err(fail(
                EPERM,
                format!(
                    "process {pid} is not a child or descendant of the adopting process \
                     {caller}: only a process's own children can be put into a domain"
                ),
            ));
        }
        let host = peer::ancestry(std::process::id()).unwrap_or_default();
        if host.contains(&pid) {
            return Err(fail(
                EPERM,
                format!("process {pid} runs the simulated host (or is its ancestor)"),
            ));
        }
        match self.identify_pid(pid) {
            Ok(Peer::Guest { domid: d, .. }) if d != domid => Err(fail(
                EPERM,
                format!("process {pid} already belongs to domain {d}"),
            )),
            Ok(_) => Ok(started),
            Err(why) => Err(fail(ESRCH, why)),
        }
    }

    fn serve_hypercalls(&self, domid: u16, conn_id: u64, conn: OwnedFd) {
        loop {
            let (msg, fds) = match wire::recv(&conn) {
                Ok(Received::Message(m, f)) => (m, f),
                Ok(Received::Closed) => break,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    let _ = send_answer(&conn, &Err(fail(EINVAL, e.to_string())), &[]);
                    continue;
                }
                Err(_) => break,
            };
            // Nobody sends us descriptors; drop any that came.
            drop(fds);
            let answer = match Request::parse(&msg) {
                Ok(req) => self.hypercall(domid, conn_id, req),
                Err(e) => (Err(fail(EINVAL, e.to_string())), Vec::new()),
            };
            let fds: Vec<BorrowedFd<'_>> = answer.1.iter().map(|f| f.as_fd()).collect();
            if send_answer(&conn, &answer.0, &fds).is_err() {
                break;
            }
        }
        let mut st = self.lock();
        if st.domains.contains_key(&domid) {
            release_conn(&mut st, domid, conn_id);
        }
    }

    fn serve_control(self: Arc<Self>, conn_id: u64, conn: OwnedFd) {
        if let Ok(keep) = sock::dup(&conn) {
            self.side_conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(conn_id, keep);
        }
        // A guest's process gets the reason, for every request.
        let caller = match self.identify(&conn) {
            Ok(Peer::Host { pid }) => Ok(pid),
            Ok(Peer::Guest { pid, domid }) => Err(format!(
                "process {pid} belongs to domain {domid}: a domain cannot use the host's \
                 control socket"
            )),
            Err(why) => Err(format!("{why}: refused on the control socket")),
        };
        if let Err(why) = &caller {
            tracing::warn!("{why}");
        }
        self.serve_control_conn(conn_id, &conn, caller);
        self.side_conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&conn_id);
    }

    fn serve_control_conn(
        self: &Arc<Self>,
        conn_id: u64,
        conn: &OwnedFd,
        caller: Result<u32, String>,
    ) {
        let mut adopted: Option<u16> = None;
        loop {
            let msg = match wire::recv(conn) {
                Ok(Received::Message(m, _)) => m,
                Ok(Received::Closed) | Err(_) => break,
            };
            let answer = match (Control::parse(&msg), &caller) {
                (Err(e), _) => Err(fail(EINVAL, e.to_string())),
                (Ok(_), Err(why)) => Err(fail(EPERM, why.clone())),
                (Ok(Control::Create { name, max_grants }), Ok(_)) => {
                    let max = if max_grants == 0 {
                        self.default_max_grants
                    } else {
                        max_grants
                    };
                    self.create(&name, max)
                        .map(|domid| ControlReply::Created { domid })
                }
                (Ok(Control::Destroy { domid }), Ok(_)) => {
                    self.destroy(domid).map(|()| ControlReply::Done)
                }
                (Ok(Control::List), Ok(_)) => Ok(ControlReply::Domains(self.list())),
                (Ok(Control::Adopt { domid, pid }), Ok(caller)) => {
                    if adopted.is_some() {
                        Err(fail(EINVAL, "this connection already adopted a process"))
                    } else if !self.lock().domains.contains_key(&domid) {
                        Err(fail(ESRCH, format!("no domain {domid}")))
                    } else {
                        self.check_adopt(*caller, domid, pid).and_then(|started| {
                            match self.lock().domains.get_mut(&domid) {
                                None => Err(fail(ESRCH, format!("no domain {domid}"))),
                                Some(d) => {
                                    d.procs.insert(conn_id, Adopted { pid, started });
                                    adopted = Some(domid);
                                    Ok(ControlReply::Done)
                                }
                            }
                        })
                    }
                }
            };
            if wire::send(conn, &proto::emit_control_answer(&answer), &[]).is_err() {
                break;
            }
        }
        if let Some(domid) = adopted {
            if let Some(d) = self.lock().domains.get_mut(&domid) {
                d.procs.remove(&conn_id);
            }
        }
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
            } => grant_alloc(&mut st, self.next_id(), domid, conn, to, writable, count).map(
                |(rep, fd)| {
                    out_fds.push(fd);
                    rep
                },
            ),
            Request::GrantDealloc { handle } => owned_alloc(&st, domid, conn, handle).map(|()| {
                release_alloc(&mut st, domid, handle);
                Reply::Done
            }),
            Request::GrantNotify {
                handle,
                action,
                offset,
                port,
            } => owned_alloc(&st, domid, conn, handle).and_then(|()| {
                let d = st.domains.get_mut(&domid).expect("checked");
                let len = d.allocs[&handle].file.pages as u64 * PAGE_SIZE as u64;
                let n = check_notify(d, action, offset, port, len)?;
                d.allocs.get_mut(&handle).expect("checked").notify = n;
                Ok(Reply::Done)
            }),
            Request::Map {
                domid: from,
                writable,
                refs,
            } => map_grants(&mut st, self.next_id(), domid, conn, from, writable, &refs).map(
                |(rep, fds)| {
                    out_fds = fds;
                    rep
                },
            ),
            Request::Unmap { handle } => owned_map(&st, domid, conn, handle).map(|()| {
                release_map(&mut st, domid, handle);
                Reply::Done
            }),
            Request::MapNotify {
                handle,
                action,
                offset,
                port,
            } => owned_map(&st, domid, conn, handle).and_then(|()| {
                let d = st.domains.get_mut(&domid).expect("checked");
                let len = d.maps[&handle].pages.len() as u64 * PAGE_SIZE as u64;
                let n = check_notify(d, action, offset, port, len)?;
                d.maps.get_mut(&handle).expect("checked").notify = n;
                Ok(Reply::Done)
            }),
            Request::EvtchnAllocUnbound { remote } => {
                evtchn_alloc_unbound(&mut st, domid, conn, remote).map(|(rep, fds)| {
                    out_fds = fds;
                    rep
                })
            }
            Request::EvtchnBind {
                remote,
                remote_port,
            } => evtchn_bind(&mut st, domid, conn, remote, remote_port).map(|(rep, fds)| {
                out_fds = fds;
                rep
            }),
            Request::EvtchnUnbind { port } => {
                match st.domains.get(&domid).and_then(|d| d.ports.get(&port)) {
                    Some(p) if p.owner == conn => {
                        unbind_port(&mut st, domid, port);
                        Ok(Reply::Done)
                    }
                    _ => Err(fail(
                        EINVAL,
                        format!("port {port} is not bound by this process"),
                    )),
                }
            }
        };
        (r, out_fds)
    }
}

fn send_answer(
    conn: &OwnedFd,
    a: &Result<Reply, Failure>,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    if let Err(f) = a {
        tracing::debug!("hypercall refused: {} ({})", f.message, f.errno);
    }
    wire::send(conn, &proto::emit_answer(a), fds)
}

#[derive(Clone, Copy)]
enum Refusal {
    Hypercall,
    XenStore,
}

/// Answer every hypercall on `conn` with `EPERM` and `why`, until it closes.
fn refuse_hypercalls(conn: &OwnedFd, why: &str) {
    loop {
        match wire::recv(conn) {
            Ok(Received::Message(..)) => {}
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {}
            Ok(Received::Closed) | Err(_) => return,
        }
        if send_answer(conn, &Err(fail(EPERM, why)), &[]).is_err() {
            return;
        }
    }
}

/// Answer every XenStore request on `conn` with `EACCES`, until it closes or sends garbage.
fn refuse_xenstore(conn: &OwnedFd) {
    use xenstore_proto::wire::{encode_frame, FrameDecoder, MsgType, Packet};
    let mut frames = FrameDecoder::new();
    let mut buf = [0u8; 4096];
    loop {
        match rustix::io::read(conn, &mut buf) {
            Ok(0) => return,
            Ok(n) => frames.push(&buf[..n]),
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        while let Ok(Some(frame)) = frames.next_frame() {
            let p = Packet::new_unchecked(&frame[..]);
            let Ok(reply) = encode_frame(MsgType::Error, p.req_id(), p.tx_id(), b"EACCES\0") else {
                return;
            };
            if rustix::io::write(conn, &reply).is_err() {
                return;
            }
        }
        if frames.next_frame().is_err() {
            return;
        }
    }
}

/// Kill the processes of a domain: the adopted `roots`, their descendants (stopped first, so
/// none forks away while the host looks), and the roots' process groups.
fn kill_domain_processes(roots: &[u32]) {
    use rustix::process::{kill_process, kill_process_group, Pid, Signal};
    if roots.is_empty() {
        return;
    }
    let me = std::process::id();
    let mut seen: Vec<u32> = Vec::new();
    for _ in 0..16 {
        let tree = peer::process_tree();
        let fresh: Vec<u32> = peer::descendants(&tree, roots)
            .into_iter()
            .filter(|p| *p != me && !seen.contains(p))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for &p in &fresh {
            if let Some(pid) = Pid::from_raw(p as i32) {
                let _ = kill_process(pid, Signal::STOP);
            }
        }
        seen.extend(fresh);
    }
    for &p in &seen {
        if let Some(pid) = Pid::from_raw(p as i32) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
    for &pgid in roots {
        if let Some(pid) = Pid::from_raw(pgid as i32) {
            match kill_process_group(pid, Signal::KILL) {
                Ok(()) | Err(rustix::io::Errno::SRCH) => {}
                Err(e) => tracing::warn!("kill process group {pgid}: {e}"),
            }
        }
    }
}

fn owned_alloc(st: &State, domid: u16, conn: u64, handle: u64) -> Result<(), Failure> {
    match st.domains.get(&domid).and_then(|d| d.allocs.get(&handle)) {
        Some(a) if a.owner == conn => Ok(()),
        _ => Err(fail(
            EINVAL,
            format!("no grant allocation {handle} in this process"),
        )),
    }
}

fn owned_map(st: &State, domid: u16, conn: u64, handle: u64) -> Result<(), Failure> {
    match st.domains.get(&domid).and_then(|d| d.maps.get(&handle)) {
        Some(m) if m.owner == conn => Ok(()),
        _ => Err(fail(EINVAL, format!("no mapping {handle} in this process"))),
    }
}

fn check_notify(
    d: &Domain,
    action: u32,
    offset: u64,
    port: u32,
    len: u64,
) -> Result<Option<Notify>, Failure> {
    if action & !(UnmapNotify::CLEAR_BYTE | UnmapNotify::SEND_EVENT) != 0 {
        return Err(fail(
            EINVAL,
            format!("unknown unmap-notify action bits {action:#x}"),
        ));
    }
    if action & UnmapNotify::CLEAR_BYTE != 0 && offset >= len {
        return Err(fail(
            EINVAL,
            format!("byte {offset} is outside the {len}-byte region"),
        ));
    }
    if action & UnmapNotify::SEND_EVENT != 0 && !d.ports.contains_key(&port) {
        return Err(fail(
            EINVAL,
            format!("port {port} is not bound in this domain"),
        ));
    }
    Ok((action != 0).then_some(Notify {
        action,
        offset,
        port,
    }))
}

fn new_page_file(domid: u16, count: u32) -> std::io::Result<PageFile> {
    let rw = rustix::fs::memfd_create(
        format!("vrdma-grant-dom{domid}"),
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&rw, count as u64 * PAGE_SIZE as u64)?;
    // Nobody may resize granted pages (a shrink would SIGBUS every mapper).
    rustix::fs::fcntl_add_seals(&rw, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(PageFile { rw, pages: count })
}

impl PageFile {
    /// A descriptor to hand a mapper. Read-only is a new open file description opened
    /// `O_RDONLY`: mapping it `PROT_WRITE` (or `mprotect`ing it so) fails with EACCES, which is
    /// what makes read-only grants read-only for the mapper.
    fn descriptor(&self, writable: bool) -> std::io::Result<OwnedFd> {
        if writable {
            return sock::dup(&self.rw);
        }
        let path = format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&self.rw)
        );
        rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(Into::into)
    }
}

fn io_fail(what: &str, e: std::io::Error) -> Failure {
    let errno = e.raw_os_error().unwrap_or(EINVAL);
    // EMFILE/ENFILE: the host itself ran out of descriptors.
    if errno == 24 || errno == 23 {
        return fail(errno, format!("{what}: the simulated host is out of file descriptors ({e}); raise its `ulimit -n`"));
    }
    fail(errno, format!("{what}: {e}"))
}

#[allow(clippy::too_many_arguments)]
fn grant_alloc(
    st: &mut State,
    handle: u64,
    domid: u16,
    conn: u64,
    to: u16,
    writable: bool,
    count: u32,
) -> Result<(Reply, Arc<OwnedFd>), Failure> {
    if count == 0 || count as usize > proto::MAX_REFS_PER_CALL {
        return Err(fail(
            EINVAL,
            format!(
                "cannot grant {count} pages in one call (1..={})",
                proto::MAX_REFS_PER_CALL
            ),
        ));
    }
    if !DomId(to).is_normal() {
        return Err(fail(EINVAL, format!("{to} is not a domain id")));
    }
    let d = st
        .domains
        .get_mut(&domid)
        .ok_or_else(|| fail(ESRCH, "domain is gone"))?;
    let in_use = d.grants.len() as u64;
    if in_use + count as u64 > d.max_grants as u64 {
        return Err(Failure {
            errno: ENOSPC,
            limit: d.max_grants,
            message: format!(
                "domain {domid} has {in_use} of its {} grants in use and asked for {count} more",
                d.max_grants
            ),
        });
    }
    let file = Arc::new(new_page_file(domid, count).map_err(|e| io_fail("memfd", e))?);
    let mut grefs = Vec::with_capacity(count as usize);
    for page in 0..count {
        while d.grants.contains_key(&d.next_gref) || d.next_gref < FIRST_GREF {
            d.next_gref = d.next_gref.wrapping_add(1);
        }
        let g = d.next_gref;
        d.next_gref = d.next_gref.wrapping_add(1);
        d.grants.insert(
            g,
            Grant {
                page,
                to,
                writable,
                file: Arc::clone(&file),
            },
        );
        grefs.push(g);
    }
    let rw = Arc::new(sock::dup(&file.rw).map_err(|e| fail(EINVAL, format!("dup: {e}")))?);
    d.allocs.insert(
        handle,
        Alloc {
            owner: conn,
            grefs: grefs.clone(),
            file,
            notify: None,
        },
    );
    Ok((Reply::Granted { handle, grefs }, rw))
}

#[allow(clippy::too_many_arguments)]
fn map_grants(
    st: &mut State,
    handle: u64,
    domid: u16,
    conn: u64,
    from: u16,
    writable: bool,
    refs: &[u32],
) -> Result<(Reply, Vec<Arc<OwnedFd>>), Failure> {
    if refs.is_empty() {
        return Err(fail(EINVAL, "no grant references to map"));
    }
    let src = st
        .domains
        .get(&from)
        .ok_or_else(|| fail(ESRCH, format!("no domain {from}")))?;
    let mut pages = Vec::with_capacity(refs.len());
    for &r in refs {
        let g = src
            .grants
            .get(&r)
            .ok_or_else(|| fail(EINVAL, format!("domain {from} has no grant {r}")))?;
        if g.to != domid {
            return Err(fail(
                EPERM,
                format!(
                    "grant {r} of domain {from} is granted to domain {}, not to domain {domid}",
                    g.to
                ),
            ));
        }
        if writable && !g.writable {
            return Err(fail(
                EPERM,
                format!("grant {r} of domain {from} is read-only"),
            ));
        }
        pages.push((Arc::clone(&g.file), g.page));
    }
    // Coalesce runs of consecutive pages of one file; one descriptor per distinct file.
    let mut files: Vec<Arc<PageFile>> = Vec::new();
    let mut segments: Vec<Segment> = Vec::new();
    for (file, page) in &pages {
        let idx = match files.iter().position(|f| Arc::ptr_eq(f, file)) {
            Some(i) => i,
            None => {
                if files.len() == MAX_FDS {
                    return Err(fail(
                        E2BIG,
                        format!(
                            "one mapping may span at most {MAX_FDS} separate grant allocations"
                        ),
                    ));
                }
                files.push(Arc::clone(file));
                files.len() - 1
            }
        } as u32;
        match segments.last_mut() {
            Some(s) if s.fd_index == idx && s.file_page + s.pages as u64 == *page as u64 => {
                s.pages += 1
            }
            _ => segments.push(Segment {
                fd_index: idx,
                file_page: *page as u64,
                pages: 1,
            }),
        }
    }
    let mut fds = Vec::with_capacity(files.len());
    for f in &files {
        fds.push(Arc::new(
            f.descriptor(writable)
                .map_err(|e| io_fail("grant descriptor", e))?,
        ));
    }
    let d = st
        .domains
        .get_mut(&domid)
        .ok_or_else(|| fail(ESRCH, "domain is gone"))?;
    d.maps.insert(
        handle,
        MapEntry {
            owner: conn,
            pages,
            notify: None,
        },
    );
    Ok((Reply::Mapped { handle, segments }, fds))
}

fn new_eventfd() -> Result<Arc<OwnedFd>, Failure> {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )
    .map(Arc::new)
    .map_err(|e| io_fail("eventfd", e.into()))
}

/// Ports per domain: xl's default `max_event_channels`.
pub const MAX_PORTS_PER_DOMAIN: u32 = 1023;

fn free_port(d: &Domain) -> Result<u32, Failure> {
    // Port 0 is never valid in Xen.
    (1..=MAX_PORTS_PER_DOMAIN)
        .find(|p| !d.ports.contains_key(p))
        .ok_or_else(|| Failure {
            errno: ENOSPC,
            limit: 0,
            message: format!(
                "all {MAX_PORTS_PER_DOMAIN} event-channel ports of this domain are in use \
                 (xl's default max_event_channels)"
            ),
        })
}

fn evtchn_alloc_unbound(
    st: &mut State,
    domid: u16,
    conn: u64,
    remote: u16,
) -> Result<(Reply, Vec<Arc<OwnedFd>>), Failure> {
    if !DomId(remote).is_normal() {
        return Err(fail(EINVAL, format!("{remote} is not a domain id")));
    }
    let d = st
        .domains
        .get_mut(&domid)
        .ok_or_else(|| fail(ESRCH, "domain is gone"))?;
    let port = free_port(d)?;
    let recv = new_eventfd()?;
    let send = new_eventfd()?;
    d.ports.insert(
        port,
        Port {
            owner: conn,
            remote,
            peer: None,
            recv: Arc::clone(&recv),
            send: Arc::clone(&send),
        },
    );
    Ok((Reply::Port { port }, vec![recv, send]))
}

fn evtchn_bind(
    st: &mut State,
    domid: u16,
    conn: u64,
    remote: u16,
    remote_port: u32,
) -> Result<(Reply, Vec<Arc<OwnedFd>>), Failure> {
    let rp = st
        .domains
        .get(&remote)
        .ok_or_else(|| fail(ESRCH, format!("no domain {remote}")))?
        .ports
        .get(&remote_port)
        .ok_or_else(|| fail(EINVAL, format!("domain {remote} has no port {remote_port}")))?;
    if rp.peer.is_some() || rp.remote != domid {
        return Err(fail(
            EINVAL,
            format!("port {remote_port} of domain {remote} is not an unbound port offered to domain {domid}"),
        ));
    }
    // Our receive side is what the remote sends to, and the other way round.
    let (recv, send) = (Arc::clone(&rp.send), Arc::clone(&rp.recv));
    let d = st
        .domains
        .get_mut(&domid)
        .ok_or_else(|| fail(ESRCH, "domain is gone"))?;
    let port = free_port(d)?;
    d.ports.insert(
        port,
        Port {
            owner: conn,
            remote,
            peer: Some((remote, remote_port)),
            recv: Arc::clone(&recv),
            send: Arc::clone(&send),
        },
    );
    st.domains
        .get_mut(&remote)
        .and_then(|r| r.ports.get_mut(&remote_port))
        .expect("checked above")
        .peer = Some((domid, port));
    Ok((Reply::Port { port }, vec![recv, send]))
}

fn signal(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

fn fire(d: &Domain, n: Notify, clear: impl FnOnce(u64)) {
    if n.action & UnmapNotify::CLEAR_BYTE != 0 {
        clear(n.offset);
    }
    if n.action & UnmapNotify::SEND_EVENT != 0 {
        if let Some(p) = d.ports.get(&n.port) {
            signal(&p.send);
        }
    }
}

fn clear_byte(file: &PageFile, offset: u64) {
    if let Err(e) = rustix::io::pwrite(&file.rw, &[0u8], offset) {
        tracing::warn!("unmap-notify: clearing byte {offset}: {e}");
    }
}

fn release_alloc(st: &mut State, domid: u16, handle: u64) {
    let Some(d) = st.domains.get_mut(&domid) else {
        return;
    };
    let Some(a) = d.allocs.remove(&handle) else {
        return;
    };
    for g in &a.grefs {
        d.grants.remove(g);
    }
    if let Some(n) = a.notify {
        fire(d, n, |off| clear_byte(&a.file, off));
    }
}

fn release_map(st: &mut State, domid: u16, handle: u64) {
    let Some(d) = st.domains.get_mut(&domid) else {
        return;
    };
    let Some(m) = d.maps.remove(&handle) else {
        return;
    };
    if let Some(n) = m.notify {
        fire(d, n, |off| {
            let (file, page) = &m.pages[(off / PAGE_SIZE as u64) as usize];
            clear_byte(
                file,
                *page as u64 * PAGE_SIZE as u64 + off % PAGE_SIZE as u64,
            );
        });
    }
}

fn unbind_port(st: &mut State, domid: u16, port: u32) {
    let Some(p) = st
        .domains
        .get_mut(&domid)
        .and_then(|d| d.ports.remove(&port))
    else {
        return;
    };
    // As in Xen, the peer's port falls back to "unbound, offered to us".
    if let Some((pd, pp)) = p.peer {
        if let Some(peer) = st.domains.get_mut(&pd).and_then(|d| d.ports.get_mut(&pp)) {
            peer.peer = None;
        }
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
        release_alloc(st, domid, h);
    }
    for h in maps {
        release_map(st, domid, h);
    }
    for p in ports {
        unbind_port(st, domid, p);
    }
    if let Some(d) = st.domains.get_mut(&domid) {
        d.conns.remove(&conn);
    }
}
