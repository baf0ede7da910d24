//! The control service of one channel: every verb of the control ring (docs/protocol.md §1,
//! docs/backend.md "The control service"), validated. A request slot arrives as a private copy
//! (the ring copied it out of shared memory); whatever it says, the answer is a response slot
//! (possibly deferred, for `Connect`) — never a panic.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared_ring::abi::control::{
    access, field, ChannelStats, CmInfoReply, CmTarget, Op, PrivData, Reply, Request, RequestRepr,
    ResponseRepr, Status, CM_SLOTS, CM_SLOT_LEN, CONTROL_SLOT_LEN,
};
use shared_ring::abi::cqe::CQE_LEN;
use shared_ring::abi::event::{EventKind, EventRepr};
use shared_ring::abi::page_dir::dir_pages_needed;
use shared_ring::abi::wqe::WQE_LEN;
use shared_ring::doorbell;
use shared_ring::event_ring::EVENT_RING_LEN;
use shared_ring::{SharedRegion, PROTOCOL_VERSION};
use xen_platform::{Access, DomId, Platform};

use super::pages::{self, PagesError};
use super::policy::{CmPolicy, CmResource};
use crate::config::canonical_ip;
use crate::device::{
    ChannelId, ChannelMode, ChannelSetup, CmInfo, ConnRequestId, CqId, CqSetup, Device,
    DeviceError, ListenerId, MrHandle, MrSetup, Notifier, PdId, QpNum, QpSetup, RemoteAv,
    WorkQueue,
};
use crate::resources::budget::{BudgetExceeded, BudgetLimits, HostBudget, Pool};
use crate::resources::table::{ChannelTable, CqEntry, MrEntry, QpEntry};
use crate::resources::{Account, QuotaExceeded, Resource};
use crate::xenbus::{CloseReason, DeviceId};

/// Pages of the doorbell page the backend grants at `Init` (one: its grant is one reference).
const DOORBELL_PAGES: usize = 1;

/// A request failed: the status to answer, and why (for the log).
#[derive(Debug)]
pub(crate) struct Refusal {
    status: Status,
    why: String,
}

impl Refusal {
    fn new(status: Status, why: impl Into<String>) -> Refusal {
        Refusal {
            status,
            why: why.into(),
        }
    }
}

impl From<DeviceError> for Refusal {
    fn from(e: DeviceError) -> Refusal {
        Refusal::new(e.status(), e.to_string())
    }
}

impl From<QuotaExceeded> for Refusal {
    fn from(e: QuotaExceeded) -> Refusal {
        Refusal::new(Status::QuotaExceeded, e.to_string())
    }
}

impl From<BudgetExceeded> for Refusal {
    fn from(e: BudgetExceeded) -> Refusal {
        let status = match e {
            // The domain's fair share is a per-domain bound, like a quota.
            BudgetExceeded::Share { .. } => Status::QuotaExceeded,
            BudgetExceeded::Host { .. } => Status::NoResources,
        };
        Refusal::new(status, e.to_string())
    }
}

impl From<PagesError> for Refusal {
    fn from(e: PagesError) -> Refusal {
        match e {
            PagesError::BadGrant(why) => Refusal::new(Status::BadGrant, why),
            PagesError::NoResources(why) => Refusal::new(Status::NoResources, why),
        }
    }
}

type Outcome = Result<Reply, Refusal>;

/// Which table a directory-page entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Cq,
    Qp,
}

/// A `Connect` answered when the QP is connected (or cannot be, or its time is up).
#[derive(Debug, Clone, Copy)]
struct PendingConnect {
    req_id: u32,
    /// `Connect`, or `ConnectAv` (the software device's pairing at RTR).
    op: Op,
    qp: QpNum,
    deadline: Instant,
}

/// How long a `Connect` waits for the remote QP to name this one back. Past it the answer is
/// `ConnectionRefused` and the QP goes to Error, whether the remote QP is missing, another
/// domain's or connecting elsewhere: the three look the same (no QP-number oracle), and a
/// guest that named a wrong QP learns it instead of waiting forever.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The control service of one channel.
pub struct ControlService {
    device_id: DeviceId,
    channel: u32,
    domid: DomId,
    platform: Platform,
    device: Arc<dyn Device>,
    account: Arc<Account>,
    /// The host-wide page budgets, shared by every channel of every guest.
    budget: Arc<HostBudget>,
    /// Pages granted to the guest for this channel (charged to `max-granted-pages` and the
    /// domain's share of `[host] granted-pages`).
    granted: u64,
    mode: ChannelMode,
    notifier: Arc<dyn Notifier>,
    /// The channel's event channel, for the device's engine to wake on
    /// ([`crate::device::ChannelSetup::kick_source`]).
    kick_source: Option<Arc<dyn crate::device::KickSource>>,
    /// The device's channel, once `Init` succeeded.
    ch: Option<ChannelId>,
    table: ChannelTable,
    /// Directory pages describing queue pages to the guest, kept while the object lives.
    dir_pages: BTreeMap<(Kind, u32), Vec<SharedRegion>>,
    pending: Vec<PendingConnect>,
    connect_timeout: Duration,
    control_requests: u64,
    /// Grants of the channel's doorbell pages, page 0 (the `Init` page) first.
    doorbell_grefs: Vec<u32>,
    last_refusal: Option<String>,
    /// The connection-management policy (shared by every channel: its quotas are per domain).
    cm: Arc<CmPolicy>,
    /// Listeners of this channel (each counted in the domain's `max-listeners`).
    listeners: BTreeSet<ListenerId>,
    /// QPs whose connection-manager connect is in flight (each counted in `max-connects`).
    cm_connects: BTreeSet<QpNum>,
    /// The channel's CM page (private data in and out) and its grant, once asked for.
    cm_page: Option<(SharedRegion, u32)>,
}

/// Default backlog of a listener when `Listen` says 0, and the largest one.
pub const DEFAULT_BACKLOG: u32 = 16;
pub const MAX_BACKLOG: u32 = 128;
/// Most ports a `Listen` on port 0 tries from the domain's `allowed-ports` before it gives up.
pub const MAX_PORT_TRIES: usize = 64;

