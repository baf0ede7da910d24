//! `<infiniband/verbs.h>` (libibverbs, rdma-core 44): the types and constants the dom0 verbs
//! device and the guest's libibverbs-compatible library use. C enums are `c_int`/`c_uint`
//! aliases with `pub const` values: a value that came from C is never an invalid Rust enum.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `pthread_mutex_t` on x86_64 glibc (40 bytes, 8-aligned): opaque, owned by libibverbs.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_mutex_t {
    pub _opaque: [u8; 40],
}

/// `pthread_cond_t` on x86_64 glibc (48 bytes, 8-aligned): opaque, owned by libibverbs.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_cond_t {
    pub _opaque: [u8; 48],
}

// ---------------------------------------------------------------------------------------------
// Enums and flag values
// ---------------------------------------------------------------------------------------------

pub type ibv_node_type = c_int;
pub const IBV_NODE_UNKNOWN: ibv_node_type = -1;
pub const IBV_NODE_CA: ibv_node_type = 1;
pub const IBV_NODE_SWITCH: ibv_node_type = 2;
pub const IBV_NODE_ROUTER: ibv_node_type = 3;
pub const IBV_NODE_RNIC: ibv_node_type = 4;
pub const IBV_NODE_USNIC: ibv_node_type = 5;
pub const IBV_NODE_USNIC_UDP: ibv_node_type = 6;
pub const IBV_NODE_UNSPECIFIED: ibv_node_type = 7;

pub type ibv_transport_type = c_int;
pub const IBV_TRANSPORT_UNKNOWN: ibv_transport_type = -1;
pub const IBV_TRANSPORT_IB: ibv_transport_type = 0;
pub const IBV_TRANSPORT_IWARP: ibv_transport_type = 1;
pub const IBV_TRANSPORT_USNIC: ibv_transport_type = 2;
pub const IBV_TRANSPORT_USNIC_UDP: ibv_transport_type = 3;
pub const IBV_TRANSPORT_UNSPECIFIED: ibv_transport_type = 4;

pub type ibv_atomic_cap = c_uint;
pub const IBV_ATOMIC_NONE: ibv_atomic_cap = 0;
pub const IBV_ATOMIC_HCA: ibv_atomic_cap = 1;
pub const IBV_ATOMIC_GLOB: ibv_atomic_cap = 2;

pub type ibv_gid_type = c_uint;
pub const IBV_GID_TYPE_IB: ibv_gid_type = 0;
pub const IBV_GID_TYPE_ROCE_V1: ibv_gid_type = 1;
pub const IBV_GID_TYPE_ROCE_V2: ibv_gid_type = 2;

pub type ibv_mtu = c_uint;
pub const IBV_MTU_256: ibv_mtu = 1;
pub const IBV_MTU_512: ibv_mtu = 2;
pub const IBV_MTU_1024: ibv_mtu = 3;
pub const IBV_MTU_2048: ibv_mtu = 4;
pub const IBV_MTU_4096: ibv_mtu = 5;

pub type ibv_port_state = c_uint;
pub const IBV_PORT_NOP: ibv_port_state = 0;
pub const IBV_PORT_DOWN: ibv_port_state = 1;
pub const IBV_PORT_INIT: ibv_port_state = 2;
pub const IBV_PORT_ARMED: ibv_port_state = 3;
pub const IBV_PORT_ACTIVE: ibv_port_state = 4;
pub const IBV_PORT_ACTIVE_DEFER: ibv_port_state = 5;

