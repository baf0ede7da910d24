//! The layout facts the C test checks: one `(name, value)` per size, field offset and constant.

use crate::cma::*;
use crate::verbs::*;
use std::mem::{offset_of, size_of};

macro_rules! layout {
    ($t:ident, $struct:ident { $($field:ident),* $(,)? }) => {{
        $t.push((concat!("sizeof ", stringify!($struct)), size_of::<$struct>() as i64));
        $(
            $t.push((
                concat!("offsetof ", stringify!($struct), ".", stringify!($field)),
                offset_of!($struct, $field) as i64,
            ));
        )*
    }};
}

macro_rules! values {
    ($t:ident, $($c:ident),* $(,)?) => {{
        $( $t.push((stringify!($c), $c as i64)); )*
    }};
}

/// Every checked fact, in the order `tests/abi/verbs_abi.c` prints them. Entries for
/// anonymous C members use the C member's name: `ibv_send_wr.invalidate_rkey` is the Rust
/// field `imm_data`, `ibv_send_wr.bind_mw` is `ext`, `rdma_addr.src_addr` is `src`, … and
/// the members of anonymous inner structs are offsets within the Rust type that models them.
pub fn layout_table() -> Vec<(&'static str, i64)> {
    let mut t: Vec<(&'static str, i64)> = Vec::new();

    // --- verbs.h structures ---
    t.push(("sizeof union ibv_gid", size_of::<ibv_gid>() as i64));
    t.push((
        "offsetof ibv_gid.global.interface_id",
        offset_of!(ibv_gid_global, interface_id) as i64,
    ));
    t.push((
        "sizeof pthread_mutex_t",
        size_of::<pthread_mutex_t>() as i64,
    ));
    t.push(("sizeof pthread_cond_t", size_of::<pthread_cond_t>() as i64));
    layout!(
        t,
        ibv_gid_entry {
            gid,
            gid_index,
            port_num,
            gid_type,
            ndev_ifindex
        }
    );
    layout!(t, _ibv_device_ops { _dummy1, _dummy2 });
    layout!(
        t,
        ibv_device {
            _ops,
            node_type,
            transport_type,
            name,
            dev_name,
            dev_path,
            ibdev_path
        }
    );
    layout!(
        t,
        ibv_context_ops {
            _compat_query_device,
            _compat_query_port,
            _compat_alloc_pd,
            _compat_dealloc_pd,
            _compat_reg_mr,
            _compat_rereg_mr,
            _compat_dereg_mr,
            alloc_mw,
            bind_mw,
            dealloc_mw,
            _compat_create_cq,
            poll_cq,
            req_notify_cq,
            _compat_cq_event,
            _compat_resize_cq,
            _compat_destroy_cq,
            _compat_create_srq,
            _compat_modify_srq,
            _compat_query_srq,
            _compat_destroy_srq,
            post_srq_recv,
            _compat_create_qp,
            _compat_query_qp,
            _compat_modify_qp,
            _compat_destroy_qp,
            post_send,
            post_recv,
            _compat_create_ah,
            _compat_destroy_ah,
            _compat_attach_mcast,
            _compat_detach_mcast,
            _compat_async_event,
        }
    );
    layout!(
        t,
        ibv_context {
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat
        }
    );
    layout!(
        t,
        verbs_context {
            query_port,
            advise_mr,
            alloc_null_mr,
            read_counters,
            attach_counters_point_flow,
            create_counters,
            destroy_counters,
            reg_dm_mr,
            alloc_dm,
            free_dm,
            modify_flow_action_esp,
            destroy_flow_action,
            create_flow_action_esp,
            modify_qp_rate_limit,
            alloc_parent_domain,
            dealloc_td,
            alloc_td,
            modify_cq,
            post_srq_ops,
            destroy_rwq_ind_table,
            create_rwq_ind_table,
            destroy_wq,
            modify_wq,
            create_wq,
            query_rt_values,
            create_cq_ex,
            query_device_ex,
            ibv_destroy_flow,
            ABI_placeholder2,
            ibv_create_flow,
            ABI_placeholder1,
            open_qp,
            create_qp_ex,
            get_srq_num,
            create_srq_ex,
            open_xrcd,
            close_xrcd,
            _ABI_placeholder3,
            sz,
            context
        }
    );
    t.push((
        "offsetof verbs_context.priv",
        offset_of!(verbs_context, priv_) as i64,
    ));
    layout!(
        t,
        ibv_device_attr {
            fw_ver,
            node_guid,
            sys_image_guid,
            max_mr_size,
            page_size_cap,
            vendor_id,
            vendor_part_id,
            hw_ver,
            max_qp,
            max_qp_wr,
            device_cap_flags,
            max_sge,
            max_sge_rd,
            max_cq,
            max_cqe,
            max_mr,
            max_pd,
            max_qp_rd_atom,
            max_ee_rd_atom,
            max_res_rd_atom,
            max_qp_init_rd_atom,
            max_ee_init_rd_atom,
            atomic_cap,
            max_ee,
            max_rdd,
            max_mw,
            max_raw_ipv6_qp,
            max_raw_ethy_qp,
            max_mcast_grp,
            max_mcast_qp_attach,
            max_total_mcast_qp_attach,
            max_ah,
            max_fmr,
            max_map_per_fmr,
            max_srq,
            max_srq_wr,
            max_srq_sge,
            max_pkeys,
            local_ca_ack_delay,
            phys_port_cnt,
        }
    );
    layout!(
        t,
        ibv_port_attr {
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            port_cap_flags,
            max_msg_sz,
            bad_pkey_cntr,
            qkey_viol_cntr,
            pkey_tbl_len,
            lid,
            sm_lid,
            lmc,
            max_vl_num,
            sm_sl,
            subnet_timeout,
            init_type_reply,
            active_width,
            active_speed,
            phys_state,
            link_layer,
            flags,
            port_cap_flags2,
        }
    );
    layout!(t, ibv_pd { context, handle });
    layout!(
        t,
        ibv_mr {
            context,
            pd,
            addr,
            length,
            handle,
            lkey,
            rkey
        }
    );
    layout!(
        t,
        ibv_comp_channel {
            context,
            fd,
            refcnt
        }
    );
    layout!(
        t,
        ibv_cq {
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed,
        }
    );
    layout!(
        t,
        ibv_qp {
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed,
        }
    );
    layout!(
        t,
        ibv_qp_cap {
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data
        }
    );
    layout!(
        t,
        ibv_qp_init_attr {
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all
        }
    );
    layout!(
        t,
        ibv_global_route {
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class
        }
    );
    layout!(
        t,
        ibv_ah_attr {
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num
        }
    );
    layout!(
        t,
        ibv_qp_attr {
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit,
        }
    );
    layout!(t, ibv_sge { addr, length, lkey });
    layout!(
        t,
        ibv_send_wr {
            wr_id,
            next,
            sg_list,
            num_sge,
            opcode,
            send_flags,
            imm_data,
            wr,
            qp_type
        }
    );
    t.push((
        "offsetof ibv_send_wr.invalidate_rkey",
        offset_of!(ibv_send_wr, imm_data) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.bind_mw",
        offset_of!(ibv_send_wr, ext) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.tso",
        offset_of!(ibv_send_wr, ext) as i64,
    ));
    t.push(("sizeof ibv_send_wr.wr", size_of::<ibv_send_wr_wr>() as i64));
    t.push((
        "sizeof ibv_send_wr.wr.rdma",
        size_of::<ibv_send_wr_rdma>() as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.rdma.remote_addr",
        offset_of!(ibv_send_wr_rdma, remote_addr) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.rdma.rkey",
        offset_of!(ibv_send_wr_rdma, rkey) as i64,
    ));
    t.push((
        "sizeof ibv_send_wr.wr.atomic",
        size_of::<ibv_send_wr_atomic>() as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.atomic.remote_addr",
        offset_of!(ibv_send_wr_atomic, remote_addr) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.atomic.compare_add",
        offset_of!(ibv_send_wr_atomic, compare_add) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.atomic.swap",
        offset_of!(ibv_send_wr_atomic, swap) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.atomic.rkey",
        offset_of!(ibv_send_wr_atomic, rkey) as i64,
    ));
    t.push((
        "sizeof ibv_send_wr.wr.ud",
        size_of::<ibv_send_wr_ud>() as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.ud.ah",
        offset_of!(ibv_send_wr_ud, ah) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.ud.remote_qpn",
        offset_of!(ibv_send_wr_ud, remote_qpn) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.wr.ud.remote_qkey",
        offset_of!(ibv_send_wr_ud, remote_qkey) as i64,
    ));
    t.push((
        "sizeof ibv_send_wr.qp_type",
        size_of::<ibv_send_wr_qp_type>() as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.qp_type.xrc.remote_srqn",
        offset_of!(ibv_send_wr_xrc, remote_srqn) as i64,
    ));
    t.push((
        "sizeof ibv_send_wr.bind_mw",
        size_of::<ibv_send_wr_bind_mw>() as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.bind_mw.mw",
        offset_of!(ibv_send_wr_bind_mw, mw) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.bind_mw.rkey",
        offset_of!(ibv_send_wr_bind_mw, rkey) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.bind_mw.bind_info",
        offset_of!(ibv_send_wr_bind_mw, bind_info) as i64,
    ));
    t.push((
        "sizeof ibv_send_wr.tso",
        size_of::<ibv_send_wr_tso>() as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.tso.hdr",
        offset_of!(ibv_send_wr_tso, hdr) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.tso.hdr_sz",
        offset_of!(ibv_send_wr_tso, hdr_sz) as i64,
    ));
    t.push((
        "offsetof ibv_send_wr.tso.mss",
        offset_of!(ibv_send_wr_tso, mss) as i64,
    ));
    layout!(
        t,
        ibv_mw_bind_info {
            mr,
            addr,
            length,
            mw_access_flags
        }
    );
    layout!(
        t,
        ibv_recv_wr {
            wr_id,
            next,
            sg_list,
            num_sge
        }
    );
    layout!(
        t,
        ibv_wc {
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm_data,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl,
            dlid_path_bits,
        }
    );
    t.push((
        "offsetof ibv_wc.invalidated_rkey",
        offset_of!(ibv_wc, imm_data) as i64,
    ));
    layout!(
        t,
        ibv_async_event {
            element,
            event_type
        }
    );
    t.push((
        "sizeof ibv_async_event.element",
        size_of::<ibv_async_event_element>() as i64,
    ));

    // --- rdma_cma.h structures ---
    t.push(("sizeof sockaddr", size_of::<sockaddr>() as i64));
    t.push(("sizeof sockaddr_in", size_of::<sockaddr_in>() as i64));
    t.push((
        "offsetof sockaddr_in.sin_port",
        offset_of!(sockaddr_in, sin_port) as i64,
    ));
    t.push((
        "offsetof sockaddr_in.sin_addr",
        offset_of!(sockaddr_in, sin_addr) as i64,
    ));
    t.push(("sizeof sockaddr_in6", size_of::<sockaddr_in6>() as i64));
    t.push((
        "offsetof sockaddr_in6.sin6_port",
        offset_of!(sockaddr_in6, sin6_port) as i64,
    ));
    t.push((
        "offsetof sockaddr_in6.sin6_flowinfo",
        offset_of!(sockaddr_in6, sin6_flowinfo) as i64,
    ));
    t.push((
        "offsetof sockaddr_in6.sin6_addr",
        offset_of!(sockaddr_in6, sin6_addr) as i64,
    ));
    t.push((
        "offsetof sockaddr_in6.sin6_scope_id",
        offset_of!(sockaddr_in6, sin6_scope_id) as i64,
    ));
    t.push((
        "sizeof sockaddr_storage",
        size_of::<sockaddr_storage>() as i64,
    ));
    t.push((
        "alignof sockaddr_storage",
        std::mem::align_of::<sockaddr_storage>() as i64,
    ));
    layout!(t, rdma_ib_addr { sgid, dgid, pkey });
    layout!(t, rdma_addr { src, dst, addr });
    t.push((
        "offsetof rdma_addr.src_sin6",
        offset_of!(rdma_addr, src) as i64,
    ));
    t.push((
        "offsetof rdma_addr.dst_sin",
        offset_of!(rdma_addr, dst) as i64,
    ));
    layout!(
        t,
        rdma_route {
            addr,
            path_rec,
            num_paths
        }
    );
    layout!(t, rdma_event_channel { fd });
    layout!(
        t,
        rdma_cm_id {
            verbs,
            channel,
            context,
            qp,
            route,
            ps,
            port_num,
            event,
            send_cq_channel,
            send_cq,
            recv_cq_channel,
            recv_cq,
            srq,
            pd,
            qp_type,
        }
    );
    layout!(
        t,
        rdma_conn_param {
            private_data,
            private_data_len,
            responder_resources,
            initiator_depth,
            flow_control,
            retry_count,
            rnr_retry_count,
            srq,
            qp_num,
        }
    );
    layout!(
        t,
        rdma_ud_param {
            private_data,
            private_data_len,
            ah_attr,
            qp_num,
            qkey
        }
    );
    layout!(
        t,
        rdma_cm_event {
            id,
            listen_id,
            event,
            status,
            param
        }
    );

    // --- constants ---
    values!(
        t,
        IBV_NODE_UNKNOWN,
        IBV_NODE_CA,
        IBV_NODE_SWITCH,
        IBV_NODE_ROUTER,
        IBV_NODE_RNIC,
        IBV_NODE_USNIC,
        IBV_NODE_USNIC_UDP,
        IBV_NODE_UNSPECIFIED,
        IBV_TRANSPORT_UNKNOWN,
        IBV_TRANSPORT_IB,
        IBV_TRANSPORT_IWARP,
        IBV_TRANSPORT_USNIC,
        IBV_TRANSPORT_USNIC_UDP,
        IBV_TRANSPORT_UNSPECIFIED,
        IBV_ATOMIC_NONE,
        IBV_ATOMIC_HCA,
        IBV_ATOMIC_GLOB,
        IBV_GID_TYPE_IB,
        IBV_GID_TYPE_ROCE_V1,
        IBV_GID_TYPE_ROCE_V2,
        IBV_MTU_256,
        IBV_MTU_512,
        IBV_MTU_1024,
        IBV_MTU_2048,
        IBV_MTU_4096,
        IBV_PORT_NOP,
        IBV_PORT_DOWN,
        IBV_PORT_INIT,
        IBV_PORT_ARMED,
        IBV_PORT_ACTIVE,
        IBV_PORT_ACTIVE_DEFER,
        IBV_LINK_LAYER_UNSPECIFIED,
        IBV_LINK_LAYER_INFINIBAND,
        IBV_LINK_LAYER_ETHERNET,
        IBV_EVENT_CQ_ERR,
        IBV_EVENT_QP_FATAL,
        IBV_EVENT_QP_REQ_ERR,
        IBV_EVENT_QP_ACCESS_ERR,
        IBV_EVENT_COMM_EST,
        IBV_EVENT_SQ_DRAINED,
        IBV_EVENT_PATH_MIG,
        IBV_EVENT_PATH_MIG_ERR,
        IBV_EVENT_DEVICE_FATAL,
        IBV_EVENT_PORT_ACTIVE,
        IBV_EVENT_PORT_ERR,
        IBV_EVENT_LID_CHANGE,
        IBV_EVENT_PKEY_CHANGE,
        IBV_EVENT_SM_CHANGE,
        IBV_EVENT_SRQ_ERR,
        IBV_EVENT_SRQ_LIMIT_REACHED,
        IBV_EVENT_QP_LAST_WQE_REACHED,
        IBV_EVENT_CLIENT_REREGISTER,
        IBV_EVENT_GID_CHANGE,
        IBV_EVENT_WQ_FATAL,
        IBV_WC_SUCCESS,
        IBV_WC_LOC_LEN_ERR,
        IBV_WC_LOC_QP_OP_ERR,
        IBV_WC_LOC_EEC_OP_ERR,
        IBV_WC_LOC_PROT_ERR,
        IBV_WC_WR_FLUSH_ERR,
        IBV_WC_MW_BIND_ERR,
        IBV_WC_BAD_RESP_ERR,
        IBV_WC_LOC_ACCESS_ERR,
        IBV_WC_REM_INV_REQ_ERR,
        IBV_WC_REM_ACCESS_ERR,
        IBV_WC_REM_OP_ERR,
        IBV_WC_RETRY_EXC_ERR,
        IBV_WC_RNR_RETRY_EXC_ERR,
        IBV_WC_LOC_RDD_VIOL_ERR,
        IBV_WC_REM_INV_RD_REQ_ERR,
        IBV_WC_REM_ABORT_ERR,
        IBV_WC_INV_EECN_ERR,
        IBV_WC_INV_EEC_STATE_ERR,
        IBV_WC_FATAL_ERR,
        IBV_WC_RESP_TIMEOUT_ERR,
        IBV_WC_GENERAL_ERR,
        IBV_WC_TM_ERR,
        IBV_WC_TM_RNDV_INCOMPLETE,
        IBV_WC_SEND,
        IBV_WC_RDMA_WRITE,
        IBV_WC_RDMA_READ,
        IBV_WC_COMP_SWAP,
        IBV_WC_FETCH_ADD,
        IBV_WC_BIND_MW,
        IBV_WC_LOCAL_INV,
        IBV_WC_TSO,
        IBV_WC_ATOMIC_WRITE,
        IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM,
        IBV_WC_GRH,
        IBV_WC_WITH_IMM,
        IBV_WC_IP_CSUM_OK,
        IBV_WC_WITH_INV,
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC,
        IBV_ACCESS_MW_BIND,
        IBV_ACCESS_ZERO_BASED,
        IBV_ACCESS_ON_DEMAND,
        IBV_ACCESS_HUGETLB,
        IBV_ACCESS_RELAXED_ORDERING,
        IBV_MW_TYPE_1,
        IBV_MW_TYPE_2,
        IBV_QPT_RC,
        IBV_QPT_UC,
        IBV_QPT_UD,
        IBV_QPT_RAW_PACKET,
        IBV_QPT_XRC_SEND,
        IBV_QPT_XRC_RECV,
        IBV_QPT_DRIVER,
        IBV_QP_STATE,
        IBV_QP_CUR_STATE,
        IBV_QP_EN_SQD_ASYNC_NOTIFY,
        IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX,
        IBV_QP_PORT,
        IBV_QP_QKEY,
        IBV_QP_AV,
        IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT,
        IBV_QP_RNR_RETRY,
        IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_ALT_PATH,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_PATH_MIG_STATE,
        IBV_QP_CAP,
        IBV_QP_DEST_QPN,
        IBV_QP_RATE_LIMIT,
        IBV_QPS_RESET,
        IBV_QPS_INIT,
        IBV_QPS_RTR,
        IBV_QPS_RTS,
        IBV_QPS_SQD,
        IBV_QPS_SQE,
        IBV_QPS_ERR,
        IBV_QPS_UNKNOWN,
        IBV_MIG_MIGRATED,
        IBV_MIG_REARM,
        IBV_MIG_ARMED,
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND,
        IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV,
        IBV_WR_BIND_MW,
        IBV_WR_SEND_WITH_INV,
        IBV_WR_TSO,
        IBV_WR_DRIVER1,
        IBV_WR_ATOMIC_WRITE,
        IBV_SEND_FENCE,
        IBV_SEND_SIGNALED,
        IBV_SEND_SOLICITED,
        IBV_SEND_INLINE,
        IBV_SEND_IP_CSUM,
        IBV_SYSFS_NAME_MAX,
        IBV_SYSFS_PATH_MAX,
        RDMA_CM_EVENT_ADDR_RESOLVED,
        RDMA_CM_EVENT_ADDR_ERROR,
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR,
        RDMA_CM_EVENT_UNREACHABLE,
        RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED,
        RDMA_CM_EVENT_DISCONNECTED,
        RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN,
        RDMA_CM_EVENT_MULTICAST_ERROR,
        RDMA_CM_EVENT_ADDR_CHANGE,
        RDMA_CM_EVENT_TIMEWAIT_EXIT,
        RDMA_PS_IPOIB,
        RDMA_PS_TCP,
        RDMA_PS_UDP,
        RDMA_PS_IB,
        RDMA_MAX_RESP_RES,
        RDMA_MAX_INIT_DEPTH,
        RDMA_UDP_QKEY,
    );
    t
}
