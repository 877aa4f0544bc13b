/*
 * tests/server/test_spec.c - speculative decoding end to end (`--spec ngram`):
 * drafts verified in one step on every rank, the output compared with plain
 * decoding of the same request.
 *
 * Oracles:
 *   - golden: `tpserve generate --spec ngram` of stories260K from BOS, greedy,
 *     200 tokens, prints exactly the reference continuation of
 *     models/stories260K.reference_greedy.json (llama2.c's run.c), and its
 *     stats line reports accepted drafts (so the verification path ran);
 *   - greedy identity over HTTP: a server started with --spec ngram answers a
 *     completion with the same text as the same request with
 *     "speculative": false (plain decoding), with usage reporting drafted and
 *     accepted tokens; also with a stop string (finish_reason and text equal),
 *     logprobs (tokens and values equal), and several requests at once, half of
 *     them plain (speculative and plain sequences share steps);
 *   - a grammar request (response_format json_object): the same reply as plain decoding, valid JSON;
 *   - tool_choice "auto" (stories260K served with the llama3.1 template, whose calls begin with "{"):
 *     free text and a call pushed by logit_bias, each the same message as plain decoding, with drafts;
 *   - /metrics counts the drafted and accepted tokens;
 *   - multirank: a synthetic F32 model (test-tiny-qwen3, and test-tiny-gptoss,
 *     whose sliding-window layers keep KV rings: the rollback of rejected
 *     drafts must leave them right) at 1, 2 and 3 ranks: greedy with drafts
 *     equals plain at every world size, and a greedy and a seeded sampled reply
 *     with drafts are the same at 1, 2 and 3 ranks;
 *   - a draft model (stories260K as its own draft): the golden text with every
 *     draft accepted; over HTTP for three slots at once; at 2 ranks the
 *     collectives per generated token fall by >= 5 / 1.2 at k = 4;
 *   - the draft model's batched round (tp_spec_draft_propose_batch): the drafts
 *     of several sequences equal an independent one-token-at-a-time greedy
 *     decode of each with the model API, in 1 + (k_max - 1) forward passes for
 *     all of them (the catch-up pass, then one per drafted position), also
 *     after a partial acceptance, and with more sequences than one pass's rows;
 *   - bench gen --verify / --spec: its JSON figures;
 *   - a draft model sharded over 2 and 3 ranks (--draft-placement sharded): the same greedy text as drafting
 *     on rank 0 and as plain decoding (F32, a one-layer draft of the model's shape: rejections rolled back on
 *     every rank); the model as its own sharded draft: every draft accepted, each draft pass counted as the
 *     12 collectives it costs;
 *   - tool_choice "auto" where a walk runs from free text into the call marker (a synthetic model with the
 *     Qwen3 tokenizer, ../shared): the reply equals plain decoding and tpserve_spec_grammar_cuts_total
 *     counts the walk the marker ended.
 * The sampling rule itself (the target distribution kept exactly) is tested on
 * the sampler (tests/model/test_sampler.c, spec_* cases: chi-square).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "e2e_impl.h"
#include "model/model.h"
#include "server/spec.h"
#include "tp_test.h"

static int have_model(void)
{
    if (access(tp_test_repo_path("models/stories260K.gguf"), R_OK) != 0) {
        tp_test_skip("models/stories260K.gguf missing");
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ golden */

/* models/stories260K.reference_greedy.json parsed (the caller frees it); fails the test when unreadable. */
static cJSON *golden_json(void)
{
    size_t len = 0;
    char *ref = tp_test_read_file(tp_test_repo_path("models/stories260K.reference_greedy.json"), &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref);
    cJSON *j = cJSON_Parse(ref);
    free(ref);
    return j;
}

static void test_golden_ngram(void)
{
    if (!have_model()) return;
    cJSON *j = golden_json();
    const cJSON *want = cJSON_GetObjectItem(j, "expected_stdout");
    CU_ASSERT_FATAL(cJSON_IsString(want));
    char out[1 << 14], cmd[2048], err_path[600];
    snprintf(err_path, sizeof err_path, "%s/golden-stats.txt", tp_test_tmpdir());
    for (int k = 1; k <= 8; k *= 2) {
        snprintf(cmd, sizeof cmd,
                 "'%s' generate -m '%s' -n 200 --temp 0 --threads 1 --spec ngram --draft-max %d 2>'%s'",
                 tp_test_tpserve(), tp_test_repo_path("models/stories260K.gguf"), k, err_path);
        CU_ASSERT_EQUAL_FATAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
        size_t n = strlen(out);
        if (n > 0 && out[n - 1] == '\n') out[--n] = '\0';
        const int same = strcmp(out, want->valuestring) == 0;
        if (!same) fprintf(stderr, "draft-max %d: got\n%s\nwant\n%s\n", k, out, want->valuestring);
        CU_ASSERT(same);
        /* the stats line: "speculative ngram: A of D drafted tokens accepted (x)" */
        char *stats = tp_test_read_file(err_path, NULL);
        CU_ASSERT_PTR_NOT_NULL_FATAL(stats);
        const char *sp = strstr(stats, "speculative ngram: ");
        CU_ASSERT_PTR_NOT_NULL(sp);
        long acc = -1, drafted = -1;
        if (sp) sscanf(sp, "speculative ngram: %ld of %ld", &acc, &drafted);
        fprintf(stderr, "draft-max %d: %ld of %ld drafts accepted\n", k, acc, drafted);
        CU_ASSERT(acc > 0 && drafted >= acc);
        free(stats);
    }
    cJSON_Delete(j);
}

/* stats line figures of `generate`: tokens/step, collectives/token, accepted and drafted (-1 when absent) */
struct gen_stats {
    double tokens_per_step, colls_per_token;
    long accepted, drafted;
    long colls;        /* collectives in all (-1 when absent) */
    long draft_passes; /* the draft model's passes (-1 when absent) */
    int draft_sharded; /* the stats line says "draft model sharded" */
};

static int parse_stats(const char *path, struct gen_stats *g)
{
    char *t = tp_test_read_file(path, NULL);
    if (!t) return -1;
    g->tokens_per_step = g->colls_per_token = -1;
    g->accepted = g->drafted = g->colls = g->draft_passes = -1;
    g->draft_sharded = 0;
    const char *p = strstr(t, " steps, ");
    if (p)
        sscanf(p, " steps, %lf tokens/step, %lf collectives/token (%ld in all)", &g->tokens_per_step,
               &g->colls_per_token, &g->colls);
    const char *dm = strstr(t, "; draft model ");
    if (dm) {
        g->draft_sharded = strncmp(dm, "; draft model sharded:", 22) == 0;
        const char *c = strchr(dm + 2, ':');
        if (c) sscanf(c, ": %ld passes", &g->draft_passes);
    }
    const char *sp = strstr(t, " drafted tokens accepted");
    if (sp) {
        while (sp > t && sp[-1] != ':') sp--;
        sscanf(sp, " %ld of %ld", &g->accepted, &g->drafted);
    }
    free(t);
    return p ? 0 : -1;
}

