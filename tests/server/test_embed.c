/*
 * tests/server/test_embed.c - POST /v1/embeddings and /api/embed end to end
 * on a synthetic Qwen3-shaped F32 model (`tpserve synth --shape
 * test-tiny-qwen3`), served by 1 and 2 ranks, with last-token and mean
 * pooling.
 *
 * Oracle: the same model loaded in this process; each input runs through
 * tp_model_forward alone, in one batch, and its tokens' final hidden states
 * (tp_model_hidden, itself checked against a double-precision reference in
 * model.forward_ref) are pooled and L2-normalised here as the pooling is
 * defined.  The server's vectors, which come out of the scheduler's chunked,
 * batched prefill of several inputs at once, must have cosine >= 0.9999 with
 * it, unit norm, and 2 ranks must equal 1 rank within 1e-4 per component.
 * Bad input gets each API's error shape.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "e2e_impl.h"
#include "model/model.h"
#include "tp_test.h"

enum { N_IN = 3, MAXT = 40 };
static const int lens[N_IN] = {7, 33, 1};

/* shape: test-tiny-qwen3 (no pooling_type), test-tiny-qwen3-embed (pooling_type last, tied output) */
static const char *synth_model_shape(const char *shape)
{
    static char path[2][600];
    char cmd[1400];
    char *p = path[strcmp(shape, "test-tiny-qwen3") != 0];
    snprintf(p, 600, "%s/embed-%s.gguf", tp_test_tmpdir(), shape);
    snprintf(cmd, sizeof cmd, "'%s' synth --shape %s --type f32 -q -o '%s' >/dev/null 2>&1", tp_test_tpserve(), shape,
             p);
    return system(cmd) == 0 ? p : NULL;
}

static const char *synth_model(void) { return synth_model_shape("test-tiny-qwen3"); }

static int tok_of(int i, int t, int n_vocab) { return (i * 131 + t * 29 + 3) % n_vocab; }

/* The oracle: pooled (mean: 0, last: 1), L2-normalised, out[N_IN][E]. */
static void oracle(const char *path, int last, double *out, int *E_out)
{
    struct tp_model_config cfg = tp_model_default_config();
    cfg.path = path;
    cfg.n_threads = 1;
    cfg.n_ctx = 64;
    cfg.n_seq = 1;
    cfg.n_batch = MAXT;
    tp_model_t *m = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_model_init(&cfg, &m, &err), TP_OK);
    const struct tp_hparams *hp = tp_model_hparams(m);
    const int E = hp->n_embd, V = hp->n_vocab;
    *E_out = E;
    float *lg = malloc(sizeof(float) * V), *h = malloc(sizeof(float) * E);
    for (int i = 0; i < N_IN; i++) {
        int32_t tok[MAXT], pos[MAXT], seq[MAXT];
        int8_t want[MAXT];
        for (int t = 0; t < lens[i]; t++) tok[t] = tok_of(i, t, V), pos[t] = t, seq[t] = 0, want[t] = t == lens[i] - 1;
        tp_model_seq_truncate(m, 0, 0);
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &(struct tp_batch){lens[i], tok, pos, seq, want}, lg), TP_OK);
        double *o = out + (size_t)i * E, ss = 0;
        for (int k = 0; k < E; k++) o[k] = 0;
        for (int t = last ? lens[i] - 1 : 0; t < lens[i]; t++) {
            CU_ASSERT_EQUAL_FATAL(tp_model_hidden(m, t, h), TP_OK);
            for (int k = 0; k < E; k++) o[k] += h[k] / (last ? 1.0 : lens[i]);
        }
        for (int k = 0; k < E; k++) ss += o[k] * o[k];
        for (int k = 0; k < E; k++) o[k] /= sqrt(ss);
    }
    free(lg);
    free(h);
    tp_model_free(m);
}

