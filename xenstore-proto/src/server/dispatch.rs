//! What each request does to the [`Store`], and watch firing.

use crate::wire::{DirectoryPart, MsgType, Perms, QuotaReply, Request, Response, XsErrno};

use super::config::QuotaKind;
use super::ops;
use super::store::{
    canonical, domain_path, ConnId, Output, Store, DOMID_FIRST_RESERVED, FEATURES,
    FEATURE_WATCHDEPTH,
};
use super::txn::{Txn, View};
use super::watch::{Event, Match, Watch};

/// A successful reply, owned (the codec's [`Response`] borrows).
pub(super) enum Reply {
    Ok,
    Bytes(Vec<u8>),
    Directory(Vec<String>),
    Part(ops::Part),
    Perms(Perms),
    TxId(u32),
    Path(String),
    Bool(bool),
    Number(u32),
    QuotaNames(Vec<&'static str>),
}

impl Reply {
    pub(super) fn as_response(&self, ty: MsgType) -> Response<'_> {
        match self {
            Reply::Ok => Response::Ok(ty),
            Reply::Bytes(b) if ty == MsgType::Control => Response::Control(b),
            Reply::Bytes(b) => Response::Read(b),
            Reply::Directory(names) => {
                Response::Directory(names.iter().map(String::as_str).collect())
            }
            Reply::Part(p) => Response::DirectoryPart(DirectoryPart {
                generation: p.generation,
                children: p.children.iter().map(String::as_str).collect(),
                complete: p.complete,
            }),
            Reply::Perms(p) => Response::GetPerms(p.clone()),
            Reply::TxId(id) => Response::TransactionStart(*id),
            Reply::Path(p) => Response::GetDomainPath(p),
            Reply::Bool(b) => Response::IsDomainIntroduced(*b),
            Reply::Number(n) if ty == MsgType::GetQuota => {
                Response::GetQuota(QuotaReply::Value(*n))
            }
            Reply::Number(n) => Response::GetFeature(*n),
            Reply::QuotaNames(n) => Response::GetQuota(QuotaReply::Names(n.clone())),
        }
    }
}

/// A domid a request may name: a real domain, not a reserved `DOMID_*` value.
fn real_domid(domid: u32) -> Result<u32, XsErrno> {
    if domid < DOMID_FIRST_RESERVED {
        Ok(domid)
    } else {
        Err(XsErrno::EINVAL)
    }
}

/// The optional depth of a `WATCH`: a third, non-empty string (the codec ignores it).
fn watch_depth(payload: &[u8]) -> Result<Option<u32>, XsErrno> {
    let parts: Vec<&[u8]> = payload.split(|&b| b == 0).collect();
    match parts.get(2) {
        Some(d) if !d.is_empty() => {
            if !d.iter().all(u8::is_ascii_digit) {
                return Err(XsErrno::EINVAL);
            }
            std::str::from_utf8(d)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or(XsErrno::EINVAL)
        }
        _ => Ok(None),
    }
}

impl Store {
    /// Runs a node operation on the committed tree or, with `tx` set, on that transaction.
    fn with_view<T>(
        &mut self,
        conn: ConnId,
        tx: u32,
        out: &mut Output,
        op: impl FnOnce(&mut View, &mut Vec<Event>) -> Result<T, XsErrno>,
    ) -> Result<T, XsErrno> {
        let mut events = Vec::new();
        let result = if tx == 0 {
            let r = op(&mut View::Direct(&mut self.tree), &mut events);
            self.fire(&events, out);
            r
        } else {
            let limit = match self.conns.get(&conn) {
                Some(c) if c.domid != 0 => self.quotas(c.domid).transaction_nodes as usize,
                _ => usize::MAX,
            };
            let c = self.conns.get_mut(&conn).ok_or(XsErrno::EINVAL)?;
            if c.txns.get(&tx).is_some_and(|t| t.size() >= limit) {
                return Err(XsErrno::ENOSPC);
            }
            let mut txn = c.txns.remove(&tx).ok_or(XsErrno::ENOENT)?;
            let r = op(&mut View::Txn(&self.tree, &mut txn), &mut events);
            if r.is_ok() {
                txn.queue_events(&mut events);
            }
            if let Some(c) = self.conns.get_mut(&conn) {
                c.txns.insert(tx, txn);
            }
            r
        };
        result
    }

