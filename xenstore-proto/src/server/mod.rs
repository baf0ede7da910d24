//! The embedded XenStore server: an in-memory store with the semantics of xenstored
//! (`docs/misc/xenstore.txt`), served on Unix sockets with a domain identity per socket.
//!
//! - [`Store`] is the synchronous core: connections, domains, and
//!   [`Store::handle`] / [`Store::feed`] turning request bytes into reply and watch-event
//!   frames for every connection ([`Output`]). No sockets, no threads: unit tests and fuzzing
//!   drive it directly.
//! - [`Server`] puts a [`Store`] behind a mutex and serves it: [`Server::listen`] (one socket,
//!   one domain identity), [`Server::connect`] (in-process stream), domain introduction and
//!   release, [`Server::shutdown`].
//!
//! `docs/xenstore.md` describes the semantics, permissions, quotas and their errors.

mod config;
mod dispatch;
mod ops;
mod serve;
mod store;
mod tree;
mod txn;
mod watch;

pub use config::{Config, QuotaKind, Quotas};
pub use serve::{DomainBacklog, Listener, Server, ServerError};
pub use store::{
    domain_path, ConnId, Output, Store, DOMID_FIRST_RESERVED, FEATURES, FEATURE_WATCHDEPTH,
};

#[cfg(test)]
mod tests;