/* The model as its own draft (greedy): the golden text, every draft accepted. */
static void test_golden_self_draft(void)
{
    if (!have_model()) return;
    cJSON *j = golden_json();
    const cJSON *want = cJSON_GetObjectItem(j, "expected_stdout");
    CU_ASSERT_FATAL(cJSON_IsString(want));
    char out[1 << 14], cmd[2048], err_path[600];
    snprintf(err_path, sizeof err_path, "%s/self-draft.txt", tp_test_tmpdir());
    const char *model = tp_test_repo_path("models/stories260K.gguf");
    snprintf(cmd, sizeof cmd,
             "'%s' generate -m '%s' -n 200 --temp 0 --threads 1 --spec draft --draft-model '%s' --draft-max 4 2>'%s'",
             tp_test_tpserve(), model, model, err_path);
    CU_ASSERT_EQUAL_FATAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    size_t n = strlen(out);
    if (n > 0 && out[n - 1] == '\n') out[--n] = '\0';
    CU_ASSERT_STRING_EQUAL(out, want->valuestring);
    struct gen_stats g;
    CU_ASSERT_EQUAL_FATAL(parse_stats(err_path, &g), 0);
    fprintf(stderr, "self draft: %ld of %ld accepted, %.2f tokens/step\n", g.accepted, g.drafted, g.tokens_per_step);
    CU_ASSERT(g.drafted > 0);
    CU_ASSERT_EQUAL(g.accepted, g.drafted);
    cJSON_Delete(j);
    /* a draft model with another vocabulary is refused with a message naming it */
    char bad[600], c2[2048];
    snprintf(bad, sizeof bad, "%s/other-vocab.gguf", tp_test_tmpdir());
    snprintf(c2, sizeof c2, "'%s' synth --shape test-tiny-llama3 --type f32 -q -o '%s' >/dev/null 2>&1", tp_test_tpserve(),
             bad);
    CU_ASSERT_EQUAL_FATAL(system(c2), 0);
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' -n 8 --temp 0 --spec draft --draft-model '%s' 2>&1",
             tp_test_tpserve(), model, bad);
    int rc = tp_test_run_cmd(cmd, out, sizeof out);
    CU_ASSERT(rc != 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "vocabulary"));
}

/* `bench gen --verify 4 --spec ngram --json`: the figures are there and consistent (the speculative decode's
 * output equals the plain one's, counts add up); a draft mode without its model is a usage error. */
static void test_bench_gen(void)
{
    if (!have_model()) return;
    char cmd[2048], out[1 << 15];
    snprintf(cmd, sizeof cmd,
             "'%s' bench gen -m '%s' -p 16 -n 60 -t 1 --reps 1 --bw-mib 64 --bw-passes 1 --verify 4 --spec ngram "
             "--text 'Once upon a time' --json 2>/dev/null",
             tp_test_tpserve(), tp_test_repo_path("models/stories260K.gguf"));
    CU_ASSERT_EQUAL_FATAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    cJSON *j = cJSON_Parse(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(j);
    const cJSON *ratio = cJSON_GetObjectItem(j, "verify_step_ratio");
    CU_ASSERT(cJSON_IsNumber(ratio) && ratio->valuedouble > 0.0);
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(j, "verify_k")->valueint, 4);
    const cJSON *sp = cJSON_GetObjectItem(j, "spec");
    CU_ASSERT_FATAL(cJSON_IsObject(sp));
    CU_ASSERT(cJSON_IsTrue(cJSON_GetObjectItem(sp, "identical")));
    const cJSON *pl = cJSON_GetObjectItem(sp, "plain"), *sv = cJSON_GetObjectItem(sp, "speculative");
    CU_ASSERT_FATAL(cJSON_IsObject(pl) && cJSON_IsObject(sv));
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(pl, "tokens_per_step")->valuedouble, 1.0, 1e-9);
    const int drafted = cJSON_GetObjectItem(sv, "drafted")->valueint, acc = cJSON_GetObjectItem(sv, "accepted")->valueint;
    CU_ASSERT(drafted > 0 && acc > 0 && acc <= drafted);
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(sv, "acceptance")->valuedouble, (double)acc / drafted, 1e-3);
    CU_ASSERT(cJSON_GetObjectItem(sv, "tokens_per_step")->valuedouble > 1.0);
    CU_ASSERT(cJSON_GetObjectItem(sv, "tg_tps")->valuedouble > 0.0);
    cJSON_Delete(j);
    snprintf(cmd, sizeof cmd, "'%s' bench gen -m '%s' --spec draft --json 2>&1", tp_test_tpserve(),
             tp_test_repo_path("models/stories260K.gguf"));
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "--draft-model"));
}

/* ------------------------------------------------------------------ HTTP */

struct answer {
    char *text;              /* malloc'd; NULL on failure */
    char finish[32];
    int n_tokens;            /* usage.completion_tokens */
    int drafted, accepted;   /* usage.speculative; -1 when absent */
    cJSON *logprobs;         /* choices[0].logprobs (detached, owned) or NULL */
};

static void answer_free(struct answer *a)
{
    free(a->text);
    cJSON_Delete(a->logprobs);
    memset(a, 0, sizeof *a);
}

/* POST body to /v1/completions; 0 and *a filled on a 200 answer. */
static int complete(int port, const char *body, struct answer *a)
{
    memset(a, 0, sizeof *a);
    a->drafted = a->accepted = -1;
    struct resp r;
    if (http_do(port, "POST", "/v1/completions", NULL, body, strlen(body), 120, &r) != 0) return -1;
    cJSON *j = r.status == 200 ? cJSON_Parse(r.body) : NULL;
    if (!j) fprintf(stderr, "status %d: %s\n", r.status, r.body ? r.body : "");
    resp_free(&r);
    if (!j) return -1;
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    const cJSON *t = cJSON_GetObjectItem(c0, "text"), *f = cJSON_GetObjectItem(c0, "finish_reason");
    if (cJSON_IsString(t)) a->text = strdup(t->valuestring);
    if (cJSON_IsString(f)) snprintf(a->finish, sizeof a->finish, "%s", f->valuestring);
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    const cJSON *ct = cJSON_GetObjectItem(u, "completion_tokens");
    if (cJSON_IsNumber(ct)) a->n_tokens = ct->valueint;
    const cJSON *sp = cJSON_GetObjectItem(u, "speculative");
    if (sp) {
        a->drafted = cJSON_GetObjectItem(sp, "drafted")->valueint;
        a->accepted = cJSON_GetObjectItem(sp, "accepted")->valueint;
        const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(u, "completion_tokens_details"),
                                             "accepted_prediction_tokens");
        CU_ASSERT(cJSON_IsNumber(d) && d->valueint == a->accepted);
    }
    a->logprobs = cJSON_DetachItemFromObject(c0, "logprobs");
    if (cJSON_IsNull(a->logprobs)) {
        cJSON_Delete(a->logprobs);
        a->logprobs = NULL;
    }
    cJSON_Delete(j);
    return a->text ? 0 : -1;
}

/* The request body with `extra` JSON members added at the end. */
static void body_with(char *out, size_t cap, const char *base, const char *extra)
{
    size_t n = strlen(base);
    snprintf(out, cap, "%.*s%s%s}", (int)(n - 1), base, extra[0] ? "," : "", extra);
}

/* Speculative (the server's default) and plain answers to base equal each other; the speculative one drafted.
 * Returns the speculative answer's accepted drafts (-1 on failure). */
