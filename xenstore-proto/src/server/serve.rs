//! Serving the store on Unix sockets: a tokio runtime owned by the [`Server`], the store behind
//! a mutex, one reader and one writer task per connection, and xenstored's bounds on what an
//! unprivileged domain can make the server hold: connections, outstanding requests (reading
//! pauses), queued output (watch events dropped past a byte budget or when stale).

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};

use super::store::{ConnId, Output, Store, DOMID_FIRST_RESERVED};
use super::Config;
use crate::wire::{FrameDecoder, MsgType, Packet};

/// Why the server could not do what the embedding code asked.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("cannot start the server runtime: {0}")]
    Runtime(io::Error),
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    #[error("domid {0} is not a real domain id")]
    BadDomid(u32),
    #[error("domain {domid} already has {max} connections open")]
    TooManyConnections { domid: u32, max: usize },
    #[error("the server has shut down")]
    Shutdown,
}

/// What one unprivileged domain has pending, over all its connections
/// ([`Server::domain_backlog`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DomainBacklog {
    /// Requests whose reply or caused watch events are not yet written out.
    pub outstanding: usize,
    /// Bytes of frames queued for its connections.
    pub queued_bytes: usize,
}

/// The embedded XenStore server. Cheap to clone: clones share one store. Dropping the last
/// clone shuts it down.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").finish_non_exhaustive()
    }
}

/// The serving bounds, from [`Config`].
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_queued: usize,
    max_conns: usize,
    max_outstanding: usize,
    max_bytes: usize,
    event_timeout: Duration,
}

struct Inner {
    shared: Mutex<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    limits: Limits,
}

struct Shared {
    store: Store,
    links: HashMap<ConnId, Link>,
    gates: HashMap<u32, Arc<Gate>>,
    down: bool,
}

/// One unprivileged domain's allowance: a permit per outstanding request, and the bytes
/// queued for all its connections.
struct Gate {
    outstanding: Arc<Semaphore>,
    bytes: AtomicUsize,
}

/// The socket side of one connection.
struct Link {
    tx: mpsc::UnboundedSender<Queued>,
    /// Frames queued (privileged connections' bound).
    queued: Arc<AtomicUsize>,
    /// The domain's allowance; `None` for dom0.
    gate: Option<Arc<Gate>>,
    kill_reader: Arc<Notify>,
    kill_writer: Arc<Notify>,
}

/// A frame waiting for the writer. Dropping it (written, stale, or its connection gone) gives
/// back what it was charged, and the outstanding-request permit of the request that caused it
/// once no other frame holds that.
struct Queued {
    frame: Vec<u8>,
    event: bool,
    at: Instant,
    _charge: Charge,
    _cause: Option<Arc<OwnedSemaphorePermit>>,
}

enum Charge {
    Frames(Arc<AtomicUsize>),
    Bytes(Arc<Gate>, usize),
}

/// What a queued frame is charged against; given back when dropped.
impl Drop for Charge {
    fn drop(&mut self) {
        match self {
            Charge::Frames(n) => n.fetch_sub(1, Ordering::Relaxed),
            Charge::Bytes(gate, len) => gate.bytes.fetch_sub(*len, Ordering::Relaxed),
        };
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.get_mut().ok().and_then(Option::take) {
            rt.shutdown_background();
        }
    }
}

fn is_event(frame: &[u8]) -> bool {
    Packet::new_checked(frame).is_ok_and(|p| p.msg_type() == Ok(MsgType::WatchEvent))
}

impl Shared {
    /// Queues what the store produced and closes what it closed. `cause` is the
    /// outstanding-request permit of the unprivileged request that produced `out`: every
    /// frame holds it until written or dropped.
    fn deliver(&mut self, out: Output, cause: Option<Arc<OwnedSemaphorePermit>>, limits: &Limits) {
        for (conn, frame) in out.messages {
            let Some(link) = self.links.get(&conn) else {
                continue;
            };
            let event = is_event(&frame);
            let charge = match &link.gate {
                None => {
                    if link.queued.fetch_add(1, Ordering::Relaxed) >= limits.max_queued {
                        link.queued.fetch_sub(1, Ordering::Relaxed);
                        tracing::warn!(conn, "client does not read its replies; dropping it");
                        self.store.close(conn);
                        self.drop_link(conn);
                        continue;
                    }
                    Charge::Frames(link.queued.clone())
                }
                Some(gate) => {
                    let len = frame.len();
                    let queued = gate.bytes.fetch_add(len, Ordering::Relaxed);
                    let charge = Charge::Bytes(gate.clone(), len);
                    if event && queued + len > limits.max_bytes {
                        // As xenstored past the hard memory quota: the event is not queued.
                        tracing::debug!(conn, "domain output budget full; watch event dropped");
                        drop(charge);
                        continue;
                    }
                    charge
                }
            };
            let _ = link.tx.send(Queued {
                frame,
                event,
                at: Instant::now(),
                _charge: charge,
                _cause: cause.clone(),
            });
        }
        for conn in out.closed {
            self.drop_link(conn);
        }
    }

