//! The host's sockets: accept on the control socket and each domain's hypercall and XenStore
//! sockets, admit the connecting process or refuse it (with the reason), and serve the
//! hypercall and control connections.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use super::super::peer;
use super::super::proto::{self, Control, ControlReply, Failure, Reply, Request};
use super::super::sock;
use super::super::wire::{self, Received};
use super::domains::{Adopted, Peer};
use super::{fail, release_conn, Host, EINVAL, EPERM, ESRCH};
use crate::types::DomId;

/// Which socket a connection came in on.
pub(super) enum Listening {
    Control,
    Hypercall(u16, OwnedFd),
    XenStore(u16, OwnedFd),
}

impl Host {
    /// Accept connections on the control socket or a domain's hypercall or XenStore socket.
    pub(super) fn accept_loop(self: Arc<Self>, on: Listening) {
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
