/*
 * server/cmd_launch.c - `tpserve launch -n N [--backend ring|rdma|mpi] -- CMD ...`:
 * start N local ranks of CMD with the environment the comm module reads
 * (TP_RANK, TP_WORLD_SIZE, TP_BACKEND, TP_HOSTFILE, TP_CLUSTER_TOKEN).
 *
 * ring/rdma: a hostfile with N free loopback ports is generated in a private
 * temporary directory (removed at exit) and a random cluster token is put in
 * the environment (--shm adds TP_COMM_SHM=1: shared-memory rings between
 * the local ranks).  Every output line of rank k is prefixed "[rank k] " (on
 * stdout or stderr as the rank wrote it).  SIGINT/SIGTERM/SIGHUP are
 * forwarded to every rank.  When a rank fails (non-zero exit or a signal)
 * the others get SIGTERM, then SIGKILL after a grace period, and launch
 * exits with the failed rank's status (128+signal for a signal).
 * mpi: runs `mpirun --oversubscribe -n N` on CMD with TP_BACKEND=mpi (MPI
 * does the rest; --tag-output prefixes lines with [job,rank]).
 *
 * With --hostfile FILE the ranks run on the hosts of that file over ssh
 * instead (tp_launch_hostfile_main in launch_ssh.c).
 *
 * Also `tpserve comm-selftest`: a small collective check run by every rank
 * under launch (used by the ctest of launch and as a first smoke test of a
 * new cluster).
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

#include "cli.h"
#include "comm/comm.h"

#define LAUNCH_MAX 64
#define LAUNCH_GRACE_MS 3000

static volatile sig_atomic_t g_signal;
static int g_sigpipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    g_signal = sig;
    if (g_sigpipe[1] >= 0) {
        char b = (char)sig;
        ssize_t r = write(g_sigpipe[1], &b, 1);
        (void)r;
    }
    errno = saved;
}

/* SIGCHLD only wakes the supervision loop, so the first rank to exit is reaped
 * (and reported) before the ranks that fail because it left; without it a
 * 50 ms poll could see several exits at once and blame the lowest rank. */
static void on_child(int sig)
{
    int saved = errno;
    (void)sig;
    if (g_sigpipe[1] >= 0) {
        char b = 0;
        ssize_t r = write(g_sigpipe[1], &b, 1);
        (void)r;
    }
    errno = saved;
}

/* Free TCP ports on 127.0.0.1: bind all n to port 0 first, then release, so
 * the n are distinct. */
static int free_ports(int n, int *ports)
{
    int fds[LAUNCH_MAX];
    int rc = 0;
    for (int i = 0; i < n; i++) fds[i] = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(fds[i], (struct sockaddr *)&a, &al) != 0)
            rc = -1;
        else
            ports[i] = ntohs(a.sin_port);
    }
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
    return rc;
}

