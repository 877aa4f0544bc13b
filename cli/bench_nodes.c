/*
 * cli/bench_nodes.c - `tpserve bench nodes`: what N nodes buy.  For each
 * node count N it runs N ranks of `tpserve bench gen --json` as one group
 * (on N simulated hosts with scripts/netsim where it works, else on
 * 127.0.0.1), calibrates the all_sum latency with `tpserve bench comm` in the
 * same set-up, projects dedicated machines and writes PREFIX.{csv,md,json,svg}.
 * --delay adds one-way latency to the simulated links (and the measured
 * round trip is reported); --verify / --spec pass through to bench gen, whose
 * verification price and speculative decode join the report.
 * The method and the projection's formula: docs/performance.md ("Node count");
 * the speculative figures: docs/speculative.md.
 * Not a test: the numbers depend on the machine.
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
    double rtt_us;             /* scripts/netsim measure: median round trip h0 -> h1 (0: not measured) */
    /* bench gen --verify K: one-token step, K + 1 positions step (ms), their ratio (0: not run) */
    double step1_ms, verify_step_ms, verify_step_ratio;
    /* bench gen --spec: [0] plain, [1] speculative decode (have_spec: present) */
    int have_spec, spec_identical;
    double spec_tps[2], spec_tokens_per_step[2], spec_collectives_per_token[2], spec_acceptance;
};

/* Run `sh -c cmd` and return its exit status (stdout/stderr inherited; -1: could not fork). */
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

/* scripts/netsim: --netsim, $TP_NETSIM, <exe dir>/../scripts/netsim, ./scripts/netsim.
 * Nonzero when the one chosen (in out) is executable. */
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
 * namespaces "<prefix>-hI" when prefix is non-NULL.  Fills r->rss_bytes_max.
 * Returns TP_OK when all ranks exited 0 within timeout_s, TP_ERR_PEER when
 * one failed, TP_ERR_TIMEOUT, TP_ERR_IO when the files or ranks could not be
 * made.
 */
static enum tp_status run_group(const char *exe, const char *prefix, int n, const char *hostfile, const char *token,
                                char *const *gen_args, const char *json_path, const char *log_path, int timeout_s,
                                struct node_run *r)
{
    pid_t pids[NODES_MAX];
    int nstarted = 0;
    enum tp_status rc = TP_OK;
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    int json_fd = open(json_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log_fd < 0 || json_fd < 0) {
        if (log_fd >= 0) close(log_fd);
        if (json_fd >= 0) close(json_fd);
        return TP_ERR_IO;
    }
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            rc = TP_ERR_IO;
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
                    if (rc == TP_OK) rc = TP_ERR_PEER;
                    for (int j = 0; j < nstarted; j++)
                        if (pids[j] > 0) kill(pids[j], SIGTERM);
                }
            }
            continue;
        }
        if (tp_now_ns() > deadline) {
            for (int j = 0; j < nstarted; j++)
                if (pids[j] > 0) kill(pids[j], SIGKILL);
            rc = TP_ERR_TIMEOUT;
            deadline = UINT64_MAX;
        }
        usleep(20000);
    }
    return rc;
}

