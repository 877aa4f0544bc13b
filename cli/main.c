/*
 * cli/main.c - `tpserve`: one executable, many subcommands.
 *
 *   tpserve <command> [options]      run a command
 *   tpserve <command> --help         its options
 *   tpserve --help | --version
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct tp_cli_command commands[] = {
    {"bench", "benchmarks: comm, gen, serve, nodes (tables; --json)", tp_cmd_bench},
    {"comm-selftest", "check the collectives on every rank (run under 'tpserve launch')", tp_cmd_comm_selftest},
    {"generate", "generate text from a prompt on this machine (streams; tokens/s on stderr)", tp_cmd_generate},
    {"info", "describe a model: architecture, shapes, types, sizes, tokenizer, memory needed", tp_cmd_info},
    {"launch", "start N local ranks of a command (hostfile, ports, token; [rank k] output)", tp_cmd_launch},
    {"plan", "will a model fit on these machines: shards, memory per node, tokens/s", tp_cmd_plan},
    {"shard", "cut a model into one file per rank (that rank's slices + the plan)", tp_cmd_shard},
    {"serve", "serve the OpenAI-compatible HTTP API (rank 0; other ranks compute)", tp_cmd_serve},
    {"synth", "write a random-weight GGUF model of a real shape (speed and scale tests)", tp_cmd_synth},
    {"version", "print version and build configuration", tp_cmd_version},
};

static void usage(FILE *f)
{
    fprintf(f, "tpserve %s - distributed tensor-parallel LLM inference server\n\n", TP_VERSION_STRING);
    fprintf(f, "Usage: tpserve <command> [options]   (tpserve <command> --help for its options)\n\nCommands:\n");
    for (size_t i = 0; i < TP_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nEnvironment: TP_LOG_LEVEL=debug|info|warn|error\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) return tp_cmd_version(1, argv + 1);
    for (size_t i = 0; i < TP_ARRAY_LEN(commands); i++)
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tpserve: unknown command '%s' (run 'tpserve --help' for the list)\n", cmd);
    return 2;
}