/// `ibv_port_attr::link_layer` values (an anonymous enum in verbs.h).
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub type ibv_event_type = c_uint;
pub const IBV_EVENT_CQ_ERR: ibv_event_type = 0;
pub const IBV_EVENT_QP_FATAL: ibv_event_type = 1;
pub const IBV_EVENT_QP_REQ_ERR: ibv_event_type = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: ibv_event_type = 3;
pub const IBV_EVENT_COMM_EST: ibv_event_type = 4;
pub const IBV_EVENT_SQ_DRAINED: ibv_event_type = 5;
pub const IBV_EVENT_PATH_MIG: ibv_event_type = 6;
pub const IBV_EVENT_PATH_MIG_ERR: ibv_event_type = 7;
pub const IBV_EVENT_DEVICE_FATAL: ibv_event_type = 8;
pub const IBV_EVENT_PORT_ACTIVE: ibv_event_type = 9;
pub const IBV_EVENT_PORT_ERR: ibv_event_type = 10;
pub const IBV_EVENT_LID_CHANGE: ibv_event_type = 11;
pub const IBV_EVENT_PKEY_CHANGE: ibv_event_type = 12;
pub const IBV_EVENT_SM_CHANGE: ibv_event_type = 13;
pub const IBV_EVENT_SRQ_ERR: ibv_event_type = 14;
pub const IBV_EVENT_SRQ_LIMIT_REACHED: ibv_event_type = 15;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: ibv_event_type = 16;
pub const IBV_EVENT_CLIENT_REREGISTER: ibv_event_type = 17;
pub const IBV_EVENT_GID_CHANGE: ibv_event_type = 18;
pub const IBV_EVENT_WQ_FATAL: ibv_event_type = 19;

pub type ibv_wc_status = c_uint;
pub const IBV_WC_SUCCESS: ibv_wc_status = 0;
pub const IBV_WC_LOC_LEN_ERR: ibv_wc_status = 1;
pub const IBV_WC_LOC_QP_OP_ERR: ibv_wc_status = 2;
pub const IBV_WC_LOC_EEC_OP_ERR: ibv_wc_status = 3;
pub const IBV_WC_LOC_PROT_ERR: ibv_wc_status = 4;
pub const IBV_WC_WR_FLUSH_ERR: ibv_wc_status = 5;
pub const IBV_WC_MW_BIND_ERR: ibv_wc_status = 6;
pub const IBV_WC_BAD_RESP_ERR: ibv_wc_status = 7;
pub const IBV_WC_LOC_ACCESS_ERR: ibv_wc_status = 8;
pub const IBV_WC_REM_INV_REQ_ERR: ibv_wc_status = 9;
pub const IBV_WC_REM_ACCESS_ERR: ibv_wc_status = 10;
pub const IBV_WC_REM_OP_ERR: ibv_wc_status = 11;
pub const IBV_WC_RETRY_EXC_ERR: ibv_wc_status = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: ibv_wc_status = 13;
pub const IBV_WC_LOC_RDD_VIOL_ERR: ibv_wc_status = 14;
pub const IBV_WC_REM_INV_RD_REQ_ERR: ibv_wc_status = 15;
pub const IBV_WC_REM_ABORT_ERR: ibv_wc_status = 16;
pub const IBV_WC_INV_EECN_ERR: ibv_wc_status = 17;
pub const IBV_WC_INV_EEC_STATE_ERR: ibv_wc_status = 18;
pub const IBV_WC_FATAL_ERR: ibv_wc_status = 19;
pub const IBV_WC_RESP_TIMEOUT_ERR: ibv_wc_status = 20;
pub const IBV_WC_GENERAL_ERR: ibv_wc_status = 21;
pub const IBV_WC_TM_ERR: ibv_wc_status = 22;
pub const IBV_WC_TM_RNDV_INCOMPLETE: ibv_wc_status = 23;

pub type ibv_wc_opcode = c_uint;
pub const IBV_WC_SEND: ibv_wc_opcode = 0;
pub const IBV_WC_RDMA_WRITE: ibv_wc_opcode = 1;
pub const IBV_WC_RDMA_READ: ibv_wc_opcode = 2;
pub const IBV_WC_COMP_SWAP: ibv_wc_opcode = 3;
pub const IBV_WC_FETCH_ADD: ibv_wc_opcode = 4;
pub const IBV_WC_BIND_MW: ibv_wc_opcode = 5;
pub const IBV_WC_LOCAL_INV: ibv_wc_opcode = 6;
pub const IBV_WC_TSO: ibv_wc_opcode = 7;
pub const IBV_WC_ATOMIC_WRITE: ibv_wc_opcode = 9;
/// Receive completions have this bit set (`opcode & IBV_WC_RECV`).
pub const IBV_WC_RECV: ibv_wc_opcode = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: ibv_wc_opcode = 129;

