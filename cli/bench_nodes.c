/*
 * cli/bench_nodes.c - `tpserve bench nodes`: what N nodes buy.
 *
 * For each node count N of --nodes it runs N ranks of `tpserve bench gen
 * --json` (prefill and decode from an empty cache, EOS ignored, median of
 * --reps) as one tensor-parallel group and collects rank 0's figures:
 * prefill and decode tokens/s, per-token compute and communication time,
 * bytes sent per token; and the peak RSS of every rank (wait4).
 *
 * Where scripts/netsim works (Linux, root, namespaces) the N ranks run on N
 * simulated hosts with the --link profile's bandwidth cap (each rank in its
 * own network namespace with its own address; latency is what the veth and
 * bridge really have); elsewhere, or with --link local, on 127.0.0.1.
 *
 * Projection for dedicated machines: on this one machine the N ranks share
 * its cores and memory bandwidth, so measured compute does not shrink with N
 * the way it would on N machines.  The communication model is calibrated in
 * the same set-up (same namespaces, same link profile) by `tpserve bench comm`:
 * t_sum(N) = median latency of one all_sum of n_embd floats (one decoded
 * token's activation); per token the engine does 2 n_layer of them plus the
 * step broadcast and the distributed argmax, one round each, as `tpserve
 * plan` models them (tp_capacity_comm_ms with the measured t_sum):
 *     comm_model(N)        = 2 n_layer t_sum(N) + 2 rounds of t_sum's latency
 *     projected_tg_tps(N)  = 1000 / (c1 / N + comm_model(N))
 * with c1 = 1000 / tg_tps(1), the whole per-token time of the 1-rank run.
 * Check of the model (compute per rank held equal, i.e. using each run's own
 * measured compute instead of c1 / N): 1000 / (compute_ms(N) + comm_model(N))
 * against the measured tg_tps(N); the Markdown output prints the difference.
 *
 * Outputs PREFIX.csv, PREFIX.md (Markdown table), PREFIX.json and PREFIX.svg
 * (tokens/s against node count, measured and projected).  Progress on
 * stderr.  Not a test: numbers depend on the machine.
 */
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "parallel/parallel.h"
#include "model/model.h"

#define NODES_MAX 16

struct node_run {
    int n;
    int ok;
    double pp_tps, tg_tps, compute_ms, comm_ms, bytes_per_token;
    uint64_t rss_bytes_max;
    double allsum_us;          /* bench comm: median all_sum of n_embd floats in this set-up */
    double comm_model_ms;      /* tp_capacity_comm_ms with allsum_us: 2 n_layer all_sums + step broadcast + argmax */
    double projected_tg_tps, check_tg_tps;
};

/* Run `sh -c cmd` and return its exit status (stdout/stderr inherited). */
static int run_sh(const char *cmd)
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* scripts/netsim: --netsim, $TP_NETSIM, <exe dir>/../scripts/netsim, ./scripts/netsim. */
static int find_netsim(const char *given, char *out, size_t cap)
{
    if (given) {
        snprintf(out, cap, "%s", given);
        return access(out, X_OK) == 0;
    }
    const char *env = getenv("TP_NETSIM");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return access(out, X_OK) == 0;
    }
#ifdef __linux__
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            int k2 = snprintf(out, cap, "%s/../scripts/netsim", exe);
            if (k2 > 0 && (size_t)k2 < cap && access(out, X_OK) == 0) return 1;
        }
    }
#endif
    snprintf(out, cap, "scripts/netsim");
    return access(out, X_OK) == 0;
}

static void self_exe(const char *argv0, char *out, size_t cap)
{
#ifdef __linux__
    ssize_t k = readlink("/proc/self/exe", out, cap - 1);
    if (k > 0) {
        out[k] = '\0';
        return;
    }
#endif
    snprintf(out, cap, "%s", argv0);
}

/*
 * One group of n ranks.  Rank 0's stdout (the JSON line) goes to json_path,
 * everything else of every rank to log_path.  Ranks run in the netsim
 * namespaces "<prefix>-hI" when prefix is non-NULL.  Returns 0 when all ranks
 * exited 0 within timeout_s; fills r.
 */
