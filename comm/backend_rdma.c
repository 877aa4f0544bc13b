/*
 * comm/backend_rdma.c - the rdma backend: a verbs transport under the shared
 * collective algorithms (algo.c).  libibverbs is loaded at run time (dlopen);
 * the TCP mesh of bootstrap.c forms the group and stays as the side channel;
 * one reliable-connected queue pair per peer carries a byte stream through
 * registered staging slots.  Start-up and data path: docs/multi-node.md
 * ("RDMA").  TODO: the verbs data path is compiled but not tested on an RDMA
 * device; the algorithms above it are tested through TCP.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "comm_impl.h"
#include "comm_wire.h"

#ifndef TP_HAVE_RDMA

enum tp_status tp_rdma_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err)
{
    (void)cfg;
    (void)c;
    return tp_error_set(err, TP_ERR_NOT_BUILT,
                        "this tpserve was not built with RDMA: install libibverbs-dev (rdma-core) and rebuild with "
                        "-DTP_WITH_RDMA=ON, or use --backend ring");
}

#else

#include <dlfcn.h>
#include <infiniband/verbs.h>

typedef struct ibv_device **(*get_device_list_fn)(int *num);
typedef void (*free_device_list_fn)(struct ibv_device **list);
typedef const char *(*get_device_name_fn)(struct ibv_device *dev);

#if defined(__APPLE__)
#define VERBS_LIB "libibverbs.dylib"
#define RDMA_HOWTO                                                                                               \
    "on macOS 26.2+ enable RDMA over Thunderbolt 5 with 'rdma_ctl enable' from Recovery, then connect the Macs " \
    "with Thunderbolt 5 cables"
#else
#define VERBS_LIB "libibverbs.so.1"
#define RDMA_HOWTO                                                                                               \
    "install an RDMA NIC (RoCE / InfiniBand), or for testing create a soft-RoCE device with 'rdma link add rxe0 " \
    "type rxe netdev eth0' (package rdma-core, module rdma_rxe)"
#endif

/* dlsym returns an object pointer; ISO C has no cast to a function
 * pointer, so copy the bits (what POSIX guarantees to work). */
static void load_sym(void *lib, const char *name, void *fn_out, size_t fn_size)
{
    void *p = dlsym(lib, name);
    if (p && fn_size == sizeof p) memcpy(fn_out, &p, sizeof p);
}

#define RDMA_SLOTS 16
#define RDMA_SLOT_BYTES (64u * 1024u)
#define RDMA_SPIN_NS 50000u
#define RDMA_YIELD_NS 2000000u
#define RDMA_WR_RECV 0x1ull

/* The verbs entry points we use, resolved with dlsym. */
struct verbs {
    void *lib;
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *user, struct ibv_comp_channel *ch, int vec);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr); /* compat prefix */
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
};

struct rdma_peer {
    struct ibv_qp *qp;
    unsigned char *sbuf, *rbuf;   /* (RDMA_SLOTS * RDMA_SLOT_BYTES) each, registered */
    struct ibv_mr *smr, *rmr;
    uint64_t sent_posted, sent_done; /* send slots posted / completed */
    uint64_t rx_done, rx_used;       /* receive completions seen / slots consumed */
    uint32_t rx_len[RDMA_SLOTS];     /* bytes in each completed slot */
    size_t rx_off;                   /* bytes already copied out of slot rx_used */
};

struct rdma_state {
    struct verbs v;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct rdma_peer *peers;   /* (net size) */
    int n;
};

/* ---- start-up helpers ---- */