pub type ibv_wc_flags = c_uint;
pub const IBV_WC_GRH: ibv_wc_flags = 1 << 0;
pub const IBV_WC_WITH_IMM: ibv_wc_flags = 1 << 1;
pub const IBV_WC_IP_CSUM_OK: ibv_wc_flags = 1 << 2;
pub const IBV_WC_WITH_INV: ibv_wc_flags = 1 << 3;

pub type ibv_access_flags = c_uint;
pub const IBV_ACCESS_LOCAL_WRITE: ibv_access_flags = 1;
pub const IBV_ACCESS_REMOTE_WRITE: ibv_access_flags = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: ibv_access_flags = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: ibv_access_flags = 1 << 3;
pub const IBV_ACCESS_MW_BIND: ibv_access_flags = 1 << 4;
pub const IBV_ACCESS_ZERO_BASED: ibv_access_flags = 1 << 5;
pub const IBV_ACCESS_ON_DEMAND: ibv_access_flags = 1 << 6;
pub const IBV_ACCESS_HUGETLB: ibv_access_flags = 1 << 7;
/// `IBV_ACCESS_OPTIONAL_FIRST`: access bits from here up are optional (the static-inline
/// `ibv_reg_mr` calls `ibv_reg_mr_iova2` when one is set).
pub const IBV_ACCESS_RELAXED_ORDERING: ibv_access_flags = 1 << 20;

pub type ibv_mw_type = c_uint;
pub const IBV_MW_TYPE_1: ibv_mw_type = 1;
pub const IBV_MW_TYPE_2: ibv_mw_type = 2;

pub type ibv_qp_type = c_uint;
pub const IBV_QPT_RC: ibv_qp_type = 2;
pub const IBV_QPT_UC: ibv_qp_type = 3;
pub const IBV_QPT_UD: ibv_qp_type = 4;
pub const IBV_QPT_RAW_PACKET: ibv_qp_type = 8;
pub const IBV_QPT_XRC_SEND: ibv_qp_type = 9;
pub const IBV_QPT_XRC_RECV: ibv_qp_type = 10;
pub const IBV_QPT_DRIVER: ibv_qp_type = 0xff;

pub type ibv_qp_attr_mask = c_uint;
pub const IBV_QP_STATE: ibv_qp_attr_mask = 1 << 0;
pub const IBV_QP_CUR_STATE: ibv_qp_attr_mask = 1 << 1;
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: ibv_qp_attr_mask = 1 << 2;
pub const IBV_QP_ACCESS_FLAGS: ibv_qp_attr_mask = 1 << 3;
pub const IBV_QP_PKEY_INDEX: ibv_qp_attr_mask = 1 << 4;
pub const IBV_QP_PORT: ibv_qp_attr_mask = 1 << 5;
pub const IBV_QP_QKEY: ibv_qp_attr_mask = 1 << 6;
pub const IBV_QP_AV: ibv_qp_attr_mask = 1 << 7;
pub const IBV_QP_PATH_MTU: ibv_qp_attr_mask = 1 << 8;
pub const IBV_QP_TIMEOUT: ibv_qp_attr_mask = 1 << 9;
pub const IBV_QP_RETRY_CNT: ibv_qp_attr_mask = 1 << 10;
pub const IBV_QP_RNR_RETRY: ibv_qp_attr_mask = 1 << 11;
pub const IBV_QP_RQ_PSN: ibv_qp_attr_mask = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: ibv_qp_attr_mask = 1 << 13;
pub const IBV_QP_ALT_PATH: ibv_qp_attr_mask = 1 << 14;
pub const IBV_QP_MIN_RNR_TIMER: ibv_qp_attr_mask = 1 << 15;
pub const IBV_QP_SQ_PSN: ibv_qp_attr_mask = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: ibv_qp_attr_mask = 1 << 17;
pub const IBV_QP_PATH_MIG_STATE: ibv_qp_attr_mask = 1 << 18;
pub const IBV_QP_CAP: ibv_qp_attr_mask = 1 << 19;
pub const IBV_QP_DEST_QPN: ibv_qp_attr_mask = 1 << 20;
pub const IBV_QP_RATE_LIMIT: ibv_qp_attr_mask = 1 << 25;