    /// Sends every watch an event matches to its connection.
    pub(super) fn fire(&self, events: &[Event], out: &mut Output) {
        if events.is_empty() {
            return;
        }
        for (&id, conn) in &self.conns {
            let caller = self.caller(conn.domid);
            for event in events {
                if !event.visible_to(&caller) {
                    continue;
                }
                for watch in conn.watches.iter().filter(|w| w.matches(event)) {
                    let resp = Response::WatchEvent {
                        path: watch.event_path(event),
                        token: &watch.token,
                    };
                    match resp.to_frame(0, 0) {
                        Ok(f) => out.send(id, f),
                        Err(e) => tracing::warn!(conn = id, error = %e, "watch event dropped"),
                    }
                }
            }
        }
    }

    /// Fires `@<name>` (plain watches) and `@<name>/<domid>` (depth watches), for the
    /// connections that may read the special node: dom0, and domains its permissions name
    /// (XSA-115; by default `n0`, dom0 only).
    fn fire_special(&self, name: &str, domid: u32, out: &mut Output) {
        let perms = vec![self.special[name].clone()];
        let events = [
            Event {
                path: name.to_owned(),
                kind: Match::NoDepth,
                perms: perms.clone(),
            },
            Event {
                path: format!("{name}/{domid}"),
                kind: Match::Depth,
                perms,
            },
        ];
        self.fire(&events, out);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch(
        &mut self,
        conn: ConnId,
        domid: u32,
        tx: u32,
        req: &Request<'_>,
        payload: &[u8],
        out: &mut Output,
        after: &mut Vec<Vec<u8>>,
    ) -> Result<Reply, XsErrno> {
        let caller = self.caller(domid);
        let quotas = self.quotas(domid);
        let abs = |path: &str| canonical(domid, path);
        match *req {
            Request::Read { path } => self
                .with_view(conn, tx, out, |v, _| ops::read(v, &caller, &abs(path)))
                .map(Reply::Bytes),
            Request::Directory { path } => self
                .with_view(conn, tx, out, |v, _| ops::directory(v, &caller, &abs(path)))
                .map(Reply::Directory),
            Request::DirectoryPart { path, offset } => self
                .with_view(conn, tx, out, |v, _| {
                    ops::directory_part(v, &caller, &abs(path), offset)
                })
                .map(Reply::Part),
            Request::GetPerms { path } => self
                .with_view(conn, tx, out, |v, _| ops::get_perms(v, &caller, &abs(path)))
                .map(Reply::Perms),
            Request::Write { path, value } => self
                .with_view(conn, tx, out, |v, ev| {
                    ops::write(v, &caller, &quotas, &abs(path), value, ev)
                })
                .map(|()| Reply::Ok),
            Request::Mkdir { path } => self
                .with_view(conn, tx, out, |v, ev| {
                    ops::mkdir(v, &caller, &quotas, &abs(path), ev)
                })
                .map(|()| Reply::Ok),
            Request::Rm { path } => self
                .with_view(conn, tx, out, |v, ev| ops::rm(v, &caller, &abs(path), ev))
                .map(|()| Reply::Ok),
            Request::SetPerms { path, ref perms } if path.starts_with('@') => {
                self.set_special_perms(&caller, &quotas, path, perms)?;
                Ok(Reply::Ok)
            }
            Request::SetPerms { path, ref perms } => self
                .with_view(conn, tx, out, |v, ev| {
                    ops::set_perms(v, &caller, &quotas, &abs(path), perms, ev)
                })
                .map(|()| Reply::Ok),
            Request::Watch { path, token } => {
                self.watch(conn, domid, path, token, payload, after)?;
                Ok(Reply::Ok)
            }
            Request::Unwatch { path, token } => {
                let path = abs(path);
                let c = self.conns.get_mut(&conn).ok_or(XsErrno::EINVAL)?;
                let i = c
                    .watches
                    .iter()
                    .position(|w| w.path == path && w.token == token)
                    .ok_or(XsErrno::ENOENT)?;
                c.watches.remove(i);
                Ok(Reply::Ok)
            }
            Request::TransactionStart => {
                if tx != 0 {
                    return Err(XsErrno::EBUSY);
                }
                let open: usize = self
                    .conns
                    .values()
                    .filter(|c| c.domid == domid)
                    .map(|c| c.txns.len())
                    .sum();
                if domid != 0 && open >= quotas.transactions as usize {
                    return Err(XsErrno::ENOSPC);
                }
                let c = self.conns.get_mut(&conn).ok_or(XsErrno::EINVAL)?;
                let mut id = c.next_txn;
                while id == 0 || c.txns.contains_key(&id) {
                    id = id.wrapping_add(1);
                }
                c.next_txn = id.wrapping_add(1);
                c.txns.insert(id, Txn::default());
                Ok(Reply::TxId(id))
            }
            Request::TransactionEnd { commit } => {
                let c = self.conns.get_mut(&conn).ok_or(XsErrno::EINVAL)?;
                let txn = c.txns.remove(&tx).ok_or(XsErrno::ENOENT)?;
                if commit {
                    self.commit(domid, txn, out)?;
                }
                Ok(Reply::Ok)
            }
            Request::ResetWatches => {
                let c = self.conns.get_mut(&conn).ok_or(XsErrno::EINVAL)?;
                c.watches.clear();
                c.txns.clear();
                Ok(Reply::Ok)
            }
            Request::GetDomainPath { domid } => Ok(Reply::Path(domain_path(real_domid(domid)?))),
            Request::Introduce { domid, evtchn, .. } => {
                let domid = real_domid(domid)?;
                if evtchn == 0 {
                    return Err(XsErrno::EINVAL);
                }
                self.introduce_into(domid, out);
                Ok(Reply::Ok)
            }
            Request::Release { domid } => {
                let domid = real_domid(domid)?;
                if domid == 0 {
                    return Err(XsErrno::EINVAL);
                }
                if !self.is_introduced(domid) {
                    return Err(XsErrno::ENOENT);
                }
                self.release_into(domid, out);
                Ok(Reply::Ok)
            }
            Request::Resume { domid } => {
                let domid = real_domid(domid)?;
                if domid == 0 {
                    return Err(XsErrno::EINVAL);
                }
                if !self.is_introduced(domid) {
                    return Err(XsErrno::ENOENT);
                }
                Ok(Reply::Ok)
            }
            Request::IsDomainIntroduced { domid } => Ok(Reply::Bool(
                domid == DOMID_FIRST_RESERVED || self.is_introduced(real_domid(domid)?),
            )),
            Request::SetTarget { domid, target } => {
                let (domid, target) = (real_domid(domid)?, real_domid(target)?);
                for d in [domid, target] {
                    if !self.domains.contains_key(&d) {
                        return Err(XsErrno::ENOENT);
                    }
                }
                if let Some(d) = self.domains.get_mut(&domid) {
                    d.target = Some(target);
                }
                Ok(Reply::Ok)
            }
            Request::GetFeature { domid: None } => Ok(Reply::Number(
                self.domains.get(&domid).map_or(FEATURES, |d| d.features),
            )),
            Request::GetFeature { domid: Some(d) } => self
                .domains
                .get(&real_domid(d)?)
                .map(|d| Reply::Number(d.features))
                .ok_or(XsErrno::ENOENT),
            Request::SetFeature { domid, features } => {
                let d = self
                    .domains
                    .get_mut(&real_domid(domid)?)
                    .ok_or(XsErrno::ENOENT)?;
                if d.introduced {
                    return Err(XsErrno::EBUSY);
                }
                if features & !FEATURES != 0 {
                    return Err(XsErrno::EINVAL);
                }
                d.features = features;
                Ok(Reply::Ok)
            }
            Request::GetQuota { quota: None, .. } => Ok(Reply::QuotaNames(
                QuotaKind::ALL.iter().map(|q| q.name()).collect(),
            )),
            Request::GetQuota {
                domid: d,
                quota: Some(name),
            } => {
                let kind = QuotaKind::from_name(name).ok_or(XsErrno::EINVAL)?;
                let quotas = match d {
                    None => self.config.quotas,
                    Some(d) => {
                        let d = real_domid(d)?;
                        if !self.domains.contains_key(&d) {
                            return Err(XsErrno::ENOENT);
                        }
                        self.quotas(d)
                    }
                };
                Ok(Reply::Number(quotas.get(kind)))
            }
            Request::SetQuota {
                domid: d,
                quota,
                value,
            } => {
                let kind = QuotaKind::from_name(quota).ok_or(XsErrno::EINVAL)?;
                if value == 0 {
                    return Err(XsErrno::EINVAL);
                }
                match d {
                    None => self.config.quotas.set(kind, value),
                    Some(d) => {
                        let global = self.config.quotas;
                        let dom = self
                            .domains
                            .get_mut(&real_domid(d)?)
                            .ok_or(XsErrno::ENOENT)?;
                        dom.quotas.get_or_insert(global).set(kind, value);
                    }
                }
                Ok(Reply::Ok)
            }
            Request::Control { ref args } => self.control(args),
        }
    }

    fn watch(
        &mut self,
        conn: ConnId,
        domid: u32,
        path: &str,
        token: &str,
        payload: &[u8],
        after: &mut Vec<Vec<u8>>,
    ) -> Result<(), XsErrno> {
        let depth = watch_depth(payload)?;
        let features = self.domains.get(&domid).map_or(FEATURES, |d| d.features);
        if depth.is_some() && features & FEATURE_WATCHDEPTH == 0 {
            return Err(XsErrno::EINVAL);
        }
        let relative = !path.starts_with('/') && !path.starts_with('@');
        let abs = canonical(domid, path);
        if abs.len() > crate::wire::ABS_PATH_MAX {
            return Err(XsErrno::EINVAL);
        }
        let quota = self.quotas(domid).watches as usize;
        let domain_watches: usize = self
            .conns
            .values()
            .filter(|c| c.domid == domid)
            .map(|c| c.watches.len())
            .sum();
        let c = self.conns.get_mut(&conn).ok_or(XsErrno::EINVAL)?;
        if c.watches.iter().any(|w| w.path == abs && w.token == token) {
            return Err(XsErrno::EEXIST);
        }
        if domid != 0 && domain_watches >= quota {
            return Err(XsErrno::E2BIG);
        }
        let watch = Watch {
            prefix_len: if relative {
                domain_path(domid).len() + 1
            } else {
                0
            },
            path: abs,
            token: token.to_owned(),
            depth,
        };
        let first = Response::WatchEvent {
            path: &watch.path[watch.prefix_len..],
            token,
        }
        .to_frame(0, 0);
        if let Ok(f) = first {
            after.push(f);
        }
        c.watches.push(watch);
        Ok(())
    }

    /// `SET_PERMS` of `@introduceDomain` / `@releaseDomain`, as xenstored 4.17: whoever may
    /// write and owns the special node (dom0, by default) decides who gets its events. Other
    /// `@` names are `EINVAL`.
    fn set_special_perms(
        &mut self,
        caller: &super::tree::Caller,
        quotas: &super::config::Quotas,
        path: &str,
        perms: &Perms,
    ) -> Result<(), XsErrno> {
        if !caller.privileged() && perms.0.len() > quotas.node_permissions as usize {
            return Err(XsErrno::ENOSPC);
        }
        let Some(current) = self.special.get_mut(path) else {
            return Err(XsErrno::EINVAL);
        };
        if perms.0.is_empty() {
            return Err(XsErrno::EINVAL);
        }
        let need = super::tree::WRITE | super::tree::OWNER;
        if caller.access(current) & need != need {
            return Err(XsErrno::EACCES);
        }
        *current = perms.clone();
        Ok(())
    }

    fn commit(&mut self, domid: u32, txn: Txn, out: &mut Output) -> Result<(), XsErrno> {
        if txn.conflicts(&self.tree) {
            return Err(XsErrno::EAGAIN);
        }
        if domid != 0 {
            let owned = i64::from(self.tree.owned(domid)) + txn.owned_delta(domid);
            if txn.owned_delta(domid) > 0 && owned > i64::from(self.quotas(domid).nodes) {
                return Err(XsErrno::ENOSPC);
            }
        }
        let events = txn.apply(&mut self.tree);
        self.fire(&events, out);
        Ok(())
    }

    fn control(&mut self, args: &[&[u8]]) -> Result<Reply, XsErrno> {
        let (cmd, params) = args.split_first().ok_or(XsErrno::EINVAL)?;
        match *cmd {
            b"help" if params.is_empty() => Ok(Reply::Bytes(
                b"check           \nhelp            \nprint           <string>\n\0".to_vec(),
            )),
            b"print" if params.len() == 1 => {
                tracing::info!("control: {}", String::from_utf8_lossy(params[0]));
                Ok(Reply::Bytes(b"OK\0".to_vec()))
            }
            b"check" if params.is_empty() => match self.check() {
                Ok(()) => Ok(Reply::Bytes(b"OK\0".to_vec())),
                Err(why) => {
                    tracing::error!(why, "store check failed");
                    Err(XsErrno::EIO)
                }
            },
            b"help" | b"print" | b"check" => Err(XsErrno::EINVAL),
            _ => Err(XsErrno::ENOSYS),
        }
    }

    /// Marks `domid` introduced and fires `@introduceDomain` (once per introduction).
    pub fn introduce_domain(&mut self, domid: u32) -> Output {
        let mut out = Output::default();
        self.introduce_into(domid, &mut out);
        out
    }

    fn introduce_into(&mut self, domid: u32, out: &mut Output) {
        let d = self
            .domains
            .entry(domid)
            .or_insert_with(|| super::store::Domain {
                features: FEATURES,
                ..Default::default()
            });
        if d.introduced {
            return;
        }
        d.introduced = true;
        tracing::info!(domid, "domain introduced");
        self.fire_special("@introduceDomain", domid, out);
    }

    /// Releases `domid` as xenstored does when a domain goes: its connections close (their
    /// watches removed first), the nodes it owns are deleted (or, with
    /// [`Config::keep_orphans`](super::Config), handed to dom0), permission entries naming it
    /// are dropped, and `@releaseDomain` fires. `/local/domain/<domid>` itself, owned by the
    /// toolstack, stays for the toolstack to remove.
    pub fn release_domain(&mut self, domid: u32) -> Output {
        let mut out = Output::default();
        self.release_into(domid, &mut out);
        out
    }

    fn release_into(&mut self, domid: u32, out: &mut Output) {
        if domid == 0 {
            return;
        }
        let gone: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.domid == domid)
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.close(id);
            out.closed.push(id);
        }
        self.release_nodes(domid, out);
        for perms in self.special.values_mut() {
            super::tree::forget_domid(perms, domid);
        }
        let was_introduced = self.domains.remove(&domid).is_some_and(|d| d.introduced);
        for d in self.domains.values_mut() {
            if d.target == Some(domid) {
                d.target = None;
            }
        }
        tracing::info!(domid, "domain released");
        if was_introduced {
            self.fire_special("@releaseDomain", domid, out);
        }
    }

    fn release_nodes(&mut self, domid: u32, out: &mut Output) {
        let keep = self.config.keep_orphans;
        let mut events = Vec::new();
        let mut stack = vec!["/".to_owned()];
        while let Some(path) = stack.pop() {
            let Some(node) = self.tree.nodes.get(&path) else {
                continue;
            };
            if node.owner() == domid && !keep {
                ops::remove_subtree(&mut View::Direct(&mut self.tree), &path, &mut events);
                continue;
            }
            let mut changed = node.clone();
            super::tree::forget_domid(&mut changed.perms, domid);
            for child in &node.children {
                stack.push(super::tree::join(&path, child));
            }
            if changed.perms != node.perms {
                self.tree.set(&path, changed);
            }
        }
        self.fire(&events, out);
    }
}
