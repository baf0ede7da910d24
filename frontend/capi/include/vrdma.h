/*
 * vrdma.h -- C API of libvrdma, RDMA verbs for Xen guests (the vrdma frontend library).
 *
 * Link with -lvrdma (pkg-config: vrdma). Mirrors the Rust API of the `vrdma` crate:
 *
 *   vrdma_context *ctx;  vrdma_open(&ctx, 0, VRDMA_MODE_DEFAULT);
 *   vrdma_pd *pd;        vrdma_alloc_pd(ctx, &pd);
 *   vrdma_cq *cq;        vrdma_create_cq(ctx, 64, &cq);
 *   vrdma_qp *qp;        vrdma_create_qp(pd, cq, cq, 0, 0, &qp);
 *   vrdma_mr *mr;        vrdma_alloc_mr(pd, 4096, VRDMA_ACCESS_ALL, &mr);
 *   vrdma_qp_endpoint(qp, &ep);   ... exchange with the peer ...   vrdma_qp_connect(qp, &peer);
 *   vrdma_mr_write(mr, 0, "hello", 5);  vrdma_post_send(qp, mr, 0, 5, 1);
 *   n = vrdma_poll_cq(cq, wc, 16);      (or vrdma_wait_cq to block)
 *
 * Conventions:
 *  - Functions returning int give 0 (or a count, or a flag) on success and a negative errno
 *    on failure (-EINVAL bad argument or NULL handle, -EAGAIN queue full, -ETIMEDOUT,
 *    -ENODEV no device, -ECONNREFUSED channel or connection refused, -EDQUOT quota
 *    exhausted, -ENOMEM backend out of resources, -ENOTCONN device lost, -EPROTO protocol
 *    error, -EIO anything else). vrdma_last_error() then says what failed (thread-local,
 *    valid until the next failing call on the same thread).
 *  - Handles are opaque. Free each with its destroy/free/close function, in any order: every
 *    object keeps alive what it needs (the channel closes when its last object is gone).
 *    Calls on one handle from several threads are serialized inside the library.
 *  - Registered memory is shared with another domain and written by RDMA at any time; it is
 *    accessed only by copy (vrdma_mr_write / vrdma_mr_read), never through a pointer.
 *  - In bypass mode (the default) posts and polls make no system call.
 */
#ifndef VRDMA_H
#define VRDMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* vrdma_open modes. DEFAULT: $VRDMA_MODE (bypass|mediated), else bypass. */
#define VRDMA_MODE_DEFAULT 0
#define VRDMA_MODE_BYPASS 1
#define VRDMA_MODE_MEDIATED 2

/* vrdma_alloc_mr access flags (local read is always allowed). */
#define VRDMA_ACCESS_LOCAL_WRITE 1u
#define VRDMA_ACCESS_REMOTE_WRITE 2u /* needs LOCAL_WRITE too */
#define VRDMA_ACCESS_REMOTE_READ 4u
#define VRDMA_ACCESS_ALL 7u

/* Largest vrdma_post_send_inline payload. */
#define VRDMA_MAX_INLINE 32

/* struct vrdma_wc.status */
#define VRDMA_WC_SUCCESS 0
#define VRDMA_WC_LOC_LEN_ERR 1
#define VRDMA_WC_LOC_QP_OP_ERR 2
#define VRDMA_WC_LOC_PROT_ERR 3
#define VRDMA_WC_WR_FLUSH_ERR 4
#define VRDMA_WC_REM_ACCESS_ERR 5
#define VRDMA_WC_REM_OP_ERR 6
#define VRDMA_WC_RETRY_EXC_ERR 7
#define VRDMA_WC_RNR_RETRY_EXC_ERR 8
#define VRDMA_WC_GENERAL_ERR 9
#define VRDMA_WC_BAD_RESP_ERR 10
#define VRDMA_WC_REM_INV_REQ_ERR 11
#define VRDMA_WC_BAD_WQE 12

/* struct vrdma_wc.opcode */
#define VRDMA_WC_SEND 1
#define VRDMA_WC_RDMA_WRITE 2
#define VRDMA_WC_RDMA_READ 3
#define VRDMA_WC_RECV 4
#define VRDMA_WC_RECV_RDMA_WITH_IMM 5

typedef struct vrdma_context vrdma_context;
typedef struct vrdma_pd vrdma_pd;
typedef struct vrdma_mr vrdma_mr;
typedef struct vrdma_cq vrdma_cq;
typedef struct vrdma_qp vrdma_qp;

/* One completed work request (40 bytes). */
struct vrdma_wc {
    uint64_t wr_id;
    uint32_t status;     /* VRDMA_WC_SUCCESS or an error */
    uint32_t opcode;     /* VRDMA_WC_SEND, ... */
    uint32_t byte_len;   /* bytes received or transferred */
    uint32_t imm_data;   /* valid if has_imm */
    uint32_t qp_num;     /* local QP */
    uint32_t vendor_err;
    uint8_t has_imm;
    uint8_t solicited;
    uint8_t reserved[6];
};

