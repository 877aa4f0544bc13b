/*
 * tests/fuzz/fuzz_driver.c - the replay / random-mutation driver shared by
 * the fuzz targets' standalone builds (see fuzz_driver.h).
 */
#include "fuzz_driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"

#define CORPUS_MAX 64
#define INPUT_CAP (1u << 16)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

void tp_fuzz_put(struct tp_fuzz_buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->b = realloc(b->b, b->cap);
        if (!b->b) abort();
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}

uint64_t tp_fuzz_rand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(sz > 0 ? (size_t)sz : 1);
    if (p && sz > 0 && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = sz > 0 ? (size_t)sz : 0;
    return p;
}

static int write_seeds(const struct tp_fuzz_target *t, const char *dir)
{
    mkdir(dir, 0755);
    for (int i = 0; i < t->n_seeds; i++) {
        size_t n = 0;
        uint8_t *p = t->seed(i, &n);
        char path[1024];
        snprintf(path, sizeof path, "%s/seed%02d%s", dir, i, t->seed_ext);
        FILE *f = fopen(path, "wb");
        if (!f || !p) {
            fprintf(stderr, "%s: cannot write %s\n", t->name, path);
            if (f) fclose(f);
            free(p);
            return 1;
        }
        if (n) fwrite(p, 1, n, f);
        fclose(f);
        free(p);
    }
    return 0;
}

int tp_fuzz_main(const struct tp_fuzz_target *t, int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--seeds") == 0) return write_seeds(t, argv[2]);
    double seconds = 0;
    int first = 1, rc = 0;
    if (argc >= 3 && strcmp(argv[1], "--mutate") == 0) {
        seconds = atof(argv[2]);
        first = 3;
    }
    uint8_t *corp[CORPUS_MAX];
    size_t corp_n[CORPUS_MAX];
    int nc = 0;
    for (int i = 0; i < t->n_seeds && nc < CORPUS_MAX; i++) {
        corp[nc] = t->seed(i, &corp_n[nc]);
        if (!corp[nc]) {
            fprintf(stderr, "%s: out of memory\n", t->name);
            return 1;
        }
        nc++;
    }
    const int n_seeds = nc;
    for (int i = first; i < argc && nc < CORPUS_MAX; i++) {
        uint8_t *p = read_file(argv[i], &corp_n[nc]);
        if (!p) {
            fprintf(stderr, "%s: cannot read %s\n", t->name, argv[i]);
            rc = 1;
            goto out;
        }
        corp[nc++] = p;
    }
    for (int i = 0; i < nc; i++) LLVMFuzzerTestOneInput(corp[i], corp_n[i]);
    if (t->check && t->check(corp, corp_n, n_seeds) != 0) {
        rc = 1;
        goto out;
    }
    uint64_t iters = 0;
    if (seconds > 0) {
        uint8_t *work = malloc(INPUT_CAP);
        if (!work) {
            rc = 1;
            goto out;
        }
        double t_end = tp_now_s() + seconds;
        while (tp_now_s() < t_end) {
            for (int r = 0; r < 64; r++) {
                int c = (int)(tp_fuzz_rand() % (uint64_t)nc);
                size_t n = corp_n[c] < INPUT_CAP ? corp_n[c] : INPUT_CAP;
                memcpy(work, corp[c], n);
                t->mutate(work, &n, INPUT_CAP);
                uint8_t *exact = malloc(n ? n : 1); /* exact size so ASan sees reads past the end */
                if (!exact) break;
                memcpy(exact, work, n);
                LLVMFuzzerTestOneInput(exact, n);
                free(exact);
                iters++;
            }
        }
        free(work);
    }
    printf("%s: %d inputs replayed, %llu mutations, no crash\n", t->name, nc, (unsigned long long)iters);
out:
    for (int i = 0; i < nc; i++) free(corp[i]);
    return rc;
}
