/*
 * pingpong.c -- libvrdma example: SEND/RECV and RDMA WRITE ping-pong between two processes
 * (normally in two guest domains), exchanging QP endpoints and memory keys over TCP.
 *
 *   pingpong server PORT [ITERS]        (PORT 0: any free port; prints "listening on PORT")
 *   pingpong client HOST PORT [ITERS]
 *
 * Build:  gcc -O2 pingpong.c $(pkg-config --cflags --libs vrdma) -o pingpong
 * Mode:   VRDMA_MODE=bypass|mediated (default bypass).
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <vrdma.h>

#define MSG 64
#define SEND_OFF 0      /* what we SEND from */
#define RECV_OFF 4096   /* where RECVs land */
#define STAGE_OFF 8192  /* what we RDMA WRITE from */
#define LAND_OFF 12288  /* where the peer's RDMA WRITEs land */
#define MR_LEN 16384

static int die(const char *what, int rc) {
    fprintf(stderr, "pingpong: %s failed: %s (%s)\n", what, strerror(rc < 0 ? -rc : rc),
            rc < 0 ? vrdma_last_error() : "");
    exit(1);
}
#define CHECK(call)                                                                           \
    do {                                                                                      \
        int rc_ = (call);                                                                     \
        if (rc_ < 0) die(#call, rc_);                                                         \
    } while (0)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Completions seen so far, by opcode (VRDMA_WC_SEND .. VRDMA_WC_RECV_RDMA_WITH_IMM). */
static int completed[8];

/* Polls once, counting completions; fails on an error completion. */
static int poll_once(vrdma_cq *cq) {
    struct vrdma_wc wc[8];
    int n = vrdma_poll_cq(cq, wc, 8);
    if (n < 0) die("vrdma_poll_cq", n);
    for (int i = 0; i < n; i++) {
        if (wc[i].status != VRDMA_WC_SUCCESS) {
            fprintf(stderr, "pingpong: work request %llu failed: %s\n",
                    (unsigned long long)wc[i].wr_id, vrdma_wc_status_str(wc[i].status));
            exit(1);
        }
        completed[wc[i].opcode & 7]++;
    }
    return n;
}

/* Busy-polls until `count` completions of `opcode` have been seen in all. */
static void wait_for(vrdma_cq *cq, uint32_t opcode, int count) {
    double start = now_us();
    while (completed[opcode] < count) {
        if (poll_once(cq) == 0 && now_us() - start > 30e6) {
            fprintf(stderr, "pingpong: no completion in 30 s\n");
            exit(1);
        }
    }
}

static void drain(vrdma_cq *cq) {
    while (poll_once(cq) > 0) {
    }
}

/* Spins on a copy of the landing area until it holds sequence number `seq`. */
static void wait_landing(vrdma_mr *mr, uint32_t seq) {
    double start = now_us();
    for (;;) {
        uint32_t got;
        CHECK(vrdma_mr_read(mr, LAND_OFF + MSG - sizeof got, &got, sizeof got));
        if (got == seq) return;
        if (now_us() - start > 30e6) {
            fprintf(stderr, "pingpong: RDMA WRITE %u did not land in 30 s\n", seq);
            exit(1);
        }
    }
}

/* Waits for write `seq` and checks all of it arrived. */
static void check_landing(vrdma_mr *mr, uint32_t seq) {
    unsigned char got[MSG];
    wait_landing(mr, seq);
    CHECK(vrdma_mr_read(mr, LAND_OFF, got, MSG));
    for (int k = 0; k < MSG - 4; k++)
        if (got[k] != (seq & 0xff)) {
            fprintf(stderr, "pingpong: write %u: byte %d is %d\n", seq, k, got[k]);
            exit(1);
        }
}

static void send_line(int fd, const char *s) {
    size_t len = strlen(s), off = 0;
    while (off < len) {
        ssize_t n = write(fd, s + off, len - off);
        if (n <= 0) die("write to peer", errno);
        off += (size_t)n;
    }
}

static void recv_line(int fd, char *buf, size_t cap) {
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, 1);
        if (r <= 0) die("read from peer", r < 0 ? errno : ECONNRESET);
        if (buf[n] == '\n') break;
        n++;
    }
    buf[n] = 0;
}

static int tcp_server(int port) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1)) die("bind/listen", errno);
    socklen_t len = sizeof a;
    getsockname(l, (struct sockaddr *)&a, &len);
    printf("listening on %d\n", ntohs(a.sin_port));
    fflush(stdout);
    int fd = accept(l, NULL, NULL);
    if (fd < 0) die("accept", errno);
    close(l);
    return fd;
}

