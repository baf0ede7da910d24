//! iWARP connection setup over TCP: one thread per device serves every TCP listener and every
//! MPA handshake in progress, nonblocking (mio), each with a deadline, and sleeps in `poll`
//! with no timeout when nothing is in progress.
//!
//! The device drives it with [`Cmd`]s and hears from it through [`CmSink::upcall`]. A
//! handshake that completes becomes an [`Established`] (the socket deregistered, blocking,
//! `TCP_NODELAY`, nothing read past the MPA frame), which the device hands to the data path.
//!
//! MPA policy (RFC 5044 §7.1, RFC 6581):
//! * requests are revision 2, enhanced, with this end's IRD/ORD, peer-to-peer, offering a
//!   zero-length RDMA Write or Read as RTR; a reply must be revision 2 and enhanced, and if
//!   it takes the peer-to-peer mode it must choose Write or Read;
//! * requests of revision 1 or 2, enhanced or not, are accepted; the reply has the request's
//!   revision; for a peer-to-peer request the responder chooses Write if offered, else Read,
//!   else Write (as siw);
//! * markers are never used: a request with M set gets a reply with R set (reject) and the
//!   connection is closed; a reply with M set fails the connect;
//! * CRC: the reply's C bit decides for both directions (the responder must set it if the
//!   request did). [`CrcPolicy`] says what this end asks for and accepts.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use iwarp_proto::mpa::{FrameKind, IrdOrd, MpaRepr, HEADER_LEN, MAX_PD_LEN};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::{Established, Role, Rtr};
use crate::device::objects::lock;
use crate::device::{CmInfo, MAX_PRIVATE_DATA};

/// A TCP connection of the connection manager (unique per device).
pub(crate) type ConnId = u64;

/// Whether MPA FPDUs carry CRC32c.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CrcPolicy {
    /// Ask for CRC when connecting; as responder, do what the request asks. A peer that
    /// declines (a reply without C, siw's default) is accepted without CRC.
    #[default]
    Offer,
    /// Ask for CRC, and as responder set C whatever the request says (RFC 5044: then both
    /// use it); a reply without C fails the connect.
    Require,
    /// Do not ask for CRC; use it if the peer asks (RFC 5044 says it MUST be honoured).
    Decline,
}

/// What the engine negotiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MpaPolicy {
    pub crc: CrcPolicy,
    /// RDMA Reads this end accepts outstanding, and wants outstanding (at most 14 bits).
    pub max_ird: u16,
    pub max_ord: u16,
    /// Deadline of a TCP connect + MPA exchange, of an incoming request and of a reply.
    pub timeout: Duration,
    /// What the data path's keepalive and user timeout are derived from (handed over in
    /// [`Established::peer_probe`]).
    pub peer_probe: Duration,
}

