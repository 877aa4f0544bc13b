/*
 * tests/fuzz/fuzz_driver.h - the plain replay driver shared by the fuzz
 * targets' TP_FUZZ_STANDALONE builds (fuzz_gguf_replay,
 * fuzz_safetensors_replay, fuzz_hf_json_replay): the same input handling
 * without libFuzzer, so the seeds and a bounded run of random mutations go
 * through every build (the ASan/UBSan one included).
 *
 *   NAME --seeds DIR             write the built-in seeds (the libFuzzer corpus)
 *   NAME --mutate SECONDS [FILE...]
 *                                replay seeds + files, check the seeds, then
 *                                mutate random corpus entries for SECONDS
 *   NAME FILE...                 replay files (crash reproducers)
 * Prints "... no crash" at the end (ctest matches it).
 */
#ifndef TP_TESTS_FUZZ_DRIVER_H
#define TP_TESTS_FUZZ_DRIVER_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct tp_fuzz_target {
    const char *name;      /* program name in messages, e.g. "fuzz_gguf_replay" */
    const char *seed_ext;  /* extension of the seed files written by --seeds, e.g. ".gguf" */
    int n_seeds;
    /* Seed i: a malloc'd buffer (caller frees), *n its size. */
    uint8_t *(*seed)(int i, size_t *n);
    /* Mutate p[0..*n) in place; at most cap bytes.  Use tp_fuzz_rand(). */
    void (*mutate)(uint8_t *p, size_t *n, size_t cap);
    /* Optional, after the corpus was replayed: check the seeds (valid ones
     * accepted, corrupt ones refused).  0 = fine; else it printed why. */
    int (*check)(uint8_t *const *seeds, const size_t *sizes, int n_seeds);
};

/* A growing byte buffer for building seeds (b: malloc'd, owned by the caller). */
struct tp_fuzz_buf {
    uint8_t *b;
    size_t n, cap;
};
/* Append n bytes of p (aborts when out of memory: a test driver). */
void tp_fuzz_put(struct tp_fuzz_buf *b, const void *p, size_t n);

/* xorshift64, fixed start: runs are repeatable. */
uint64_t tp_fuzz_rand(void);

/* The driver's main (see the file comment); returns the exit status. */
int tp_fuzz_main(const struct tp_fuzz_target *t, int argc, char **argv);

#endif /* TP_TESTS_FUZZ_DRIVER_H */
