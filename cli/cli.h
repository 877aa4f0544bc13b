/*
 * cli/cli.h - private: the `tpserve` command line.  Each subcommand lives
 * in its own cmd_*.c file and is listed in the table in main.c.
 *
 * Exit codes: 0 success, 1 runtime failure, 2 usage error (bad flag/value),
 * TP_CLI_EXIT_PEER_LOST (3) a rank of a group stopped because another rank
 * was lost (`tpserve launch` reports another rank's failure before such one).
 */
#ifndef TP_SERVER_CLI_H
#define TP_SERVER_CLI_H

#include <stdint.h>

#include "common/common.h"

enum tp_opt_kind {
    TP_OPT_FLAG = 0, /* int: set to 1 when present */
    TP_OPT_INT,      /* int within [min, max] */
    TP_OPT_U64,      /* uint64_t */
    TP_OPT_FLOAT,    /* float within [min, max] */
    TP_OPT_STRING,   /* const char * pointing into argv */
    TP_OPT_LIST      /* const char * (comma separated list, validated by the command) */
};

/* One option: `--long_name VALUE`, `--long_name=VALUE` or `-s VALUE`. */
struct tp_opt {
    const char *long_name;  /* without dashes */
    char short_name;        /* 0: none */
    enum tp_opt_kind kind;
    void *dest;
    const char *metavar;    /* for help, e.g. "N" */
    const char *help;
    double min, max;        /* for INT/FLOAT; both 0: no range check */
};

/*
 * Parse argv[1..argc) (argv[0] is the subcommand name) against opts
 * (terminated by an entry with long_name NULL).  Positional arguments are
 * returned in pos (at most max_pos; more is a usage error).  Everything after
 * a bare `--` is returned via rest_argc/rest_argv when those are non-NULL
 * (else `--` is a usage error).  `-h`/`--help` prints help built from usage
 * and opts to stdout.
 * Returns 0 to proceed, 1 when help was printed (exit 0), 2 after printing a
 * one-line error to stderr (exit 2).
 */
int tp_cli_parse(const char *cmd, const char *usage, const struct tp_opt *opts, int argc, char **argv,
                 const char **pos, int max_pos, int *n_pos, int *rest_argc, char ***rest_argv);
/* In a command, after rc = tp_cli_parse(...): return the command's exit status
 * (0 after --help, 2 after a usage error) unless rc says to proceed. */
#define TP_CLI_RETURN_UNLESS_PARSED(rc)     \
    do {                                    \
        if (rc) return (rc) == 1 ? 0 : (rc); \
    } while (0)

/* Print the options table (used by tp_cli_parse for --help). */
void tp_cli_print_help(const char *cmd, const char *usage, const struct tp_opt *opts);

/* Install the stderr log hook with an optional prefix (e.g. "rank 1"). */
void tp_cli_setup_logging(const char *prefix);

/* One-line error "tpserve CMD: message" to stderr; returns exit code 1. */
int tp_cli_fail(const char *cmd, const char *fmt, ...) TP_PRINTF(2, 3);
/* A usage check for a command that writes `bytes` of memory in full (benchmark buffers): 0 when they fit in
 * half of this machine's memory (or its size is unknown); else prints "tpserve CMD: WHAT needs N MiB, more
 * than half of this machine's M MiB of memory; FIX" to stderr and returns exit code 2. */
int tp_cli_check_memory(const char *cmd, const char *what, uint64_t bytes, const char *fix);
/* `serve` on a worker that rank 0 left out of the group (it re-planned without it, and refused the
 * worker when it came back: the only TP_ERR_CANCELLED a worker's group formation returns): `launch`
 * neither restarts it nor takes it for a failure (docs/cli.md). */
#define TP_CLI_EXIT_LEFT_OUT 88

#define TP_CLI_EXIT_PEER_LOST 3
/* The exit code of a rank whose group work failed with st: TP_CLI_EXIT_PEER_LOST when st says another
 * rank was lost (TP_ERR_PEER, TP_ERR_POISONED, TP_ERR_TIMEOUT), else 1. */
int tp_cli_exit_for(enum tp_status st);

/* Model-loading progress (load_progress.c): a bar on a terminal, else a log
 * line per 10% / 5 s.  Set cfg.model.progress = tp_cli_load_progress and
 * cfg.model.progress_ctx = &state after tp_cli_progress_init(&state, "rank 1"). */
struct tp_cli_progress {
    char label[48];
    int tty;
    int last_pct;
    double t0, last_print;
};
void tp_cli_progress_init(struct tp_cli_progress *p, const char *label);
void tp_cli_load_progress(void *ctx, uint64_t done, uint64_t total);

