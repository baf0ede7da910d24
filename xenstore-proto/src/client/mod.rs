//! The XenStore client: blocking ([`Client`]) and tokio ([`AsyncClient`]), over the xenstored
//! Unix socket or the `/dev/xen/xenbus` device.
//!
//! - Many requests may be in flight on one connection, from many threads or tasks: a
//!   connection task writes requests in order and hands each reply to its waiter by `req_id`,
//!   each `WATCH_EVENT` to its watch by token. When the connection dies, every waiter and watch
//!   fails with [`Error::ConnectionLost`] — nothing hangs.
//! - Watches are a [`Stream`](futures_core::Stream) ([`AsyncWatch`]) or an iterator
//!   ([`Watch`]), starting with xenstored's initial fire; dropping one unwatches.
//! - Transactions: [`Client::start_transaction`] for manual control, or
//!   [`Client::transaction`] / [`AsyncClient::transaction`], which retry on `EAGAIN` within a
//!   [`RetryPolicy`].
//! - Errors keep the XenStore errno visible ([`Error::Xs`], [`Error::errno`]).
//! - [`XenbusStore`]: the object-safe trait the xenbus handshake code is written against.
//!
//! The client has no notion of its domid: the connection carries the identity (the socket a
//! simulated domain connects to, or the guest's xenbus device).

mod async_client;
mod blocking;
mod demux;
mod driver;
mod error;
mod ops;
mod retry;
mod store;
mod transport;
mod watch;

pub use async_client::{AsyncClient, AsyncTransaction};
pub use blocking::{Client, Transaction};
pub use error::{Error, Result};
pub use retry::RetryPolicy;
pub use store::{NodeOps, WatchEvents, XenbusStore, XenbusStoreExt};
pub use transport::{
    socket_path_from_env, DEFAULT_SOCKET_PATH, XENBUS_DEVICE_PATH, XENSTORED_PATH_ENV,
};
pub use watch::{AsyncWatch, Watch, WatchEvent, WatchStopper};

/// A node value as UTF-8 text.
fn utf8_value(path: &str, value: Vec<u8>) -> Result<String> {
    String::from_utf8(value).map_err(|e| Error::BadValue {
        path: path.to_owned(),
        value: String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

#[cfg(test)]
mod tests;