impl std::fmt::Debug for ControlService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlService")
            .field("device", &self.device_id)
            .field("channel", &self.channel)
            .field("ch", &self.ch)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl ControlService {
    /// A service for channel `channel` of `device_id`; nothing is allocated before `Init`.
    pub fn new(
        device_id: DeviceId,
        channel: u32,
        platform: Platform,
        device: Arc<dyn Device>,
        account: Arc<Account>,
        mode: ChannelMode,
        notifier: Arc<dyn Notifier>,
    ) -> ControlService {
        ControlService {
            device_id,
            channel,
            domid: DomId(device_id.domid as u16),
            platform,
            device,
            account,
            budget: Arc::new(HostBudget::new(BudgetLimits::UNLIMITED)),
            granted: 0,
            mode,
            notifier,
            kick_source: None,
            ch: None,
            table: ChannelTable::default(),
            dir_pages: BTreeMap::new(),
            pending: Vec::new(),
            connect_timeout: CONNECT_TIMEOUT,
            control_requests: 0,
            doorbell_grefs: Vec::new(),
            last_refusal: None,
            cm: Arc::new(CmPolicy::default()),
            listeners: BTreeSet::new(),
            cm_connects: BTreeSet::new(),
            cm_page: None,
        }
    }

    /// Applies `policy` (the daemon's `[cm]`: quotas per domain, allowed ports and peers);
    /// without it the defaults of `[cm]` apply.
    pub fn with_cm_policy(mut self, policy: Arc<CmPolicy>) -> ControlService {
        self.cm = policy;
        self
    }

    /// Lets the device's engine wake on `source`, the channel's event channel, when the guest
    /// kicks it ([`crate::device::ChannelSetup::kick_source`]); without it every kick goes
    /// through this service's thread ([`crate::device::Device::kick`]).
    pub fn with_kick_source(
        mut self,
        source: Arc<dyn crate::device::KickSource>,
    ) -> ControlService {
        self.kick_source = Some(source);
        self
    }

    /// Charges this channel's pages to `budget` too (the daemon's host-wide page budgets);
    /// without it only the device's quotas bound them.
    pub fn with_budget(mut self, budget: Arc<HostBudget>) -> ControlService {
        self.budget = budget;
        self
    }

    /// How long a `Connect` waits for its remote QP (default [`CONNECT_TIMEOUT`]).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> ControlService {
        self.connect_timeout = timeout;
        self
    }

    /// When the earliest waiting `Connect` times out, if any waits.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.iter().map(|p| p.deadline).min()
    }

    /// Pages granted to the guest for this channel now.
    pub fn granted_pages(&self) -> u64 {
        self.granted
    }

    /// Why the last refused request was refused (the sentence the log has).
    pub fn last_refusal(&self) -> Option<&str> {
        self.last_refusal.as_deref()
    }

    /// The device channel, once initialised.
    pub fn device_channel(&self) -> Option<ChannelId> {
        self.ch
    }

    /// Whether `Connect`s are waiting for their QP, or connection-manager connects are in
    /// flight (call [`ControlService::poll_pending`] then).
    pub fn has_pending(&self) -> bool {
        // Connection-manager connects too: [`ControlService::poll_pending`] gives their
        // `max-connects` count back once they are over (the device's events wake the
        // channel's thread, which calls it).
        !self.pending.is_empty() || !self.cm_connects.is_empty()
    }

    /// Handles one request slot; `None` when the answer is deferred (see
    /// [`ControlService::poll_pending`]).
    pub fn handle(&mut self, slot: &[u8; CONTROL_SLOT_LEN]) -> Option<[u8; CONTROL_SLOT_LEN]> {
        self.control_requests += 1;
        let req = match RequestRepr::parse(slot) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(device = %self.device_id, channel = self.channel, "malformed request: {e}");
                return Some(raw_error(slot, Status::BadRequest));
            }
        };
        let op = req.request.op();
        let outcome = self.dispatch(req.req_id, req.request);
        let rsp = match outcome {
            None => return None,
            Some(Ok(reply)) => ResponseRepr {
                req_id: req.req_id,
                op,
                status: Status::Ok,
                reply,
            },
            Some(Err(r)) => {
                if matches!(
                    r.status,
                    Status::QuotaExceeded | Status::NoResources | Status::NotPermitted
                ) {
                    tracing::warn!(device = %self.device_id, channel = self.channel, ?op, "{:?}: {}", r.status, r.why);
                } else {
                    tracing::debug!(device = %self.device_id, channel = self.channel, ?op, "{:?}: {}", r.status, r.why);
                }
                self.last_refusal = Some(r.why);
                ResponseRepr::error(req.req_id, op, r.status)
            }
        };
        Some(rsp.to_bytes())
    }

    /// Answers the deferred `Connect`s whose QP is now connected (or failed).
    pub fn poll_pending(&mut self) -> Vec<[u8; CONTROL_SLOT_LEN]> {
        let Some(ch) = self.ch else {
            return Vec::new();
        };
        self.refresh_cm_connects(ch);
        let mut out = Vec::new();
        let device = self.device.clone();
        let now = Instant::now();
        self.pending.retain(|p| {
            let status = match device.qp_state(ch, p.qp) {
                Ok(shared_ring::abi::control::QpState::Rts) => Status::Ok,
                Ok(shared_ring::abi::control::QpState::Error) => Status::ConnectionRefused,
                Ok(_) if now >= p.deadline => {
                    // Nobody named this QP back in time: it will not be paired later either.
                    if let Err(e) =
                        device.modify_qp(ch, p.qp, shared_ring::abi::control::QpState::Error)
                    {
                        tracing::debug!("timed-out connect of QP {}: {e}", p.qp.0);
                    }
                    Status::ConnectionRefused
                }
                Ok(_) => return true,
                Err(e) => e.status(),
            };
            out.push(
                ResponseRepr {
                    req_id: p.req_id,
                    op: p.op,
                    status,
                    reply: Reply::Empty,
                }
                .to_bytes(),
            );
            false
        });
        out
    }

    /// Forgets the connection-manager connects that are over (QP established, failed or
    /// gone): they no longer count in the domain's `max-connects`.
    fn refresh_cm_connects(&mut self, ch: ChannelId) {
        let device = self.device.clone();
        let before = self.cm_connects.len();
        self.cm_connects.retain(|qp| {
            !matches!(
                device.qp_state(ch, *qp),
                Ok(shared_ring::abi::control::QpState::Rts
                    | shared_ring::abi::control::QpState::Error)
                    | Err(_)
            )
        });
        let done = (before - self.cm_connects.len()) as u32;
        self.cm
            .refund(self.device_id.domid, CmResource::Connects, done);
    }

    /// Connection-manager connects in flight on this channel.
    pub fn cm_connects_in_flight(&self) -> usize {
        self.cm_connects.len()
    }

    /// Listeners of this channel.
    pub fn listener_count(&self) -> usize {
        self.listeners.len()
    }

    fn dispatch(&mut self, req_id: u32, request: Request) -> Option<Outcome> {
        let ch = match (request, self.ch) {
            (Request::Init { version }, _) => return Some(self.init(version)),
            (_, None) => {
                return Some(Err(Refusal::new(
                    Status::BadRequest,
                    "the channel is not initialised (send Init first)",
                )))
            }
            (_, Some(ch)) => ch,
        };
        Some(match request {
            Request::Init { .. } => unreachable!("handled above"),
            Request::QueryDevice => Ok(Reply::Device(self.attrs())),
            Request::QueryPort { port } => self.query_port(port),
            Request::QueryGid { port, index } => self.query_gid(port, index),
            Request::AllocPd => self.alloc_pd(ch),
            Request::DeallocPd { pd } => self.dealloc_pd(ch, PdId(pd)),
            Request::RegMr {
                pd,
                access,
                length,
                iova,
                first_page_offset,
                pages,
            } => self.reg_mr(
                ch,
                PdId(pd),
                access,
                length,
                iova,
                first_page_offset,
                &pages,
            ),
            Request::DeregMr { mr } => self.dereg_mr(ch, MrHandle(mr)),
            Request::CreateCq { cqe_log2 } => self.create_cq(ch, cqe_log2),
            Request::DestroyCq { cq } => self.destroy_cq(ch, CqId(cq)),
            Request::CreateQp {
                pd,
                send_cq,
                recv_cq,
                sq_log2,
                rq_log2,
            } => self.create_qp(ch, PdId(pd), CqId(send_cq), CqId(recv_cq), sq_log2, rq_log2),
            Request::ModifyQp { qp, state } => self
                .own_qp(QpNum(qp))
                .and_then(|qp| Ok(self.device.modify_qp(ch, qp, state)?))
                .map(|()| Reply::Empty),
            Request::DestroyQp { qp } => self.destroy_qp(ch, QpNum(qp)),
            Request::Listen {
                port,
                backlog,
                addr,
            } => self.listen(ch, port, backlog, addr),
            Request::CloseListener { listener } => self.close_listener(ch, ListenerId(listener)),
            Request::Connect {
                qp,
                port,
                addr,
                remote_qpn: 0,
                private,
            } => self.cm_connect(ch, QpNum(qp), addr, port, private),
            Request::Connect {
                qp,
                port,
                addr,
                remote_qpn,
                private,
            } => {
                return match self.connect(ch, QpNum(qp), port, addr, QpNum(remote_qpn), private) {
                    Ok(()) => {
                        self.pending.push(PendingConnect {
                            req_id,
                            op: Op::Connect,
                            qp: QpNum(qp),
                            deadline: Instant::now() + self.connect_timeout,
                        });
                        None
                    }
                    Err(r) => Some(Err(r)),
                }
            }
            Request::ConnectAv {
                qp,
                remote_qpn,
                gid,
                rq_psn,
                sq_psn,
                lid,
                path_mtu,
                rts,
            } => {
                let remote = RemoteAv {
                    gid,
                    lid,
                    qpn: remote_qpn,
                    psn: rq_psn,
                    mtu: u32::from(path_mtu),
                };
                return match self.connect_av(ch, QpNum(qp), remote, rts.then_some(sq_psn)) {
                    Ok(true) => Some(Ok(Reply::Empty)),
                    Ok(false) => {
                        self.pending.push(PendingConnect {
                            req_id,
                            op: Op::ConnectAv,
                            qp: QpNum(qp),
                            deadline: Instant::now() + self.connect_timeout,
                        });
                        None
                    }
                    Err(r) => Some(Err(r)),
                };
            }
            Request::Accept {
                request,
                qp,
                private,
            } => self.accept(ch, ConnRequestId(request), QpNum(qp), private),
            Request::Reject { request, private } => self.private_data(private).and_then(|data| {
                self.device.cm_reject(ch, ConnRequestId(request), &data)?;
                Ok(Reply::Empty)
            }),
            Request::Disconnect { qp } => self.own_qp(QpNum(qp)).and_then(|qp| {
                self.device.cm_disconnect(ch, qp)?;
                Ok(Reply::Empty)
            }),
            Request::CmInfo { target, slot } => self.cm_info(ch, target, slot),
            Request::CmPage => self.cm_page(),
            Request::ArmCq { cq, solicited_only } => self
                .own_cq(CqId(cq))
                .and_then(|cq| Ok(self.device.arm_cq(ch, cq, solicited_only)?))
                .map(|()| Reply::Empty),
            Request::Stats => {
                let s = self.device.stats(ch);
                Ok(Reply::Stats(ChannelStats {
                    work_requests: s.ops,
                    completions: s.ops,
                    control_requests: self.control_requests,
                    notifications: s.notifications,
                }))
            }
            Request::PostSend { qp, prod } => self.post(ch, QpNum(qp), WorkQueue::Sq, prod),
            Request::PostRecv { qp, prod } => self.post(ch, QpNum(qp), WorkQueue::Rq, prod),
            Request::PollCq { cq } => self.own_cq(CqId(cq)).and_then(|cq| {
                let cqe = self.device.poll_cq_mediated(ch, cq)?;
                Ok(Reply::Poll(cqe.map(|c| {
                    let mut b = c.to_bytes();
                    b[CQE_LEN - 4..].fill(0);
                    b
                })))
            }),
        })
    }

    /// Device limits as this guest sees them: the device's, bounded by the quotas.
    fn attrs(&self) -> shared_ring::abi::control::DeviceAttrs {
        let mut a = self.device.attrs();
        let q = self.account.quotas();
        a.max_qp = a.max_qp.min(q.max_qps);
        a.max_cq = a.max_cq.min(q.max_cqs);
        a.max_mr = a.max_mr.min(q.max_mrs);
        a.max_pd = a.max_pd.min(q.max_pds);
        a.max_mr_pages = a.max_mr_pages.min(q.max_mr_pages);
        a
    }

    fn init(&mut self, version: u32) -> Outcome {
        if self.ch.is_some() {
            return Err(Refusal::new(Status::BadRequest, "Init sent twice"));
        }
        if version != PROTOCOL_VERSION {
            return Err(Refusal::new(
                Status::VersionMismatch,
                format!(
                    "Init with protocol version {version}; this backend speaks {PROTOCOL_VERSION}"
                ),
            ));
        }
        let event_pages = EVENT_RING_LEN / xen_platform::PAGE_SIZE;
        let cost = (DOORBELL_PAGES + event_pages) as u64;
        self.charge_granted(cost)?;
        let opened = (|| -> Result<_, Refusal> {
            let (doorbell, doorbell_grefs) = pages::share(
                &self.platform,
                self.domid,
                DOORBELL_PAGES,
                Access::ReadWrite,
            )?;
            let (event_ring, event_grefs) =
                pages::share(&self.platform, self.domid, event_pages, Access::ReadWrite)?;
            let slots = doorbell::slots_in(doorbell.len());
            let ch = self.device.open_channel(ChannelSetup {
                domid: self.domid,
                doorbell,
                event_ring,
                notifier: self.notifier.clone(),
                mode: self.mode,
                kick_source: self.kick_source.clone(),
            })?;
            Ok((ch, slots, doorbell_grefs, event_grefs))
        })();
        let (ch, slots, doorbell_grefs, event_grefs) = match opened {
            Ok(x) => x,
            Err(r) => {
                self.refund_granted(cost);
                return Err(r);
            }
        };
        self.ch = Some(ch);
        self.table = ChannelTable::new(slots);
        self.doorbell_grefs = vec![doorbell_grefs[0]];
        tracing::debug!(device = %self.device_id, channel = self.channel, "initialised: {slots} doorbell slots");
        Ok(Reply::Init {
            version: PROTOCOL_VERSION,
            doorbell_gref: doorbell_grefs[0],
            event_gref: event_grefs[0],
            doorbell_slots: slots,
        })
    }

    fn query_port(&self, port: u32) -> Outcome {
        if port != 1 {
            return Err(Refusal::new(
                Status::InvalidArgument,
                format!("port {port} does not exist (the device has port 1)"),
            ));
        }
        Ok(Reply::Port {
            state: 4, // ACTIVE, as ibverbs numbers it
            active_mtu: 4096,
            speed_mbps: 100_000,
            // The device's own GID (the first of its table); none on the software device.
            gid: self.device.gid_table().first().map_or([0; 16], |(g, _)| *g),
        })
    }

    /// Entry `index` of the device port's GID table (`QueryGid`). A device without a table
    /// of its own answers `NotSupported` (the guest library then uses the backend's address).
    fn query_gid(&self, port: u32, index: u32) -> Outcome {
        if port != 1 {
            return Err(Refusal::new(
                Status::InvalidArgument,
                format!("port {port} does not exist (the device has port 1)"),
            ));
        }
        let mut table = self.device.gid_table();
        table.truncate(shared_ring::abi::control::MAX_GIDS as usize);
        if table.is_empty() {
            return Err(Refusal::new(
                Status::NotSupported,
                "the device has no GID table of its own (the backend's address is GID 0)",
            ));
        }
        let count = table.len() as u32;
        match table.get(index as usize) {
            Some(&(gid, gid_type)) => Ok(Reply::Gid {
                gid,
                gid_type,
                count,
            }),
            None => Err(Refusal::new(
                Status::InvalidArgument,
                format!("GID index {index}: the table has {count} entries"),
            )),
        }
    }

    fn alloc_pd(&mut self, ch: ChannelId) -> Outcome {
        self.account.charge(Resource::Pds, 1)?;
        match self.device.alloc_pd(ch) {
            Ok(pd) => {
                self.table.pds.insert(pd);
                Ok(Reply::Handle(pd.0))
            }
            Err(e) => {
                self.account.refund(Resource::Pds, 1);
                Err(e.into())
            }
        }
    }

    fn dealloc_pd(&mut self, ch: ChannelId, pd: PdId) -> Outcome {
        self.own_pd(pd)?;
        if self.table.pd_in_use(pd) {
            return Err(Refusal::new(Status::Busy, format!("PD {} is in use", pd.0)));
        }
        self.device.dealloc_pd(ch, pd)?;
        self.table.pds.remove(&pd);
        self.account.refund(Resource::Pds, 1);
        Ok(Reply::Empty)
    }

    #[allow(clippy::too_many_arguments)]
    fn reg_mr(
        &mut self,
        ch: ChannelId,
        pd: PdId,
        acc: u32,
        length: u64,
        iova: u64,
        first_page_offset: u32,
        list: &shared_ring::abi::page_dir::PageList,
    ) -> Outcome {
        self.own_pd(pd)?;
        if acc & access::REMOTE_WRITE != 0 && acc & access::LOCAL_WRITE == 0 {
            return Err(Refusal::new(
                Status::InvalidArgument,
                "REMOTE_WRITE needs LOCAL_WRITE",
            ));
        }
        let n_pages = u64::from(list.n_pages());
        let need = u64::from(first_page_offset)
            .checked_add(length)
            .map(|end| end.div_ceil(xen_platform::PAGE_SIZE as u64));
        if length == 0 || need != Some(n_pages) {
            return Err(Refusal::new(
                Status::InvalidArgument,
                format!(
                    "a region of {length} bytes at page offset {first_page_offset} needs {need:?} pages, not {n_pages}"
                ),
            ));
        }
        if iova.checked_add(length).is_none() {
            return Err(Refusal::new(
                Status::InvalidArgument,
                "iova + length overflows",
            ));
        }
        // Quotas before any grant is touched: they bound the directory walk too.
        self.account.charge(Resource::Mrs, 1)?;
        if let Err(e) = self.account.charge(Resource::MrPages, n_pages) {
            self.account.refund(Resource::Mrs, 1);
            return Err(e.into());
        }
        if let Err(e) = self
            .budget
            .charge(self.device_id.domid, Pool::Mapped, n_pages)
        {
            self.account.refund(Resource::Mrs, 1);
            self.account.refund(Resource::MrPages, n_pages);
            return Err(e.into());
        }
        let domid = self.device_id.domid;
        let refund = |a: &Account, b: &HostBudget| {
            a.refund(Resource::Mrs, 1);
            a.refund(Resource::MrPages, n_pages);
            b.refund(domid, Pool::Mapped, n_pages);
        };
        let registered = (|| -> Result<crate::device::MrKeys, Refusal> {
            let grefs = pages::resolve_guest_list(&self.platform, self.domid, list)?;
            let (region, writable) = pages::map_guest_pages(&self.platform, self.domid, &grefs)?;
            Ok(self.device.reg_mr(
                ch,
                MrSetup {
                    pd,
                    pages: region,
                    writable,
                    first_page_offset,
                    length,
                    iova,
                    access: acc,
                },
            )?)
        })();
        match registered {
            Ok(keys) => {
                self.table
                    .mrs
                    .insert(keys.handle, MrEntry { pd, pages: n_pages });
                Ok(Reply::Mr {
                    mr: keys.handle.0,
                    lkey: keys.lkey,
                    rkey: keys.rkey,
                })
            }
            Err(r) => {
                refund(&self.account, &self.budget);
                Err(r)
            }
        }
    }

    fn dereg_mr(&mut self, ch: ChannelId, mr: MrHandle) -> Outcome {
        let Some(entry) = self.table.mrs.get(&mr).copied() else {
            return Err(bad_handle("MR", mr.0));
        };
        self.device.dereg_mr(ch, mr)?;
        self.table.mrs.remove(&mr);
        self.account.refund(Resource::Mrs, 1);
        self.account.refund(Resource::MrPages, entry.pages);
        self.budget
            .refund(self.device_id.domid, Pool::Mapped, entry.pages);
        Ok(Reply::Empty)
    }

    fn check_log2(&self, log2: u8, max: u32, what: &str) -> Result<usize, Refusal> {
        let entries = 1usize << log2;
        if entries as u64 > u64::from(max) {
            return Err(Refusal::new(
                Status::InvalidArgument,
                format!("{what} of {entries} entries exceeds the device limit {max}"),
            ));
        }
        Ok(entries)
    }

    fn create_cq(&mut self, ch: ChannelId, cqe_log2: u8) -> Outcome {
        let entries = self.check_log2(cqe_log2, self.device.attrs().max_cqe, "CQ")?;
        let ring_pages = pages::pages_for(entries, CQE_LEN);
        let cost = (ring_pages + dir_pages_needed(ring_pages)) as u64;
        self.account.charge(Resource::Cqs, 1)?;
        if let Err(r) = self.charge_granted(cost) {
            self.account.refund(Resource::Cqs, 1);
            return Err(r);
        }
        let made = (|| -> Result<(CqId, u32, shared_ring::abi::page_dir::PageList, Vec<SharedRegion>), Refusal> {
            let slot = self.take_slots(ch, 1)?[0];
            let result = (|| {
                // Read-only for the guest: it only polls; the backend writes the CQEs.
                let (ring, grefs) =
                    pages::share(&self.platform, self.domid, ring_pages, Access::ReadOnly)?;
                let (list, dirs) = pages::describe(&self.platform, self.domid, &grefs)?;
                let cq = self.device.create_cq(
                    ch,
                    CqSetup {
                        ring,
                        cqe_log2,
                        doorbell_slot: slot,
                    },
                )?;
                Ok((cq, slot, list, dirs))
            })();
            if result.is_err() {
                self.table.free_slots(&[slot]);
            }
            result
        })();
        match made {
            Ok((cq, slot, list, dirs)) => {
                self.table.cqs.insert(
                    cq,
                    CqEntry {
                        doorbell_slot: slot,
                        granted_pages: cost,
                    },
                );
                self.keep_dirs(Kind::Cq, cq.0, dirs);
                Ok(Reply::Cq {
                    cq: cq.0,
                    doorbell_slot: slot,
                    cqe_log2,
                    pages: list,
                    doorbell_gref: self.doorbell_gref_of(slot),
                })
            }
            Err(r) => {
                self.account.refund(Resource::Cqs, 1);
                self.refund_granted(cost);
                Err(r)
            }
        }
    }

    fn destroy_cq(&mut self, ch: ChannelId, cq: CqId) -> Outcome {
        let entry = self.own_cq_entry(cq)?;
        if self.table.cq_in_use(cq) {
            return Err(Refusal::new(
                Status::Busy,
                format!("CQ {} is used by a QP", cq.0),
            ));
        }
        self.device.destroy_cq(ch, cq)?;
        self.table.cqs.remove(&cq);
        self.table.free_slots(&[entry.doorbell_slot]);
        self.dir_pages.remove(&(Kind::Cq, cq.0));
        self.account.refund(Resource::Cqs, 1);
        self.refund_granted(entry.granted_pages);
        Ok(Reply::Empty)
    }

    fn create_qp(
        &mut self,
        ch: ChannelId,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
        sq_log2: u8,
        rq_log2: u8,
    ) -> Outcome {
        self.own_pd(pd)?;
        self.own_cq(send_cq)?;
        self.own_cq(recv_cq)?;
        let max_wr = self.device.attrs().max_qp_wr;
        let sq_entries = self.check_log2(sq_log2, max_wr, "send queue")?;
        let rq_entries = self.check_log2(rq_log2, max_wr, "receive queue")?;
        let sq_pages = pages::pages_for(sq_entries, WQE_LEN);
        let rq_pages = pages::pages_for(rq_entries, WQE_LEN);
        let cost = (sq_pages + rq_pages + dir_pages_needed(sq_pages + rq_pages)) as u64;
        self.account.charge(Resource::Qps, 1)?;
        if let Err(r) = self.charge_granted(cost) {
            self.account.refund(Resource::Qps, 1);
            return Err(r);
        }
        type Made = (
            QpNum,
            [u32; 2],
            shared_ring::abi::page_dir::PageList,
            Vec<SharedRegion>,
        );
        let made = (|| -> Result<Made, Refusal> {
            let slots = self.take_slots(ch, 2)?;
            let (sq_slot, rq_slot) = (slots[0], slots[1]);
            let result = (|| {
                let (sq, mut grefs) =
                    pages::share(&self.platform, self.domid, sq_pages, Access::ReadWrite)?;
                let (rq, rq_grefs) =
                    pages::share(&self.platform, self.domid, rq_pages, Access::ReadWrite)?;
                grefs.extend(rq_grefs);
                let (list, dirs) = pages::describe(&self.platform, self.domid, &grefs)?;
                let qp = self.device.create_qp(
                    ch,
                    QpSetup {
                        pd,
                        send_cq,
                        recv_cq,
                        sq,
                        rq,
                        sq_log2,
                        rq_log2,
                        sq_slot,
                        rq_slot,
                        sq_sig_all: false,
                    },
                )?;
                Ok((qp, [sq_slot, rq_slot], list, dirs))
            })();
            if result.is_err() {
                self.table.free_slots(&slots);
            }
            result
        })();
        match made {
            Ok((qp, [sq_slot, rq_slot], list, dirs)) => {
                self.table.qps.insert(
                    qp,
                    QpEntry {
                        pd,
                        send_cq,
                        recv_cq,
                        sq_slot,
                        rq_slot,
                        granted_pages: cost,
                    },
                );
                self.keep_dirs(Kind::Qp, qp.0, dirs);
                Ok(Reply::Qp {
                    qp: qp.0,
                    qp_num: qp.0,
                    sq_slot,
                    rq_slot,
                    sq_log2,
                    rq_log2,
                    pages: list,
                    doorbell_gref: self.doorbell_gref_of(sq_slot),
                })
            }
            Err(r) => {
                self.account.refund(Resource::Qps, 1);
                self.refund_granted(cost);
                Err(r)
            }
        }
    }

    fn destroy_qp(&mut self, ch: ChannelId, qp: QpNum) -> Outcome {
        let Some(entry) = self.table.qps.get(&qp).copied() else {
            return Err(bad_handle("QP", qp.0));
        };
        self.device.destroy_qp(ch, qp)?;
        self.forget_qp(qp, &entry);
        Ok(Reply::Empty)
    }

    fn forget_qp(&mut self, qp: QpNum, entry: &QpEntry) {
        self.table.qps.remove(&qp);
        self.table.free_slots(&[entry.sq_slot, entry.rq_slot]);
        self.dir_pages.remove(&(Kind::Qp, qp.0));
        self.account.refund(Resource::Qps, 1);
        self.refund_granted(entry.granted_pages);
        self.pending.retain(|p| p.qp != qp);
        if self.cm_connects.remove(&qp) {
            self.cm
                .refund(self.device_id.domid, CmResource::Connects, 1);
        }
    }

    /// Charges `n` granted pages to the device's quota and the domain's host share (both or
    /// neither), before any page is allocated.
    fn charge_granted(&mut self, n: u64) -> Result<(), Refusal> {
        self.account.charge(Resource::GrantedPages, n)?;
        if let Err(e) = self.budget.charge(self.device_id.domid, Pool::Granted, n) {
            self.account.refund(Resource::GrantedPages, n);
            return Err(e.into());
        }
        self.granted += n;
        Ok(())
    }

    /// Gives back `n` granted pages (their grants were revoked or are being).
    fn refund_granted(&mut self, n: u64) {
        let n = n.min(self.granted);
        self.granted -= n;
        self.account.refund(Resource::GrantedPages, n);
        self.budget.refund(self.device_id.domid, Pool::Granted, n);
    }

    /// An address-vector style connect: pairs `qp` with QP `remote` of this backend.
    fn connect(
        &mut self,
        ch: ChannelId,
        qp: QpNum,
        port: u16,
        addr: [u8; 16],
        remote: QpNum,
        private: PrivData,
    ) -> Result<(), Refusal> {
        self.own_qp(qp)?;
        if port != 0 || private != PrivData::NONE {
            return Err(Refusal::new(
                Status::InvalidArgument,
                "a Connect naming a remote QP number pairs on this backend: port and private \
                 data must be 0 (connect to a port with remote_qpn 0)",
            ));
        }
        if self.pending.iter().any(|p| p.qp == qp) || self.cm_connects.contains(&qp) {
            return Err(Refusal::new(
                Status::Busy,
                format!("QP {} is already connecting", qp.0),
            ));
        }
        // The peer is this backend: its own address (or the one the guest named, which must
        // be one of the backend's).
        let own = self.device.local_addrs();
        let target = match ip_of(addr) {
            None => own.first().copied(),
            Some(ip) if own.contains(&ip) => Some(ip),
            Some(ip) => {
                return Err(Refusal::new(
                    Status::InvalidArgument,
                    format!(
                        "a Connect naming a remote QP number pairs on this backend; {ip} is not \
                         one of its addresses"
                    ),
                ))
            }
        };
        let domid = self.device_id.domid;
        if let Some(ip) = target {
            if !self.cm.peer_allowed(domid, ip) {
                return Err(Refusal::new(
                    Status::NotPermitted,
                    format!("domain {domid} may not connect to {ip} ([cm] allowed-peers)"),
                ));
            }
        }
        // Not counted in max-connects: a pairing is bounded by the QPs (max-qps) and times
        // out by itself.
        self.device.connect_qp(ch, qp, remote)?;
        Ok(())
    }

    /// An address-vector connect (`ibv_modify_qp` to RTR, and with `sq_psn` on to RTS): the
    /// peer's GID is checked against `[cm] allowed-peers` first, whatever the device and the
    /// step. A device with address vectors moves the QP at once (`Ok(true)`: answer now).
    /// The software device has none: at RTR it pairs with QP `remote.qpn` of this backend
    /// when the GID is this backend's own (`Ok(false)`: answered when connected, as a
    /// pairing `Connect`); the RTS is then the pairing's (`Ok(true)`, nothing to do).
    fn connect_av(
        &mut self,
        ch: ChannelId,
        qp: QpNum,
        remote: RemoteAv,
        sq_psn: Option<u32>,
    ) -> Result<bool, Refusal> {
        self.own_qp(qp)?;
        if self.cm_connects.contains(&qp) {
            return Err(Refusal::new(
                Status::Busy,
                format!("QP {} is connecting through the connection manager", qp.0),
            ));
        }
        let domid = self.device_id.domid;
        let has_av = self.device.local_av().is_some();
        // Without address vectors the all-zero GID names this backend (checked as a pairing
        // `Connect` is, below).
        if has_av || remote.gid != [0; 16] {
            self.cm
                .av_peer_allowed(domid, remote.gid)
                .map_err(|why| Refusal::new(Status::NotPermitted, why))?;
        }
        // On InfiniBand the packets go to the LID, whatever GID the address vector also
        // names: a LID is checked as no address at all (allowed only without a list).
        if has_av && remote.lid != 0 {
            self.cm.av_peer_allowed(domid, [0; 16]).map_err(|_| {
                Refusal::new(
                    Status::NotPermitted,
                    format!(
                        "domain {domid} may not connect by LID ({}): a LID names no address \
                         [cm] allowed-peers could allow (InfiniBand routes by the LID, not \
                         the GID)",
                        remote.lid
                    ),
                )
            })?;
        }
        if has_av {
            if self.device.av_names_own_qp(&remote) {
                // A QP of this backend (another guest's, or this one) through the device's own
                // port: a pairing, as `Connect` by QP number — both ends must name each other,
                // so a guest cannot aim its QP at another guest's. The RTS step has nothing
                // left to do; the RTR step is answered once the pair is made (or refused).
                if sq_psn.is_some() {
                    return Ok(true);
                }
                self.connect(ch, qp, 0, [0; 16], QpNum(remote.qpn), PrivData::NONE)?;
                return Ok(false);
            }
            self.device.connect_qp_av(ch, qp, remote, sq_psn)?;
            return Ok(true);
        }
        if let Some(ip) = crate::control::policy::gid_peer(remote.gid) {
            if !self.device.local_addrs().contains(&ip) {
                return Err(Refusal::new(
                    Status::NotSupported,
                    format!(
                        "the device has no address vectors: a QP pairs with QPs of this \
                         backend only, and {ip} is not one of its addresses (connect through \
                         the connection manager between hosts)"
                    ),
                ));
            }
        }
        if sq_psn.is_some() {
            return Ok(true);
        }
        self.connect(ch, qp, 0, remote.gid, QpNum(remote.qpn), PrivData::NONE)?;
        Ok(false)
    }

    /// A connection-manager connect to `addr:port` with private data; answered at once, the
    /// outcome is an event.
    fn cm_connect(
        &mut self,
        ch: ChannelId,
        qp: QpNum,
        addr: [u8; 16],
        port: u16,
        private: PrivData,
    ) -> Outcome {
        self.own_qp(qp)?;
        let Some(ip) = ip_of(addr) else {
            return Err(Refusal::new(
                Status::InvalidArgument,
                "Connect to the unspecified address",
            ));
        };
        if port == 0 {
            return Err(Refusal::new(Status::InvalidArgument, "Connect to port 0"));
        }
        if self.pending.iter().any(|p| p.qp == qp) || self.cm_connects.contains(&qp) {
            return Err(Refusal::new(
                Status::Busy,
                format!("QP {} is already connecting", qp.0),
            ));
        }
        let domid = self.device_id.domid;
        if !self.cm.peer_allowed(domid, ip) {
            return Err(Refusal::new(
                Status::NotPermitted,
                format!("domain {domid} may not connect to {ip} ([cm] allowed-peers)"),
            ));
        }
        let data = self.private_data(private)?;
        // Connects that finished since the last look no longer count.
        self.refresh_cm_connects(ch);
        self.cm
            .charge(domid, CmResource::Connects)
            .map_err(|why| Refusal::new(Status::QuotaExceeded, why))?;
        if let Err(e) = self
            .device
            .cm_connect(ch, qp, SocketAddr::new(ip, port), &data)
        {
            self.cm.refund(domid, CmResource::Connects, 1);
            return Err(e.into());
        }
        self.cm_connects.insert(qp);
        Ok(Reply::Empty)
    }

    fn accept(
        &mut self,
        ch: ChannelId,
        req: ConnRequestId,
        qp: QpNum,
        private: PrivData,
    ) -> Outcome {
        let qp = self.own_qp(qp)?;
        let data = self.private_data(private)?;
        // The device filters incoming connections with the same rules; checked here too so
        // that the policy holds whatever the device does.
        let peer = self.device.cm_request_info(ch, req)?.peer.ip();
        let domid = self.device_id.domid;
        if !self.cm.peer_allowed(domid, peer) {
            return Err(Refusal::new(
                Status::NotPermitted,
                format!("domain {domid} may not accept from {peer} ([cm] allowed-peers)"),
            ));
        }
        self.device.cm_accept(ch, req, qp, &data)?;
        Ok(Reply::Empty)
    }

    fn listen(&mut self, ch: ChannelId, port: u16, backlog: u32, addr: [u8; 16]) -> Outcome {
        let backlog = match backlog {
            0 => DEFAULT_BACKLOG,
            b => b.min(MAX_BACKLOG),
        };
        let domid = self.device_id.domid;
        let rules = self.cm.rules(domid);
        let ports: Vec<u16> = match (port, &rules.allowed_ports) {
            (0, None) => vec![0],
            (0, Some(list)) => list
                .iter()
                .flat_map(|r| r.ports())
                .take(MAX_PORT_TRIES)
                .collect(),
            (p, _) if rules.port_allowed(p) => vec![p],
            (p, _) => {
                return Err(Refusal::new(
                    Status::NotPermitted,
                    format!(
                        "domain {domid} may not listen on port {p} ([cm] allowed-ports: {})",
                        match &rules.allowed_ports {
                            Some(l) => format!("{l:?}"),
                            None => format!(
                                "absent, so ports from {} up",
                                crate::config::FIRST_UNPRIVILEGED_PORT
                            ),
                        }
                    ),
                ))
            }
        };
        let own = self.device.local_addrs();
        let ip = match ip_of(addr) {
            None => own.first().copied().ok_or_else(|| {
                Refusal::new(
                    Status::NotSupported,
                    "the backend has no address to listen on (config `address`)",
                )
            })?,
            Some(ip) if own.contains(&ip) => ip,
            Some(ip) => {
                return Err(Refusal::new(
                    Status::NotPermitted,
                    format!("{ip} is not an address of this backend ({own:?})"),
                ))
            }
        };
        self.cm
            .charge(domid, CmResource::Listeners)
            .map_err(|why| Refusal::new(Status::QuotaExceeded, why))?;
        let mut last = Refusal::new(Status::NotPermitted, "allowed-ports is empty");
        for p in ports {
            match self.device.cm_listen(ch, SocketAddr::new(ip, p), backlog) {
                Ok(l) => {
                    let bound = match self.device.cm_listener_addr(ch, l) {
                        Ok(a) => a.port(),
                        Err(e) => {
                            let _ = self.device.cm_close_listener(ch, l);
                            self.cm.refund(domid, CmResource::Listeners, 1);
                            return Err(e.into());
                        }
                    };
                    self.listeners.insert(l);
                    return Ok(Reply::Listener {
                        listener: l.0,
                        port: bound,
                    });
                }
                Err(DeviceError::Busy(what)) => {
                    last =
                        Refusal::new(Status::AddressInUse, format!("{ip}:{p} is in use ({what})"));
                }
                Err(e) => {
                    last = e.into();
                    break;
                }
            }
        }
        self.cm.refund(domid, CmResource::Listeners, 1);
        Err(last)
    }

    fn close_listener(&mut self, ch: ChannelId, l: ListenerId) -> Outcome {
        if !self.listeners.contains(&l) {
            return Err(bad_handle("listener", l.0));
        }
        self.device.cm_close_listener(ch, l)?;
        self.listeners.remove(&l);
        self.cm
            .refund(self.device_id.domid, CmResource::Listeners, 1);
        Ok(Reply::Empty)
    }

    /// The channel's CM page: allocated, zeroed and granted on the first call.
    fn cm_page(&mut self) -> Outcome {
        if self.cm_page.is_none() {
            self.charge_granted(1)?;
            match pages::share(&self.platform, self.domid, 1, Access::ReadWrite) {
                Ok((region, grefs)) => self.cm_page = Some((region, grefs[0])),
                Err(e) => {
                    self.refund_granted(1);
                    return Err(e.into());
                }
            }
        }
        let gref = self.cm_page.as_ref().map(|(_, g)| *g).unwrap_or_default();
        Ok(Reply::CmPage {
            gref,
            slots: u32::from(CM_SLOTS),
            slot_len: CM_SLOT_LEN as u32,
        })
    }

    fn cm_page_region(&self) -> Result<&SharedRegion, Refusal> {
        self.cm_page.as_ref().map(|(r, _)| r).ok_or_else(|| {
            Refusal::new(
                Status::InvalidArgument,
                "private data names a CM page slot but the channel has no CM page (send CmPage first)",
            )
        })
    }

    /// The private data a request names, copied out of the CM page.
    fn private_data(&self, p: PrivData) -> Result<Vec<u8>, Refusal> {
        if p.len == 0 {
            return Ok(Vec::new());
        }
        let page = self.cm_page_region()?;
        let mut data = vec![0u8; usize::from(p.len)];
        page.read_bytes(usize::from(p.slot) * CM_SLOT_LEN, &mut data)
            .map_err(|e| Refusal::new(Status::InvalidArgument, format!("CM page: {e}")))?;
        Ok(data)
    }

    fn cm_info(&mut self, ch: ChannelId, target: CmTarget, slot: u8) -> Outcome {
        let info: CmInfo = match target {
            CmTarget::Request(r) => self.device.cm_request_info(ch, ConnRequestId(r))?,
            CmTarget::Qp(qp) => {
                let qp = self.own_qp(QpNum(qp))?;
                self.device.cm_qp_info(ch, qp)?
            }
        };
        let n = info.private_data.len().min(crate::device::MAX_PRIVATE_DATA);
        if n > 0 {
            let page = self.cm_page_region()?;
            page.write_bytes(usize::from(slot) * CM_SLOT_LEN, &info.private_data[..n])
                .map_err(|e| Refusal::new(Status::InvalidArgument, format!("CM page: {e}")))?;
        }
        Ok(Reply::CmInfo(CmInfoReply {
            local_addr: addr_bytes(info.local.ip()),
            local_port: info.local.port(),
            remote_addr: addr_bytes(info.peer.ip()),
            remote_port: info.peer.port(),
            private_len: n as u8,
            ird: info.ird,
            ord: info.ord,
        }))
    }

    fn post(&mut self, ch: ChannelId, qp: QpNum, which: WorkQueue, prod: u32) -> Outcome {
        self.own_qp(qp)?;
        self.device.post_mediated(ch, qp, which, prod)?;
        Ok(Reply::Empty)
    }

    /// `n` doorbell slots on one page; a new doorbell page is granted when no page has room,
    /// up to what the channel's quotas can use.
    fn take_slots(&mut self, ch: ChannelId, n: usize) -> Result<Vec<u32>, Refusal> {
        if let Some(s) = self.table.take_slots(n) {
            return Ok(s);
        }
        let per_page = self.table.slots_per_page();
        let q = self.account.quotas();
        // Enough pages for every queue the quotas allow, with one slot lost per page to the
        // same-page rule of a QP's two slots.
        let wanted = 2 * u64::from(q.max_qps) + u64::from(q.max_cqs);
        let limit = (wanted / u64::from(per_page.saturating_sub(1).max(1)) + 1)
            .min(crate::device::MAX_DOORBELL_PAGES as u64);
        if u64::from(self.table.slot_pages()) >= limit {
            return Err(Refusal::new(
                Status::NoResources,
                format!(
                    "the channel's {} doorbell pages have no {n} free slots on one page (each CQ takes 1, each QP 2) and it may not have more",
                    self.table.slot_pages()
                ),
            ));
        }
        self.charge_granted(1)?;
        let added = pages::share(&self.platform, self.domid, 1, Access::ReadWrite)
            .map_err(Refusal::from)
            .and_then(|(page, grefs)| Ok((self.device.add_doorbell_page(ch, page)?, grefs)));
        let (first, grefs) = match added {
            Ok(x) => x,
            Err(r) => {
                self.refund_granted(1);
                return Err(r);
            }
        };
        if first != self.table.slot_count() {
            // The device and the table disagree on the numbering: refuse rather than guess.
            return Err(Refusal::new(
                Status::NoResources,
                format!(
                    "doorbell page added at slot {first}, expected {}",
                    self.table.slot_count()
                ),
            ));
        }
        self.table.add_slot_page();
        self.doorbell_grefs.push(grefs[0]);
        tracing::debug!(device = %self.device_id, channel = self.channel, "doorbell page {} added", self.doorbell_grefs.len() - 1);
        self.table.take_slots(n).ok_or_else(|| {
            Refusal::new(
                Status::NoResources,
                format!("a fresh doorbell page has no {n} free slots"),
            )
        })
    }

    /// The grant of the doorbell page holding `slot`.
    fn doorbell_gref_of(&self, slot: u32) -> u32 {
        let page = slot / self.table.slots_per_page().max(1);
        self.doorbell_grefs
            .get(page as usize)
            .copied()
            .unwrap_or_default()
    }

    fn keep_dirs(&mut self, op: Kind, handle: u32, dirs: Vec<SharedRegion>) {
        if !dirs.is_empty() {
            self.dir_pages.insert((op, handle), dirs);
        }
    }

    fn own_pd(&self, pd: PdId) -> Result<PdId, Refusal> {
        if self.table.pds.contains(&pd) {
            Ok(pd)
        } else {
            Err(bad_handle("PD", pd.0))
        }
    }

    fn own_cq(&self, cq: CqId) -> Result<CqId, Refusal> {
        self.own_cq_entry(cq).map(|_| cq)
    }

    fn own_cq_entry(&self, cq: CqId) -> Result<CqEntry, Refusal> {
        self.table
            .cqs
            .get(&cq)
            .copied()
            .ok_or_else(|| bad_handle("CQ", cq.0))
    }

    fn own_qp(&self, qp: QpNum) -> Result<QpNum, Refusal> {
        if self.table.qps.contains_key(&qp) {
            Ok(qp)
        } else {
            Err(bad_handle("QP", qp.0))
        }
    }

    /// Releases everything the channel holds (QPs flushed, MRs unmapped, pages revoked) and
    /// gives it back to the account. With a reason that means the device is lost, the guest
    /// gets a `DeviceLost` event first.
    pub fn reclaim(&mut self, reason: &CloseReason) {
        let Some(ch) = self.ch.take() else {
            return;
        };
        if reason.device_lost() {
            let ev = EventRepr {
                kind: EventKind::DeviceLost,
                handle: 0,
                detail: 0,
            };
            if let Err(e) = self.device.post_event(ch, ev) {
                tracing::debug!(device = %self.device_id, channel = self.channel, "DeviceLost event not posted: {e}");
            }
        }
        let t = std::mem::take(&mut self.table);
        let (qps, cqs, mrs, pds) = (t.qps.len(), t.cqs.len(), t.mrs.len(), t.pds.len());
        let mr_pages: u64 = t.mrs.values().map(|m| m.pages).sum();
        // The device frees everything of the channel in one call (QPs first, peers flushed).
        // (and its connection-manager state: listeners closed, requests rejected, connections
        // ended with QpDisconnected at their peers).
        self.device.close_channel(ch);
        self.dir_pages.clear();
        let domid = self.device_id.domid;
        let connects = self.cm_connects.len() as u32;
        self.cm.refund(domid, CmResource::Connects, connects);
        self.cm
            .refund(domid, CmResource::Listeners, self.listeners.len() as u32);
        self.listeners.clear();
        self.cm_connects.clear();
        self.cm_page = None;
        self.pending.clear();
        self.account.refund(Resource::Qps, qps as u64);
        self.account.refund(Resource::Cqs, cqs as u64);
        self.account.refund(Resource::Mrs, mrs as u64);
        self.account.refund(Resource::MrPages, mr_pages);
        self.account.refund(Resource::Pds, pds as u64);
        self.budget
            .refund(self.device_id.domid, Pool::Mapped, mr_pages);
        let granted = self.granted;
        self.refund_granted(granted);
        tracing::info!(
            device = %self.device_id,
            channel = self.channel,
            "reclaimed {qps} QPs, {cqs} CQs, {mrs} MRs ({mr_pages} pages), {pds} PDs, {granted} granted pages: {reason}"
        );
    }
}

