/*
 * cli/cmd_serve.c - `tpserve serve`: load a model (this rank's slice) and
 * serve the OpenAI-compatible API on rank 0.
 *
 * Single machine: `tpserve serve -m MODEL`.  Under `tpserve launch -n N` or
 * mpirun the group comes from the environment (TP_RANK / TP_WORLD_SIZE /
 * TP_COORDINATOR ..., or OpenMPI's variables with TP_BACKEND=mpi): rank 0
 * serves HTTP and drives the engine, the other ranks run
 * tp_parallel_worker_loop() until rank 0 shuts down or fails.
 * HTTP comes up before the model loads, so /health answers 503 "loading".
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "server/spec.h"
#include "parallel/parallel.h"
#include "server/server.h"

static tp_server_t *g_server; /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    if (g_server) tp_server_stop(g_server);
}

/* Workers: SIGTERM/SIGINT (forwarded by launch / mpirun to every rank) give
 * rank 0 up to 10 s to shut the group down cleanly; then SIGALRM ends us.
 * A worker trying to rejoin a group has no rank 0 to wait for: it exits. */
static volatile sig_atomic_t g_rejoining; /* a worker between groups: no rank 0 to shut it down */
static volatile sig_atomic_t g_worker_sig; /* the stop signal a worker received, 0: none */

static void on_worker_signal(int sig)
{
    g_worker_sig = sig;
    if (g_rejoining) _exit(128 + sig);
    alarm(10);
}

static void json_log_hook(enum tp_log_level level, const char *module, const char *msg, void *user)
{
    (void)user;
    char line[2048];
    if (msg[0] == '{') {
        /* already a JSON object (per-request lines): add level and module */
        snprintf(line, sizeof line, "{\"level\":\"%s\",\"module\":\"%s\",%s\n", tp_log_level_str(level), module,
                 msg + 1);
        fputs(line, stderr);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    int ok = o && cJSON_AddStringToObject(o, "level", tp_log_level_str(level)) &&
             cJSON_AddStringToObject(o, "module", module) && cJSON_AddStringToObject(o, "msg", msg);
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    if (text) fprintf(stderr, "%s\n", text);
    else fputs("{\"level\":\"error\",\"module\":\"cli\",\"msg\":\"out of memory formatting a log line\"}\n", stderr);
    cJSON_free(text);
    cJSON_Delete(o);
}

/* Rank 0 of an MPI group: an MPI job cannot re-form in place, so once the
 * group failed (a rank died or stalled past the op timeout) rank 0 stops
 * serving and exits non-zero at once, naming the failure, for mpirun or
 * the scheduler (Slurm --requeue, Kubeflow restartPolicy) to restart the
 * job; see docs/recovery.md. */
struct mpi_watch {
    tp_parallel_t *p;
    tp_server_t *srv;
    atomic_int stop, failed;
};

static void *mpi_watch_main(void *arg)
{
    struct mpi_watch *w = arg;
    while (!atomic_load(&w->stop)) {
        if (tp_parallel_is_poisoned(w->p)) {
            atomic_store(&w->failed, 1);
            tp_log(TP_LOG_ERROR, "serve",
                   "the MPI group failed (%s); an MPI job cannot re-form in place: exiting so that mpirun or the "
                   "scheduler restarts the job",
                   tp_parallel_last_error(w->p));
            tp_server_stop(w->srv);
            break;
        }
        tp_sleep_ms(100);
    }
    return NULL;
}

/* Loading progress: the command line's, and rank 0's for GET /v1/cluster. */
struct serve_progress {
    struct tp_cli_progress cli;
    tp_server_t *srv; /* rank 0, else NULL */
};
static void serve_load_progress(void *ctx, uint64_t done, uint64_t total)
{
    struct serve_progress *p = ctx;
    tp_cli_load_progress(&p->cli, done, total);
    tp_server_load_progress(p->srv, done, total);
}

static char *read_key_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
    if (n == 0) return NULL;
    char *k = malloc(n + 1);
    if (k) memcpy(k, buf, n + 1);
    return k;
}

