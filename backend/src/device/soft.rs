//! The software device: control path and resource tables.

use shared_ring::abi::control::QpState;
use shared_ring::abi::cqe::CqeRepr;
use shared_ring::abi::event::EventRepr;

use super::*;

/// The software RDMA device (stub while the engine is being written).
pub struct SoftDevice {
    _config: EngineConfig,
}

impl SoftDevice {
    /// Starts the engine threads.
    pub fn new(config: EngineConfig) -> std::io::Result<Self> {
        Ok(Self { _config: config })
    }
}

const STUB: DeviceError = DeviceError::NotSupported("software device not written yet");

impl Device for SoftDevice {
    fn attrs(&self) -> DeviceAttrs {
        DeviceAttrs::default()
    }
    fn open_channel(&self, _setup: ChannelSetup) -> DeviceResult<ChannelId> {
        Err(STUB)
    }
    fn close_channel(&self, _ch: ChannelId) {}
    fn kick(&self, _ch: ChannelId) {}
    fn post_event(&self, _ch: ChannelId, _event: EventRepr) -> DeviceResult<()> {
        Err(STUB)
    }
    fn alloc_pd(&self, _ch: ChannelId) -> DeviceResult<PdId> {
        Err(STUB)
    }
    fn dealloc_pd(&self, _ch: ChannelId, _pd: PdId) -> DeviceResult<()> {
        Err(STUB)
    }
    fn reg_mr(&self, _ch: ChannelId, _setup: MrSetup) -> DeviceResult<MrKeys> {
        Err(STUB)
    }
    fn dereg_mr(&self, _ch: ChannelId, _mr: MrHandle) -> DeviceResult<()> {
        Err(STUB)
    }
    fn create_cq(&self, _ch: ChannelId, _setup: CqSetup) -> DeviceResult<CqId> {
        Err(STUB)
    }
    fn destroy_cq(&self, _ch: ChannelId, _cq: CqId) -> DeviceResult<()> {
        Err(STUB)
    }
    fn create_qp(&self, _ch: ChannelId, _setup: QpSetup) -> DeviceResult<QpNum> {
        Err(STUB)
    }
    fn modify_qp(&self, _ch: ChannelId, _qp: QpNum, _state: QpState) -> DeviceResult<()> {
        Err(STUB)
    }
    fn qp_state(&self, _ch: ChannelId, _qp: QpNum) -> DeviceResult<QpState> {
        Err(STUB)
    }
    fn destroy_qp(&self, _ch: ChannelId, _qp: QpNum) -> DeviceResult<()> {
        Err(STUB)
    }
    fn connect_qp(&self, _ch: ChannelId, _qp: QpNum, _remote: QpNum) -> DeviceResult<()> {
        Err(STUB)
    }
    fn arm_cq(&self, _ch: ChannelId, _cq: CqId, _solicited_only: bool) -> DeviceResult<()> {
        Err(STUB)
    }
    fn post_mediated(
        &self,
        _ch: ChannelId,
        _qp: QpNum,
        _which: WorkQueue,
        _prod: u32,
    ) -> DeviceResult<()> {
        Err(STUB)
    }
    fn poll_cq_mediated(&self, _ch: ChannelId, _cq: CqId) -> DeviceResult<Option<CqeRepr>> {
        Err(STUB)
    }
    fn stats(&self, _ch: ChannelId) -> DeviceStats {
        DeviceStats::default()
    }
    fn domain_stats(&self, _domid: DomId) -> DeviceStats {
        DeviceStats::default()
    }
}
