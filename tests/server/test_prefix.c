/*
 * tests/server/test_prefix.c - cross-slot prompt prefix sharing end to end
 * (`tpserve serve --prefix-share-min`), stories260K on 127.0.0.1.
 *
 * Three prompts share a long text prefix P (~60+ tokens) and differ after
 * it.  R1 (P + one ending) streams a long reply (ignore_eos), so its slot is
 * busy; once its first token has arrived (its prompt is in the KV cache),
 * R2 and R3 (P + other endings) are sent concurrently.  Oracles:
 *   - text: R2 and R3 equal `tpserve generate` of the same prompt (greedy),
 *     byte for byte: a copied prefix must give exactly the KV a prefill would;
 *   - sharing on (default 32): each of R2 / R3 reports cached_tokens >= the
 *     token prefix common to all three prompts (from /tokenize), which is
 *     >= 32 tokens; the fresh server's other slots hold nothing, so only a
 *     copy from R1's slot (or from each other's) explains it;
 *     tpserve_prompt_tokens_cached_total is the sum over the finished ones;
 *   - --prefix-share-min 0: cached_tokens is 0 for R2 (fresh slots, R1 busy),
 *     and R2 sent again reuses its own slot (n_prompt - 1 cached, also in a
 *     stream's usage chunk);
 *   - R1 is checked to be still streaming when R2 and R3 have their answers
 *     (else the check of the busy source proved nothing), then cancelled.
 * share_chunked: --batch-size 8, four requests started 0.5 ms apart, so
 * later ones find earlier ones part way through their chunked prefill (only
 * fed positions may be copied); every text still equals generate.
 * The multirank suite runs the sharing-on case on 2 ranks (the copy travels
 * in the step descriptor and every rank copies its KV slice).
 */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "e2e_impl.h"
#include "tp_test.h"

#ifndef MSG_NOSIGNAL /* macOS */
#define MSG_NOSIGNAL 0
#endif

#define P_TEXT                                                                                                       \
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her big red "  \
    "ball. One day, she saw a small bird sitting on a tree. The bird was sad because it could not fly."
static const char *const endings[3] = {" Lily wanted to help", " Her mom said", " Then a big dog came"};
#define GEN 32

static int have_model(void)
{
    if (access(tp_test_repo_path("models/stories260K.gguf"), R_OK) != 0) {
        tp_test_skip("models/stories260K.gguf missing");
        return 0;
    }
    return 1;
}

/* `tpserve generate` of prompt (greedy, n tokens): the generated text only; malloc'd or NULL. */
static char *generate(const char *prompt, int n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' -p '%s' -n %d --temp 0 --quiet-stats --threads 1 2>/dev/null",
             tp_test_tpserve(), tp_test_repo_path("models/stories260K.gguf"), prompt, n);
    char *buf = calloc(1, 65536);
    if (!buf) return NULL;
    FILE *f = popen(cmd, "r");
    if (!f) {
        free(buf);
        return NULL;
    }
    size_t k = fread(buf, 1, 65535, f);
    pclose(f);
    buf[k] = '\0';
    size_t pl = strlen(prompt);
    if (k < pl || strncmp(buf, prompt, pl) != 0) {
        free(buf);
        return NULL;
    }
    if (k > 0 && buf[k - 1] == '\n') buf[k - 1] = '\0';
    memmove(buf, buf + pl, strlen(buf + pl) + 1);
    return buf;
}

/* Token ids of text as the completions endpoint encodes it (BOS added); count or -1. */
static int tokenize(int port, const char *text, int32_t *ids, int cap)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"content\":\"%s\",\"add_special\":true}", text);
    struct resp r;
    if (http_post(port, "/tokenize", body, &r) != 0) return -1;
    int n = -1;
    cJSON *j = r.status == 200 ? cJSON_Parse(r.body) : NULL;
    cJSON *t = cJSON_GetObjectItem(j, "tokens");
    if (cJSON_IsArray(t)) {
        n = cJSON_GetArraySize(t);
        for (int i = 0; i < n && i < cap; i++) ids[i] = (int32_t)cJSON_GetArrayItem(t, i)->valueint;
    }
    cJSON_Delete(j);
    resp_free(&r);
    return n;
}

