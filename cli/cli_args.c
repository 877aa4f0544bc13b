/* cli/cli_args.c - a small, strict option parser for the tpserve subcommands. */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct tp_opt *find_long(const struct tp_opt *opts, const char *name, size_t len)
{
    for (const struct tp_opt *o = opts; o && o->long_name; o++)
        if (strlen(o->long_name) == len && strncmp(o->long_name, name, len) == 0) return o;
    return NULL;
}

static const struct tp_opt *find_short(const struct tp_opt *opts, char c)
{
    for (const struct tp_opt *o = opts; o && o->long_name; o++)
        if (o->short_name && o->short_name == c) return o;
    return NULL;
}

static int set_value(const char *cmd, const struct tp_opt *o, const char *val)
{
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case TP_OPT_FLAG:
        *(int *)o->dest = 1;
        return 0;
    case TP_OPT_INT: {
        long v = strtol(val, &end, 10);
        if (errno || !*val || *end) {
            fprintf(stderr, "tpserve %s: --%s expects an integer, got '%s'\n", cmd, o->long_name, val);
            return 2;
        }
        if ((o->min != 0 || o->max != 0) && (v < o->min || v > o->max)) {
            fprintf(stderr, "tpserve %s: --%s must be between %.0f and %.0f, got %ld\n", cmd, o->long_name, o->min,
                    o->max, v);
            return 2;
        }
        *(int *)o->dest = (int)v;
        return 0;
    }
    case TP_OPT_U64: {
        if (*val == '-') {
            fprintf(stderr, "tpserve %s: --%s expects a non-negative integer, got '%s'\n", cmd, o->long_name, val);
            return 2;
        }
        unsigned long long v = strtoull(val, &end, 10);
        if (errno || !*val || *end) {
            fprintf(stderr, "tpserve %s: --%s expects a non-negative integer, got '%s'\n", cmd, o->long_name, val);
            return 2;
        }
        *(uint64_t *)o->dest = (uint64_t)v;
        return 0;
    }
    case TP_OPT_FLOAT: {
        float v = strtof(val, &end);
        if (errno || !*val || *end || v != v) {
            fprintf(stderr, "tpserve %s: --%s expects a number, got '%s'\n", cmd, o->long_name, val);
            return 2;
        }
        if ((o->min != 0 || o->max != 0) && (v < o->min || v > o->max)) {
            fprintf(stderr, "tpserve %s: --%s must be between %g and %g, got %g\n", cmd, o->long_name, o->min,
                    o->max, (double)v);
            return 2;
        }
        *(float *)o->dest = v;
        return 0;
    }
    case TP_OPT_STRING:
    case TP_OPT_LIST:
        if (!*val) {
            fprintf(stderr, "tpserve %s: --%s expects a value, got an empty string\n", cmd, o->long_name);
            return 2;
        }
        *(const char **)o->dest = val;
        return 0;
    }
    return 2;
}

void tp_cli_print_help(const char *cmd, const char *usage, const struct tp_opt *opts)
{
    printf("%s\n", usage);
    if (opts && opts->long_name) printf("\nOptions:\n");
    for (const struct tp_opt *o = opts; o && o->long_name; o++) {
        char left[64];
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->long_name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->long_name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        printf("  %-30s %s\n", left, o->help ? o->help : "");
    }
    printf("  %-30s %s\n", "-h, --help", "show this help");
    (void)cmd;
}

int tp_cli_parse(const char *cmd, const char *usage, const struct tp_opt *opts, int argc, char **argv,
                 const char **pos, int max_pos, int *n_pos, int *rest_argc, char ***rest_argv)
{
    int np = 0;
    if (rest_argc) *rest_argc = 0;
    if (rest_argv) *rest_argv = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            if (!rest_argc || !rest_argv) {
                fprintf(stderr, "tpserve %s: unexpected '--'\n", cmd);
                return 2;
            }
            *rest_argc = argc - i - 1;
            *rest_argv = argv + i + 1;
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            tp_cli_print_help(cmd, usage, opts);
            return 1;
        }
        const struct tp_opt *o = NULL;
        const char *val = NULL;
        if (a[0] == '-' && a[1] == '-') {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            o = find_long(opts, name, len);
            if (!o) {
                fprintf(stderr, "tpserve %s: unknown option '%.*s' (see 'tpserve %s --help')\n", cmd, (int)len + 2, a,
                        cmd);
                return 2;
            }
            if (eq) {
                if (o->kind == TP_OPT_FLAG) {
                    fprintf(stderr, "tpserve %s: --%s takes no value\n", cmd, o->long_name);
                    return 2;
                }
                val = eq + 1;
            }
        } else if (a[0] == '-' && a[1] && !(a[1] >= '0' && a[1] <= '9')) {
            if (a[2]) {
                fprintf(stderr, "tpserve %s: unknown option '%s' (see 'tpserve %s --help')\n", cmd, a, cmd);
                return 2;
            }
            o = find_short(opts, a[1]);
            if (!o) {
                fprintf(stderr, "tpserve %s: unknown option '%s' (see 'tpserve %s --help')\n", cmd, a, cmd);
                return 2;
            }
        } else {
            if (np >= max_pos) {
                fprintf(stderr, "tpserve %s: unexpected argument '%s' (see 'tpserve %s --help')\n", cmd, a, cmd);
                return 2;
            }
            pos[np++] = a;
            continue;
        }
        if (o->kind != TP_OPT_FLAG && !val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tpserve %s: --%s needs a value%s%s\n", cmd, o->long_name, o->metavar ? " " : "",
                        o->metavar ? o->metavar : "");
                return 2;
            }
            val = argv[++i];
        }
        int rc = set_value(cmd, o, val ? val : "");
        if (rc) return rc;
    }
    if (n_pos) *n_pos = np;
    return 0;
}

void tp_cli_setup_logging(const char *prefix)
{
    const char *lvl = getenv("TP_LOG_LEVEL");
    enum tp_log_level l;
    if (lvl && tp_log_level_parse(lvl, &l) == TP_OK) tp_log_set_level(l);
    tp_log_set_hook(tp_log_stderr_hook, (void *)prefix);
}

int tp_cli_exit_for(enum tp_status st)
{
    return st == TP_ERR_PEER || st == TP_ERR_POISONED || st == TP_ERR_TIMEOUT ? TP_CLI_EXIT_PEER_LOST : 1;
}

int tp_cli_fail(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tpserve %s: %s\n", cmd, msg);
    return 1;
}

int tp_cli_check_memory(const char *cmd, const char *what, uint64_t bytes, const char *fix)
{
    const uint64_t ram = tp_mem_total_bytes();
    if (ram == 0 || bytes <= ram / 2) return 0;
    fprintf(stderr, "tpserve %s: %s needs %llu MiB, more than half of this machine's %llu MiB of memory; %s\n", cmd, what,
            (unsigned long long)((bytes + (1u << 20) - 1) >> 20), (unsigned long long)(ram >> 20), fix);
    return 2;
}