/* ------------------------------------------------------------------ parse */

/* "64G", "512M", "1.5T", "1048576": bytes (K/M/G/T binary); 0 on a malformed size. */
static uint64_t parse_size(const char *s)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (!s[0] || end == s || !(v > 0)) return 0;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i' && mul > 1) end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v * mul >= 1.8e19) return 0;
    return (uint64_t)(v * mul);
}

struct serve_opts {
    const char *model, *host, *api_key, *api_key_file, *tmpl, *log_format, *alias, *cors_origin, *shard_weights;
    const char *moe_split, *comm_dtype, *kv_type, *pooling, *logit_bias;
    int port, parallel, ctx, max_queue, threads, batch, chunk, share_min;
    uint64_t max_body, mem_budget;
    int max_conn, max_conn_ip, header_timeout, body_timeout, recover_wait, rejoin, resp_store;
    const char *on_rank_loss, *mem_limit; /* --on-rank-loss wait|replan, --mem-limit SIZE */
    int replan_after;
    const char *spec; /* --spec off|ngram|draft */
    const char *draft_model;
    int draft_max;
    const char *draft_placement; /* --draft-placement auto|rank0|sharded */
    float draft_mem_bw, draft_allsum_us; /* figures for its decision (0: measured at start) */
    uint64_t mem_limit_bytes;
    char *key_buf; /* --api-key-file's key (owned; api_key points at it) */
    /* generation defaults (llama-server's flags): NaN / INT_MIN / NULL when not given */
    float temp, top_p, min_p, repeat_penalty;
    int top_k, n_predict;
    const char *seed;
    struct tp_gen_defaults gen; /* the ones given, checked (serve_check) */
};

/* --temp --top-p --top-k --min-p --seed --n-predict --repeat-penalty into o->gen (the ranges the API takes
 * for the same fields): 0, or 2 after printing a usage error. */
static int serve_check_gen(struct serve_opts *o)
{
    struct tp_gen_defaults *g = &o->gen;
    memset(g, 0, sizeof *g);
    if (!isnan(o->temp)) {
        g->temperature = o->temp;
        g->set |= TP_GEN_TEMPERATURE;
    }
    if (!isnan(o->top_p)) {
        if (!(o->top_p > 0)) {
            fprintf(stderr, "tpserve serve: --top-p %g: want a number above 0 and at most 1 (1: off)\n", (double)o->top_p);
            return 2;
        }
        g->top_p = o->top_p;
        g->set |= TP_GEN_TOP_P;
    }
    if (o->top_k != INT_MIN) {
        g->top_k = o->top_k;
        g->set |= TP_GEN_TOP_K;
    }
    if (!isnan(o->min_p)) {
        g->min_p = o->min_p;
        g->set |= TP_GEN_MIN_P;
    }
    if (!isnan(o->repeat_penalty)) {
        if (!(o->repeat_penalty > 0)) {
            fprintf(stderr, "tpserve serve: --repeat-penalty %g: want a number above 0 and at most 10 (1: off)\n",
                    (double)o->repeat_penalty);
            return 2;
        }
        g->repeat_penalty = o->repeat_penalty;
        g->set |= TP_GEN_REPEAT_PENALTY;
    }
    if (o->n_predict != INT_MIN) {
        if (o->n_predict == 0 || o->n_predict < -1) {
            fprintf(stderr, "tpserve serve: --n-predict %d: want a token count of at least 1, or -1 for no limit\n",
                    o->n_predict);
            return 2;
        }
        g->n_predict = o->n_predict;
        g->set |= TP_GEN_N_PREDICT;
    }
    if (o->seed && strcmp(o->seed, "-1") != 0) { /* -1: a random seed per request, as without the flag */
        char *end = NULL;
        errno = 0;
        unsigned long long v = o->seed[0] == '-' ? 0 : strtoull(o->seed, &end, 10);
        if (o->seed[0] == '-' || errno || !end || *end || end == o->seed) {
            fprintf(stderr, "tpserve serve: --seed %s: want an integer from 0 to 18446744073709551615, or -1 for a "
                            "random seed per request\n", o->seed);
            return 2;
        }
        g->seed = (uint64_t)v;
        g->set |= TP_GEN_SEED;
    }
    return 0;
}

