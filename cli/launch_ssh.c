/*
 * cli/launch_ssh.c - `tpserve launch --hostfile FILE -- CMD ...`: one rank
 * per hostfile entry over ssh (like mlx.launch), or the job handed to
 * mpirun with --backend mpi.  The cluster token goes to each rank through
 * ssh's stdin with the terminal's echo off, never on a command line; remote
 * checks turn a missing program (127) or a file not at the same path (126)
 * into one clear line; the supervisor (supervise.c) prefixes output, forwards
 * signals and stops everyone when one rank fails.  The remote command and
 * the exit statuses: docs/multi-node.md ("Launching over ssh").
 */
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "supervise.h"

#define LAUNCH_MAX_RANKS 256
#define KILL_GRACE_MS 5000
#define LAUNCH_MARKER "@tpserve-launch: remote shell started@"

/* Append s to buf as one single-quoted shell word. Returns 0, or -1 when full. */
static int put_quoted(char *buf, size_t cap, size_t *off, const char *s)
{
    if (*off + 3 >= cap) return -1;
    buf[(*off)++] = '\'';
    for (; *s; s++) {
        if (*s == '\'') {
            if (*off + 5 >= cap) return -1;
            memcpy(buf + *off, "'\\''", 4);
            *off += 4;
        } else {
            if (*off + 2 >= cap) return -1;
            buf[(*off)++] = *s;
        }
    }
    buf[(*off)++] = '\'';
    buf[*off] = '\0';
    return 0;
}

static int put_raw(char *buf, size_t cap, size_t *off, const char *s)
{
    size_t n = strlen(s);
    if (*off + n + 1 >= cap) return -1;
    memcpy(buf + *off, s, n + 1);
    *off += n;
    return 0;
}

/* Hosts of the hostfile: "host" (ssh destination) or else the first of "ips". */
static int read_hosts(const char *path, struct tp_sup_child *ranks, int max, int *n_out, char *token, size_t tcap)
{
    char *text = NULL;
    struct tp_error rerr = {0};
    enum tp_status rst = tp_read_file(path, (size_t)1 << 20, &text, NULL, &rerr);
    if (rst == TP_ERR_FORMAT) return tp_cli_fail("launch", "hostfile '%s' is larger than 1 MiB", path), -1;
    if (rst != TP_OK) return tp_cli_fail("launch", "cannot open hostfile '%s' (see configs/hostfile-*.json)", path), -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return tp_cli_fail("launch", "hostfile '%s' is not valid JSON", path), -1;
    const cJSON *hosts = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "hosts") : root;
    const cJSON *tok = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "cluster_token") : NULL;
    token[0] = '\0';
    if (cJSON_IsString(tok) && strlen(tok->valuestring) < tcap) snprintf(token, tcap, "%s", tok->valuestring);
    int rc = 0, count = cJSON_IsArray(hosts) ? cJSON_GetArraySize(hosts) : 0;
    if (count < 1) {
        rc = tp_cli_fail("launch", "hostfile '%s': want {\"hosts\": [{\"host\": \"mac-a\", \"ips\": [...], "
                                   "\"port\": N}, ...]} with at least one entry", path);
    } else if (count > max) {
        rc = tp_cli_fail("launch", "hostfile '%s' has %d entries (at most %d)", path, count, max);
    }
    for (int i = 0; rc == 0 && i < count; i++) {
        const cJSON *h = cJSON_GetArrayItem(hosts, i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(h, "host");
        const cJSON *ips = cJSON_GetObjectItemCaseSensitive(h, "ips");
        if (!cJSON_IsString(name) && cJSON_IsArray(ips)) name = cJSON_GetArrayItem(ips, 0);
        if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) >= sizeof ranks[i].label ||
            name->valuestring[0] == '-') {
            rc = tp_cli_fail("launch", "hostfile '%s': hosts[%d] needs \"host\" (the ssh destination) or \"ips\"",
                             path, i);
            break;
        }
        snprintf(ranks[i].label, sizeof ranks[i].label, "%s", name->valuestring);
    }
    cJSON_Delete(root);
    if (rc) return -1;
    *n_out = count;
    return 0;
}