static int tcp_client(const char *host, const char *port) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai)) die("getaddrinfo", EINVAL);
    for (int tries = 0; tries < 200; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            freeaddrinfo(ai);
            return fd;
        }
        close(fd);
        nanosleep(&(struct timespec){.tv_nsec = 50000000}, NULL);
    }
    die("connect", errno);
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "server") && strcmp(argv[1], "client")) ||
        (!strcmp(argv[1], "client") && argc < 4)) {
        fprintf(stderr, "usage: %s server PORT [ITERS] | %s client HOST PORT [ITERS]\n", argv[0],
                argv[0]);
        return 2;
    }
    int server = !strcmp(argv[1], "server");
    int iters = atoi(argv[server ? 3 : 4] ? argv[server ? 3 : 4] : "1000");
    if (iters <= 0) iters = 1000;

    vrdma_context *ctx;
    vrdma_pd *pd;
    vrdma_cq *cq;
    vrdma_qp *qp;
    vrdma_mr *mr;
    CHECK(vrdma_open(&ctx, 0, VRDMA_MODE_DEFAULT));
    CHECK(vrdma_alloc_pd(ctx, &pd));
    CHECK(vrdma_create_cq(ctx, 256, &cq));
    CHECK(vrdma_create_qp(pd, cq, cq, 64, 64, &qp));
    CHECK(vrdma_alloc_mr(pd, MR_LEN, VRDMA_ACCESS_ALL, &mr));

    /* Out of band: "ENDPOINT REMOTE_MR\n" each way. */
    int fd = server ? tcp_server(atoi(argv[2])) : tcp_client(argv[2], argv[3]);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct vrdma_endpoint ep, peer_ep;
    struct vrdma_remote_mr rmr, peer_mr;
    char eps[128], mrs[128], line[300];
    CHECK(vrdma_qp_endpoint(qp, &ep));
    CHECK(vrdma_mr_remote(mr, &rmr));
    CHECK(vrdma_endpoint_format(&ep, eps, sizeof eps));
    CHECK(vrdma_remote_mr_format(&rmr, mrs, sizeof mrs));
    snprintf(line, sizeof line, "%s %s\n", eps, mrs);
    send_line(fd, line);
    recv_line(fd, line, sizeof line);
    char *space = strchr(line, ' ');
    if (!space) die("peer line", EPROTO);
    *space = 0;
    CHECK(vrdma_endpoint_parse(line, &peer_ep));
    CHECK(vrdma_remote_mr_parse(space + 1, &peer_mr));
    CHECK(vrdma_qp_connect(qp, &peer_ep));
    printf("domain %d, mode %s, connected to %s\n", vrdma_domid(ctx),
           vrdma_mode(ctx) == VRDMA_MODE_MEDIATED ? "mediated" : "bypass", line);

    /* SEND/RECV ping-pong: the client sends "ping N", the server answers "pong N". */
    char msg[MSG], want[MSG], got[MSG];
    double t0 = now_us();
    CHECK(vrdma_post_recv(qp, mr, RECV_OFF, MSG, 0));
    for (int i = 0; i < iters; i++) {
        if (!server) {
            memset(msg, 0, MSG);
            snprintf(msg, MSG, "ping %d", i);
            CHECK(vrdma_mr_write(mr, SEND_OFF, msg, MSG));
            CHECK(vrdma_post_send(qp, mr, SEND_OFF, MSG, (uint64_t)i));
        }
        wait_for(cq, VRDMA_WC_RECV, i + 1);
        CHECK(vrdma_mr_read(mr, RECV_OFF, got, MSG));
        memset(want, 0, MSG);
        snprintf(want, MSG, server ? "ping %d" : "pong %d", i);
        if (memcmp(got, want, MSG)) {
            fprintf(stderr, "pingpong: round %d: got \"%.*s\", want \"%s\"\n", i, MSG, got, want);
            return 1;
        }
        if (i + 1 < iters) CHECK(vrdma_post_recv(qp, mr, RECV_OFF, MSG, (uint64_t)i + 1));
        if (server) {
            memset(msg, 0, MSG);
            snprintf(msg, MSG, "pong %d", i);
            CHECK(vrdma_mr_write(mr, SEND_OFF, msg, MSG));
            CHECK(vrdma_post_send(qp, mr, SEND_OFF, MSG, (uint64_t)i));
        }
    }
    wait_for(cq, VRDMA_WC_SEND, iters);
    double send_us = (now_us() - t0) / iters;
    drain(cq);
    send_line(fd, "sent\n");
    recv_line(fd, line, sizeof line);

    /* RDMA WRITE ping-pong: each side writes MSG bytes ending in the sequence number into
     * the peer's landing area and spins on its own landing area for the answer. */
    t0 = now_us();
    for (uint32_t seq = 1; seq <= (uint32_t)iters; seq++) {
        if (server) check_landing(mr, seq); /* the client writes first */
        memset(msg, (int)(seq & 0xff), MSG);
        memcpy(msg + MSG - sizeof seq, &seq, sizeof seq);
        CHECK(vrdma_mr_write(mr, STAGE_OFF, msg, MSG));
        drain(cq);
        CHECK(vrdma_post_write(qp, mr, STAGE_OFF, MSG, peer_mr.addr + LAND_OFF, peer_mr.rkey,
                               seq));
        if (!server) check_landing(mr, seq);
    }
    double write_us = (now_us() - t0) / iters;
    wait_for(cq, VRDMA_WC_RDMA_WRITE, iters);
    drain(cq);
    send_line(fd, "written\n");
    recv_line(fd, line, sizeof line);

    printf("send/recv: %d round trips of %d bytes ok, %.2f us per round trip\n", iters, MSG,
           send_us);
    printf("rdma write: %d round trips of %d bytes ok, %.2f us per round trip\n", iters, MSG,
           write_us);
    close(fd);
    vrdma_destroy_qp(qp);
    vrdma_free_mr(mr);
    vrdma_destroy_cq(cq);
    vrdma_dealloc_pd(pd);
    vrdma_close(ctx);
    return 0;
}