/* Rank 0's figures from `bench gen --json` output: TP_OK, TP_ERR_IO (unreadable), TP_ERR_FORMAT. */
static enum tp_status parse_json_result(const char *path, struct node_run *r)
{
    char *buf = NULL;
    struct tp_error err = {0};
    if (tp_read_file(path, (size_t)1 << 20, &buf, NULL, &err) != TP_OK) return TP_ERR_IO;
    cJSON *o = cJSON_Parse(buf);
    free(buf);
    if (!o) return TP_ERR_FORMAT;
    const cJSON *v1 = cJSON_GetObjectItemCaseSensitive(o, "step1_ms");
    const cJSON *vk = cJSON_GetObjectItemCaseSensitive(o, "verify_step_ms");
    const cJSON *vr = cJSON_GetObjectItemCaseSensitive(o, "verify_step_ratio");
    if (cJSON_IsNumber(v1) && cJSON_IsNumber(vk) && cJSON_IsNumber(vr)) {
        r->step1_ms = v1->valuedouble;
        r->verify_step_ms = vk->valuedouble;
        r->verify_step_ratio = vr->valuedouble;
    }
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(o, "spec");
    if (cJSON_IsObject(sp)) {
        r->have_spec = 1;
        r->spec_identical = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sp, "identical"));
        for (int v = 0; v < 2; v++) {
            const cJSON *q = cJSON_GetObjectItemCaseSensitive(sp, v ? "speculative" : "plain");
            const cJSON *tps = cJSON_GetObjectItemCaseSensitive(q, "tg_tps");
            const cJSON *tsp = cJSON_GetObjectItemCaseSensitive(q, "tokens_per_step");
            const cJSON *cpt = cJSON_GetObjectItemCaseSensitive(q, "collectives_per_token");
            const cJSON *acc = cJSON_GetObjectItemCaseSensitive(q, "acceptance");
            if (!cJSON_IsNumber(tps) || !cJSON_IsNumber(tsp) || !cJSON_IsNumber(cpt) || !cJSON_IsNumber(acc)) {
                r->have_spec = 0;
                break;
            }
            r->spec_tps[v] = tps->valuedouble;
            r->spec_tokens_per_step[v] = tsp->valuedouble;
            r->spec_collectives_per_token[v] = cpt->valuedouble;
            if (v) r->spec_acceptance = acc->valuedouble;
        }
    }
    const char *keys[] = {"pp_tps", "tg_tps", "compute_ms_per_token", "comm_ms_per_token", "bytes_per_token"};
    double *dst[] = {&r->pp_tps, &r->tg_tps, &r->compute_ms, &r->comm_ms, &r->bytes_per_token};
    enum tp_status rc = TP_OK;
    for (size_t i = 0; i < TP_ARRAY_LEN(keys); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
        if (!cJSON_IsNumber(v)) rc = TP_ERR_FORMAT;
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

/* ------------------------------------------------------------------ parse */

struct nodes_opts {
    const char *model, *nodes, *link, *out, *netsim_arg;
    int p, n, threads, reps, timeout_s;
    int use_link;    /* --link is not "local" */
    const char *delay; /* --delay MS: one-way latency of the simulated links (NULL: none) */
    int verify;      /* --verify K, passed to bench gen (0: off) */
    const char *spec, *draft_model, *text; /* --spec MODE, --draft-model, --text: passed to bench gen */
    const char *draft_placement;           /* --draft-placement: passed to bench gen (NULL: its default) */
    int draft_max;
};

/* Parse argv into o and the node counts into runs[*n_runs].n.  Returns what tp_cli_parse does: 0 to go on,
 * 1 after --help, 2 after printing a usage error. */
static int nodes_parse(int argc, char **argv, struct nodes_opts *o, struct node_run *runs, int *n_runs)
{
    *o = (struct nodes_opts){.nodes = "1,2,4", .link = "10gbe", .out = "bench-nodes", .p = 128, .n = 64, .reps = 1,
                             .timeout_s = 600, .draft_max = 4};
    const struct tp_opt opts[] = {
        {"model", 'm', TP_OPT_STRING, &o->model, "FILE", "model (GGUF)", 0, 0},
        {"nodes", 0, TP_OPT_LIST, &o->nodes, "LIST", "node counts to run (default 1,2,4)", 0, 0},
        {"link", 0, TP_OPT_STRING, &o->link, "PROFILE", "netsim profile: tb5, 10gbe (default), 1gbe, none, local", 0,
         0},
        {"prompt-tokens", 'p', TP_OPT_INT, &o->p, "P", "prefill length (default 128)", 0, 65536},
        {"gen-tokens", 'n', TP_OPT_INT, &o->n, "N", "decoded tokens (default 64)", 1, 65536},
        {"threads", 't', TP_OPT_INT, &o->threads, "T", "threads per rank (default: cores / ranks, at least 1)", 1,
         1024},
        {"reps", 'r', TP_OPT_INT, &o->reps, "R", "repetitions per run, median (default 1)", 1, 100},
        {"out", 'o', TP_OPT_STRING, &o->out, "PREFIX", "output files PREFIX.{csv,md,json,svg} (default bench-nodes)",
         0, 0},
        {"netsim", 0, TP_OPT_STRING, &o->netsim_arg, "PATH", "scripts/netsim to use (default: found next to the build)",
         0, 0},
        {"timeout", 0, TP_OPT_INT, &o->timeout_s, "S", "limit per node count (default 600)", 10, 86400},
        {"delay", 0, TP_OPT_STRING, &o->delay, "MS",
         "one-way latency added to every simulated link, in milliseconds (e.g. 0.1, 1; scripts/netsim --delay); "
         "the measured round trip is reported",
         0, 0},
        {"verify", 0, TP_OPT_INT, &o->verify, "K", "also bench gen --verify K: verify_step_ratio per node count", 0,
         16},
        {"spec", 0, TP_OPT_STRING, &o->spec, "MODE",
         "also bench gen --spec MODE (ngram, draft): plain and speculative decode per node count", 0, 0},
        {"draft-max", 0, TP_OPT_INT, &o->draft_max, "K", "--spec: drafted tokens per step (default 4)", 1, 16},
        {"draft-model", 0, TP_OPT_STRING, &o->draft_model, "FILE", "--spec draft: the draft model", 0, 0},
        {"draft-placement", 0, TP_OPT_STRING, &o->draft_placement, "P",
         "--spec draft: auto, rank0 or sharded (passed to bench gen, which checks it)", 0, 0},
        {"text", 0, TP_OPT_STRING, &o->text, "TEXT", "--spec: the prompt to continue", 0, 0},
        {0},
    };
    const char *usage =
        "Usage: tpserve bench nodes -m MODEL [--nodes 1,2,4] [--link 10gbe] [-p 128] [-n 64] [-o PREFIX]\n"
        "Prefill/decode tokens/s, compute vs communication per token, bytes per token and per-rank memory for\n"
        "each node count (ranks on simulated hosts with the link's bandwidth where scripts/netsim works, else\n"
        "on 127.0.0.1), plus a projection for dedicated machines.  Writes PREFIX.csv/.md/.json/.svg.\n"
        "--delay MS adds one-way latency to the simulated links (their measured round trip is reported);\n"
        "--verify K and --spec MODE add bench gen's verification price and speculative decode per node count.";
    int rc = tp_cli_parse("bench nodes", usage, opts, argc, argv, NULL, 0, NULL, NULL, NULL);
    if (rc) return rc;
    if (!o->model) {
        fprintf(stderr, "tpserve bench nodes: -m MODEL is required\n");
        return 2;
    }
    *n_runs = 0;
    for (const char *s = o->nodes; *s;) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > NODES_MAX || (*end && *end != ',') || *n_runs == NODES_MAX) {
            fprintf(stderr, "tpserve bench nodes: --nodes wants counts 1..%d like 1,2,4, got '%s'\n", NODES_MAX,
                    o->nodes);
            return 2;
        }
        memset(&runs[*n_runs], 0, sizeof runs[*n_runs]);
        runs[(*n_runs)++].n = (int)v;
        s = *end ? end + 1 : end;
    }
    if (o->delay) {
        char *end = NULL;
        const double d = strtod(o->delay, &end);
        if (end == o->delay || *end || !(d >= 0.0 && d <= 1000.0)) {
            fprintf(stderr, "tpserve bench nodes: --delay wants milliseconds between 0 and 1000 like 0.1, got '%s'\n",
                    o->delay);
            return 2;
        }
    }
    if (o->spec && strcmp(o->spec, "ngram") != 0 && strcmp(o->spec, "draft") != 0 && strcmp(o->spec, "off") != 0) {
        fprintf(stderr, "tpserve bench nodes: --spec %s: want off, ngram or draft\n", o->spec);
        return 2;
    }
    if (o->spec && strcmp(o->spec, "off") == 0) o->spec = NULL;
    if ((o->spec && strcmp(o->spec, "draft") == 0) != (o->draft_model != NULL)) {
        fprintf(stderr, "tpserve bench nodes: %s\n",
                o->draft_model ? "--draft-model needs --spec draft" : "--spec draft needs --draft-model FILE");
        return 2;
    }
    const char *link = o->link;
    o->use_link = strcmp(link, "local") != 0;
    if (o->delay && !o->use_link) {
        fprintf(stderr, "tpserve bench nodes: --delay needs simulated hosts: a --link profile other than local\n");
        return 2;
    }
    if (o->use_link && strcmp(link, "tb5") && strcmp(link, "10gbe") && strcmp(link, "1gbe") && strcmp(link, "none")) {
        fprintf(stderr, "tpserve bench nodes: --link must be tb5, 10gbe, 1gbe, none or local, got '%s'\n", link);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------------ run */

/* The set-up every node count shares; nodes_env_close undoes it. */
struct nodes_env {
    struct tp_hparams hp;                 /* of the model, for the calibration's message size */
    char exe[PATH_MAX];                   /* this tpserve */
    char netsim[PATH_MAX];
    char prefix[32];                      /* netsim namespace prefix */
    char tmpdir[48];                      /* hostfiles, rank output; kept when a run failed */
    char token[40];                       /* cluster token of the groups (loopback / namespaces only) */
    const char *subnet;
    int have_netsim, netsim_up;
    struct tp_cap_link plan_link;         /* the link profile tp_capacity_comm_ms projects with */
};

static enum tp_status nodes_setup(const struct nodes_opts *o, const char *argv0, struct nodes_env *E,
                                  struct tp_error *err)
{
    memset(E, 0, sizeof *E);
    if (access(o->model, R_OK) != 0) return tp_error_set(err, TP_ERR_IO, "cannot read model '%s'", o->model);
    struct tp_model_config mc = tp_model_default_config();
    tp_model_t *mm = NULL;
    mc.path = o->model;
    mc.vocab_only = 1;
    enum tp_status st = tp_model_init(&mc, &mm, err);
    if (st != TP_OK) return st;
    E->hp = *tp_model_hparams(mm);
    tp_model_free(mm);
    self_exe(argv0, E->exe, sizeof E->exe);
    snprintf(E->tmpdir, sizeof E->tmpdir, "/tmp/tpserve-bench-nodes-XXXXXX");
    if (!mkdtemp(E->tmpdir)) {
        E->tmpdir[0] = '\0';
        return tp_error_set(err, TP_ERR_IO, "cannot create a temporary directory: %s", strerror(errno));
    }
    snprintf(E->prefix, sizeof E->prefix, "tpbn%d", (int)getpid() % 100000);
    snprintf(E->token, sizeof E->token, "bench-%d-%llu", (int)getpid(), (unsigned long long)tp_now_ns());
    E->subnet = "10.77.6";
    char reason[256] = "--link local", cmd[PATH_MAX + 64];
    if (o->use_link) {
        if (!find_netsim(o->netsim_arg, E->netsim, sizeof E->netsim)) {
            snprintf(reason, sizeof reason, "scripts/netsim not found (give --netsim PATH)");
        } else {
            setenv("TP_NETSIM_PREFIX", E->prefix, 1);
            setenv("TP_NETSIM_SUBNET", E->subnet, 1);
            snprintf(cmd, sizeof cmd, "'%s' check >/dev/null 2>&1", E->netsim);
            if (run_sh(cmd) == 0) E->have_netsim = 1;
            else snprintf(reason, sizeof reason, "network namespaces not permitted here (see 'scripts/netsim check')");
        }
    }
    fprintf(stderr, "bench nodes: %s, nodes %s, %s%s%s%s, p=%d n=%d reps=%d\n", o->model, o->nodes,
            E->have_netsim ? o->link : "127.0.0.1, unshaped", E->have_netsim && o->delay ? ", one-way delay " : "",
            E->have_netsim && o->delay ? o->delay : "", E->have_netsim && o->delay ? " ms" : "", o->p, o->n, o->reps);
    if (!E->have_netsim && o->use_link)
        fprintf(stderr, "bench nodes: ranks on 127.0.0.1%s: %s\n", o->delay ? " WITHOUT the --delay" : "", reason);
    if (tp_capacity_link_profile(E->have_netsim ? o->link : "local", &E->plan_link, NULL) != TP_OK)
        tp_capacity_link_profile("local", &E->plan_link, NULL);
    return TP_OK;
}

/* Tear the simulated hosts down; remove the temporary directory unless keep (a run failed: its logs stay). */
static void nodes_env_close(struct nodes_env *E, int keep)
{
    char cmd[PATH_MAX + 64];
    if (E->netsim_up) {
        snprintf(cmd, sizeof cmd, "'%s' down >/dev/null 2>&1", E->netsim);
        run_sh(cmd);
        E->netsim_up = 0;
    }
    if (E->tmpdir[0] && !keep) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", E->tmpdir);
        run_sh(cmd);
    }
}

