//! Server configuration: quotas and the handling of a released domain's nodes.

use std::time::Duration;

/// Per-domain limits, applied to unprivileged domains only (dom0 is never limited), with
/// xenstored 4.17's defaults. Names are those `GET_QUOTA`/`SET_QUOTA` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// `nodes`: nodes a domain may own (xenstored `-E`, 1000). Exceeding it: `ENOSPC`.
    pub nodes: u32,
    /// `node-size`: largest node record a domain may write — header, permissions, value and
    /// children names, as xenstored counts it (`-S`, 2048).
    /// Exceeding it: `ENOSPC`.
    pub node_size: u32,
    /// `watches`: watches per domain (xenstored `-W`, 128). Exceeding it: `E2BIG`, as 4.17.
    pub watches: u32,
    /// `transactions`: open transactions of one domain, over all its connections (xenstored
    /// `-t`, 10, counts them per connection, and a domU has exactly one). Exceeding it:
    /// `ENOSPC`.
    pub transactions: u32,
    /// `node-permissions`: entries in one `SET_PERMS` (xenstored `-A`, 5). Exceeding it:
    /// `ENOSPC`.
    pub node_permissions: u32,
    /// `transaction-nodes`: nodes one transaction may read or change (xenstored `-n`, 1024).
    /// Exceeding it: `ENOSPC`.
    pub transaction_nodes: u32,
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            nodes: 1000,
            node_size: 2048,
            watches: 128,
            transactions: 10,
            node_permissions: 5,
            transaction_nodes: 1024,
        }
    }
}

/// One named quota, as `GET_QUOTA`/`SET_QUOTA` address it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    Nodes,
    NodeSize,
    Watches,
    Transactions,
    NodePermissions,
    TransactionNodes,
}

impl QuotaKind {
    /// Every quota, in the order `GET_QUOTA` lists them.
    pub const ALL: [QuotaKind; 6] = [
        QuotaKind::Nodes,
        QuotaKind::Watches,
        QuotaKind::Transactions,
        QuotaKind::TransactionNodes,
        QuotaKind::NodePermissions,
        QuotaKind::NodeSize,
    ];

    /// The name on the wire (xenstored's names).
    pub fn name(self) -> &'static str {
        match self {
            QuotaKind::Nodes => "nodes",
            QuotaKind::NodeSize => "node-size",
            QuotaKind::Watches => "watches",
            QuotaKind::Transactions => "transactions",
            QuotaKind::NodePermissions => "node-permissions",
            QuotaKind::TransactionNodes => "transaction-nodes",
        }
    }

    /// The quota with this wire name.
    pub fn from_name(name: &str) -> Option<QuotaKind> {
        Self::ALL.into_iter().find(|q| q.name() == name)
    }
}

impl Quotas {
    /// The value of one quota.
    pub fn get(&self, kind: QuotaKind) -> u32 {
        match kind {
            QuotaKind::Nodes => self.nodes,
            QuotaKind::NodeSize => self.node_size,
            QuotaKind::Watches => self.watches,
            QuotaKind::Transactions => self.transactions,
            QuotaKind::NodePermissions => self.node_permissions,
            QuotaKind::TransactionNodes => self.transaction_nodes,
        }
    }

    /// Sets one quota.
    pub fn set(&mut self, kind: QuotaKind, value: u32) {
        match kind {
            QuotaKind::Nodes => self.nodes = value,
            QuotaKind::NodeSize => self.node_size = value,
            QuotaKind::Watches => self.watches = value,
            QuotaKind::Transactions => self.transactions = value,
            QuotaKind::NodePermissions => self.node_permissions = value,
            QuotaKind::TransactionNodes => self.transaction_nodes = value,
        }
    }
}

/// How the store is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Default quotas for every unprivileged domain (`SET_QUOTA` changes them at run time).
    pub quotas: Quotas,
    /// On domain release, hand the nodes the domain owns to dom0 instead of deleting them
    /// (xenstored's `--keep-orphans`). Off by default, as in xenstored.
    pub keep_orphans: bool,
    /// Connections one unprivileged domain may have open at once (served sockets and
    /// [`Server::connect`](super::Server::connect)); more are refused. xenstored gives a domU
    /// exactly one (its ring, which all its processes share); here each process of a guest
    /// opens its own, so a few are allowed.
    pub max_domain_connections: usize,
    /// Requests of one unprivileged domain whose reply, or a watch event they caused, is not
    /// yet written out (xenstored's `quota-outstanding`, 20). At the limit the server stops
    /// reading that domain's connections until some are delivered.
    pub max_outstanding: usize,
    /// Bytes of frames queued for one unprivileged domain's connections beyond which further
    /// watch events for it are dropped (replies never are): xenstored's hard memory quota,
    /// 2.5 MiB (which there counts the domain's nodes too).
    pub max_domain_output_bytes: usize,
    /// A watch event queued this long for an unprivileged connection without being sent is
    /// dropped (xenstored's watch-event timeout, 20 s).
    pub watch_event_timeout: Duration,
    /// Frames queued for one privileged connection beyond which it is dropped (xenstored sets
    /// no bound for dom0; this one only stops a stuck local tool from exhausting memory).
    pub max_queued_messages: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            quotas: Quotas::default(),
            keep_orphans: false,
            max_domain_connections: 16,
            max_outstanding: 20,
            max_domain_output_bytes: 2 * 1024 * 1024 + 512 * 1024,
            watch_event_timeout: Duration::from_secs(20),
            max_queued_messages: 65536,
        }
    }
}