/* The remote shell command of one rank (see the file comment). */
static int remote_command(char *buf, size_t cap, int rank, int world, const char *hostfile, const char *backend,
                          int rejoin, const char *cwd, int argc, char **argv)
{
    size_t off = 0;
    char tmp[96];
    buf[0] = '\0';
    const char *model = NULL;
    for (int i = 0; i + 1 < argc; i++)
        if (strcmp(argv[i], "-m") == 0 || strcmp(argv[i], "--model") == 0) model = argv[i + 1];
    int bad = put_raw(buf, cap, &off,
                      "stty -echo 2>/dev/null; echo '" LAUNCH_MARKER "'; IFS= read -r TP_CLUSTER_TOKEN; "
                      "export TP_CLUSTER_TOKEN; cd ") || put_quoted(buf, cap, &off, cwd) ||
              put_raw(buf, cap, &off, " 2>/dev/null; if ! command -v ") || put_quoted(buf, cap, &off, argv[0]) ||
              put_raw(buf, cap, &off, " >/dev/null 2>&1; then echo \"tpserve launch: '\"") ||
              put_quoted(buf, cap, &off, argv[0]) ||
              put_raw(buf, cap, &off, "\"' not found on $(hostname) (PATH=$PATH): install it at the same path on "
                                      "every host\" >&2; exit 127; fi; if [ ! -r ") ||
              put_quoted(buf, cap, &off, hostfile) ||
              put_raw(buf, cap, &off, " ]; then echo \"tpserve launch: hostfile '\"") ||
              put_quoted(buf, cap, &off, hostfile) ||
              put_raw(buf, cap, &off, "\"' is missing on $(hostname): copy it to the same path on every host\" >&2; "
                                      "exit 126; fi; ");
    if (!bad && model)
        bad = put_raw(buf, cap, &off, "if [ ! -r ") || put_quoted(buf, cap, &off, model) ||
              put_raw(buf, cap, &off, " ]; then echo \"tpserve launch: model '\"") || put_quoted(buf, cap, &off, model) ||
              put_raw(buf, cap, &off, "\"' is missing on $(hostname): copy it to the same path on every host\" >&2; "
                                      "exit 126; fi; ");
    snprintf(tmp, sizeof tmp, "exec env TP_RANK=%d TP_WORLD_SIZE=%d TP_HOSTFILE=", rank, world);
    bad = bad || put_raw(buf, cap, &off, tmp) || put_quoted(buf, cap, &off, hostfile) ||
          put_raw(buf, cap, &off, " TP_BACKEND=") || put_quoted(buf, cap, &off, backend) ||
          (rejoin && put_raw(buf, cap, &off, " TP_REJOIN=1"));
    static const char *const pass[] = {"TP_LOG_LEVEL", "TP_COMM_TIMEOUT_MS", "TP_COMM_CONNECT_TIMEOUT_MS"};
    for (size_t i = 0; !bad && i < TP_ARRAY_LEN(pass); i++) {
        const char *v = getenv(pass[i]);
        if (!v) continue;
        bad = put_raw(buf, cap, &off, " ") || put_raw(buf, cap, &off, pass[i]) || put_raw(buf, cap, &off, "=") ||
              put_quoted(buf, cap, &off, v);
    }
    for (int i = 0; !bad && i < argc; i++) bad = put_raw(buf, cap, &off, " ") || put_quoted(buf, cap, &off, argv[i]);
    return bad ? -1 : 0;
}

static const char *explain(const struct tp_sup_child *r)
{
    switch (r->status) {
    case 255:
        return r->reached ? " (ssh lost the connection, or the rank was killed by a signal)"
                          : " (ssh could not reach the host or log in: check that `ssh HOST true` works without a "
                            "password)";
    case 127: return " (program not found there)";
    case 126: return " (a file is missing there)";
    default: return "";
    }
}

/* A worker's restart (--restart): the same ssh command, the token again on its stdin. */
struct ssh_respawn {
    const char *ssh;
    char (*cmd)[16384];
    const char *token;
};