/// What the engine reports.
#[derive(Debug)]
pub(crate) enum Upcall {
    /// A valid MPA request arrived at listener `listener`; answer with [`Cmd::Accept`] or
    /// [`Cmd::Reject`].
    Request {
        listener: u32,
        conn: ConnId,
        info: CmInfo,
    },
    /// The handshake of `conn` (a connect, or an accepted request) completed.
    Established { conn: ConnId, est: Established },
    /// The peer rejected the connect (an MPA reply with R, or TCP refused the connection).
    Rejected { conn: ConnId, private_data: Vec<u8> },
    /// `conn` is gone without an answer: timeout, reset, protocol error; for a request
    /// waiting for the device, the peer went away.
    Failed { conn: ConnId, why: &'static str },
}

/// Receives the engine's reports (called on the engine thread, no engine lock held).
pub(crate) trait CmSink: Send + Sync {
    fn upcall(&self, u: Upcall);
}

/// What the device asks the engine to do.
#[derive(Debug)]
pub(crate) enum Cmd {
    /// Serve these (nonblocking) listening sockets as listener `id`.
    Listen {
        id: u32,
        sockets: Vec<TcpListener>,
    },
    /// Close them; handshakes that did not reach the device yet are dropped. `done` hears
    /// when the sockets are closed (the port is free again).
    CloseListener {
        id: u32,
        done: std::sync::mpsc::Sender<()>,
    },
    Connect {
        conn: ConnId,
        src: IpAddr,
        peer: SocketAddr,
        private_data: Vec<u8>,
    },
    Accept {
        conn: ConnId,
        private_data: Vec<u8>,
    },
    Reject {
        conn: ConnId,
        private_data: Vec<u8>,
    },
    /// Close the connection, no report.
    Abort {
        conn: ConnId,
    },
}

const WAKE: Token = Token(usize::MAX);
/// Listener socket tokens start here; connection tokens are their `ConnId`s (below).
const LISTENER_BASE: usize = 1 << 62;

struct Shared {
    cmds: Mutex<VecDeque<Option<Cmd>>>,
    waker: Waker,
    next_conn: AtomicU64,
}

/// The engine thread.
pub(crate) struct TcpCm {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: Option<ThreadId>,
}

impl TcpCm {
    pub(crate) fn start(policy: MpaPolicy, sink: Arc<dyn CmSink>) -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKE)?;
        let shared = Arc::new(Shared {
            cmds: Mutex::new(VecDeque::new()),
            waker,
            next_conn: AtomicU64::new(1),
        });
        let mut engine = Engine {
            poll,
            shared: shared.clone(),
            sink,
            policy,
            listeners: HashMap::new(),
            next_listener_token: LISTENER_BASE,
            conns: HashMap::new(),
        };
        let thread = std::thread::Builder::new()
            .name("vrdma-cm".into())
            .spawn(move || engine.run())?;
        let thread_id = Some(thread.thread().id());
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
            thread_id,
        })
    }

    /// A fresh connection id.
    pub(crate) fn next_conn(&self) -> ConnId {
        self.shared.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn send(&self, cmd: Cmd) {
        lock(&self.shared.cmds).push_back(Some(cmd));
        if let Err(e) = self.shared.waker.wake() {
            tracing::warn!("connection manager wake failed: {e}");
        }
    }

    /// Stops the thread (idempotent; from the thread itself it only asks).
    pub(crate) fn stop(&self) {
        lock(&self.shared.cmds).push_back(None);
        let _ = self.shared.waker.wake();
        if Some(std::thread::current().id()) == self.thread_id {
            return;
        }
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for TcpCm {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The request fields the reply depends on.
#[derive(Debug, Clone, Copy)]
struct ReqParams {
    revision: u8,
    crc: bool,
    ird_ord: Option<IrdOrd>,
}

enum State {
    /// Initiator: TCP connect in progress; then the request goes out.
    Connecting { request: Vec<u8> },
    /// Initiator: the request is (being) sent; waiting for the reply.
    AwaitReply,
    /// Responder: waiting for the request.
    AwaitRequest { listener: u32 },
    /// Responder: the device decides.
    AwaitAnswer { req: ReqParams },
    /// Responder: the reply is being sent; then the connection is established.
    Replying { est: EstParams },
    /// A reject is being sent; then the connection closes.
    Closing,
}

#[derive(Debug, Clone)]
struct EstParams {
    role: Role,
    crc: bool,
    ird: u16,
    ord: u16,
    rtr: Rtr,
    peer_private: Vec<u8>,
}

struct Conn {
    stream: TcpStream,
    state: State,
    deadline: Option<Instant>,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
}

enum Step {
    Pending,
    /// Close the connection; report if there is something to say.
    Close(Option<Upcall>),
    /// A request for the device (the connection waits).
    Request(Upcall),
    Established(EstParams),
}

struct Engine {
    poll: Poll,
    shared: Arc<Shared>,
    sink: Arc<dyn CmSink>,
    policy: MpaPolicy,
    /// token → (listener id, socket)
    listeners: HashMap<usize, (u32, TcpListener)>,
    next_listener_token: usize,
    conns: HashMap<ConnId, Conn>,
}

fn is_in_progress(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(115) // EINPROGRESS
}

impl Engine {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let now = Instant::now();
            let timeout = self
                .conns
                .values()
                .filter_map(|c| c.deadline)
                .min()
                .map(|d| d.saturating_duration_since(now));
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("connection manager poll failed: {e}");
                    return;
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKE => {}
                    Token(t) if t >= LISTENER_BASE => self.accept(t),
                    Token(t) => self.drive(t as ConnId),
                }
            }
            if !self.commands() {
                return;
            }
            self.expire();
        }
    }

    /// Runs queued commands; `false` when asked to stop.
    fn commands(&mut self) -> bool {
        loop {
            let Some(cmd) = lock(&self.shared.cmds).pop_front() else {
                return true;
            };
            let Some(cmd) = cmd else { return false };
            self.command(cmd);
        }
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Listen { id, sockets } => {
                for s in sockets {
                    let token = self.next_listener_token;
                    self.next_listener_token += 1;
                    let fd = s.as_raw_fd();
                    match self.poll.registry().register(
                        &mut SourceFd(&fd),
                        Token(token),
                        Interest::READABLE,
                    ) {
                        Ok(()) => {
                            self.listeners.insert(token, (id, s));
                            self.accept(token);
                        }
                        Err(e) => tracing::warn!(listener = id, "cannot serve listener: {e}"),
                    }
                }
            }
            Cmd::CloseListener { id, done } => {
                let tokens: Vec<usize> = self
                    .listeners
                    .iter()
                    .filter(|(_, (l, _))| *l == id)
                    .map(|(t, _)| *t)
                    .collect();
                for t in tokens {
                    if let Some((_, s)) = self.listeners.remove(&t) {
                        let _ = self
                            .poll
                            .registry()
                            .deregister(&mut SourceFd(&s.as_raw_fd()));
                    }
                }
                let waiting: Vec<ConnId> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| matches!(c.state, State::AwaitRequest { listener } if listener == id))
                    .map(|(k, _)| *k)
                    .collect();
                for k in waiting {
                    self.close(k);
                }
                let _ = done.send(());
            }
            Cmd::Connect {
                conn,
                src,
                peer,
                private_data,
            } => self.connect(conn, src, peer, &private_data),
            Cmd::Accept { conn, private_data } => {
                let policy = self.policy;
                let Some(c) = self.conns.get_mut(&conn) else {
                    return self.report(Upcall::Failed {
                        conn,
                        why: "the peer went away",
                    });
                };
                let State::AwaitAnswer { req } = c.state else {
                    return;
                };
                let (frame, est) = reply(&policy, &req, &private_data, c.inbuf_private());
                c.out = frame;
                c.sent = 0;
                c.state = State::Replying { est };
                c.deadline = Some(Instant::now() + policy.timeout);
                self.drive(conn);
            }
            Cmd::Reject { conn, private_data } => {
                let Some(c) = self.conns.get_mut(&conn) else {
                    return;
                };
                let State::AwaitAnswer { req } = c.state else {
                    return;
                };
                c.out = reject_frame(&req, &private_data);
                c.sent = 0;
                c.state = State::Closing;
                c.deadline = Some(Instant::now() + self.policy.timeout);
                self.drive(conn);
            }
            Cmd::Abort { conn } => {
                self.close(conn);
            }
        }
    }

    fn report(&self, u: Upcall) {
        self.sink.upcall(u);
    }

    fn register(&mut self, conn: ConnId, c: Conn) -> bool {
        let fd = c.stream.as_raw_fd();
        if let Err(e) = self.poll.registry().register(
            &mut SourceFd(&fd),
            Token(conn as usize),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!(conn, "cannot register connection: {e}");
            return false;
        }
        self.conns.insert(conn, c);
        true
    }

    fn connect(&mut self, conn: ConnId, src: IpAddr, peer: SocketAddr, pd: &[u8]) {
        let request = MpaRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: self.policy.crc != CrcPolicy::Decline,
            reject: false,
            revision: 2,
            ird_ord: Some(IrdOrd {
                ird: self.policy.max_ird,
                ord: self.policy.max_ord,
                p2p: true,
                rtr_b: false,
                rtr_write: true,
                rtr_read: true,
            }),
            private_data: pd,
        }
        .to_vec();
        let open = || -> io::Result<TcpStream> {
            use socket2::{Domain, Protocol, SockAddr, Socket, Type};
            let s = Socket::new(Domain::for_address(peer), Type::STREAM, Some(Protocol::TCP))?;
            s.set_nonblocking(true)?;
            s.set_tcp_nodelay(true)?;
            s.bind(&SockAddr::from(SocketAddr::new(src, 0)))?;
            match s.connect(&SockAddr::from(peer)) {
                Ok(()) => {}
                Err(e) if is_in_progress(&e) => {}
                Err(e) => return Err(e),
            }
            Ok(s.into())
        };
        let stream = match (request, open()) {
            (Ok(r), Ok(s)) => (r, s),
            (Err(e), _) => {
                tracing::debug!(conn, "connect: {e}");
                return self.report(Upcall::Failed {
                    conn,
                    why: "private data too long",
                });
            }
            (_, Err(e)) => {
                tracing::debug!(conn, %peer, "connect: {e}");
                return self.report(refused_or_failed(conn, &e));
            }
        };
        let c = Conn {
            stream: stream.1,
            state: State::Connecting { request: stream.0 },
            deadline: Some(Instant::now() + self.policy.timeout),
            inbuf: Vec::new(),
            out: Vec::new(),
            sent: 0,
        };
        if !self.register(conn, c) {
            return self.report(Upcall::Failed {
                conn,
                why: "cannot register the socket",
            });
        }
        self.drive(conn);
    }

    fn accept(&mut self, token: usize) {
        loop {
            let Some((id, l)) = self.listeners.get(&token) else {
                return;
            };
            let id = *id;
            let stream = match l.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ECONNABORTED and friends: that connection is gone, the listener is fine;
                    // EMFILE: try again on the next event.
                    tracing::debug!(listener = id, "accept: {e}");
                    if e.kind() == io::ErrorKind::ConnectionAborted {
                        continue;
                    }
                    return;
                }
            };
            if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
                continue;
            }
            let conn = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
            let c = Conn {
                stream,
                state: State::AwaitRequest { listener: id },
                deadline: Some(Instant::now() + self.policy.timeout),
                inbuf: Vec::new(),
                out: Vec::new(),
                sent: 0,
            };
            if self.register(conn, c) {
                self.drive(conn);
            }
        }
    }

    fn close(&mut self, conn: ConnId) -> Option<Conn> {
        let c = self.conns.remove(&conn)?;
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&c.stream.as_raw_fd()));
        Some(c)
    }

    fn expire(&mut self) {
        let now = Instant::now();
        let late: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for k in late {
            let Some(c) = self.close(k) else { continue };
            // Initiators and accepted requests are known to the device; a responder that
            // waited for a request is not.
            match c.state {
                State::Connecting { .. } | State::AwaitReply | State::Replying { .. } => self
                    .report(Upcall::Failed {
                        conn: k,
                        why: "timeout",
                    }),
                State::AwaitRequest { .. } | State::Closing | State::AwaitAnswer { .. } => {}
            }
        }
    }

    fn drive(&mut self, conn: ConnId) {
        let policy = self.policy;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let step = c.step(conn, &policy);
        match step {
            Step::Pending => {}
            Step::Request(u) => self.report(u),
            Step::Close(u) => {
                self.close(conn);
                if let Some(u) = u {
                    self.report(u);
                }
            }
            Step::Established(p) => {
                let Some(c) = self.close(conn) else { return };
                match c.into_established(p, self.policy.peer_probe) {
                    Ok(est) => self.report(Upcall::Established { conn, est }),
                    Err(e) => {
                        tracing::debug!(conn, "handing over the stream: {e}");
                        self.report(Upcall::Failed {
                            conn,
                            why: "socket error",
                        })
                    }
                }
            }
        }
    }
}

