//! Domains: create, destroy (killing their processes), list; the processes adopted into a
//! domain, and which domain a process is in.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use super::super::peer;
use super::super::proto::{DomainInfo, Failure};
use super::super::sock;
use super::grants::FIRST_GREF;
use super::serve::Listening;
use super::{fail, release_conn, Domain, Host, EEXIST, EINVAL, ENOSPC, EPERM, ESRCH};
use crate::types::DomId;

/// An adopted process: its pid and start time, so a reused pid is not taken for it.
#[derive(Clone, Copy)]
pub(super) struct Adopted {
    pub(super) pid: u32,
    pub(super) started: u64,
}

impl Adopted {
    /// Whether the adopted process still runs (the pid was not reused by another).
    fn lives(&self) -> bool {
        peer::start_time(self.pid) == Some(self.started)
    }
}

/// Who connected, as far as the simulator's domains go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Peer {
    /// Not in any guest domain: the host's user (dom0, the toolstack, tests), trusted with
    /// every socket.
    Host { pid: u32 },
    /// A process of guest domain `domid`: it, or its nearest adopted ancestor, was adopted into
    /// the domain.
    Guest { pid: u32, domid: u16 },
}

/// A host that died leaves its domains' sockets behind; nobody serves them any more.
pub(super) fn remove_stale_domains(dir: &Path) {
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

impl Host {
    pub(super) fn create(self: &Arc<Self>, name: &str, max_grants: u32) -> Result<u16, Failure> {
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

    pub(super) fn create_domain(
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

    pub(super) fn destroy(&self, domid: u16) -> Result<(), Failure> {
        if domid == 0 {
            return Err(fail(
                EPERM,
                "domain 0 cannot be destroyed (stop the host instead)",
            ));
        }
        self.destroy_inner(domid, false)
    }

    pub(super) fn destroy_inner(&self, domid: u16, stopping: bool) -> Result<(), Failure> {
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

    pub(super) fn list(&self) -> Vec<DomainInfo> {
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

    pub(super) fn identify_pid(&self, pid: u32) -> Result<Peer, String> {
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

    /// May `caller` (a host process) put `pid` into domain `domid`? Only its own child or
    /// descendant, not the host or its ancestors, and not a process already in another domain.
    /// Returns the process's start time.
    pub(super) fn check_adopt(&self, caller: u32, domid: u16, pid: u32) -> Result<u64, Failure> {
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
