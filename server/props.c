/*
 * server/props.c - what the server tells clients about itself without being
 * asked per request, as llama-server does:
 *   - the generation defaults every request of every API starts from
 *     (tp_server_gen_init): `serve --temp --top-p --top-k --min-p --seed
 *     --n-predict --repeat-penalty`, else the model's recommended settings
 *     (GGUF general.sampling.*, generation_config.json), else the engine's;
 *   - system_fingerprint (tp_server_identity_init): "fp_" and 10 hex digits
 *     of SHA-256 over the build (version, commit) and the model's identity,
 *     itself SHA-256 over the model file's size, its first 16 MiB (a GGUF's
 *     header, metadata and tensor table) and 4 KiB at 16 offsets spread over
 *     the file (an HF directory: each file's name, size and first 1 MiB), so
 *     it is computed in milliseconds, never by reading the weights, and is
 *     the same across restarts of one build with one model;
 *   - GET /props: llama-server's shape (default_generation_settings, total_slots,
 *     model_path, chat_template, build_info ...) with the model's metadata.
 */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "http_impl.h"
#include "model/tensor_source.h"
#include "tp_build_info.h"

#define HEAD_BYTES ((uint64_t)16 << 20)      /* a file's first bytes hashed: metadata and tensor table */
#define SAMPLE_BYTES 4096                    /* bytes hashed at each sampled offset */
#define N_SAMPLES 16
#define DIR_FILE_HEAD_BYTES ((uint64_t)1 << 20) /* HF directory: each file's first bytes (safetensors header) */
#define DIR_MAX_FILES 512

double tp_srv_num(float x) { return round((double)x * 1e6) / 1e6; }

uint64_t tp_srv_n_params(const struct tp_hparams *hp)
{
    uint64_t d = (uint64_t)hp->n_embd, q = (uint64_t)hp->n_head * (uint64_t)hp->head_dim;
    uint64_t kv = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    uint64_t ne = hp->n_expert > 0 ? (uint64_t)hp->n_expert : 1;
    uint64_t layer = 2 * d * q + 2 * d * kv + 3 * d * (uint64_t)hp->n_ff * ne + 3 * d * (uint64_t)hp->n_ff_shexp +
                     (hp->n_expert > 0 ? d * ne : 0) + 2 * d;
    return (uint64_t)hp->n_vocab * d * (hp->tied_embeddings ? 1 : 2) + (uint64_t)hp->n_layer * layer + d;
}

/* ------------------------------------------------------------ generation defaults */