fn refused_or_failed(conn: ConnId, e: &io::Error) -> Upcall {
    if e.kind() == io::ErrorKind::ConnectionRefused {
        Upcall::Rejected {
            conn,
            private_data: Vec::new(),
        }
    } else {
        Upcall::Failed {
            conn,
            why: "TCP connect failed",
        }
    }
}

/// The reply that accepts `req`, and what the connection then is.
fn reply(policy: &MpaPolicy, req: &ReqParams, pd: &[u8], peer_pd: Vec<u8>) -> (Vec<u8>, EstParams) {
    let crc = req.crc || policy.crc == CrcPolicy::Require;
    let (word, ird, ord, rtr) = match req.ird_ord {
        Some(w) => {
            let ird = w.ord.min(policy.max_ird);
            let ord = w.ird.min(policy.max_ord);
            let rtr = if !w.p2p {
                Rtr::None
            } else if w.rtr_write || !w.rtr_read {
                Rtr::Write
            } else {
                Rtr::Read
            };
            let word = IrdOrd {
                ird,
                ord,
                p2p: w.p2p,
                rtr_b: false,
                rtr_write: rtr == Rtr::Write,
                rtr_read: rtr == Rtr::Read,
            };
            (Some(word), ird, ord, rtr)
        }
        None => (None, policy.max_ird, policy.max_ord, Rtr::None),
    };
    let frame = MpaRepr {
        kind: FrameKind::Reply,
        markers: false,
        crc,
        reject: false,
        revision: req.revision,
        ird_ord: word,
        private_data: pd,
    }
    .to_vec()
    // The device checked the length (at most MAX_PRIVATE_DATA + 4 < 512).
    .unwrap_or_default();
    (
        frame,
        EstParams {
            role: Role::Responder,
            crc,
            ird,
            ord,
            rtr,
            peer_private: peer_pd,
        },
    )
}

