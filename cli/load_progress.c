/*
 * cli/load_progress.c - model-loading progress for the command line: a
 * bar redrawn in place on stderr when it is a terminal ("rank 1  loading
 * [#####.....] 52%  1.4 / 2.7 GiB  610 MB/s"), otherwise one log line per 10%
 * or per 5 s (through tp_log, so under `tpserve launch` each line carries
 * the launcher's "[rank R HOST]" prefix and the rank's own).  Plugged into
 * tp_model_config.progress, which the loader calls with the bytes of this
 * rank's slice read so far and the slice's total.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

void tp_cli_progress_init(struct tp_cli_progress *p, const char *label)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->tty = isatty(STDERR_FILENO);
    p->t0 = tp_now_s();
    p->last_pct = -1;
}

void tp_cli_load_progress(void *ctx, uint64_t done, uint64_t total)
{
    struct tp_cli_progress *p = ctx;
    if (!p || total == 0) return;
    if (done > total) done = total;
    double now = tp_now_s(), dt = now - p->t0;
    int pct = (int)(100.0 * (double)done / (double)total);
    /* GiB for real models, MiB for small ones (the bundled model is 1.1 MiB) */
    const int use_gib = total >= (64ull << 20);
    const double unit = use_gib ? 1024.0 * 1024.0 * 1024.0 : 1024.0 * 1024.0;
    const char *uname = use_gib ? "GiB" : "MiB";
    double rate = dt > 0 ? (double)done / dt / 1e6 : 0; /* MB/s */
    if (p->tty) {
        if (pct == p->last_pct && done < total && now - p->last_print < 0.1) return;
        char bar[31];
        int fill = pct * 30 / 100;
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r%s%sloading [%s] %3d%%  %.2f / %.2f %s  %.0f MB/s ", p->label, p->label[0] ? "  " : "",
                bar, pct, (double)done / unit, (double)total / unit, uname, rate);
        if (done >= total) fprintf(stderr, "\n");
        fflush(stderr);
    } else {
        int step = pct / 10;
        if (done < total && step == p->last_pct / 10 && now - p->last_print < 5.0) return;
        if (done >= total && p->last_pct == 100) return;
        /* the log hook already names the rank */
        tp_log(TP_LOG_INFO, "load", "weights %d%% (%.2f of %.2f %s, %.0f MB/s)", pct, (double)done / unit,
               (double)total / unit, uname, rate);
    }
    p->last_pct = pct;
    p->last_print = now;
}