struct call {
    int port;
    char prompt[512];
    char *text;     /* out: malloc'd */
    int cached;     /* out: usage.prompt_tokens_details.cached_tokens, -1 if absent */
    int n_prompt;   /* out: usage.prompt_tokens */
};

static void *call_main(void *arg)
{
    struct call *c = arg;
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}", c->prompt, GEN);
    c->text = NULL;
    c->cached = c->n_prompt = -1;
    struct resp r;
    if (http_post(c->port, "/v1/completions", body, &r) != 0) return NULL;
    cJSON *j = r.status == 200 ? cJSON_Parse(r.body) : NULL;
    if (!j) fprintf(stderr, "completion status %d: %s\n", r.status, r.body ? r.body : "");
    cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text");
    if (cJSON_IsString(t)) c->text = strdup(t->valuestring);
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens");
    if (cJSON_IsNumber(d)) c->cached = d->valueint;
    cJSON *pt = cJSON_GetObjectItem(u, "prompt_tokens");
    if (cJSON_IsNumber(pt)) c->n_prompt = pt->valueint;
    cJSON_Delete(j);
    resp_free(&r);
    return NULL;
}

/* Start a long streaming completion; returns the socket once its first token
 * event arrived (the prompt is in the KV cache), or -1.  Closing it cancels. */
static int start_long_stream(int port, const char *prompt)
{
    char body[1024], req[2048];
    int bl = snprintf(body, sizeof body,
                      "{\"prompt\":\"%s\",\"max_tokens\":8000,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}",
                      prompt);
    int rl = snprintf(req, sizeof req,
                      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s",
                      bl, body);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || send(fd, req, (size_t)rl, MSG_NOSIGNAL) != rl) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char buf[8192];
    size_t n = 0;
    double t0 = tp_now_s();
    while (tp_now_s() - t0 < 30 && n < sizeof buf - 1) {
        struct pollfd pf = {.fd = fd, .events = POLLIN, .revents = 0};
        if (poll(&pf, 1, 200) <= 0) continue;
        ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = '\0';
        if (strstr(buf, "\"text\":\"")) return fd; /* a token chunk */
    }
    fprintf(stderr, "long stream: no token within 30 s (%s)\n", buf);
    close(fd);
    return -1;
}

/* Nonzero if the stream on fd already ended (everything available is read, [DONE] looked for). */
static int stream_ended(int fd)
{
    char buf[65536];
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN, .revents = 0};
        if (poll(&pf, 1, 0) <= 0) return 0;
        ssize_t k = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
        if (k <= 0) return k == 0;
        buf[k] = '\0';
        if (strstr(buf, "[DONE]")) return 1;
    }
}

static long metric(int port, const char *name)
{
    struct resp r;
    if (http_do(port, "GET", "/metrics", NULL, NULL, 0, 10, &r) != 0) return -1;
    long v = -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = r.body ? strstr(r.body, key) : NULL;
    if (p) v = strtol(p + strlen(key), NULL, 10);
    resp_free(&r);
    return v;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int l = 0;
    while (l < na && l < nb && a[l] == b[l]) l++;
    return l;
}

