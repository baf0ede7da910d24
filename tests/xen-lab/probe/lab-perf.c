/* lab-perf: the Xen lab's yardstick for what a Xen user would use instead of vrdma between two
 * domains of one host: TCP (over netfront/netback and a bridge in dom0) and libxenvchan
 * (Xen's shared-memory channel library; a lab-only comparison, never linked into vrdma).
 * Same measurements as vrdma-perf's: a 64-byte ping-pong (round trip) and one-way streaming
 * with messages of 64 KiB and 1 MiB.
 *
 *   lab-perf tcp-server PORT ITERS BW_ITERS
 *   lab-perf tcp-client HOST PORT ITERS BW_ITERS
 *   lab-perf vchan-server PEER_DOMID XS_PATH ITERS BW_ITERS blocking|busy
 *   lab-perf vchan-client SERVER_DOMID XS_PATH ITERS BW_ITERS blocking|busy
 *
 * The server prints "LISTENING" once a client may connect and exits after one client. The
 * client prints one line:
 *   RESULT rtt64_med_us=.. rtt64_min_us=.. bw64k_MBps=.. bw1m_MBps=..
 * (MB = 2^20 bytes, as vrdma-perf and perftest). ITERS round trips (after 10 warm-up ones);
 * BW_ITERS messages per bandwidth size. The client says on stderr which phase it is in. vchan "blocking" sleeps in libxenvchan_wait() (the
 * event channel) whenever it cannot progress; "busy" spins on the ring.
 *
 * Static build (no libraries to ship into the guests):
 *   gcc -O2 -static lab-perf.c -lxenvchan -lxenstore -lxengnttab -lxenevtchn -lxentoollog \
 *       -lxentoolcore -lpthread
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <libxenvchan.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WARMUP 10
#define MAXMSG (1 << 20)
static const size_t SIZES[2] = {65536, 1 << 20};

static void die(const char *what)
{
    fprintf(stderr, "lab-perf: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A transport: exact-length send and receive. */
struct xport {
    int fd;                    /* TCP */
    struct libxenvchan *vc;    /* vchan */
    int busy;                  /* vchan: spin instead of waiting on the event channel */
};

static void x_send(struct xport *x, const char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        if (x->vc) {
            int n = libxenvchan_write(x->vc, buf + done, len - done);
            if (n < 0)
                die("libxenvchan_write");
            if (n == 0 && !x->busy && libxenvchan_wait(x->vc) < 0)
                die("libxenvchan_wait");
            done += n;
        } else {
            ssize_t n = write(x->fd, buf + done, len - done);
            if (n <= 0)
                die("write");
            done += n;
        }
    }
}

static void x_recv(struct xport *x, char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        if (x->vc) {
            int n = libxenvchan_read(x->vc, buf + done, len - done);
            if (n < 0)
                die("libxenvchan_read");
            if (n == 0) {
                if (!libxenvchan_is_open(x->vc)) {
                    errno = EPIPE;
                    die("vchan closed by the peer");
                }
                if (!x->busy && libxenvchan_wait(x->vc) < 0)
                    die("libxenvchan_wait");
            }
            done += n;
        } else {
            ssize_t n = read(x->fd, buf + done, len - done);
            if (n <= 0) {
                if (n == 0)
                    errno = EPIPE;
                die("read");
            }
            done += n;
        }
    }
}

static char *buffer(void)
{
    char *b = malloc(MAXMSG);
    if (!b)
        die("malloc");
    memset(b, 0x5a, MAXMSG);
    return b;
}

/* The server's side of both tests: echo 64-byte messages, then drain each size and ack. */
static void serve(struct xport *x, int iters, int bw_iters)
{
    char *b = buffer();
    for (int i = 0; i < iters + WARMUP; i++) {
        x_recv(x, b, 64);
        x_send(x, b, 64);
    }
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < bw_iters; i++)
            x_recv(x, b, SIZES[s]);
        x_send(x, b, 1);
    }
    /* Wait for the client's last word so it has its ack before we close. */
    x_recv(x, b, 1);
    free(b);
}