/* `netsim measure`: the median round trip h0 -> h1 in microseconds, 0 when it could not be measured. */
static double netsim_rtt_us(const struct nodes_env *E)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "'%s' measure --seconds 0.2 2>/dev/null", E->netsim);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    char line[256];
    double rtt = 0;
    while (fgets(line, sizeof line, f)) {
        const char *k = strstr(line, "h0 -> h1 rtt_us_p50=");
        if (k) rtt = strtod(k + strlen("h0 -> h1 rtt_us_p50="), NULL);
    }
    return pclose(f) == 0 ? rtt : 0;
}

/* Write the hostfile of an N-rank group. */
static enum tp_status write_hostfile(const struct nodes_env *E, int N, const char *path, struct tp_error *err)
{
    FILE *hf = fopen(path, "w");
    if (!hf) return tp_error_set(err, TP_ERR_IO, "cannot write %s", path);
    const int base_port = 20000 + (int)(getpid() % 2000) * 10;
    fprintf(hf, "{\"version\": 1, \"hosts\": [");
    for (int i = 0; i < N; i++) {
        if (E->have_netsim) fprintf(hf, "%s{\"ips\": [\"%s.%d\"], \"port\": 29500}", i ? ", " : "", E->subnet, i + 1);
        else fprintf(hf, "%s{\"ips\": [\"127.0.0.1\"], \"port\": %d}", i ? ", " : "", base_port + i);
    }
    fprintf(hf, "]}\n");
    return fclose(hf) == 0 ? TP_OK : tp_error_set(err, TP_ERR_IO, "cannot write %s", path);
}