    fn drop_link(&mut self, conn: ConnId) {
        if let Some(link) = self.links.remove(&conn) {
            link.kill_reader.notify_one();
            link.kill_writer.notify_one();
        }
    }
}

impl Server {
    /// A server with an empty store, running its own small tokio runtime.
    ///
    /// # Panics
    /// If the runtime cannot start (no threads available); see [`Server::try_new`].
    pub fn new(config: Config) -> Server {
        Server::try_new(config).expect("start the XenStore server runtime")
    }

    /// A server with an empty store, or why its runtime could not start.
    pub fn try_new(config: Config) -> Result<Server, ServerError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("vrdma-xenstored")
            .enable_io()
            .enable_time()
            .build()
            .map_err(ServerError::Runtime)?;
        let limits = Limits {
            max_queued: config.max_queued_messages,
            max_conns: config.max_domain_connections,
            max_outstanding: config.max_outstanding.max(1),
            max_bytes: config.max_domain_output_bytes,
            event_timeout: config.watch_event_timeout,
        };
        Ok(Server {
            inner: Arc::new(Inner {
                shared: Mutex::new(Shared {
                    store: Store::new(config),
                    links: HashMap::new(),
                    gates: HashMap::new(),
                    down: false,
                }),
                handle: runtime.handle().clone(),
                runtime: Mutex::new(Some(runtime)),
                limits,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.inner)
    }

    /// Runs `f` on the store (inspection, tests). Watch events it causes are not sent.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        f(&mut self.lock().store)
    }

    /// Serves the store on a Unix socket at `path`; every client of it speaks as `domid`
    /// (0: privileged). A stale socket file at `path` is replaced. Dropping or stopping the
    /// returned [`Listener`] stops accepting; connections already accepted go on.
    pub fn listen(&self, path: impl AsRef<Path>, domid: u32) -> Result<Listener, ServerError> {
        check_domid(domid)?;
        if self.lock().down {
            return Err(ServerError::Shutdown);
        }
        let path = path.as_ref().to_path_buf();
        let bind_err = |source| ServerError::Bind {
            path: path.clone(),
            source,
        };
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
            std::fs::remove_file(&path).map_err(bind_err)?;
        }
        let std_listener = std::os::unix::net::UnixListener::bind(&path).map_err(bind_err)?;
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let listener = {
            let _guard = self.inner.handle.enter();
            tokio::net::UnixListener::from_std(std_listener).map_err(bind_err)?
        };
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let inner = Arc::downgrade(&self.inner);
        let shown = path.display().to_string();
        tracing::info!(path = %shown, domid, "listening");
        self.inner.handle.spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            let Some(inner) = inner.upgrade() else { break };
                            if let Err(e) = serve(&inner, stream, domid) {
                                // The refused stream is dropped: the client sees it close.
                                tracing::warn!(path = %shown, error = %e, "connection refused");
                            }
                        }
                        Err(e) => {
                            tracing::warn!(path = %shown, error = %e, "accept failed");
                            tokio::task::yield_now().await;
                        }
                    }
                }
            }
            tracing::debug!(path = %shown, "listener stopped");
        });
        Ok(Listener {
            path,
            stop: Some(stop_tx),
        })
    }

    /// A new connection speaking as `domid`, for in-process clients.
    pub fn connect(&self, domid: u32) -> Result<std::os::unix::net::UnixStream, ServerError> {
        check_domid(domid)?;
        if self.lock().down {
            return Err(ServerError::Shutdown);
        }
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let stream = {
            let _guard = self.inner.handle.enter();
            tokio::net::UnixStream::from_std(ours)?
        };
        serve(&self.inner, stream, domid)?;
        Ok(theirs)
    }

    /// What unprivileged `domid` has pending: outstanding requests and queued output bytes
    /// (both bounded, see [`Config`]). Zero for dom0 and for a domain never connected.
    pub fn domain_backlog(&self, domid: u32) -> DomainBacklog {
        let shared = self.lock();
        match shared.gates.get(&domid) {
            Some(gate) => DomainBacklog {
                outstanding: self.inner.limits.max_outstanding
                    - gate.outstanding.available_permits(),
                queued_bytes: gate.bytes.load(Ordering::Relaxed),
            },
            None => DomainBacklog {
                outstanding: 0,
                queued_bytes: 0,
            },
        }
    }

    /// Serves a stream the embedding code accepted (and vetted) itself, as `domid`.
    pub fn serve_stream(
        &self,
        stream: std::os::unix::net::UnixStream,
        domid: u32,
    ) -> Result<(), ServerError> {
        check_domid(domid)?;
        if self.lock().down {
            return Err(ServerError::Shutdown);
        }
        stream.set_nonblocking(true)?;
        let stream = {
            let _guard = self.inner.handle.enter();
            tokio::net::UnixStream::from_std(stream)?
        };
        serve(&self.inner, stream, domid)
    }

    /// Marks `domid` introduced and fires `@introduceDomain` (as `INTRODUCE` does).
    pub fn introduce_domain(&self, domid: u32) -> Result<(), ServerError> {
        check_domid(domid)?;
        let mut shared = self.lock();
        let out = shared.store.introduce_domain(domid);
        shared.deliver(out, None, &self.inner.limits);
        Ok(())
    }

    /// Releases `domid` (as `RELEASE` or a domain's death): its connections close, the nodes it
    /// owns go (see [`Store::release_domain`]) and `@releaseDomain` fires.
    pub fn release_domain(&self, domid: u32) -> Result<(), ServerError> {
        check_domid(domid)?;
        let mut shared = self.lock();
        let out = shared.store.release_domain(domid);
        shared.deliver(out, None, &self.inner.limits);
        Ok(())
    }

    /// Closes every connection and stops the runtime (listeners stop with it). Idempotent.
    pub fn shutdown(&self) {
        {
            let mut shared = self.lock();
            shared.down = true;
            for conn in shared.store.conn_ids() {
                shared.store.close(conn);
                shared.drop_link(conn);
            }
        }
        let rt = self
            .inner
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(rt) = rt {
            rt.shutdown_background();
        }
        tracing::info!("server shut down");
    }
}