/* POST the inputs as token lists; got[N_IN][E]. */
static void fetch(int port, const char *route, int n_vocab, int E, double *got)
{
    struct tp_buf_local {
        char s[4096];
        size_t n;
    } b = {{0}, 0};
    b.n += (size_t)snprintf(b.s + b.n, sizeof b.s - b.n, "{\"model\":\"m\",\"input\":[");
    for (int i = 0; i < N_IN; i++) {
        b.n += (size_t)snprintf(b.s + b.n, sizeof b.s - b.n, "%s[", i ? "," : "");
        for (int t = 0; t < lens[i]; t++)
            b.n += (size_t)snprintf(b.s + b.n, sizeof b.s - b.n, "%s%d", t ? "," : "", tok_of(i, t, n_vocab));
        b.n += (size_t)snprintf(b.s + b.n, sizeof b.s - b.n, "]");
    }
    snprintf(b.s + b.n, sizeof b.s - b.n, "]}");
    struct resp r;
    CU_ASSERT_EQUAL_FATAL(http_post(port, route, b.s, &r), 0);
    if (r.status != 200) fprintf(stderr, "%s: %d %s\n", route, r.status, r.body);
    CU_ASSERT_EQUAL_FATAL(r.status, 200);
    cJSON *root = cJSON_Parse(r.body);
    CU_ASSERT_PTR_NOT_NULL_FATAL(root);
    int ollama = strcmp(route, "/api/embed") == 0;
    const cJSON *arr = cJSON_GetObjectItem(root, ollama ? "embeddings" : "data");
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(arr), N_IN);
    if (!ollama) {
        const cJSON *u = cJSON_GetObjectItem(root, "usage");
        CU_ASSERT_EQUAL(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, lens[0] + lens[1] + lens[2]);
        CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(root, "object")->valuestring, "list");
    }
    for (int i = 0; i < N_IN; i++) {
        const cJSON *it = cJSON_GetArrayItem(arr, i);
        if (!ollama) {
            CU_ASSERT_EQUAL(cJSON_GetObjectItem(it, "index")->valueint, i);
            CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItem(it, "object")->valuestring, "embedding");
            it = cJSON_GetObjectItem(it, "embedding");
        }
        CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(it), E);
        for (int k = 0; k < E; k++) got[(size_t)i * E + k] = cJSON_GetArrayItem(it, k)->valuedouble;
    }
    cJSON_Delete(root);
    resp_free(&r);
}

static double cosine(const double *a, const double *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    return ab / sqrt(aa * bb);
}

/* flag: the --pooling the servers get (NULL: none, the model's own) */
static void check_pooling_flag(const char *path, int last, const char *flag)
{
    int E = 0;
    double *want = malloc(sizeof(double) * N_IN * 4096);
    oracle(path, last, want, &E);
    tp_model_t *m = NULL;
    double *got[2] = {malloc(sizeof(double) * N_IN * (size_t)E), malloc(sizeof(double) * N_IN * (size_t)E)};
    double *gol = malloc(sizeof(double) * N_IN * (size_t)E);
    int n_vocab = 0;
    {
        struct tp_model_config cfg = tp_model_default_config();
        struct tp_error err = {0};
        cfg.path = path;
        cfg.n_threads = 1;
        cfg.n_ctx = 16;
        CU_ASSERT_EQUAL_FATAL(tp_model_init(&cfg, &m, &err), TP_OK);
        n_vocab = tp_model_hparams(m)->n_vocab;
        tp_model_free(m);
    }
    for (int world = 1; world <= 2; world++) {
        /* a small batch budget: the 33-token input is prefilled in several chunks next to the others */
        const char *with_flag[] = {"--pooling", flag, "--parallel", "4", "--batch-size", "16", NULL};
        const char *const *extra = flag ? with_flag : with_flag + 2;
        struct srv s;
        CU_ASSERT_EQUAL_FATAL(srv_start_model(&s, world, path, extra), 0);
        fetch(s.port, "/v1/embeddings", n_vocab, E, got[world - 1]);
        fetch(s.port, "/api/embed", n_vocab, E, gol);
        for (int i = 0; i < N_IN; i++) {
            const double *g = got[world - 1] + (size_t)i * E, *w = want + (size_t)i * E;
            double c = cosine(g, w, E), nn = 0, od = 0;
            for (int k = 0; k < E; k++) nn += g[k] * g[k], od = fmax(od, fabs(g[k] - gol[(size_t)i * E + k]));
            if (c < 0.9999 || getenv("TP_TEST_VERBOSE"))
                fprintf(stderr, "%s pooling, %d rank(s), input %d: cosine %.9f\n", last ? "last" : "mean", world, i, c);
            CU_ASSERT(c >= 0.9999);
            CU_ASSERT(fabs(nn - 1.0) < 1e-5);
            CU_ASSERT(od < 1e-5); /* /api/embed: the same vectors (its batches may differ: float order only) */
        }
        /* different inputs give different vectors (the comparison can fail) */
        CU_ASSERT(cosine(got[world - 1], got[world - 1] + E, E) < 0.999);
        CU_ASSERT_EQUAL(srv_stop(&s), 0);
    }
    double md = 0;
    for (int k = 0; k < N_IN * E; k++) md = fmax(md, fabs(got[0][k] - got[1][k]));
    if (md >= 1e-4 || getenv("TP_TEST_VERBOSE")) fprintf(stderr, "TP=2 vs TP=1: max |diff| %g\n", md);
    CU_ASSERT(md < 1e-4);
    free(want);
    free(got[0]);
    free(got[1]);
    free(gol);
}

