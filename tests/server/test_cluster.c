/*
 * tests/server/test_cluster.c - GET /v1/cluster, GET / and --cors-origin on
 * real `tpserve serve` processes with the bundled stories260K model:
 *   one_rank    every documented field, with memory figures against
 *               independent oracles (KV bytes from the model's shape, machine
 *               memory from sysconf, host from gethostname), the generated
 *               token count against a request's usage, the page's three files.
 *   two_ranks   both ranks, their head / FFN / vocabulary ranges partition
 *               the model's, KV bytes per rank from its KV heads, the
 *               workers' counters arrive (tokens, bytes sent).
 *   auth_cors   /v1/cluster needs the key, the page does not; POST / is 405;
 *               CORS headers and the preflight only with --cors-origin.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "e2e_impl.h"
#include "tp_test.h"

static int have_model(void)
{
    if (access(tp_test_repo_path("models/stories260K.gguf"), R_OK) != 0) {
        tp_test_skip("models/stories260K.gguf missing");
        return 0;
    }
    return 1;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1.0;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* [begin, end) of a share range; -1s when absent. */
static void range(const cJSON *share, const char *k, int *b, int *e)
{
    const cJSON *a = cJSON_GetObjectItem(share, k);
    *b = *e = -1;
    if (cJSON_GetArraySize(a) == 2) {
        *b = cJSON_GetArrayItem(a, 0)->valueint;
        *e = cJSON_GetArrayItem(a, 1)->valueint;
    }
}

static cJSON *get_cluster(int port, const char *headers)
{
    struct resp r;
    if (http_do(port, "GET", "/v1/cluster", headers, NULL, 0, 10, &r) != 0) return NULL;
    cJSON *j = r.status == 200 ? cJSON_Parse(r.body) : NULL;
    CU_ASSERT_EQUAL(r.status, 200);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, "application/json"));
    resp_free(&r);
    return j;
}

/* /v1/cluster once every rank reports at least n tokens: the counters are
 * published by the engine thread (when it goes idle, after its pings every
 * second; the workers' come with the steps and pings), so they may lag a
 * finished request by a moment.  NULL after 10 s. */
static cJSON *get_until(int port, int world, int n)
{
    for (int t = 0; t < 100; t++) {
        cJSON *j = get_cluster(port, NULL);
        const cJSON *ranks = cJSON_GetObjectItem(j, "ranks");
        int ok = cJSON_GetArraySize(ranks) == world;
        for (int r = 0; ok && r < world; r++) ok = num(cJSON_GetArrayItem(ranks, r), "n_tokens") >= n;
        if (ok) return j;
        cJSON_Delete(j);
        tp_sleep_ms(100);
    }
    return NULL;
}

/* The checks both rank counts share; returns the ranks array (owned by j). */
static const cJSON *check_common(const cJSON *j, int world)
{
    CU_ASSERT_STRING_EQUAL(str(j, "object"), "cluster");
    CU_ASSERT_STRING_EQUAL(str(j, "state"), "ready");
    CU_ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(j, "reason")));
    CU_ASSERT_EQUAL((int)num(j, "n_ranks"), world);
    CU_ASSERT_STRING_EQUAL(str(j, "backend"), world == 1 ? "local" : "ring");
    /* the ranks are started without launch: TCP unless the environment asks for shared memory */
    const char *shm = getenv("TP_COMM_SHM");
    CU_ASSERT_STRING_EQUAL(str(j, "transport"), world == 1 ? "none" : shm && strcmp(shm, "1") == 0 ? "shm" : "tcp");
    CU_ASSERT_STRING_EQUAL(str(j, "wire_dtype"), "f32");
    CU_ASSERT_EQUAL((int)num(j, "n_parallel"), 8);
    CU_ASSERT_TRUE(num(j, "time") > 1.6e9);
    CU_ASSERT_TRUE(num(j, "tokens_per_s") >= 0);
    CU_ASSERT_EQUAL((int)num(j, "active_seqs"), 0);
    CU_ASSERT_EQUAL((int)num(j, "queue_depth"), 0);
    CU_ASSERT_TRUE(cJSON_IsArray(cJSON_GetObjectItem(j, "history")));
    const cJSON *m = cJSON_GetObjectItem(j, "model");
    /* stories260K: 5 layers, 8 query / 4 KV heads of 8 dims, FFN 172, vocabulary 512 */
    CU_ASSERT_EQUAL((int)num(m, "n_layer"), 5);
    CU_ASSERT_EQUAL((int)num(m, "n_head"), 8);
    CU_ASSERT_EQUAL((int)num(m, "n_head_kv"), 4);
    CU_ASSERT_EQUAL((int)num(m, "n_ff"), 172);
    CU_ASSERT_EQUAL((int)num(m, "n_vocab"), 512);
    const cJSON *ld = cJSON_GetObjectItem(j, "load");
    CU_ASSERT_TRUE(num(ld, "total_bytes") > 0 && num(ld, "done_bytes") == num(ld, "total_bytes"));
    const cJSON *ranks = cJSON_GetObjectItem(j, "ranks");
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(ranks), world);
    char host[256] = "";
    gethostname(host, sizeof host);
    host[31] = '\0'; /* the field keeps 31 bytes */
    const double n_ctx = num(m, "n_ctx");
    for (int r = 0; r < world; r++) {
        const cJSON *x = cJSON_GetArrayItem(ranks, r);
        CU_ASSERT_EQUAL((int)num(x, "rank"), r);
        CU_ASSERT_STRING_EQUAL(str(x, "state"), "ready");
        CU_ASSERT_STRING_EQUAL(str(x, "host"), host);
        CU_ASSERT_STRING_EQUAL(str(x, "link"), r == 0 ? "self" : "same-host");
        CU_ASSERT_EQUAL(num(x, "mem_total_bytes"), (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE));
        CU_ASSERT_TRUE(num(x, "rss_bytes") > num(x, "weight_bytes"));
        CU_ASSERT_TRUE(num(x, "weight_bytes") > 0 && num(x, "weight_bytes") <= num(m, "weight_bytes"));
        const cJSON *sh = cJSON_GetObjectItem(x, "share");
        int kb, ke;
        range(sh, "kv_heads", &kb, &ke);
        /* keys and values, f16 (the default --kv-type), head_dim 8, 8 sequences */
        CU_ASSERT_EQUAL(num(x, "kv_bytes"), 2.0 * 5 * 8 * n_ctx * (ke - kb) * 8 * 2);
        CU_ASSERT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(sh, "experts")));
        int lb, le;
        range(sh, "layers", &lb, &le);
        CU_ASSERT(lb == 0 && le == 5);
        CU_ASSERT_TRUE(num(x, "compute_ms_per_token") >= 0 && num(x, "comm_ms_per_token") >= 0);
    }
    return ranks;
}