pub type ibv_qp_state = c_uint;
pub const IBV_QPS_RESET: ibv_qp_state = 0;
pub const IBV_QPS_INIT: ibv_qp_state = 1;
pub const IBV_QPS_RTR: ibv_qp_state = 2;
pub const IBV_QPS_RTS: ibv_qp_state = 3;
pub const IBV_QPS_SQD: ibv_qp_state = 4;
pub const IBV_QPS_SQE: ibv_qp_state = 5;
pub const IBV_QPS_ERR: ibv_qp_state = 6;
pub const IBV_QPS_UNKNOWN: ibv_qp_state = 7;

pub type ibv_mig_state = c_uint;
pub const IBV_MIG_MIGRATED: ibv_mig_state = 0;
pub const IBV_MIG_REARM: ibv_mig_state = 1;
pub const IBV_MIG_ARMED: ibv_mig_state = 2;

pub type ibv_wr_opcode = c_uint;
pub const IBV_WR_RDMA_WRITE: ibv_wr_opcode = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wr_opcode = 1;
pub const IBV_WR_SEND: ibv_wr_opcode = 2;
pub const IBV_WR_SEND_WITH_IMM: ibv_wr_opcode = 3;
pub const IBV_WR_RDMA_READ: ibv_wr_opcode = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wr_opcode = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wr_opcode = 6;
pub const IBV_WR_LOCAL_INV: ibv_wr_opcode = 7;
pub const IBV_WR_BIND_MW: ibv_wr_opcode = 8;
pub const IBV_WR_SEND_WITH_INV: ibv_wr_opcode = 9;
pub const IBV_WR_TSO: ibv_wr_opcode = 10;
pub const IBV_WR_DRIVER1: ibv_wr_opcode = 11;
pub const IBV_WR_ATOMIC_WRITE: ibv_wr_opcode = 15;

pub type ibv_send_flags = c_uint;
pub const IBV_SEND_FENCE: ibv_send_flags = 1 << 0;
pub const IBV_SEND_SIGNALED: ibv_send_flags = 1 << 1;
pub const IBV_SEND_SOLICITED: ibv_send_flags = 1 << 2;
pub const IBV_SEND_INLINE: ibv_send_flags = 1 << 3;
pub const IBV_SEND_IP_CSUM: ibv_send_flags = 1 << 4;

/// `IBV_SYSFS_NAME_MAX`, `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
pub const IBV_SYSFS_PATH_MAX: usize = 256;

// ---------------------------------------------------------------------------------------------
// Structures
// ---------------------------------------------------------------------------------------------

/// `union ibv_gid`: 16 bytes; `global` is two big-endian 64-bit words.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    pub raw: [u8; 16],
    pub global: ibv_gid_global,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid_global {
    /// `__be64`.
    pub subnet_prefix: u64,
    /// `__be64`.
    pub interface_id: u64,
}

impl Default for ibv_gid {
    fn default() -> Self {
        ibv_gid { raw: [0; 16] }
    }
}

impl ibv_gid {
    pub fn raw(&self) -> [u8; 16] {
        // SAFETY: both members are 16 plain bytes; every bit pattern is a valid `[u8; 16]`.
        unsafe { self.raw }
    }
}

impl std::fmt::Debug for ibv_gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ibv_gid({:02x?})", self.raw())
    }
}

