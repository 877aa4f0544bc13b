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

/* SIGCHLD only wakes the loop (the children are reaped there). */
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

/* The state of one supervision (tp_sup_run). */
struct sup_run {
    struct tp_sup_child *c;
    int n, n_started;
    const struct tp_sup_config *cfg;
    uint64_t grace_ns;
    uint64_t kill_at;         /* SIGKILL the rest then (0: not stopping; UINT64_MAX: sent) */
    int first_fail;           /* the failure reported (child index), -1: none */
    int first_peer;           /* it ended with TP_SUP_EXIT_PEER_LOST: a later failure of another kind replaces it */
    int exit_code;
    int live, pending;        /* children running; restarts scheduled */
    int n_left_out;           /* workers that ended with cfg->left_out_status */
    char left_out[160];       /* their ranks, "2, 3" */
    struct sup_restart *rs;   /* (n) */
    struct pollfd *pfd;       /* (2n + 1) */
    struct tp_sup_stream **ps;
    int *owner;
};

static void sup_stop_all(struct sup_run *S)
{
    signal_all(S->c, S->n_started, SIGTERM);
    if (!S->kill_at) S->kill_at = tp_now_ns() + S->grace_ns;
}

static void sup_say_failed(const struct sup_run *S, int i, const char *what)
{
    const struct tp_sup_child *c = &S->c[i];
    const char *why = S->cfg->explain ? S->cfg->explain(c) : "";
    char where[280] = "";
    if (c->label[0]) snprintf(where, sizeof where, " (%s)", c->label);
    if (c->signaled)
        fprintf(stderr, "tpserve %s: rank %d%s was killed by signal %d (%s)%s%s\n", S->cfg->who, i, where,
                c->status - 128, strsignal(c->status - 128), why ? why : "", what);
    else
        fprintf(stderr, "tpserve %s: rank %d%s exited with status %d%s%s\n", S->cfg->who, i, where, c->status,
                why ? why : "", what);
}

/* Child i ended with a failure (status != 0).  The reported failure: the first one seen, except that a
 * rank which stopped because it lost a peer (TP_SUP_EXIT_PEER_LOST) gives way to the first later failure
 * of another kind that was not launch's own SIGTERM / SIGKILL (the rank whose loss it saw). */
static void sup_failed(struct sup_run *S, int i)
{
    struct tp_sup_child *c = &S->c[i];
    const int peer = !c->signaled && c->status == TP_SUP_EXIT_PEER_LOST;
    int sr = 0;
    if (i > 0 && S->cfg->left_out_status && !c->signaled && c->status == S->cfg->left_out_status) {
        /* rank 0 re-planned without it and refused it when it tried to come back: the job goes on without
         * it by rank 0's decision, so this is neither a failure nor something a restart can change */
        size_t at = strlen(S->left_out);
        snprintf(S->left_out + at, sizeof S->left_out - at, "%s%d", S->n_left_out ? ", " : "", i);
        S->n_left_out++;
        if (!S->kill_at && !g_signal)
            fprintf(stderr, "tpserve %s: rank %d was left out of the group (rank 0 re-planned without it); "
                            "not restarting it, the other ranks go on\n", S->cfg->who, i);
    } else if (S->first_fail < 0 && !S->exit_code && !S->kill_at &&
               (sr = schedule_restart(c, i, &S->rs[i], S->cfg)) != 0) {
        S->pending += sr == 1;
    } else if (S->first_fail < 0 && !S->exit_code) {
        S->first_fail = i;
        S->first_peer = peer;
        S->exit_code = c->status;
        sup_say_failed(S, i, peer ? " (it lost a peer rank); stopping the other ranks"
                                  : "; stopping the other ranks");
        sup_stop_all(S);
    } else if (S->first_fail >= 0 && S->first_peer && !peer && !c->signaled) {
        sup_say_failed(S, i, "; reporting this status: the earlier failure was a rank that lost a peer");
        S->first_fail = i;
        S->first_peer = 0;
        S->exit_code = c->status;
    }
}

/* Reap every child that has ended, then act on their failures in rank order, peer-lost ones last (not in
 * the order waitpid returns them: the order they were forked in, when several ended before launch woke). */
static void sup_reap(struct sup_run *S)
{
    int st, ended[TP_SUP_MAX_CHILDREN], n_ended = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int i = 0; i < S->n_started; i++) {
            struct tp_sup_child *c = &S->c[i];
            if (c->pid != pid) continue;
            c->pid = 0;
            S->live--;
            c->signaled = WIFSIGNALED(st);
            c->status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
            /* what it wrote last (a background grandchild may hold the pipe open: bounded) */
            for (int k = 0; k < 256 && (pump(c, i, &c->out, S->cfg) | pump(c, i, &c->err, S->cfg)); k++) {
            }
            if (n_ended < TP_SUP_MAX_CHILDREN) ended[n_ended++] = i;
        }
    }
    for (int a = 1; a < n_ended; a++) /* insertion sort by rank */
        for (int b = a; b > 0 && ended[b - 1] > ended[b]; b--) {
            int t = ended[b];
            ended[b] = ended[b - 1];
            ended[b - 1] = t;
        }
    for (int pass = 0; pass < 2; pass++) /* within a pass: the failures of other kinds before the peer-lost ones */
        for (int k = 0; k < n_ended; k++) {
            const struct tp_sup_child *c = &S->c[ended[k]];
            const int peer = !c->signaled && c->status == TP_SUP_EXIT_PEER_LOST;
            if (c->status != 0 && peer == pass) sup_failed(S, ended[k]);
        }
}

