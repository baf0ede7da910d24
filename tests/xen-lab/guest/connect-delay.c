/*
 * connect-delay.so (LD_PRELOAD, lab only): every rdma_connect() of the program but its first
 * waits LAB_CONNECT_DELAY_MS (default 3000) before going to librdmacm.
 *
 * Why: perftest -R connects twice (its exchange, then the test QP). Its server re-listens
 * after the exchange; a client whose second connect comes first is refused, and Debian's
 * perftest 4.5-0.17 then retries with the rdma_cm ids it has just destroyed and crashes
 * (SIGSEGV; fixed upstream by perftest commit 3d9d8d0, "Fix crashes and logical flaws in RDMA
 * CM connection retry"). A stock client in dom0 against a server in a TCG domU, whose listen is
 * a round trip to the backend, loses that race every time. The delay is the retry perftest
 * meant to make; nothing else of the tool changes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

struct rdma_cm_id;
struct rdma_conn_param;

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	static int calls;
	static int (*next)(struct rdma_cm_id *, struct rdma_conn_param *);

	if (!next)
		next = (int (*)(struct rdma_cm_id *, struct rdma_conn_param *))dlsym(RTLD_NEXT, "rdma_connect");
	if (!next)
		abort();
	if (calls++ > 0) {
		const char *s = getenv("LAB_CONNECT_DELAY_MS");
		long ms = s ? atol(s) : 3000;
		struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

		nanosleep(&ts, NULL);
	}
	return next(id, param);
}
