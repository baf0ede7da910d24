//! `<rdma/rdma_cma.h>` (librdmacm, rdma-core 44): connection-manager types and constants.

use crate::verbs::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_qp_type,
};
use std::ffi::{c_int, c_uint, c_void};

pub type rdma_cm_event_type = c_uint;
pub const RDMA_CM_EVENT_ADDR_RESOLVED: rdma_cm_event_type = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: rdma_cm_event_type = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: rdma_cm_event_type = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: rdma_cm_event_type = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: rdma_cm_event_type = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: rdma_cm_event_type = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: rdma_cm_event_type = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: rdma_cm_event_type = 7;
pub const RDMA_CM_EVENT_REJECTED: rdma_cm_event_type = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: rdma_cm_event_type = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: rdma_cm_event_type = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: rdma_cm_event_type = 11;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: rdma_cm_event_type = 12;
pub const RDMA_CM_EVENT_MULTICAST_ERROR: rdma_cm_event_type = 13;
pub const RDMA_CM_EVENT_ADDR_CHANGE: rdma_cm_event_type = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: rdma_cm_event_type = 15;

pub type rdma_port_space = c_uint;
pub const RDMA_PS_IPOIB: rdma_port_space = 0x0002;
pub const RDMA_PS_TCP: rdma_port_space = 0x0106;
pub const RDMA_PS_UDP: rdma_port_space = 0x0111;
pub const RDMA_PS_IB: rdma_port_space = 0x013F;

pub const RDMA_MAX_RESP_RES: u8 = 0xFF;
pub const RDMA_MAX_INIT_DEPTH: u8 = 0xFF;
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// glibc `struct sockaddr` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct sockaddr {
    pub sa_family: u16,
    pub sa_data: [u8; 14],
}

/// glibc `struct sockaddr_in` (16 bytes); port and address in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct sockaddr_in {
    pub sin_family: u16,
    pub sin_port: u16,
    pub sin_addr: u32,
    pub sin_zero: [u8; 8],
}

/// glibc `struct sockaddr_in6` (28 bytes); port and flow info in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct sockaddr_in6 {
    pub sin6_family: u16,
    pub sin6_port: u16,
    pub sin6_flowinfo: u32,
    pub sin6_addr: [u8; 16],
    pub sin6_scope_id: u32,
}

/// glibc `struct sockaddr_storage` (128 bytes, 8-aligned).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct sockaddr_storage {
    pub ss_family: u16,
    pub _padding: [u8; 126],
}

/// One of the two address unions of `struct rdma_addr` (`src_*` or `dst_*`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_sockaddr {
    pub addr: sockaddr,
    pub sin: sockaddr_in,
    pub sin6: sockaddr_in6,
    pub storage: sockaddr_storage,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    /// `__be16`.
    pub pkey: u16,
}

/// `rdma_addr.addr` (`union { struct rdma_ib_addr ibaddr; }`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_addr_addr {
    pub ibaddr: rdma_ib_addr,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// The anonymous `src_addr`/`src_sin`/`src_sin6`/`src_storage` union.
    pub src: rdma_sockaddr,
    /// The anonymous `dst_addr`/`dst_sin`/`dst_sin6`/`dst_storage` union.
    pub dst: rdma_sockaddr,
    pub addr: rdma_addr_addr,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    /// `struct ibv_sa_path_rec *`.
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: rdma_port_space,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    /// `struct ibv_srq *`.
    pub srq: *mut c_void,
    pub pd: *mut ibv_pd,
    pub qp_type: ibv_qp_type,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    /// Ignored when accepting.
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// This and `qp_num` are ignored if a QP is created on the `rdma_cm_id`.
    pub srq: u8,
    pub qp_num: u32,
}

impl Default for rdma_conn_param {
    fn default() -> Self {
        // SAFETY: a null pointer and integers: all-zero is valid.
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// `rdma_cm_event.param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: rdma_cm_event_type,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}