static int respawn_ssh(struct tp_sup_child *c, int index, void *arg)
{
    const struct ssh_respawn *x = arg;
    char *const args[] = {(char *)x->ssh, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-tt", c->label,
                          x->cmd[index], NULL};
    c->reached = 0;
    c->stdin_line = x->token;
    return tp_sup_spawn(c, args, NULL, 0, 1, 1, -1);
}

static int run_mpirun(const char *hostfile_hosts, int n, int dry_run, int argc, char **argv)
{
    char np[16];
    snprintf(np, sizeof np, "%d", n);
    char *args[64 + 32]; /* mpirun options (<= 19) + at most 64 of the command + NULL */
    int k = 0;
    args[k++] = "mpirun";
    args[k++] = "-np";
    args[k++] = np;
    args[k++] = "--host";
    args[k++] = (char *)hostfile_hosts;
    args[k++] = "--map-by";
    args[k++] = "node";
    args[k++] = "--bind-to";
    args[k++] = "none";
    args[k++] = "-x";
    args[k++] = "TP_BACKEND=mpi";
    static const char *const pass[] = {"TP_LOG_LEVEL", "TP_CLUSTER_TOKEN", "TP_COMM_TIMEOUT_MS",
                                       "TP_COMM_CONNECT_TIMEOUT_MS"};
    for (size_t i = 0; i < TP_ARRAY_LEN(pass); i++)
        if (getenv(pass[i])) {
            args[k++] = "-x";
            args[k++] = (char *)pass[i];
        }
    if (argc > 64) return tp_cli_fail("launch", "too many arguments after -- (at most 64 with --backend mpi)");
    for (int i = 0; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;
    if (dry_run) {
        for (int i = 0; i < k; i++) printf("%s%s", i ? " " : "", args[i]);
        printf("\n");
        return 0;
    }
    fflush(stdout);
    execvp("mpirun", args);
    return tp_cli_fail("launch", "cannot run mpirun (%s): install OpenMPI (openmpi-bin) or use --backend ring",
                       strerror(errno));
}

int tp_launch_hostfile_main(int argc, char **argv)
{
    const char *hostfile = NULL, *backend = "ring";
    int dry_run = 0, restarts = 0;
    const struct tp_opt opts[] = {
        {"restart", 0, TP_OPT_INT, &restarts, "N",
         "restart a failed worker (rank > 0) with backoff, up to N times in a row (then leave it stopped), and let "
         "the survivors rejoin (ring/rdma; default 0: stop every rank)",
         0, 1000000},
        {"hostfile", 0, TP_OPT_STRING, &hostfile, "FILE", "JSON hostfile: one rank per entry, over ssh", 0, 0},
        {"backend", 'b', TP_OPT_STRING, &backend, "NAME", "ring (default), rdma, or mpi (runs mpirun)", 0, 0},
        {"dry-run", 0, TP_OPT_FLAG, &dry_run, NULL, "print the commands instead of running them", 0, 0},
        {0},
    };
    int rest_argc = 0;
    char **rest_argv = NULL;
    int rc = tp_cli_parse("launch",
                          "Usage: tpserve launch --hostfile FILE [--backend ring|rdma|mpi] [--dry-run] -- CMD [ARGS...]\n"
                          "Starts CMD once per hostfile entry over ssh with TP_RANK, TP_WORLD_SIZE, TP_HOSTFILE,\n"
                          "TP_BACKEND (and TP_LOG_LEVEL, TP_COMM_*TIMEOUT_MS when set) in its environment, and\n"
                          "TP_CLUSTER_TOKEN (yours, the hostfile's cluster_token, or a random one) through ssh's stdin.",
                          opts, argc, argv, NULL, 0, NULL, &rest_argc, &rest_argv);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    if (!hostfile) {
        fprintf(stderr, "tpserve launch: --hostfile FILE is required here\n");
        return 2;
    }
    if (rest_argc < 1) {
        fprintf(stderr, "tpserve launch: give the command after --, e.g. -- tpserve serve -m MODEL --host 0.0.0.0\n");
        return 2;
    }
    if (strcmp(backend, "ring") != 0 && strcmp(backend, "rdma") != 0 && strcmp(backend, "mpi") != 0) {
        fprintf(stderr, "tpserve launch: --backend must be ring, rdma or mpi, got '%s'\n", backend);
        return 2;
    }
    static struct tp_sup_child ranks[LAUNCH_MAX_RANKS];
    int n = 0;
    char abs_hostfile[PATH_MAX], cwd[PATH_MAX];
    if (!realpath(hostfile, abs_hostfile)) return tp_cli_fail("launch", "cannot open hostfile '%s': %s", hostfile,
                                                              strerror(errno));
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
    static char token[256];
    if (read_hosts(abs_hostfile, ranks, LAUNCH_MAX_RANKS, &n, token, sizeof token)) return 1;
    const char *given = getenv("TP_CLUSTER_TOKEN");
    if (given && *given) {
        if (strlen(given) >= sizeof token)
            return tp_cli_fail("launch", "TP_CLUSTER_TOKEN is %zu bytes long (at most %zu)", strlen(given),
                               sizeof token - 1);
        snprintf(token, sizeof token, "%s", given);
    } else if (!token[0] && tp_launch_random_token(token, sizeof token) != 0) {
        return tp_cli_fail("launch", "the system's random generator failed (OpenSSL RAND_bytes): no cluster token");
    }

    if (strcmp(backend, "mpi") == 0 && restarts > 0) {
        fprintf(stderr, "tpserve launch: --restart does not apply to --backend mpi: an MPI job cannot re-form in "
                        "place; a failed rank ends the mpirun job and the scheduler restarts it (see docs/recovery.md)\n");
        return 2;
    }
    if (strcmp(backend, "mpi") == 0) {
        static char hostlist[LAUNCH_MAX_RANKS * 260];
        size_t off = 0;
        for (int i = 0; i < n; i++) off += (size_t)snprintf(hostlist + off, sizeof hostlist - off, "%s%s",
                                                            i ? "," : "", ranks[i].label);
        return run_mpirun(hostlist, n, dry_run, rest_argc, rest_argv);
    }

    const char *ssh = getenv("TP_LAUNCH_SSH");
    if (!ssh || !*ssh) ssh = "ssh";
    static char cmd[LAUNCH_MAX_RANKS][16384];
    for (int i = 0; i < n; i++) {
        if (remote_command(cmd[i], sizeof cmd[i], i, n, abs_hostfile, backend, restarts > 0, cwd, rest_argc,
                           rest_argv))
            return tp_cli_fail("launch", "the command for rank %d is too long", i);
        if (dry_run) printf("%s -o BatchMode=yes -o ConnectTimeout=10 -tt %s %s\n", ssh, ranks[i].label, cmd[i]);
    }
    if (dry_run) return 0;

    if (tp_sup_install() != 0) return tp_cli_fail("launch", "pipe: %s", strerror(errno));
    int started = 0;
    for (int i = 0; i < n; i++) {
        char *const args[] = {(char *)ssh, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-tt", ranks[i].label,
                              cmd[i], NULL};
        ranks[i].stdin_line = token;
        if (tp_sup_spawn(&ranks[i], args, NULL, 0, 1, 1, -1) != 0) {
            fprintf(stderr, "tpserve launch: cannot start rank %d (%s): %s\n", i, ranks[i].label, strerror(errno));
            break;
        }
        started++;
    }
    struct ssh_respawn rx = {.ssh = ssh, .cmd = cmd, .token = token};
    const struct tp_sup_config sc = {.who = "launch", .grace_ms = KILL_GRACE_MS, .marker = LAUNCH_MARKER,
                                     .explain = explain, .report_ok = 1, .max_restarts = restarts,
                                     .left_out_status = TP_CLI_EXIT_LEFT_OUT, /* with or without --restart: never a failure */
                                     .respawn = respawn_ssh, .respawn_ctx = &rx};
    return tp_sup_run(ranks, n, started, &sc);
}