/* The values serve_parse read, checked (and --api-key-file read): 0, 2 after printing a usage error, or 3
 * after printing a run-time error. */
static int serve_check(struct serve_opts *o)
{
    if (!o->model) {
        fprintf(stderr, "tpserve serve: -m MODEL is required (e.g. -m models/stories260K.gguf)\n");
        return 2;
    }
    if (strcmp(o->log_format, "text") != 0 && strcmp(o->log_format, "json") != 0) {
        fprintf(stderr, "tpserve serve: --log-format %s: want text or json\n", o->log_format);
        return 2;
    }
    if (strcmp(o->pooling, "auto") && strcmp(o->pooling, "mean") && strcmp(o->pooling, "last") &&
        strcmp(o->pooling, "cls")) {
        fprintf(stderr, "tpserve serve: --pooling %s: want auto, mean, last or cls\n", o->pooling);
        return 2;
    }
    if (o->api_key && o->api_key_file) {
        fprintf(stderr, "tpserve serve: give --api-key or --api-key-file, not both\n");
        return 2;
    }
    if (o->max_body < 64 || o->max_body > (1ull << 32)) {
        fprintf(stderr, "tpserve serve: --max-body %llu: must be between 64 and 4294967296\n",
                (unsigned long long)o->max_body);
        return 2;
    }
    if (tp_spec_mode_parse(o->spec) < 0) {
        fprintf(stderr, "tpserve serve: --spec %s: want off, ngram or draft\n", o->spec);
        return 2;
    }
    if ((tp_spec_mode_parse(o->spec) == TP_SPEC_DRAFT) != (o->draft_model != NULL)) {
        fprintf(stderr, "tpserve serve: %s\n",
                o->draft_model ? "--draft-model needs --spec draft" : "--spec draft needs --draft-model FILE");
        return 2;
    }
    enum tp_draft_placement dp;
    struct tp_error perr = {0};
    if (tp_draft_placement_parse(o->draft_placement, &dp, &perr) != TP_OK) {
        fprintf(stderr, "tpserve serve: %s\n", perr.msg);
        return 2;
    }
    if (!(o->draft_mem_bw >= 0) || !(o->draft_allsum_us >= 0)) {
        fprintf(stderr, "tpserve serve: --draft-mem-bw and --draft-allsum-us take figures >= 0 (0: measured)\n");
        return 2;
    }
    if (strcmp(o->on_rank_loss, "wait") != 0 && strcmp(o->on_rank_loss, "replan") != 0) {
        fprintf(stderr, "tpserve serve: --on-rank-loss %s: want wait or replan\n", o->on_rank_loss);
        return 2;
    }
    if (serve_check_gen(o)) return 2;
    o->mem_limit_bytes = o->mem_limit ? parse_size(o->mem_limit) : 0;
    if (o->mem_limit && !o->mem_limit_bytes) {
        fprintf(stderr, "tpserve serve: --mem-limit %s: want a size such as 48G, 512M or a byte count\n",
                o->mem_limit);
        return 2;
    }
    if (o->api_key_file) {
        o->key_buf = read_key_file(o->api_key_file);
        if (!o->key_buf) {
            tp_cli_fail("serve", "--api-key-file %s: cannot read a key from it", o->api_key_file);
            return 3;
        }
        o->api_key = o->key_buf;
    }
    return 0;
}

/* Parse argv into o (reading --api-key-file).  Returns 0 to go on, 1 after --help, 2 after printing a
 * usage error, or 3 after printing a run-time error (exit 1); o->key_buf is freed by the caller. */
