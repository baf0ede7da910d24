//! The tokio client: every operation is an `async fn`, any number may be in flight at once
//! over one connection (from any number of tasks); replies are matched by `req_id`.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::demux::{Demux, PendingGuard};
use super::ops::{self, decode, shape};
use super::transport::{self, BoxRead, BoxWrite};
use super::watch::AsyncWatch;
use super::{driver, Error, Result, RetryPolicy};
use crate::wire::{MsgType, Perms, QuotaReply, Request, Response, XsErrno};

/// Prefix of the watch tokens this client generates.
const TOKEN_PREFIX: &str = "vrdma-w";
/// `DIRECTORY_PART` listings restarted because the node changed, before giving up with EAGAIN.
const MAX_DIRECTORY_RESTARTS: u32 = 64;

struct Inner {
    demux: Arc<Demux>,
    queue: mpsc::UnboundedSender<Vec<u8>>,
}

/// A XenStore connection for tokio code. Cheap to clone; clones share the connection.
///
/// Constructors that take a socket or device must run inside a tokio runtime (they start the
/// connection task on it).
#[derive(Clone)]
pub struct AsyncClient {
    inner: Arc<Inner>,
    retry: RetryPolicy,
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClient")
            .field("lost", &self.inner.demux.lost_reason())
            .field("retry", &self.retry)
            .finish()
    }
}

impl AsyncClient {
    fn start(reader: BoxRead, writer: BoxWrite) -> AsyncClient {
        let demux = Arc::new(Demux::default());
        let queue = driver::spawn(reader, writer, demux.clone());
        AsyncClient {
            inner: Arc::new(Inner { demux, queue }),
            retry: RetryPolicy::default(),
        }
    }

    /// Connects to the socket named by `XENSTORED_PATH`, else `/run/xenstored/socket`.
    pub async fn connect_env() -> Result<AsyncClient> {
        AsyncClient::connect(transport::socket_path_from_env()).await
    }

    /// Connects to a xenstored Unix socket.
    pub async fn connect(path: impl AsRef<Path>) -> Result<AsyncClient> {
        let stream = tokio::net::UnixStream::connect(path).await?;
        Ok(AsyncClient::from_stream(stream))
    }

    /// Opens a xenbus character device (normally `/dev/xen/xenbus`).
    pub fn open_xenbus(path: impl AsRef<Path>) -> Result<AsyncClient> {
        AsyncClient::from_xenbus_file(transport::open_xenbus(path.as_ref())?)
    }

    /// Uses an already open xenbus device, or any file descriptor with its semantics (whole
    /// messages written, replies and events read). It is switched to non-blocking mode.
    pub fn from_xenbus_file(file: std::fs::File) -> Result<AsyncClient> {
        let (r, w) = transport::xenbus_halves(file)?;
        Ok(AsyncClient::start(r, w))
    }

    /// Uses a connected tokio socket (e.g. one end of an in-process embedded server).
    pub fn from_stream(stream: tokio::net::UnixStream) -> AsyncClient {
        let (r, w) = transport::socket_halves(stream);
        AsyncClient::start(r, w)
    }

    /// Uses a connected std socket (e.g. from the embedded server's `connect(domid)`).
    pub fn from_std_stream(stream: std::os::unix::net::UnixStream) -> Result<AsyncClient> {
        stream.set_nonblocking(true)?;
        Ok(AsyncClient::from_stream(tokio::net::UnixStream::from_std(
            stream,
        )?))
    }

    /// The same connection with another retry policy for [`AsyncClient::transaction`].
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> AsyncClient {
        self.retry = retry;
        self
    }

    /// The retry policy of [`AsyncClient::transaction`].
    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// Why the connection died, once it has.
    pub fn connection_lost(&self) -> Option<String> {
        self.inner.demux.lost_reason()
    }

    /// Sends one request and waits for the frame that answers it.
    async fn call(&self, tx_id: u32, req: &Request<'_>) -> Result<Vec<u8>> {
        let payload = req.to_payload();
        ops::payload_len(req.msg_type(), payload.len())?;
        let demux = &self.inner.demux;
        let (req_id, reply) = demux.register()?;
        let mut guard = PendingGuard {
            demux,
            req_id,
            armed: true,
        };
        let frame = crate::wire::encode_frame(req.msg_type(), req_id, tx_id, &payload)?;
        tracing::trace!(req_id, tx_id, op = %req.msg_type(), "xenstore request");
        if self.inner.queue.send(frame).is_err() {
            return Err(demux.lost_error());
        }
        let frame = reply.await.map_err(|_| demux.lost_error())?;
        guard.armed = false;
        Ok(frame)
    }

