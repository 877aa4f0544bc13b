/*
 * cli/supervise.c - the child supervisor behind `tpserve launch` (local
 * ranks and ranks over ssh): spawn with piped output, prefix and forward
 * every line, forward the launcher's signals, stop everyone when one child
 * fails.  See supervise.h for the contract.
 */
#include "supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"

static volatile sig_atomic_t g_signal;
static int g_wake[2] = {-1, -1}; /* self-pipe: signal handlers wake the poll */

static void wake(char b)
{
    if (g_wake[1] >= 0) {
        ssize_t r = write(g_wake[1], &b, 1);
        (void)r;
    }
}

static void on_signal(int sig)
{
    int saved = errno;
    g_signal = sig;
    wake((char)sig);
    errno = saved;
}

/* SIGCHLD only wakes the loop, so the first child to exit is reaped (and
 * reported) before the ones that fail because it left. */
static void on_child(int sig)
{
    int saved = errno;
    (void)sig;
    wake(0);
    errno = saved;
}

int tp_sup_install(void)
{
    if (g_wake[0] < 0) {
        if (pipe(g_wake) != 0) return -1;
        for (int i = 0; i < 2; i++) {
            fcntl(g_wake[i], F_SETFD, FD_CLOEXEC);
            fcntl(g_wake[i], F_SETFL, fcntl(g_wake[i], F_GETFL) | O_NONBLOCK);
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sc;
    memset(&sc, 0, sizeof sc);
    sc.sa_handler = on_child;
    sc.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigemptyset(&sc.sa_mask);
    sigaction(SIGCHLD, &sc, NULL);
    return 0;
}

int tp_sup_spawn(struct tp_sup_child *c, char *const argv[], const char *const *env, int n_env, int merge,
                 int null_stdin, int keep_fd)
{
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, pi[2] = {-1, -1};
    c->pid = 0;
    c->out.fd = c->err.fd = c->in_fd = -1;
    if (pipe(po) != 0 || (!merge && pipe(pe) != 0) || (c->stdin_line && pipe(pi) != 0)) goto fail;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) goto fail;
    if (pid == 0) {
        if (pi[0] >= 0) {
            dup2(pi[0], STDIN_FILENO);
            close(pi[0]), close(pi[1]);
        } else if (null_stdin) {
            int dn = open("/dev/null", O_RDONLY);
            if (dn >= 0) dup2(dn, STDIN_FILENO);
        }
        dup2(po[1], STDOUT_FILENO);
        dup2(merge ? po[1] : pe[1], STDERR_FILENO);
        close(po[0]), close(po[1]);
        if (!merge) close(pe[0]), close(pe[1]);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);
        for (int i = 0; i < n_env; i++) {
            if (env[2 * i + 1]) setenv(env[2 * i], env[2 * i + 1], 1);
            else unsetenv(env[2 * i]);
        }
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(po[1]);
    if (pi[0] >= 0) {
        close(pi[0]);
        c->in_fd = pi[1];
        fcntl(c->in_fd, F_SETFD, FD_CLOEXEC);
    }
    c->out = (struct tp_sup_stream){.fd = po[0], .to_err = 0};
    if (!merge) {
        close(pe[1]);
        c->err = (struct tp_sup_stream){.fd = pe[0], .to_err = 1};
    }
    int fds[2] = {c->out.fd, c->err.fd};
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) {
            fcntl(fds[i], F_SETFD, FD_CLOEXEC);
            fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
        }
    c->pid = pid;
    c->status = 0;
    return 0;
fail:;
    int saved = errno;
    int all[6] = {po[0], po[1], pe[0], pe[1], pi[0], pi[1]};
    for (int i = 0; i < 6; i++)
        if (all[i] >= 0) close(all[i]);
    errno = saved;
    return -1;
}