/// `struct ibv_gid_entry` (`ibv_query_gid_ex`, `ibv_query_gid_table`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    /// `enum ibv_gid_type`.
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct _ibv_device_ops`: two legacy function pointers libibverbs keeps for the ABI.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct _ibv_device_ops {
    pub _dummy1: Option<unsafe extern "C" fn(*mut ibv_device, c_int) -> *mut ibv_context>,
    pub _dummy2: Option<unsafe extern "C" fn(*mut ibv_context)>,
}

#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: ibv_node_type,
    pub transport_type: ibv_transport_type,
    /// Kernel IB device name, e.g. `rxe0` (NUL-terminated).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// uverbs device name, e.g. `uverbs0`.
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// An entry of `ibv_context_ops` that only exists to keep the table's layout.
pub type CompatOp = Option<unsafe extern "C" fn() -> *mut c_void>;

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops`, in header order. The static-inline `ibv_post_send`,
/// `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` call `context->ops.<op>`, so an
/// application compiled against verbs.h reads these slots at these offsets.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_context_ops {
    pub _compat_query_device:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int>,
    pub _compat_query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut c_void) -> c_int>,
    pub _compat_alloc_pd: CompatOp,
    pub _compat_dealloc_pd: CompatOp,
    pub _compat_reg_mr: CompatOp,
    pub _compat_rereg_mr: CompatOp,
    pub _compat_dereg_mr: CompatOp,
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, ibv_mw_type) -> *mut c_void>,
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut c_void, *mut c_void) -> c_int>,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
    pub _compat_create_cq: CompatOp,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_cq_event: CompatOp,
    pub _compat_resize_cq: CompatOp,
    pub _compat_destroy_cq: CompatOp,
    pub _compat_create_srq: CompatOp,
    pub _compat_modify_srq: CompatOp,
    pub _compat_query_srq: CompatOp,
    pub _compat_destroy_srq: CompatOp,
    pub post_srq_recv:
        Option<unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat_create_qp: CompatOp,
    pub _compat_query_qp: CompatOp,
    pub _compat_modify_qp: CompatOp,
    pub _compat_destroy_qp: CompatOp,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: CompatOp,
    pub _compat_destroy_ah: CompatOp,
    pub _compat_attach_mcast: CompatOp,
    pub _compat_detach_mcast: CompatOp,
    pub _compat_async_event: CompatOp,
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;

/// `abi_compat` of an extended context: `verbs_get_ctx()` only looks before `ibv_context`
/// (at `struct verbs_context`) when it holds this value.
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// `struct verbs_context`: the extended context that precedes `struct ibv_context` in memory.
/// The static inlines of verbs.h (`ibv_query_port`, `ibv_query_device_ex`, `ibv_create_cq_ex`,
/// …) read an op here when `context.abi_compat == VERBS_ABI_IS_EXTENDED`, `sz` covers it and
/// it is not NULL; otherwise they fall back to the exported function or fail with
/// EOPNOTSUPP. Ops this crate does not model are untyped pointers (keep them NULL).
#[repr(C)]
#[allow(non_snake_case)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: *mut c_void,
    pub alloc_null_mr: *mut c_void,
    pub read_counters: *mut c_void,
    pub attach_counters_point_flow: *mut c_void,
    pub create_counters: *mut c_void,
    pub destroy_counters: *mut c_void,
    pub reg_dm_mr: *mut c_void,
    pub alloc_dm: *mut c_void,
    pub free_dm: *mut c_void,
    pub modify_flow_action_esp: *mut c_void,
    pub destroy_flow_action: *mut c_void,
    pub create_flow_action_esp: *mut c_void,
    pub modify_qp_rate_limit: *mut c_void,
    pub alloc_parent_domain: *mut c_void,
    pub dealloc_td: *mut c_void,
    pub alloc_td: *mut c_void,
    pub modify_cq: *mut c_void,
    pub post_srq_ops: *mut c_void,
    pub destroy_rwq_ind_table: *mut c_void,
    pub create_rwq_ind_table: *mut c_void,
    pub destroy_wq: *mut c_void,
    pub modify_wq: *mut c_void,
    pub create_wq: *mut c_void,
    pub query_rt_values: *mut c_void,
    pub create_cq_ex: *mut c_void,
    /// `priv` in C (a Rust keyword).
    pub priv_: *mut c_void,
    /// `int (*)(struct ibv_context *, const struct ibv_query_device_ex_input *,
    /// struct ibv_device_attr_ex *, size_t)`; NULL makes `ibv_query_device_ex` fall back to
    /// `ibv_query_device`.
    pub query_device_ex: *mut c_void,
    pub ibv_destroy_flow: *mut c_void,
    pub ABI_placeholder2: *mut c_void,
    pub ibv_create_flow: *mut c_void,
    pub ABI_placeholder1: *mut c_void,
    pub open_qp: *mut c_void,
    pub create_qp_ex: *mut c_void,
    pub get_srq_num: *mut c_void,
    pub create_srq_ex: *mut c_void,
    pub open_xrcd: *mut c_void,
    pub close_xrcd: *mut c_void,
    pub _ABI_placeholder3: u64,
    /// `sizeof(struct verbs_context)` when every op field exists: `verbs_get_ctx_op` treats
    /// an op as absent when `sz < sizeof(struct verbs_context) - offsetof(op)`.
    pub sz: usize,
    /// Must be last: applications get `&context`.
    pub context: ibv_context,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    /// `__be64`.
    pub node_guid: u64,
    /// `__be64`.
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: ibv_atomic_cap,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        // SAFETY: plain integers and a byte array: all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: ibv_port_state,
    pub max_mtu: ibv_mtu,
    pub active_mtu: ibv_mtu,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    /// `struct ibv_srq *` (SRQs are not modelled here).
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: ibv_qp_state,
    pub qp_type: ibv_qp_type,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    /// `struct ibv_srq *`.
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: ibv_qp_type,
    pub sq_sig_all: c_int,
}