static int serve_parse(int argc, char **argv, struct serve_opts *o)
{
    *o = (struct serve_opts){.host = "127.0.0.1", .log_format = "text", .moe_split = "auto", .comm_dtype = "f32",
                             .kv_type = "auto", .port = 8080, .parallel = 8, .max_queue = 64, .batch = 256,
                             .chunk = 64, .share_min = 32, .max_body = 1u << 20, .mem_budget = (uint64_t)256 << 20,
                             .max_conn = 256, .max_conn_ip = 32, .header_timeout = 10, .body_timeout = 30,
                             .recover_wait = 60, .pooling = "auto", .resp_store = 256, .on_rank_loss = "wait",
                             .replan_after = 10, .spec = "off", .draft_max = 4, .draft_placement = "auto",
                             .temp = NAN, .top_p = NAN,
                             .min_p = NAN, .repeat_penalty = NAN, .top_k = INT_MIN, .n_predict = INT_MIN};
    const struct tp_opt opts[] = {
        {"model", 'm', TP_OPT_STRING, &o->model, "FILE", "GGUF model (or this rank's shard file)", 0, 0},
        {"host", 0, TP_OPT_STRING, &o->host, "ADDR", "IPv4 address to listen on (default 127.0.0.1)", 0, 0},
        {"port", 0, TP_OPT_INT, &o->port, "N", "TCP port (default 8080; 0: any free port)", 0, 65535},
        {"parallel", 0, TP_OPT_INT, &o->parallel, "N", "sequences generated together (default 8)", 1, 256},
        {"ctx-size", 'c', TP_OPT_INT, &o->ctx, "N", "context tokens per sequence (default min(train, 4096))", 0,
         1 << 20},
        {"batch-size", 'b', TP_OPT_INT, &o->batch, "N", "max tokens per engine step / prefill chunk (default 256)", 1,
         1 << 16},
        {"prefill-chunk", 0, TP_OPT_INT, &o->chunk, "N",
         "prompt tokens per step while other sequences generate (default 64; 0: --batch-size)", 0, 1 << 16},
        {"prefix-share-min", 0, TP_OPT_INT, &o->share_min, "N",
         "copy a prompt prefix held in another slot's KV cache when it saves at least N more tokens than the "
         "slot's own cache (default 32; 0: off)",
         0, 1 << 20},
        {"api-key", 0, TP_OPT_STRING, &o->api_key, "KEY", "require 'Authorization: Bearer KEY'", 0, 0},
        {"api-key-file", 0, TP_OPT_STRING, &o->api_key_file, "FILE", "read the API key from FILE", 0, 0},
        {"max-body", 0, TP_OPT_U64, &o->max_body, "BYTES", "largest request body (default 1048576)", 0, 0},
        {"mem-budget", 0, TP_OPT_U64, &o->mem_budget, "BYTES",
         "memory for request bodies in flight, each charged 10x its body + 256 KiB; over it 503 (default 268435456)",
         0, 0},
        {"max-connections", 0, TP_OPT_INT, &o->max_conn, "N", "open HTTP connections (default 256)", 4, 100000},
        {"max-conn-per-ip", 0, TP_OPT_INT, &o->max_conn_ip, "N",
         "open HTTP connections per client address (default 32)", 1, 100000},
        {"header-timeout", 0, TP_OPT_INT, &o->header_timeout, "S",
         "seconds for a client to send a complete header block (default 10)", 1, 3600},
        {"body-timeout", 0, TP_OPT_INT, &o->body_timeout, "S",
         "seconds for a client to send a request body after its headers (default 30)", 1, 3600},
        {"recover-wait", 0, TP_OPT_INT, &o->recover_wait, "S",
         "rank 0: after a worker is lost, queued requests wait this long for the group to re-form, then 503 "
         "(default 60; see docs/recovery.md)",
         1, 86400},
        {"on-rank-loss", 0, TP_OPT_STRING, &o->on_rank_loss, "MODE",
         "rank 0: wait (default) for a lost worker to rejoin, or replan: once it has been gone --replan-after "
         "seconds and the surviving ranks have the memory, go on without it (see docs/recovery.md)",
         0, 0},
        {"replan-after", 0, TP_OPT_INT, &o->replan_after, "S",
         "rank 0, --on-rank-loss replan: how long a lost worker may take to come back first (default 10)", 1, 86400},
        {"mem-limit", 0, TP_OPT_STRING, &o->mem_limit, "SIZE",
         "memory this rank offers the model (weights + KV cache, e.g. 48G) when rank 0 decides whether the "
         "survivors can hold it without a lost rank (default: its machine's memory less a reserve)",
         0, 0},
        {"rejoin", 0, TP_OPT_FLAG, &o->rejoin, NULL,
         "workers: when the group fails, rejoin rank 0's next group epoch instead of exiting (set by "
         "'tpserve launch --restart'; also TP_REJOIN=1)",
         0, 0},
        {"pooling", 0, TP_OPT_STRING, &o->pooling, "MODE",
         "/v1/embeddings pooling: auto (the model's GGUF pooling_type, else mean), mean, last, cls", 0, 0},
        {"logit-bias", 0, TP_OPT_STRING, &o->logit_bias, "ID+B,...",
         "logit bias for every request that sends none, as llama-server's: TOKEN_ID+BIAS or TOKEN_ID-BIAS, "
         "comma-separated (-100 bans the token)", 0, 0},
        {"responses-store", 0, TP_OPT_INT, &o->resp_store, "N",
         "finished /v1/responses kept in memory for previous_response_id, oldest evicted first (default 256; 0: "
         "none)", 0, 1 << 20},
        {"temp", 0, TP_OPT_FLOAT, &o->temp, "T",
         "temperature of every request (any API) that sends none, 0..2 (0: greedy; default: the model's "
         "recommendation (GGUF general.sampling.temp, generation_config.json), else 1)", 0, 2},
        {"top-p", 0, TP_OPT_FLOAT, &o->top_p, "P", "top_p of requests that send none, (0, 1] (default: the model's, "
         "else 1: off)", 0, 1},
        {"top-k", 0, TP_OPT_INT, &o->top_k, "K", "top_k of requests that send none (default: the model's, else 0: off)",
         0, 1 << 30},
        {"min-p", 0, TP_OPT_FLOAT, &o->min_p, "P", "min_p of requests that send none, 0..1 (default: the model's, "
         "else 0: off)", 0, 1},
        {"repeat-penalty", 0, TP_OPT_FLOAT, &o->repeat_penalty, "R",
         "repetition penalty of requests that send none, (0, 10] (default: the model's, else 1: off)", 0, 10},
        {"seed", 0, TP_OPT_STRING, &o->seed, "N",
         "seed of requests that send none: 0..2^64-1, or -1 (default): a random seed per request", 0, 0},
        {"n-predict", 'n', TP_OPT_INT, &o->n_predict, "N",
         "reply token limit of requests that set none (max_tokens, num_predict ...), lowered to what fits in the "
         "context; -1: no limit but the end of text and the context (default: the model's max_new_tokens, else -1)",
         -1, 1 << 24},
        {"max-queue", 0, TP_OPT_INT, &o->max_queue, "N", "waiting requests before 429 (default 64)", 1, 1 << 20},
        {"threads", 't', TP_OPT_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 4096},
        {"chat-template", 0, TP_OPT_STRING, &o->tmpl, "NAME",
         "llama2|llama3|chatml|qwen3|mistral|zephyr|plain (default: from the model)", 0, 0},
        {"alias", 0, TP_OPT_STRING, &o->alias, "NAME", "model id reported by /v1/models", 0, 0},
        {"log-format", 0, TP_OPT_STRING, &o->log_format, "FMT", "text|json (per-request log lines)", 0, 0},
        {"cors-origin", 0, TP_OPT_STRING, &o->cors_origin, "ORIGIN",
         "let a web app served from ORIGIN (e.g. https://app.example.com, or *) call this API (default: off)", 0,
         0},
        {"comm-dtype", 0, TP_OPT_STRING, &o->comm_dtype, "T",
         "under launch/mpirun: f32|f16|bf16|q8 activations on the wire", 0, 0},
        {"kv-type", 0, TP_OPT_STRING, &o->kv_type, "T", TP_CLI_KV_TYPE_HELP, 0, 0},
        {"shard-weights", 0, TP_OPT_LIST, &o->shard_weights, "W,W,..",
         "under launch/mpirun: share per rank, e.g. from 'tpserve plan' (default equal)", 0, 0},
        {"moe-split", 0, TP_OPT_STRING, &o->moe_split, "S", TP_CLI_MOE_SPLIT_HELP, 0, 0},
        {"spec", 0, TP_OPT_STRING, &o->spec, "MODE",
         "speculative decoding of requests that do not say (\"speculative\": true|false): off (default), ngram "
         "(draft from the prompt and output so far) or draft (a smaller model drafts: --draft-model); every draft "
         "is verified in one step (docs/speculative.md)",
         0, 0},
        {"draft-model", 0, TP_OPT_STRING, &o->draft_model, "FILE",
         "--spec draft: a smaller GGUF with the model's vocabulary (every rank gives the same)", 0, 0},
        {"draft-max", 0, TP_OPT_INT, &o->draft_max, "K", "drafted tokens per sequence and step, 1..16 (default 4)", 1,
         TP_SPEC_DRAFT_MAX},
        {"draft-placement", 0, TP_OPT_STRING, &o->draft_placement, "P", TP_CLI_DRAFT_PLACEMENT_HELP, 0, 0},
        {"draft-mem-bw", 0, TP_OPT_FLOAT, &o->draft_mem_bw, "GBS", TP_CLI_DRAFT_MEM_BW_HELP, 0, 0},
        {"draft-allsum-us", 0, TP_OPT_FLOAT, &o->draft_allsum_us, "US", TP_CLI_DRAFT_ALLSUM_HELP, 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0},
    };
    int pr = tp_cli_parse("serve", "Usage: tpserve serve -m MODEL [options]", opts, argc, argv, NULL, 0, NULL, NULL,
                          NULL);
    return pr ? pr : serve_check(o);
}