static int load_verbs(struct verbs *v, char *why, size_t cap)
{
    memset(v, 0, sizeof *v);
    v->lib = dlopen(VERBS_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!v->lib) {
        snprintf(why, cap, "cannot load %s (%s): install rdma-core / libibverbs", VERBS_LIB, dlerror());
        return -1;
    }
#define SYM(field, name) load_sym(v->lib, name, &v->field, sizeof v->field)
    SYM(get_device_list, "ibv_get_device_list");
    SYM(free_device_list, "ibv_free_device_list");
    SYM(get_device_name, "ibv_get_device_name");
    SYM(open_device, "ibv_open_device");
    SYM(close_device, "ibv_close_device");
    SYM(alloc_pd, "ibv_alloc_pd");
    SYM(dealloc_pd, "ibv_dealloc_pd");
    SYM(create_cq, "ibv_create_cq");
    SYM(destroy_cq, "ibv_destroy_cq");
    SYM(create_qp, "ibv_create_qp");
    SYM(destroy_qp, "ibv_destroy_qp");
    SYM(modify_qp, "ibv_modify_qp");
    SYM(reg_mr, "ibv_reg_mr");
    SYM(dereg_mr, "ibv_dereg_mr");
    SYM(query_port, "ibv_query_port");
    SYM(query_gid, "ibv_query_gid");
#undef SYM
    if (!v->get_device_list || !v->free_device_list || !v->get_device_name || !v->open_device || !v->close_device ||
        !v->alloc_pd || !v->dealloc_pd || !v->create_cq || !v->destroy_cq || !v->create_qp || !v->destroy_qp ||
        !v->modify_qp || !v->reg_mr || !v->dereg_mr || !v->query_port || !v->query_gid) {
        snprintf(why, cap, "%s lacks some ibv_* functions (too old?)", VERBS_LIB);
        dlclose(v->lib);
        v->lib = NULL;
        return -1;
    }
    return 0;
}

static void rdma_free_state(struct rdma_state *st)
{
    if (!st) return;
    for (int i = 0; st->peers && i < st->n; i++) {
        struct rdma_peer *p = &st->peers[i];
        if (p->qp) st->v.destroy_qp(p->qp);
        if (p->smr) st->v.dereg_mr(p->smr);
        if (p->rmr) st->v.dereg_mr(p->rmr);
        tp_aligned_free(p->sbuf);
        tp_aligned_free(p->rbuf);
    }
    free(st->peers);
    if (st->cq) st->v.destroy_cq(st->cq);
    if (st->pd) st->v.dealloc_pd(st->pd);
    if (st->ctx) st->v.close_device(st->ctx);
    if (st->v.lib) dlclose(st->v.lib);
    free(st);
}

static int post_recv(struct rdma_state *st, int peer, unsigned slot)
{
    struct rdma_peer *p = &st->peers[peer];
    struct ibv_sge sge = {.addr = (uintptr_t)(p->rbuf + (size_t)slot * RDMA_SLOT_BYTES),
                          .length = RDMA_SLOT_BYTES,
                          .lkey = p->rmr->lkey};
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = ((uint64_t)peer << 32) | ((uint64_t)slot << 1) | RDMA_WR_RECV;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(p->qp, &wr, &bad);
}

/* Wire record of one QP endpoint (32 bytes, little-endian). */
struct qp_info {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t gid[16];
};

static void put_qp_info(const struct qp_info *q, uint8_t out[32])
{
    memset(out, 0, 32);
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(q->qpn >> (8 * i));
    for (int i = 0; i < 4; i++) out[4 + i] = (uint8_t)(q->psn >> (8 * i));
    out[8] = (uint8_t)q->lid;
    out[9] = (uint8_t)(q->lid >> 8);
    memcpy(out + 16, q->gid, 16);
}

static void get_qp_info(const uint8_t in[32], struct qp_info *q)
{
    q->qpn = (uint32_t)in[0] | ((uint32_t)in[1] << 8) | ((uint32_t)in[2] << 16) | ((uint32_t)in[3] << 24);
    q->psn = ((uint32_t)in[4] | ((uint32_t)in[5] << 8) | ((uint32_t)in[6] << 16) | ((uint32_t)in[7] << 24)) & 0xffffffu;
    q->lid = (uint16_t)(in[8] | (in[9] << 8));
    memcpy(q->gid, in + 16, 16);
}

