/*
 * Drives one or both ends of a Xen shared ring with the macros of Xen's own io/ring.h, in a
 * file mapped MAP_SHARED, so that tests/c_ring_compat.rs can compare it with shared-ring.
 *
 * usage: ringc FILE REGION_LEN ENTRY_LEN(64|12)    commands on stdin, one result line each:
 *   FI start        XEN_FRONT_RING_INIT, then indexes moved to `start` (FRONT_RING_ATTACH)
 *   BI start        BACK_RING_ATTACH at `start`
 *   FP n            write n requests, RING_PUSH_REQUESTS_AND_CHECK_NOTIFY   -> "notify B"
 *   BC max          RING_COPY_REQUEST up to max requests                    -> "got K HASH"
 *   BP n            write n responses, RING_PUSH_RESPONSES_AND_CHECK_NOTIFY -> "notify B"
 *   FC max          copy up to max responses                                -> "got K HASH"
 *   BF / FF         RING_FINAL_CHECK_FOR_REQUESTS / _RESPONSES              -> "work B"
 *   BO prod         RING_REQUEST_PROD_OVERFLOW(back, prod)                  -> "overflow B"
 *   SERVE n         back end: answer n requests spinning (free-running)     -> "served n HASH"
 *   CLIENT n        front end: send n requests, collect n responses         -> "done n HASH"
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define mb()  __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define rmb() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define wmb() __atomic_thread_fence(__ATOMIC_RELEASE)
#include <xen/io/ring.h>

struct reqr64 { uint8_t b[64]; };
struct rspr64 { uint8_t b[64]; };
struct reqr12 { uint8_t b[12]; };
struct rspr12 { uint8_t b[12]; };
DEFINE_RING_TYPES(r64, struct reqr64, struct rspr64);
DEFINE_RING_TYPES(r12, struct reqr12, struct rspr12);

/* Entry contents both implementations generate: a function of the ring index and a salt. */
static void fill(uint8_t *p, size_t n, uint32_t idx, uint8_t salt)
{
    for (size_t j = 0; j < n; j++)
        p[j] = (uint8_t)(idx * 31u + j * 7u + salt);
}

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        h ^= p[j];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV0 0xcbf29ce484222325ull