/* ------------------------------------------------------------------ run */

static struct tp_server_config serve_server_config(const struct serve_opts *o, const struct tp_parallel_config *pc)
{
    struct tp_server_config sc = tp_server_default_config();
    sc.host = o->host;
    sc.port = o->port;
    sc.n_parallel = o->parallel;
    sc.max_queue = o->max_queue;
    sc.max_body_bytes = (size_t)o->max_body;
    sc.mem_budget_bytes = (size_t)o->mem_budget;
    sc.max_connections = o->max_conn;
    sc.max_conn_per_ip = o->max_conn_ip;
    sc.header_timeout_s = (unsigned)o->header_timeout;
    sc.body_timeout_s = (unsigned)o->body_timeout;
    sc.api_key = o->api_key;
    sc.chat_template = o->tmpl;
    sc.model_id = o->alias;
    sc.log_json = strcmp(o->log_format, "json") == 0;
    sc.n_batch = pc->model.n_batch;
    sc.prefill_chunk = o->chunk;
    sc.prefix_share_min = o->share_min;
    sc.recover_wait_s = (unsigned)o->recover_wait;
    sc.on_rank_loss_replan = strcmp(o->on_rank_loss, "replan") == 0;
    sc.replan_after_s = (unsigned)o->replan_after;
    sc.responses_store = o->resp_store;
    sc.pooling = strcmp(o->pooling, "mean") == 0 ? 1 : strcmp(o->pooling, "last") == 0 ? 2 : strcmp(o->pooling, "cls") == 0 ? 3 : 0;
    sc.cors_origin = o->cors_origin;
    sc.spec = tp_spec_mode_parse(o->spec);
    sc.draft_max = o->draft_max;
    sc.draft_model = o->draft_model;
    sc.logit_bias = o->logit_bias;
    sc.gen = o->gen;
    return sc;
}

