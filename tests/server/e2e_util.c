/*
 * tests/server/e2e_util.c - process and HTTP helpers of e2e_impl.h.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "comm/comm.h"
#include "common/common.h"
#include "e2e_impl.h"

#ifndef MSG_NOSIGNAL /* macOS */
#define MSG_NOSIGNAL 0
#endif
#include "tp_test.h"

/* A free loopback port, kept listening by *fd_out (rank 0 inherits it as
 * TP_LISTEN_FD, so no parallel test can take the port meanwhile). */
static int hold_port(int *fd_out)
{
    int port = -1;
    return tp_comm_hold_loopback_ports(1, &port, fd_out, NULL) == TP_OK ? port : -1;
}

static int srv_start_impl(struct srv *s, int world, int launch, const char *model, const char *const *extra,
                          void (*between)(int coord_port, void *arg), void *between_arg)
{
    memset(s, 0, sizeof *s);
    s->n = launch ? 1 : world;
    int coord_fd = -1;
    int coord = world > 1 && !launch ? hold_port(&coord_fd) : 0;
    int fds[2];
    if (pipe(fds) != 0) {
        if (coord_fd >= 0) close(coord_fd);
        return -1;
    }
    for (int rank = 0; rank < s->n; rank++) {
        pid_t pid = fork();
        if (pid < 0) return -1;
        if (pid == 0) {
            if (rank == 0) dup2(fds[1], 1);
            close(fds[0]);
            close(fds[1]);
            if (world > 1 && !launch) {
                char buf[64];
                snprintf(buf, sizeof buf, "%d", rank);
                setenv("TP_RANK", buf, 1);
                snprintf(buf, sizeof buf, "%d", world);
                setenv("TP_WORLD_SIZE", buf, 1);
                snprintf(buf, sizeof buf, "127.0.0.1:%d", coord);
                setenv("TP_COORDINATOR", buf, 1);
                setenv("TP_COMM_TIMEOUT_MS", "10000", 1);
                if (rank == 0) {
                    (void)fcntl(coord_fd, F_SETFD, 0); /* tpserve inherits it across exec */
                    snprintf(buf, sizeof buf, "%d", coord_fd);
                    setenv("TP_LISTEN_FD", buf, 1);
                } else if (coord_fd >= 0) {
                    close(coord_fd);
                }
            }
            const char *argv[64];
            int k = 0;
            char nbuf[16];
            snprintf(nbuf, sizeof nbuf, "%d", world);
            if (launch) {
                argv[k++] = tp_test_tpserve();
                argv[k++] = "launch";
                argv[k++] = "-n";
                argv[k++] = nbuf;
                argv[k++] = "--";
            }
            argv[k++] = tp_test_tpserve();
            argv[k++] = "serve";
            argv[k++] = "-m";
            argv[k++] = model ? model : tp_test_repo_path("models/stories260K.gguf");
            argv[k++] = "--port";
            argv[k++] = "0";
            argv[k++] = "--threads";
            argv[k++] = "1";
            for (int i = 0; extra && extra[i] && k < 62; i++) argv[k++] = extra[i];
            argv[k] = NULL;
            execv(argv[0], (char *const *)argv);
            _exit(127);
        }
        s->pid[rank] = pid;
        if (rank == 0 && between) between(coord, between_arg);
    }
    if (coord_fd >= 0) close(coord_fd);
    close(fds[1]);
    /* read rank 0's stdout until "serving on http://HOST:PORT" (30 s) */
    char buf[4096];
    size_t n = 0;
    double t0 = tp_now_s();
    while (tp_now_s() - t0 < 30 && n < sizeof buf - 1) {
        struct pollfd pf = {.fd = fds[0], .events = POLLIN};
        if (poll(&pf, 1, 200) <= 0) continue;
        ssize_t r = read(fds[0], buf + n, sizeof buf - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        buf[n] = '\0';
        const char *p = strstr(buf, "serving on http://");
        if (p && strchr(p, '\n')) {
            const char *colon = strchr(p + 18, ':');
            s->port = colon ? atoi(colon + 1) : 0;
            break;
        }
    }
    close(fds[0]);
    if (s->port <= 0) {
        fprintf(stderr, "srv_start: server did not report its port (stdout: %s)\n", buf);
        srv_stop(s);
        return -1;
    }
    return 0;
}

int srv_start(struct srv *s, int world, const char *const *extra)
{
    return srv_start_impl(s, world, 0, NULL, extra, NULL, NULL);
}
int srv_start_model(struct srv *s, int world, const char *model, const char *const *extra)
{
    return srv_start_impl(s, world, 0, model, extra, NULL, NULL);
}
int srv_start_staged(struct srv *s, int world, const char *const *extra, void (*between)(int coord_port, void *arg),
                     void *arg)
{
    return srv_start_impl(s, world, 0, NULL, extra, between, arg);
}
int srv_start_launch(struct srv *s, int n_ranks, const char *const *extra)
{
    return srv_start_impl(s, n_ranks, 1, NULL, extra, NULL, NULL);
}

void srv_kill_rank(struct srv *s, int rank)
{
    if (s->pid[rank] > 0) kill(s->pid[rank], SIGKILL);
}

int srv_stop(struct srv *s)
{
    int st0 = -1;
    for (int i = 0; i < s->n; i++)
        if (s->pid[i] > 0) kill(s->pid[i], SIGTERM);
    double t0 = tp_now_s();
    for (int i = 0; i < s->n; i++) {
        if (s->pid[i] <= 0) continue;
        int st = 0;
        for (;;) {
            pid_t r = waitpid(s->pid[i], &st, WNOHANG);
            if (r == s->pid[i] || r < 0) break;
            if (tp_now_s() - t0 > 15) {
                kill(s->pid[i], SIGKILL);
                waitpid(s->pid[i], &st, 0);
                fprintf(stderr, "srv_stop: rank %d did not exit on SIGTERM within 15 s\n", i);
                st = -1;
                break;
            }
            tp_sleep_ms(20);
        }
        if (i == 0) st0 = st;
        s->pid[i] = 0;
    }
    return st0;
}

void resp_free(struct resp *r)
{
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static void dechunk(struct resp *r)
{
    char *out = malloc(r->body_len + 1);
    size_t o = 0;
    const char *p = r->body, *end = r->body + r->body_len;
    while (p < end) {
        char *e = NULL;
        unsigned long n = strtoul(p, &e, 16);
        const char *crlf = strstr(p, "\r\n");
        if (!crlf || n == 0) break;
        p = crlf + 2;
        if (p + n > end) n = (unsigned long)(end - p);
        memcpy(out + o, p, n);
        o += n;
        p += n + 2;
    }
    out[o] = '\0';
    free(r->body);
    r->body = out;
    r->body_len = o;
}

int http_do(int port, const char *method, const char *path, const char *headers, const char *body, size_t len,
            double timeout_s, struct resp *r)
{
    memset(r, 0, sizeof *r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char head[2048];
    int hl = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                      headers ? headers : "");
    if (body) hl += snprintf(head + hl, sizeof head - (size_t)hl, "Content-Type: application/json\r\nContent-Length: %zu\r\n", len);
    hl += snprintf(head + hl, sizeof head - (size_t)hl, "\r\n");
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl) {
        close(fd);
        return -1;
    }
    size_t off = 0;
    while (body && off < len) {
        ssize_t w = send(fd, body + off, len - off, MSG_NOSIGNAL);
        if (w <= 0) break; /* the server may answer (413) before reading everything */
        off += (size_t)w;
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    double t0 = tp_now_s();
    for (;;) {
        if (tp_now_s() - t0 > timeout_s) {
            fprintf(stderr, "http_do: %s %s timed out after %.0f s\n", method, path, timeout_s);
            break;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0) continue;
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        return -1;
    }
    size_t hlen = (size_t)(sep - buf);
    r->headers = malloc(hlen + 1);
    memcpy(r->headers, buf, hlen);
    r->headers[hlen] = '\0';
    r->body_len = n - hlen - 4;
    r->body = malloc(r->body_len + 1);
    memcpy(r->body, sep + 4, r->body_len);
    r->body[r->body_len] = '\0';
    free(buf);
    if (strstr(r->headers, "chunked") || strstr(r->headers, "Chunked")) dechunk(r);
    return 0;
}

int http_post(int port, const char *path, const char *json, struct resp *r)
{
    return http_do(port, "POST", path, NULL, json, strlen(json), 60, r);
}

char *sse_collect(const char *body, int chat, int *n_events, int *saw_done, char *finish, size_t finish_cap,
                  int *saw_error)
{
    size_t cap = strlen(body) + 1, o = 0;
    char *out = calloc(1, cap);
    *n_events = 0;
    *saw_done = 0;
    *saw_error = 0;
    if (finish_cap) finish[0] = '\0';
    const char *p = body;
    while ((p = strstr(p, "data: ")) != NULL) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (strncmp(p, "[DONE]", 6) == 0) {
            *saw_done = 1;
            p = e;
            continue;
        }
        (*n_events)++;
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(e - p));
        if (j) {
            if (cJSON_GetObjectItem(j, "error")) *saw_error = 1;
            cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
            if (ch) {
                cJSON *t = chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content")
                                : cJSON_GetObjectItem(ch, "text");
                if (cJSON_IsString(t)) {
                    size_t l = strlen(t->valuestring);
                    memcpy(out + o, t->valuestring, l < cap - o - 1 ? l : cap - o - 1);
                    o += l < cap - o - 1 ? l : cap - o - 1;
                }
                cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
                if (cJSON_IsString(f) && finish_cap) snprintf(finish, finish_cap, "%s", f->valuestring);
            }
            cJSON_Delete(j);
        }
        p = e;
    }
    out[o] = '\0';
    return out;
}