/*
 * Node count runs[r].n: bench gen in a group of that many ranks, then (N > 1) the all_sum calibration.
 * A group that fails leaves run->ok 0 (said on stderr) and returns TP_OK; an error is returned only when
 * the set-up itself fails (files, simulated hosts).
 */
static enum tp_status nodes_run_one(const struct nodes_opts *o, struct nodes_env *E, int r, int n_runs,
                                    struct node_run *run, struct tp_error *err)
{
    const int N = run->n;
    char hostfile[PATH_MAX], json_path[PATH_MAX], log_path[PATH_MAX], cmd[PATH_MAX + 64];
    snprintf(hostfile, sizeof hostfile, "%s/hostfile-%d.json", E->tmpdir, N);
    snprintf(json_path, sizeof json_path, "%s/rank0-%d.json", E->tmpdir, N);
    snprintf(log_path, sizeof log_path, "%s/ranks-%d.log", E->tmpdir, N);
    enum tp_status st = write_hostfile(E, N, hostfile, err);
    if (st != TP_OK) return st;
    if (E->have_netsim) {
        snprintf(cmd, sizeof cmd, "'%s' up %d --profile %s%s%s >/dev/null", E->netsim, N, o->link,
                 o->delay ? " --delay " : "", o->delay ? o->delay : "");
        E->netsim_up = 1; /* whatever part of it came up is taken down */
        if (run_sh(cmd) != 0) return tp_error_set(err, TP_ERR_IO, "'%s' failed", cmd);
        if (N > 1) run->rtt_us = netsim_rtt_us(E);
    }
    const char *ns_prefix = E->have_netsim ? E->prefix : NULL;
    const int t = o->threads > 0 ? o->threads : TP_MAX(1, tp_cpu_count() / N);
    char ps[16], ns_[16], ts[16], rs[16];
    snprintf(ps, sizeof ps, "%d", o->p);
    snprintf(ns_, sizeof ns_, "%d", o->n);
    snprintf(ts, sizeof ts, "%d", t);
    snprintf(rs, sizeof rs, "%d", o->reps);
    char vs[16], ds[16];
    snprintf(vs, sizeof vs, "%d", o->verify);
    snprintf(ds, sizeof ds, "%d", o->draft_max);
    char *gen_args[32] = {"bench", "gen", "-m", (char *)o->model, "-p", ps, "-n", ns_, "-t", ts, "-r", rs, "--json",
                          "--bw-mib", "64", NULL};
    int ga = 15;
    if (o->verify > 0) gen_args[ga++] = "--verify", gen_args[ga++] = vs;
    if (o->spec) gen_args[ga++] = "--spec", gen_args[ga++] = (char *)o->spec, gen_args[ga++] = "--draft-max",
                 gen_args[ga++] = ds;
    if (o->spec && o->draft_model) gen_args[ga++] = "--draft-model", gen_args[ga++] = (char *)o->draft_model;
    if (o->spec && o->draft_model && o->draft_placement)
        gen_args[ga++] = "--draft-placement", gen_args[ga++] = (char *)o->draft_placement;
    if (o->spec && o->text) gen_args[ga++] = "--text", gen_args[ga++] = (char *)o->text;
    gen_args[ga] = NULL;
    fprintf(stderr, "bench nodes: [%d/%d] %d rank%s x %d thread%s ... ", r + 1, n_runs, N, N == 1 ? "" : "s", t,
            t == 1 ? "" : "s");
    double t0 = tp_now_s();
    st = run_group(E->exe, ns_prefix, N, hostfile, E->token, gen_args, json_path, log_path, o->timeout_s, run);
    if (st == TP_OK) st = parse_json_result(json_path, run);
    if (st != TP_OK) {
        fprintf(stderr, "FAILED (%s; rank output in %s)\n", st == TP_ERR_TIMEOUT ? "timed out" : "a rank failed",
                log_path);
        return TP_OK;
    }
    run->ok = 1;
    fprintf(stderr, "pp %.1f t/s, tg %.2f t/s", run->pp_tps, run->tg_tps);
    if (run->rtt_us > 0) fprintf(stderr, ", rtt %.1f us", run->rtt_us);
    if (run->verify_step_ratio > 0) fprintf(stderr, ", verify_step_ratio %.3f", run->verify_step_ratio);
    if (run->have_spec)
        fprintf(stderr, ", spec %.2f vs plain %.2f t/s (acceptance %.3f)", run->spec_tps[1], run->spec_tps[0],
                run->spec_acceptance);
    fprintf(stderr, " (%.1f s)\n", tp_now_s() - t0);
    if (N == 1) return TP_OK;
    char sz[32];
    snprintf(sz, sizeof sz, "%d", E->hp.n_embd * 4);
    char *comm_args[] = {"bench", "comm", "--min-bytes", sz, "--max-bytes", sz, "--iters", "300", "--json", NULL};
    fprintf(stderr, "bench nodes: [%d/%d] calibrating: all_sum of %d floats over %d ranks ... ", r + 1, n_runs,
            E->hp.n_embd, N);
    struct node_run scratch;
    memset(&scratch, 0, sizeof scratch);
    if (run_group(E->exe, ns_prefix, N, hostfile, E->token, comm_args, json_path, log_path, o->timeout_s,
                  &scratch) == TP_OK &&
        (run->allsum_us = parse_comm_latency(json_path)) > 0) {
        run->comm_model_ms = tp_capacity_comm_ms(&E->hp, TP_WIRE_F32, N, &E->plan_link, run->allsum_us, NULL);
        fprintf(stderr, "%.1f us\n", run->allsum_us);
    } else {
        run->allsum_us = 0;
        fprintf(stderr, "FAILED (rank output in %s)\n", log_path);
    }
    return TP_OK;
}