impl Drop for ControlService {
    fn drop(&mut self) {
        self.reclaim(&CloseReason::Shutdown);
    }
}

/// The address a request names; `None` for the unspecified address (all zero). IPv4-mapped
/// addresses are IPv4.
fn ip_of(addr: [u8; 16]) -> Option<IpAddr> {
    let v6 = Ipv6Addr::from(addr);
    if v6.is_unspecified() {
        return None;
    }
    Some(canonical_ip(IpAddr::V6(v6)))
}

/// An address as the protocol carries it (IPv4 as v4-mapped IPv6).
fn addr_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn bad_handle(what: &str, h: u32) -> Refusal {
    Refusal::new(
        Status::BadHandle,
        format!("{what} {h} does not belong to this channel"),
    )
}

/// An error response for a slot that does not parse: its `req_id` and op number echoed.
fn raw_error(slot: &[u8; CONTROL_SLOT_LEN], status: Status) -> [u8; CONTROL_SLOT_LEN] {
    let mut b = [0u8; CONTROL_SLOT_LEN];
    b[field::REQ_ID..field::REQ_ID + 4].copy_from_slice(&slot[field::REQ_ID..field::REQ_ID + 4]);
    b[field::OP..field::OP + 2].copy_from_slice(&slot[field::OP..field::OP + 2]);
    b[field::STATUS..field::STATUS + 4].copy_from_slice(&(status as u32).to_le_bytes());
    b
}
