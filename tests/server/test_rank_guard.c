/*
 * tests/server/test_rank_guard.c - a 2-rank `tpserve serve` (stories260K,
 * coordinator on 127.0.0.1) under attack and with a stalled worker:
 *   - before rank 1 starts, rank 0's comm port gets junk, a replay of the
 *     REJECT's bytes, a forged REGISTER with a wrong proof and random bytes
 *     after a forged REGISTER; each is refused, the group then forms and rank
 *     0 serves the same greedy text as a one-rank server;
 *   - a SIGSTOPped worker turns /health to 503 naming it within 2 s, a new
 *     completion gets 503 with Retry-After within 2 s, and after SIGCONT
 *     /health is 200 again and completions work.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "comm/comm_wire.h"
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

static char *greedy(int port, const char *prompt)
{
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":40,\"temperature\":0}", prompt);
    struct resp r;
    char *out = NULL;
    if (http_do(port, "POST", "/v1/completions", NULL, body, strlen(body), 30, &r) != 0) return NULL;
    if (r.status == 200) {
        cJSON *j = cJSON_Parse(r.body);
        cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text");
        out = cJSON_IsString(t) ? strdup(t->valuestring) : NULL;
        cJSON_Delete(j);
    }
    resp_free(&r);
    return out;
}

/* ---------------------------------------------------------------- attacks */

static int read_frame(int fd, struct tp_wire_frame *f, uint8_t raw[TP_WIRE_FRAME_BYTES])
{
    size_t got = 0;
    while (got < TP_WIRE_FRAME_BYTES) {
        ssize_t r = recv(fd, raw + got, TP_WIRE_FRAME_BYTES - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    tp_wire_decode(raw, f);
    return 0;
}

struct attack_result {
    int n_refused;  /* attacks answered with a REJECT carrying no secret material */
    int n_tried;
};

static int is_clean_reject(const struct tp_wire_frame *f)
{
    static const uint8_t zeros[TP_WIRE_AUTH_BYTES];
    return f->magic == TP_WIRE_MAGIC && f->kind == TP_WIRE_REJECT && f->arg != TP_REJECT_NONE &&
           memcmp(f->auth, zeros, sizeof zeros) == 0;
}

/* A forged REGISTER (rank 1 of 2, port 9) then `proof` (64 bytes). */
static int forged_register_then(int port, const uint8_t *proof, struct tp_wire_frame *answer)
{
    int fd = tp_test_connect_loopback(port, 600);
    if (fd < 0) return -1;
    struct tp_wire_frame h = {.magic = TP_WIRE_MAGIC, .version = TP_WIRE_VERSION, .kind = TP_WIRE_REGISTER,
                              .rank = 1, .world_size = 2, .arg = 9};
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    (void)tp_wire_random(h.auth, sizeof h.auth);
    tp_wire_encode(&h, buf);
    int rc = -1;
    struct tp_wire_frame ch;
    if (send(fd, buf, sizeof buf, MSG_NOSIGNAL) == (ssize_t)sizeof buf && read_frame(fd, &ch, buf) == 0 &&
        ch.kind == TP_WIRE_CHALLENGE && send(fd, proof, TP_WIRE_FRAME_BYTES, MSG_NOSIGNAL) == TP_WIRE_FRAME_BYTES &&
        read_frame(fd, answer, buf) == 0)
        rc = 0;
    close(fd);
    return rc;
}

static void attack(int coord_port, void *arg)
{
    struct attack_result *ar = arg;
    struct tp_wire_frame f;
    uint8_t junk[TP_WIRE_FRAME_BYTES], reply[TP_WIRE_FRAME_BYTES], raw[TP_WIRE_FRAME_BYTES];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 29 + 3);
    /* 1. junk */
    ar->n_tried++;
    int fd = tp_test_connect_loopback(coord_port, 600);
    if (fd >= 0) {
        if (send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk && read_frame(fd, &f, reply) == 0)
            ar->n_refused += is_clean_reject(&f);
        close(fd);
    }
    /* 2. the reply replayed as a proof after a forged REGISTER */
    struct tp_wire_frame pf = {.magic = TP_WIRE_MAGIC, .version = TP_WIRE_VERSION, .kind = TP_WIRE_PROOF,
                               .rank = 1, .world_size = 2};
    memcpy(pf.auth, reply + 16, TP_WIRE_AUTH_BYTES);
    tp_wire_encode(&pf, raw);
    ar->n_tried++;
    if (forged_register_then(coord_port, raw, &f) == 0) ar->n_refused += is_clean_reject(&f);
    /* 3. random bytes after a forged REGISTER */
    (void)tp_wire_random(raw, sizeof raw);
    ar->n_tried++;
    if (forged_register_then(coord_port, raw, &f) == 0) ar->n_refused += is_clean_reject(&f);
}

static const char *const prompts[] = {"Once upon a time", "The little dog"};

static void test_attack_then_serve(void)
{
    if (!have_model()) return;
    struct srv s;
    char *want[2] = {NULL, NULL};
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 1, NULL), 0);
    for (int i = 0; i < 2; i++) want[i] = greedy(s.port, prompts[i]);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
    struct attack_result ar = {0};
    CU_ASSERT_EQUAL_FATAL(srv_start_staged(&s, 2, NULL, attack, &ar), 0);
    CU_ASSERT_EQUAL(ar.n_tried, 3);
    CU_ASSERT_EQUAL(ar.n_refused, 3);
    struct resp r;
    CU_ASSERT_EQUAL(http_do(s.port, "GET", "/health", NULL, NULL, 0, 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 200);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.body, "\"ranks\":2"));
    resp_free(&r);
    for (int i = 0; i < 2; i++) {
        char *got = greedy(s.port, prompts[i]);
        CU_ASSERT_PTR_NOT_NULL(want[i]);
        CU_ASSERT_PTR_NOT_NULL(got);
        if (want[i] && got) CU_ASSERT_STRING_EQUAL(got, want[i]);
        CU_ASSERT(got && strlen(got) > 20);
        free(got);
        free(want[i]);
    }
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