    /// Sends a request whose reply nobody waits for (unwatch and abort from `Drop`).
    pub(crate) fn send_detached(&self, tx_id: u32, req: &Request<'_>) {
        let Ok((req_id, _reply)) = self.inner.demux.register() else {
            return;
        };
        match req.to_frame(req_id, tx_id) {
            Ok(frame) => {
                let _ = self.inner.queue.send(frame);
            }
            Err(_) => self.inner.demux.cancel(req_id),
        }
    }

    /// A request whose success reply is `OK`.
    async fn call_ok(&self, tx_id: u32, req: &Request<'_>, path: Option<&str>) -> Result<()> {
        let frame = self.call(tx_id, req).await?;
        match decode(&frame, req.msg_type(), path)? {
            Response::Ok(_) => Ok(()),
            _ => Err(shape(req.msg_type())),
        }
    }

    // ---- node operations, at `tx_id` (0: outside any transaction) ----

    pub(crate) async fn read_at(&self, tx_id: u32, path: &str) -> Result<Vec<u8>> {
        ops::node_path(path)?;
        let frame = self.call(tx_id, &Request::Read { path }).await?;
        match decode(&frame, MsgType::Read, Some(path))? {
            Response::Read(value) => Ok(value.to_vec()),
            _ => Err(shape(MsgType::Read)),
        }
    }

    pub(crate) async fn write_at(&self, tx_id: u32, path: &str, value: &[u8]) -> Result<()> {
        ops::node_path(path)?;
        self.call_ok(tx_id, &Request::Write { path, value }, Some(path))
            .await
    }

    pub(crate) async fn mkdir_at(&self, tx_id: u32, path: &str) -> Result<()> {
        ops::node_path(path)?;
        self.call_ok(tx_id, &Request::Mkdir { path }, Some(path))
            .await
    }

    pub(crate) async fn rm_at(&self, tx_id: u32, path: &str) -> Result<()> {
        ops::node_path(path)?;
        self.call_ok(tx_id, &Request::Rm { path }, Some(path)).await
    }