static int same_as_plain(int port, const char *base, const char *what)
{
    char b1[4096], b2[4096];
    body_with(b1, sizeof b1, base, "");
    body_with(b2, sizeof b2, base, "\"speculative\":false");
    struct answer s, p;
    CU_ASSERT_EQUAL_FATAL(complete(port, b1, &s), 0);
    CU_ASSERT_EQUAL_FATAL(complete(port, b2, &p), 0);
    const int same = strcmp(s.text, p.text) == 0;
    if (!same) fprintf(stderr, "%s: speculative\n%s\nplain\n%s\n", what, s.text, p.text);
    CU_ASSERT(same);
    CU_ASSERT_STRING_EQUAL(s.finish, p.finish);
    CU_ASSERT_EQUAL(s.n_tokens, p.n_tokens);
    CU_ASSERT_EQUAL(p.drafted, -1); /* plain: no speculative usage */
    CU_ASSERT(s.drafted >= s.accepted && s.accepted >= 0);
    fprintf(stderr, "%s: %d tokens, %d of %d drafts accepted, finish %s\n", what, s.n_tokens, s.accepted, s.drafted,
            s.finish);
    if (s.logprobs || p.logprobs) {
        /* the same tokens, top alternatives and offsets; values within 1e-4: a step of several rows (a
         * verification, or a prefill chunk where the other request reused a cached prompt) rounds
         * differently from a one-row step by ~1e-6 */
        CU_ASSERT_FATAL(s.logprobs && p.logprobs);
        const char *keys[4] = {"tokens", "text_offset", "token_logprobs", "top_logprobs"};
        for (int k = 0; k < 4; k++) {
            const cJSON *x = cJSON_GetObjectItem(s.logprobs, keys[k]), *y = cJSON_GetObjectItem(p.logprobs, keys[k]);
            CU_ASSERT_FATAL(cJSON_IsArray(x) && cJSON_IsArray(y));
            CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(x), cJSON_GetArraySize(y));
            for (int i = 0; i < cJSON_GetArraySize(x); i++) {
                const cJSON *u = cJSON_GetArrayItem(x, i), *v = cJSON_GetArrayItem(y, i);
                if (k == 2) {
                    CU_ASSERT(fabs(u->valuedouble - v->valuedouble) < 1e-4);
                } else if (k == 3) { /* {token: logprob} objects, in the same order */
                    const cJSON *e = u->child, *f = v->child;
                    for (; e && f; e = e->next, f = f->next) {
                        CU_ASSERT_STRING_EQUAL(e->string, f->string);
                        CU_ASSERT(fabs(e->valuedouble - f->valuedouble) < 1e-4);
                    }
                    CU_ASSERT(!e && !f);
                } else {
                    char *a = cJSON_PrintUnformatted(u), *b = cJSON_PrintUnformatted(v);
                    CU_ASSERT(a && b && strcmp(a, b) == 0);
                    cJSON_free(a);
                    cJSON_free(b);
                }
            }
        }
    }
    const int acc = s.accepted;
    answer_free(&s);
    answer_free(&p);
    return acc;
}

struct par_call {
    int port;
    char body[512];
    struct answer a;
    int rc;
};

static void *par_main(void *arg)
{
    struct par_call *c = arg;
    c->rc = complete(c->port, c->body, &c->a);
    return NULL;
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

/* POST a chat body; 0 with [choices[0].message without its calls' ids, finish_reason, usage.completion_tokens]
 * printed (malloc'd, *msg) and usage.speculative.drafted (-1: none). */
static int chat(int port, const char *body, char **msg, int *drafted)
{
    struct resp r;
    *msg = NULL;
    *drafted = -1;
    if (http_do(port, "POST", "/v1/chat/completions", NULL, body, strlen(body), 120, &r) != 0) return -1;
    cJSON *j = r.status == 200 ? cJSON_Parse(r.body) : NULL;
    if (!j) fprintf(stderr, "status %d: %s\n", r.status, r.body ? r.body : "");
    resp_free(&r);
    if (!j) return -1;
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *call;
    cJSON_ArrayForEach(call, cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "tool_calls"))
        cJSON_DeleteItemFromObject(call, "id"); /* named after the request */
    /* the message, the finish reason and the token count (text after a call is not in the message) */
    cJSON *cmp = cJSON_CreateArray();
    cJSON_AddItemToArray(cmp, cJSON_DetachItemFromObject(c0, "message"));
    cJSON_AddItemToArray(cmp, cJSON_DetachItemFromObject(c0, "finish_reason"));
    cJSON_AddItemToArray(cmp, cJSON_DetachItemFromObject(cJSON_GetObjectItem(j, "usage"), "completion_tokens"));
    *msg = cJSON_PrintUnformatted(cmp);
    cJSON_Delete(cmp);
    const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "speculative"), "drafted");
    if (cJSON_IsNumber(d)) *drafted = d->valueint;
    cJSON_Delete(j);
    return *msg ? 0 : -1;
}

/* tool_choice "auto" with drafts (the server runs the llama3.1 template: a call is a reply that begins with "{"):
 * free text; a call pushed by logit_bias on "{" (the grammar on from its first token; drafts inside the call cut
 * and masked by it); a call whose schema fixes its arguments, so that it closes by itself and free text follows
 * (parallel_tool_calls).  Each the same message, finish reason and token count as plain decoding; the
 * speculative requests drafted.  Whether the grammar switches inside a verification walk (slot_verify then ends
 * the walk) depends on what the n-gram drafts; with this model it does not in these cases (a walk into the call
 * marker is forced in test_tool_switch_in_walk). */
static void tool_auto_same_as_plain(int port)
{
    struct resp r;
    const char *tb = "{\"content\":\"{\"}";
    CU_ASSERT_EQUAL_FATAL(http_do(port, "POST", "/tokenize", NULL, tb, strlen(tb), 10, &r), 0);
    cJSON *tj = cJSON_Parse(r.body ? r.body : "");
    resp_free(&r);
    const cJSON *ta = cJSON_GetObjectItem(tj, "tokens");
    CU_ASSERT_FATAL(cJSON_IsArray(ta) && cJSON_GetArraySize(ta) > 0);
    const int brace = cJSON_GetArrayItem(ta, cJSON_GetArraySize(ta) - 1)->valueint;
    cJSON_Delete(tj);
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]";
    /* a call whose arguments the schema fixes: it closes by itself, and free text follows */
    const char *fixed = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"go\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"c\":{\"enum\":[\"x\"]}},\"required\":[\"c\"],"
                        "\"additionalProperties\":false}}}]";
    for (int v = 0; v < 3; v++) { /* free text; a call; a call that closes, then text */
        const int push = v > 0;
        char base[1024], bias[64] = "", b1[1200], b2[1200];
        if (push) snprintf(bias, sizeof bias, ",\"logit_bias\":{\"%d\":%d}", brace, v == 2 ? 30 : 100);
        snprintf(base, sizeof base,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],%s,\"max_tokens\":60,"
                 "\"temperature\":0,\"parallel_tool_calls\":%s%s}",
                 v == 2 ? fixed : tools, v == 2 ? "true" : "false", bias);
        body_with(b1, sizeof b1, base, "");
        body_with(b2, sizeof b2, base, "\"speculative\":false");
        char *ms = NULL, *mp = NULL;
        int ds = -1, dp = -1;
        CU_ASSERT_EQUAL_FATAL(chat(port, b1, &ms, &ds), 0);
        CU_ASSERT_EQUAL_FATAL(chat(port, b2, &mp, &dp), 0);
        fprintf(stderr, "tool_choice auto, variant %d: %d drafted; %s\n", v, ds, ms);
        CU_ASSERT_STRING_EQUAL(ms, mp);
        CU_ASSERT(ds > 0);
        CU_ASSERT_EQUAL(dp, -1);
        if (push) CU_ASSERT_PTR_NOT_NULL(strstr(ms, "\"tool_calls\""));
        cJSON_free(ms);
        cJSON_free(mp);
    }
}