/* RoCE: the first GID that carries an IPv4 address (::ffff:a.b.c.d), else index 0. */
static int pick_gid(struct rdma_state *st, uint8_t port, union ibv_gid *gid)
{
    union ibv_gid g;
    for (int i = 0; i < 16; i++) {
        if (st->v.query_gid(st->ctx, port, i, &g) != 0) break;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(g.raw, v4, 12) == 0) {
            *gid = g;
            return i;
        }
    }
    if (st->v.query_gid(st->ctx, port, 0, gid) != 0) memset(gid, 0, sizeof *gid);
    return 0;
}

/* ---- data path ---- */

static enum tp_status rdma_poll(struct tp_net *net, struct rdma_state *st, int *progressed, struct tp_error *err)
{
    struct ibv_wc wc[32];
    int n = ibv_poll_cq(st->cq, 32, wc);
    if (n < 0) return tp_error_set(err, TP_ERR_IO, "rdma: ibv_poll_cq failed");
    for (int i = 0; i < n; i++) {
        int peer = (int)(wc[i].wr_id >> 32);
        if (peer < 0 || peer >= st->n) return tp_error_set(err, TP_ERR_INTERNAL, "rdma: bad completion id");
        if (wc[i].status != IBV_WC_SUCCESS)
            return tp_error_set(err, TP_ERR_PEER,
                                "rdma: work completion error %d on the link to rank %d (peer gone or link down)",
                                (int)wc[i].status, peer);
        struct rdma_peer *p = &st->peers[peer];
        if (wc[i].wr_id & RDMA_WR_RECV) {
            p->rx_len[p->rx_done % RDMA_SLOTS] = wc[i].byte_len;
            p->rx_done++;
        } else {
            p->sent_done++;
        }
        *progressed = 1;
    }
    (void)net;
    return TP_OK;
}

/* Advance one transfer as far as slots allow; 1 on progress, -1 on error. */
static int rdma_step(struct rdma_state *st, struct tp_xfer *x, struct tp_error *err)
{
    struct rdma_peer *p = &st->peers[x->peer];
    int progressed = 0;
    if (x->is_send) {
        while (x->done < x->bytes && p->sent_posted - p->sent_done < RDMA_SLOTS) {
            unsigned slot = (unsigned)(p->sent_posted % RDMA_SLOTS);
            size_t len = TP_MIN((size_t)RDMA_SLOT_BYTES, x->bytes - x->done);
            unsigned char *dst = p->sbuf + (size_t)slot * RDMA_SLOT_BYTES;
            memcpy(dst, (const unsigned char *)x->buf + x->done, len);
            struct ibv_sge sge = {.addr = (uintptr_t)dst, .length = (uint32_t)len, .lkey = p->smr->lkey};
            struct ibv_send_wr wr, *bad = NULL;
            memset(&wr, 0, sizeof wr);
            wr.wr_id = ((uint64_t)x->peer << 32) | ((uint64_t)slot << 1);
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND;
            wr.send_flags = IBV_SEND_SIGNALED;
            if (ibv_post_send(p->qp, &wr, &bad) != 0) {
                tp_error_set(err, TP_ERR_PEER, "rdma: ibv_post_send to rank %d failed", x->peer);
                return -1;
            }
            p->sent_posted++;
            x->done += len;
            progressed = 1;
        }
    } else {
        while (x->done < x->bytes && p->rx_used < p->rx_done) {
            unsigned slot = (unsigned)(p->rx_used % RDMA_SLOTS);
            size_t avail = p->rx_len[slot] - p->rx_off;
            size_t len = TP_MIN(avail, x->bytes - x->done);
            memcpy((unsigned char *)x->buf + x->done, p->rbuf + (size_t)slot * RDMA_SLOT_BYTES + p->rx_off, len);
            x->done += len;
            p->rx_off += len;
            progressed = 1;
            if (p->rx_off == p->rx_len[slot]) {
                p->rx_off = 0;
                p->rx_used++;
                if (post_recv(st, x->peer, slot) != 0) {
                    tp_error_set(err, TP_ERR_PEER, "rdma: ibv_post_recv for rank %d failed", x->peer);
                    return -1;
                }
            }
        }
    }
    return progressed;
}

