//! Completion queues: polling (a phase-bit read, no system call, in bypass mode), arming, and
//! blocking waits on the channel's event channel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shared_ring::abi::control::{Reply, Request, MAX_QUEUE_LOG2};
use shared_ring::abi::cqe::{self, CqeOpcode, CqeRepr, CqeStatus, CQE_LEN};
use shared_ring::cq::CqPoller;
use shared_ring::SharedRegion;
use xen_platform::Access;

use crate::context::{CtxInner, Mode};
use crate::error::{Error, Result};
use crate::signal::Signal;

/// One completed work request (ibverbs' `ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: CqeStatus,
    pub opcode: CqeOpcode,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// Immediate data, for `*_WITH_IMM` completions.
    pub imm_data: Option<u32>,
    /// The local QP number.
    pub qp_num: u32,
    pub vendor_err: u32,
    /// The sender asked for a solicited event.
    pub solicited: bool,
}

impl Default for WorkCompletion {
    fn default() -> Self {
        WorkCompletion {
            wr_id: 0,
            status: CqeStatus::Success,
            opcode: CqeOpcode::Send,
            byte_len: 0,
            imm_data: None,
            qp_num: 0,
            vendor_err: 0,
            solicited: false,
        }
    }
}

impl WorkCompletion {
    /// The request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == CqeStatus::Success
    }

    fn from_cqe(c: &CqeRepr) -> WorkCompletion {
        WorkCompletion {
            wr_id: c.wr_id,
            status: c.status,
            opcode: c.opcode,
            byte_len: c.byte_len,
            imm_data: (c.flags & cqe::flags::WITH_IMM != 0).then_some(c.imm_data),
            qp_num: c.qp_num,
            vendor_err: c.vendor_err,
            solicited: c.flags & cqe::flags::SOLICITED != 0,
        }
    }
}

pub(crate) struct CqShared {
    pub ctx: Arc<CtxInner>,
    pub handle: u32,
    // The CQ pages stay mapped while any QP uses the CQ.
    _pages: SharedRegion,
}

impl Drop for CqShared {
    fn drop(&mut self) {
        if !self.ctx.chan.is_lost() {
            if let Err(e) = self.ctx.chan.call(Request::DestroyCq { cq: self.handle }) {
                tracing::warn!(cq = self.handle, "destroying a CQ: {e}");
            }
        }
    }
}

/// A completion queue.
pub struct CompletionQueue {
    pub(crate) shared: Arc<CqShared>,
    poller: CqPoller,
    /// The context's mode (fixed), kept here so a poll does not follow two pointers for it.
    mode: Mode,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("handle", &self.shared.handle)
            .field("size", &self.poller.size())
            .finish()
    }
}

impl CompletionQueue {
    pub(crate) fn create(ctx: Arc<CtxInner>, min_cqe: u32) -> Result<CompletionQueue> {
        let log2 = min_cqe.max(1).next_power_of_two().trailing_zeros();
        if log2 > u32::from(MAX_QUEUE_LOG2) {
            return Err(Error::InvalidArgument(format!(
                "a CQ of {min_cqe} entries is larger than the protocol allows (2^{MAX_QUEUE_LOG2})"
            )));
        }
        let (handle, slot, got_log2, pages, db_gref) = match ctx.chan.call(Request::CreateCq {
            cqe_log2: log2 as u8,
        })? {
            Reply::Cq {
                cq,
                doorbell_slot,
                cqe_log2,
                pages,
                doorbell_gref,
            } => (cq, doorbell_slot, cqe_log2, pages, doorbell_gref),
            r => return Err(Error::protocol(format!("CreateCq answered with {r:?}"))),
        };
        // From here the backend holds a CQ: destroy it if we cannot use it.
        let made = (|| {
            let region = ctx.chan.map_page_list(&pages, Access::ReadOnly)?;
            let slots = region.slots::<CQE_LEN>(0, 1usize << got_log2)?;
            let (page, k) = ctx.chan.doorbell_slot(slot, db_gref)?;
            let db = page.cq(k)?;
            Ok::<_, Error>((region, CqPoller::new(slots, db)))
        })();
        let (region, poller) = match made {
            Ok(v) => v,
            Err(e) => {
                let _ = ctx.chan.call(Request::DestroyCq { cq: handle });
                return Err(e);
            }
        };
        Ok(CompletionQueue {
            mode: ctx.mode,
            shared: Arc::new(CqShared {
                ctx,
                handle,
                _pages: region,
            }),
            poller,
        })
    }

