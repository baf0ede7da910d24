/*
 * cm_race_check (tests/tools.rs): rdma_cm teardown and short-lived connections, many times.
 *
 *   cm_race_check server ADDR PORT N MODE
 *       listens once and serves N connections one after another. MODE:
 *       drop    disconnects each one right after rdma_accept (the client destroys its id
 *               meanwhile), then waits for its DISCONNECTED;
 *       expect  each accepted id must get ESTABLISHED, then DISCONNECTED (the client
 *               disconnects as soon as it is established), never CONNECT_ERROR.
 *   cm_race_check destroy ADDR PORT N
 *       N times: connects on a new channel and destroys its id as soon as the channel has an
 *       event (ESTABLISHED: the connect thread is then starting the id's disconnection
 *       thread), after a delay that varies with the round; then, once every round is done,
 *       no destroyed id may have an event on its channel (a thread of the id that outlived
 *       rdma_destroy_id would queue DISCONNECTED for the freed id, if it does not crash).
 *   cm_race_check quick ADDR PORT N
 *       N times: connects, disconnects as soon as ESTABLISHED comes, waits for DISCONNECTED.
 *
 * Exit 0 iff every round went as described; the last line says so.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define MAX_ROUNDS 1000

static struct sockaddr_in sin_;

/* The next event on ch within 30 s: its type (and id), or -1. */
static int next_event(struct rdma_event_channel *ch, struct rdma_cm_id **id)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int kind;

	for (;;) {
		if (poll(&p, 1, 30000) != 1) {
			printf("no event within 30 s\n");
			return -1;
		}
		if (rdma_get_cm_event(ch, &ev) == 0)
			break;
		/* A byte of an event that went with its id: poll again. */
		if (errno != EAGAIN) {
			perror("rdma_get_cm_event");
			return -1;
		}
	}
	kind = ev->event;
	if (id)
		*id = ev->id;
	rdma_ack_cm_event(ev);
	return kind;
}

static int expect(struct rdma_event_channel *ch, int want, const char *who, int round)
{
	int got = next_event(ch, NULL);

	if (got != want) {
		printf("%s round %d: wanted %s, got %s\n", who, round, rdma_event_str(want),
		       got < 0 ? "nothing" : rdma_event_str(got));
		fflush(stdout);
		return -1;
	}
	return 0;
}

/* A PD, a CQ and an RC QP on id (rdma_create_qp). */
static int make_qp(struct rdma_cm_id *id, struct ibv_pd **pd, struct ibv_cq **cq)
{
	struct ibv_qp_init_attr a;

	*pd = ibv_alloc_pd(id->verbs);
	*cq = *pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	if (!*cq) {
		printf("PD or CQ failed\n");
		return -1;
	}
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_RC;
	a.send_cq = *cq;
	a.recv_cq = *cq;
	a.cap.max_send_wr = 2;
	a.cap.max_recv_wr = 2;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, *pd, &a)) {
		perror("rdma_create_qp");
		return -1;
	}
	return 0;
}

static void free_qp(struct ibv_qp *qp, struct ibv_pd *pd, struct ibv_cq *cq)
{
	if (qp)
		ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

/* A new id on ch, resolved to the server, with a QP, connecting. */
static int start_connect(struct rdma_event_channel *ch, struct rdma_cm_id **id,
			 struct ibv_pd **pd, struct ibv_cq **cq, int round)
{
	struct rdma_conn_param param;

	memset(&param, 0, sizeof(param));
	if (rdma_create_id(ch, id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(*id, NULL, (struct sockaddr *)&sin_, 2000) ||
	    expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "client", round) ||
	    rdma_resolve_route(*id, 2000) ||
	    expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "client", round) || make_qp(*id, pd, cq))
		return -1;
	if (rdma_connect(*id, &param)) {
		perror("rdma_connect");
		return -1;
	}
	return 0;
}

