//! The blocking client: the tokio client driven by a private one-thread runtime, so any
//! number of threads can share one connection with requests in flight at once.
//!
//! Its methods block the calling thread; do not call them from inside an async task.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use super::async_client::{AsyncClient, AsyncTransaction};
use super::watch::Watch;
use super::{Error, Result, RetryPolicy};
use crate::wire::Perms;

/// The runtime that runs a blocking client's connection task.
pub(crate) struct Runtime(Option<tokio::runtime::Runtime>);

impl Runtime {
    fn new() -> Result<Arc<Runtime>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("xenstore-client")
            .enable_io()
            .enable_time()
            .build()?;
        Ok(Arc::new(Runtime(Some(rt))))
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("runtime lives until drop")
    }

    pub(crate) fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.rt().block_on(future)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Never blocks, so a client may also be dropped from async code.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A blocking XenStore connection. Cheap to clone; clones share the connection and may be used
/// from many threads at once.
#[derive(Clone)]
pub struct Client {
    // Declared before `rt`: the connection's handles go before its runtime.
    inner: AsyncClient,
    rt: Arc<Runtime>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Client").field(&self.inner).finish()
    }
}

impl Client {
    fn build(make: impl FnOnce() -> Result<AsyncClient>) -> Result<Client> {
        let rt = Runtime::new()?;
        let inner = {
            let _entered = rt.rt().enter();
            make()?
        };
        Ok(Client { inner, rt })
    }

    /// Connects to the socket named by `XENSTORED_PATH`, else `/run/xenstored/socket`.
    pub fn from_env() -> Result<Client> {
        Client::connect(super::socket_path_from_env())
    }

    /// Connects to a xenstored Unix socket.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client> {
        Client::from_unix_stream(std::os::unix::net::UnixStream::connect(path)?)
    }

    /// Opens a xenbus character device (normally `/dev/xen/xenbus`).
    pub fn open_xenbus(path: impl AsRef<Path>) -> Result<Client> {
        let path = path.as_ref();
        Client::build(|| AsyncClient::open_xenbus(path))
    }

    /// Uses an already open xenbus device, or any file descriptor with its semantics.
    pub fn from_xenbus_file(file: std::fs::File) -> Result<Client> {
        Client::build(|| AsyncClient::from_xenbus_file(file))
    }

    /// Uses a connected socket (e.g. from the embedded server's `connect(domid)`).
    pub fn from_unix_stream(stream: std::os::unix::net::UnixStream) -> Result<Client> {
        Client::build(|| AsyncClient::from_std_stream(stream))
    }

    /// The same connection with another retry policy for [`Client::transaction`].
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Client {
        self.inner = self.inner.with_retry_policy(retry);
        self
    }

    /// The retry policy of [`Client::transaction`].
    pub fn retry_policy(&self) -> RetryPolicy {
        self.inner.retry_policy()
    }

    /// The tokio client underneath (its futures run on any runtime).
    pub fn as_async(&self) -> &AsyncClient {
        &self.inner
    }

    /// Why the connection died, once it has.
    pub fn connection_lost(&self) -> Option<String> {
        self.inner.connection_lost()
    }

    fn run<F: Future>(&self, future: F) -> F::Output {
        self.rt.block_on(future)
    }

    /// The node's value (`XS_READ`).
    pub fn read(&self, path: &str) -> Result<Vec<u8>> {
        self.run(self.inner.read(path))
    }

    /// The node's value as UTF-8 text.
    pub fn read_string(&self, path: &str) -> Result<String> {
        self.run(self.inner.read_string(path))
    }

    /// Creates or overwrites a node, creating missing parents (`XS_WRITE`).
    pub fn write(&self, path: &str, value: impl AsRef<[u8]>) -> Result<()> {
        self.run(self.inner.write(path, value))
    }

    /// Creates a node with an empty value if it is missing (`XS_MKDIR`).
    pub fn mkdir(&self, path: &str) -> Result<()> {
        self.run(self.inner.mkdir(path))
    }

    /// Removes a node and everything below it (`XS_RM`).
    pub fn rm(&self, path: &str) -> Result<()> {
        self.run(self.inner.rm(path))
    }

    /// The names of the node's children, falling back to `XS_DIRECTORY_PART` for big listings.
    pub fn directory(&self, path: &str) -> Result<Vec<String>> {
        self.run(self.inner.directory(path))
    }

    /// Whether the node exists (a read that is not `ENOENT`; other errors are returned).
    pub fn exists(&self, path: &str) -> Result<bool> {
        self.run(self.inner.exists(path))
    }

    /// The node's permission list (`XS_GET_PERMS`).
    pub fn get_perms(&self, path: &str) -> Result<Perms> {
        self.run(self.inner.get_perms(path))
    }

    /// Replaces the node's permission list (`XS_SET_PERMS`).
    pub fn set_perms(&self, path: &str, perms: &Perms) -> Result<()> {
        self.run(self.inner.set_perms(path, perms))
    }

    /// Watches `path` and everything below it; see [`AsyncClient::watch`].
    pub fn watch(&self, path: &str) -> Result<Watch> {
        let watch = self.run(self.inner.watch(path))?;
        Ok(Watch::new(watch, self.rt.clone()))
    }

    /// Removes every watch and transaction of this connection; every watch of this client ends.
    pub fn reset_watches(&self) -> Result<()> {
        self.run(self.inner.reset_watches())
    }

    /// Starts a transaction. Dropping it without commit aborts it.
    pub fn start_transaction(&self) -> Result<Transaction> {
        let inner = self.run(self.inner.start_transaction())?;
        Ok(Transaction {
            inner,
            rt: self.rt.clone(),
        })
    }

    /// Runs `f` in a transaction and commits it, starting over on a conflict (`EAGAIN` from
    /// the commit or from an operation inside) at most as often as the [`RetryPolicy`]
    /// allows. An error from `f` aborts the transaction and is returned.
    pub fn transaction<T>(&self, mut f: impl FnMut(&Transaction) -> Result<T>) -> Result<T> {
        let policy = self.inner.retry_policy();
        let attempts = policy.attempts_bound();
        for attempt in 1..=attempts {
            let tx = self.start_transaction()?;
            let outcome = match f(&tx) {
                Ok(value) => tx.commit().map(|()| value),
                Err(e) => {
                    let _ = tx.abort();
                    Err(e)
                }
            };
            match outcome {
                Err(e) if e.is_conflict() => {
                    tracing::debug!(attempt, "xenstore transaction conflicted; retrying");
                    let pause = policy.pause(attempt);
                    if !pause.is_zero() && attempt < attempts {
                        std::thread::sleep(pause);
                    }
                }
                outcome => return outcome,
            }
        }
        Err(Error::RetriesExhausted { attempts })
    }

    /// Tells xenstored about a new domain (`XS_INTRODUCE`).
    pub fn introduce(&self, domid: u32, mfn: u64, evtchn: u32) -> Result<()> {
        self.run(self.inner.introduce(domid, mfn, evtchn))
    }

    /// Forgets a domain (`XS_RELEASE`).
    pub fn release(&self, domid: u32) -> Result<()> {
        self.run(self.inner.release(domid))
    }

    /// Whether xenstored knows the domain (`XS_IS_DOMAIN_INTRODUCED`).
    pub fn is_domain_introduced(&self, domid: u32) -> Result<bool> {
        self.run(self.inner.is_domain_introduced(domid))
    }

    /// The domain's home path (`XS_GET_DOMAIN_PATH`).
    pub fn get_domain_path(&self, domid: u32) -> Result<String> {
        self.run(self.inner.get_domain_path(domid))
    }

    /// Clears a domain's shutdown flag (`XS_RESUME`).
    pub fn resume(&self, domid: u32) -> Result<()> {
        self.run(self.inner.resume(domid))
    }

    /// Lets `domid` act with `target`'s privileges (`XS_SET_TARGET`).
    pub fn set_target(&self, domid: u32, target: u32) -> Result<()> {
        self.run(self.inner.set_target(domid, target))
    }

    /// The server's feature bits, or a domain's (`XS_GET_FEATURE`).
    pub fn get_feature(&self, domid: Option<u32>) -> Result<u32> {
        self.run(self.inner.get_feature(domid))
    }

    /// Sets a domain's feature bits (`XS_SET_FEATURE`).
    pub fn set_feature(&self, domid: u32, features: u32) -> Result<()> {
        self.run(self.inner.set_feature(domid, features))
    }

    /// The quota names the server supports.
    pub fn list_quotas(&self) -> Result<Vec<String>> {
        self.run(self.inner.list_quotas())
    }

    /// A quota's value, global (`None`) or a domain's (`XS_GET_QUOTA`).
    pub fn get_quota(&self, domid: Option<u32>, quota: &str) -> Result<u32> {
        self.run(self.inner.get_quota(domid, quota))
    }

    /// Sets a quota, global (`None`) or a domain's (`XS_SET_QUOTA`).
    pub fn set_quota(&self, domid: Option<u32>, quota: &str, value: u32) -> Result<()> {
        self.run(self.inner.set_quota(domid, quota, value))
    }

    /// An implementation-specific command (`XS_CONTROL`); returns the daemon's output.
    pub fn control(&self, args: &[&[u8]]) -> Result<Vec<u8>> {
        self.run(self.inner.control(args))
    }
}

