/*
 * cli/supervise.h - private to cli/: the supervisor shared by
 * `tpserve launch -n N` (local ranks) and `tpserve launch --hostfile`
 * (ranks over ssh): tp_sup_spawn forks a child with piped output, tp_sup_run
 * prefixes its lines with "[rank R] ", forwards signals, stops or restarts
 * failed children and returns the status to exit with (docs/cli.md).
 */
#ifndef TP_SERVER_SUPERVISE_H
#define TP_SERVER_SUPERVISE_H

#include <stddef.h>
#include <sys/types.h>

#include "cli.h"

#define TP_SUP_LINE_MAX 8192
#define TP_SUP_MAX_CHILDREN 1024
#define TP_SUP_EXIT_PEER_LOST TP_CLI_EXIT_PEER_LOST

/* One output stream of a child: a partial line is kept until its newline. */
struct tp_sup_stream {
    int fd;       /* non-blocking read end; -1 when closed */
    int to_err;   /* print on stderr (else stdout) */
    size_t len;
    char buf[TP_SUP_LINE_MAX];
};

struct tp_sup_child {
    char label[256];          /* "" -> prefix "[rank R] ", else "[rank R LABEL] " */
    pid_t pid;                /* 0 once reaped (or never started) */
    int status;               /* once reaped: exit status, or 128 + signal */
    int signaled;             /* it was killed by a signal */
    int reached;              /* it printed the config's marker line (which is not shown) */
    struct tp_sup_stream out; /* stdout (and stderr when started with merge) */
    struct tp_sup_stream err; /* stderr; fd -1 when merged */
    const char *stdin_line;   /* set before tp_sup_spawn (NULL: none): the child's stdin is a pipe,
                                 and this line plus a newline is written to it once the child
                                 prints the config's marker line, then the pipe is closed (a
                                 secret that must not be on a command line); not owned */
    int in_fd;                /* write end of that pipe, -1 when none or written */
};

struct tp_sup_config {
    const char *who;      /* message prefix: "launch" */
    int grace_ms;         /* SIGTERM -> SIGKILL delay */
    const char *marker;   /* a line to hide and note as `reached` (NULL: none) */
    /* Extra words for a failure, e.g. " (program not found there)"; may be NULL. */
    const char *(*explain)(const struct tp_sup_child *c);
    int report_ok;        /* print "all N ranks exited normally" at the end */
    int max_restarts;     /* > 0: restart a failed worker (index > 0) up to this many times in a row, then
                           * leave it stopped while the others go on (rank 0 decides what to do) */
    /* Start child `index` again (its streams are closed, label kept); 0 or -1 with errno.
     * Required when max_restarts > 0. */
    int (*respawn)(struct tp_sup_child *c, int index, void *ctx);
    void *respawn_ctx;
    /* A worker (index > 0) exiting with this status (non-zero) was left out of the group by rank 0
     * (it re-planned without it, docs/recovery.md): it is neither restarted nor a failure (it stops
     * no one and does not set the exit status); the end of the run names it.  Rank 0 exiting with it
     * is a failure like any other status.  0: none. */
    int left_out_status;
};

/* Install the signal handlers (SIGINT/SIGTERM/SIGHUP recorded, SIGCHLD wakes,
 * SIGPIPE ignored).  Call once before forking.  0, or -1 with errno. */
int tp_sup_install(void);

/*
 * Fork a child that runs argv (execvp) with its stdin from a pipe when
 * c->stdin_line is set (see struct tp_sup_child), else from /dev/null when
 * null_stdin, stdout and stderr into pipes (one pipe when merge); setenv
 * pairs env[0..2*n_env) are applied in the child first (value NULL: unset);
 * keep_fd >= 0 is inherited by the child (its close-on-exec flag cleared
 * there), every other descriptor of ours is close-on-exec.
 * Fills c->pid and the streams.  0, or -1 with errno (nothing left open).
 */
int tp_sup_spawn(struct tp_sup_child *c, char *const argv[], const char *const *env, int n_env, int merge,
                 int null_stdin, int keep_fd);

/*
 * Supervise children c[0..n) (n <= TP_SUP_MAX_CHILDREN) until all have
 * exited; n_started < n means starting failed part-way (the started ones are
 * stopped at once).  Every line a child prints is prefixed with "[rank R] ";
 * SIGINT/SIGTERM/SIGHUP are forwarded.  When a child fails the others are
 * stopped (SIGTERM, SIGKILL after grace_ms), unless cfg->max_restarts > 0: a
 * failed worker (index > 0) is then restarted after a backoff (250 ms doubling
 * to 8 s), at most max_restarts times in a row, then left stopped while the
 * others go on.  A worker exiting with cfg->left_out_status is neither
 * restarted nor a failure.  Returns the launcher's exit status: 0 when all
 * exited 0 (left-out workers aside); else the reported failure's: the first
 * seen (children that ended together in rank order), except that a
 * TP_SUP_EXIT_PEER_LOST one gives way to the first later failure of another
 * kind not caused by the launcher's own signals; 128 + signal when the
 * launcher itself was signalled.
 */
int tp_sup_run(struct tp_sup_child *c, int n, int n_started, const struct tp_sup_config *cfg);

#endif /* TP_SERVER_SUPERVISE_H */