/* Start the workers whose restart is due (none once stopping). */
static void sup_restarts(struct sup_run *S)
{
    for (int i = 1; i < S->n_started && S->pending > 0; i++) {
        struct sup_restart *rs = &S->rs[i];
        if (!rs->at_ns) continue;
        if (g_signal || S->kill_at || S->first_fail >= 0 || S->c[0].pid == 0) { /* stopping: no more restarts */
            rs->at_ns = 0;
            S->pending--;
            continue;
        }
        if (tp_now_ns() < rs->at_ns) continue;
        rs->at_ns = 0;
        S->pending--;
        close_streams(&S->c[i], i, S->cfg);
        if (S->cfg->respawn(&S->c[i], i, S->cfg->respawn_ctx) != 0) {
            fprintf(stderr, "tpserve %s: cannot restart rank %d: %s; stopping the ranks\n", S->cfg->who, i,
                    strerror(errno));
            S->first_fail = i;
            if (!S->exit_code) S->exit_code = 1;
            sup_stop_all(S);
            continue;
        }
        rs->started_ns = tp_now_ns();
        S->live++;
    }
}

/* Wait up to 100 ms for output or a signal, and print what arrived. */
static void sup_poll(struct sup_run *S)
{
    int np = 0;
    for (int i = 0; i < S->n_started; i++) {
        struct tp_sup_stream *s[2] = {&S->c[i].out, &S->c[i].err};
        for (int k = 0; k < 2; k++)
            if (s[k]->fd >= 0) {
                S->pfd[np] = (struct pollfd){.fd = s[k]->fd, .events = POLLIN};
                S->ps[np] = s[k];
                S->owner[np++] = i;
            }
    }
    const int n_streams = np;
    S->pfd[np++] = (struct pollfd){.fd = g_wake[0], .events = POLLIN};
    if (poll(S->pfd, (nfds_t)np, 100) <= 0) return;
    for (int k = 0; k < n_streams; k++)
        if (S->pfd[k].revents) pump(&S->c[S->owner[k]], S->owner[k], S->ps[k], S->cfg);
    if (S->pfd[n_streams].revents & POLLIN) {
        char b[64];
        while (read(g_wake[0], b, sizeof b) > 0) {
        }
    }
}

static void sup_free(struct sup_run *S)
{
    free(S->pfd);
    free(S->ps);
    free(S->owner);
    free(S->rs);
}

int tp_sup_run(struct tp_sup_child *c, int n, int n_started, const struct tp_sup_config *cfg)
{
    struct sup_run S = {.c = c, .n = n, .n_started = n_started, .cfg = cfg, .first_fail = -1,
                        .grace_ns = (uint64_t)cfg->grace_ms * 1000000u};
    S.rs = calloc((size_t)n, sizeof *S.rs);
    S.pfd = calloc((size_t)(2 * n + 1), sizeof *S.pfd);
    S.ps = calloc((size_t)(2 * n + 1), sizeof *S.ps);
    S.owner = calloc((size_t)(2 * n + 1), sizeof *S.owner);
    if (!S.rs || !S.pfd || !S.ps || !S.owner || n > TP_SUP_MAX_CHILDREN) {
        fprintf(stderr, "tpserve %s: %s; stopping the ranks\n", cfg->who,
                n > TP_SUP_MAX_CHILDREN ? "too many ranks" : "out of memory");
        signal_all(c, n_started, SIGKILL);
        for (int i = 0; i < n_started; i++)
            if (c[i].pid > 0) waitpid(c[i].pid, NULL, 0), c[i].pid = 0;
        sup_free(&S);
        return 1;
    }
    for (int i = 0; i < n; i++) S.rs[i].started_ns = tp_now_ns();
    for (int i = 0; i < n_started; i++) S.live += c[i].pid > 0;
    if (n_started < n) {
        fprintf(stderr, "tpserve %s: could only start %d of %d ranks; stopping\n", cfg->who, n_started, n);
        S.first_fail = n_started;
        S.exit_code = 1;
        sup_stop_all(&S);
    }
    while (S.live > 0 || S.pending > 0) {
        sup_restarts(&S);
        if (g_signal) {
            int sig = g_signal;
            g_signal = 0;
            fprintf(stderr, "tpserve %s: %s: stopping all %d ranks\n", cfg->who, strsignal(sig), n);
            signal_all(c, n_started, sig);
            if (!S.exit_code) S.exit_code = 128 + sig;
            if (!S.kill_at) S.kill_at = tp_now_ns() + S.grace_ns;
        }
        if (S.kill_at && tp_now_ns() > S.kill_at) {
            signal_all(c, n_started, SIGKILL);
            S.kill_at = UINT64_MAX;
        }
        sup_poll(&S);
        sup_reap(&S);
    }
    for (int i = 0; i < n_started; i++) {
        close_streams(&c[i], i, cfg);
        if (c[i].in_fd >= 0) close(c[i].in_fd), c[i].in_fd = -1;
    }
    sup_free(&S);
    if (S.first_fail < 0 && S.exit_code == 0 && S.n_left_out)
        fprintf(stderr, "tpserve %s: rank%s %s left out by a re-plan; the other %d ranks exited normally\n",
                cfg->who, S.n_left_out > 1 ? "s" : "", S.left_out, n - S.n_left_out);
    else if (S.first_fail < 0 && S.exit_code == 0 && cfg->report_ok)
        fprintf(stderr, "tpserve %s: all %d ranks exited normally\n", cfg->who, n);
    return S.exit_code;
}