static void spin_us(long us)
{
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while ((b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}

/* The end of an accepted id: its QP, CQ and PD go with it. */
static void drop_child(struct rdma_cm_id *child)
{
	struct ibv_cq *cq = child->send_cq;
	struct ibv_pd *pd = child->pd;

	rdma_destroy_qp(child);
	rdma_destroy_id(child);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
}

static int server(int n, int drop)
{
	static struct rdma_cm_id *ids[MAX_ROUNDS];
	static int est[MAX_ROUNDS];
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id, *child;
	struct rdma_conn_param param;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int i, kind, k, accepted = 0, ended = 0, bad = 0;

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(id, (struct sockaddr *)&sin_) || rdma_listen(id, 4)) {
		perror("rdma_listen");
		return 1;
	}
	printf("server: listening\n");
	fflush(stdout);
	memset(&param, 0, sizeof(param));
	/* Each accepted id must get ESTABLISHED (rdma_accept queues it), then DISCONNECTED;
	 * with `drop` an accept the client's destroy beat may end in CONNECT_ERROR instead.
	 * The ids' events may interleave (a request may come before the previous id's
	 * DISCONNECTED). */
	while (ended < n) {
		kind = next_event(ch, &child);
		if (kind < 0) {
			printf("server: %d accepted, %d ended, then nothing\n", accepted, ended);
			return 1;
		}
		for (i = 0, k = -1; i < accepted; i++)
			if (ids[i] == child)
				k = i;
		switch (kind) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			if (accepted == n || make_qp(child, &pd, &cq) || rdma_accept(child, &param)) {
				perror("rdma_accept");
				return 1;
			}
			ids[accepted] = child;
			est[accepted++] = 0;
			if (drop)
				rdma_disconnect(child);
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			if (k < 0 || est[k]) {
				printf("server: ESTABLISHED of no accepted id, or twice\n");
				bad++;
			} else {
				est[k] = 1;
			}
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_CONNECT_ERROR:
			if (k < 0) {
				printf("server: %s of no accepted id\n", rdma_event_str(kind));
				return 1;
			}
			if (!est[k] && !(drop && kind == RDMA_CM_EVENT_CONNECT_ERROR)) {
				printf("server: %s without ESTABLISHED before\n", rdma_event_str(kind));
				bad++;
			}
			if (est[k] && kind != RDMA_CM_EVENT_DISCONNECTED) {
				printf("server: ESTABLISHED, then %s\n", rdma_event_str(kind));
				bad++;
			}
			ids[k] = NULL;
			drop_child(child);
			ended++;
			break;
		default:
			printf("server: unexpected %s\n", rdma_event_str(kind));
			bad++;
		}
		fflush(stdout);
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("server: %d of %d rounds wrong\n", bad, n);
	return bad ? 1 : 0;
}

static int destroy_in_flight(int n)
{
	static struct rdma_event_channel *chs[MAX_ROUNDS];
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct rdma_cm_event *ev;
	struct pollfd p;
	int i, late = 0;

	for (i = 0; i < n; i++) {
		chs[i] = rdma_create_event_channel();
		if (!chs[i] || start_connect(chs[i], &id, &pd, &cq, i))
			return 1;
		p.fd = chs[i]->fd;
		p.events = POLLIN;
		if (poll(&p, 1, 30000) != 1) {
			printf("client round %d: no event within 30 s\n", i);
			return 1;
		}
		/* Sweep the moment of the destroy across the connect thread's last steps. */
		spin_us((i * 7) % 120);
		qp = id->qp;
		rdma_destroy_id(id);
		free_qp(qp, pd, cq);
	}
	/* A thread of an id that outlived its rdma_destroy_id queues its event within its
	 * 200 ms poll. */
	usleep(500000);
	for (i = 0; i < n; i++) {
		fcntl(chs[i]->fd, F_SETFL, fcntl(chs[i]->fd, F_GETFL) | O_NONBLOCK);
		while (rdma_get_cm_event(chs[i], &ev) == 0) {
			printf("client round %d: %s after rdma_destroy_id\n", i,
			       rdma_event_str(ev->event));
			rdma_ack_cm_event(ev);
			late++;
		}
		rdma_destroy_event_channel(chs[i]);
	}
	printf("client: %d events of destroyed ids\n", late);
	return late ? 1 : 0;
}

static int quick(int n)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int i, bad = 0;

	if (!ch)
		return 1;
	for (i = 0; i < n; i++) {
		if (start_connect(ch, &id, &pd, &cq, i))
			return 1;
		if (expect(ch, RDMA_CM_EVENT_ESTABLISHED, "client", i))
			return 1;
		rdma_disconnect(id);
		if (expect(ch, RDMA_CM_EVENT_DISCONNECTED, "client", i))
			bad++;
		rdma_destroy_qp(id);
		rdma_destroy_id(id);
		ibv_destroy_cq(cq);
		ibv_dealloc_pd(pd);
	}
	rdma_destroy_event_channel(ch);
	printf("client: %d of %d rounds wrong\n", bad, n);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	int n;

	if (argc < 5) {
		fprintf(stderr, "usage: cm_race_check server|destroy|quick ADDR PORT N [MODE]\n");
		return 2;
	}
	memset(&sin_, 0, sizeof(sin_));
	sin_.sin_family = AF_INET;
	sin_.sin_port = htons(atoi(argv[3]));
	if (inet_pton(AF_INET, argv[2], &sin_.sin_addr) != 1)
		return 2;
	n = atoi(argv[4]);
	if (n < 1 || n > MAX_ROUNDS)
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "server") && argc == 6)
		return server(n, !strcmp(argv[5], "drop"));
	if (!strcmp(argv[1], "destroy"))
		return destroy_in_flight(n);
	if (!strcmp(argv[1], "quick"))
		return quick(n);
	fprintf(stderr, "usage: cm_race_check server|destroy|quick ADDR PORT N [MODE]\n");
	return 2;
}