static void client(struct xport *x, int iters, int bw_iters)
{
    char *b = buffer();
    double *rtt = calloc(iters, sizeof(double));
    double bw[2];
    if (!rtt)
        die("calloc");
    fprintf(stderr, "lab-perf: %d round trips of 64 B\n", iters + WARMUP);
    for (int i = 0; i < iters + WARMUP; i++) {
        double t0 = now_us();
        x_send(x, b, 64);
        x_recv(x, b, 64);
        if (i >= WARMUP)
            rtt[i - WARMUP] = now_us() - t0;
    }
    for (int s = 0; s < 2; s++) {
        fprintf(stderr, "lab-perf: streaming %d messages of %zu B\n", bw_iters, SIZES[s]);
        double t0 = now_us();
        for (int i = 0; i < bw_iters; i++)
            x_send(x, b, SIZES[s]);
        x_recv(x, b, 1);
        double secs = (now_us() - t0) / 1e6;
        bw[s] = (double)SIZES[s] * bw_iters / (1 << 20) / secs;
    }
    x_send(x, b, 1);
    qsort(rtt, iters, sizeof(double), cmp_double);
    double med = iters % 2 ? rtt[iters / 2] : (rtt[iters / 2 - 1] + rtt[iters / 2]) / 2;
    printf("RESULT rtt64_med_us=%.1f rtt64_min_us=%.1f bw64k_MBps=%.1f bw1m_MBps=%.1f\n", med,
           rtt[0], bw[0], bw[1]);
    fflush(stdout);
    free(rtt);
    free(b);
}

static void nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        die("TCP_NODELAY");
}

static int tcp_server(int port, int iters, int bw_iters)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (l < 0)
        die("socket");
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0)
        die("bind");
    if (listen(l, 1) < 0)
        die("listen");
    printf("LISTENING tcp %d\n", port);
    fflush(stdout);
    struct xport x = {.fd = accept(l, NULL, NULL)};
    if (x.fd < 0)
        die("accept");
    nodelay(x.fd);
    serve(&x, iters, bw_iters);
    close(x.fd);
    close(l);
    return 0;
}

static int tcp_client(const char *host, int port, int iters, int bw_iters)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        fprintf(stderr, "lab-perf: not an IPv4 address: %s\n", host);
        return 2;
    }
    struct xport x = {.fd = -1};
    for (int tries = 0; tries < 100; tries++) {
        x.fd = socket(AF_INET, SOCK_STREAM, 0);
        if (x.fd < 0)
            die("socket");
        if (connect(x.fd, (struct sockaddr *)&a, sizeof a) == 0)
            break;
        close(x.fd);
        x.fd = -1;
        usleep(100000);
    }
    if (x.fd < 0)
        die("connect");
    nodelay(x.fd);
    client(&x, iters, bw_iters);
    close(x.fd);
    return 0;
}

static int vchan(int server, int domid, const char *path, int iters, int bw_iters,
                 const char *mode)
{
    struct xport x = {.busy = strcmp(mode, "busy") == 0};
    if (!x.busy && strcmp(mode, "blocking") != 0) {
        fprintf(stderr, "lab-perf: mode must be blocking or busy, not %s\n", mode);
        return 2;
    }
    if (server) {
        /* Rings of 1 MiB each way (256 granted pages each: raise gntalloc's limit). */
        x.vc = libxenvchan_server_init(NULL, domid, path, MAXMSG, MAXMSG);
        if (!x.vc)
            die("libxenvchan_server_init");
        x.vc->blocking = 0;
        printf("LISTENING vchan %s\n", path);
        fflush(stdout);
        while (libxenvchan_is_open(x.vc) == 2)
            if (libxenvchan_wait(x.vc) < 0)
                die("libxenvchan_wait (connect)");
        serve(&x, iters, bw_iters);
    } else {
        x.vc = libxenvchan_client_init(NULL, domid, path);
        if (!x.vc)
            die("libxenvchan_client_init");
        x.vc->blocking = 0;
        client(&x, iters, bw_iters);
    }
    libxenvchan_close(x.vc);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "tcp-server"))
        return tcp_server(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (argc == 6 && !strcmp(argv[1], "tcp-client"))
        return tcp_client(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 7 && !strcmp(argv[1], "vchan-server"))
        return vchan(1, atoi(argv[2]), argv[3], atoi(argv[4]), atoi(argv[5]), argv[6]);
    if (argc == 7 && !strcmp(argv[1], "vchan-client"))
        return vchan(0, atoi(argv[2]), argv[3], atoi(argv[4]), atoi(argv[5]), argv[6]);
    fprintf(stderr, "usage: lab-perf tcp-server PORT ITERS BW_ITERS | tcp-client HOST PORT ITERS BW_ITERS |\n"
                    "       vchan-server PEER_DOMID XS_PATH ITERS BW_ITERS blocking|busy |\n"
                    "       vchan-client SERVER_DOMID XS_PATH ITERS BW_ITERS blocking|busy\n");
    return 2;
}