    pub(crate) async fn exists_at(&self, tx_id: u32, path: &str) -> Result<bool> {
        match self.read_at(tx_id, path).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn get_perms_at(&self, tx_id: u32, path: &str) -> Result<Perms> {
        ops::node_path(path)?;
        let frame = self.call(tx_id, &Request::GetPerms { path }).await?;
        match decode(&frame, MsgType::GetPerms, Some(path))? {
            Response::GetPerms(perms) => Ok(perms),
            _ => Err(shape(MsgType::GetPerms)),
        }
    }

    pub(crate) async fn set_perms_at(&self, tx_id: u32, path: &str, perms: &Perms) -> Result<()> {
        // A node, or the special `@introduceDomain` / `@releaseDomain` (XSA-115).
        ops::watch_path(path)?;
        if perms.0.is_empty() {
            return Err(Error::InvalidArgument(
                "a permission list needs at least the owner entry".to_owned(),
            ));
        }
        let req = Request::SetPerms {
            path,
            perms: perms.clone(),
        };
        self.call_ok(tx_id, &req, Some(path)).await
    }

    /// `DIRECTORY`, falling back to `DIRECTORY_PART` chunks when the listing is too big for
    /// one reply (`E2BIG`), as libxenstore does.
    pub(crate) async fn directory_at(&self, tx_id: u32, path: &str) -> Result<Vec<String>> {
        ops::node_path(path)?;
        let frame = self.call(tx_id, &Request::Directory { path }).await?;
        match decode(&frame, MsgType::Directory, Some(path)) {
            Ok(Response::Directory(children)) => {
                Ok(children.into_iter().map(str::to_owned).collect())
            }
            Ok(_) => Err(shape(MsgType::Directory)),
            Err(e) if e.errno() == Some(XsErrno::E2BIG) => self.directory_parts(tx_id, path).await,
            Err(e) => Err(e),
        }
    }

    /// Reads a listing chunk by chunk; the offset is in bytes of the nul-separated names. A
    /// generation count that changes between chunks means the node changed: start over.
    async fn directory_parts(&self, tx_id: u32, path: &str) -> Result<Vec<String>> {
        'restart: for _ in 0..MAX_DIRECTORY_RESTARTS {
            let mut children = Vec::new();
            let mut offset: u32 = 0;
            let mut generation = None;
            loop {
                let frame = self
                    .call(tx_id, &Request::DirectoryPart { path, offset })
                    .await?;
                let part = match decode(&frame, MsgType::DirectoryPart, Some(path)) {
                    Ok(Response::DirectoryPart(part)) => part,
                    Ok(_) => return Err(shape(MsgType::DirectoryPart)),
                    // A daemon without DIRECTORY_PART cannot list this node at all.
                    Err(e) if e.errno() == Some(XsErrno::ENOSYS) => {
                        return Err(Error::Xs {
                            errno: XsErrno::E2BIG,
                            op: MsgType::Directory,
                            path: Some(path.to_owned()),
                        })
                    }
                    Err(e) => return Err(e),
                };
                match generation {
                    None => generation = Some(part.generation),
                    Some(g) if g != part.generation => {
                        tracing::debug!(path, "directory changed while listing it; restarting");
                        continue 'restart;
                    }
                    Some(_) => {}
                }
                if part.children.is_empty() && !part.complete {
                    return Err(Error::Protocol(crate::wire::WireError::BadReply {
                        ty: MsgType::DirectoryPart,
                        why: "empty chunk that does not end the listing",
                    }));
                }
                for child in part.children {
                    offset = offset.saturating_add(child.len() as u32 + 1);
                    children.push(child.to_owned());
                }
                if part.complete {
                    return Ok(children);
                }
            }
        }
        Err(Error::Xs {
            errno: XsErrno::EAGAIN,
            op: MsgType::DirectoryPart,
            path: Some(path.to_owned()),
        })
    }

    // ---- public node operations outside transactions ----

    /// The node's value (`XS_READ`).
    pub async fn read(&self, path: &str) -> Result<Vec<u8>> {
        self.read_at(0, path).await
    }

    /// The node's value as UTF-8 text.
    pub async fn read_string(&self, path: &str) -> Result<String> {
        super::utf8_value(path, self.read_at(0, path).await?)
    }

    /// Creates or overwrites a node, creating missing parents (`XS_WRITE`).
    pub async fn write(&self, path: &str, value: impl AsRef<[u8]>) -> Result<()> {
        self.write_at(0, path, value.as_ref()).await
    }

    /// Creates a node with an empty value if it is missing (`XS_MKDIR`).
    pub async fn mkdir(&self, path: &str) -> Result<()> {
        self.mkdir_at(0, path).await
    }

    /// Removes a node and everything below it (`XS_RM`).
    pub async fn rm(&self, path: &str) -> Result<()> {
        self.rm_at(0, path).await
    }

    /// The names of the node's children, falling back to `XS_DIRECTORY_PART` for big listings.
    pub async fn directory(&self, path: &str) -> Result<Vec<String>> {
        self.directory_at(0, path).await
    }

    /// Whether the node exists (a read that is not `ENOENT`; other errors are returned).
    pub async fn exists(&self, path: &str) -> Result<bool> {
        self.exists_at(0, path).await
    }

    /// The node's permission list (`XS_GET_PERMS`).
    pub async fn get_perms(&self, path: &str) -> Result<Perms> {
        self.get_perms_at(0, path).await
    }

    /// Replaces the node's permission list (`XS_SET_PERMS`).
    pub async fn set_perms(&self, path: &str, perms: &Perms) -> Result<()> {
        self.set_perms_at(0, path, perms).await
    }

    // ---- watches ----

