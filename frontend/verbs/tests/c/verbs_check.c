/* Checks of libvrdma_verbs that the Debian tools do not make, written against rdma-core's
 * verbs.h like any verbs program and run unmodified through vrdma-exec (tests/tools.rs):
 * two RC QPs of one context connected to each other (address vector with GID 0), RDMA WRITEs
 * into malloc'd and stack memory and into two regions sharing a page, a completion event on
 * a completion channel, ibv_dereg_mr revoking the rkey at once, the bytes staying in place
 * after deregistration, and unsupported verbs failing with EOPNOTSUPP.
 * Prints one line per check; exits 1 at the first failure. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { printf("FAILED: " __VA_ARGS__); printf("\n"); exit(1); } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_comp_channel *ch;
static struct ibv_qp *qa, *qb;

static struct ibv_qp *make_qp(enum ibv_qp_type type)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = type,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	return ibv_create_qp(pd, &ia);
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("modify to INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		FAIL("modify to RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 1;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("modify to RTS");
}

/* RDMA WRITE of len bytes at src (lkey) to raddr/rkey from QP A; the completion's status. */
static int write_wait(void *src, uint32_t lkey, uint32_t len, void *raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qa, &wr, &bad))
		FAIL("post_send: %s", strerror(errno));
	struct ibv_wc wc;
	for (long i = 0; i < 20000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			FAIL("poll_cq");
		if (n == 1) {
			if (wc.wr_id != 7)
				FAIL("wr_id %llu", (unsigned long long)wc.wr_id);
			return wc.status;
		}
	}
	FAIL("no completion");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		FAIL("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("open: %s", strerror(errno));
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	if (!pd || !ch)
		FAIL("pd/channel");
	cq = ibv_create_cq(ctx, 64, NULL, ch, 0);
	if (!cq)
		FAIL("cq");

	errno = 0;
	if (make_qp(IBV_QPT_UD) || errno != EOPNOTSUPP)
		FAIL("UD QP: errno %d", errno);
	printf("UD QP: EOPNOTSUPP\n");
	char small[64];
	errno = 0;
	if (ibv_reg_mr(pd, small, sizeof small, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC) ||
	    errno != EOPNOTSUPP)
		FAIL("atomic access: errno %d", errno);
	printf("atomic access: EOPNOTSUPP\n");

	qa = make_qp(IBV_QPT_RC);
	qb = make_qp(IBV_QPT_RC);
	if (!qa || !qb)
		FAIL("create RC QPs: %s", strerror(errno));
	if (qa->qp_num >= 1 << 24 || qb->qp_num >= 1 << 24)
		FAIL("QPNs wider than 24 bits");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		FAIL("query_gid");
	connect_qp(qa, qb->qp_num, &gid);
	connect_qp(qb, qa->qp_num, &gid);

	/* malloc'd memory, neither end page-aligned */
	char *src = malloc(8192), *dst = malloc(10000);
	for (int i = 0; i < 8192; i++)
		src[i] = (char)(i * 7 + 3);
	memset(dst, 0, 10000);
	struct ibv_mr *ms = ibv_reg_mr(pd, src, 8192, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *md = ibv_reg_mr(pd, dst + 100, 5000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!ms || !md)
		FAIL("reg_mr: %s", strerror(errno));
	if (md->addr != dst + 100 || md->length != 5000)
		FAIL("mr addr/length");
	int st = write_wait(src, ms->lkey, 5000, dst + 100, md->rkey);
	if (st != IBV_WC_SUCCESS)
		FAIL("write: %s", ibv_wc_status_str(st));
	if (memcmp(dst + 100, src, 5000) || dst[99] || dst[5100])
		FAIL("write into malloc'd memory: wrong bytes");
	printf("write into malloc'd memory: ok\n");

	/* stack memory */
	{
		char stack_buf[300];
		memset(stack_buf, 0, sizeof stack_buf);
		struct ibv_mr *mk = ibv_reg_mr(pd, stack_buf, sizeof stack_buf,
					       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!mk)
			FAIL("reg_mr on the stack: %s", strerror(errno));
		st = write_wait(src + 1, ms->lkey, 200, stack_buf + 50, mk->rkey);
		if (st != IBV_WC_SUCCESS || memcmp(stack_buf + 50, src + 1, 200) || stack_buf[49])
			FAIL("write into stack memory");
		if (ibv_dereg_mr(mk))
			FAIL("dereg stack mr");
		if (memcmp(stack_buf + 50, src + 1, 200))
			FAIL("stack bytes lost at dereg");
		printf("write into stack memory: ok\n");
	}

	/* two regions on one page; the second keeps working after the first goes */
	char *pg = aligned_alloc(4096, 4096);
	memset(pg, 0, 4096);
	struct ibv_mr *r1 = ibv_reg_mr(pd, pg, 100, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *r2 = ibv_reg_mr(pd, pg + 1000, 100, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!r1 || !r2)
		FAIL("reg_mr on one page");
	if (write_wait(src, ms->lkey, 100, pg, r1->rkey) != IBV_WC_SUCCESS ||
	    write_wait(src + 100, ms->lkey, 100, pg + 1000, r2->rkey) != IBV_WC_SUCCESS)
		FAIL("writes into one page");
	if (ibv_dereg_mr(r1))
		FAIL("dereg r1");
	if (write_wait(src + 200, ms->lkey, 50, pg + 1010, r2->rkey) != IBV_WC_SUCCESS)
		FAIL("write into the second region after the first's dereg");
	if (memcmp(pg, src, 100) || memcmp(pg + 1000, src + 100, 10) || memcmp(pg + 1010, src + 200, 50))
		FAIL("bytes on the shared page");
	if (ibv_dereg_mr(r2))
		FAIL("dereg r2");
	printf("two regions on one page: ok\n");

	/* a completion event on the channel */
	if (ibv_req_notify_cq(cq, 0))
		FAIL("req_notify_cq");
	{
		struct ibv_sge sge = { .addr = (uintptr_t)src, .length = 16, .lkey = ms->lkey };
		struct ibv_send_wr wr = { .wr_id = 8, .sg_list = &sge, .num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.wr.rdma.remote_addr = (uintptr_t)(dst + 100);
		wr.wr.rdma.rkey = md->rkey;
		if (ibv_post_send(qa, &wr, &bad))
			FAIL("post_send for the event");
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		if (poll(&p, 1, 10000) != 1)
			FAIL("no completion event within 10 s");
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != cq)
			FAIL("get_cq_event");
		ibv_ack_cq_events(cq, 1);
		struct ibv_wc wc;
		if (ibv_poll_cq(cq, 1, &wc) != 1 || wc.wr_id != 8 || wc.status != IBV_WC_SUCCESS)
			FAIL("the event's completion");
		printf("completion event: ok\n");
	}

	/* an overrun CQ raises an asynchronous event on async_fd */
	{
		struct ibv_cq *small_cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
		if (!small_cq)
			FAIL("small cq");
		struct ibv_qp_init_attr ia = {
			.send_cq = small_cq, .recv_cq = small_cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		struct ibv_qp *qe = ibv_create_qp(pd, &ia), *qf = ibv_create_qp(pd, &ia);
		if (!qe || !qf)
			FAIL("overrun pair");
		connect_qp(qe, qf->qp_num, &gid);
		connect_qp(qf, qe->qp_num, &gid);
		for (int i = 0; i < 8; i++) {
			struct ibv_sge sge = { .addr = (uintptr_t)src, .length = 8, .lkey = ms->lkey };
			struct ibv_send_wr wr = { .wr_id = 200 + i, .sg_list = &sge, .num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad;
			wr.wr.rdma.remote_addr = (uintptr_t)(dst + 100);
			wr.wr.rdma.rkey = md->rkey;
			if (ibv_post_send(qe, &wr, &bad))
				break; /* the QP may already be in error */
		}
		struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
		if (poll(&p, 1, 10000) != 1)
			FAIL("no asynchronous event within 10 s of a CQ overrun");
		struct ibv_async_event ev;
		if (ibv_get_async_event(ctx, &ev))
			FAIL("get_async_event: %s", strerror(errno));
		if (!((ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qe) ||
		      (ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small_cq)))
			FAIL("async event %d is not QP_FATAL of the QP or CQ_ERR of the CQ", ev.event_type);
		ibv_ack_async_event(&ev);
		if (ibv_destroy_qp(qe) || ibv_destroy_qp(qf) || ibv_destroy_cq(small_cq))
			FAIL("overrun pair teardown");
		printf("async event on CQ overrun: %s\n",
		       ev.event_type == IBV_EVENT_QP_FATAL ? "QP fatal" : "CQ error");
	}

	/* bad work requests are refused at post time, never dereferenced blindly */
	{
		struct ibv_send_wr wr = { .wr_id = 9, .sg_list = NULL, .num_sge = 1,
			.opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED }, *bad = NULL;
		if (ibv_post_send(qa, &wr, &bad) != EINVAL || bad != &wr)
			FAIL("a send with one SGE and no list");
		struct ibv_sge sge = { .addr = (uintptr_t)src, .length = 8, .lkey = ms->lkey };
		wr.sg_list = &sge;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		bad = NULL;
		if (ibv_post_send(qa, &wr, &bad) != EINVAL || bad != &wr)
			FAIL("an atomic work request");
		printf("bad work requests: EINVAL\n");
	}

	/* a move to ERR flushes the posted receives */
	{
		struct ibv_qp *qc = make_qp(IBV_QPT_RC), *qd = make_qp(IBV_QPT_RC);
		if (!qc || !qd)
			FAIL("second pair");
		connect_qp(qc, qd->qp_num, &gid);
		connect_qp(qd, qc->qp_num, &gid);
		struct ibv_mr *mr = ibv_reg_mr(pd, dst, 256, IBV_ACCESS_LOCAL_WRITE);
		if (!mr)
			FAIL("reg_mr for receives");
		for (int i = 0; i < 3; i++) {
			struct ibv_sge sge = { .addr = (uintptr_t)dst, .length = 64, .lkey = mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
			if (ibv_post_recv(qd, &wr, &bad))
				FAIL("post_recv");
		}
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
		if (ibv_modify_qp(qd, &a, IBV_QP_STATE))
			FAIL("modify to ERR");
		int flushed = 0;
		for (long i = 0; i < 20000000 && flushed < 3; i++) {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n < 0)
				FAIL("poll_cq");
			if (n == 1) {
				if (wc.qp_num != qd->qp_num || wc.status != IBV_WC_WR_FLUSH_ERR ||
				    wc.wr_id != (uint64_t)(100 + flushed))
					FAIL("unexpected completion qp %u status %d wr_id %llu", wc.qp_num,
					     wc.status, (unsigned long long)wc.wr_id);
				flushed++;
			}
		}
		if (flushed != 3)
			FAIL("%d of 3 receives flushed by the move to ERR", flushed);
		if (ibv_destroy_qp(qc) || ibv_destroy_qp(qd) || ibv_dereg_mr(mr))
			FAIL("second pair teardown");
		printf("move to ERR flushes receives: ok\n");
	}

	/* a move to ERR right after RTR: the pairing Connects of the two moves to RTR may still
	 * be on their way to the backend (each runs on a thread of its own) */
	{
		struct ibv_mr *mr = ibv_reg_mr(pd, dst, 256, IBV_ACCESS_LOCAL_WRITE);
		if (!mr)
			FAIL("reg_mr for the quick moves");
		for (int round = 0; round < 20; round++) {
			struct ibv_qp *qe = make_qp(IBV_QPT_RC), *qf = make_qp(IBV_QPT_RC);
			if (!qe || !qf)
				FAIL("quick pair");
			connect_qp(qe, qf->qp_num, &gid);
			connect_qp(qf, qe->qp_num, &gid);
			struct ibv_sge sge = { .addr = (uintptr_t)dst, .length = 64, .lkey = mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = 500 + round, .sg_list = &sge, .num_sge = 1 }, *bad;
			if (ibv_post_recv(qf, &wr, &bad))
				FAIL("quick post_recv");
			struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
			int rc = ibv_modify_qp(qf, &a, IBV_QP_STATE);
			if (rc)
				FAIL("modify to ERR right after RTR (round %d): %s", round, strerror(rc));
			int flushed = 0;
			for (long i = 0; i < 20000000 && !flushed; i++) {
				struct ibv_wc wc;
				int n = ibv_poll_cq(cq, 1, &wc);
				if (n < 0)
					FAIL("poll_cq");
				if (n == 1) {
					if (wc.qp_num != qf->qp_num || wc.status != IBV_WC_WR_FLUSH_ERR ||
					    wc.wr_id != (uint64_t)(500 + round))
						FAIL("unexpected completion qp %u status %d wr_id %llu (round %d)",
						     wc.qp_num, wc.status, (unsigned long long)wc.wr_id, round);
					flushed = 1;
				}
			}
			if (!flushed)
				FAIL("the receive was not flushed by the move to ERR (round %d)", round);
			if (ibv_destroy_qp(qe) || ibv_destroy_qp(qf))
				FAIL("quick pair teardown");
		}
		if (ibv_dereg_mr(mr))
			FAIL("quick moves dereg");
		printf("move to ERR right after RTR, 20 times: ok\n");
	}

	/* a move to ERR after a refused RTR: the backend refuses the address vector, so the QP
	 * has no connection to end; ERR still works, flushes the posted receive, and the QP is
	 * destroyed as any other. Case 0: a destination QP number beyond 24 bits on our own GID
	 * (a pairing, refused in the background, the QP in RTR); case 1: another host's GID,
	 * refused at once (the software device reaches no other host by address vector; a peer
	 * outside [cm] allowed-peers is refused at once the same way, NotPermitted), the QP still
	 * in INIT */
	for (int kase = 0; kase < 2; kase++) {
		struct ibv_mr *mr = ibv_reg_mr(pd, dst, 256, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_qp *qg = make_qp(IBV_QPT_RC);
		if (!mr || !qg)
			FAIL("refused-RTR QP");
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
			.qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
		if (ibv_modify_qp(qg, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
			FAIL("refused-RTR QP to INIT");
		struct ibv_sge sge = { .addr = (uintptr_t)dst, .length = 64, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 900, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(qg, &wr, &bad))
			FAIL("refused-RTR post_recv");
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = kase == 0 ? 0x1000000 : 0x99;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		if (kase == 1) {
			/* ::ffff:192.0.2.1 (TEST-NET-1), not this backend */
			memset(a.ah_attr.grh.dgid.raw, 0, 16);
			a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff;
			a.ah_attr.grh.dgid.raw[12] = 192;
			a.ah_attr.grh.dgid.raw[14] = 2;
			a.ah_attr.grh.dgid.raw[15] = 1;
		}
		a.ah_attr.port_num = 1;
		int rtr = ibv_modify_qp(qg, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					IBV_QP_MIN_RNR_TIMER);
		if (kase == 1 && rtr == 0)
			FAIL("an RTR to another host's GID was not refused at once");
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_ERR;
		int rc = ibv_modify_qp(qg, &a, IBV_QP_STATE);
		if (rc)
			FAIL("modify to ERR after a refused RTR (RTR gave %d): %s", rtr, strerror(rc));
		int flushed = 0;
		for (long i = 0; i < 20000000 && !flushed; i++) {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n < 0)
				FAIL("poll_cq");
			if (n == 1) {
				if (wc.qp_num != qg->qp_num || wc.status != IBV_WC_WR_FLUSH_ERR ||
				    wc.wr_id != 900)
					FAIL("unexpected completion qp %u status %d wr_id %llu", wc.qp_num,
					     wc.status, (unsigned long long)wc.wr_id);
				flushed = 1;
			}
		}
		if (!flushed)
			FAIL("the receive was not flushed by the move to ERR after a refused RTR "
			     "(case %d)", kase);
		if (ibv_destroy_qp(qg) || ibv_dereg_mr(mr))
			FAIL("refused-RTR QP teardown");
		printf("move to ERR after a refused RTR (%s): ok\n",
		       kase == 0 ? "in the background" : "at once");
	}

	/* dereg revokes the rkey at once; the program keeps its bytes */
	uint32_t old_rkey = md->rkey;
	if (ibv_dereg_mr(md))
		FAIL("dereg_mr");
	if (memcmp(dst + 100, src, 5000))
		FAIL("bytes kept after dereg: changed");
	printf("bytes kept after dereg: ok\n");
	memset(dst, 0x55, 10000);
	st = write_wait(src, ms->lkey, 64, dst + 100, old_rkey);
	if (st != IBV_WC_REM_ACCESS_ERR)
		FAIL("write after dereg: %s (%d)", ibv_wc_status_str(st), st);
	for (int i = 0; i < 10000; i++)
		if (dst[i] != 0x55)
			FAIL("write after dereg reached the memory");
	printf("write after dereg: remote access error\n");

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_dereg_mr(ms);
	if (ibv_destroy_cq(cq) || ibv_destroy_comp_channel(ch) || ibv_dealloc_pd(pd) ||
	    ibv_close_device(ctx))
		FAIL("teardown");
	ibv_free_device_list(list);
	free(src);
	free(dst);
	free(pg);
	printf("all checks passed\n");
	return 0;
}