/* projected_tg_tps = 1000 / (c1 / N + comm_model(N)), c1 the 1-rank run's whole time per token;
 * check_tg_tps: the same with each run's own measured compute (docs/performance.md). */
static void nodes_project(struct node_run *runs, int n_runs)
{
    double c1 = 0;
    for (int r = 0; r < n_runs; r++)
        if (runs[r].ok && runs[r].n == 1 && runs[r].tg_tps > 0) c1 = 1000.0 / runs[r].tg_tps;
    for (int r = 0; r < n_runs; r++) {
        if (!runs[r].ok) continue;
        const int N = runs[r].n;
        const double comm = N > 1 ? runs[r].comm_model_ms : 0;
        const double comp = c1 > 0 ? c1 / N : runs[r].compute_ms;
        runs[r].projected_tg_tps = 1000.0 / (comp + comm);
        runs[r].check_tg_tps = 1000.0 / (runs[r].compute_ms + comm);
    }
}

/* ------------------------------------------------------------------ report */

static void nodes_md(FILE *md, const struct nodes_opts *o, const struct nodes_env *E, const struct node_run *runs,
                     int n_runs)
{
    const char *where = E->have_netsim ? "on simulated hosts (scripts/netsim) sharing this machine's cores"
                                       : "on 127.0.0.1";
    fprintf(md, "Model `%s`, %s%s%s%s, prefill %d / decode %d tokens, %d rep(s); ranks %s.\n\n", o->model,
            E->have_netsim ? o->link : "loopback", E->have_netsim && o->delay ? ", one-way delay " : "",
            E->have_netsim && o->delay ? o->delay : "", E->have_netsim && o->delay ? " ms" : "", o->p, o->n, o->reps,
            where);
    double la[3] = {0, 0, 0};
    if (getloadavg(la, 3) == 3)
        fprintf(md, "This machine: %d cores, load average %.1f %.1f %.1f at the end (other work shares the cores).\n\n",
                tp_cpu_count(), la[0], la[1], la[2]);
    fprintf(md, "| nodes | prefill tok/s | decode tok/s | compute ms/tok | comm ms/tok | bytes/tok | max RSS MiB | "
                "projected decode tok/s (dedicated) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int r = 0; r < n_runs; r++) {
        const struct node_run *x = &runs[r];
        if (x->ok)
            fprintf(md, "| %d | %.1f | %.2f | %.3f | %.3f | %.0f | %.1f | %.2f |\n", x->n, x->pp_tps, x->tg_tps,
                    x->compute_ms, x->comm_ms, x->bytes_per_token, (double)x->rss_bytes_max / 1048576.0,
                    x->projected_tg_tps);
    }
    fprintf(md, "\nProjection for dedicated machines: 1-rank compute / N + 2 x %d all_sums of %d floats (and the "
                "step broadcast and argmax gather, one round each), each as measured by `tpserve bench comm` in the "
                "same set-up (",
            E->hp.n_layer, E->hp.n_embd);
    for (int r = 0; r < n_runs; r++)
        if (runs[r].ok && runs[r].n > 1) fprintf(md, "N=%d: %.1f us; ", runs[r].n, runs[r].allsum_us);
    fprintf(md, ").\nCheck of that model with each run's own compute (compute per rank held equal): ");
    for (int r = 0; r < n_runs; r++)
        if (runs[r].ok && runs[r].n > 1)
            fprintf(md, "N=%d model %.2f vs measured %.2f tok/s (%+.1f%%); ", runs[r].n, runs[r].check_tg_tps,
                    runs[r].tg_tps, 100.0 * (runs[r].check_tg_tps / runs[r].tg_tps - 1.0));
    fprintf(md, "\n");
    if (o->verify <= 0 && !o->spec) return;
    fprintf(md, "\nSpeculative decoding (bench gen");
    if (o->verify > 0) fprintf(md, " --verify %d", o->verify);
    if (o->spec) fprintf(md, " --spec %s --draft-max %d", o->spec, o->draft_max);
    fprintf(md, "):\n\n| nodes | round trip us | one-token step ms | verify_step_ratio | plain tok/s | speculative "
                "tok/s | acceptance | tokens/step | collectives/token plain / spec | speedup |\n"
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int r = 0; r < n_runs; r++) {
        const struct node_run *x = &runs[r];
        if (!x->ok) continue;
        fprintf(md, "| %d |", x->n);
        if (x->rtt_us > 0) fprintf(md, " %.1f |", x->rtt_us);
        else fprintf(md, " |");
        if (x->verify_step_ratio > 0) fprintf(md, " %.2f | %.3f |", x->step1_ms, x->verify_step_ratio);
        else fprintf(md, " | |");
        if (x->have_spec)
            fprintf(md, " %.2f | %.2f | %.3f | %.3f | %.2f / %.2f | %.3f%s |\n", x->spec_tps[0], x->spec_tps[1],
                    x->spec_acceptance, x->spec_tokens_per_step[1], x->spec_collectives_per_token[0],
                    x->spec_collectives_per_token[1], x->spec_tps[0] > 0 ? x->spec_tps[1] / x->spec_tps[0] : 0.0,
                    x->spec_identical ? "" : " (outputs differ)");
        else
            fprintf(md, " | | | | | |\n");
    }
    if (o->verify > 0)
        fprintf(md, "\nverify_step_ratio: a step scoring %d positions of one sequence over a one-token step.\n",
                o->verify + 1);
}

