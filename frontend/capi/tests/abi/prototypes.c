/* Compiled by tests/header_sync.rs against include/vrdma.h and linked with libvrdma: every
 * function of the header must have exactly the prototype below (the Rust side checks the
 * same list in src/lib.rs, `exported_signatures`), and the library must define it. */
#include <stdio.h>
#include <vrdma.h>

#define CHECK(name, type)                                                                     \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), type), #name);

CHECK(vrdma_last_error, const char *(*)(void))
CHECK(vrdma_wc_status_str, const char *(*)(uint32_t))
CHECK(vrdma_open, int (*)(vrdma_context **, uint32_t, int))
CHECK(vrdma_close, void (*)(vrdma_context *))
CHECK(vrdma_domid, int (*)(const vrdma_context *))
CHECK(vrdma_mode, int (*)(const vrdma_context *))
CHECK(vrdma_alloc_pd, int (*)(vrdma_context *, vrdma_pd **))
CHECK(vrdma_dealloc_pd, void (*)(vrdma_pd *))
CHECK(vrdma_alloc_mr, int (*)(vrdma_pd *, size_t, uint32_t, vrdma_mr **))
CHECK(vrdma_free_mr, void (*)(vrdma_mr *))
CHECK(vrdma_mr_write, int (*)(vrdma_mr *, size_t, const void *, size_t))
CHECK(vrdma_mr_read, int (*)(const vrdma_mr *, size_t, void *, size_t))
CHECK(vrdma_mr_len, size_t (*)(const vrdma_mr *))
CHECK(vrdma_mr_lkey, uint32_t (*)(const vrdma_mr *))
CHECK(vrdma_mr_rkey, uint32_t (*)(const vrdma_mr *))
CHECK(vrdma_mr_addr, uint64_t (*)(const vrdma_mr *))
CHECK(vrdma_mr_remote, int (*)(const vrdma_mr *, struct vrdma_remote_mr *))
CHECK(vrdma_remote_mr_format, int (*)(const struct vrdma_remote_mr *, char *, size_t))
CHECK(vrdma_remote_mr_parse, int (*)(const char *, struct vrdma_remote_mr *))
CHECK(vrdma_create_cq, int (*)(vrdma_context *, uint32_t, vrdma_cq **))
CHECK(vrdma_destroy_cq, void (*)(vrdma_cq *))
CHECK(vrdma_poll_cq, int (*)(vrdma_cq *, struct vrdma_wc *, int))
CHECK(vrdma_arm_cq, int (*)(vrdma_cq *, int))
CHECK(vrdma_wait_cq, int (*)(vrdma_cq *, struct vrdma_wc *, int, int))
CHECK(vrdma_create_qp, int (*)(vrdma_pd *, vrdma_cq *, vrdma_cq *, uint32_t, uint32_t, vrdma_qp **))
CHECK(vrdma_destroy_qp, void (*)(vrdma_qp *))
CHECK(vrdma_qp_endpoint, int (*)(const vrdma_qp *, struct vrdma_endpoint *))
CHECK(vrdma_endpoint_format, int (*)(const struct vrdma_endpoint *, char *, size_t))
CHECK(vrdma_endpoint_parse, int (*)(const char *, struct vrdma_endpoint *))
CHECK(vrdma_qp_connect, int (*)(vrdma_qp *, const struct vrdma_endpoint *))
CHECK(vrdma_post_recv, int (*)(vrdma_qp *, vrdma_mr *, size_t, uint32_t, uint64_t))
CHECK(vrdma_post_send, int (*)(vrdma_qp *, vrdma_mr *, size_t, uint32_t, uint64_t))
CHECK(vrdma_post_send_imm, int (*)(vrdma_qp *, vrdma_mr *, size_t, uint32_t, uint32_t, uint64_t))
CHECK(vrdma_post_send_inline, int (*)(vrdma_qp *, const void *, size_t, uint64_t))
CHECK(vrdma_post_write, int (*)(vrdma_qp *, vrdma_mr *, size_t, uint32_t, uint64_t, uint32_t, uint64_t))
CHECK(vrdma_post_write_imm, int (*)(vrdma_qp *, vrdma_mr *, size_t, uint32_t, uint64_t, uint32_t, uint32_t, uint64_t))
CHECK(vrdma_post_read, int (*)(vrdma_qp *, vrdma_mr *, size_t, uint32_t, uint64_t, uint32_t, uint64_t))

_Static_assert(sizeof(struct vrdma_wc) == 40, "struct vrdma_wc");
_Static_assert(sizeof(struct vrdma_remote_mr) == 24, "struct vrdma_remote_mr");
_Static_assert(sizeof(struct vrdma_endpoint) == 24, "struct vrdma_endpoint");
_Static_assert(__builtin_offsetof(struct vrdma_wc, byte_len) == 16, "vrdma_wc.byte_len");
_Static_assert(__builtin_offsetof(struct vrdma_wc, has_imm) == 32, "vrdma_wc.has_imm");
_Static_assert(__builtin_offsetof(struct vrdma_endpoint, qp_num) == 16, "vrdma_endpoint.qp_num");

int main(void) {
    /* Call something so the library is really loaded and its symbols resolved. */
    struct vrdma_endpoint ep;
    if (vrdma_endpoint_parse("::/7", &ep) != 0 || ep.qp_num != 7) {
        fprintf(stderr, "endpoint_parse: %s\n", vrdma_last_error());
        return 1;
    }
    if (vrdma_alloc_pd(NULL, NULL) != -22) {
        fprintf(stderr, "NULL ctx must be -EINVAL\n");
        return 1;
    }
    printf("ok %s\n", vrdma_last_error());
    return 0;
}