impl Default for ibv_qp_init_attr {
    fn default() -> Self {
        // SAFETY: null pointers and zero integers are valid values of every field.
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: ibv_qp_state,
    pub cur_qp_state: ibv_qp_state,
    pub path_mtu: ibv_mtu,
    pub path_mig_state: ibv_mig_state,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `ibv_send_wr.wr.rdma`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr.ud`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_ud {
    /// `struct ibv_ah *`.
    pub ah: *mut c_void,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `ibv_send_wr.qp_type.xrc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_xrc {
    pub remote_srqn: u32,
}

/// `ibv_send_wr.qp_type`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_qp_type {
    pub xrc: ibv_send_wr_xrc,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `ibv_send_wr.bind_mw` (member of the last, anonymous union).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_bind_mw {
    /// `struct ibv_mw *`.
    pub mw: *mut c_void,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `ibv_send_wr.tso` (member of the last, anonymous union).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

/// The last, anonymous union of `ibv_send_wr` (`bind_mw` / `tso`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_ext {
    pub bind_mw: ibv_send_wr_bind_mw,
    pub tso: ibv_send_wr_tso,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: ibv_wr_opcode,
    pub send_flags: c_uint,
    /// The anonymous union `{ __be32 imm_data; uint32_t invalidate_rkey; }`: immediate data
    /// in network byte order for `*_WITH_IMM`, the rkey to invalidate for `*_INV`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    pub qp_type: ibv_send_wr_qp_type,
    /// The anonymous union `{ bind_mw; tso; }`.
    pub ext: ibv_send_wr_ext,
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        // SAFETY: integers, null pointers and unions of those: all-zero is valid.
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

impl Default for ibv_recv_wr {
    fn default() -> Self {
        // SAFETY: integers and null pointers: all-zero is valid.
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: ibv_wc_status,
    pub opcode: ibv_wc_opcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// The anonymous union `{ __be32 imm_data; uint32_t invalidated_rkey; }`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `ibv_async_event.element`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    /// `struct ibv_srq *`.
    pub srq: *mut c_void,
    /// `struct ibv_wq *`.
    pub wq: *mut c_void,
    pub port_num: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    pub element: ibv_async_event_element,
    pub event_type: ibv_event_type,
}

impl Default for ibv_async_event {
    fn default() -> Self {
        // SAFETY: a null pointer / zero integer union and an integer: all-zero is valid.
        unsafe { std::mem::zeroed() }
    }
}