/* A worker: run steps until rank 0 shuts down; with rejoin, a failed group is rejoined in rank 0's next
 * epoch (for up to the connect timeout).  Returns the exit code. */
static int serve_worker(tp_parallel_t *p, const struct tp_parallel_config *pc, int rejoin)
{
    signal(SIGINT, on_worker_signal);
    signal(SIGTERM, on_worker_signal);
    const char *rj = getenv("TP_REJOIN");
    if (rj && strcmp(rj, "1") == 0) rejoin = 1;
    enum tp_status st;
    while ((st = tp_parallel_worker_loop(p)) != TP_OK && rejoin) {
        /* rank 0 re-forms the group in a new epoch; join it, keeping our slice */
        uint32_t window_ms = pc->comm.connect_timeout_ms ? pc->comm.connect_timeout_ms : 60000;
        uint64_t give_up = tp_now_ns() + (uint64_t)window_ms * 1000000ull;
        tp_log(TP_LOG_WARN, "serve", "the group failed (%s); rejoining rank 0 (for up to %u s)",
               tp_parallel_last_error(p), window_ms / 1000);
        g_rejoining = 1;
        if (g_worker_sig) _exit(128 + g_worker_sig); /* told to stop before the group failed */
        for (;;) {
            uint64_t now = tp_now_ns();
            uint32_t left_ms = now < give_up ? (uint32_t)((give_up - now) / 1000000u) : 0;
            if (left_ms == 0) break;
            st = tp_parallel_rejoin(p, TP_MIN(left_ms, 5000u));
            if (st == TP_OK || st == TP_ERR_UNSUPPORTED || st == TP_ERR_CANCELLED) break;
            tp_sleep_ms(100);
        }
        g_rejoining = 0;
        if (st != TP_OK) break;
        tp_log(TP_LOG_INFO, "serve", "rejoined the group (epoch %u)", tp_parallel_epoch(p));
    }
    if (st == TP_OK) return 0;
    tp_cli_fail("serve", "worker stopped: %s", tp_parallel_last_error(p));
    return st == TP_ERR_CANCELLED ? TP_CLI_EXIT_LEFT_OUT : tp_cli_exit_for(st);
}