struct tp_parallel_config;
/*
 * For commands that run alone or as one rank of a group (generate, bench gen,
 * serve): parse --comm-dtype into pc->wire_dtype and --kv-type (f16 | q8_0 | f32)
 * into pc->model.kv_type, fill pc->comm from the
 * environment, and make it a world of one unless `tpserve launch`, a hostfile,
 * a coordinator or an MPI/PMI launcher (mpirun, srun) says otherwise.
 * *rank_hint: this process's rank as far as known before the group forms;
 * *log_prefix: "rank N" for a group, NULL alone (static storage).  Either
 * may be NULL.  Returns 0, 1 after printing a bad --comm-dtype / --kv-type,
 * 2 after printing a bad environment variable.
 */
int tp_cli_group_config(const char *cmd, const char *comm_dtype, const char *kv_type, struct tp_parallel_config *pc,
                        int *rank_hint, const char **log_prefix);
/* Help text of --kv-type, shared by the commands that take it. */
#define TP_CLI_KV_TYPE_HELP                                                                                      \
    "KV cache element type: auto (default: bf16 where the attention reads it in place, AVX-512 BF16 CPUs, else "  \
    "f16), f16, bf16 (head_dim % 16 == 0), q8_0 (0.53x the memory of f16, head_dim % 8 == 0) or f32"
#define TP_CLI_MOE_SPLIT_HELP                                                                                     \
    "mixture of experts under launch/mpirun: auto (default: the plan chooses and says why), tensor (a slice of "  \
    "every expert per rank) or expert (whole experts per rank)"
/* Help texts of the draft model's placement flags (serve, generate). */
#define TP_CLI_DRAFT_PLACEMENT_HELP                                                                              \
    "--spec draft under launch/mpirun: where the draft model runs: auto (default: decided at start from its "   \
    "bytes per rank, the memory bandwidth and the time of an all_sum, and logged with its reason), rank0 or "     \
    "sharded (a slice on every rank, one pair of all_sums per draft layer and drafted token)"
#define TP_CLI_DRAFT_MEM_BW_HELP                                                                                 \
    "memory bandwidth of this rank in GB/s for --draft-placement auto (default: measured at start)"
#define TP_CLI_DRAFT_ALLSUM_HELP                                                                                 \
    "time of one all_sum in microseconds for --draft-placement auto, e.g. from `tpserve bench comm` (default: "   \
    "rank 0 times a few at start)"


/* Subcommand entry point: argv[0] is the subcommand name. Returns exit code. */
typedef int (*tp_cli_fn)(int argc, char **argv);
struct tp_cli_command {
    const char *name;
    const char *summary;
    tp_cli_fn run;
};

/* Subcommands (one file each). Add new ones here and in main.c's table. */
int tp_cmd_version(int argc, char **argv);
int tp_cmd_bench(int argc, char **argv); /* dispatches to tp_bench_* (table in cmd_bench.c) */
int tp_cmd_synth(int argc, char **argv); /* random-weight model of a real shape (cmd_synth.c) */
int tp_cmd_info(int argc, char **argv);  /* describe a model file (cmd_info.c) */
int tp_cmd_generate(int argc, char **argv); /* prompt -> streamed text (cmd_generate.c) */
int tp_cmd_plan(int argc, char **argv);  /* capacity planner (cmd_plan.c) */
/* `tpserve launch --hostfile FILE ... -- CMD`: one rank per hostfile entry over ssh, or mpirun with
 * --backend mpi (launch_ssh.c).  argv[0] is "launch"; parses all of launch's options itself. */
int tp_launch_hostfile_main(int argc, char **argv);
/* A fresh cluster token for launched ranks: 32 bytes from OpenSSL's RAND_bytes
 * as 64 hex digits in out (cap >= 65).  0, or -1 when the generator failed. */
int tp_launch_random_token(char *out, size_t cap);
int tp_cmd_shard(int argc, char **argv); /* one GGUF per rank (cmd_shard.c) */
int tp_cmd_serve(int argc, char **argv); /* OpenAI-compatible HTTP server (cmd_serve.c) */
int tp_cmd_launch(int argc, char **argv);        /* N local ranks of a command (cmd_launch.c) */
int tp_cmd_comm_selftest(int argc, char **argv); /* collective check per rank (cmd_launch.c) */

/* Benchmarks (`tpserve bench NAME`), one file each: add here and to cmd_bench.c's table. */
int tp_bench_comm(int argc, char **argv);    /* collectives per message size (bench_comm.c) */
int tp_bench_serve(int argc, char **argv);   /* load test of a running server (bench_serve.c) */
int tp_bench_kernels(int argc, char **argv); /* matrix kernels vs streaming read (bench_kernels.c) */
int tp_bench_gen(int argc, char **argv);     /* prefill/decode tokens/s vs memory bandwidth (bench_gen.c) */
int tp_bench_nodes(int argc, char **argv);   /* tokens/s per node count on simulated hosts (bench_nodes.c) */
int tp_bench_attn(int argc, char **argv);    /* attention kernel GFLOP/s per path (bench_attn.c) */

#endif /* TP_SERVER_CLI_H */
