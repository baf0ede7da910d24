//! Event channels: a port offered to one domain (unbound), bound by it, unbound; each side's
//! pair of eventfds is what the kernel's evtchn device would signal.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::super::proto::{Failure, Reply};
use super::{fail, io_fail, Domain, State, EINVAL, ENOSPC, ESRCH};
use crate::types::DomId;

pub(super) struct Port {
    pub(super) owner: u64,
    pub(super) remote: u16,
    pub(super) peer: Option<(u16, u32)>,
    pub(super) recv: Arc<OwnedFd>,
    pub(super) send: Arc<OwnedFd>,
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

/// `EvtchnAllocUnbound`: a fresh port offered to `remote`.
pub(super) fn alloc_unbound(
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

/// `EvtchnBind`: a fresh port connected to `remote`'s port offered to us.
pub(super) fn bind(
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

/// Raises the event on one side of a channel: as on Xen, nothing new while that side has an
/// event it has not consumed (its port is masked; see [`masked`]).
pub(super) fn signal(fd: &OwnedFd) {
    if !masked(fd) {
        let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
    }
}

/// Whether the receiving side of eventfd `fd` has an event it has not consumed. On Xen,
/// `/dev/xen/evtchn` masks a port when it delivers its event and unmasks it only when the
/// reader writes the port back (consumes it); a notification meanwhile only sets the pending
/// bit and raises no new interrupt, so an edge-triggered poller hears nothing new until the
/// event is consumed. The simulated host does the same: the sender leaves a readable eventfd
/// alone (the unconsumed event already stands for the new one; Xen delivers that pending bit
/// once more on unmask, which this model does not: readers consume before they look, as the
/// platform's contract says).
pub(crate) fn masked(fd: &impl std::os::fd::AsFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0].revents().contains(PollFlags::IN)
}

/// `EvtchnUnbind`: close a port this connection bound.
pub(super) fn unbind(st: &mut State, domid: u16, conn: u64, port: u32) -> Result<Reply, Failure> {
    match st.domains.get(&domid).and_then(|d| d.ports.get(&port)) {
        Some(p) if p.owner == conn => {
            unbind_port(st, domid, port);
            Ok(Reply::Done)
        }
        _ => Err(fail(
            EINVAL,
            format!("port {port} is not bound by this process"),
        )),
    }
}

/// Closes a port; its peer falls back to unbound.
pub(super) fn unbind_port(st: &mut State, domid: u16, port: u32) {
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