static void test_http_greedy(void)
{
    if (!have_model()) return;
    static const char *const extra[] = {"--spec", "ngram", "--draft-max", "6", "--parallel", "4",
                                        "--chat-template", "llama3.1", NULL};
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, extra), 0);
    int acc = same_as_plain(s.port, "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0}", "greedy");
    CU_ASSERT(acc > 0);
    /* a stop string that the reply reaches (", she saw" follows "One day" in the golden text) */
    same_as_plain(s.port,
                  "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,\"stop\":[\"big, red\"]}",
                  "stop");
    same_as_plain(s.port,
                  "{\"prompt\":\"Lily and Ben\",\"max_tokens\":60,\"temperature\":0,\"logprobs\":3,"
                  "\"logit_bias\":{\"260\":-100}}",
                  "logprobs + logit_bias");
    same_as_plain(s.port,
                  "{\"prompt\":\"The dog\",\"max_tokens\":80,\"temperature\":0,\"repetition_penalty\":1.3}",
                  "repetition penalty");
    /* continuous batching: four at once, two of them plain; each equals its own answer alone */
    const char *prompts[4] = {"Once upon a time", "Tom had a", "The sun was", "Lily and Ben"};
    struct par_call calls[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        calls[i].port = s.port;
        snprintf(calls[i].body, sizeof calls[i].body, "{\"prompt\":\"%s\",\"max_tokens\":70,\"temperature\":0%s}",
                 prompts[i], i % 2 ? ",\"speculative\":false" : "");
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, par_main, &calls[i]), 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL_FATAL(calls[i].rc, 0);
        struct answer alone;
        char b[512];
        snprintf(b, sizeof b, "{\"prompt\":\"%s\",\"max_tokens\":70,\"temperature\":0,\"speculative\":false}",
                 prompts[i]);
        CU_ASSERT_EQUAL_FATAL(complete(s.port, b, &alone), 0);
        CU_ASSERT_STRING_EQUAL(calls[i].a.text, alone.text);
        CU_ASSERT_EQUAL(calls[i].a.drafted >= 0, i % 2 == 0);
        answer_free(&alone);
        answer_free(&calls[i].a);
    }
    /* structured output: drafts are checked against the grammar and each row masked from the state after the
     * drafts before it; the reply equals plain decoding's and is valid JSON */
    const char *json_req = "{\"prompt\":\"Once upon a time\",\"max_tokens\":80,\"temperature\":0,"
                           "\"response_format\":{\"type\":\"json_object\"}}";
    same_as_plain(s.port, json_req, "json_object");
    struct answer g;
    CU_ASSERT_EQUAL(complete(s.port, json_req, &g), 0);
    if (g.text) {
        cJSON *v = cJSON_Parse(g.text);
        CU_ASSERT(cJSON_IsObject(v) || strcmp(g.finish, "length") == 0);
        cJSON_Delete(v);
    }
    answer_free(&g);
    tool_auto_same_as_plain(s.port);
    /* streamed: the same text, several tokens per step arriving as their own chunks */
    {
        const char *sb = "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,\"stream\":true}";
        const char *pb = "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,\"speculative\":false}";
        struct resp r;
        struct answer p;
        CU_ASSERT_EQUAL_FATAL(http_do(s.port, "POST", "/v1/completions", NULL, sb, strlen(sb), 60, &r), 0);
        CU_ASSERT_EQUAL(r.status, 200);
        int n_events = 0, done = 0, err = 0;
        char fin[32] = "";
        char *text = sse_collect(r.body, 0, &n_events, &done, fin, sizeof fin, &err);
        CU_ASSERT_EQUAL_FATAL(complete(s.port, pb, &p), 0);
        CU_ASSERT(text && strcmp(text, p.text) == 0);
        CU_ASSERT(done && !err);
        CU_ASSERT(n_events > 2);
        free(text);
        answer_free(&p);
        resp_free(&r);
    }
    /* a bad field */
    struct resp r;
    const char *bad = "{\"prompt\":\"Once\",\"max_tokens\":4,\"speculative\":\"yes\"}";
    CU_ASSERT_EQUAL(http_do(s.port, "POST", "/v1/completions", NULL, bad, strlen(bad), 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 400);
    CU_ASSERT_PTR_NOT_NULL(r.body ? strstr(r.body, "speculative") : NULL);
    resp_free(&r);
    const long drafted = metric(s.port, "tpserve_spec_drafted_tokens_total");
    const long accepted = metric(s.port, "tpserve_spec_accepted_tokens_total");
    fprintf(stderr, "metrics: %ld of %ld drafts accepted\n", accepted, drafted);
    CU_ASSERT(accepted > 0 && drafted >= accepted);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

/* A server without --spec: requests opt in with "speculative": true. */
static void test_http_opt_in(void)
{
    if (!have_model()) return;
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, NULL), 0);
    struct answer a, b;
    const char *on = "{\"prompt\":\"Once upon a time\",\"max_tokens\":80,\"temperature\":0,\"speculative\":true}";
    const char *off = "{\"prompt\":\"Once upon a time\",\"max_tokens\":80,\"temperature\":0}";
    CU_ASSERT_EQUAL_FATAL(complete(s.port, on, &a), 0);
    CU_ASSERT_EQUAL_FATAL(complete(s.port, off, &b), 0);
    CU_ASSERT_STRING_EQUAL(a.text, b.text);
    CU_ASSERT(a.drafted > 0);
    CU_ASSERT_EQUAL(b.drafted, -1);
    answer_free(&a);
    answer_free(&b);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

/* The server with a draft model (stories260K as its own draft): greedy replies equal plain decoding with every
 * draft accepted, also for three requests at once (one draft sequence per slot); a sampled request works. */
static void test_http_self_draft(void)
{
    if (!have_model()) return;
    const char *model = tp_test_repo_path("models/stories260K.gguf");
    const char *const extra[] = {"--spec", "draft", "--draft-model", model, "--draft-max", "4", "--parallel", "3",
                                 NULL};
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, extra), 0);
    const char *prompts[3] = {"Once upon a time", "Tom had a", "The sun was"};
    struct par_call calls[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        calls[i].port = s.port;
        snprintf(calls[i].body, sizeof calls[i].body, "{\"prompt\":\"%s\",\"max_tokens\":64,\"temperature\":0}",
                 prompts[i]);
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, par_main, &calls[i]), 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL_FATAL(calls[i].rc, 0);
        struct answer alone;
        char b[512];
        snprintf(b, sizeof b, "{\"prompt\":\"%s\",\"max_tokens\":64,\"temperature\":0,\"speculative\":false}",
                 prompts[i]);
        CU_ASSERT_EQUAL_FATAL(complete(s.port, b, &alone), 0);
        CU_ASSERT_STRING_EQUAL(calls[i].a.text, alone.text);
        fprintf(stderr, "self draft, slot request %d: %d of %d drafts accepted\n", i, calls[i].a.accepted,
                calls[i].a.drafted);
        CU_ASSERT(calls[i].a.drafted > 0);
        CU_ASSERT_EQUAL(calls[i].a.accepted, calls[i].a.drafted);
        answer_free(&alone);
        answer_free(&calls[i].a);
    }
    struct answer a;
    CU_ASSERT_EQUAL(complete(s.port, "{\"prompt\":\"Once\",\"max_tokens\":48,\"temperature\":0.8,\"seed\":3}", &a), 0);
    CU_ASSERT(a.drafted > 0 && a.accepted <= a.drafted);
    answer_free(&a);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