static void emit(struct tp_sup_child *c, int rank, struct tp_sup_stream *s, const struct tp_sup_config *cfg)
{
    size_t n = s->len;
    while (n > 0 && (s->buf[n - 1] == '\r' || s->buf[n - 1] == '\n')) n--;
    s->len = 0;
    if (cfg->marker && !c->reached && n == strlen(cfg->marker) && memcmp(s->buf, cfg->marker, n) == 0) {
        c->reached = 1;
        if (c->in_fd >= 0) { /* a short line into an empty pipe: written at once (SIGPIPE is ignored) */
            ssize_t w = write(c->in_fd, c->stdin_line, strlen(c->stdin_line));
            if (w >= 0) w = write(c->in_fd, "\n", 1);
            (void)w;
            close(c->in_fd);
            c->in_fd = -1;
        }
        return;
    }
    FILE *to = s->to_err ? stderr : stdout;
    if (c->label[0]) fprintf(to, "[rank %d %s] %.*s\n", rank, c->label, (int)n, s->buf);
    else fprintf(to, "[rank %d] %.*s\n", rank, (int)n, s->buf);
    fflush(to);
}

/* Read what is there (non-blocking) and print the complete lines; at EOF
 * print the rest and close.  Returns 1 when it read something. */
static int pump(struct tp_sup_child *c, int rank, struct tp_sup_stream *s, const struct tp_sup_config *cfg)
{
    if (s->fd < 0) return 0;
    char buf[4096];
    ssize_t r = read(s->fd, buf, sizeof buf);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r <= 0) {
        if (s->len) emit(c, rank, s, cfg);
        close(s->fd);
        s->fd = -1;
        return 0;
    }
    for (ssize_t i = 0; i < r; i++) {
        if (buf[i] == '\n') {
            emit(c, rank, s, cfg);
        } else {
            if (s->len == sizeof s->buf) emit(c, rank, s, cfg); /* a very long line: cut it */
            s->buf[s->len++] = buf[i];
        }
    }
    return 1;
}

static void signal_all(struct tp_sup_child *c, int n, int sig)
{
    for (int i = 0; i < n; i++)
        if (c[i].pid > 0) kill(c[i].pid, sig);
}

static void close_streams(struct tp_sup_child *c, int rank, const struct tp_sup_config *cfg)
{
    struct tp_sup_stream *s[2] = {&c->out, &c->err};
    for (int k = 0; k < 2; k++) {
        if (s[k]->fd < 0) continue;
        if (s[k]->len) emit(c, rank, s[k], cfg);
        close(s[k]->fd);
        s[k]->fd = -1;
    }
}

#define SUP_BACKOFF_MIN_MS 250u
#define SUP_BACKOFF_MAX_MS 8000u
#define SUP_STABLE_NS 2000000000ull /* a child that ran this long (it started, so not a start-up crash loop) starts its backoff over */

struct sup_restart {
    uint64_t at_ns;      /* restart due; 0: none scheduled */
    uint64_t started_ns; /* when the running child started */
    int n_row;           /* restarts in a row (reset once a child ran SUP_STABLE_NS) */
};

/* Child i failed: schedule its restart (1), give up on it while the others go on (2), or
 * not (0: the caller stops everyone). */