    /// Watches `path` and everything below it (or a special `@introduceDomain` /
    /// `@releaseDomain`). The stream starts with xenstored's initial fire; dropping it
    /// unwatches.
    pub async fn watch(&self, path: &str) -> Result<AsyncWatch> {
        ops::watch_path(path)?;
        let demux = &self.inner.demux;
        let (token, events) = demux.add_watch(TOKEN_PREFIX)?;
        // If this future is dropped after WATCH went out, unwatch as a dropped watch would.
        let mut guard = WatchGuard {
            client: self,
            path,
            token: &token,
            armed: true,
        };
        let req = Request::Watch {
            path,
            token: &token,
        };
        let outcome = self.call_ok(0, &req, Some(path)).await;
        guard.armed = false;
        drop(guard);
        match outcome {
            Ok(()) => Ok(AsyncWatch::new(
                self.clone(),
                path.to_owned(),
                token,
                events,
            )),
            Err(e) => {
                demux.remove_watch(&token);
                Err(e)
            }
        }
    }

    /// Removes the watch `(path, token)` and waits for the daemon's answer.
    pub(crate) async fn unwatch(&self, path: &str, token: &str) -> Result<()> {
        self.inner.demux.remove_watch(token);
        self.call_ok(0, &Request::Unwatch { path, token }, Some(path))
            .await
    }

    /// Removes the watch without waiting (from `Drop`).
    pub(crate) fn unwatch_detached(&self, path: &str, token: &str) {
        self.inner.demux.remove_watch(token);
        self.send_detached(0, &Request::Unwatch { path, token });
    }

    /// Whether the watch with `token` still delivers events (not unwatched, stopped or reset).
    pub(crate) fn has_watch(&self, token: &str) -> bool {
        self.inner.demux.has_watch(token)
    }

    /// Removes every watch and transaction of this connection (`XS_RESET_WATCHES`); every
    /// watch stream of this client ends.
    pub async fn reset_watches(&self) -> Result<()> {
        self.inner.demux.clear_watches();
        self.call_ok(0, &Request::ResetWatches, None).await
    }

    // ---- transactions ----

    /// Starts a transaction (`XS_TRANSACTION_START`). Dropping it without commit aborts it.
    pub async fn start_transaction(&self) -> Result<AsyncTransaction> {
        let frame = self.call(0, &Request::TransactionStart).await?;
        match decode(&frame, MsgType::TransactionStart, None)? {
            Response::TransactionStart(tx_id) => Ok(AsyncTransaction {
                inner: Arc::new(TxInner {
                    client: self.clone(),
                    tx_id,
                    ended: AtomicBool::new(false),
                }),
            }),
            _ => Err(shape(MsgType::TransactionStart)),
        }
    }

