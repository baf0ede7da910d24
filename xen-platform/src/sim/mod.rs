//! The simulated Xen host: server ([`host`]), the domain-side client, and their protocol.

pub mod host;
pub mod proto;
pub mod sock;
pub mod wire;
pub mod xenstore;

pub(crate) mod client;
pub mod peer;

pub use client::SimControl;
pub use host::{SimHost, SimHostConfig, DEFAULT_MAX_GRANTS};
pub use proto::DomainInfo;
