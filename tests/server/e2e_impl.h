/*
 * tests/server/e2e_impl.h - helpers for end-to-end server tests: start
 * `tpserve serve` processes on free 127.0.0.1 ports, a minimal blocking HTTP
 * client (one request per connection), SSE parsing.
 */
#ifndef TP_TEST_SERVER_E2E_IMPL_H
#define TP_TEST_SERVER_E2E_IMPL_H

#include <stddef.h>
#include <sys/types.h>

struct srv {
    pid_t pid[4];
    int n;
    int port;
};
/* Start `tpserve serve -m MODEL --port 0 extra...` as world_size ranks
 * (ranks > 0 get TP_RANK etc.); waits until rank 0 prints its port.
 * Returns 0, or -1 (message on stderr). */
int srv_start(struct srv *s, int world_size, const char *const *extra);
/* The same with another model file (NULL: the bundled stories260K). */
int srv_start_model(struct srv *s, int world_size, const char *model, const char *const *extra);
/* srv_start, with between(coord_port, arg) called after rank 0 started
 * and before the other ranks do (world > 1). */
int srv_start_staged(struct srv *s, int world, const char *const *extra, void (*between)(int coord_port, void *arg),
                     void *arg);
/* Same through `tpserve launch -n N -- tpserve serve ...` (one launcher process). */
int srv_start_launch(struct srv *s, int n_ranks, const char *const *extra);
void srv_kill_rank(struct srv *s, int rank);
/* SIGTERM everything, wait (bounded), SIGKILL stragglers. Returns rank 0's exit status or -1. */
int srv_stop(struct srv *s);

struct resp {
    int status;
    char *headers; /* malloc'd */
    char *body;    /* malloc'd, NUL-terminated (chunked decoding applied) */
    size_t body_len;
};
/* One request; raw_body may contain NULs (len given). headers: extra lines "K: V\r\n". timeout_s bounds it. */
int http_do(int port, const char *method, const char *path, const char *headers, const char *body, size_t len,
            double timeout_s, struct resp *r);
int http_post(int port, const char *path, const char *json, struct resp *r);
void resp_free(struct resp *r);
/* Concatenate delta content / text from an SSE body; returns malloc'd text, sets flags. */
char *sse_collect(const char *body, int chat, int *n_events, int *saw_done, char *finish, size_t finish_cap,
                  int *saw_error);

#endif