    /// The backend's handle.
    pub fn handle(&self) -> u32 {
        self.shared.handle
    }

    /// Number of CQEs.
    pub fn size(&self) -> u32 {
        self.poller.size()
    }

    /// Moves available completions into `wc` and returns the filled part (empty when there
    /// are none). Never blocks. In bypass mode this reads the next CQE's phase bit in shared
    /// memory and makes no system call; in mediated mode each completion is a control request.
    #[inline]
    pub fn poll<'a>(&mut self, wc: &'a mut [WorkCompletion]) -> Result<&'a mut [WorkCompletion]> {
        let n = match self.mode {
            Mode::Bypass => self.poll_bypass(wc)?,
            Mode::Mediated => self.poll_mediated(wc)?,
        };
        Ok(&mut wc[..n])
    }

    #[inline]
    fn poll_bypass(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let mut n = 0;
        while n < wc.len() {
            let Some(raw) = self.poller.poll_raw() else {
                break;
            };
            let c = CqeRepr::from_bytes(&raw)?;
            wc[n] = WorkCompletion::from_cqe(&c);
            n += 1;
        }
        if n == 0 {
            // A few loads, no system call: a `DeviceLost` event on the event ring (or a channel
            // already known dead) reports itself instead of looking idle.
            self.shared.ctx.chan.notice_events()?;
        }
        Ok(n)
    }

    fn poll_mediated(&mut self, wc: &mut [WorkCompletion]) -> Result<usize> {
        let mut n = 0;
        while n < wc.len() {
            match self.shared.ctx.chan.call(Request::PollCq {
                cq: self.shared.handle,
            })? {
                Reply::Poll(Some(body)) => {
                    let mut b = [0u8; CQE_LEN];
                    b.copy_from_slice(&body);
                    // The owner word is ring mechanics; the backend sends it as 0.
                    b[cqe::field::OWNER..].fill(0);
                    wc[n] = WorkCompletion::from_cqe(&CqeRepr::from_bytes(&b)?);
                    n += 1;
                }
                Reply::Poll(None) => break,
                r => return Err(Error::protocol(format!("PollCq answered with {r:?}"))),
            }
        }
        Ok(n)
    }

    /// The CQ's poller, for benchmarks that drive the library's own rings with shared-ring's
    /// code (`examples/lib_costs.rs`). Not for applications: it skips the CQE's validation.
    #[doc(hidden)]
    pub fn raw_poller(&mut self) -> &mut CqPoller {
        &mut self.poller
    }

    /// Whether a completion is waiting (bypass: a phase-bit read, no system call; mediated:
    /// unknown without a request, so `false` — poll instead).
    pub fn ready(&self) -> bool {
        match self.shared.ctx.mode {
            Mode::Bypass => self.poller.ready(),
            Mode::Mediated => false,
        }
    }

    /// Asks for one event-channel notification on the next completion (or the next solicited
    /// or error completion). Returns `true` if a completion is already waiting: poll then.
    pub fn arm(&mut self, solicited_only: bool) -> Result<bool> {
        match self.shared.ctx.mode {
            Mode::Bypass => Ok(self.poller.arm(solicited_only)),
            Mode::Mediated => {
                self.shared.ctx.chan.call(Request::ArmCq {
                    cq: self.shared.handle,
                    solicited_only,
                })?;
                Ok(false)
            }
        }
    }

    /// Polls; if nothing is there, arms the CQ and blocks on the channel's event channel until
    /// completions arrive or `timeout` passes (forever with `None`). Returns the completions
    /// (empty on timeout). A lost device is an error, not a hang.
    pub fn wait<'a>(
        &mut self,
        wc: &'a mut [WorkCompletion],
        timeout: Option<Duration>,
    ) -> Result<&'a mut [WorkCompletion]> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let shared = self.shared.clone();
        let chan = &shared.ctx.chan;
        loop {
            let n = self.poll(wc)?.len();
            if n > 0 {
                return Ok(&mut wc[..n]);
            }
            let epoch = chan.hub.epoch();
            let ready = self.arm(false)?;
            let n = self.poll(wc)?.len();
            if n > 0 {
                return Ok(&mut wc[..n]);
            }
            if ready {
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(&mut wc[..0]);
            }
            if !chan.hub.wait_after(epoch, deadline)? {
                // No event for a while: is the backend still there?
                chan.probe_backend();
            }
            chan.notice_backend();
            chan.pump_events()?;
            chan.check_lost()?;
        }
    }
}