fn check_domid(domid: u32) -> Result<(), ServerError> {
    if domid < DOMID_FIRST_RESERVED {
        Ok(())
    } else {
        Err(ServerError::BadDomid(domid))
    }
}

fn lock(inner: &Inner) -> MutexGuard<'_, Shared> {
    // The store is left consistent between requests, so a panic elsewhere need not stop it.
    inner.shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves one accepted (or in-process) stream as `domid`, unless the domain is at its
/// connection limit.
fn serve(
    inner: &Arc<Inner>,
    stream: tokio::net::UnixStream,
    domid: u32,
) -> Result<(), ServerError> {
    let limits = inner.limits;
    let (tx, rx) = mpsc::unbounded_channel::<Queued>();
    let kill_reader = Arc::new(Notify::new());
    let kill_writer = Arc::new(Notify::new());
    let (id, gate) = {
        let mut shared = lock(inner);
        if shared.down {
            return Err(ServerError::Shutdown);
        }
        let gate = if domid == 0 {
            None
        } else {
            if shared.store.domain_conn_count(domid) >= limits.max_conns {
                return Err(ServerError::TooManyConnections {
                    domid,
                    max: limits.max_conns,
                });
            }
            let gate = shared.gates.entry(domid).or_insert_with(|| {
                Arc::new(Gate {
                    outstanding: Arc::new(Semaphore::new(limits.max_outstanding)),
                    bytes: AtomicUsize::new(0),
                })
            });
            Some(gate.clone())
        };
        let id = shared.store.open(domid);
        shared.links.insert(
            id,
            Link {
                tx,
                queued: Arc::new(AtomicUsize::new(0)),
                gate: gate.clone(),
                kill_reader: kill_reader.clone(),
                kill_writer: kill_writer.clone(),
            },
        );
        (id, gate)
    };
    let (mut rd, wr) = stream.into_split();
    let unprivileged = gate.is_some();
    inner
        .handle
        .spawn(write_loop(id, wr, rx, kill_writer, unprivileged, limits));
    let weak = Arc::downgrade(inner);
    inner.handle.spawn(async move {
        let mut buf = vec![0u8; 8192];
        let mut decoder = FrameDecoder::new();
        'conn: loop {
            let n = tokio::select! {
                _ = kill_reader.notified() => break,
                r = rd.read(&mut buf) => match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
            };
            decoder.push(&buf[..n]);
            loop {
                let frame = match decoder.next_frame() {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(e) => {
                        // An oversized message closes the connection, as xenstored does.
                        tracing::warn!(conn = id, error = %e, "closing connection");
                        break 'conn;
                    }
                };
                // An unprivileged domain waits here while it has too many requests
                // outstanding: its socket is not read meanwhile (xenstored stops reading the
                // ring).
                let cause = match &gate {
                    None => None,
                    Some(gate) => tokio::select! {
                        _ = kill_reader.notified() => break 'conn,
                        p = gate.outstanding.clone().acquire_owned() => match p {
                            Ok(p) => Some(Arc::new(p)),
                            Err(_) => break 'conn,
                        },
                    },
                };
                let Some(inner) = weak.upgrade() else {
                    break 'conn;
                };
                let mut shared = lock(&inner);
                if !shared.store.is_open(id) {
                    break 'conn;
                }
                let out = shared.store.handle(id, &frame);
                shared.deliver(out, cause, &inner.limits);
            }
        }
        if let Some(inner) = weak.upgrade() {
            let mut shared = lock(&inner);
            shared.store.close(id);
            shared.drop_link(id);
        }
    });
    Ok(())
}