static void nodes_csv(FILE *csv, const struct node_run *runs, int n_runs)
{
    fprintf(csv, "nodes,pp_tps,tg_tps,compute_ms,comm_ms,bytes_per_token,rss_bytes_max,projected_tg_tps\n");
    for (int r = 0; r < n_runs; r++) {
        const struct node_run *x = &runs[r];
        if (x->ok)
            fprintf(csv, "%d,%.3f,%.3f,%.4f,%.4f,%.0f,%llu,%.3f\n", x->n, x->pp_tps, x->tg_tps, x->compute_ms,
                    x->comm_ms, x->bytes_per_token, (unsigned long long)x->rss_bytes_max, x->projected_tg_tps);
    }
}

/* The JSON document (caller cJSON_Delete's it; NULL on out of memory). */
static cJSON *nodes_json(const struct nodes_opts *o, const struct nodes_env *E, const struct node_run *runs,
                         int n_runs)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddStringToObject(root, "link", E->have_netsim ? o->link : "loopback");
    if (E->have_netsim && o->delay) cJSON_AddNumberToObject(root, "delay_ms", strtod(o->delay, NULL));
    if (o->verify > 0) cJSON_AddNumberToObject(root, "verify_k", o->verify);
    cJSON_AddNumberToObject(root, "prompt_tokens", o->p);
    cJSON_AddNumberToObject(root, "gen_tokens", o->n);
    cJSON_AddNumberToObject(root, "n_layer", E->hp.n_layer);
    cJSON_AddNumberToObject(root, "n_embd", E->hp.n_embd);
    cJSON *arr = cJSON_AddArrayToObject(root, "runs");
    for (int r = 0; r < n_runs; r++) {
        const struct node_run *x = &runs[r];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "nodes", x->n);
        cJSON_AddBoolToObject(j, "ok", x->ok);
        if (x->ok) {
            cJSON_AddNumberToObject(j, "pp_tps", x->pp_tps);
            cJSON_AddNumberToObject(j, "tg_tps", x->tg_tps);
            cJSON_AddNumberToObject(j, "compute_ms", x->compute_ms);
            cJSON_AddNumberToObject(j, "comm_ms", x->comm_ms);
            cJSON_AddNumberToObject(j, "bytes_per_token", x->bytes_per_token);
            cJSON_AddNumberToObject(j, "rss_bytes_max", (double)x->rss_bytes_max);
            cJSON_AddNumberToObject(j, "projected_tg_tps", x->projected_tg_tps);
            cJSON_AddNumberToObject(j, "allsum_us", x->allsum_us);
            cJSON_AddNumberToObject(j, "comm_model_ms", x->comm_model_ms);
            cJSON_AddNumberToObject(j, "model_check_tg_tps", x->check_tg_tps);
            if (x->rtt_us > 0) cJSON_AddNumberToObject(j, "rtt_us", x->rtt_us);
            if (x->verify_step_ratio > 0) {
                cJSON_AddNumberToObject(j, "step1_ms", x->step1_ms);
                cJSON_AddNumberToObject(j, "verify_step_ms", x->verify_step_ms);
                cJSON_AddNumberToObject(j, "verify_step_ratio", x->verify_step_ratio);
            }
            if (x->have_spec) {
                cJSON *sp = cJSON_AddObjectToObject(j, "spec");
                cJSON_AddBoolToObject(sp, "identical", x->spec_identical);
                cJSON_AddNumberToObject(sp, "acceptance", x->spec_acceptance);
                for (int v = 0; v < 2; v++) {
                    cJSON *q = cJSON_AddObjectToObject(sp, v ? "speculative" : "plain");
                    cJSON_AddNumberToObject(q, "tg_tps", x->spec_tps[v]);
                    cJSON_AddNumberToObject(q, "tokens_per_step", x->spec_tokens_per_step[v]);
                    cJSON_AddNumberToObject(q, "collectives_per_token", x->spec_collectives_per_token[v]);
                }
            }
        }
        cJSON_AddItemToArray(arr, j);
    }
    return root;
}

