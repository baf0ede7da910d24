//! XenStore wire protocol (`io/xs_wire.h`): codec, client and embedded server.
//!
//! - [`wire`]: the message codec — header view, typed request/response representations,
//!   path syntax, permissions and error names, a streaming frame decoder.
//! - [`client`]: blocking and tokio clients over the xenstored socket or `/dev/xen/xenbus`.
//! - [`server`]: an in-memory XenStore with xenstored's semantics, served on Unix sockets.

pub mod client;
pub mod server;
pub mod wire;