/* share: 1 = default --prefix-share-min (32), 0 = --prefix-share-min 0 */
static void scenario(int world, int share)
{
    char prompts[3][512];
    for (int i = 0; i < 3; i++) snprintf(prompts[i], sizeof prompts[i], "%s%s", P_TEXT, endings[i]);
    char *want[3] = {NULL, NULL, NULL};
    for (int i = 1; i < 3; i++) {
        want[i] = generate(prompts[i], GEN);
        CU_ASSERT_PTR_NOT_NULL_FATAL(want[i]);
        CU_ASSERT(strlen(want[i]) > 20);
    }
    const char *extra_on[] = {"--parallel", "4", "--ctx-size", "8192", NULL};
    const char *extra_off[] = {"--parallel", "4", "--ctx-size", "8192", "--prefix-share-min", "0", NULL};
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, world, share ? extra_on : extra_off), 0);
    int32_t ids[3][256];
    int nids[3];
    for (int i = 0; i < 3; i++) {
        nids[i] = tokenize(s.port, prompts[i], ids[i], 256);
        CU_ASSERT_FATAL(nids[i] > 0 && nids[i] <= 256);
    }
    int common = TP_MIN(common_prefix(ids[0], nids[0], ids[1], nids[1]), common_prefix(ids[0], nids[0], ids[2], nids[2]));
    CU_ASSERT_FATAL(common >= 32 + 8); /* the prompts are built so that sharing must apply */

    int fd = start_long_stream(s.port, prompts[0]);
    CU_ASSERT_FATAL(fd >= 0);
    struct call c[3];
    pthread_t th[3];
    int n_calls = share ? 2 : 1;
    for (int i = 0; i < n_calls; i++) {
        c[i].port = s.port;
        snprintf(c[i].prompt, sizeof c[i].prompt, "%s", prompts[1 + i]);
        pthread_create(&th[i], NULL, call_main, &c[i]);
    }
    for (int i = 0; i < n_calls; i++) pthread_join(th[i], NULL);
    int ended = stream_ended(fd);
    if (ended) fprintf(stderr, "prefix share: the long stream ended before the other requests were answered\n");
    CU_ASSERT(!ended);
    close(fd); /* cancels R1 */
    for (int i = 0; i < n_calls; i++) {
        CU_ASSERT_PTR_NOT_NULL(c[i].text);
        if (c[i].text && strcmp(c[i].text, want[1 + i]) != 0)
            fprintf(stderr, "prompt %d (world %d share %d):\n http '%s'\n gen  '%s'\n", 1 + i, world, share, c[i].text,
                    want[1 + i]);
        if (c[i].text) CU_ASSERT_STRING_EQUAL(c[i].text, want[1 + i]);
        CU_ASSERT_EQUAL(c[i].n_prompt, nids[1 + i]);
        fprintf(stderr, "prefix share (world %d, share %d): request %d prompt %d cached %d, common prefix %d\n", world,
                share, 1 + i, c[i].n_prompt, c[i].cached, common);
        if (share) {
            CU_ASSERT(c[i].cached >= common && c[i].cached <= c[i].n_prompt - 1);
        } else {
            CU_ASSERT_EQUAL(c[i].cached, 0);
        }
    }
    if (share) {
        /* both finished requests counted; R1 was cancelled (not counted) */
        long total = -1;
        for (int k = 0; k < 50 && total != c[0].cached + c[1].cached; k++) {
            total = metric(s.port, "tpserve_prompt_tokens_cached_total");
            if (total != c[0].cached + c[1].cached) tp_sleep_ms(20);
        }
        CU_ASSERT_EQUAL(total, c[0].cached + c[1].cached);
    } else {
        /* the same-slot prompt cache still works: R2 again reuses all but its last token */
        struct call again = {.port = s.port};
        snprintf(again.prompt, sizeof again.prompt, "%s", prompts[1]);
        call_main(&again);
        CU_ASSERT_EQUAL(again.cached, nids[1] - 1);
        CU_ASSERT_PTR_NOT_NULL(again.text);
        if (again.text) CU_ASSERT_STRING_EQUAL(again.text, want[1]);
        free(again.text);
        /* and the stream's usage chunk says so too */
        char body[1024], expect[64];
        snprintf(body, sizeof body,
                 "{\"prompt\":\"%s\",\"max_tokens\":4,\"temperature\":0,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}",
                 prompts[1]);
        snprintf(expect, sizeof expect, "\"prompt_tokens_details\":{\"cached_tokens\":%d}", nids[1] - 1);
        struct resp r;
        CU_ASSERT_EQUAL_FATAL(http_post(s.port, "/v1/completions", body, &r), 0);
        CU_ASSERT_EQUAL(r.status, 200);
        if (!r.body || !strstr(r.body, expect)) fprintf(stderr, "stream lacks %s: %s\n", expect, r.body ? r.body : "");
        CU_ASSERT_PTR_NOT_NULL(r.body ? strstr(r.body, expect) : NULL);
        resp_free(&r);
    }
    for (int i = 0; i < n_calls; i++) free(c[i].text);
    for (int i = 0; i < 3; i++) free(want[i]);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