static int schedule_restart(struct tp_sup_child *c, int i, struct sup_restart *rs, const struct tp_sup_config *cfg)
{
    if (i == 0 || cfg->max_restarts <= 0 || !cfg->respawn || g_signal) return 0;
    uint64_t now = tp_now_ns();
    if (rs->started_ns && now - rs->started_ns > SUP_STABLE_NS) rs->n_row = 0;
    if (rs->n_row >= cfg->max_restarts) {
        /* rank 0 outlives its workers: it waits for the rank (503 with the reason) or re-plans without it */
        fprintf(stderr,
                "tpserve %s: rank %d failed %d times in a row (--restart %d); giving up on it, the other ranks go "
                "on (rank 0 waits for it, or re-plans without it under --on-rank-loss replan)\n",
                cfg->who, i, rs->n_row + 1, cfg->max_restarts);
        return 2;
    }
    uint32_t ms = SUP_BACKOFF_MIN_MS << (rs->n_row < 5 ? rs->n_row : 5);
    if (ms > SUP_BACKOFF_MAX_MS) ms = SUP_BACKOFF_MAX_MS;
    rs->n_row++;
    rs->at_ns = now + (uint64_t)ms * 1000000ull;
    if (c->signaled)
        fprintf(stderr, "tpserve %s: rank %d was killed by signal %d (%s); restarting it in %.2f s (restart %d of %d)\n",
                cfg->who, i, c->status - 128, strsignal(c->status - 128), ms / 1000.0, rs->n_row, cfg->max_restarts);
    else
        fprintf(stderr, "tpserve %s: rank %d exited with status %d; restarting it in %.2f s (restart %d of %d)\n",
                cfg->who, i, c->status, ms / 1000.0, rs->n_row, cfg->max_restarts);
    return 1;
}