#define DRIVER(T)                                                              \
static void run_##T(void *mem, size_t len)                                     \
{                                                                              \
    T##_sring_t *s = mem;                                                      \
    T##_front_ring_t f;                                                        \
    T##_back_ring_t bk;                                                        \
    char cmd[32];                                                              \
    unsigned long a;                                                           \
    memset(&f, 0, sizeof f);                                                   \
    memset(&bk, 0, sizeof bk);                                                 \
    while (scanf("%31s", cmd) == 1) {                                          \
        if (!strcmp(cmd, "Q"))                                                 \
            break;                                                             \
        if (!strcmp(cmd, "FF") || !strcmp(cmd, "BF")) {                        \
            int work;                                                          \
            if (cmd[0] == 'F')                                                 \
                RING_FINAL_CHECK_FOR_RESPONSES(&f, work);                      \
            else                                                               \
                RING_FINAL_CHECK_FOR_REQUESTS(&bk, work);                      \
            printf("work %d\n", work != 0);                                    \
        } else if (scanf("%lu", &a) != 1) {                                    \
            printf("bad\n");                                                   \
        } else if (!strcmp(cmd, "FI")) {                                       \
            RING_IDX st = (RING_IDX)a;                                         \
            XEN_FRONT_RING_INIT(&f, s, len);                                   \
            s->req_prod = s->rsp_prod = st;                                    \
            s->req_event = s->rsp_event = st + 1;                              \
            FRONT_RING_ATTACH(&f, s, st, len);                                 \
            printf("ok %u\n", RING_SIZE(&f));                                  \
        } else if (!strcmp(cmd, "BI")) {                                       \
            BACK_RING_ATTACH(&bk, s, (RING_IDX)a, len);                        \
            printf("ok %u\n", RING_SIZE(&bk));                                 \
        } else if (!strcmp(cmd, "FP")) {                                       \
            int notify;                                                        \
            for (unsigned long i = 0; i < a; i++) {                            \
                fill(RING_GET_REQUEST(&f, f.req_prod_pvt)->b,                  \
                     sizeof(struct req##T), f.req_prod_pvt, 'q');              \
                f.req_prod_pvt++;                                              \
            }                                                                  \
            RING_PUSH_REQUESTS_AND_CHECK_NOTIFY(&f, notify);                   \
            printf("notify %d\n", notify);                                     \
        } else if (!strcmp(cmd, "BP")) {                                       \
            int notify;                                                        \
            for (unsigned long i = 0; i < a; i++) {                            \
                fill(RING_GET_RESPONSE(&bk, bk.rsp_prod_pvt)->b,               \
                     sizeof(struct rsp##T), bk.rsp_prod_pvt, 'r');             \
                bk.rsp_prod_pvt++;                                             \
            }                                                                  \
            RING_PUSH_RESPONSES_AND_CHECK_NOTIFY(&bk, notify);                 \
            printf("notify %d\n", notify);                                     \
        } else if (!strcmp(cmd, "BC")) {                                       \
            unsigned long k = 0;                                               \
            uint64_t h = FNV0;                                                 \
            while (k < a && RING_HAS_UNCONSUMED_REQUESTS(&bk)) {               \
                struct req##T r;                                               \
                rmb();                                                         \
                RING_COPY_REQUEST(&bk, bk.req_cons, &r);                       \
                bk.req_cons++;                                                 \
                h = fnv(h, r.b, sizeof r.b);                                   \
                k++;                                                           \
            }                                                                  \
            printf("got %lu %016llx\n", k, (unsigned long long)h);             \
        } else if (!strcmp(cmd, "FC")) {                                       \
            unsigned long k = 0;                                               \
            uint64_t h = FNV0;                                                 \
            while (k < a && RING_HAS_UNCONSUMED_RESPONSES(&f)) {               \
                struct rsp##T r;                                               \
                rmb();                                                         \
                RING_COPY_RESPONSE(&f, f.rsp_cons, &r);                        \
                f.rsp_cons++;                                                  \
                h = fnv(h, r.b, sizeof r.b);                                   \
                k++;                                                           \
            }                                                                  \
            printf("got %lu %016llx\n", k, (unsigned long long)h);             \
        } else if (!strcmp(cmd, "BO")) {                                       \
            printf("overflow %d\n",                                            \
                   RING_REQUEST_PROD_OVERFLOW(&bk, (RING_IDX)a) ? 1 : 0);      \
        } else if (!strcmp(cmd, "SERVE")) {                                    \
            /* Echo each request back with every byte xor 0x5a. */             \
            unsigned long done = 0;                                            \
            uint64_t h = FNV0;                                                 \
            while (done < a) {                                                 \
                int more, notify;                                              \
                mb();                                                          \
                while (RING_HAS_UNCONSUMED_REQUESTS(&bk)) {                    \
                    struct req##T r;                                           \
                    rmb();                                                     \
                    RING_COPY_REQUEST(&bk, bk.req_cons, &r);                   \
                    bk.req_cons++;                                             \
                    h = fnv(h, r.b, sizeof r.b);                               \
                    for (size_t j = 0; j < sizeof r.b; j++)                    \
                        r.b[j] ^= 0x5a;                                        \
                    memcpy(RING_GET_RESPONSE(&bk, bk.rsp_prod_pvt)->b, r.b,    \
                           sizeof r.b);                                        \
                    bk.rsp_prod_pvt++;                                         \
                    done++;                                                    \
                }                                                              \
                RING_PUSH_RESPONSES_AND_CHECK_NOTIFY(&bk, notify);             \
                (void)notify;                                                  \
                RING_FINAL_CHECK_FOR_REQUESTS(&bk, more);                      \
                (void)more;                                                    \
            }                                                                  \
            printf("served %lu %016llx\n", done, (unsigned long long)h);       \
        } else if (!strcmp(cmd, "CLIENT")) {                                   \
            unsigned long sent = 0, got = 0;                                   \
            uint64_t h = FNV0;                                                 \
            while (got < a) {                                                  \
                int notify, more;                                              \
                while (sent < a && !RING_FULL(&f)) {                           \
                    fill(RING_GET_REQUEST(&f, f.req_prod_pvt)->b,              \
                         sizeof(struct req##T), f.req_prod_pvt, 'c');          \
                    f.req_prod_pvt++;                                          \
                    sent++;                                                    \
                }                                                              \
                RING_PUSH_REQUESTS_AND_CHECK_NOTIFY(&f, notify);               \
                (void)notify;                                                  \
                mb();                                                          \
                while (RING_HAS_UNCONSUMED_RESPONSES(&f)) {                    \
                    struct rsp##T r;                                           \
                    rmb();                                                     \
                    RING_COPY_RESPONSE(&f, f.rsp_cons, &r);                    \
                    f.rsp_cons++;                                              \
                    h = fnv(h, r.b, sizeof r.b);                               \
                    got++;                                                     \
                }                                                              \
                RING_FINAL_CHECK_FOR_RESPONSES(&f, more);                      \
                (void)more;                                                    \
            }                                                                  \
            printf("done %lu %016llx\n", got, (unsigned long long)h);          \
        } else {                                                               \
            printf("bad\n");                                                   \
        }                                                                      \
        fflush(stdout);                                                        \
    }                                                                          \
}

DRIVER(r64)
DRIVER(r12)

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s FILE REGION_LEN ENTRY_LEN\n", argv[0]);
        return 2;
    }
    size_t len = strtoul(argv[2], NULL, 0);
    int entry = atoi(argv[3]);
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    if (entry == 64)
        run_r64(mem, len);
    else if (entry == 12)
        run_r12(mem, len);
    else
        return 2;
    return 0;
}
