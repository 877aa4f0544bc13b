/* cli/cmd_version.c - `tpserve version`: version and build configuration. */
#include <stdio.h>

#include "cli.h"

int tp_cmd_version(int argc, char **argv)
{
    static const struct tp_opt opts[] = {{0}};
    int np = 0;
    int rc = tp_cli_parse("version", "Usage: tpserve version", opts, argc, argv, NULL, 0, &np, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    printf("tpserve %s\n", TP_VERSION_STRING);
    printf("backends: ring");
#ifdef TP_HAVE_MPI
    printf(", mpi");
#endif
#ifdef TP_HAVE_RDMA
    printf(", rdma");
#endif
    printf("\n");
#if defined(__APPLE__)
    printf("blas: accelerate\n");
#else
    printf("blas: openblas\n");
#endif
    return 0;
}