void tp_server_gen_init(struct tp_server *s)
{
    /* the engine's own defaults (json_validate.c tp_req_parse) */
    struct tp_gen_defaults g = {.set = 0, .temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .min_p = 0.0f,
                                .repeat_penalty = 1.0f, .seed = 0, .n_predict = -1};
    for (int i = 0; i < 7; i++) s->gen_from[i] = "built-in";
    struct tp_model_gen_defaults md;
    struct tp_error err = {0};
    const char *path = tp_parallel_model_path(s->par);
    if (tp_model_gen_defaults_read(path, &md, &err) != TP_OK) {
        tp_log(TP_LOG_WARN, "server", "the model's recommended generation settings are not used: %s", err.msg);
        memset(&md, 0, sizeof md);
    }
    snprintf(s->model_gen_source, sizeof s->model_gen_source, "%s", md.set ? md.source : "");
    static const unsigned model_bits[7] = {TP_MODEL_GEN_TEMPERATURE, TP_MODEL_GEN_TOP_P, TP_MODEL_GEN_TOP_K,
                                           TP_MODEL_GEN_MIN_P, TP_MODEL_GEN_REPEAT_PENALTY, 0,
                                           TP_MODEL_GEN_MAX_NEW_TOKENS};
    const struct tp_gen_defaults *c = &s->cfg.gen;
    for (int i = 0; i < 7; i++) {
        const unsigned bit = 1u << i;
        int from_cli = (c->set & bit) != 0, from_model = !from_cli && (md.set & model_bits[i]);
        if (!from_cli && !from_model) continue;
        g.set |= bit;
        s->gen_from[i] = from_cli ? "command line" : s->model_gen_source;
        switch (bit) {
        case TP_GEN_TEMPERATURE: g.temperature = from_cli ? c->temperature : md.temperature; break;
        case TP_GEN_TOP_P: g.top_p = from_cli ? c->top_p : md.top_p; break;
        case TP_GEN_TOP_K: g.top_k = from_cli ? c->top_k : md.top_k; break;
        case TP_GEN_MIN_P: g.min_p = from_cli ? c->min_p : md.min_p; break;
        case TP_GEN_REPEAT_PENALTY: g.repeat_penalty = from_cli ? c->repeat_penalty : md.repeat_penalty; break;
        case TP_GEN_SEED: g.seed = c->seed; break;
        case TP_GEN_N_PREDICT: g.n_predict = from_cli ? c->n_predict : md.max_new_tokens; break;
        default: break;
        }
    }
    /* a model's temperature above the API's 0..2 range is clamped there */
    if (g.temperature > 2.0f) g.temperature = 2.0f;
    if (g.n_predict <= 0) g.n_predict = -1;
    s->gen = g;
    if (g.set)
        tp_log(TP_LOG_INFO, "server",
               "generation defaults: temperature %g, top_p %g, top_k %d, min_p %g, repeat_penalty %g, seed %s, "
               "n_predict %d%s%s", (double)g.temperature, (double)g.top_p, g.top_k, (double)g.min_p,
               (double)g.repeat_penalty, (g.set & TP_GEN_SEED) ? "fixed" : "random", g.n_predict,
               md.set ? "; the model's from " : "", md.set ? md.source : "");
}

/* ------------------------------------------------------------ identity */

static void sha_hex(const unsigned char *d, unsigned n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (unsigned i = 0; i < n; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Hash [off, off + n) of fd (what can be read of it). */
static void hash_range(EVP_MD_CTX *md, int fd, uint64_t off, uint64_t n, unsigned char *buf, size_t cap)
{
    while (n > 0) {
        size_t want = (size_t)TP_MIN((uint64_t)cap, n);
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got <= 0) return;
        EVP_DigestUpdate(md, buf, (size_t)got);
        off += (uint64_t)got;
        n -= (uint64_t)got;
    }
}

/* One regular file: its size, first head bytes and (samples) SAMPLE_BYTES at N_SAMPLES spread offsets. */
static void hash_file(EVP_MD_CTX *md, const char *path, uint64_t head, int samples, unsigned char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return;
    }
    uint64_t size = (uint64_t)st.st_size;
    EVP_DigestUpdate(md, &size, sizeof size);
    hash_range(md, fd, 0, TP_MIN(head, size), buf, cap);
    if (samples && size > head + SAMPLE_BYTES) {
        uint64_t span = size - head - SAMPLE_BYTES;
        for (int k = 0; k < N_SAMPLES; k++)
            hash_range(md, fd, head + span / (N_SAMPLES - 1) * (uint64_t)k, SAMPLE_BYTES, buf, cap);
    }
    close(fd);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* An HF directory: its regular files in name order, each as name, size and first DIR_FILE_HEAD_BYTES. */
static void hash_dir(EVP_MD_CTX *md, const char *dir, unsigned char *buf, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[DIR_MAX_FILES];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < DIR_MAX_FILES) {
        if (de->d_name[0] == '.') continue;
        if (!(names[n] = strdup(de->d_name))) break;
        n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            EVP_DigestUpdate(md, names[i], strlen(names[i]) + 1);
            hash_file(md, p, DIR_FILE_HEAD_BYTES, 0, buf, cap);
        }
        free(names[i]);
    }
}

