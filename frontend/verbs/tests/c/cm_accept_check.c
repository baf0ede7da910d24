/*
 * cm_accept_check (tests/tools.rs): an rdma_cm server that destroys its listening id right
 * after rdma_accept, as perftest -R does (rdma_server_connect), and a client that must get
 * ESTABLISHED, not REJECTED.
 *
 *   cm_accept_check server ADDR PORT   listens, accepts one connection, destroys the listener
 *                                      at once; prints whether ESTABLISHED was already queued
 *                                      when rdma_accept returned, then waits for it and for
 *                                      the client's disconnect
 *                                      (it sends one message once established)
 *   cm_accept_check server ADDR PORT early
 *                                      the same, but destroys the listening id as soon as
 *                                      the request is there, BEFORE rdma_accept (Linux rdma_cm
 *                                      keeps a request id it handed out: it can still be
 *                                      accepted)
 *   cm_accept_check client ADDR PORT   connects, prints the event it got, takes the
 *                                      server's message, disconnects
 *
 * Exit 0 iff every step went as described; each step prints one line.
 */
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* The next event on ch within 30 s: its type (and id), or -1. */
static int next_event(struct rdma_event_channel *ch, struct rdma_cm_id **id)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int kind;

	if (poll(&p, 1, 30000) != 1) {
		printf("no event within 30 s\n");
		return -1;
	}
	if (rdma_get_cm_event(ch, &ev)) {
		perror("rdma_get_cm_event");
		return -1;
	}
	kind = ev->event;
	if (id)
		*id = ev->id;
	rdma_ack_cm_event(ev);
	return kind;
}

static int expect(struct rdma_event_channel *ch, int want, struct rdma_cm_id **id,
		  const char *who)
{
	int got = next_event(ch, id);

	printf("%s: %s\n", who, got < 0 ? "nothing" : rdma_event_str(got));
	fflush(stdout);
	return got == want ? 0 : -1;
}

static struct ibv_cq *cq;
static struct ibv_mr *mr;
static char buf[64];

/* A PD, a CQ, a registered buffer and an RC QP on id (rdma_create_qp). */
static int make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a;
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);

	cq = pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	mr = cq ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr) {
		printf("PD, CQ or MR failed\n");
		return -1;
	}
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_RC;
	a.send_cq = cq;
	a.recv_cq = cq;
	a.cap.max_send_wr = 2;
	a.cap.max_recv_wr = 2;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, pd, &a)) {
		perror("rdma_create_qp");
		return -1;
	}
	return 0;
}

/* One completion within 30 s, successful and of kind `want`. */
static int completion(enum ibv_wc_opcode want, const char *who)
{
	struct ibv_wc wc;
	int i, n = 0;

	for (i = 0; i < 30000 && n == 0; i++) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n == 0)
			usleep(1000);
	}
	printf("%s: %s completion: %s\n", who, want == IBV_WC_SEND ? "send" : "receive",
	       n == 1 ? ibv_wc_status_str(wc.status) : "none");
	fflush(stdout);
	return n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == want ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id, *child;
	struct rdma_conn_param param;
	struct sockaddr_in sin;
	int server, early, ready;
	struct pollfd p;
	struct ibv_sge sge;
	struct ibv_send_wr swr, *bad_s;
	struct ibv_recv_wr rwr, *bad_r;

	if (argc < 4 || argc > 5 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: cm_accept_check server|client ADDR PORT [early]\n");
		return 2;
	}
	server = !strcmp(argv[1], "server");
	early = argc == 5 && !strcmp(argv[4], "early");
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(atoi(argv[3]));
	if (inet_pton(AF_INET, argv[2], &sin.sin_addr) != 1)
		return 2;
	memset(&param, 0, sizeof(param));
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		perror("rdma_create_id");
		return 1;
	}
	if (server) {
		if (rdma_bind_addr(id, (struct sockaddr *)&sin) || rdma_listen(id, 1)) {
			perror("rdma_listen");
			return 1;
		}
		printf("server: listening\n");
		fflush(stdout);
		if (expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &child, "server"))
			return 1;
		if (early) {
			/* The request id outlives its listener. */
			rdma_destroy_id(id);
			printf("server: listening id destroyed before rdma_accept\n");
			fflush(stdout);
		}
		if (make_qp(child))
			return 1;
		if (rdma_accept(child, &param)) {
			perror("rdma_accept");
			return 1;
		}
		p.fd = ch->fd;
		p.events = POLLIN;
		ready = poll(&p, 1, 0);
		/* perftest -R destroys its listening id as soon as rdma_accept returns. */
		if (!early)
			rdma_destroy_id(id);
		printf("server: ESTABLISHED queued when rdma_accept returned: %s\n",
		       ready == 1 ? "yes" : "no");
		fflush(stdout);
		/* A message once established: the client disconnects when it has it. */
		sge.addr = (uintptr_t)buf;
		sge.length = 4;
		sge.lkey = mr->lkey;
		memset(&swr, 0, sizeof(swr));
		swr.opcode = IBV_WR_SEND;
		swr.send_flags = IBV_SEND_SIGNALED;
		swr.sg_list = &sge;
		swr.num_sge = 1;
		memcpy(buf, "ok!", 4);
		if (expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL, "server") ||
		    ibv_post_send(child->qp, &swr, &bad_s) || completion(IBV_WC_SEND, "server") ||
		    expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL, "server"))
			return 1;
		rdma_destroy_qp(child);
		rdma_destroy_id(child);
	} else {
		if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000) ||
		    expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, "client") ||
		    rdma_resolve_route(id, 2000) ||
		    expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, "client") || make_qp(id))
			return 1;
		sge.addr = (uintptr_t)buf;
		sge.length = sizeof(buf);
		sge.lkey = mr->lkey;
		memset(&rwr, 0, sizeof(rwr));
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		if (ibv_post_recv(id->qp, &rwr, &bad_r) || rdma_connect(id, &param)) {
			perror("ibv_post_recv or rdma_connect");
			return 1;
		}
		if (expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL, "client") ||
		    completion(IBV_WC_RECV, "client"))
			return 1;
		rdma_disconnect(id);
		if (expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL, "client"))
			return 1;
		rdma_destroy_qp(id);
		rdma_destroy_id(id);
	}
	rdma_destroy_event_channel(ch);
	printf("%s: done\n", argv[1]);
	return 0;
}
