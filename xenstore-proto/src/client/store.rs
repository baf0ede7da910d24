//! The XenStore operations the xenbus handshake needs, as traits, so backend and frontend
//! state machines are written once and run against a real daemon, the simulated host's store
//! or the embedded server in unit tests (mirage-net-xen's CONFIGURATION idea).
//!
//! All three traits are object safe: hold an `Arc<dyn XenbusStore>` or take `&dyn XenbusStore`.

use std::time::Duration;

use super::blocking::{Client, Transaction};
use super::watch::{Watch, WatchEvent, WatchStopper};
use super::{Error, Result};
use crate::wire::Perms;

/// Node operations, on a connection or inside a transaction.
pub trait NodeOps {
    /// The node's value; `ENOENT` if it does not exist.
    fn read(&self, path: &str) -> Result<Vec<u8>>;
    /// Creates or overwrites a node (and missing parents).
    fn write(&self, path: &str, value: &[u8]) -> Result<()>;
    /// Creates a node with an empty value if missing.
    fn mkdir(&self, path: &str) -> Result<()>;
    /// Removes a node and its subtree.
    fn rm(&self, path: &str) -> Result<()>;
    /// The node's children names.
    fn directory(&self, path: &str) -> Result<Vec<String>>;
    /// The node's permissions (owner first).
    fn get_perms(&self, path: &str) -> Result<Perms>;
    /// Replaces the node's permissions.
    fn set_perms(&self, path: &str, perms: &Perms) -> Result<()>;

    /// The value, or `None` if the node does not exist.
    fn read_opt(&self, path: &str) -> Result<Option<Vec<u8>>> {
        match self.read(path) {
            Ok(value) => Ok(Some(value)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The value as UTF-8 text.
    fn read_string(&self, path: &str) -> Result<String> {
        super::utf8_value(path, self.read(path)?)
    }

    /// The value parsed as an unsigned decimal (xenbus `state`, `backend-id`, `ring-ref`, ...).
    fn read_u32(&self, path: &str) -> Result<u32> {
        let text = self.read_string(path)?;
        text.trim().parse().map_err(|_| Error::BadValue {
            path: path.to_owned(),
            value: text,
        })
    }

    /// Whether the node exists.
    fn exists(&self, path: &str) -> Result<bool> {
        Ok(self.read_opt(path)?.is_some())
    }
}

/// The events of one watch, waited for with an optional timeout.
pub trait WatchEvents: Send {
    /// The watched path.
    fn watch_path(&self) -> &str;
    /// The next event: `Ok(None)` if `timeout` passed first (never with `None`),
    /// [`Error::ConnectionLost`] or [`Error::WatchEnded`] when no event will come again.
    fn next_event(&mut self, timeout: Option<Duration>) -> Result<Option<WatchEvent>>;
    /// A handle that ends the watch from another thread: a `next_event` waiting without a
    /// timeout wakes with [`Error::WatchEnded`] (so waiting threads need no periodic check).
    fn stopper(&self) -> WatchStopper;
}

/// Everything a xenbus front or back end does with XenStore: node operations, watches
/// (initial fire included; dropping one unwatches), transactions retried on conflict.
pub trait XenbusStore: NodeOps + Send + Sync {
    /// Watches `path` and its subtree.
    fn watch(&self, path: &str) -> Result<Box<dyn WatchEvents>>;

    /// Runs `f` in a transaction, committing it and starting over on a conflict (`EAGAIN`)
    /// within the store's retry policy; an error from `f` aborts it. Prefer the generic
    /// [`XenbusStoreExt::transaction`].
    fn transact(&self, f: &mut dyn FnMut(&dyn NodeOps) -> Result<()>) -> Result<()>;

    /// `/local/domain/<domid>`.
    fn get_domain_path(&self, domid: u32) -> Result<String>;
}

/// Helpers on every [`XenbusStore`], trait objects included.
pub trait XenbusStoreExt: XenbusStore {
    /// [`XenbusStore::transact`] returning a value from the attempt that committed.
    fn transaction<T>(&self, mut f: impl FnMut(&dyn NodeOps) -> Result<T>) -> Result<T> {
        let mut out = None;
        self.transact(&mut |ops| {
            out = Some(f(ops)?);
            Ok(())
        })?;
        Ok(out.expect("a committed transaction ran its closure"))
    }
}

impl<S: XenbusStore + ?Sized> XenbusStoreExt for S {}

macro_rules! node_ops_via_inherent {
    ($ty:ty) => {
        impl NodeOps for $ty {
            fn read(&self, path: &str) -> Result<Vec<u8>> {
                <$ty>::read(self, path)
            }
            fn write(&self, path: &str, value: &[u8]) -> Result<()> {
                <$ty>::write(self, path, value)
            }
            fn mkdir(&self, path: &str) -> Result<()> {
                <$ty>::mkdir(self, path)
            }
            fn rm(&self, path: &str) -> Result<()> {
                <$ty>::rm(self, path)
            }
            fn directory(&self, path: &str) -> Result<Vec<String>> {
                <$ty>::directory(self, path)
            }
            fn get_perms(&self, path: &str) -> Result<Perms> {
                <$ty>::get_perms(self, path)
            }
            fn set_perms(&self, path: &str, perms: &Perms) -> Result<()> {
                <$ty>::set_perms(self, path, perms)
            }
            fn read_string(&self, path: &str) -> Result<String> {
                <$ty>::read_string(self, path)
            }
            fn exists(&self, path: &str) -> Result<bool> {
                <$ty>::exists(self, path)
            }
        }
    };
}

node_ops_via_inherent!(Client);
node_ops_via_inherent!(Transaction);

impl WatchEvents for Watch {
    fn watch_path(&self) -> &str {
        self.path()
    }

    fn next_event(&mut self, timeout: Option<Duration>) -> Result<Option<WatchEvent>> {
        self.next_timeout(timeout)
    }

    fn stopper(&self) -> WatchStopper {
        Watch::stopper(self)
    }
}

impl XenbusStore for Client {
    fn watch(&self, path: &str) -> Result<Box<dyn WatchEvents>> {
        Ok(Box::new(Client::watch(self, path)?))
    }

    fn transact(&self, f: &mut dyn FnMut(&dyn NodeOps) -> Result<()>) -> Result<()> {
        Client::transaction(self, |tx| f(tx))
    }

    fn get_domain_path(&self, domid: u32) -> Result<String> {
        Client::get_domain_path(self, domid)
    }
}
