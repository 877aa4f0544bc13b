/*
 * cli/cmd_launch.c - `tpserve launch -n N [--backend ring|rdma|mpi] -- CMD`:
 * N local ranks of CMD with the environment comm/ reads (TP_RANK,
 * TP_WORLD_SIZE, TP_BACKEND, TP_HOSTFILE, TP_CLUSTER_TOKEN); each rank
 * inherits the socket of its loopback port (TP_LISTEN_FD), the token is in
 * the environment only; --restart N restarts failed workers (then leaves
 * one stopped, and never restarts one left out by a re-plan); mpi runs
 * mpirun.  With --hostfile: launch_ssh.c.  Also `tpserve comm-selftest`, a
 * collective check every rank runs under launch.  Details: docs/multi-node.md
 * ("Launching"), exit status: docs/cli.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "cli.h"
#include "comm/comm.h"
#include "supervise.h"

#define LAUNCH_MAX 64
#define LAUNCH_GRACE_MS 3000

static void release_ports(int n, int *fds)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]), fds[i] = -1;
}

int tp_launch_random_token(char *out, size_t cap)
{
    unsigned char raw[32];
    if (cap < 2 * sizeof raw + 1 || RAND_bytes(raw, (int)sizeof raw) != 1) return -1;
    for (size_t i = 0; i < sizeof raw; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
    OPENSSL_cleanse(raw, sizeof raw);
    return 0;
}

static int launch_mpi(int n, const char *token, int argc, char **argv)
{
    char nstr[16];
    snprintf(nstr, sizeof nstr, "%d", n);
    char **args = calloc((size_t)argc + 16, sizeof *args);
    if (!args) return tp_cli_fail("launch", "out of memory");
    int k = 0;
    args[k++] = "mpirun";
    args[k++] = "--oversubscribe";
    args[k++] = "--tag-output";
    args[k++] = "-n";
    args[k++] = nstr;
    args[k++] = "-x";
    args[k++] = "TP_BACKEND";
    args[k++] = "-x";
    args[k++] = "TP_WORLD_SIZE";
    args[k++] = "-x";
    args[k++] = "TP_CLUSTER_TOKEN";
    for (int i = 0; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;
    setenv("TP_BACKEND", "mpi", 1);
    setenv("TP_WORLD_SIZE", nstr, 1);
    setenv("TP_CLUSTER_TOKEN", token, 1);
    if (geteuid() == 0) { /* OpenMPI refuses root unless told twice */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    execvp("mpirun", args);
    int e = errno;
    free(args);
    return tp_cli_fail("launch", "cannot run mpirun (%s): install OpenMPI (openmpi-bin) or use --backend ring",
                       strerror(e));
}

/* What a worker restart needs (the hostfile and token of this launch). */
struct respawn_ctx {
    char **argv;
    const char *nstr, *backend, *hostfile, *token, *shm;
};

static int respawn_local(struct tp_sup_child *c, int index, void *arg)
{
    const struct respawn_ctx *x = arg;
    char rstr[16];
    snprintf(rstr, sizeof rstr, "%d", index);
    /* no TP_LISTEN_FD: the dead rank's port is free again and the new process binds it */
    const char *env[] = {"TP_LISTEN_FD", NULL, "TP_RANK", rstr, "TP_WORLD_SIZE", x->nstr, "TP_BACKEND", x->backend,
                         "TP_HOSTFILE", x->hostfile, "TP_CLUSTER_TOKEN", x->token, "TP_COORDINATOR", NULL,
                         "TP_COMM_SHM", x->shm, "TP_REJOIN", "1"};
    return tp_sup_spawn(c, x->argv, env, (int)(TP_ARRAY_LEN(env) / 2), 0, 0, -1);
}

/* *out = TP_COMM_SHM for local ranks (NULL: leave it unset).  They share this host, so the ring
 * backend's collectives go through shared memory unless --no-shm or TP_COMM_SHM says otherwise (comm/
 * falls back to TCP by itself where the rings cannot be set up).  Returns 2 after a usage error. */