/* ------------------------------------------------------------------ batched draft */

/* Greedy continuation of toks[0..n) by k tokens with the model API, one token per forward pass (the oracle). */
static void greedy_oracle(tp_model_t *m, const int32_t *toks, int n, int k, int32_t *out)
{
    const int V = tp_model_hparams(m)->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t tok[64], pos[64], seq[64];
    int8_t want[64];
    CU_ASSERT_FATAL(lg && n + k <= 64);
    tp_model_seq_truncate(m, 0, 0);
    for (int i = 0; i < n; i++) tok[i] = toks[i], pos[i] = i, seq[i] = 0, want[i] = i == n - 1;
    struct tp_batch b = {n, tok, pos, seq, want};
    for (int j = 0; j < k; j++) {
        CU_ASSERT_EQUAL_FATAL(tp_model_forward(m, &b, lg), TP_OK);
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        out[j] = best;
        tok[0] = best, pos[0] = n + j, seq[0] = 0, want[0] = 1;
        b.n_tokens = 1;
    }
    free(lg);
}

/* tp_spec_draft_propose_batch over stories260K: three sequences with different k, their drafts equal to the
 * oracle's in 1 + (4 - 1) passes; a second round after a partial acceptance (the cache truncated and refed);
 * 34 sequences at once (more than one pass's 32 rows); a repeated sequence refused. */
static void test_draft_batch(void)
{
    if (!have_model()) return;
    const char *model = tp_test_repo_path("models/stories260K.gguf");
    struct tp_model_config mc = tp_model_default_config();
    mc.path = model;
    mc.n_threads = 1;
    mc.n_ctx = 128;
    tp_model_t *m = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_model_init(&mc, &m, &err), TP_OK);
    const int V = tp_model_hparams(m)->n_vocab;
    tp_spec_draft_t *d = NULL;
    CU_ASSERT_EQUAL_FATAL(tp_spec_draft_init(model, 128, 34, 1, V, &d, &err), TP_OK);
    int32_t p[3][16] = {{1, 403, 259, 300, 270}, {1, 34, 87}, {1, 500, 250, 260, 270, 280, 290}};
    const int np[3] = {5, 3, 7}, ks[3] = {4, 2, 3};
    int32_t out[34][TP_SPEC_DRAFT_MAX], want[TP_SPEC_DRAFT_MAX];
    struct tp_spec_draft_req rq[34];
    for (int i = 0; i < 3; i++)
        rq[i] = (struct tp_spec_draft_req){.seq = i, .toks = p[i], .n = np[i], .k = ks[i], .out = out[i]};
    uint64_t p0 = tp_spec_draft_passes(d);
    CU_ASSERT_EQUAL_FATAL(tp_spec_draft_propose_batch(d, rq, 3), TP_OK);
    CU_ASSERT_EQUAL(tp_spec_draft_passes(d) - p0, 4);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(rq[i].n_out, ks[i]);
        greedy_oracle(m, p[i], np[i], ks[i], want);
        CU_ASSERT_EQUAL(memcmp(out[i], want, sizeof(int32_t) * (size_t)ks[i]), 0);
    }
    /* sequence 0 accepted 2 drafts and then chose another token; sequence 2 accepted all 3 and one more:
     * both are fed from where they differ from the cache, together; sequence 1 sits this round out */
    int32_t q0[16], q2[16];
    memcpy(q0, p[0], sizeof(int32_t) * 5);
    q0[5] = out[0][0], q0[6] = out[0][1], q0[7] = (out[0][2] + 1) % V;
    memcpy(q2, p[2], sizeof(int32_t) * 7);
    memcpy(q2 + 7, out[2], sizeof(int32_t) * 3);
    q2[10] = 77;
    rq[0] = (struct tp_spec_draft_req){.seq = 0, .toks = q0, .n = 8, .k = 3, .out = out[0]};
    rq[1] = (struct tp_spec_draft_req){.seq = 2, .toks = q2, .n = 11, .k = 5, .out = out[2]};
    p0 = tp_spec_draft_passes(d);
    CU_ASSERT_EQUAL_FATAL(tp_spec_draft_propose_batch(d, rq, 2), TP_OK);
    CU_ASSERT_EQUAL(tp_spec_draft_passes(d) - p0, 5);
    greedy_oracle(m, q0, 8, 3, want);
    CU_ASSERT_EQUAL(rq[0].n_out, 3);
    CU_ASSERT_EQUAL(memcmp(out[0], want, sizeof(int32_t) * 3), 0);
    greedy_oracle(m, q2, 11, 5, want);
    CU_ASSERT_EQUAL(rq[1].n_out, 5);
    CU_ASSERT_EQUAL(memcmp(out[2], want, sizeof(int32_t) * 5), 0);
    /* 34 sequences with the same prompt, k = 2: two catch-up passes (32 rows each at most), two decode passes */
    for (int i = 0; i < 34; i++)
        rq[i] = (struct tp_spec_draft_req){.seq = i, .toks = p[1], .n = np[1], .k = 2, .out = out[i]};
    p0 = tp_spec_draft_passes(d);
    CU_ASSERT_EQUAL_FATAL(tp_spec_draft_propose_batch(d, rq, 34), TP_OK);
    CU_ASSERT_EQUAL(tp_spec_draft_passes(d) - p0, 4);
    greedy_oracle(m, p[1], np[1], 2, want);
    for (int i = 0; i < 34; i++) CU_ASSERT(rq[i].n_out == 2 && out[i][0] == want[0] && out[i][1] == want[1]);
    /* the same sequence twice in one round is a caller's error */
    rq[1].seq = 0;
    CU_ASSERT_EQUAL(tp_spec_draft_propose_batch(d, rq, 2), TP_ERR_INVALID_ARG);
    tp_spec_draft_free(d);
    tp_model_free(m);
}

/* ------------------------------------------------------------------ multirank */

static const char *synth(const char *shape)
{
    static char path[2][600];
    char cmd[1400];
    char *p = path[strcmp(shape, "test-tiny-qwen3") != 0];
    snprintf(p, 600, "%s/spec-%s.gguf", tp_test_tmpdir(), shape);
    if (access(p, R_OK) == 0) return p;
    snprintf(cmd, sizeof cmd, "'%s' synth --shape %s --type f32 -q -o '%s' >/dev/null 2>&1", tp_test_tpserve(), shape,
             p);
    return system(cmd) == 0 ? p : NULL;
}

/* A token-id prompt with a repeating motif (so the n-gram lookup finds drafts). */
static void ids_prompt(char *out, size_t cap, int salt)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < 48 && n < cap - 8; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%d", i ? "," : "", 5 + ((i % 12) * 37 + salt) % 400);
    snprintf(out + n, cap - n, "]");
}

