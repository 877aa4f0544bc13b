/*
 * cli/cli_group.c - how a command that may run as one rank of a group
 * (generate, bench gen, serve) decides its group: the environment set by
 * `tpserve launch` / a hostfile / a coordinator, or an MPI / PMI launcher
 * (mpirun, srun); started alone, it is a world of one.  Also the KV cache
 * type (--kv-type), which every rank of a group must share.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "parallel/parallel.h"

int tp_cli_group_config(const char *cmd, const char *comm_dtype, const char *kv_type, struct tp_parallel_config *pc,
                        int *rank_hint, const char **log_prefix)
{
    struct tp_error err = {0};
    if (tp_wire_dtype_parse(comm_dtype, &pc->wire_dtype) != TP_OK) {
        fprintf(stderr, "tpserve %s: --comm-dtype %s: want f32, f16, bf16 or q8\n", cmd, comm_dtype);
        return 1;
    }
    pc->model.kv_f16 = 0;
    if (tp_kv_type_parse(kv_type, &pc->model.kv_type) != TP_OK) {
        fprintf(stderr,
                "tpserve %s: --kv-type %s: want auto, f16 or bf16 (half the memory of f32), q8_0 (about a quarter) or "
                "f32\n",
                cmd, kv_type);
        return 1;
    }
    if (tp_comm_config_from_env(&pc->comm, &err) != TP_OK) {
        fprintf(stderr, "tpserve %s: %s\n", cmd, err.msg);
        return 2;
    }
    /* rank published by mpirun, srun or another PMI launcher */
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    const char *env_rank = NULL;
    for (size_t i = 0; i < TP_ARRAY_LEN(rank_vars) && !env_rank; i++) env_rank = getenv(rank_vars[i]);
    if (pc->comm.world_size < 0 && !env_rank) {
        pc->comm.world_size = 1;
        pc->comm.rank = 0;
    }
    int rank = pc->comm.rank >= 0 ? pc->comm.rank : env_rank ? atoi(env_rank) : 0;
    static char prefix[32];
    snprintf(prefix, sizeof prefix, "rank %d", rank);
    if (rank_hint) *rank_hint = rank;
    if (log_prefix) *log_prefix = pc->comm.world_size == 1 ? NULL : prefix;
    return 0;
}