static void check_pooling(const char *path, int last) { check_pooling_flag(path, last, last ? "last" : "mean"); }

/* A model whose GGUF says pooling_type last (as Qwen3-Embedding's does) is pooled on its last token without a
 * flag; --pooling mean overrides it. */
static void test_gguf_pooling_type(void)
{
    const char *path = synth_model_shape("test-tiny-qwen3-embed");
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    struct tp_model_config cfg = tp_model_default_config();
    struct tp_error err = {0};
    tp_model_t *m = NULL;
    cfg.path = path;
    cfg.n_threads = 1;
    cfg.n_ctx = 16;
    CU_ASSERT_EQUAL_FATAL(tp_model_init(&cfg, &m, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_model_hparams(m)->pooling_type, 3);
    tp_model_free(m);
    check_pooling_flag(path, 1, NULL);
    check_pooling_flag(path, 0, "mean");
}

static void test_last(void)
{
    const char *path = synth_model();
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    check_pooling(path, 1);
}

static void test_mean(void)
{
    const char *path = synth_model();
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    check_pooling(path, 0);
}

/* Bad input: OpenAI's error shape on /v1/embeddings, Ollama's on /api/embed; the server keeps answering. */
static void test_errors(void)
{
    const char *path = synth_model();
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start_model(&s, 1, path, NULL), 0);
    static const struct {
        const char *route, *body, *param;
    } bad[] = {
        {"/v1/embeddings", "{\"model\":\"m\"}", "input"},
        {"/v1/embeddings", "{\"input\":\"\"}", "input"},
        {"/v1/embeddings", "{\"input\":[]}", "input"},
        {"/v1/embeddings", "{\"input\":[[1,2],[999999]]}", "input[1]"},
        {"/v1/embeddings", "{\"input\":\"a\",\"encoding_format\":\"hex\"}", "encoding_format"},
        {"/v1/embeddings", "{\"input\":\"a\",\"dimensions\":3}", "dimensions"},
        {"/v1/embeddings", "{\"input\":\"a\",\"bogus\":1}", "bogus"},
        {"/api/embed", "{\"input\":\"a\"}", NULL},
        {"/api/embed", "{\"model\":\"m\",\"input\":7}", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct resp r;
        CU_ASSERT_EQUAL_FATAL(http_post(s.port, bad[i].route, bad[i].body, &r), 0);
        CU_ASSERT_EQUAL(r.status, 400);
        cJSON *root = cJSON_Parse(r.body);
        CU_ASSERT_PTR_NOT_NULL_FATAL(root);
        if (bad[i].param) {
            const cJSON *er = cJSON_GetObjectItem(root, "error");
            const cJSON *pm = cJSON_GetObjectItem(er, "param");
            CU_ASSERT(cJSON_IsString(pm) && strcmp(pm->valuestring, bad[i].param) == 0);
            if (!cJSON_IsString(pm) || strcmp(pm->valuestring, bad[i].param) != 0)
                fprintf(stderr, "%s %s: %s\n", bad[i].route, bad[i].body, r.body);
        } else {
            CU_ASSERT(cJSON_IsString(cJSON_GetObjectItem(root, "error")));
        }
        cJSON_Delete(root);
        resp_free(&r);
    }
    struct resp r;
    CU_ASSERT_EQUAL_FATAL(http_post(s.port, "/v1/embeddings", "{\"input\":\"still here\",\"encoding_format\":\"base64\"}", &r), 0);
    CU_ASSERT_EQUAL(r.status, 200);
    cJSON *root = cJSON_Parse(r.body);
    const cJSON *emb = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "data"), 0), "embedding");
    CU_ASSERT(cJSON_IsString(emb) && strlen(emb->valuestring) % 4 == 0 && strlen(emb->valuestring) > 100);
    cJSON_Delete(root);
    resp_free(&r);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

static const struct tp_test_case embed_cases[] = {
    {"last_token_pooling_1_and_2_ranks", test_last},
    {"mean_pooling_1_and_2_ranks", test_mean},
    {"gguf_pooling_type_last", test_gguf_pooling_type},
    {"errors", test_errors},
    {NULL, NULL},
};
TP_TEST_SUITE(embed, "model,multirank", 240, embed_cases)
