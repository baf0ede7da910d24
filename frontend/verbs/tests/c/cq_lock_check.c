/*
 * cq_lock_check (tests/tools.rs): two threads create and destroy RC QPs on the same two CQs,
 * one with (send A, receive B), the other with (send B, receive A), ROUNDS times each, while
 * two more threads poll the CQs. ibv_create_qp holds both CQs' locks while it creates the
 * QP; taken in the order the arguments name them, a creator holding its first CQ's lock
 * waits for the second (held by a poller) while the other creator takes that one first: the
 * two deadlock. SIGALRM after 60 s ends a hung run (exit 3, "hung").
 *
 * Exit 0 iff both threads finished every round; the last line says so.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define ROUNDS 1000

static struct ibv_pd *pd;
static struct ibv_cq *cqs[2];

static void *churn(void *arg)
{
	long first = (long)arg;
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;
	int i;

	for (i = 0; i < ROUNDS; i++) {
		memset(&a, 0, sizeof(a));
		a.qp_type = IBV_QPT_RC;
		a.send_cq = cqs[first];
		a.recv_cq = cqs[1 - first];
		a.cap.max_send_wr = 2;
		a.cap.max_recv_wr = 2;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		qp = ibv_create_qp(pd, &a);
		if (!qp) {
			perror("ibv_create_qp");
			return (void *)1;
		}
		if (ibv_destroy_qp(qp)) {
			printf("ibv_destroy_qp failed\n");
			return (void *)1;
		}
	}
	return NULL;
}

static volatile int polling = 1;

static void *poller(void *arg)
{
	struct ibv_wc wc;

	while (polling)
		if (ibv_poll_cq(cqs[(long)arg], 1, &wc) < 0)
			return (void *)1;
	return NULL;
}

static void hung(int sig)
{
	(void)sig;
	static const char msg[] = "hung: the two threads deadlocked\n";
	if (write(1, msg, sizeof(msg) - 1) < 0)
		_exit(4);
	_exit(3);
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	pthread_t t[2], p[2];
	void *r[2];
	long i;
	int n;

	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	if (!list || n < 1 || !(ctx = ibv_open_device(list[0]))) {
		printf("no device\n");
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	cqs[0] = pd ? ibv_create_cq(ctx, 8, NULL, NULL, 0) : NULL;
	cqs[1] = cqs[0] ? ibv_create_cq(ctx, 8, NULL, NULL, 0) : NULL;
	if (!cqs[1]) {
		printf("PD or CQs failed\n");
		return 1;
	}
	signal(SIGALRM, hung);
	alarm(60);
	for (i = 0; i < 2; i++)
		pthread_create(&p[i], NULL, poller, (void *)i);
	for (i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, churn, (void *)i);
	for (i = 0; i < 2; i++)
		pthread_join(t[i], &r[i]);
	polling = 0;
	for (i = 0; i < 2; i++)
		pthread_join(p[i], NULL);
	alarm(0);
	if (r[0] || r[1])
		return 1;
	ibv_destroy_cq(cqs[1]);
	ibv_destroy_cq(cqs[0]);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("both threads finished %d rounds\n", ROUNDS);
	return 0;
}