/// What woke the writer.
enum Wake {
    Kill,
    Queued(Option<Queued>),
    Wrote(io::Result<usize>),
    Expiry,
}

/// The writer of one connection: sends queued frames in order. Watch events of an
/// unprivileged connection that wait longer than the timeout are dropped, even while a write
/// is stuck on a peer that does not read (as xenstored's timer): the requests that caused
/// them stop counting as outstanding for their domain, so a guest that never reads cannot
/// hold another domain's requests up for longer than that.
async fn write_loop(
    id: ConnId,
    mut wr: tokio::net::unix::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    kill: Arc<Notify>,
    unprivileged: bool,
    limits: Limits,
) {
    let timeout = limits.event_timeout;
    let stale = |q: &Queued| unprivileged && q.event && q.at.elapsed() >= timeout;
    let mut pending: std::collections::VecDeque<Queued> = std::collections::VecDeque::new();
    // The frame being written and how much of it is out (a partly written frame is finished).
    let mut current: Option<(Queued, usize)> = None;
    let mut open = true;
    loop {
        if current.is_none() {
            while let Some(q) = pending.pop_front() {
                if stale(&q) {
                    tracing::debug!(conn = id, "watch event timed out unsent; dropped");
                    continue;
                }
                current = Some((q, 0));
                break;
            }
        }
        if !open && current.is_none() {
            break;
        }
        // Events are queued in order, so the first waiting one expires first.
        let expiry = pending
            .iter()
            .find(|q| unprivileged && q.event)
            .map(|q| tokio::time::Instant::from_std(q.at + timeout));
        let wake = tokio::select! {
            _ = kill.notified() => Wake::Kill,
            q = rx.recv(), if open => Wake::Queued(q),
            r = async {
                match &current {
                    Some((q, off)) => wr.write(&q.frame[*off..]).await,
                    None => std::future::pending().await,
                }
            }, if current.is_some() => Wake::Wrote(r),
            () = async {
                match expiry {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            }, if expiry.is_some() => Wake::Expiry,
        };
        match wake {
            Wake::Kill => break,
            Wake::Queued(Some(q)) => pending.push_back(q),
            Wake::Queued(None) => open = false,
            Wake::Wrote(Ok(n)) if n > 0 => {
                if let Some((q, off)) = &mut current {
                    *off += n;
                    if *off >= q.frame.len() {
                        current = None;
                    }
                }
            }
            Wake::Wrote(_) => break,
            Wake::Expiry => pending.retain(|q| {
                let keep = !stale(q);
                if !keep {
                    tracing::debug!(conn = id, "watch event timed out unsent; dropped");
                }
                keep
            }),
        }
    }
    // Whatever is still queued is dropped here, giving back its charges.
    drop(pending);
    drop(current);
    let _ = wr.shutdown().await;
}

/// A socket the server listens on. Dropping it stops the listener and removes the socket file.
#[derive(Debug)]
pub struct Listener {
    path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
}

impl Listener {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting connections and removes the socket file.
    pub fn stop(self) {}
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