static int run_group(const char *exe, const char *prefix, const char *subnet, int n, const char *hostfile,
                     const char *token, char *const *gen_args, const char *json_path, const char *log_path,
                     int timeout_s, struct node_run *r)
{
    pid_t pids[NODES_MAX];
    int nstarted = 0, rc = 0;
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    int json_fd = open(json_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log_fd < 0 || json_fd < 0) {
        if (log_fd >= 0) close(log_fd);
        if (json_fd >= 0) close(json_fd);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            rc = -1;
            break;
        }
        if (pid == 0) {
            char v[32];
            snprintf(v, sizeof v, "%d", i);
            setenv("TP_RANK", v, 1);
            snprintf(v, sizeof v, "%d", n);
            setenv("TP_WORLD_SIZE", v, 1);
            setenv("TP_BACKEND", "ring", 1);
            setenv("TP_CLUSTER_TOKEN", token, 1);
            if (n > 1) setenv("TP_HOSTFILE", hostfile, 1);
            else unsetenv("TP_HOSTFILE");
            dup2(i == 0 ? json_fd : log_fd, STDOUT_FILENO);
            dup2(log_fd, STDERR_FILENO);
            close(json_fd);
            close(log_fd);
            char *args[64];
            int k = 0;
            char ns[96];
            if (prefix) {
                snprintf(ns, sizeof ns, "%s-h%d", prefix, i);
                args[k++] = "ip";
                args[k++] = "netns";
                args[k++] = "exec";
                args[k++] = ns;
            }
            args[k++] = (char *)exe;
            for (int j = 0; gen_args[j] && k < 62; j++) args[k++] = gen_args[j];
            args[k] = NULL;
            execvp(args[0], args);
            _exit(127);
        }
        pids[nstarted++] = pid;
    }
    (void)subnet;
    close(json_fd);
    close(log_fd);
    uint64_t deadline = tp_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    int live = nstarted;
    r->rss_bytes_max = 0;
    while (live > 0) {
        int st;
        struct rusage ru;
        pid_t pid = wait4(-1, &st, WNOHANG, &ru);
        if (pid > 0) {
            for (int i = 0; i < nstarted; i++) {
                if (pids[i] != pid) continue;
                pids[i] = 0;
                live--;
#ifdef __APPLE__
                uint64_t rss = (uint64_t)ru.ru_maxrss; /* bytes on macOS */
#else
                uint64_t rss = (uint64_t)ru.ru_maxrss * 1024u; /* KiB on Linux */
#endif
                if (rss > r->rss_bytes_max) r->rss_bytes_max = rss;
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    if (!rc) rc = 1;
                    for (int j = 0; j < nstarted; j++)
                        if (pids[j] > 0) kill(pids[j], SIGTERM);
                }
            }
            continue;
        }
        if (tp_now_ns() > deadline) {
            for (int j = 0; j < nstarted; j++)
                if (pids[j] > 0) kill(pids[j], SIGKILL);
            rc = 2;
            deadline = UINT64_MAX;
        }
        usleep(20000);
    }
    return rc;
}

static int parse_json_result(const char *path, struct node_run *r)
{
    char *buf = NULL;
    struct tp_error err = {0};
    if (tp_read_file(path, (size_t)1 << 20, &buf, NULL, &err) != TP_OK) return -1;
    cJSON *o = cJSON_Parse(buf);
    free(buf);
    if (!o) return -1;
    const char *keys[] = {"pp_tps", "tg_tps", "compute_ms_per_token", "comm_ms_per_token", "bytes_per_token"};
    double *dst[] = {&r->pp_tps, &r->tg_tps, &r->compute_ms, &r->comm_ms, &r->bytes_per_token};
    int rc = 0;
    for (size_t i = 0; i < TP_ARRAY_LEN(keys); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
        if (!cJSON_IsNumber(v)) rc = -1;
        else *dst[i] = v->valuedouble;
    }
    cJSON_Delete(o);
    return rc;
}

