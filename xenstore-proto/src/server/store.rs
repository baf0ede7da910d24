//! The synchronous core: connections, domains, and the handling of one request at a time.
//! No sockets here: a request frame goes in, frames for this and other connections come out.

use std::collections::{BTreeMap, HashMap};

use crate::wire::{
    FrameDecoder, MsgType, Packet, PermKind, Perms, Request, Response, WireError, XsErrno,
};

use super::config::{Config, Quotas};
use super::tree::{Caller, Tree};
use super::txn::Txn;
use super::watch::Watch;

/// A connection's number within one [`Store`].
pub type ConnId = u64;

/// `XENSTORE_SERVER_FEATURE_WATCHDEPTH`: `WATCH` takes a depth.
pub const FEATURE_WATCHDEPTH: u32 = 4;
/// Features this server offers (`GET_FEATURE`).
pub const FEATURES: u32 = FEATURE_WATCHDEPTH;
/// First reserved domid (`DOMID_FIRST_RESERVED`); `DOMID_SELF` is this value.
pub const DOMID_FIRST_RESERVED: u32 = 0x7ff0;

/// What handling produced: frames to send, in order, and connections to close (after
/// sending what is queued for them).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Output {
    pub messages: Vec<(ConnId, Vec<u8>)>,
    pub closed: Vec<ConnId>,
}

impl Output {
    pub(super) fn send(&mut self, conn: ConnId, frame: Vec<u8>) {
        self.messages.push((conn, frame));
    }
}

#[derive(Debug)]
pub(super) struct Conn {
    pub domid: u32,
    decoder: FrameDecoder,
    pub watches: Vec<Watch>,
    pub txns: HashMap<u32, Txn>,
    pub next_txn: u32,
}

#[derive(Debug, Default)]
pub(super) struct Domain {
    pub introduced: bool,
    pub features: u32,
    pub quotas: Option<Quotas>,
    pub target: Option<u32>,
}

/// The in-memory XenStore with xenstored's semantics.
#[derive(Debug)]
pub struct Store {
    pub(super) tree: Tree,
    pub(super) conns: BTreeMap<ConnId, Conn>,
    pub(super) domains: HashMap<u32, Domain>,
    pub(super) config: Config,
    /// Permissions of `@introduceDomain` and `@releaseDomain` (XSA-115): who gets their events.
    pub(super) special: HashMap<&'static str, Perms>,
    next_conn: ConnId,
}

/// The special watch paths that carry permissions, as xenstored 4.17 keeps them.
pub(super) const SPECIAL_PATHS: [&str; 2] = ["@introduceDomain", "@releaseDomain"];

/// `/local/domain/<domid>`.
pub fn domain_path(domid: u32) -> String {
    format!("/local/domain/{domid}")
}

pub(super) fn canonical(domid: u32, path: &str) -> String {
    if path.starts_with('/') || path.starts_with('@') {
        path.to_owned()
    } else {
        format!("{}/{path}", domain_path(domid))
    }
}

pub(super) fn frame(resp: Response<'_>, req_id: u32, tx_id: u32) -> Vec<u8> {
    resp.to_frame(req_id, tx_id).unwrap_or_else(|_| {
        Response::Error(XsErrno::E2BIG)
            .to_frame(req_id, tx_id)
            .expect("error reply fits")
    })
}

impl Store {
    /// An empty store (`/`, `/tool`, `/tool/xenstored`), dom0 known and introduced.
    pub fn new(config: Config) -> Store {
        let mut domains = HashMap::new();
        domains.insert(
            0,
            Domain {
                introduced: true,
                features: FEATURES,
                ..Domain::default()
            },
        );
        Store {
            tree: Tree::new(),
            conns: BTreeMap::new(),
            domains,
            config,
            special: SPECIAL_PATHS
                .into_iter()
                .map(|p| (p, Perms::owned_by(0, PermKind::None)))
                .collect(),
            next_conn: 1,
        }
    }

    /// Opens a connection speaking as `domid` (0 is privileged).
    pub fn open(&mut self, domid: u32) -> ConnId {
        let id = self.next_conn;
        self.next_conn += 1;
        self.domains.entry(domid).or_insert_with(|| Domain {
            features: FEATURES,
            ..Domain::default()
        });
        self.conns.insert(
            id,
            Conn {
                domid,
                decoder: FrameDecoder::new(),
                watches: Vec::new(),
                txns: HashMap::new(),
                next_txn: 1,
            },
        );
        tracing::debug!(conn = id, domid, "connection opened");
        id
    }

    /// Forgets a connection: its watches and open transactions go.
    pub fn close(&mut self, conn: ConnId) {
        if self.conns.remove(&conn).is_some() {
            tracing::debug!(conn, "connection closed");
        }
    }

    /// Whether `conn` is open.
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// The domain a connection speaks as.
    pub fn conn_domid(&self, conn: ConnId) -> Option<u32> {
        self.conns.get(&conn).map(|c| c.domid)
    }