/* Rank 0: start the engine and serve until stopped (with MPI, a watch thread ends the server when the
 * group fails).  Returns the exit code. */
static int serve_rank0(tp_server_t *srv, tp_parallel_t *p, const struct tp_parallel_config *pc, const char *host)
{
    struct tp_error err = {0};
    if (tp_server_start(srv, p, &err) != TP_OK) return tp_cli_fail("serve", "%s", err.msg);
    printf("tpserve: serving on http://%s:%d/v1\n", host, tp_server_port(srv));
    fflush(stdout);
    int code = 0;
    struct mpi_watch w = {.p = p, .srv = srv};
    atomic_init(&w.stop, 0);
    atomic_init(&w.failed, 0);
    pthread_t wt;
    int watching = tp_parallel_size(p) > 1 && pc->comm.backend == TP_COMM_BACKEND_MPI &&
                   pthread_create(&wt, NULL, mpi_watch_main, &w) == 0;
    tp_server_run(srv);
    if (watching) {
        atomic_store(&w.stop, 1);
        pthread_join(wt, NULL);
        if (atomic_load(&w.failed)) code = 1;
    }
    tp_log(TP_LOG_INFO, "server", "shutting down");
    return code;
}

/* ------------------------------------------------------------------ command */

int tp_cmd_serve(int argc, char **argv)
{
    struct serve_opts o;
    int pr = serve_parse(argc, argv, &o);
    if (pr) {
        free(o.key_buf);
        return pr == 3 ? 1 : pr == 1 ? 0 : pr;
    }
    struct tp_error err = {0};
    struct tp_parallel_config pc = tp_parallel_default_config();
    pc.model.path = o.model;
    pc.model.n_threads = o.threads;
    pc.model.n_ctx = o.ctx;
    pc.model.n_seq = o.parallel;
    pc.model.n_batch = TP_MAX(o.batch, o.parallel);
    pc.shard_weights = o.shard_weights;
    pc.mem_limit_bytes = o.mem_limit_bytes;
    pc.draft_path = o.draft_model;
    (void)tp_draft_placement_parse(o.draft_placement, &pc.draft_placement, NULL); /* checked by serve_check */
    pc.draft_mem_bw_gbs = o.draft_mem_bw;
    pc.draft_allsum_us = o.draft_allsum_us;
    if (tp_moe_split_parse(o.moe_split, &pc.moe_split, &err) != TP_OK) {
        free(o.key_buf);
        return tp_cli_fail("serve", "%s", err.msg);
    }
    const char *prefix = NULL;
    int rank_hint = 0;
    int grc = tp_cli_group_config("serve", o.comm_dtype, o.kv_type, &pc, &rank_hint, &prefix);
    if (grc) {
        free(o.key_buf);
        return grc == 1 ? 2 : 1; /* bad --comm-dtype: usage error; bad environment: 1 */
    }
    if (strcmp(o.on_rank_loss, "replan") == 0 && pc.comm.world_size != 1 && pc.comm.backend != TP_COMM_BACKEND_RING) {
        /* docs/recovery.md: an MPI job cannot re-form in place at all; rdma re-forms at its size only */
        fprintf(stderr, "tpserve serve: --on-rank-loss replan does not apply to --backend %s: %s (use --backend ring, "
                        "or --on-rank-loss wait)\n", tp_comm_backend_name(pc.comm.backend),
                pc.comm.backend == TP_COMM_BACKEND_MPI
                    ? "an MPI job cannot re-form in place; mpirun or the scheduler restarts the whole job"
                    : "only the ring backend can form a group with fewer ranks");
        free(o.key_buf);
        return 2;
    }
    tp_cli_setup_logging(prefix);
    if (strcmp(o.log_format, "json") == 0) tp_log_set_hook(json_log_hook, NULL);
    signal(SIGPIPE, SIG_IGN);

    tp_server_t *srv = NULL; /* rank 0: HTTP answers 503 "loading" while the model loads */
    tp_parallel_t *p = NULL;
    int code = 1;
    if (rank_hint == 0) {
        struct tp_server_config sc = serve_server_config(&o, &pc);
        if (tp_server_init(&sc, &srv, &err) != TP_OK) {
            tp_cli_fail("serve", "%s", err.msg);
            goto out;
        }
        g_server = srv;
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        tp_log(TP_LOG_INFO, "server", "listening on http://%s:%d (loading %s)", o.host, tp_server_port(srv), o.model);
    }
    static struct serve_progress load_progress;
    tp_cli_progress_init(&load_progress.cli, prefix);
    load_progress.srv = srv;
    pc.model.progress = serve_load_progress;
    pc.model.progress_ctx = &load_progress;
    enum tp_status irc = tp_parallel_init(&pc, &p, &err);
    if (irc != TP_OK) {
        tp_cli_fail("serve", "%s", err.msg);
        if (irc == TP_ERR_CANCELLED && rank_hint > 0) code = TP_CLI_EXIT_LEFT_OUT; /* left out by a re-plan */
    } else if (tp_parallel_rank(p) != 0) {
        code = serve_worker(p, &pc, o.rejoin);
    } else if (!srv) { /* rank 0 by MPI but the hint said otherwise: cannot happen with sane env */
        tp_cli_fail("serve", "rank mismatch between the environment and the group");
    } else {
        code = serve_rank0(srv, p, &pc, o.host);
    }
out:
    g_server = NULL;
    tp_server_free(srv);
    tp_parallel_free(p);
    free(o.key_buf);
    return code;
}