/* ---------------------------------------------------------------- stall */

static void test_stalled_worker(void)
{
    if (!have_model()) return;
    struct srv s;
    struct resp r;
    CU_ASSERT_EQUAL_FATAL(srv_start(&s, 2, NULL), 0);
    CU_ASSERT_EQUAL(http_do(s.port, "GET", "/health", NULL, NULL, 0, 10, &r), 0);
    CU_ASSERT_EQUAL(r.status, 200);
    resp_free(&r);
    char *before = greedy(s.port, prompts[0]);
    CU_ASSERT_PTR_NOT_NULL(before);

    kill(s.pid[1], SIGSTOP);
    double t0 = tp_now_s(), t_health = -1, t_req = -1;
    while (tp_now_s() - t0 < 5 && t_health < 0) {
        if (http_do(s.port, "GET", "/health", NULL, NULL, 0, 3, &r) == 0) {
            if (r.status == 503) {
                t_health = tp_now_s() - t0;
                fprintf(stderr, "    /health 503 after %.2f s: %s\n", t_health, r.body);
                CU_ASSERT_PTR_NOT_NULL(strstr(r.body, "rank 1 has not answered for"));
            }
            resp_free(&r);
        }
        if (t_health < 0) tp_sleep_ms(50);
    }
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":5}";
    double t1 = tp_now_s();
    CU_ASSERT_EQUAL(http_do(s.port, "POST", "/v1/completions", NULL, body, strlen(body), 5, &r), 0);
    t_req = tp_now_s() - t1;
    CU_ASSERT_EQUAL(r.status, 503);
    CU_ASSERT(r.headers && strstr(r.headers, "Retry-After: 1"));
    CU_ASSERT(r.body && strstr(r.body, "rank 1"));
    resp_free(&r);
    fprintf(stderr, "    new completion answered %d in %.3f s\n", 503, t_req);
    CU_ASSERT(t_health >= 0 && t_health < 2.0);
    CU_ASSERT(t_req < 2.0);

    kill(s.pid[1], SIGCONT);
    double t2 = tp_now_s(), t_back = -1;
    while (tp_now_s() - t2 < 5 && t_back < 0) {
        if (http_do(s.port, "GET", "/health", NULL, NULL, 0, 3, &r) == 0) {
            if (r.status == 200) t_back = tp_now_s() - t2;
            resp_free(&r);
        }
        if (t_back < 0) tp_sleep_ms(50);
    }
    fprintf(stderr, "    /health 200 again %.2f s after SIGCONT\n", t_back);
    CU_ASSERT(t_back >= 0 && t_back < 2.0);
    char *after = greedy(s.port, prompts[0]);
    CU_ASSERT_PTR_NOT_NULL(after);
    if (before && after) CU_ASSERT_STRING_EQUAL(after, before);
    free(before);
    free(after);
    CU_ASSERT_EQUAL(srv_stop(&s), 0);
}

static const struct tp_test_case guard_cases[] = {
    {"attack_then_serve", test_attack_then_serve},
    {"stalled_worker", test_stalled_worker},
    {NULL, NULL},
};
TP_TEST_SUITE(rank_guard, "model,multirank", 120, guard_cases)