/* PREFIX.csv, .md, .json, .svg; the Markdown table is printed too. */
static enum tp_status nodes_report(const struct nodes_opts *o, const struct nodes_env *E,
                                   const struct node_run *runs, int n_runs, struct tp_error *err)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.csv", o->out);
    FILE *csv = fopen(path, "w");
    snprintf(path, sizeof path, "%s.md", o->out);
    FILE *md = fopen(path, "w");
    if (!csv || !md) {
        if (csv) fclose(csv);
        if (md) fclose(md);
        return tp_error_set(err, TP_ERR_IO, "cannot write %s.csv / %s.md", o->out, o->out);
    }
    nodes_csv(csv, runs, n_runs);
    nodes_md(md, o, E, runs, n_runs);
    fclose(csv);
    fclose(md);
    cJSON *root = nodes_json(o, E, runs, n_runs);
    char *js = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    snprintf(path, sizeof path, "%s.json", o->out);
    FILE *jf = fopen(path, "w");
    if (jf && js) fprintf(jf, "%s\n", js);
    if (jf) fclose(jf);
    free(js);
    snprintf(path, sizeof path, "%s.svg", o->out);
    char title[256];
    const char *base = strrchr(o->model, '/');
    snprintf(title, sizeof title, "%.120s: decode tokens/s vs nodes (%s)", base ? base + 1 : o->model,
             E->have_netsim ? o->link : "loopback");
    write_svg(path, runs, n_runs, title);
    snprintf(path, sizeof path, "%s.md", o->out);
    FILE *show = fopen(path, "r");
    if (show) {
        char line[1024];
        while (fgets(line, sizeof line, show)) fputs(line, stdout);
        fclose(show);
    }
    printf("\nwrote %s.csv %s.md %s.json %s.svg\n", o->out, o->out, o->out, o->out);
    return TP_OK;
}

/* ------------------------------------------------------------------ command */

int tp_bench_nodes(int argc, char **argv)
{
    struct nodes_opts o;
    struct node_run runs[NODES_MAX];
    int n_runs = 0;
    int rc = nodes_parse(argc, argv, &o, runs, &n_runs);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    struct nodes_env E;
    struct tp_error err = {0};
    if (nodes_setup(&o, argv[0], &E, &err) != TP_OK) {
        nodes_env_close(&E, 0);
        return tp_cli_fail("bench nodes", "%s", err.msg);
    }
    enum tp_status st = TP_OK;
    int failures = 0;
    for (int r = 0; r < n_runs && st == TP_OK; r++) {
        st = nodes_run_one(&o, &E, r, n_runs, &runs[r], &err);
        failures += !runs[r].ok;
    }
    nodes_env_close(&E, 1);
    if (st == TP_OK) {
        nodes_project(runs, n_runs);
        st = nodes_report(&o, &E, runs, n_runs, &err);
    }
    if (st != TP_OK) return tp_cli_fail("bench nodes", "%s", err.msg);
    nodes_env_close(&E, failures > 0);
    return failures ? 1 : 0;
}
