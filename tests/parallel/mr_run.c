/*
 * tests/parallel/mr_run.c - the multi-rank harness of mr_impl.h: fork one
 * process per rank, each forms a ring group on 127.0.0.1 (coordinator on a
 * per-run port), runs the engine and writes what it saw to files in the
 * test's temporary directory; the parent waits with a deadline, kills
 * whatever is left, and reads the files back.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/synth.h"
#include "mr_impl.h"
#include "tp_test.h"

static int g_run_no;

void mr_init(struct mr_run *r, const char *model, int world)
{
    memset(r, 0, sizeof *r);
    r->model = model;
    r->world = world;
    r->wire = TP_WIRE_F32;
    r->n_steps = 16;
    r->deadline_s = 60;
    for (int i = 0; i < MR_MAX_RANKS; i++) r->file_of_rank[i] = i;
}

void mr_free(struct mr_run *r)
{
    free(r->logits);
    r->logits = NULL;
}

double mr_nmse(const float *a, const float *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? num / den : num;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* What rank 0 writes: header then tokens then logits. */
struct mr_out {
    int32_t n_tokens, n_vocab;
    struct tp_parallel_stats stats;
    int32_t top_ids[8];
    float top_logits[8];
    float lse;
};
struct mr_info {
    uint64_t rss, plan_bytes, weight_bytes;
    int64_t split;
};

static int rank0_generate(tp_parallel_t *p, const struct mr_run *r, const char *dir)
{
    const int V = tp_parallel_hparams(p)->n_vocab;
    float *logits = malloc(2 * (size_t)V * sizeof(float));
    int32_t *t0 = calloc(MR_MAX_STEPS, sizeof(int32_t)), *t1 = calloc(MR_MAX_STEPS, sizeof(int32_t));
    /* gap, rms: sequence 0; then the same for sequence 1 */
    float *gap = calloc(4 * MR_MAX_STEPS, sizeof(float)), *rms = gap + MR_MAX_STEPS;
    if (!logits || !t0 || !t1 || !gap) return 4;
    /* prompts: seq 0 [1 5 9 14], seq 1 [1 7 3] */
    int32_t tok[8] = {1, 5, 9, 14, 1, 7, 3}, pos[8] = {0, 1, 2, 3, 0, 1, 2}, seq[8] = {0, 0, 0, 0, 1, 1, 1};
    int8_t want[8] = {0, 0, 0, 1, 0, 0, 1};
    int32_t clear_seq[1] = {1}, clear_from[1] = {0};
    int32_t copy_dst[1] = {1}, copy_src[1] = {0}, copy_len[1] = {0};
    int32_t *bias_row = calloc((size_t)r->n_bias + 1, sizeof(int32_t)); /* every entry on row 0: sequence 0 */
    if (!bias_row) return 4;
    struct tp_step st = {{7, tok, pos, seq, want}, 0, clear_seq, clear_from, 0, copy_dst, copy_src, copy_len,
                         r->n_bias, bias_row, r->bias_id, r->bias_val, 0, NULL, NULL};
    static const int32_t mask_row0[1] = {0};
    if (r->mask0) {
        st.n_mask = 1;
        st.mask_row = mask_row0;
        st.mask = r->mask0;
    }
    int p0 = 4, p1 = 3, rc = 0;
    int32_t ids[2];
    struct tp_parallel_cand top[16];
    float lse[2] = {0, 0};
    for (int s = 0; s <= r->n_steps && s < MR_MAX_STEPS; s++) {
        enum tp_status e = r->greedy_api == 2 ? tp_parallel_step_topk(p, &st, 8, top, lse)
                           : r->greedy_api ? tp_parallel_step_greedy(p, &st, ids, NULL)
                                           : tp_parallel_step(p, &st, logits);
        if (e == TP_OK && r->greedy_api == 2) {
            ids[0] = top[0].id;
            ids[1] = top[8].id;
        }
        if (e != TP_OK) {
            char m[512];
            snprintf(m, sizeof m, "%s", tp_parallel_last_error(p));
            char path[1024];
            snprintf(path, sizeof path, "%s/r0.err", dir);
            write_file(path, m, strlen(m));
            rc = 4;
            break;
        }
        if (r->kill_last_rank) tp_sleep_ms(5); /* keep generating until the peer has died */
        if (!r->greedy_api) {
            for (int q = 0; q < 2; q++) {
                const float *lq = logits + (size_t)q * V;
                ids[q] = argmax(lq, V);
                double second = -1e30, sq = 0;
                for (int i = 0; i < V; i++) {
                    if (i != ids[q] && lq[i] > second) second = lq[i];
                    sq += (double)lq[i] * lq[i];
                }
                gap[2 * q * MR_MAX_STEPS + s] = (float)(lq[ids[q]] - second);
                rms[2 * q * MR_MAX_STEPS + s] = (float)sqrt(sq / V);
            }
        }
        t0[s] = ids[0];
        t1[s] = ids[1];
        /* next step: one token per sequence; halfway, restart sequence 1 from its prompt's first token */
        st.n_clear = 0;
        st.n_copy = 0;
        tok[0] = r->force0 ? r->force0[s] : ids[0];
        pos[0] = p0++;
        seq[0] = 0;
        want[0] = 1;
        if (s == r->n_steps / 2 && r->copy_restart) {
            st.n_clear = 1;
            st.n_copy = 1;
            copy_len[0] = pos[0]; /* every position sequence 0 holds */
            p1 = pos[0];
            tok[1] = tok[0];
        } else if (s == r->n_steps / 2) {
            st.n_clear = 1;
            p1 = 0;
            tok[1] = 1;
        } else {
            tok[1] = ids[1];
        }
        pos[1] = p1++;
        seq[1] = 1;
        want[1] = 1;
        st.batch.n_tokens = 2;
    }
    struct mr_out o;
    memset(&o, 0, sizeof o);
    o.n_tokens = rc == 0 ? r->n_steps + 1 : 0;
    o.n_vocab = V;
    tp_parallel_get_stats(p, &o.stats);
    for (int j = 0; j < 8 && r->greedy_api == 2; j++) {
        o.top_ids[j] = top[j].id;
        o.top_logits[j] = top[j].logit;
    }
    o.lse = lse[0];
    char path[1024];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(&o, sizeof o, 1, f);
        fwrite(t0, sizeof(int32_t), MR_MAX_STEPS, f);
        fwrite(t1, sizeof(int32_t), MR_MAX_STEPS, f);
        fwrite(logits, sizeof(float), (size_t)V, f);
        fwrite(gap, sizeof(float), 4 * MR_MAX_STEPS, f);
        fclose(f);
    }
    free(bias_row);
    free(gap);
    free(logits);
    free(t0);
    free(t1);
    return rc;
}