int tp_sup_run(struct tp_sup_child *c, int n, int n_started, const struct tp_sup_config *cfg)
{
    const uint64_t grace_ns = (uint64_t)cfg->grace_ms * 1000000u;
    int first_fail = -1, exit_code = 0, live = 0, pending = 0;
    uint64_t kill_at = 0;
    struct sup_restart *rs = calloc((size_t)n, sizeof *rs);
    if (!rs) {
        fprintf(stderr, "tpserve %s: out of memory; stopping the ranks\n", cfg->who);
        signal_all(c, n_started, SIGKILL);
        for (int i = 0; i < n_started; i++)
            if (c[i].pid > 0) waitpid(c[i].pid, NULL, 0), c[i].pid = 0;
        return 1;
    }
    for (int i = 0; i < n; i++) rs[i].started_ns = tp_now_ns();
    for (int i = 0; i < n_started; i++) live += c[i].pid > 0;
    if (n_started < n) {
        fprintf(stderr, "tpserve %s: could only start %d of %d ranks; stopping\n", cfg->who, n_started, n);
        first_fail = n_started;
        exit_code = 1;
        signal_all(c, n_started, SIGTERM);
        kill_at = tp_now_ns() + grace_ns;
    }
    struct pollfd *pfd = calloc((size_t)(2 * n + 1), sizeof *pfd);
    struct tp_sup_stream **ps = calloc((size_t)(2 * n + 1), sizeof *ps);
    int *owner = calloc((size_t)(2 * n + 1), sizeof *owner);
    if (!pfd || !ps || !owner) {
        fprintf(stderr, "tpserve %s: out of memory; stopping the ranks\n", cfg->who);
        signal_all(c, n_started, SIGKILL);
        for (int i = 0; i < n_started; i++)
            if (c[i].pid > 0) waitpid(c[i].pid, NULL, 0), c[i].pid = 0;
        free(pfd), free(ps), free(owner), free(rs);
        return 1;
    }
    while (live > 0 || pending > 0) {
        for (int i = 1; i < n_started && pending > 0; i++) {
            if (!rs[i].at_ns) continue;
            if (g_signal || kill_at || first_fail >= 0 || c[0].pid == 0) { /* stopping: no more restarts */
                rs[i].at_ns = 0;
                pending--;
                continue;
            }
            if (tp_now_ns() < rs[i].at_ns) continue;
            rs[i].at_ns = 0;
            pending--;
            close_streams(&c[i], i, cfg);
            if (cfg->respawn(&c[i], i, cfg->respawn_ctx) != 0) {
                fprintf(stderr, "tpserve %s: cannot restart rank %d: %s; stopping the ranks\n", cfg->who, i,
                        strerror(errno));
                first_fail = i;
                if (!exit_code) exit_code = 1;
                signal_all(c, n_started, SIGTERM);
                if (!kill_at) kill_at = tp_now_ns() + grace_ns;
                continue;
            }
            rs[i].started_ns = tp_now_ns();
            live++;
        }
        if (g_signal) {
            int sig = g_signal;
            g_signal = 0;
            fprintf(stderr, "tpserve %s: %s: stopping all %d ranks\n", cfg->who, strsignal(sig), n);
            signal_all(c, n_started, sig);
            if (!exit_code) exit_code = 128 + sig;
            if (!kill_at) kill_at = tp_now_ns() + grace_ns;
        }
        if (kill_at && tp_now_ns() > kill_at) {
            signal_all(c, n_started, SIGKILL);
            kill_at = UINT64_MAX;
        }
        int np = 0;
        for (int i = 0; i < n_started; i++) {
            struct tp_sup_stream *s[2] = {&c[i].out, &c[i].err};
            for (int k = 0; k < 2; k++)
                if (s[k]->fd >= 0) {
                    pfd[np] = (struct pollfd){.fd = s[k]->fd, .events = POLLIN};
                    ps[np] = s[k];
                    owner[np++] = i;
                }
        }
        int n_streams = np;
        pfd[np++] = (struct pollfd){.fd = g_wake[0], .events = POLLIN};
        if (poll(pfd, (nfds_t)np, 100) > 0) {
            for (int k = 0; k < n_streams; k++)
                if (pfd[k].revents) pump(&c[owner[k]], owner[k], ps[k], cfg);
            if (pfd[n_streams].revents & POLLIN) {
                char b[64];
                while (read(g_wake[0], b, sizeof b) > 0) {
                }
            }
        }
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            for (int i = 0; i < n_started; i++) {
                int sr = 0;
                if (c[i].pid != pid) continue;
                c[i].pid = 0;
                live--;
                c[i].signaled = WIFSIGNALED(st);
                c[i].status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
                /* what it wrote last (a background grandchild may hold the pipe open: bounded) */
                for (int k = 0; k < 256 && (pump(&c[i], i, &c[i].out, cfg) | pump(&c[i], i, &c[i].err, cfg)); k++) {
                }
                if (i > 0 && cfg->left_out_status && !c[i].signaled && c[i].status == cfg->left_out_status &&
                    first_fail < 0 && !kill_at) {
                    fprintf(stderr, "tpserve %s: rank %d was left out of the group (rank 0 re-planned without it); "
                            "not restarting it, the other ranks go on\n", cfg->who, i);
                } else if (c[i].status != 0 && first_fail < 0 && !exit_code && !kill_at &&
                           (sr = schedule_restart(&c[i], i, &rs[i], cfg)) != 0) {
                    pending += sr == 1;
                } else if (c[i].status != 0 && first_fail < 0 && !exit_code) {
                    first_fail = i;
                    exit_code = c[i].status;
                    const char *why = cfg->explain ? cfg->explain(&c[i]) : "";
                    char where[280] = "";
                    if (c[i].label[0]) snprintf(where, sizeof where, " (%s)", c[i].label);
                    if (c[i].signaled)
                        fprintf(stderr, "tpserve %s: rank %d%s was killed by signal %d (%s)%s; stopping the other ranks\n",
                                cfg->who, i, where, c[i].status - 128, strsignal(c[i].status - 128), why ? why : "");
                    else
                        fprintf(stderr, "tpserve %s: rank %d%s exited with status %d%s; stopping the other ranks\n",
                                cfg->who, i, where, c[i].status, why ? why : "");
                    signal_all(c, n_started, SIGTERM);
                    if (!kill_at) kill_at = tp_now_ns() + grace_ns;
                }
            }
        }
    }
    for (int i = 0; i < n_started; i++) {
        close_streams(&c[i], i, cfg);
        if (c[i].in_fd >= 0) close(c[i].in_fd), c[i].in_fd = -1;
    }
    free(pfd), free(ps), free(owner), free(rs);
    if (first_fail < 0 && exit_code == 0 && cfg->report_ok)
        fprintf(stderr, "tpserve %s: all %d ranks exited normally\n", cfg->who, n);
    return exit_code;
}