    /// Open connections.
    pub fn conn_ids(&self) -> Vec<ConnId> {
        self.conns.keys().copied().collect()
    }

    /// Open connections speaking as `domid`.
    pub fn domain_conn_count(&self, domid: u32) -> usize {
        self.conns.values().filter(|c| c.domid == domid).count()
    }

    /// Watches set on a connection.
    pub fn watch_count(&self, conn: ConnId) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.watches.len())
    }

    /// Nodes in the store.
    pub fn node_count(&self) -> usize {
        self.tree.nodes.len()
    }

    /// Nodes `domid` owns.
    pub fn owned_by(&self, domid: u32) -> u32 {
        self.tree.owned(domid)
    }

    /// Whether `domid` has been introduced and not released (dom0 always is).
    pub fn is_introduced(&self, domid: u32) -> bool {
        self.domains.get(&domid).is_some_and(|d| d.introduced)
    }

    /// Checks the store's invariants (tree shape, owner accounting).
    pub fn check(&self) -> Result<(), String> {
        self.tree.check()
    }

    pub(super) fn caller(&self, domid: u32) -> Caller {
        Caller {
            domid,
            target: self.domains.get(&domid).and_then(|d| d.target),
        }
    }

    pub(super) fn quotas(&self, domid: u32) -> Quotas {
        self.domains
            .get(&domid)
            .and_then(|d| d.quotas)
            .unwrap_or(self.config.quotas)
    }

    /// Feeds bytes read from a connection's stream; whole frames are handled in order. An
    /// oversized message closes the connection, as xenstored does.
    pub fn feed(&mut self, conn: ConnId, bytes: &[u8]) -> Output {
        let mut out = Output::default();
        let Some(c) = self.conns.get_mut(&conn) else {
            return out;
        };
        c.decoder.push(bytes);
        while let Some(c) = self.conns.get_mut(&conn) {
            match c.decoder.next_frame() {
                Ok(Some(frame)) => self.handle_into(conn, &frame, &mut out),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(conn, error = %e, "closing connection");
                    self.close(conn);
                    out.closed.push(conn);
                    break;
                }
            }
        }
        out
    }

    /// Handles one whole frame (header and payload) from `conn`.
    pub fn handle(&mut self, conn: ConnId, frame: &[u8]) -> Output {
        let mut out = Output::default();
        self.handle_into(conn, frame, &mut out);
        out
    }

    fn handle_into(&mut self, conn: ConnId, bytes: &[u8], out: &mut Output) {
        let Some(domid) = self.conn_domid(conn) else {
            return;
        };
        let packet = match Packet::new_checked(bytes) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(conn, error = %e, "closing connection");
                self.close(conn);
                out.closed.push(conn);
                return;
            }
        };
        let (req_id, tx_id) = (packet.req_id(), packet.tx_id());
        let error = |out: &mut Output, errno: XsErrno| {
            out.send(conn, frame_err(errno, req_id, tx_id));
        };
        let ty = match packet.msg_type() {
            Ok(MsgType::WatchEvent | MsgType::Error) | Err(_) => {
                tracing::debug!(conn, raw = packet.msg_type_raw(), "unsupported type");
                return error(out, XsErrno::ENOSYS);
            }
            Ok(ty) => ty,
        };
        let req = match Request::parse(ty, packet.payload()) {
            Ok(r) => r,
            Err(WireError::WrongDirection(_) | WireError::UnknownType(_)) => {
                return error(out, XsErrno::ENOSYS)
            }
            Err(e) => {
                tracing::debug!(conn, %ty, error = %e, "malformed request");
                return error(out, XsErrno::EINVAL);
            }
        };
        tracing::trace!(conn, domid, req_id, tx_id, ?req, "request");
        let privileged_only = matches!(
            ty,
            MsgType::Control
                | MsgType::Introduce
                | MsgType::Release
                | MsgType::IsDomainIntroduced
                | MsgType::Resume
                | MsgType::SetTarget
                | MsgType::SetFeature
                | MsgType::GetQuota
                | MsgType::SetQuota
        ) || matches!(req, Request::GetFeature { domid: Some(_) });
        if privileged_only && domid != 0 {
            return error(out, XsErrno::EACCES);
        }
        let uses_txn = !matches!(ty, MsgType::Watch | MsgType::Unwatch);
        if uses_txn && tx_id != 0 && !self.conns[&conn].txns.contains_key(&tx_id) {
            return error(out, XsErrno::ENOENT);
        }
        let tx = if uses_txn { tx_id } else { 0 };
        let mut after = Vec::new();
        match self.dispatch(conn, domid, tx, &req, packet.payload(), out, &mut after) {
            Ok(reply) => out.send(conn, frame(reply.as_response(ty), req_id, tx_id)),
            Err(errno) => error(out, errno),
        }
        // What must follow the reply: the first event of a WATCH.
        for f in after {
            out.send(conn, f);
        }
    }
}

pub(super) fn frame_err(errno: XsErrno, req_id: u32, tx_id: u32) -> Vec<u8> {
    frame(Response::Error(errno), req_id, tx_id)
}