void tp_server_identity_init(struct tp_server *s)
{
    snprintf(s->build_info, sizeof s->build_info, "b%d-%s", TP_BUILD_NUMBER, TP_BUILD_COMMIT);
    const char *path = tp_parallel_model_path(s->par);
    unsigned char dg[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    const size_t cap = 1 << 16;
    unsigned char *buf = malloc(cap);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    s->model_sha[0] = s->fingerprint[0] = '\0';
    if (buf && md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1) {
        struct stat st;
        if (path && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) hash_dir(md, path, buf, cap);
        else if (path) hash_file(md, path, HEAD_BYTES, 1, buf, cap);
        if (EVP_DigestFinal_ex(md, dg, &n) == 1 && n == 32) sha_hex(dg, n, s->model_sha);
    }
    if (md && s->model_sha[0] && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1) {
        char build[160];
        snprintf(build, sizeof build, "tpserve %s %s", TP_VERSION_STRING, TP_BUILD_COMMIT);
        EVP_DigestUpdate(md, build, strlen(build) + 1);
        EVP_DigestUpdate(md, s->model_sha, strlen(s->model_sha));
        if (EVP_DigestFinal_ex(md, dg, &n) == 1 && n == 32) {
            char hex[65];
            sha_hex(dg, n, hex);
            snprintf(s->fingerprint, sizeof s->fingerprint, "fp_%.10s", hex);
        }
    }
    EVP_MD_CTX_free(md);
    free(buf);
    if (!s->fingerprint[0]) tp_log(TP_LOG_WARN, "server", "system_fingerprint unavailable (the model file could not be read)");
}

/* ------------------------------------------------------------ GET /props */

static const char *chat_template_source(const struct tp_server *s, const char *tmpl)
{
    if (s->cfg.chat_template) return "--chat-template";
    if (!tmpl || !tmpl[0]) return "fallback (the model has no chat template)";
    return "model";
}

static void add_piece(struct tp_server *s, cJSON *o, const char *key, int id)
{
    size_t l = 0;
    const char *p = id >= 0 ? tp_tokenizer_piece(s->tok, id, &l) : NULL;
    tp_json_add_bytes(o, key, p ? p : "", p ? l : 0);
}

enum MHD_Result tp_api_props(struct tp_server *s, struct MHD_Connection *c)
{
    tp_model_t *m = tp_parallel_model(s->par);
    const struct tp_hparams *hp = tp_model_hparams(m);
    const char *tmpl = tp_model_chat_template(m);
    const char *path = tp_parallel_model_path(s->par);
    const struct tp_gen_defaults *g = &s->gen;
    cJSON *o = cJSON_CreateObject();
    if (!o) return MHD_NO;

    cJSON *dgs = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(dgs, "n_ctx", s->n_ctx);
    cJSON *pr = cJSON_AddObjectToObject(dgs, "params");
    cJSON_AddNumberToObject(pr, "n_predict", g->n_predict);
    cJSON_AddNumberToObject(pr, "max_tokens", g->n_predict);
    if (g->set & TP_GEN_SEED) cJSON_AddNumberToObject(pr, "seed", (double)g->seed);
    else cJSON_AddNumberToObject(pr, "seed", -1); /* a random seed per request */
    cJSON_AddNumberToObject(pr, "temperature", tp_srv_num(g->temperature));
    cJSON_AddNumberToObject(pr, "top_k", g->top_k);
    cJSON_AddNumberToObject(pr, "top_p", tp_srv_num(g->top_p));
    cJSON_AddNumberToObject(pr, "min_p", tp_srv_num(g->min_p));
    cJSON_AddNumberToObject(pr, "repeat_penalty", tp_srv_num(g->repeat_penalty));
    cJSON_AddNumberToObject(pr, "repeat_last_n", -1); /* penalties look at the whole reply */
    cJSON_AddNumberToObject(pr, "presence_penalty", 0);
    cJSON_AddNumberToObject(pr, "frequency_penalty", 0);
    cJSON_AddFalseToObject(pr, "ignore_eos");
    cJSON_AddFalseToObject(pr, "stream");
    cJSON_AddNumberToObject(pr, "n_probs", 0);
    cJSON *lb = cJSON_AddArrayToObject(pr, "logit_bias");
    for (int i = 0; i < s->n_bias; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->bias_id[i]));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->bias_val[i]));
        cJSON_AddItemToArray(lb, pair);
    }
    cJSON *samplers = cJSON_AddArrayToObject(pr, "samplers");
    static const char *const order[] = {"penalties", "top_k", "top_p", "min_p", "temperature"};
    for (size_t i = 0; i < TP_ARRAY_LEN(order); i++) cJSON_AddItemToArray(samplers, cJSON_CreateString(order[i]));
    /* where each default comes from: the command line, the model's file, or the engine's own */
    cJSON *from = cJSON_AddObjectToObject(dgs, "params_from");
    static const char *const names[7] = {"temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "n_predict"};
    for (int i = 0; i < 7; i++) cJSON_AddStringToObject(from, names[i], s->gen_from[i]);

    cJSON_AddNumberToObject(o, "total_slots", s->cfg.n_parallel);
    cJSON_AddStringToObject(o, "model_alias", s->model_id ? s->model_id : "tpserve");
    cJSON_AddStringToObject(o, "model_path", path ? path : "");
    cJSON *mod = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddFalseToObject(mod, "vision");
    cJSON_AddFalseToObject(mod, "audio");
    cJSON_AddFalseToObject(o, "endpoint_slots");
    cJSON_AddTrueToObject(o, "endpoint_props");
    cJSON_AddTrueToObject(o, "endpoint_metrics");
    cJSON_AddBoolToObject(o, "webui", 1);
    /* the template text the model carries when its family is the one rendered; else the family's name */
    const int model_text = !s->cfg.chat_template && tmpl && tmpl[0];
    cJSON_AddStringToObject(o, "chat_template", model_text ? tmpl : tp_chat_family_name(s->chat));
    cJSON_AddStringToObject(o, "chat_template_family", tp_chat_family_name(s->chat));
    cJSON_AddStringToObject(o, "chat_template_source", chat_template_source(s, tmpl));
    cJSON *caps = cJSON_AddObjectToObject(o, "chat_template_caps");
    cJSON_AddBoolToObject(caps, "supports_tools", tp_chat_has_tools(s->chat));
    cJSON_AddBoolToObject(caps, "supports_tool_calls", tp_chat_has_tools(s->chat));
    cJSON_AddBoolToObject(caps, "supports_system_role", s->chat != TP_CHAT_MISTRAL);
    add_piece(s, o, "bos_token", tp_tokenizer_bos(s->tok));
    add_piece(s, o, "eos_token", tp_tokenizer_eos(s->tok));
    cJSON_AddStringToObject(o, "build_info", s->build_info);
    cJSON_AddStringToObject(o, "system_fingerprint", s->fingerprint);

    cJSON *meta = cJSON_AddObjectToObject(o, "model_meta");
    cJSON_AddStringToObject(meta, "architecture", tp_arch_name(hp->arch));
    cJSON_AddStringToObject(meta, "name", tp_model_name(m) ? tp_model_name(m) : "");
    cJSON_AddNumberToObject(meta, "n_params", (double)tp_srv_n_params(hp));
    cJSON_AddStringToObject(meta, "ftype", tp_wtype_name(tp_model_weight_type(m)));
    cJSON_AddNumberToObject(meta, "size", (double)tp_model_weight_bytes(m));
    cJSON_AddNumberToObject(meta, "vocab_type", tp_tokenizer_kind(s->tok) == TP_TOK_SPM ? 1 : 2); /* llama.cpp's numbering */
    cJSON_AddNumberToObject(meta, "n_vocab", hp->n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", hp->n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_embd", hp->n_embd);
    cJSON_AddNumberToObject(meta, "n_layer", hp->n_layer);
    cJSON_AddNumberToObject(meta, "n_head", hp->n_head);
    cJSON_AddNumberToObject(meta, "n_head_kv", hp->n_head_kv);
    cJSON_AddNumberToObject(meta, "n_ranks", tp_parallel_size(s->par));
    cJSON_AddStringToObject(meta, "identity_sha256", s->model_sha);
    cJSON_AddStringToObject(meta, "generation_defaults_file", s->model_gen_source);

    char *json = tp_json_print(o);
    cJSON_Delete(o);
    if (!json) return MHD_NO;
    enum MHD_Result r = tp_http_send_json(s, c, 200, json);
    free(json);
    return r;
}