static int random_token(char *out, size_t cap)
{
    unsigned char raw[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t r = read(fd, raw, sizeof raw);
    close(fd);
    if (r != (ssize_t)sizeof raw || cap < 2 * sizeof raw + 1) return -1;
    for (size_t i = 0; i < sizeof raw; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

/* Per-rank output stream: partial line kept until its newline arrives. */
struct stream {
    int fd;
    FILE *to;
    char buf[8192];
    size_t len;
};

static void emit(struct stream *s, int rank, const char *p, size_t n)
{
    fprintf(s->to, "[rank %d] %.*s\n", rank, (int)n, p);
    fflush(s->to);
}

/* Read what is there; print complete lines; 0 at EOF. */
static int pump(struct stream *s, int rank)
{
    ssize_t r;
    do {
        r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    } while (r < 0 && errno == EINTR);
    if (r <= 0) {
        if (s->len) emit(s, rank, s->buf, s->len);
        s->len = 0;
        return 0;
    }
    s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++)
        if (s->buf[i] == '\n') {
            emit(s, rank, s->buf + start, i - start);
            start = i + 1;
        }
    if (start == 0 && s->len == sizeof s->buf) { /* a very long line: cut it */
        emit(s, rank, s->buf, s->len);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    return 1;
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

static int exit_code_of(int status)
{
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

int tp_cmd_launch(int argc, char **argv)
{
    /* `--hostfile FILE`: ranks on other machines over ssh (launch_ssh.c). */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--hostfile") == 0 || strncmp(argv[i], "--hostfile=", 11) == 0)
            return tp_launch_hostfile_main(argc, argv);
    int n = 2;
    const char *backend = "ring";
    int grace_ms = LAUNCH_GRACE_MS, shm = 0;
    const struct tp_opt opts[] = {
        {"shm", 0, TP_OPT_FLAG, &shm, NULL, "ring: move data through shared memory (sets TP_COMM_SHM=1)", 0, 0},
        {"np", 'n', TP_OPT_INT, &n, "N", "number of local ranks (1..64, default 2)", 1, LAUNCH_MAX},
        {"backend", 'b', TP_OPT_STRING, &backend, "NAME", "ring (default), rdma or mpi (runs mpirun)", 0, 0},
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
    if (rc) return rc == 1 ? 0 : rc;
    if (rest_argc < 1) {
        fprintf(stderr, "tpserve launch: no command given (usage: tpserve launch -n N -- COMMAND [ARGS...])\n");
        return 2;
    }
    enum tp_comm_backend be;
    if (tp_comm_backend_parse(backend, &be) != TP_OK) {
        fprintf(stderr, "tpserve launch: --backend must be ring, rdma or mpi, got '%s'\n", backend);
        return 2;
    }
    char token[64];
    if (random_token(token, sizeof token) != 0) return tp_cli_fail("launch", "cannot read /dev/urandom for a token");
    if (be == TP_COMM_BACKEND_MPI) return launch_mpi(n, token, rest_argc, rest_argv);

    /* hostfile with free ports in a private directory */
    char dir[256], hostfile[320], nstr[16];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tpserve-launch.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return tp_cli_fail("launch", "cannot create a temporary directory in %s: %s", dir, strerror(errno));
    snprintf(hostfile, sizeof hostfile, "%s/hostfile.json", dir);
    snprintf(nstr, sizeof nstr, "%d", n);
    int ports[LAUNCH_MAX];
    int exit_code = 1;
    pid_t pids[LAUNCH_MAX];
    int alive[LAUNCH_MAX];
    struct stream out[LAUNCH_MAX], err[LAUNCH_MAX];
    int n_started = 0;
    memset(alive, 0, sizeof alive);
    if (free_ports(n, ports) != 0) {
        tp_cli_fail("launch", "cannot find %d free TCP ports on 127.0.0.1", n);
        goto cleanup;
    }
    FILE *hf = fopen(hostfile, "w");
    if (!hf) {
        tp_cli_fail("launch", "cannot write %s: %s", hostfile, strerror(errno));
        goto cleanup;
    }
    fprintf(hf, "{\"version\": 1, \"hosts\": [\n");
    for (int r = 0; r < n; r++)
        fprintf(hf, "  {\"host\": \"localhost\", \"ips\": [\"127.0.0.1\"], \"port\": %d}%s\n", ports[r],
                r + 1 < n ? "," : "");
    fprintf(hf, "]}\n");
    fclose(hf);

    if (pipe(g_sigpipe) != 0) {
        tp_cli_fail("launch", "pipe: %s", strerror(errno));
        goto cleanup;
    }
    fcntl(g_sigpipe[0], F_SETFD, FD_CLOEXEC);
    fcntl(g_sigpipe[1], F_SETFD, FD_CLOEXEC);
    fcntl(g_sigpipe[1], F_SETFL, O_NONBLOCK);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sc;
    memset(&sc, 0, sizeof sc);
    sc.sa_handler = on_child;
    sc.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigemptyset(&sc.sa_mask);
    sigaction(SIGCHLD, &sc, NULL);

    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        int po[2], pe[2];
        if (pipe(po) != 0 || pipe(pe) != 0) {
            tp_cli_fail("launch", "pipe: %s", strerror(errno));
            goto reap;
        }
        pid_t pid = fork();
        if (pid < 0) {
            tp_cli_fail("launch", "fork: %s", strerror(errno));
            close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
            goto reap;
        }
        if (pid == 0) {
            char rstr[16];
            snprintf(rstr, sizeof rstr, "%d", r);
            dup2(po[1], 1);
            dup2(pe[1], 2);
            close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGHUP, SIG_DFL);
            signal(SIGPIPE, SIG_DFL);
            setenv("TP_RANK", rstr, 1);
            setenv("TP_WORLD_SIZE", nstr, 1);
            setenv("TP_BACKEND", backend, 1);
            setenv("TP_HOSTFILE", hostfile, 1);
            setenv("TP_CLUSTER_TOKEN", token, 1);
            unsetenv("TP_COORDINATOR");
            if (shm) setenv("TP_COMM_SHM", "1", 1);
            execvp(rest_argv[0], rest_argv);
            fprintf(stderr, "cannot run '%s': %s\n", rest_argv[0], strerror(errno));
            _exit(127);
        }
        close(po[1]);
        close(pe[1]);
        pids[r] = pid;
        alive[r] = 1;
        out[r] = (struct stream){.fd = po[0], .to = stdout};
        err[r] = (struct stream){.fd = pe[0], .to = stderr};
        n_started++;
    }

reap:;
    int failed_rank = -1, failed_status = 0, n_alive = n_started;
    if (n_started < n) failed_rank = n_started; /* could not start them all */
    uint64_t kill_at = 0;
    int forwarded_term = 0;
    if (failed_rank >= 0) {
        for (int r = 0; r < n_started; r++) kill(pids[r], SIGTERM);
        kill_at = tp_now_ns() + (uint64_t)grace_ms * 1000000u;
        forwarded_term = 1;
    }
    for (;;) {
        struct pollfd pfd[2 * LAUNCH_MAX + 1];
        struct stream *ps[2 * LAUNCH_MAX + 1];
        int idx[2 * LAUNCH_MAX + 1];
        int np_ = 0;
        for (int r = 0; r < n_started; r++) {
            if (out[r].fd >= 0) pfd[np_] = (struct pollfd){.fd = out[r].fd, .events = POLLIN}, ps[np_] = &out[r], idx[np_++] = r;
            if (err[r].fd >= 0) pfd[np_] = (struct pollfd){.fd = err[r].fd, .events = POLLIN}, ps[np_] = &err[r], idx[np_++] = r;
        }
        int streams = np_;
        if (n_alive == 0 && streams == 0) break;
        pfd[np_] = (struct pollfd){.fd = g_sigpipe[0], .events = POLLIN};
        ps[np_] = NULL;
        idx[np_++] = -1;
        int pr = poll(pfd, (nfds_t)np_, 50);
        if (pr > 0) {
            for (int i = 0; i < streams; i++)
                if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))
                    if (!pump(ps[i], idx[i])) {
                        close(ps[i]->fd);
                        ps[i]->fd = -1;
                    }
            if (pfd[streams].revents & POLLIN) {
                char b[16];
                ssize_t rr = read(g_sigpipe[0], b, sizeof b);
                (void)rr;
            }
        }
        if (g_signal) {
            int sig = g_signal;
            g_signal = 0;
            for (int r = 0; r < n_started; r++)
                if (alive[r]) kill(pids[r], sig);
            if (!kill_at) kill_at = tp_now_ns() + (uint64_t)grace_ms * 1000000u;
            if (failed_rank < 0) exit_code = 128 + sig;
            forwarded_term = 1;
        }
        for (int r = 0; r < n_started; r++) {
            if (!alive[r]) continue;
            int st = 0;
            if (waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
            alive[r] = 0;
            n_alive--;
            int code = exit_code_of(st);
            if (code != 0 && failed_rank < 0) {
                failed_rank = r;
                failed_status = code;
                if (!forwarded_term)
                    fprintf(stderr, "tpserve launch: rank %d failed (%s %d); stopping the other ranks\n", r,
                            WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? code : code - 128);
                for (int k = 0; k < n_started; k++)
                    if (alive[k]) kill(pids[k], SIGTERM);
                if (!kill_at) kill_at = tp_now_ns() + (uint64_t)grace_ms * 1000000u;
            }
        }
        if (kill_at && tp_now_ns() > kill_at) {
            for (int r = 0; r < n_started; r++)
                if (alive[r]) kill(pids[r], SIGKILL);
            kill_at = 0;
        }
    }
    if (failed_rank >= 0)
        exit_code = failed_status ? failed_status : 1;
    else if (exit_code == 1 && n_started == n)
        exit_code = 0;
cleanup:
    unlink(hostfile);
    rmdir(dir);
    return exit_code;
}

/* ------------------------------------------------------------ comm-selftest */

static int selftest_sum(tp_comm_t *c, size_t count, enum tp_dtype dt)
{
    const int me = tp_comm_rank(c), n = tp_comm_size(c);
    const size_t es = tp_dtype_size(dt);
    unsigned char *buf = malloc(count * es + 1);
    int bad = 0;
    if (!buf) return 1;
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
        return 1;
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
    return bad;
}

int tp_cmd_comm_selftest(int argc, char **argv)
{
    int exit_rank = -1, exit_code = 3;
    const struct tp_opt opts[] = {
        {"exit-rank", 0, TP_OPT_INT, &exit_rank, "R", "(testing) rank R exits right after joining", 0, 1 << 20},
        {"exit-code", 0, TP_OPT_INT, &exit_code, "C", "(testing) with this status (default 3)", 0, 255},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0},
    };
    int np = 0;
    int rc = tp_cli_parse("comm-selftest", "Usage: tpserve comm-selftest   (run under 'tpserve launch -n N --')",
                          opts, argc, argv, NULL, 0, &np, NULL, NULL);
    if (rc) return rc == 1 ? 0 : rc;
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
    int bad = 0;
    static const size_t counts[] = {1, 4096, 300000};
    for (size_t k = 0; k < TP_ARRAY_LEN(counts) && !bad; k++) {
        bad += selftest_sum(c, counts[k], TP_DTYPE_F32);
        if (!bad) bad += selftest_sum(c, counts[k], TP_DTYPE_I32);
    }
    int32_t mine = me * 10, all[LAUNCH_MAX];
    if (!bad && n <= LAUNCH_MAX) {
        if (tp_comm_all_gather(c, &mine, all, 1, TP_DTYPE_I32) != TP_OK) bad++;
        for (int r = 0; r < n && !bad; r++) bad += all[r] != r * 10;
    }
    if (!bad && tp_comm_barrier(c) != TP_OK) bad++;
    if (bad) {
        fprintf(stderr, "comm-selftest: rank %d of %d FAILED: %s\n", me, n, tp_comm_last_error(c));
        tp_comm_free(c);
        return 1;
    }
    printf("comm-selftest: rank %d of %d ok (backend %s)\n", me, n, tp_comm_backend_name(tp_comm_backend(c)));
    tp_comm_free(c);
    return 0;
}
