/*
 * comm/backend_rdma.c - the rdma backend's start-up: libibverbs is loaded at
 * run time with dlopen() (one binary runs where it is absent; only the
 * header is needed at build time) and the device list is checked, so that
 * `--backend rdma` on a machine without an RDMA device fails at start with
 * an error naming what is missing and how to enable it.
 *
 * The verbs data path (RC queue pairs, registered staging buffers, QP
 * details exchanged over the TCP side channel) is NOT implemented yet: with
 * a device present, start-up answers TP_ERR_UNSUPPORTED and says so.  The
 * collective algorithms it would run are the shared ones in algo.c.
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"

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

enum tp_status tp_rdma_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err)
{
    (void)c;
    enum tp_status rc = TP_OK;
    void *lib = dlopen(VERBS_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return tp_error_set(err, TP_ERR_NOT_BUILT,
                            "--backend rdma: cannot load %s (%s): install rdma-core / libibverbs, or use --backend "
                            "ring",
                            VERBS_LIB, dlerror());
    get_device_list_fn get_list = NULL;
    free_device_list_fn free_list = NULL;
    get_device_name_fn get_name = NULL;
    load_sym(lib, "ibv_get_device_list", &get_list, sizeof get_list);
    load_sym(lib, "ibv_free_device_list", &free_list, sizeof free_list);
    load_sym(lib, "ibv_get_device_name", &get_name, sizeof get_name);
    if (!get_list || !free_list || !get_name) {
        rc = tp_error_set(err, TP_ERR_NOT_BUILT, "--backend rdma: %s lacks ibv_get_device_list (too old?)", VERBS_LIB);
        goto out;
    }
    int n = 0;
    struct ibv_device **list = get_list(&n);
    if (!list || n <= 0) {
        if (list) free_list(list);
        rc = tp_error_set(err, TP_ERR_NOT_FOUND,
                          "--backend rdma: no RDMA device found (ibv_get_device_list is empty): %s; or use --backend "
                          "ring",
                          RDMA_HOWTO);
        goto out;
    }
    char names[256] = "";
    size_t len = 0;
    for (int i = 0; i < n && len + 32 < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? "," : "", get_name(list[i]));
    free_list(list);
    rc = tp_error_set(err, TP_ERR_UNSUPPORTED,
                      "--backend rdma: found device(s) %s but this build has no verbs data path yet (rank %d of %d); "
                      "use --backend ring (or mpi) for now",
                      names, cfg->rank, cfg->world_size);
out:
    dlclose(lib);
    return rc;
}

#endif /* TP_HAVE_RDMA */
