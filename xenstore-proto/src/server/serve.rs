//! Serving the store on Unix sockets: a tokio runtime owned by the [`Server`], the store behind
//! a mutex, one reader and one writer task per connection.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Notify};

use super::store::{ConnId, Output, Store, DOMID_FIRST_RESERVED};
use super::Config;

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
    #[error("the server has shut down")]
    Shutdown,
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

struct Inner {
    shared: Mutex<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    max_queued: usize,
}

struct Shared {
    store: Store,
    links: HashMap<ConnId, Link>,
    down: bool,
}

/// The socket side of one connection.
struct Link {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    queued: Arc<AtomicUsize>,
    kill: Arc<Notify>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.get_mut().ok().and_then(Option::take) {
            rt.shutdown_background();
        }
    }
}

impl Shared {
    /// Queues what the store produced and closes what it closed.
    fn deliver(&mut self, out: Output, max_queued: usize) {
        for (conn, frame) in out.messages {
            let Some(link) = self.links.get(&conn) else {
                continue;
            };
            if link.queued.fetch_add(1, Ordering::Relaxed) >= max_queued {
                tracing::warn!(conn, "client does not read its replies; dropping it");
                self.store.close(conn);
                self.drop_link(conn);
                continue;
            }
            if link.tx.send(frame).is_err() {
                link.queued.fetch_sub(1, Ordering::Relaxed);
            }
        }
        for conn in out.closed {
            self.drop_link(conn);
        }
    }

    fn drop_link(&mut self, conn: ConnId) {
        if let Some(link) = self.links.remove(&conn) {
            link.kill.notify_one();
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
            .build()
            .map_err(ServerError::Runtime)?;
        let max_queued = config.max_queued_messages;
        Ok(Server {
            inner: Arc::new(Inner {
                shared: Mutex::new(Shared {
                    store: Store::new(config),
                    links: HashMap::new(),
                    down: false,
                }),
                handle: runtime.handle().clone(),
                runtime: Mutex::new(Some(runtime)),
                max_queued,
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
                            serve(&inner, stream, domid);
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
        serve(&self.inner, stream, domid);
        Ok(theirs)
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
        serve(&self.inner, stream, domid);
        Ok(())
    }

    /// Marks `domid` introduced and fires `@introduceDomain` (as `INTRODUCE` does).
    pub fn introduce_domain(&self, domid: u32) -> Result<(), ServerError> {
        check_domid(domid)?;
        let mut shared = self.lock();
        let out = shared.store.introduce_domain(domid);
        shared.deliver(out, self.inner.max_queued);
        Ok(())
    }

    /// Releases `domid` (as `RELEASE` or a domain's death): its connections close, the nodes it
    /// owns go (see [`Store::release_domain`]) and `@releaseDomain` fires.
    pub fn release_domain(&self, domid: u32) -> Result<(), ServerError> {
        check_domid(domid)?;
        let mut shared = self.lock();
        let out = shared.store.release_domain(domid);
        shared.deliver(out, self.inner.max_queued);
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

/// Serves one accepted (or in-process) stream as `domid`.
fn serve(inner: &Arc<Inner>, stream: tokio::net::UnixStream, domid: u32) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let queued = Arc::new(AtomicUsize::new(0));
    let kill = Arc::new(Notify::new());
    let id = {
        let mut shared = lock(inner);
        if shared.down {
            return;
        }
        let id = shared.store.open(domid);
        shared.links.insert(
            id,
            Link {
                tx,
                queued: queued.clone(),
                kill: kill.clone(),
            },
        );
        id
    };
    let (mut rd, mut wr) = stream.into_split();
    inner.handle.spawn(async move {
        while let Some(frame) = rx.recv().await {
            queued.fetch_sub(1, Ordering::Relaxed);
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let weak = Arc::downgrade(inner);
    inner.handle.spawn(async move {
        let mut buf = vec![0u8; 8192];
        loop {
            let n = tokio::select! {
                _ = kill.notified() => break,
                r = rd.read(&mut buf) => match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
            };
            let Some(inner) = weak.upgrade() else { break };
            let mut shared = lock(&inner);
            if !shared.store.is_open(id) {
                break;
            }
            let out = shared.store.feed(id, &buf[..n]);
            shared.deliver(out, inner.max_queued);
        }
        if let Some(inner) = weak.upgrade() {
            let mut shared = lock(&inner);
            shared.store.close(id);
            shared.drop_link(id);
        }
    });
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