static int launch_shm_value(int shm, int no_shm, enum tp_comm_backend be, const char **out)
{
    const char *env = getenv("TP_COMM_SHM");
    if (shm && no_shm) {
        fprintf(stderr, "tpserve launch: --shm and --no-shm contradict each other; give one\n");
        return 2;
    }
    *out = no_shm ? "0" : shm ? "1" : env && *env ? env : be == TP_COMM_BACKEND_RING ? "1" : NULL;
    return 0;
}

int tp_cmd_launch(int argc, char **argv)
{
    /* `--hostfile FILE`: ranks on other machines over ssh (launch_ssh.c). */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--hostfile") == 0 || strncmp(argv[i], "--hostfile=", 11) == 0)
            return tp_launch_hostfile_main(argc, argv);
    int n = 2;
    const char *backend = "ring";
    int grace_ms = LAUNCH_GRACE_MS, shm = 0, no_shm = 0, restarts = 0;
    const struct tp_opt opts[] = {
        {"shm", 0, TP_OPT_FLAG, &shm, NULL, "ring: collectives through shared memory (TP_COMM_SHM=1; default "
         "unless TP_COMM_SHM is set)", 0, 0},
        {"no-shm", 0, TP_OPT_FLAG, &no_shm, NULL, "ring: on loopback TCP instead (TP_COMM_SHM=0)", 0, 0},
        {"np", 'n', TP_OPT_INT, &n, "N", "number of local ranks (1..64, default 2)", 1, LAUNCH_MAX},
        {"backend", 'b', TP_OPT_STRING, &backend, "NAME", "ring (default), rdma or mpi (runs mpirun)", 0, 0},
        {"restart", 0, TP_OPT_INT, &restarts, "N",
         "restart a failed worker (rank > 0) with backoff, up to N times in a row (then leave it stopped), and let "
         "the survivors rejoin (ring/rdma; default 0: stop every rank)",
         0, 1000000},
        {"grace-ms", 0, TP_OPT_INT, &grace_ms, "MS", "after a rank fails, SIGKILL the others this much later", 0,
         600000},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0},
    };
    int rest_argc = 0, np = 0;
    char **rest_argv = NULL;
    int rc = tp_cli_parse("launch",
                          "Usage: tpserve launch -n N [--backend ring|rdma|mpi] -- COMMAND [ARGS...]\n"
                          "       tpserve launch --hostfile FILE [...] -- COMMAND [ARGS...]   (ssh; see --hostfile --help)",
                          opts,
                          argc, argv, NULL, 0, &np, &rest_argc, &rest_argv);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    if (rest_argc < 1) {
        fprintf(stderr, "tpserve launch: no command given (usage: tpserve launch -n N -- COMMAND [ARGS...])\n");
        return 2;
    }
    enum tp_comm_backend be;
    if (tp_comm_backend_parse(backend, &be) != TP_OK) {
        fprintf(stderr, "tpserve launch: --backend must be ring, rdma or mpi, got '%s'\n", backend);
        return 2;
    }
    const char *shm_val = NULL;
    if (launch_shm_value(shm, no_shm, be, &shm_val)) return 2;
    char token[256];
    const char *given = getenv("TP_CLUSTER_TOKEN");
    if (given && strlen(given) >= sizeof token)
        return tp_cli_fail("launch", "TP_CLUSTER_TOKEN is %zu bytes long (at most %zu)", strlen(given), sizeof token - 1);
    if (given && *given) snprintf(token, sizeof token, "%s", given);
    else if (tp_launch_random_token(token, sizeof token) != 0)
        return tp_cli_fail("launch", "the system's random generator failed (OpenSSL RAND_bytes): no cluster token");
    if (be == TP_COMM_BACKEND_MPI && restarts > 0) {
        fprintf(stderr, "tpserve launch: --restart does not apply to --backend mpi: an MPI job cannot re-form in "
                        "place; a failed rank ends the mpirun job and the scheduler restarts it (Slurm --requeue, "
                        "Kubeflow restartPolicy; see docs/recovery.md)\n");
        return 2;
    }
    if (be == TP_COMM_BACKEND_MPI) return launch_mpi(n, token, rest_argc, rest_argv);

    /* hostfile with free ports in a private directory */
    char dir[256], hostfile[320], nstr[16];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tpserve-launch.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return tp_cli_fail("launch", "cannot create a temporary directory in %s: %s", dir, strerror(errno));
    snprintf(hostfile, sizeof hostfile, "%s/hostfile.json", dir);
    snprintf(nstr, sizeof nstr, "%d", n);
    int ports[LAUNCH_MAX], port_fds[LAUNCH_MAX];
    int exit_code = 1;
    static struct tp_sup_child kids[LAUNCH_MAX];
    int n_started = 0;
    struct tp_error perr = {0};
    if (tp_comm_hold_loopback_ports(n, ports, port_fds, &perr) != TP_OK) {
        tp_cli_fail("launch", "cannot find %d free TCP ports: %s", n, tp_error_msg(&perr));
        goto cleanup;
    }
    FILE *hf = fopen(hostfile, "w");
    if (!hf) {
        tp_cli_fail("launch", "cannot write %s: %s", hostfile, strerror(errno));
        release_ports(n, port_fds);
        goto cleanup;
    }
    fprintf(hf, "{\"version\": 1, \"hosts\": [\n");
    for (int r = 0; r < n; r++)
        fprintf(hf, "  {\"host\": \"localhost\", \"ips\": [\"127.0.0.1\"], \"port\": %d}%s\n", ports[r],
                r + 1 < n ? "," : "");
    fprintf(hf, "]}\n");
    fclose(hf);

    if (tp_sup_install() != 0) {
        tp_cli_fail("launch", "pipe: %s", strerror(errno));
        release_ports(n, port_fds);
        goto cleanup;
    }
    for (int r = 0; r < n; r++) {
        char rstr[16], fdstr[16];
        snprintf(rstr, sizeof rstr, "%d", r);
        snprintf(fdstr, sizeof fdstr, "%d", port_fds[r]);
        const char *env[] = {"TP_LISTEN_FD", fdstr, "TP_RANK", rstr, "TP_WORLD_SIZE", nstr, "TP_BACKEND", backend, "TP_HOSTFILE", hostfile,
                             "TP_CLUSTER_TOKEN", token, "TP_COORDINATOR", NULL, "TP_COMM_SHM", shm_val,
                             "TP_REJOIN", restarts > 0 ? "1" : getenv("TP_REJOIN")};
        memset(&kids[r], 0, sizeof kids[r]);
        if (tp_sup_spawn(&kids[r], rest_argv, env, (int)(TP_ARRAY_LEN(env) / 2), 0, 0, port_fds[r]) != 0) {
            tp_cli_fail("launch", "cannot start rank %d: %s", r, strerror(errno));
            break;
        }
        n_started++;
    }
    release_ports(n, port_fds); /* each rank holds its own now */
    struct respawn_ctx rx = {.argv = rest_argv, .nstr = nstr, .backend = backend, .hostfile = hostfile,
                             .token = token, .shm = shm_val};
    const struct tp_sup_config sc = {.who = "launch", .grace_ms = grace_ms, .max_restarts = restarts,
                                     .left_out_status = TP_CLI_EXIT_LEFT_OUT, /* with or without --restart: never a failure */
                                     .respawn = respawn_local, .respawn_ctx = &rx};
    exit_code = tp_sup_run(kids, n, n_started, &sc);