    /// Runs `f` in a transaction and commits it, starting over when the commit (or an
    /// operation inside) reports a conflict (`EAGAIN`), at most as often as the client's
    /// [`RetryPolicy`] allows. An error from `f` aborts the transaction and is returned.
    /// `f` gets its own handle on the transaction; it must not commit or abort it.
    pub async fn transaction<T, F, Fut>(&self, mut f: F) -> Result<T>
    where
        F: FnMut(AsyncTransaction) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let attempts = self.retry.attempts_bound();
        for attempt in 1..=attempts {
            let tx = self.start_transaction().await?;
            let outcome = match f(tx.clone()).await {
                Ok(value) => tx.commit().await.map(|()| value),
                Err(e) => {
                    let _ = tx.abort().await;
                    Err(e)
                }
            };
            match outcome {
                Err(e) if e.is_conflict() => {
                    tracing::debug!(attempt, "xenstore transaction conflicted; retrying");
                    let pause = self.retry.pause(attempt);
                    if !pause.is_zero() && attempt < attempts {
                        tokio::time::sleep(pause).await;
                    }
                }
                outcome => return outcome,
            }
        }
        Err(Error::RetriesExhausted { attempts })
    }

    // ---- domains (toolstack) ----

    /// Tells xenstored about a new domain's store page and event channel (`XS_INTRODUCE`).
    pub async fn introduce(&self, domid: u32, mfn: u64, evtchn: u32) -> Result<()> {
        self.call_ok(0, &Request::Introduce { domid, mfn, evtchn }, None)
            .await
    }

    /// Forgets a domain (`XS_RELEASE`).
    pub async fn release(&self, domid: u32) -> Result<()> {
        self.call_ok(0, &Request::Release { domid }, None).await
    }

    /// Whether xenstored knows the domain (`XS_IS_DOMAIN_INTRODUCED`).
    pub async fn is_domain_introduced(&self, domid: u32) -> Result<bool> {
        let frame = self.call(0, &Request::IsDomainIntroduced { domid }).await?;
        match decode(&frame, MsgType::IsDomainIntroduced, None)? {
            Response::IsDomainIntroduced(yes) => Ok(yes),
            _ => Err(shape(MsgType::IsDomainIntroduced)),
        }
    }

    /// The domain's home path, `/local/domain/<domid>` (`XS_GET_DOMAIN_PATH`).
    pub async fn get_domain_path(&self, domid: u32) -> Result<String> {
        let frame = self.call(0, &Request::GetDomainPath { domid }).await?;
        match decode(&frame, MsgType::GetDomainPath, None)? {
            Response::GetDomainPath(path) => Ok(path.to_owned()),
            _ => Err(shape(MsgType::GetDomainPath)),
        }
    }

    /// Clears a domain's shutdown flag (`XS_RESUME`).
    pub async fn resume(&self, domid: u32) -> Result<()> {
        self.call_ok(0, &Request::Resume { domid }, None).await
    }

    /// Lets `domid` act with `target`'s privileges (`XS_SET_TARGET`).
    pub async fn set_target(&self, domid: u32, target: u32) -> Result<()> {
        self.call_ok(0, &Request::SetTarget { domid, target }, None)
            .await
    }

    // ---- features, quotas, control ----

    /// The server's feature bits, or a domain's (`XS_GET_FEATURE`).
    pub async fn get_feature(&self, domid: Option<u32>) -> Result<u32> {
        let frame = self.call(0, &Request::GetFeature { domid }).await?;
        match decode(&frame, MsgType::GetFeature, None)? {
            Response::GetFeature(value) => Ok(value),
            _ => Err(shape(MsgType::GetFeature)),
        }
    }

    /// Sets a domain's feature bits (`XS_SET_FEATURE`).
    pub async fn set_feature(&self, domid: u32, features: u32) -> Result<()> {
        self.call_ok(0, &Request::SetFeature { domid, features }, None)
            .await
    }

    /// The quota names the server supports (`XS_GET_QUOTA` without arguments).
    pub async fn list_quotas(&self) -> Result<Vec<String>> {
        let req = Request::GetQuota {
            domid: None,
            quota: None,
        };
        let frame = self.call(0, &req).await?;
        match decode(&frame, MsgType::GetQuota, None)? {
            Response::GetQuota(QuotaReply::Names(names)) => {
                Ok(names.into_iter().map(str::to_owned).collect())
            }
            _ => Err(shape(MsgType::GetQuota)),
        }
    }

    /// A quota's value: the global default (`domid` None) or a domain's (`XS_GET_QUOTA`).
    pub async fn get_quota(&self, domid: Option<u32>, quota: &str) -> Result<u32> {
        quota_name(quota)?;
        let req = Request::GetQuota {
            domid,
            quota: Some(quota),
        };
        let frame = self.call(0, &req).await?;
        match decode(&frame, MsgType::GetQuota, None)? {
            Response::GetQuota(QuotaReply::Value(value)) => Ok(value),
            _ => Err(shape(MsgType::GetQuota)),
        }
    }

    /// Sets a quota: the global default (`domid` None) or a domain's (`XS_SET_QUOTA`).
    pub async fn set_quota(&self, domid: Option<u32>, quota: &str, value: u32) -> Result<()> {
        quota_name(quota)?;
        let req = Request::SetQuota {
            domid,
            quota,
            value,
        };
        self.call_ok(0, &req, None).await
    }

    /// An implementation-specific command (`XS_CONTROL`), e.g. `["log", "on"]`; returns the
    /// daemon's output.
    pub async fn control(&self, args: &[&[u8]]) -> Result<Vec<u8>> {
        for arg in args {
            ops::string_arg("control argument", arg)?;
        }
        let req = Request::Control {
            args: args.to_vec(),
        };
        let frame = self.call(0, &req).await?;
        match decode(&frame, MsgType::Control, None)? {
            Response::Control(out) => Ok(out.to_vec()),
            _ => Err(shape(MsgType::Control)),
        }
    }
}

fn quota_name(quota: &str) -> Result<()> {
    if quota.is_empty() || quota.bytes().any(|b| b == 0 || b.is_ascii_whitespace()) {
        return Err(Error::InvalidArgument(format!("bad quota name {quota:?}")));
    }
    Ok(())
}