static void multirank_shape(const char *shape)
{
    const char *model = synth(shape);
    CU_ASSERT_PTR_NOT_NULL_FATAL(model);
    char *sampled[3] = {NULL, NULL, NULL}, *greedy[3] = {NULL, NULL, NULL};
    static const char *const extra[] = {"--spec", "ngram", "--draft-max", "5", "--ctx-size", "256", NULL};
    for (int world = 1; world <= 3; world++) {
        struct srv s;
        CU_ASSERT_EQUAL_FATAL(srv_start_model(&s, world, model, extra), 0);
        char ids[1024], base[2048], what[96];
        for (int salt = 0; salt < 3; salt++) {
            ids_prompt(ids, sizeof ids, salt);
            snprintf(base, sizeof base, "{\"prompt\":%s,\"max_tokens\":96,\"temperature\":0,\"ignore_eos\":true}",
                     ids);
            snprintf(what, sizeof what, "%s, %d rank(s), prompt %d", shape, world, salt);
            CU_ASSERT(same_as_plain(s.port, base, what) >= 0);
            if (salt == 0) { /* kept to compare across world sizes (F32: the same tokens) */
                struct answer g;
                CU_ASSERT_EQUAL(complete(s.port, base, &g), 0);
                greedy[world - 1] = g.text;
                g.text = NULL;
                answer_free(&g);
            }
        }
        /* sampling with a seed and drafts: the same reply whatever the number of ranks */
        ids_prompt(ids, sizeof ids, 7);
        snprintf(base, sizeof base,
                 "{\"prompt\":%s,\"max_tokens\":64,\"temperature\":0.7,\"top_p\":0.9,\"seed\":42,\"ignore_eos\":true}",
                 ids);
        struct answer a;
        CU_ASSERT_EQUAL(complete(s.port, base, &a), 0);
        CU_ASSERT(a.drafted > 0);
        sampled[world - 1] = a.text;
        a.text = NULL;
        answer_free(&a);
        CU_ASSERT_EQUAL(srv_stop(&s), 0);
    }
    for (int w = 1; w < 3; w++) {
        if (sampled[0] && sampled[w]) CU_ASSERT_STRING_EQUAL(sampled[w], sampled[0]);
        if (greedy[0] && greedy[w]) CU_ASSERT_STRING_EQUAL(greedy[w], greedy[0]);
    }
    for (int w = 0; w < 3; w++) {
        free(sampled[w]);
        free(greedy[w]);
    }
}

static void test_multirank_dense(void) { multirank_shape("test-tiny-qwen3"); }

/* 2 ranks, stories260K as its own draft at k = 4: every draft accepted, so each step yields 5 tokens and the
 * collectives per generated token drop by at least 5 / 1.2 against plain decoding; the text is the same.  The
 * same draft sharded over the 2 ranks (--draft-placement sharded): the same text, every draft accepted, and
 * its passes counted truthfully: each is a step on both ranks (header + 2 x 5 all_sums + argmax gather = 12
 * collectives), so the sharded run's collectives are the rank-0 run's plus 12 per draft pass. */
static void test_self_draft_collectives(void)
{
    if (!have_model()) return;
    const char *model = tp_test_repo_path("models/stories260K.gguf");
    char out[3][1 << 14], cmd[2048], err_path[3][600];
    static const char *const place[3] = {"", "rank0", "sharded"};
    struct gen_stats g[3];
    for (int v = 0; v < 3; v++) {
        char spec[900] = "";
        if (v)
            snprintf(spec, sizeof spec, "--spec draft --draft-max 4 --draft-model '%s' --draft-placement %s", model,
                     place[v]);
        snprintf(err_path[v], sizeof err_path[v], "%s/coll-%d.txt", tp_test_tmpdir(), v);
        snprintf(cmd, sizeof cmd, "'%s' launch -n 2 -- '%s' generate -m '%s' -n 120 --temp 0 --threads 1 %s 2>'%s'",
                 tp_test_tpserve(), tp_test_tpserve(), model, spec, err_path[v]);
        CU_ASSERT_EQUAL_FATAL(tp_test_run_cmd(cmd, out[v], sizeof out[v]), 0);
        CU_ASSERT_EQUAL_FATAL(parse_stats(err_path[v], &g[v]), 0);
    }
    CU_ASSERT_STRING_EQUAL(out[0], out[1]);
    CU_ASSERT_STRING_EQUAL(out[0], out[2]);
    fprintf(stderr, "2 ranks: plain %.2f collectives/token; self draft on rank 0 %.2f (%ld of %ld accepted, %.2f "
            "tokens/step); sharded %.2f (%ld collectives, %ld draft passes; on rank 0 %ld)\n",
            g[0].colls_per_token, g[1].colls_per_token, g[1].accepted, g[1].drafted, g[1].tokens_per_step,
            g[2].colls_per_token, g[2].colls, g[2].draft_passes, g[1].colls);
    CU_ASSERT_EQUAL(g[1].accepted, g[1].drafted);
    CU_ASSERT(g[1].colls_per_token > 0);
    CU_ASSERT(g[0].colls_per_token >= g[1].colls_per_token * 5.0 / 1.2);
    /* sharded: the same steps and drafts, every draft pass 12 collectives more (a rank-stats gather, at most
     * one a second, may add one) */
    CU_ASSERT(!g[1].draft_sharded && g[2].draft_sharded);
    CU_ASSERT_EQUAL(g[2].accepted, g[2].drafted);
    CU_ASSERT_EQUAL(g[2].drafted, g[1].drafted);
    CU_ASSERT_EQUAL(g[2].draft_passes, g[1].draft_passes);
    CU_ASSERT(g[2].draft_passes > 0);
    const long extra = g[2].colls - g[1].colls;
    CU_ASSERT(extra >= 12 * g[2].draft_passes && extra <= 12 * g[2].draft_passes + 2);
}

/* A draft model sharded over 2 and 3 ranks (--draft-placement sharded) on F32 synthetic models: the model
 * (test-tiny-qwen3) drafted for by a one-layer model of its shape and seed (the same vocabulary, other
 * logits, so drafts are rejected and the draft's KV is rolled back on every rank), greedy: the same text as
 * the draft on rank 0 and as plain decoding at each world size. */
static void test_sharded_draft_f32(void)
{
    const char *model = synth("test-tiny-qwen3");
    CU_ASSERT_PTR_NOT_NULL_FATAL(model);
    char draft[600], cmd[2400];
    snprintf(draft, sizeof draft, "%s/spec-draft-1layer.gguf", tp_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --shape test-tiny-qwen3 --layers 1 --type f32 -q -o '%s' >/dev/null 2>&1",
             tp_test_tpserve(), draft);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    static const char *const place[3] = {"", "rank0", "sharded"};
    for (int world = 2; world <= 3; world++) {
        char out[3][1 << 14], err_path[600];
        struct gen_stats g[3];
        for (int v = 0; v < 3; v++) {
            char spec[900] = "";
            if (v)
                snprintf(spec, sizeof spec, "--spec draft --draft-max 4 --draft-model '%s' --draft-placement %s", draft,
                         place[v]);
            snprintf(err_path, sizeof err_path, "%s/sharded-%d-%d.txt", tp_test_tmpdir(), world, v);
            snprintf(cmd, sizeof cmd,
                     "'%s' launch -n %d -- '%s' generate -m '%s' -p 'the cat sat on the mat and the dog' -n 64 "
                     "--temp 0 --threads 1 %s 2>'%s'",
                     tp_test_tpserve(), world, tp_test_tpserve(), model, spec, err_path);
            CU_ASSERT_EQUAL_FATAL(tp_test_run_cmd(cmd, out[v], sizeof out[v]), 0);
            CU_ASSERT_EQUAL_FATAL(parse_stats(err_path, &g[v]), 0);
        }
        fprintf(stderr, "%d ranks: draft on rank 0 %ld of %ld accepted; sharded %ld of %ld accepted, %ld passes\n",
                world, g[1].accepted, g[1].drafted, g[2].accepted, g[2].drafted, g[2].draft_passes);
        CU_ASSERT_STRING_EQUAL(out[1], out[0]);
        CU_ASSERT_STRING_EQUAL(out[2], out[0]);
        CU_ASSERT(g[2].draft_sharded && !g[1].draft_sharded);
        CU_ASSERT(g[2].drafted > 0);
        CU_ASSERT(g[2].accepted < g[2].drafted); /* rejections: the rollback ran */
    }
}