/* A chat request at temperature 0; returns its usage.completion_tokens. */
static int one_request(int port, const char *headers)
{
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":24,"
                       "\"temperature\":0}";
    struct resp r;
    if (http_do(port, "POST", "/v1/chat/completions", headers, body, strlen(body), 30, &r) != 0) return -1;
    cJSON *j = cJSON_Parse(r.body);
    int n = (int)num(cJSON_GetObjectItem(j, "usage"), "completion_tokens");
    cJSON_Delete(j);
    resp_free(&r);
    return n;
}

static void test_one_rank(void)
{
    if (!have_model()) return;
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, NULL), 0);
    cJSON *j = get_cluster(s.port, NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    const cJSON *ranks = check_common(j, 1);
    const cJSON *x = cJSON_GetArrayItem(ranks, 0);
    /* one rank holds the whole model */
    CU_ASSERT_EQUAL(num(x, "weight_bytes"), num(cJSON_GetObjectItem(j, "model"), "weight_bytes"));
    CU_ASSERT_EQUAL(num(x, "bytes_sent"), 0);
    const cJSON *sh = cJSON_GetObjectItem(x, "share");
    CU_ASSERT_EQUAL(num(sh, "fraction"), 1.0);
    int b, e;
    range(sh, "q_heads", &b, &e);
    CU_ASSERT(b == 0 && e == 8);
    range(sh, "ffn", &b, &e);
    CU_ASSERT(b == 0 && e == 172);
    CU_ASSERT_EQUAL(num(j, "n_generated"), 0);
    cJSON_Delete(j);
    int n = one_request(s.port, NULL);
    CU_ASSERT_TRUE(n > 0);
    j = get_until(s.port, 1, n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    CU_ASSERT_EQUAL(num(j, "n_generated"), n);
    x = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ranks"), 0);
    CU_ASSERT_TRUE(num(x, "n_tokens") >= n);
    CU_ASSERT_TRUE(num(x, "compute_ms_per_token") > 0);
    cJSON_Delete(j);
    /* the page's three files */
    static const char *const files[][2] = {{"/", "text/html"}, {"/app.js", "text/javascript"},
                                           {"/style.css", "text/css"}};
    for (int i = 0; i < 3; i++) {
        struct resp r;
        CU_ASSERT_EQUAL_FATAL(http_do(s.port, "GET", files[i][0], NULL, NULL, 0, 10, &r), 0);
        CU_ASSERT_EQUAL(r.status, 200);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, files[i][1]));
        CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, "Content-Security-Policy: default-src 'none'"));
        CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, "X-Tpserve-Auth: none"));
        CU_ASSERT_TRUE(r.body_len > 500);
        if (i == 0) CU_ASSERT_PTR_NOT_NULL(strstr(r.body, "<script src=\"/app.js\""));
        resp_free(&r);
    }
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