/* Rank 0's "lat_us_median" from `bench comm --json` output; -1 if absent. */
static double parse_comm_latency(const char *path)
{
    char *buf = NULL;
    struct tp_error err = {0};
    if (tp_read_file(path, (size_t)1 << 20, &buf, NULL, &err) != TP_OK) return -1;
    cJSON *o = cJSON_Parse(buf);
    free(buf);
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, "lat_us_median") : NULL;
    double lat = cJSON_IsNumber(v) ? v->valuedouble : -1;
    cJSON_Delete(o);
    return lat;
}

static void write_svg(const char *path, const struct node_run *runs, int n_runs, const char *title)
{
    FILE *f = fopen(path, "w");
    if (!f) return;
    const double W = 640, H = 400, L = 70, R = 20, T = 50, B = 60;
    double ymax = 0;
    int nmax = 1;
    for (int i = 0; i < n_runs; i++) {
        if (!runs[i].ok) continue;
        ymax = fmax(ymax, fmax(runs[i].tg_tps, runs[i].projected_tg_tps));
        if (runs[i].n > nmax) nmax = runs[i].n;
    }
    if (ymax <= 0) ymax = 1;
    double step = pow(10, floor(log10(ymax / 4)));
    while (ymax / step > 8) step *= 2;
    ymax = ceil(ymax * 1.1 / step) * step;
#define XP(n) (L + ((double)(n)-1) / ((nmax > 1 ? nmax : 2) - 1.0) * (W - L - R))
#define YP(v) (H - B - (v) / ymax * (H - T - B))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">%s</text>\n", W / 2, title);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (double v = 0; v <= ymax + 1e-9; v += step) {
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, YP(v), W - R, YP(v));
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", L - 6, YP(v) + 4, v);
    }
    for (int i = 0; i < n_runs; i++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%d</text>\n", XP(runs[i].n), H - B + 18,
                runs[i].n);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">nodes</text>\n", (L + W - R) / 2, H - 20);
    fprintf(f, "<text x=\"18\" y=\"%.0f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.0f)\">decode "
               "tokens/s</text>\n",
            (T + H - B) / 2, (T + H - B) / 2);
    const char *color[2] = {"#1f77b4", "#ff7f0e"};
    const char *name[2] = {"measured (ranks share this machine)", "projected (dedicated machines)"};
    for (int s = 0; s < 2; s++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", color[s],
                s ? " stroke-dasharray=\"6 4\"" : "");
        for (int i = 0; i < n_runs; i++)
            if (runs[i].ok)
                fprintf(f, "%.1f,%.1f ", XP(runs[i].n), YP(s ? runs[i].projected_tg_tps : runs[i].tg_tps));
        fprintf(f, "\"/>\n");
        for (int i = 0; i < n_runs; i++)
            if (runs[i].ok)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n", XP(runs[i].n),
                        YP(s ? runs[i].projected_tg_tps : runs[i].tg_tps), color[s]);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"3\" fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                L + 12, T + 8 + 16 * s, color[s], L + 32, T + 12 + 16 * s, name[s]);
    }
    fprintf(f, "</svg>\n");
#undef XP
#undef YP
    fclose(f);
}