/* A peer's memory region, as RDMA READ/WRITE address it (24 bytes). */
struct vrdma_remote_mr {
    uint64_t addr;
    uint64_t len;
    uint32_t rkey;
    uint32_t reserved;
};

/* Where a queue pair is reached (24 bytes): the backend's address and the QP number. */
struct vrdma_endpoint {
    uint8_t addr[16];
    uint32_t qp_num;
    uint32_t reserved;
};

/* Errors */
const char *vrdma_last_error(void);
const char *vrdma_wc_status_str(uint32_t status);

/* Context: one channel to vrdma device `devid` of this domain. */
int vrdma_open(vrdma_context **out, uint32_t devid, int mode);
void vrdma_close(vrdma_context *ctx);
int vrdma_domid(const vrdma_context *ctx);
int vrdma_mode(const vrdma_context *ctx);

/* Protection domains */
int vrdma_alloc_pd(vrdma_context *ctx, vrdma_pd **out);
void vrdma_dealloc_pd(vrdma_pd *pd);

/* Memory regions: grant-backed, registered; accessed by copy. */
int vrdma_alloc_mr(vrdma_pd *pd, size_t len, uint32_t access, vrdma_mr **out);
void vrdma_free_mr(vrdma_mr *mr);
int vrdma_mr_write(vrdma_mr *mr, size_t offset, const void *data, size_t len);
int vrdma_mr_read(const vrdma_mr *mr, size_t offset, void *buf, size_t len);
size_t vrdma_mr_len(const vrdma_mr *mr);
uint32_t vrdma_mr_lkey(const vrdma_mr *mr);
uint32_t vrdma_mr_rkey(const vrdma_mr *mr);
uint64_t vrdma_mr_addr(const vrdma_mr *mr);
int vrdma_mr_remote(const vrdma_mr *mr, struct vrdma_remote_mr *out);
/* Text forms for the out-of-band exchange; format works like snprintf (returns the full
 * length, truncates to len - 1 and NUL-terminates). */
int vrdma_remote_mr_format(const struct vrdma_remote_mr *r, char *buf, size_t len);
int vrdma_remote_mr_parse(const char *s, struct vrdma_remote_mr *out);

/* Completion queues. poll: never blocks, returns the count. arm: 1 if a completion is
 * already waiting. wait: blocks on the event channel up to timeout_ms (< 0: forever),
 * returns the count (0 on timeout). */
int vrdma_create_cq(vrdma_context *ctx, uint32_t min_cqe, vrdma_cq **out);
void vrdma_destroy_cq(vrdma_cq *cq);
int vrdma_poll_cq(vrdma_cq *cq, struct vrdma_wc *wc, int n);
int vrdma_arm_cq(vrdma_cq *cq, int solicited_only);
int vrdma_wait_cq(vrdma_cq *cq, struct vrdma_wc *wc, int n, int timeout_ms);

/* Queue pairs (RC). sq_size/rq_size 0: 128. Both peers connect to each other's endpoint. */
int vrdma_create_qp(vrdma_pd *pd, vrdma_cq *send_cq, vrdma_cq *recv_cq, uint32_t sq_size,
                    uint32_t rq_size, vrdma_qp **out);
void vrdma_destroy_qp(vrdma_qp *qp);
int vrdma_qp_endpoint(const vrdma_qp *qp, struct vrdma_endpoint *out);
int vrdma_endpoint_format(const struct vrdma_endpoint *ep, char *buf, size_t len);
int vrdma_endpoint_parse(const char *s, struct vrdma_endpoint *out);
int vrdma_qp_connect(vrdma_qp *qp, const struct vrdma_endpoint *remote);

/* Posts: local data is `len` bytes of `mr` at `offset`; -EAGAIN when the queue is full. */
int vrdma_post_recv(vrdma_qp *qp, vrdma_mr *mr, size_t offset, uint32_t len, uint64_t wr_id);
int vrdma_post_send(vrdma_qp *qp, vrdma_mr *mr, size_t offset, uint32_t len, uint64_t wr_id);
int vrdma_post_send_imm(vrdma_qp *qp, vrdma_mr *mr, size_t offset, uint32_t len, uint32_t imm,
                        uint64_t wr_id);
int vrdma_post_send_inline(vrdma_qp *qp, const void *data, size_t len, uint64_t wr_id);
int vrdma_post_write(vrdma_qp *qp, vrdma_mr *mr, size_t offset, uint32_t len,
                     uint64_t remote_addr, uint32_t rkey, uint64_t wr_id);
int vrdma_post_write_imm(vrdma_qp *qp, vrdma_mr *mr, size_t offset, uint32_t len,
                         uint64_t remote_addr, uint32_t rkey, uint32_t imm, uint64_t wr_id);
int vrdma_post_read(vrdma_qp *qp, vrdma_mr *mr, size_t offset, uint32_t len,
                    uint64_t remote_addr, uint32_t rkey, uint64_t wr_id);

#ifdef __cplusplus
}
#endif

#endif /* VRDMA_H */