struct delayed {
    struct call c;
    int delay_us;
};
static void *delayed_main(void *arg)
{
    struct delayed *d = arg;
    if (d->delay_us > 0) usleep((useconds_t)d->delay_us);
    return call_main(&d->c);
}

/* Sources still being prefilled: with --batch-size 8 a prompt takes ~11
 * steps, and the requests start 0.5 ms apart, so later ones find earlier
 * ones part way through their prefill (only the fed positions may be copied)
 * or not yet started; whatever the interleaving, every text equals generate. */
static void test_share_chunked(void)
{
    if (!have_model()) return;
    char prompts[4][512];
    char *want[4];
    for (int i = 0; i < 4; i++) {
        snprintf(prompts[i], sizeof prompts[i], "%s%s", P_TEXT, i < 3 ? endings[i] : " The bird said");
        want[i] = generate(prompts[i], GEN);
        CU_ASSERT_PTR_NOT_NULL_FATAL(want[i]);
    }
    const char *extra[] = {"--parallel", "4", "--batch-size", "8", NULL};
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, extra), 0);
    long cached_sum = 0;
    for (int round = 0; round < 3; round++) {
        struct delayed d[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            memset(&d[i], 0, sizeof d[i]);
            d[i].c.port = s.port;
            snprintf(d[i].c.prompt, sizeof d[i].c.prompt, "%s", prompts[(i + round) % 4]);
            d[i].delay_us = 500 * i;
            pthread_create(&th[i], NULL, delayed_main, &d[i]);
        }
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 4; i++) {
            const char *w = want[(i + round) % 4];
            CU_ASSERT_PTR_NOT_NULL(d[i].c.text);
            if (d[i].c.text && strcmp(d[i].c.text, w) != 0)
                fprintf(stderr, "chunked round %d request %d:\n http '%s'\n gen  '%s'\n", round, i, d[i].c.text, w);
            if (d[i].c.text) CU_ASSERT_STRING_EQUAL(d[i].c.text, w);
            CU_ASSERT(d[i].c.cached >= 0 && d[i].c.cached < d[i].c.n_prompt);
            cached_sum += d[i].c.cached;
            free(d[i].c.text);
        }
    }
    fprintf(stderr, "prefix share, chunked prefill: %ld prompt tokens cached over 12 requests\n", cached_sum);
    CU_ASSERT(cached_sum > 0); /* rounds 2 and 3 at least find the prefix in their own slots */
    for (int i = 0; i < 4; i++) free(want[i]);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

static void test_share_on(void)
{
    if (have_model()) scenario(1, 1);
}

static void test_share_off(void)
{
    if (have_model()) scenario(1, 0);
}

static void test_share_two_ranks(void)
{
    if (have_model()) scenario(2, 1);
}

static const struct tp_test_case prefix_cases[] = {
    {"share_on", test_share_on},
    {"share_off", test_share_off},
    {"share_chunked", test_share_chunked},
    {NULL, NULL},
};
TP_TEST_SUITE(prefix, "model", 120, prefix_cases)

static const struct tp_test_case prefix_mr_cases[] = {
    {"share_two_ranks", test_share_two_ranks},
    {NULL, NULL},
};
TP_TEST_SUITE(prefix_multirank, "model,multirank", 120, prefix_mr_cases)