cleanup:
    unlink(hostfile);
    rmdir(dir);
    return exit_code;
}

/* ------------------------------------------------------------ comm-selftest */

/* One all_sum of count values checked against the exact sums.  TP_OK, the collective's failure, or
 * TP_ERR_INTERNAL (wrong values, printed). */
static enum tp_status selftest_sum(tp_comm_t *c, size_t count, enum tp_dtype dt)
{
    const int me = tp_comm_rank(c), n = tp_comm_size(c);
    const size_t es = tp_dtype_size(dt);
    unsigned char *buf = malloc(count * es + 1);
    int bad = 0;
    if (!buf) return TP_ERR_NOMEM;
    for (size_t i = 0; i < count; i++) {
        int32_t v = (int32_t)((i * 3 + (size_t)me * 5) % 11) - 5;
        if (dt == TP_DTYPE_F32) ((float *)buf)[i] = (float)v;
        else ((int32_t *)buf)[i] = v;
    }
    enum tp_status st = tp_comm_all_sum(c, buf, buf, count, dt);
    if (st != TP_OK) {
        fprintf(stderr, "comm-selftest: rank %d: all_sum of %zu %s failed: %s\n", me, count, tp_dtype_name(dt),
                tp_comm_last_error(c));
        free(buf);
        return st;
    }
    for (size_t i = 0; i < count && bad < 3; i++) {
        int32_t want = 0;
        for (int r = 0; r < n; r++) want += (int32_t)((i * 3 + (size_t)r * 5) % 11) - 5;
        double got = dt == TP_DTYPE_F32 ? ((float *)buf)[i] : ((int32_t *)buf)[i];
        if (got != want) {
            fprintf(stderr, "comm-selftest: rank %d: all_sum %s index %zu expected %d got %g\n", me,
                    tp_dtype_name(dt), i, want, got);
            bad++;
        }
    }
    free(buf);
    return bad ? TP_ERR_INTERNAL : TP_OK;
}