fn reject_frame(req: &ReqParams, pd: &[u8]) -> Vec<u8> {
    let pd = &pd[..pd.len().min(MAX_PRIVATE_DATA)];
    MpaRepr {
        kind: FrameKind::Reply,
        markers: false,
        crc: req.crc,
        reject: true,
        revision: req.revision,
        ird_ord: req.ird_ord.map(|_| IrdOrd::default()),
        private_data: pd,
    }
    .to_vec()
    .unwrap_or_default()
}

impl Conn {
    /// The private data of the frame in `inbuf` (after the IRD/ORD word).
    fn inbuf_private(&self) -> Vec<u8> {
        MpaRepr::from_bytes(&self.inbuf)
            .map(|r| r.private_data.to_vec())
            .unwrap_or_default()
    }

    fn into_established(self, p: EstParams, peer_probe: Duration) -> io::Result<Established> {
        let stream = self.stream;
        stream.set_nonblocking(false)?;
        let local = stream.local_addr()?;
        let peer = stream.peer_addr()?;
        Ok(Established {
            stream,
            role: p.role,
            crc: p.crc,
            ird: p.ird,
            ord: p.ord,
            rtr: p.rtr,
            local,
            peer,
            peer_private: p.peer_private,
            peer_probe,
        })
    }

    /// Writes what is left of `out`: `Ok(true)` when all of it is out.
    fn flush(&mut self) -> io::Result<bool> {
        while self.sent < self.out.len() {
            match self.stream.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads up to the end of one MPA frame (never past it): `Ok(true)` when `inbuf` holds
    /// it whole.
    fn read_frame(&mut self) -> io::Result<bool> {
        loop {
            let need = if self.inbuf.len() < HEADER_LEN {
                HEADER_LEN
            } else {
                let pd = usize::from(u16::from_be_bytes([self.inbuf[18], self.inbuf[19]]));
                if pd > MAX_PD_LEN {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "MPA private data over 512 bytes",
                    ));
                }
                HEADER_LEN + pd
            };
            if self.inbuf.len() >= need {
                return Ok(true);
            }
            let have = self.inbuf.len();
            self.inbuf.resize(need, 0);
            match self.stream.read(&mut self.inbuf[have..need]) {
                Ok(0) => {
                    self.inbuf.truncate(have);
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                Ok(n) => self.inbuf.truncate(have + n),
                Err(e) => {
                    self.inbuf.truncate(have);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(false),
                        io::ErrorKind::Interrupted => {}
                        _ => return Err(e),
                    }
                }
            }
        }
    }