/* A peer whose TCP side channel reached EOF has exited. */
static int side_channel_dead(struct tp_net *net, struct tp_xfer *x, int n, int *who)
{
    struct pollfd pfd[2 * TP_ALGO_MAX_RANKS];
    int np = 0;
    for (int i = 0; i < n && np < (int)TP_ARRAY_LEN(pfd); i++)
        if (x[i].done < x[i].bytes) pfd[np++] = (struct pollfd){.fd = net->fds[x[i].peer], .events = POLLIN};
    if (np == 0 || poll(pfd, (nfds_t)np, 0) <= 0) return 0;
    for (int i = 0; i < np; i++) {
        char b;
        if ((pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) && recv(pfd[i].fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
            for (int k = 0; k < net->size; k++)
                if (net->fds[k] == pfd[i].fd) *who = k;
            return 1;
        }
    }
    return 0;
}

static enum tp_status rdma_xfer(struct tp_net *net, struct tp_xfer *x, int n, struct tp_error *err)
{
    struct rdma_state *st = net->impl;
    uint64_t last = tp_now_ns(), last_check = last;
    const uint64_t idle_ns = (uint64_t)net->op_timeout_ms * 1000000u;
    for (;;) {
        int progressed = 0, pending = 0;
        enum tp_status rc = rdma_poll(net, st, &progressed, err);
        int r = rc == TP_OK ? 0 : -1;
        for (int i = 0; i < n && r >= 0; i++) {
            if (x[i].done >= x[i].bytes) continue;
            if (tp_xfer_blocked(x, i)) {
                pending += !x[i].optional;
                continue;
            }
            r = rdma_step(st, &x[i], err);
            if (r > 0) progressed = 1;
            if (x[i].done < x[i].bytes && !x[i].optional) pending++;
        }
        if (r < 0 && atomic_load_explicit(&net->poisoned, memory_order_acquire))
            return tp_error_force(err, TP_ERR_POISONED, "aborted: %s", tp_error_msg(&net->err));
        if (r < 0) return err->status;
        if (!pending) return TP_OK;
        if (atomic_load_explicit(&net->poisoned, memory_order_acquire))
            return tp_error_set(err, TP_ERR_POISONED, "aborted: %s", tp_error_msg(&net->err));
        uint64_t now = tp_now_ns();
        if (progressed) last = now;
        if (now - last < RDMA_SPIN_NS) continue;
        if (now - last_check > 20000000u) { /* every 20 ms while stalled */
            int who = -1;
            last_check = now;
            if (side_channel_dead(net, x, n, &who)) {
                /* what the peer sent before leaving may still be completing */
                int more = 0;
                if (rdma_poll(net, st, &more, err) != TP_OK) return err->status;
                for (int i = 0; i < n; i++)
                    if (x[i].done < x[i].bytes && !tp_xfer_blocked(x, i) && rdma_step(st, &x[i], err) > 0) more = 1;
                if (!more)
                    return tp_error_set(err, TP_ERR_PEER,
                                        "rank %d closed its connection (it exited, crashed or failed)", who);
                last = now;
                continue;
            }
        }
        if (now - last >= idle_ns)
            return tp_error_set(err, TP_ERR_TIMEOUT,
                                "rdma: timed out after %u ms without progress (is a rank stopped or overloaded? "
                                "raise TP_COMM_TIMEOUT_MS if it is just slow)",
                                net->op_timeout_ms);
        if (now - last < RDMA_YIELD_NS)
            sched_yield();
        else
            tp_sleep_ms(1);
    }
}

static void rdma_shutdown(struct tp_net *net)
{
    for (int i = 0; i < net->size; i++)
        if (net->fds[i] >= 0) shutdown(net->fds[i], SHUT_RDWR);
}

static void rdma_destroy(struct tp_net *net)
{
    rdma_free_state(net->impl);
    net->impl = NULL;
    for (int i = 0; i < net->size; i++) tp_sock_close(&net->fds[i]);
}

static const struct tp_transport_ops rdma_ops = {
    .name = "rdma",
    .xfer = rdma_xfer,
    .shutdown = rdma_shutdown,
    .destroy = rdma_destroy,
};

/* Opens the RDMA device named want_dev (the first one when NULL or empty) into st->ctx. */
static enum tp_status rdma_open_device(const struct tp_comm_config *cfg, struct rdma_state *st, const char *want_dev,
                                       struct tp_error *err)
{
    int ndev = 0;
    struct ibv_device **list = st->v.get_device_list(&ndev);
    struct ibv_device *dev = NULL;
    char names[256] = "";
    size_t nl = 0;
    for (int i = 0; list && i < ndev; i++) {
        const char *nm = st->v.get_device_name(list[i]);
        if (nl + 32 < sizeof names) nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s%s", i ? "," : "", nm);
        if (!dev && (!want_dev || !*want_dev || strcmp(nm, want_dev) == 0)) dev = list[i];
    }
    if (!list || ndev <= 0) {
        if (list) st->v.free_device_list(list);
        return tp_error_set(err, TP_ERR_NOT_FOUND,
                            "--backend rdma: no RDMA device found (ibv_get_device_list is empty): %s; or use "
                            "--backend ring",
                            RDMA_HOWTO);
    }
    if (!dev) {
        st->v.free_device_list(list);
        return tp_error_set(err, TP_ERR_NOT_FOUND,
                            "--backend rdma: device '%s' (hostfile \"rdma\" of rank %d) not found; this host has: %s",
                            want_dev, cfg->rank, names);
    }
    st->ctx = st->v.open_device(dev);
    st->v.free_device_list(list);
    if (!st->ctx) return tp_error_set(err, TP_ERR_IO, "--backend rdma: cannot open the RDMA device (permissions?)");
    return TP_OK;
}

/* Rank r's staging buffers (registered) and queue pair, moved to INIT with every receive posted. */
static enum tp_status rdma_make_peer(struct rdma_state *st, int r, uint8_t port, struct tp_error *err)
{
    const size_t bytes = (size_t)RDMA_SLOTS * RDMA_SLOT_BYTES;
    struct rdma_peer *p = &st->peers[r];
    p->sbuf = tp_aligned_alloc(4096, bytes);
    p->rbuf = tp_aligned_alloc(4096, bytes);
    if (!p->sbuf || !p->rbuf) return tp_error_set(err, TP_ERR_NOMEM, "rdma: out of memory for staging buffers");
    p->smr = st->v.reg_mr(st->pd, p->sbuf, bytes, IBV_ACCESS_LOCAL_WRITE);
    p->rmr = st->v.reg_mr(st->pd, p->rbuf, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!p->smr || !p->rmr)
        return tp_error_set(err, TP_ERR_IO, "rdma: ibv_reg_mr failed (raise the locked-memory limit: ulimit -l unlimited)");
    struct ibv_qp_init_attr qa;
    memset(&qa, 0, sizeof qa);
    qa.send_cq = st->cq;
    qa.recv_cq = st->cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = RDMA_SLOTS;
    qa.cap.max_recv_wr = RDMA_SLOTS;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    p->qp = st->v.create_qp(st->pd, &qa);
    if (!p->qp) return tp_error_set(err, TP_ERR_IO, "rdma: ibv_create_qp failed for rank %d", r);
    struct ibv_qp_attr at;
    memset(&at, 0, sizeof at);
    at.qp_state = IBV_QPS_INIT;
    at.pkey_index = 0;
    at.port_num = port;
    at.qp_access_flags = 0;
    if (st->v.modify_qp(p->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
        return tp_error_set(err, TP_ERR_IO, "rdma: QP to INIT failed for rank %d", r);
    for (unsigned sl = 0; sl < RDMA_SLOTS; sl++)
        if (post_recv(st, r, sl) != 0) return tp_error_set(err, TP_ERR_IO, "rdma: ibv_post_recv failed");
    return TP_OK;
}

/* Rank r's queue pair to RTR towards theirs, then to RTS with our packet sequence number. */
static enum tp_status rdma_ready_peer(struct rdma_state *st, int r, uint8_t port, const struct ibv_port_attr *pa,
                                      int gid_index, const struct qp_info *mine, const struct qp_info *theirs,
                                      struct tp_error *err)
{
    struct rdma_peer *p = &st->peers[r];
    struct ibv_qp_attr at;
    memset(&at, 0, sizeof at);
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = pa->active_mtu;
    at.dest_qp_num = theirs->qpn;
    at.rq_psn = theirs->psn;
    at.max_dest_rd_atomic = 1;
    at.min_rnr_timer = 12;
    at.ah_attr.dlid = theirs->lid;
    at.ah_attr.sl = 0;
    at.ah_attr.port_num = port;
    if (pa->link_layer == IBV_LINK_LAYER_ETHERNET || pa->lid == 0) {
        at.ah_attr.is_global = 1;
        memcpy(at.ah_attr.grh.dgid.raw, theirs->gid, 16);
        at.ah_attr.grh.sgid_index = (uint8_t)gid_index;
        at.ah_attr.grh.hop_limit = 64;
    }
    if (st->v.modify_qp(p->qp, &at,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
        return tp_error_set(err, TP_ERR_IO, "rdma: QP to RTR failed for rank %d (GID index %d; RoCE needs an IP on "
                            "the RDMA netdev)", r, gid_index);
    memset(&at, 0, sizeof at);
    at.qp_state = IBV_QPS_RTS;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.sq_psn = mine->psn;
    at.max_rd_atomic = 1;
    if (st->v.modify_qp(p->qp, &at,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                            IBV_QP_MAX_QP_RD_ATOMIC) != 0)
        return tp_error_set(err, TP_ERR_IO, "rdma: QP to RTS failed for rank %d", r);
    return TP_OK;
}

/* Open the device, make the per-peer QPs and buffers, connect them. */
static enum tp_status rdma_connect(const struct tp_comm_config *cfg, struct tp_net *net, struct rdma_state *st,
                                   const char *want_dev, struct tp_error *err)
{
    enum tp_status rc = rdma_open_device(cfg, st, want_dev, err);
    if (rc != TP_OK) return rc;
    const uint8_t port = 1;
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof pa);
    if (st->v.query_port(st->ctx, port, &pa) != 0)
        return tp_error_set(err, TP_ERR_IO, "--backend rdma: ibv_query_port failed");
    if (pa.state != IBV_PORT_ACTIVE)
        return tp_error_set(err, TP_ERR_IO,
                            "--backend rdma: port 1 of the RDMA device is not active (cable, link, 'ibv_devinfo')");
    union ibv_gid gid;
    int gid_index = pick_gid(st, port, &gid);
    st->pd = st->v.alloc_pd(st->ctx);
    st->cq = st->pd ? st->v.create_cq(st->ctx, 2 * RDMA_SLOTS * net->size + 16, NULL, NULL, 0) : NULL;
    st->peers = calloc((size_t)net->size, sizeof *st->peers);
    st->n = net->size;
    if (!st->pd || !st->cq || !st->peers)
        return tp_error_set(err, TP_ERR_NOMEM, "--backend rdma: cannot allocate a protection domain / completion queue");
    for (int r = 0; r < net->size; r++)
        if (r != net->rank && (rc = rdma_make_peer(st, r, port, err)) != TP_OK) return rc;
    uint64_t deadline = tp_now_ns() + (uint64_t)cfg->connect_timeout_ms * 1000000ull;
    for (int r = 0; r < net->size; r++) {
        if (r == net->rank) continue;
        struct rdma_peer *p = &st->peers[r];
        struct qp_info mine = {.qpn = p->qp->qp_num, .psn = (uint32_t)((tp_now_ns() ^ (uint64_t)r * 7919u) & 0xffffffu),
                               .lid = pa.lid}, theirs;
        memcpy(mine.gid, gid.raw, 16);
        uint8_t out[32], in[32];
        put_qp_info(&mine, out);
        struct tp_error e = {0};
        if (tp_sock_write_full(net->fds[r], out, 32, deadline, &e) != TP_OK ||
            tp_sock_read_full(net->fds[r], in, 32, deadline, &e) != TP_OK)
            return tp_error_set(err, TP_ERR_PEER, "rdma: exchanging queue-pair details with rank %d failed: %s", r,
                                e.msg);
        get_qp_info(in, &theirs);
        if ((rc = rdma_ready_peer(st, r, port, &pa, gid_index, &mine, &theirs, err)) != TP_OK) return rc;
    }
    /* Everyone is RTS before anyone sends: one byte each way on every link. */
    for (int r = 0; r < net->size; r++) {
        if (r == net->rank) continue;
        char b = 1;
        struct tp_error e = {0};
        if (tp_sock_write_full(net->fds[r], &b, 1, deadline, &e) != TP_OK ||
            tp_sock_read_full(net->fds[r], &b, 1, deadline, &e) != TP_OK)
            return tp_error_set(err, TP_ERR_PEER, "rdma: rank %d did not finish connecting: %s", r, e.msg);
    }
    return TP_OK;
}

enum tp_status tp_rdma_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    char why[300];
    struct rdma_state *st = calloc(1, sizeof *st);
    if (!st) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    if (load_verbs(&st->v, why, sizeof why) != 0) {
        free(st);
        return tp_error_set(err, TP_ERR_NOT_BUILT, "--backend rdma: %s, or use --backend ring", why);
    }
    /* Fail fast, before any network wait, when this host has no device. */
    int ndev = 0;
    struct ibv_device **list = st->v.get_device_list(&ndev);
    if (list) st->v.free_device_list(list);
    if (!list || ndev <= 0) {
        rdma_free_state(st);
        return tp_error_set(err, TP_ERR_NOT_FOUND,
                            "--backend rdma: no RDMA device found (ibv_get_device_list is empty): %s; or use "
                            "--backend ring",
                            RDMA_HOWTO);
    }
    c->rank = cfg->rank;
    c->size = cfg->world_size;
    c->ops = &tp_net_coll_ops;
    c->peer_of = malloc((size_t)c->size * sizeof(int));
    if (!c->peer_of) {
        rdma_free_state(st);
        return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < c->size; i++) c->peer_of[i] = i;
    if (c->size == 1) {
        rdma_free_state(st);
        return TP_OK;
    }
    if (c->size > TP_ALGO_MAX_RANKS) {
        rdma_free_state(st);
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "the rdma backend supports at most %d ranks", TP_ALGO_MAX_RANKS);
    }
    char want_dev[TP_HOST_RDMA_MAX] = "";
    if (cfg->hostfile && *cfg->hostfile) {
        struct tp_hostfile hf;
        if (tp_hostfile_load(cfg->hostfile, &hf, NULL) == TP_OK) {
            if (cfg->rank < hf.n) snprintf(want_dev, sizeof want_dev, "%s", hf.hosts[cfg->rank].rdma);
            tp_hostfile_free(&hf);
        }
    }
    if (cfg->drop_rank || cfg->allow_shrink || cfg->hostfile_skip) {
        rc = tp_error_set(err, TP_ERR_UNSUPPORTED, "the rdma backend cannot shrink a group (use ring)");
        goto fail;
    }
    TP_CHECK_GOTO(tp_tcp_net_create(c->rank, c->size, cfg->op_timeout_ms, &c->net, err), rc, fail);
    TP_CHECK_GOTO(tp_bootstrap_tcp(cfg, c->net, err), rc, fail);
    TP_CHECK_GOTO(rdma_connect(cfg, c->net, st, want_dev, err), rc, fail);
    c->net->impl = st;
    c->net->tops = &rdma_ops;
    return TP_OK;
fail:
    rdma_free_state(st);
    return rc;
}

#endif /* TP_HAVE_RDMA */