static void test_two_ranks(void)
{
    if (!have_model()) return;
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 2, NULL), 0);
    int n = one_request(s.port, NULL);
    CU_ASSERT_TRUE(n > 0);
    cJSON *j = get_until(s.port, 2, n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    const cJSON *ranks = check_common(j, 2);
    CU_ASSERT_EQUAL(num(j, "n_generated"), n);
    const cJSON *m = cJSON_GetObjectItem(j, "model");
    static const char *const keys[] = {"q_heads", "ffn", "vocab"};
    const int whole[] = {8, 172, 512};
    double frac = 0;
    for (int k = 0; k < 3; k++) {
        int b0, e0, b1, e1;
        range(cJSON_GetObjectItem(cJSON_GetArrayItem(ranks, 0), "share"), keys[k], &b0, &e0);
        range(cJSON_GetObjectItem(cJSON_GetArrayItem(ranks, 1), "share"), keys[k], &b1, &e1);
        CU_ASSERT(b0 == 0 && e0 == b1 && e1 == whole[k] && e0 > 0 && b1 < whole[k]);
    }
    for (int r2 = 0; r2 < 2; r2++) {
        const cJSON *x = cJSON_GetArrayItem(ranks, r2);
        frac += num(cJSON_GetObjectItem(x, "share"), "fraction");
        /* a slice: less than the whole model, but every replicated part too */
        CU_ASSERT_TRUE(num(x, "weight_bytes") < num(m, "weight_bytes"));
        CU_ASSERT_TRUE(num(x, "n_tokens") > 0);
        CU_ASSERT_TRUE(num(x, "bytes_sent") > 0);
        CU_ASSERT_TRUE(num(x, "comm_ns") > 0);
    }
    CU_ASSERT_DOUBLE_EQUAL(frac, 1.0, 1e-9);
    cJSON_Delete(j);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

static void test_auth_cors(void)
{
    if (!have_model()) return;
    struct srv s;
    const char *extra[] = {"--api-key", "sekret", "--cors-origin", "http://app.example:8000", NULL};
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, extra), 0);
    struct resp r;
    CU_ASSERT_EQUAL(http_do(s.port, "GET", "/v1/cluster", NULL, NULL, 0, 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 401);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, "Access-Control-Allow-Origin: http://app.example:8000"));
    resp_free(&r);
    cJSON *j = get_cluster(s.port, "Authorization: Bearer sekret\r\n");
    CU_ASSERT_PTR_NOT_NULL(j);
    cJSON_Delete(j);
    CU_ASSERT_EQUAL(http_do(s.port, "GET", "/", NULL, NULL, 0, 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 200);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, "X-Tpserve-Auth: required"));
    resp_free(&r);
    CU_ASSERT_EQUAL(http_do(s.port, "POST", "/", NULL, "{}", 2, 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 405);
    resp_free(&r);
    CU_ASSERT_EQUAL(http_do(s.port, "OPTIONS", "/v1/chat/completions",
                            "Origin: http://app.example:8000\r\nAccess-Control-Request-Method: POST\r\n"
                            "Access-Control-Request-Headers: authorization, content-type\r\n",
                            NULL, 0, 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 204);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, "Access-Control-Allow-Origin: http://app.example:8000"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, "Access-Control-Allow-Headers: Authorization, Content-Type"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.headers, "Access-Control-Allow-Methods: GET, HEAD, POST, OPTIONS"));
    resp_free(&r);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
    /* off by default: no CORS header, no preflight */
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, NULL), 0);
    CU_ASSERT_EQUAL(http_do(s.port, "OPTIONS", "/v1/chat/completions", "Origin: http://app.example:8000\r\n", NULL,
                            0, 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 405);
    CU_ASSERT_PTR_NULL(strstr(r.headers, "Access-Control-Allow-Origin"));
    resp_free(&r);
    CU_ASSERT_EQUAL(http_do(s.port, "GET", "/v1/cluster", NULL, NULL, 0, 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 200);
    CU_ASSERT_PTR_NULL(strstr(r.headers, "Access-Control-Allow-Origin"));
    resp_free(&r);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
    /* a malformed origin is refused at start */
    const char *bad[] = {"--cors-origin", "http://a.example/path", NULL};
    CU_ASSERT_NOT_EQUAL(srv_start(&s, 1, bad), 0); /* srv_start stops what it started */
}

static const struct tp_test_case cluster_cases[] = {
    {"one_rank", test_one_rank},
    {"auth_cors", test_auth_cors},
    {NULL, NULL},
};
TP_TEST_SUITE(cluster, "model", 120, cluster_cases)

static const struct tp_test_case cluster_mr_cases[] = {
    {"two_ranks", test_two_ranks},
    {NULL, NULL},
};
TP_TEST_SUITE(cluster_multirank, "model,multirank", 120, cluster_mr_cases)