int tp_bench_nodes(int argc, char **argv)
{
    const char *model = NULL, *nodes = "1,2,4", *link = "10gbe", *out = "bench-nodes", *netsim_arg = NULL;
    int p = 128, n = 64, threads = 0, reps = 1, timeout_s = 600;
    const struct tp_opt opts[] = {
        {"model", 'm', TP_OPT_STRING, &model, "FILE", "model (GGUF)", 0, 0},
        {"nodes", 0, TP_OPT_LIST, &nodes, "LIST", "node counts to run (default 1,2,4)", 0, 0},
        {"link", 0, TP_OPT_STRING, &link, "PROFILE", "netsim profile: tb5, 10gbe (default), 1gbe, none, local", 0, 0},
        {"prompt-tokens", 'p', TP_OPT_INT, &p, "P", "prefill length (default 128)", 0, 65536},
        {"gen-tokens", 'n', TP_OPT_INT, &n, "N", "decoded tokens (default 64)", 1, 65536},
        {"threads", 't', TP_OPT_INT, &threads, "T", "threads per rank (default: cores / ranks, at least 1)", 1, 1024},
        {"reps", 'r', TP_OPT_INT, &reps, "R", "repetitions per run, median (default 1)", 1, 100},
        {"out", 'o', TP_OPT_STRING, &out, "PREFIX", "output files PREFIX.{csv,md,json,svg} (default bench-nodes)", 0,
         0},
        {"netsim", 0, TP_OPT_STRING, &netsim_arg, "PATH", "scripts/netsim to use (default: found next to the build)",
         0, 0},
        {"timeout", 0, TP_OPT_INT, &timeout_s, "S", "limit per node count (default 600)", 10, 86400},
        {0},
    };
    const char *usage =
        "Usage: tpserve bench nodes -m MODEL [--nodes 1,2,4] [--link 10gbe] [-p 128] [-n 64] [-o PREFIX]\n"
        "Prefill/decode tokens/s, compute vs communication per token, bytes per token and per-rank memory for\n"
        "each node count (ranks on simulated hosts with the link's bandwidth where scripts/netsim works, else\n"
        "on 127.0.0.1), plus a projection for dedicated machines.  Writes PREFIX.csv/.md/.json/.svg.";
    int rc = tp_cli_parse("bench nodes", usage, opts, argc, argv, NULL, 0, NULL, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    if (!model) {
        fprintf(stderr, "tpserve bench nodes: -m MODEL is required\n");
        return 2;
    }
    if (access(model, R_OK) != 0) return tp_cli_fail("bench nodes", "cannot read model '%s'", model);
    struct tp_hparams hp;
    {
        struct tp_model_config mc = tp_model_default_config();
        struct tp_error merr = {0};
        tp_model_t *mm = NULL;
        mc.path = model;
        mc.vocab_only = 1;
        if (tp_model_init(&mc, &mm, &merr) != TP_OK) return tp_cli_fail("bench nodes", "%s", merr.msg);
        hp = *tp_model_hparams(mm);
        tp_model_free(mm);
    }
    struct node_run runs[NODES_MAX];
    int n_runs = 0;
    memset(runs, 0, sizeof runs);
    for (const char *s = nodes; *s;) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > NODES_MAX || (*end && *end != ',') || n_runs == NODES_MAX) {
            fprintf(stderr, "tpserve bench nodes: --nodes wants counts 1..%d like 1,2,4, got '%s'\n", NODES_MAX, nodes);
            return 2;
        }
        runs[n_runs++].n = (int)v;
        s = *end ? end + 1 : end;
    }
    const int use_link = strcmp(link, "local") != 0;
    if (use_link && strcmp(link, "tb5") && strcmp(link, "10gbe") && strcmp(link, "1gbe") && strcmp(link, "none")) {
        fprintf(stderr, "tpserve bench nodes: --link must be tb5, 10gbe, 1gbe, none or local, got '%s'\n", link);
        return 2;
    }

    char exe[PATH_MAX], netsim[PATH_MAX], prefix[32], tmpdir[] = "/tmp/tpserve-bench-nodes-XXXXXX";
    self_exe(argv[0], exe, sizeof exe);
    if (!mkdtemp(tmpdir)) return tp_cli_fail("bench nodes", "cannot create a temporary directory: %s", strerror(errno));
    snprintf(prefix, sizeof prefix, "tpbn%d", (int)getpid() % 100000);
    const char *subnet = "10.77.6";
    int have_netsim = 0;
    char cmd[2 * PATH_MAX + 128], reason[256] = "--link local";
    if (use_link) {
        if (!find_netsim(netsim_arg, netsim, sizeof netsim)) {
            snprintf(reason, sizeof reason, "scripts/netsim not found (give --netsim PATH)");
        } else {
            setenv("TP_NETSIM_PREFIX", prefix, 1);
            setenv("TP_NETSIM_SUBNET", subnet, 1);
            snprintf(cmd, sizeof cmd, "'%s' check >/dev/null 2>&1", netsim);
            if (run_sh(cmd) == 0) have_netsim = 1;
            else snprintf(reason, sizeof reason, "network namespaces not permitted here (see 'scripts/netsim check')");
        }
    }
    fprintf(stderr, "bench nodes: %s, nodes %s, %s, p=%d n=%d reps=%d\n", model, nodes,
            have_netsim ? link : "127.0.0.1, unshaped", p, n, reps);
    if (!have_netsim && use_link) fprintf(stderr, "bench nodes: ranks on 127.0.0.1: %s\n", reason);

    char token[40];
    snprintf(token, sizeof token, "bench-%d-%llu", (int)getpid(), (unsigned long long)tp_now_ns());
    int ncpu = tp_cpu_count();
    int failures = 0;
    struct tp_cap_link plan_link;
    if (tp_capacity_link_profile(have_netsim ? link : "local", &plan_link, NULL) != TP_OK)
        tp_capacity_link_profile("local", &plan_link, NULL);
    for (int r = 0; r < n_runs; r++) {
        int N = runs[r].n;
        char hostfile[PATH_MAX], json_path[PATH_MAX], log_path[PATH_MAX];
        snprintf(hostfile, sizeof hostfile, "%s/hostfile-%d.json", tmpdir, N);
        snprintf(json_path, sizeof json_path, "%s/rank0-%d.json", tmpdir, N);
        snprintf(log_path, sizeof log_path, "%s/ranks-%d.log", tmpdir, N);
        int base_port = 20000 + (int)(getpid() % 2000) * 10;
        FILE *hf = fopen(hostfile, "w");
        if (!hf) return tp_cli_fail("bench nodes", "cannot write %s", hostfile);
        fprintf(hf, "{\"version\": 1, \"hosts\": [");
        for (int i = 0; i < N; i++) {
            if (have_netsim) fprintf(hf, "%s{\"ips\": [\"%s.%d\"], \"port\": 29500}", i ? ", " : "", subnet, i + 1);
            else fprintf(hf, "%s{\"ips\": [\"127.0.0.1\"], \"port\": %d}", i ? ", " : "", base_port + i);
        }
        fprintf(hf, "]}\n");
        fclose(hf);
        if (have_netsim) {
            snprintf(cmd, sizeof cmd, "'%s' up %d --profile %s >/dev/null", netsim, N, link);
            if (run_sh(cmd) != 0) {
                tp_cli_fail("bench nodes", "'%s' failed", cmd);
                snprintf(cmd, sizeof cmd, "'%s' down >/dev/null 2>&1", netsim);
                run_sh(cmd);
                return 1;
            }
        }
        int t = threads > 0 ? threads : TP_MAX(1, ncpu / N);
        char ps[16], ns_[16], ts[16], rs[16];
        snprintf(ps, sizeof ps, "%d", p);
        snprintf(ns_, sizeof ns_, "%d", n);
        snprintf(ts, sizeof ts, "%d", t);
        snprintf(rs, sizeof rs, "%d", reps);
        char *gen_args[] = {"bench", "gen", "-m", (char *)model, "-p", ps, "-n", ns_, "-t", ts, "-r", rs,
                            "--json", "--bw-mib", "64", NULL};
        fprintf(stderr, "bench nodes: [%d/%d] %d rank%s x %d thread%s ... ", r + 1, n_runs, N, N == 1 ? "" : "s", t,
                t == 1 ? "" : "s");
        double t0 = tp_now_s();
        int grc = run_group(exe, have_netsim ? prefix : NULL, subnet, N, hostfile, token, gen_args, json_path,
                            log_path, timeout_s, &runs[r]);
        if (grc == 0 && parse_json_result(json_path, &runs[r]) == 0) {
            runs[r].ok = 1;
            fprintf(stderr, "pp %.1f t/s, tg %.2f t/s (%.1f s)\n", runs[r].pp_tps, runs[r].tg_tps, tp_now_s() - t0);
            if (N > 1) {
                char sz[32];
                snprintf(sz, sizeof sz, "%d", hp.n_embd * 4);
                char *comm_args[] = {"bench", "comm", "--min-bytes", sz, "--max-bytes", sz, "--iters", "300",
                                     "--json", NULL};
                fprintf(stderr, "bench nodes: [%d/%d] calibrating: all_sum of %d floats over %d ranks ... ", r + 1,
                        n_runs, hp.n_embd, N);
                struct node_run scratch;
                memset(&scratch, 0, sizeof scratch);
                if (run_group(exe, have_netsim ? prefix : NULL, subnet, N, hostfile, token, comm_args, json_path,
                              log_path, timeout_s, &scratch) == 0 &&
                    (runs[r].allsum_us = parse_comm_latency(json_path)) > 0) {
                    runs[r].comm_model_ms =
                        tp_capacity_comm_ms(&hp, TP_WIRE_F32, N, &plan_link, runs[r].allsum_us, NULL);
                    fprintf(stderr, "%.1f us\n", runs[r].allsum_us);
                } else {
                    runs[r].allsum_us = 0;
                    fprintf(stderr, "FAILED (rank output in %s)\n", log_path);
                }
            }
        } else {
            failures++;
            fprintf(stderr, "FAILED (%s; rank output in %s)\n", grc == 2 ? "timed out" : "a rank failed", log_path);
        }
    }
    if (have_netsim) {
        snprintf(cmd, sizeof cmd, "'%s' down >/dev/null", netsim);
        run_sh(cmd);
    }

    /* projection: c1 / N + comm_model(N) (see the file comment) */
    double c1 = 0;
    for (int r = 0; r < n_runs; r++)
        if (runs[r].ok && runs[r].n == 1 && runs[r].tg_tps > 0) c1 = 1000.0 / runs[r].tg_tps; /* all compute */
    for (int r = 0; r < n_runs; r++) {
        if (!runs[r].ok) continue;
        int N = runs[r].n;
        double comm = N > 1 ? runs[r].comm_model_ms : 0;
        double comp = c1 > 0 ? c1 / N : runs[r].compute_ms;
        runs[r].projected_tg_tps = 1000.0 / (comp + comm);
        runs[r].check_tg_tps = 1000.0 / (runs[r].compute_ms + comm);
    }

    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.csv", out);
    FILE *csv = fopen(path, "w");
    snprintf(path, sizeof path, "%s.md", out);
    FILE *md = fopen(path, "w");
    if (!csv || !md) {
        if (csv) fclose(csv);
        if (md) fclose(md);
        return tp_cli_fail("bench nodes", "cannot write %s.csv / %s.md", out, out);
    }
    fprintf(csv, "nodes,pp_tps,tg_tps,compute_ms,comm_ms,bytes_per_token,rss_bytes_max,projected_tg_tps\n");
    fprintf(md, "Model `%s`, %s, prefill %d / decode %d tokens, %d rep(s); ranks %s.\n\n", model,
            have_netsim ? link : "loopback", p, n, reps,
            have_netsim ? "on simulated hosts (scripts/netsim) sharing this machine's cores" : "on 127.0.0.1");
    {
        double la[3] = {0, 0, 0};
        if (getloadavg(la, 3) == 3)
            fprintf(md, "This machine: %d cores, load average %.1f %.1f %.1f at the end (other work shares the cores).\n\n",
                    ncpu, la[0], la[1], la[2]);
    }
    fprintf(md, "| nodes | prefill tok/s | decode tok/s | compute ms/tok | comm ms/tok | bytes/tok | max RSS MiB | "
                "projected decode tok/s (dedicated) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddStringToObject(root, "link", have_netsim ? link : "loopback");
    cJSON_AddNumberToObject(root, "prompt_tokens", p);
    cJSON_AddNumberToObject(root, "gen_tokens", n);
    cJSON_AddNumberToObject(root, "n_layer", hp.n_layer);
    cJSON_AddNumberToObject(root, "n_embd", hp.n_embd);
    cJSON *arr = cJSON_AddArrayToObject(root, "runs");
    for (int r = 0; r < n_runs; r++) {
        const struct node_run *x = &runs[r];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "nodes", x->n);
        cJSON_AddBoolToObject(o, "ok", x->ok);
        if (x->ok) {
            fprintf(csv, "%d,%.3f,%.3f,%.4f,%.4f,%.0f,%llu,%.3f\n", x->n, x->pp_tps, x->tg_tps, x->compute_ms,
                    x->comm_ms, x->bytes_per_token, (unsigned long long)x->rss_bytes_max, x->projected_tg_tps);
            fprintf(md, "| %d | %.1f | %.2f | %.3f | %.3f | %.0f | %.1f | %.2f |\n", x->n, x->pp_tps, x->tg_tps,
                    x->compute_ms, x->comm_ms, x->bytes_per_token, (double)x->rss_bytes_max / 1048576.0,
                    x->projected_tg_tps);
            cJSON_AddNumberToObject(o, "pp_tps", x->pp_tps);
            cJSON_AddNumberToObject(o, "tg_tps", x->tg_tps);
            cJSON_AddNumberToObject(o, "compute_ms", x->compute_ms);
            cJSON_AddNumberToObject(o, "comm_ms", x->comm_ms);
            cJSON_AddNumberToObject(o, "bytes_per_token", x->bytes_per_token);
            cJSON_AddNumberToObject(o, "rss_bytes_max", (double)x->rss_bytes_max);
            cJSON_AddNumberToObject(o, "projected_tg_tps", x->projected_tg_tps);
            cJSON_AddNumberToObject(o, "allsum_us", x->allsum_us);
            cJSON_AddNumberToObject(o, "comm_model_ms", x->comm_model_ms);
            cJSON_AddNumberToObject(o, "model_check_tg_tps", x->check_tg_tps);
        }
        cJSON_AddItemToArray(arr, o);
    }
    fprintf(md, "\nProjection for dedicated machines: 1-rank compute / N + 2 x %d all_sums of %d floats (and the "
                "step broadcast and argmax gather, one round each), each as measured by `tpserve bench comm` in the "
                "same set-up (",
            hp.n_layer, hp.n_embd);
    for (int r = 0; r < n_runs; r++)
        if (runs[r].ok && runs[r].n > 1) fprintf(md, "N=%d: %.1f us; ", runs[r].n, runs[r].allsum_us);
    fprintf(md, ").\nCheck of that model with each run's own compute (compute per rank held equal): ");
    for (int r = 0; r < n_runs; r++)
        if (runs[r].ok && runs[r].n > 1)
            fprintf(md, "N=%d model %.2f vs measured %.2f tok/s (%+.1f%%); ", runs[r].n, runs[r].check_tg_tps,
                    runs[r].tg_tps, 100.0 * (runs[r].check_tg_tps / runs[r].tg_tps - 1.0));
    fprintf(md, "\n");
    fclose(csv);
    fclose(md);
    snprintf(path, sizeof path, "%s.json", out);
    char *js = cJSON_Print(root);
    FILE *jf = fopen(path, "w");
    if (jf && js) fprintf(jf, "%s\n", js);
    if (jf) fclose(jf);
    free(js);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "%s.svg", out);
    char title[256];
    const char *base = strrchr(model, '/');
    snprintf(title, sizeof title, "%.120s: decode tokens/s vs nodes (%s)", base ? base + 1 : model,
             have_netsim ? link : "loopback");
    write_svg(path, runs, n_runs, title);

    snprintf(path, sizeof path, "%s.md", out);
    FILE *show = fopen(path, "r");
    if (show) {
        char line[1024];
        while (fgets(line, sizeof line, show)) fputs(line, stdout);
        fclose(show);
    }
    printf("\nwrote %s.csv %s.md %s.json %s.svg\n", out, out, out, out);
    if (failures == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        run_sh(cmd);
    }
    return failures ? 1 : 0;
}