int tp_cmd_comm_selftest(int argc, char **argv)
{
    int exit_rank = -1, exit_code = 5;
    const struct tp_opt opts[] = {
        {"exit-rank", 0, TP_OPT_INT, &exit_rank, "R", "(testing) rank R exits right after joining", 0, 1 << 20},
        {"exit-code", 0, TP_OPT_INT, &exit_code, "C", "(testing) with this status (default 5)", 0, 255},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0},
    };
    int np = 0;
    int rc = tp_cli_parse("comm-selftest", "Usage: tpserve comm-selftest   (run under 'tpserve launch -n N --')",
                          opts, argc, argv, NULL, 0, &np, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    tp_cli_setup_logging(NULL);
    struct tp_comm_config cfg = tp_comm_default_config();
    struct tp_error err = {0};
    tp_comm_t *c = NULL;
    if (tp_comm_config_from_env(&cfg, &err) != TP_OK || tp_comm_init(&cfg, &c, &err) != TP_OK)
        return tp_cli_fail("comm-selftest", "%s", err.msg);
    const int me = tp_comm_rank(c), n = tp_comm_size(c);
    if (me == exit_rank) {
        fprintf(stderr, "comm-selftest: rank %d exits with status %d as asked\n", me, exit_code);
        fflush(stderr);
        _exit(exit_code);
    }
    enum tp_status st = TP_OK;
    static const size_t counts[] = {1, 4096, 300000};
    for (size_t k = 0; k < TP_ARRAY_LEN(counts) && st == TP_OK; k++) {
        st = selftest_sum(c, counts[k], TP_DTYPE_F32);
        if (st == TP_OK) st = selftest_sum(c, counts[k], TP_DTYPE_I32);
    }
    int32_t mine = me * 10, all[LAUNCH_MAX];
    if (st == TP_OK && n <= LAUNCH_MAX) {
        st = tp_comm_all_gather(c, &mine, all, 1, TP_DTYPE_I32);
        for (int r = 0; r < n && st == TP_OK; r++)
            if (all[r] != r * 10) st = TP_ERR_INTERNAL;
    }
    if (st == TP_OK) st = tp_comm_barrier(c);
    if (st != TP_OK) {
        fprintf(stderr, "comm-selftest: rank %d of %d FAILED: %s\n", me, n, tp_comm_last_error(c));
        tp_comm_free(c);
        return tp_cli_exit_for(st);
    }
    printf("comm-selftest: rank %d of %d ok (backend %s over %s)\n", me, n, tp_comm_backend_name(tp_comm_backend(c)),
           tp_comm_transport(c));
    tp_comm_free(c);
    return 0;
}