/// Unwatches if `AsyncClient::watch` is dropped after the watch may have been set.
struct WatchGuard<'a> {
    client: &'a AsyncClient,
    path: &'a str,
    token: &'a str,
    armed: bool,
}

impl Drop for WatchGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client.unwatch_detached(self.path, self.token);
        }
    }
}

struct TxInner {
    client: AsyncClient,
    tx_id: u32,
    ended: AtomicBool,
}

impl Drop for TxInner {
    fn drop(&mut self) {
        if !self.ended.load(Ordering::Acquire) {
            tracing::debug!(tx_id = self.tx_id, "xenstore transaction dropped; aborting");
            self.client
                .send_detached(self.tx_id, &Request::TransactionEnd { commit: false });
        }
    }
}

/// An open transaction. Clones share it; when the last clone is dropped without
/// [`commit`](AsyncTransaction::commit) or [`abort`](AsyncTransaction::abort), it is aborted.
#[derive(Clone)]
pub struct AsyncTransaction {
    inner: Arc<TxInner>,
}

impl std::fmt::Debug for AsyncTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncTransaction")
            .field("tx_id", &self.inner.tx_id)
            .field("ended", &self.inner.ended.load(Ordering::Relaxed))
            .finish()
    }
}

impl AsyncTransaction {
    /// The daemon's transaction id.
    pub fn id(&self) -> u32 {
        self.inner.tx_id
    }

    fn live(&self) -> Result<(&AsyncClient, u32)> {
        if self.inner.ended.load(Ordering::Acquire) {
            return Err(Error::TransactionEnded);
        }
        Ok((&self.inner.client, self.inner.tx_id))
    }

    async fn end(&self, commit: bool) -> Result<()> {
        let (client, tx_id) = self.live()?;
        if self.inner.ended.swap(true, Ordering::AcqRel) {
            return Err(Error::TransactionEnded);
        }
        client
            .call_ok(tx_id, &Request::TransactionEnd { commit }, None)
            .await
    }

    /// Commits. `Err` with [`Error::is_conflict`] means another transaction changed what this
    /// one read: start over (or use [`AsyncClient::transaction`], which does).
    pub async fn commit(&self) -> Result<()> {
        self.end(true).await
    }

    /// Abandons every change.
    pub async fn abort(&self) -> Result<()> {
        self.end(false).await
    }

    /// See [`AsyncClient::read`].
    pub async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let (c, tx) = self.live()?;
        c.read_at(tx, path).await
    }

    /// See [`AsyncClient::read_string`].
    pub async fn read_string(&self, path: &str) -> Result<String> {
        super::utf8_value(path, self.read(path).await?)
    }

    /// See [`AsyncClient::write`].
    pub async fn write(&self, path: &str, value: impl AsRef<[u8]>) -> Result<()> {
        let (c, tx) = self.live()?;
        c.write_at(tx, path, value.as_ref()).await
    }

    /// See [`AsyncClient::mkdir`].
    pub async fn mkdir(&self, path: &str) -> Result<()> {
        let (c, tx) = self.live()?;
        c.mkdir_at(tx, path).await
    }

    /// See [`AsyncClient::rm`].
    pub async fn rm(&self, path: &str) -> Result<()> {
        let (c, tx) = self.live()?;
        c.rm_at(tx, path).await
    }

    /// See [`AsyncClient::directory`].
    pub async fn directory(&self, path: &str) -> Result<Vec<String>> {
        let (c, tx) = self.live()?;
        c.directory_at(tx, path).await
    }

    /// See [`AsyncClient::exists`].
    pub async fn exists(&self, path: &str) -> Result<bool> {
        let (c, tx) = self.live()?;
        c.exists_at(tx, path).await
    }

    /// See [`AsyncClient::get_perms`].
    pub async fn get_perms(&self, path: &str) -> Result<Perms> {
        let (c, tx) = self.live()?;
        c.get_perms_at(tx, path).await
    }

    /// See [`AsyncClient::set_perms`].
    pub async fn set_perms(&self, path: &str, perms: &Perms) -> Result<()> {
        let (c, tx) = self.live()?;
        c.set_perms_at(tx, path, perms).await
    }
}