/* Progress hook of the "slow disk" rank: sleeps once, at its first call. */
static void slow_progress(void *ctx, uint64_t done, uint64_t total)
{
    int *ms = ctx;
    (void)done;
    (void)total;
    if (*ms > 0) tp_sleep_ms((uint32_t)*ms);
    *ms = 0;
}

struct mr_hook {
    int rank;
    uint64_t weight_bytes;
};

static enum tp_status mr_hook_fn(void *ud, int32_t arg, double out[TP_PARALLEL_HOOK_VALUES])
{
    const struct mr_hook *h = ud;
    out[0] = h->rank;
    out[1] = arg;
    out[2] = (double)h->weight_bytes;
    out[3] = -1;
    return TP_OK;
}

static int child(const struct mr_run *r, int rank, int port, const char *dir)
{
    int slow_ms = r->slow_load_ms;
    char model[512], coord[64], path[1024];
    if (r->shard_files) snprintf(model, sizeof model, r->model, r->file_of_rank[rank]);
    else snprintf(model, sizeof model, "%s", r->model);
    snprintf(coord, sizeof coord, "127.0.0.1:%d", port);
    struct tp_parallel_config cfg = tp_parallel_default_config();
    cfg.model.path = model;
    cfg.model.n_threads = 1;
    cfg.model.n_ctx = 512;
    cfg.model.n_seq = 2;
    cfg.model.n_batch = 16;
    cfg.comm.backend = TP_COMM_BACKEND_RING;
    cfg.comm.rank = rank;
    cfg.comm.world_size = r->world;
    cfg.comm.coordinator = coord;
    cfg.comm.op_timeout_ms = r->op_timeout_ms ? r->op_timeout_ms : 10000;
    if (slow_ms > 0 && rank == r->world - 1) {
        cfg.model.progress = slow_progress;
        cfg.model.progress_ctx = &slow_ms;
    }
    cfg.comm.connect_timeout_ms = 15000;
    cfg.shard_weights = r->weights_last && rank == r->world - 1 ? r->weights_last : r->weights;
    cfg.wire_dtype = r->wire;
    cfg.moe_split = r->moe_split;
    tp_parallel_t *p = NULL;
    struct tp_error err = {0};
    if (tp_parallel_init(&cfg, &p, &err) != TP_OK) {
        snprintf(path, sizeof path, "%s/r%d.err", dir, rank);
        write_file(path, err.msg, strlen(err.msg));
        return 3;
    }
    const struct tp_shard_plan *plan = tp_parallel_get_plan(p);
    struct mr_info info = {tp_rss_bytes(), plan->ranks[rank].sharded_bytes + plan->ranks[rank].replicated_bytes,
                           tp_model_weight_bytes(tp_parallel_model(p)), (int64_t)plan->moe_split};
    snprintf(path, sizeof path, "%s/r%d.info", dir, rank);
    write_file(path, &info, sizeof info);
    int rc = 0;
    struct mr_hook hook = {rank, info.weight_bytes};
    if (r->hook && rank < r->world - 1) tp_parallel_set_hook(p, mr_hook_fn, &hook);
    if (rank == 0) {
        if (r->idle_ms > 0) tp_sleep_ms((uint32_t)r->idle_ms);
        if (r->hook) {
            double v[MR_MAX_RANKS * TP_PARALLEL_HOOK_VALUES];
            if (tp_parallel_run_hook(p, 42, v, r->world) != TP_OK) {
                snprintf(path, sizeof path, "%s/r0.err", dir);
                write_file(path, tp_parallel_last_error(p), strlen(tp_parallel_last_error(p)));
                tp_parallel_free(p);
                return 4;
            }
            snprintf(path, sizeof path, "%s/hook.bin", dir);
            write_file(path, v, sizeof(double) * TP_PARALLEL_HOOK_VALUES * (size_t)r->world);
        }
        rc = rank0_generate(p, r, dir);
    } else if (r->kill_last_rank && rank == r->world - 1) {
        /* dead peer: leave abruptly (no shutdown) after a short while */
        tp_sleep_ms(300);
        _exit(9);
    } else if (tp_parallel_worker_loop(p) != TP_OK) {
        snprintf(path, sizeof path, "%s/r%d.err", dir, rank);
        write_file(path, tp_parallel_last_error(p), strlen(tp_parallel_last_error(p)));
        rc = 4;
    }
    tp_parallel_free(p);
    uint64_t peak = tp_rss_peak_bytes();
    snprintf(path, sizeof path, "%s/r%d.peak", dir, rank);
    write_file(path, &peak, sizeof peak);
    return rc;
}