    fn step(&mut self, conn: ConnId, policy: &MpaPolicy) -> Step {
        let fail = |why| Step::Close(Some(Upcall::Failed { conn, why }));
        if let State::Connecting { request } = &mut self.state {
            if let Ok(Some(e)) | Err(e) = self.stream.take_error() {
                tracing::debug!(conn, "connect: {e}");
                return Step::Close(Some(refused_or_failed(conn, &e)));
            }
            match self.stream.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return Step::Pending,
                Err(e) => return Step::Close(Some(refused_or_failed(conn, &e))),
            }
            self.out = std::mem::take(request);
            self.sent = 0;
            self.state = State::AwaitReply;
        }
        match self.flush() {
            Ok(true) => {}
            Ok(false) => return Step::Pending,
            Err(e) => {
                tracing::debug!(conn, "send: {e}");
                return match self.state {
                    State::AwaitReply | State::Replying { .. } => fail("reset during setup"),
                    _ => Step::Close(None),
                };
            }
        }
        match &self.state {
            State::Connecting { .. } => Step::Pending,
            State::Closing => Step::Close(None),
            State::Replying { est } => Step::Established(est.clone()),
            State::AwaitAnswer { .. } => {
                // The peer must wait for the reply: data or EOF now is the end.
                let mut b = [0u8; 1];
                match self.stream.peek(&mut b) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Step::Pending,
                    _ => fail("the peer went away"),
                }
            }
            State::AwaitReply => match self.read_frame() {
                Ok(false) => Step::Pending,
                Err(e) => {
                    tracing::debug!(conn, "MPA reply: {e}");
                    fail("no valid MPA reply")
                }
                Ok(true) => self.on_reply(conn, policy),
            },
            State::AwaitRequest { listener } => {
                let listener = *listener;
                match self.read_frame() {
                    Ok(false) => Step::Pending,
                    Err(e) => {
                        tracing::debug!(conn, "MPA request: {e}");
                        Step::Close(None)
                    }
                    Ok(true) => self.on_request(conn, listener),
                }
            }
        }
    }

    fn on_reply(&mut self, conn: ConnId, policy: &MpaPolicy) -> Step {
        let fail = |why| Step::Close(Some(Upcall::Failed { conn, why }));
        let r = match MpaRepr::from_bytes(&self.inbuf) {
            Ok(r) if r.kind == FrameKind::Reply => r,
            Ok(_) => return fail("MPA request where a reply was due"),
            Err(e) => {
                tracing::debug!(conn, "MPA reply: {e}");
                return fail("malformed MPA reply");
            }
        };
        if r.reject {
            let pd = &r.private_data[..r.private_data.len().min(MAX_PRIVATE_DATA)];
            return Step::Close(Some(Upcall::Rejected {
                conn,
                private_data: pd.to_vec(),
            }));
        }
        if r.markers {
            return fail("the peer wants markers");
        }
        if r.revision != 2 {
            return fail("MPA reply is not revision 2");
        }
        let Some(w) = r.ird_ord else {
            return fail("MPA reply is not enhanced");
        };
        if policy.crc == CrcPolicy::Require && !r.crc {
            return fail("the peer declines CRC");
        }
        if r.private_data.len() > MAX_PRIVATE_DATA {
            return fail("reply private data too long");
        }
        if w.ord > policy.max_ird {
            return fail("the peer's ORD exceeds this end's IRD");
        }
        let rtr = match (w.p2p, w.rtr_write, w.rtr_read) {
            (false, _, _) => Rtr::None,
            (true, true, false) => Rtr::Write,
            (true, false, true) => Rtr::Read,
            _ => return fail("no single RTR chosen"),
        };
        Step::Established(EstParams {
            role: Role::Initiator,
            crc: r.crc,
            ird: w.ord,
            ord: policy.max_ord.min(w.ird),
            rtr,
            peer_private: r.private_data.to_vec(),
        })
    }

    fn on_request(&mut self, conn: ConnId, listener: u32) -> Step {
        let r = match MpaRepr::from_bytes(&self.inbuf) {
            Ok(r) if r.kind == FrameKind::Request => r,
            _ => return Step::Close(None),
        };
        let req = ReqParams {
            revision: r.revision,
            crc: r.crc,
            ird_ord: r.ird_ord,
        };
        let refuse = |me: &mut Self, why: &str, req: ReqParams| {
            tracing::debug!(conn, "MPA request refused: {why}");
            me.out = reject_frame(&req, &[]);
            me.sent = 0;
            me.state = State::Closing;
            match me.flush() {
                Ok(false) => Step::Pending,
                _ => Step::Close(None),
            }
        };
        if r.markers {
            // The initiator wants markers, which this end never sends: MPA reject (R=1, M=0),
            // as siw answers it.
            return refuse(self, "markers", req);
        }
        if !(1..=2).contains(&r.revision) || (r.revision == 1 && r.ird_ord.is_some()) {
            return refuse(self, "revision", ReqParams { revision: 2, ..req });
        }
        if r.private_data.len() > MAX_PRIVATE_DATA {
            return refuse(self, "private data too long", req);
        }
        let (local, peer) = match (self.stream.local_addr(), self.stream.peer_addr()) {
            (Ok(l), Ok(p)) => (l, p),
            _ => return Step::Close(None),
        };
        let w = r.ird_ord.unwrap_or_default();
        let info = CmInfo {
            local,
            peer,
            private_data: r.private_data.to_vec(),
            ird: w.ird,
            ord: w.ord,
        };
        self.state = State::AwaitAnswer { req };
        self.deadline = None;
        Step::Request(Upcall::Request {
            listener,
            conn,
            info,
        })
    }
}