static void test_multirank_window(void) { multirank_shape("test-tiny-gptoss"); }

/* ------------------------------------------------------------------ grammar switch inside a walk */

/* The single token id of text (-1 when it is not one token). */
static int one_token(int port, const char *text)
{
    char body[256];
    snprintf(body, sizeof body, "{\"content\":\"%s\"}", text);
    struct resp r;
    if (http_do(port, "POST", "/tokenize", NULL, body, strlen(body), 10, &r) != 0) return -1;
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    resp_free(&r);
    const cJSON *t = cJSON_GetObjectItem(j, "tokens");
    const int id = cJSON_IsArray(t) && cJSON_GetArraySize(t) == 1 ? cJSON_GetArrayItem(t, 0)->valueint : -1;
    cJSON_Delete(j);
    return id;
}

/* The conversation and tools of the grammar-switch test: a user message ending in a line of t times word and
 * the call marker (what the n-gram lookup drafts from), the one tool (its arguments fixed by the schema),
 * greedy, logit_bias +100 on word (id ok: the free text) and +bias_m on <tool_call>; extra appended. */
static void switch_body(char *out, size_t cap, const char *word, int salt, int t, int ok, int marker, double bias_m,
                        int max_tokens, const char *extra)
{
    char line[128] = "";
    for (int i = 0; i < t; i++) strcat(line, word);
    snprintf(out, cap,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi %d\\n%s<tool_call>\"}],\"tools\":[{\"type\":"
             "\"function\",\"function\":{\"name\":\"go\",\"parameters\":{\"type\":\"object\",\"properties\":{\"c\":"
             "{\"enum\":[\"x\"]}},\"required\":[\"c\"],\"additionalProperties\":false}}}],\"tool_choice\":\"auto\","
             "\"max_tokens\":%d,\"temperature\":0,\"logit_bias\":{\"%d\":100,\"%d\":%.6f}%s}",
             salt, line, max_tokens, ok, marker, bias_m, extra);
}

/*
 * tool_choice "auto" where a verification walk runs from free text into the call marker (Hermes <tool_call>,
 * one token of the Qwen3 tokenizer on a synthetic model): logit_bias +100 on a word W (" red": the free text
 * is W W ...), and <tool_call> at +100 - x wins at the first position t whose logit lead over W (d_t, read
 * from a plain run's top-2 logprobs with the marker held at +99, so d_t - 1) exceeds x; x is set between d_t
 * and the largest earlier lead (the first word, position and prompt salt where that gap is >= 0.004 of the
 * few tried).  The user message ends in "\nW...W<tool_call>" (t of them), so after the reply's first W the
 * n-gram lookup drafts the rest of that line: W x (t - 1), then the marker.
 * The step accepts them and the marker switches the grammar on inside the walk (the rows after it were
 * masked for free text): the walk ends there and the call's JSON is decoded under the grammar.  The reply
 * (content, tool call, finish reason, token count) equals plain decoding's, and
 * tpserve_spec_grammar_cuts_total counts the cut walk.
 */
static void test_tool_switch_in_walk(void)
{
    const char *tj = tp_test_shared_path("models/tokenizers/qwen3/tokenizer.json");
    if (!tj) return; /* ../shared data absent: recorded as a skip */
    char model[600], cmd[2048];
    snprintf(model, sizeof model, "%s/spec-qwen3-tok.gguf", tp_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --shape test-tiny-qwen3 --tokenizer '%s' -q --threads 1 -o '%s' 2>/dev/null",
             tp_test_tpserve(), tj, model);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    static const char *const extra[] = {"--spec", "ngram", "--draft-max", "4", "--parallel", "1", NULL};
    struct srv s;
    CU_ASSERT_EQUAL_FATAL(srv_start_model(&s, 1, model, extra), 0);
    static const char *const words[] = {" red", " a", " cat", " no", " yes", " ok"};
    const int marker = one_token(s.port, "<tool_call>");
    CU_ASSERT_FATAL(marker >= 0);
    int salt = -1, t = 0, ok = -1;
    const char *word = NULL;
    double x = 0;
    char body[2048], b1[2200], b2[2200];
    for (size_t w = 0; w < TP_ARRAY_LEN(words) && salt < 0; w++) {
        const int wid = one_token(s.port, words[w]);
        for (int tt = 3; tt >= 1 && salt < 0 && wid >= 0; tt--) {
            const int sa = 0;
            switch_body(body, sizeof body, words[w], sa, tt, wid, marker, 99.0, tt + 1,
                        ",\"logprobs\":true,\"top_logprobs\":2,\"speculative\":false");
            struct resp r;
            CU_ASSERT_EQUAL_FATAL(http_do(s.port, "POST", "/v1/chat/completions", NULL, body, strlen(body), 60, &r), 0);
            cJSON *j = cJSON_Parse(r.body ? r.body : "");
            resp_free(&r);
            const cJSON *lp = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j,
                                                  "choices"), 0), "logprobs"), "content");
            double d[4], lead = -1e9;
            int n = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, lp)
            {
                double l_ok = NAN, l_m = NAN;
                const cJSON *c;
                cJSON_ArrayForEach(c, cJSON_GetObjectItem(e, "top_logprobs"))
                {
                    const char *tk = cJSON_GetStringValue(cJSON_GetObjectItem(c, "token"));
                    const double v = cJSON_GetNumberValue(cJSON_GetObjectItem(c, "logprob"));
                    if (tk && strcmp(tk, words[w]) == 0) l_ok = v;
                    if (tk && strcmp(tk, "<tool_call>") == 0) l_m = v;
                }
                if (n < 4) d[n++] = l_m - l_ok + 1.0;
            }
            cJSON_Delete(j);
            if (n != tt + 1) continue;
            for (int i = 0; i < tt; i++) lead = fmax(lead, d[i]);
            if (d[tt] > lead + 0.004 && d[tt] < 0.9) {
                salt = sa;
                t = tt;
                x = (d[tt] + lead) / 2;
                word = words[w];
                ok = wid;
            }
        }
    }
    fprintf(stderr, "grammar switch: word '%s', salt %d, the marker at reply position %d with bias 100 - %.4f\n",
            word ? word : "", salt, t, x);
    CU_ASSERT_FATAL(salt >= 0);
    char *ms = NULL, *mp = NULL;
    int ds = -1, dp = -1;
    /* the reply stopped one token after the marker: the only grammar switch it can have is the marker's,
     * inside the walk that drafted it */
    const long cuts0 = metric(s.port, "tpserve_spec_grammar_cuts_total");
    switch_body(body, sizeof body, word, salt, t, ok, marker, 100.0 - x, t + 2, "");
    CU_ASSERT_EQUAL_FATAL(chat(s.port, body, &ms, &ds), 0);
    const long cuts1 = metric(s.port, "tpserve_spec_grammar_cuts_total");
    fprintf(stderr, "grammar switch, %d tokens: %d drafted, %ld walk(s) cut; %s\n", t + 2, ds, cuts1 - cuts0, ms);
    CU_ASSERT(cuts0 >= 0 && cuts1 - cuts0 == 1);
    cJSON_free(ms);
    /* the whole call (its JSON under the grammar, then what follows), speculative and plain */
    switch_body(body, sizeof body, word, salt, t, ok, marker, 100.0 - x, 96, "");
    body_with(b1, sizeof b1, body, "");
    body_with(b2, sizeof b2, body, "\"speculative\":false");
    CU_ASSERT_EQUAL_FATAL(chat(s.port, b1, &ms, &ds), 0);
    CU_ASSERT_EQUAL_FATAL(chat(s.port, b2, &mp, &dp), 0);
    fprintf(stderr, "grammar switch: %d drafted; %s\n", ds, ms);
    CU_ASSERT_STRING_EQUAL(ms, mp);
    CU_ASSERT(ds > 0);
    CU_ASSERT_EQUAL(dp, -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(ms, "\"tool_calls\""));
    char want[128] = "\"content\":\"";
    for (int i = 0; i < t; i++) strcat(want, word);
    strcat(want, "\"");
    CU_ASSERT_PTR_NOT_NULL(strstr(ms, want)); /* the free text before the call: positions 0 .. t - 1 */
    cJSON_free(ms);
    cJSON_free(mp);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