static void read_text(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

int mr_exec(struct mr_run *r)
{
    if (r->world < 1 || r->world > MR_MAX_RANKS) return -1;
    char dir[512];
    int run = ++g_run_no;
    snprintf(dir, sizeof dir, "%s/mr%d", tp_test_tmpdir(), run);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) return -1;
    int port = 20000 + (int)((getpid() * 37 + run * 11) % 12000); /* below the ephemeral range (32768+) */
    pid_t pids[MR_MAX_RANKS];
    double t0 = tp_now_s();
    fflush(NULL);
    for (int k = 0; k < r->world; k++) {
        pids[k] = fork();
        if (pids[k] < 0) return -1;
        if (pids[k] == 0) _exit(child(r, k, port, dir));
    }
    int left = r->world;
    int done[MR_MAX_RANKS] = {0};
    while (left > 0) {
        for (int k = 0; k < r->world; k++) {
            if (done[k]) continue;
            int status = 0;
            pid_t w = waitpid(pids[k], &status, WNOHANG);
            if (w == pids[k]) {
                done[k] = 1;
                left--;
                r->exit_code[k] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
        }
        if (left > 0 && tp_now_s() - t0 > r->deadline_s) {
            for (int k = 0; k < r->world; k++)
                if (!done[k]) {
                    kill(pids[k], SIGKILL);
                    waitpid(pids[k], NULL, 0);
                    r->exit_code[k] = -1;
                    done[k] = 1;
                }
            left = 0;
        }
        if (left > 0) tp_sleep_ms(5);
    }
    r->seconds = tp_now_s() - t0;
    char path[1024];
    for (int k = 0; k < r->world; k++) {
        snprintf(path, sizeof path, "%s/r%d.err", dir, k);
        read_text(path, r->msg[k], sizeof r->msg[k]);
        snprintf(path, sizeof path, "%s/r%d.info", dir, k);
        FILE *f = fopen(path, "rb");
        struct mr_info info;
        if (f && fread(&info, sizeof info, 1, f) == 1) {
            r->rss[k] = info.rss;
            r->plan_bytes[k] = info.plan_bytes;
            r->weight_bytes[k] = info.weight_bytes;
            if (k == 0) r->plan_split = (int)info.split;
        }
        if (f) fclose(f);
        snprintf(path, sizeof path, "%s/r%d.peak", dir, k);
        f = fopen(path, "rb");
        if (!f || fread(&r->rss_peak[k], sizeof r->rss_peak[k], 1, f) != 1) r->rss_peak[k] = 0;
        if (f) fclose(f);
    }
    for (size_t i = 0; i < sizeof r->hook_values / sizeof r->hook_values[0]; i++) r->hook_values[i] = NAN;
    snprintf(path, sizeof path, "%s/hook.bin", dir);
    FILE *hf = fopen(path, "rb");
    if (hf) {
        if (fread(r->hook_values, sizeof(double) * TP_PARALLEL_HOOK_VALUES, (size_t)r->world, hf) != (size_t)r->world)
            r->hook_values[0] = NAN;
        fclose(hf);
    }
    snprintf(path, sizeof path, "%s/out.bin", dir);
    FILE *f = fopen(path, "rb");
    struct mr_out o;
    if (f && fread(&o, sizeof o, 1, f) == 1 && o.n_vocab > 0 && o.n_vocab < (1 << 24)) {
        r->n_tokens = o.n_tokens;
        r->n_vocab = o.n_vocab;
        r->stats0 = o.stats;
        memcpy(r->top_ids, o.top_ids, sizeof r->top_ids);
        memcpy(r->top_logits, o.top_logits, sizeof r->top_logits);
        r->lse = o.lse;
        r->logits = malloc((size_t)o.n_vocab * sizeof(float));
        if (fread(r->tokens, sizeof(int32_t), MR_MAX_STEPS, f) != MR_MAX_STEPS ||
            fread(r->tokens1, sizeof(int32_t), MR_MAX_STEPS, f) != MR_MAX_STEPS || !r->logits ||
            fread(r->logits, sizeof(float), (size_t)o.n_vocab, f) != (size_t)o.n_vocab ||
            fread(r->gap0, sizeof(float), MR_MAX_STEPS, f) != MR_MAX_STEPS ||
            fread(r->rms0, sizeof(float), MR_MAX_STEPS, f) != MR_MAX_STEPS ||
            fread(r->gap1, sizeof(float), MR_MAX_STEPS, f) != MR_MAX_STEPS ||
            fread(r->rms1, sizeof(float), MR_MAX_STEPS, f) != MR_MAX_STEPS)
            r->n_tokens = 0;
    }
    if (f) fclose(f);
    if (r->exit_code[0] != 0 && strstr(r->msg[0], "in use")) {
        fprintf(stderr, "mr_exec: port %d in use, retrying on another\n", port);
        memset(r->exit_code, 0, sizeof r->exit_code);
        return mr_exec(r);
    }
    return 0;
}

const char *mr_synth_model(const char *tag, enum tp_wtype type)
{
    static char paths[8][512];
    static int n;
    char want[512];
    snprintf(want, sizeof want, "%s/synth-%s-%s.gguf", tp_test_tmpdir(), tag, tp_wtype_name(type));
    for (int i = 0; i < n; i++)
        if (strcmp(paths[i], want) == 0) return paths[i];
    if (n == 8) return NULL;
    struct tp_shape sh;
    memset(&sh, 0, sizeof sh);
    snprintf(sh.name, sizeof sh.name, "test-%s", tag);
    sh.arch = TP_ARCH_LLAMA;
    if (strncmp(tag, "test-", 5) == 0) { /* built-in test shapes (configs/shapes.json) */
        struct tp_error e = {0};
        if (tp_shape_find(NULL, tag, &sh, &e) != TP_OK) {
            fprintf(stderr, "mr_synth_model: %s\n", e.msg);
            return NULL;
        }
    } else if (strcmp(tag, "moe-mid") == 0) {
        /* a mid-size Qwen3-MoE (~115 MiB at Q4_0): 16 layers of 32 experts x 256 columns, top 4 */
        sh.arch = TP_ARCH_QWEN3MOE;
        sh.n_embd = 512;
        sh.n_layer = 16;
        sh.n_head = 8;
        sh.n_head_kv = 2;
        sh.head_dim = 64;
        sh.n_ff = 1024;
        sh.n_ff_exp = 256;
        sh.n_expert = 32;
        sh.n_expert_used = 4;
        sh.n_vocab = 4096;
        sh.n_ctx = 512;
        sh.rope_theta = 1000000.0f;
        sh.norm_eps = 1e-6f;
        sh.qk_norm = 1;
    } else if (strcmp(tag, "tinyllama4") == 0) {
        struct tp_error e = {0};
        if (tp_shape_find(NULL, "tinyllama-1.1b", &sh, &e) != TP_OK) return NULL;
        sh.n_layer = 4;
    } else {
        /* grouped-query attention, 8 Q heads / 2 KV heads (N=3,4 replicate KV heads), untied head */
        sh.n_embd = 128;
        sh.n_layer = 2;
        sh.n_head = 8;
        sh.n_head_kv = 2;
        sh.head_dim = 16;
        sh.n_ff = 256;
        sh.n_vocab = 512;
        sh.n_ctx = 512;
        sh.rope_theta = 10000.0f;
        sh.norm_eps = 1e-5f;
        sh.tied = 0;
    }
    /* gpt-oss as published: MXFP4 experts, Q8_0 else */
    const char *p = mr_synth_shape(&sh, type, type == TP_WTYPE_MXFP4 ? TP_SYNTH_MIX_MXFP4 : TP_SYNTH_MIX_NONE, 1234,
                                   want);
    if (!p) return NULL;
    snprintf(paths[n], sizeof paths[n], "%s", p);
    return paths[n++];
}

const char *mr_synth_shape(const struct tp_shape *sh, enum tp_wtype type, enum tp_synth_mix mix, uint64_t seed,
                           const char *path)
{
    static char paths[8][512];
    static int n;
    char *p = paths[n++ % 8];
    if (path)
        snprintf(p, sizeof paths[0], "%s", path);
    else
        snprintf(p, sizeof paths[0], "%s/synth-%s-%s-m%d-s%llu.gguf", tp_test_tmpdir(), sh->name, tp_wtype_name(type),
                 (int)mix, (unsigned long long)seed);
    struct tp_synth_config sc = tp_synth_default_config();
    sc.shape = sh;
    sc.n_layer = sh->n_layer;
    sc.type = type;
    sc.mix = mix;
    sc.seed = seed;
    sc.out_path = p;
    sc.n_threads = 2;
    struct tp_error e = {0};
    if (tp_synth_write(&sc, &e) != TP_OK) {
        fprintf(stderr, "synth %s: %s\n", sh->name, e.msg);
        return NULL;
    }
    return p;
}

int mr_near_ties(const struct mr_run *ref, double tau)
{
    int n = 0;
    for (int i = 0; i < ref->n_tokens && i < MR_MAX_STEPS; i++) n += ref->gap0[i] < tau * ref->rms0[i];
    return n;
}

int mr_near_tie_violations(const struct mr_run *ref, const struct mr_run *r, double tau, int forced, const char *what)
{
    int n = TP_MIN(TP_MIN(r->n_tokens, ref->n_tokens), MR_MAX_STEPS), n_bad = 0;
    for (int q = 0; q < 2; q++) {
        const int32_t *rt = q ? r->tokens1 : r->tokens, *ft = q ? ref->tokens1 : ref->tokens;
        const float *gap = q ? ref->gap1 : ref->gap0, *rms = q ? ref->rms1 : ref->rms0;
        const int every_step = forced && q == 0; /* only sequence 0 is teacher-forced */
        int first = -1, n_diff = 0;
        char steps[256] = "";
        for (int i = 0; i < n; i++) {
            if (rt[i] == ft[i]) continue;
            double rel = gap[i] / rms[i];
            if (first < 0) first = i;
            n_diff++;
            n_bad += !(rel < tau);
            size_t l = strlen(steps);
            if (l < sizeof steps - 40)
                snprintf(steps + l, sizeof steps - l, " %d (gap %.4f rms%s)", i, rel, rel < tau ? "" : ", NOT a near-tie");
            if (!every_step) break; /* free run: after a different token the sequences are different texts */
        }
        fprintf(stderr, "%s seq %d: %d of %d tokens as N=1%s%s\n", what, q,
                every_step ? n - n_diff : (first < 0 ? n : first), n, n_diff ? ", differing at" : "", steps);
    }
    return n_bad + (r->n_tokens != ref->n_tokens);
}