/// An open transaction on a blocking client; dropped without commit, it is aborted.
pub struct Transaction {
    inner: AsyncTransaction,
    rt: Arc<Runtime>,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Transaction {
    fn run<F: Future>(&self, future: F) -> F::Output {
        self.rt.block_on(future)
    }

    /// The daemon's transaction id.
    pub fn id(&self) -> u32 {
        self.inner.id()
    }

    /// Commits; `Err` with [`Error::is_conflict`] means start over.
    pub fn commit(&self) -> Result<()> {
        self.run(self.inner.commit())
    }

    /// Abandons every change.
    pub fn abort(&self) -> Result<()> {
        self.run(self.inner.abort())
    }

    /// See [`Client::read`].
    pub fn read(&self, path: &str) -> Result<Vec<u8>> {
        self.run(self.inner.read(path))
    }

    /// See [`Client::read_string`].
    pub fn read_string(&self, path: &str) -> Result<String> {
        self.run(self.inner.read_string(path))
    }

    /// See [`Client::write`].
    pub fn write(&self, path: &str, value: impl AsRef<[u8]>) -> Result<()> {
        self.run(self.inner.write(path, value))
    }

    /// See [`Client::mkdir`].
    pub fn mkdir(&self, path: &str) -> Result<()> {
        self.run(self.inner.mkdir(path))
    }

    /// See [`Client::rm`].
    pub fn rm(&self, path: &str) -> Result<()> {
        self.run(self.inner.rm(path))
    }

    /// See [`Client::directory`].
    pub fn directory(&self, path: &str) -> Result<Vec<String>> {
        self.run(self.inner.directory(path))
    }

    /// See [`Client::exists`].
    pub fn exists(&self, path: &str) -> Result<bool> {
        self.run(self.inner.exists(path))
    }

    /// See [`Client::get_perms`].
    pub fn get_perms(&self, path: &str) -> Result<Perms> {
        self.run(self.inner.get_perms(path))
    }

    /// See [`Client::set_perms`].
    pub fn set_perms(&self, path: &str, perms: &Perms) -> Result<()> {
        self.run(self.inner.set_perms(path, perms))
    }
}