/* ------------------------------------------------------------------ unit */

/* The n-gram lookup: the longest suffix (4 down to 1 tokens) that occurred before, its most recent earlier
 * occurrence, the tokens after it (up to k, never past the end). */
static void test_ngram_draft(void)
{
    int32_t out[TP_SPEC_DRAFT_MAX];
    /* "1 2 3 4 | 9 9 | 1 2 3 5 | 7 7 7 | 2 3": suffix "2 3" last seen before "5" */
    const int32_t a[] = {1, 2, 3, 4, 9, 9, 1, 2, 3, 5, 7, 7, 7, 2, 3};
    int n = tp_spec_ngram_draft(a, 15, 4, out);
    CU_ASSERT_EQUAL_FATAL(n, 4);
    CU_ASSERT(out[0] == 5 && out[1] == 7 && out[2] == 7 && out[3] == 7);
    /* a longer match wins over a more recent shorter one: suffix "1 2 3" occurs once before (then 4) while
     * "2 3" alone is more recent (then 9) */
    const int32_t b[] = {1, 2, 3, 4, 8, 2, 3, 9, 6, 1, 2, 3};
    n = tp_spec_ngram_draft(b, 12, 2, out);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT(out[0] == 4 && out[1] == 8);
    /* no earlier occurrence of the last token: no draft */
    const int32_t c[] = {1, 2, 3, 4};
    CU_ASSERT_EQUAL(tp_spec_ngram_draft(c, 4, 4, out), 0);
    /* the continuation stops at the end of the sequence: "5 6 5" -> after the first 5 comes "6 5" */
    const int32_t d[] = {5, 6, 5};
    n = tp_spec_ngram_draft(d, 3, 8, out);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT(out[0] == 6 && out[1] == 5);
    CU_ASSERT_EQUAL(tp_spec_ngram_draft(d, 3, 0, out), 0);
    CU_ASSERT_EQUAL(tp_spec_ngram_draft(d, 1, 4, out), 0);
}

/* Adaptive k: alpha^k >= 0.2 within 1..k_max; full acceptance raises k to k_max, none lowers it to 1. */
static void test_adapt(void)
{
    struct tp_spec_adapt a;
    tp_spec_adapt_init(&a, 8);
    CU_ASSERT_EQUAL(tp_spec_adapt_k(&a), 3); /* alpha 0.6 */
    for (int i = 0; i < 20; i++) tp_spec_adapt_update(&a, tp_spec_adapt_k(&a), tp_spec_adapt_k(&a));
    CU_ASSERT(tp_spec_adapt_alpha(&a) > 0.95f);
    CU_ASSERT_EQUAL(tp_spec_adapt_k(&a), 8);
    for (int i = 0; i < 20; i++) tp_spec_adapt_update(&a, tp_spec_adapt_k(&a), 0);
    CU_ASSERT(tp_spec_adapt_alpha(&a) < 0.1f);
    CU_ASSERT_EQUAL(tp_spec_adapt_k(&a), 1);
    /* half of the drafted tokens accepted, one rejection per step: alpha -> 2/3 at 2 of 3, k = 3 */
    tp_spec_adapt_init(&a, 16);
    for (int i = 0; i < 40; i++) tp_spec_adapt_update(&a, 3, 2);
    CU_ASSERT(fabsf(tp_spec_adapt_alpha(&a) - 2.0f / 3.0f) < 0.01f);
    CU_ASSERT_EQUAL(tp_spec_adapt_k(&a), 3);
    tp_spec_adapt_init(&a, 99); /* clamped to TP_SPEC_DRAFT_MAX */
    CU_ASSERT_EQUAL(a.k_max, TP_SPEC_DRAFT_MAX);
    CU_ASSERT_EQUAL(tp_spec_mode_parse("ngram"), TP_SPEC_NGRAM);
    CU_ASSERT_EQUAL(tp_spec_mode_parse("off"), TP_SPEC_OFF);
    CU_ASSERT_EQUAL(tp_spec_mode_parse("draft"), TP_SPEC_DRAFT);
    CU_ASSERT_EQUAL(tp_spec_mode_parse("eagle"), -1);
}

static const struct tp_test_case spec_unit_cases[] = {
    {"ngram_draft", test_ngram_draft},
    {"adapt", test_adapt},
    {NULL, NULL},
};
TP_TEST_SUITE(spec_unit, "unit", 30, spec_unit_cases)

static const struct tp_test_case spec_cases[] = {
    {"golden_ngram", test_golden_ngram},
    {"golden_self_draft", test_golden_self_draft},
    {"bench_gen_verify_spec", test_bench_gen},
    {"http_greedy_equals_plain", test_http_greedy},
    {"http_opt_in", test_http_opt_in},
    {"http_self_draft", test_http_self_draft},
    {"draft_batch", test_draft_batch},
    {NULL, NULL},
};
TP_TEST_SUITE(spec, "model", 240, spec_cases)

static const struct tp_test_case spec_mr_cases[] = {
    {"f32_1_2_3_ranks", test_multirank_dense},
    {"sliding_window_1_2_3_ranks", test_multirank_window},
    {"self_draft_collectives_2_ranks", test_self_draft_collectives},
    {"sharded_draft_f32_2_3_ranks", test_sharded_draft_f32},
    {NULL, NULL},
};
TP_TEST_SUITE(spec_multirank, "model,multirank", 300, spec_mr_cases)

static const struct tp_test_case spec_shared_cases[] = {
    {"tool_auto_switch_in_walk", test_tool_switch_in_walk},
    {NULL, NULL},
};
TP_TEST_SUITE(spec_shared, "model", 120, spec_shared_cases)
