/*
 * tests/fuzz/fuzz_safetensors.c - fuzz target for the safetensors reader
 * (model/safetensors.c).
 *
 * LLVMFuzzerTestOneInput opens the input with tp_st_open_mem and, when it is
 * accepted, walks every tensor: lookup by name must find the same record,
 * the first and last data bytes are read (out-of-bounds is a sanitizer
 * report), extents must lie inside the input, and tp_st_pread of the last
 * byte must succeed while one past the end must be refused.  Every refusal
 * must carry a message.
 *
 * Built two ways (tests/model.cmake):
 *   - with clang -fsanitize=fuzzer,address,undefined as `fuzz_safetensors`
 *     (libFuzzer main), run for a bounded time on the seed corpus;
 *   - with TP_FUZZ_STANDALONE as `fuzz_safetensors_replay`, a plain driver:
 *       fuzz_safetensors_replay --seeds DIR       write the seed corpus
 *       fuzz_safetensors_replay --mutate SECONDS [FILE...]
 *                                                 replay seeds + files, then random mutations
 *       fuzz_safetensors_replay FILE...           replay files (crash reproducers)
 * The seeds are handcrafted: a valid file with several dtypes, metadata and
 * an empty tensor, plus corrupt variants (length, JSON, dtype, shape,
 * offsets, overlap, duplicates).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_st_t *st = NULL;
    struct tp_error err = {0};
    if (tp_st_open_mem("fuzz", data, size, &st, &err) != TP_OK) {
        if (err.msg[0] == '\0' || st) abort(); /* every refusal must say why, and leave nothing */
        return 0;
    }
    uint64_t acc = 0;
    const char *fmt = tp_st_metadata(st, "format");
    if (fmt) acc += strlen(fmt);
    for (int i = 0; i < tp_st_n_tensors(st); i++) {
        const struct tp_st_tensor *t = tp_st_tensor(st, i);
        if (tp_st_find(st, t->name) != t) abort();
        if (t->n_dims < 0 || t->n_dims > TP_ST_MAX_DIMS) abort();
        if ((uint64_t)t->n_elems * tp_st_dtype_size(t->dtype) != t->n_bytes) abort();
        if (t->file_offset > size || t->n_bytes > size - t->file_offset) abort();
        if (t->n_bytes) {
            const uint8_t *p = t->data;
            acc += p[0] + p[t->n_bytes - 1];
            uint8_t last;
            struct tp_error e = {0};
            if (tp_st_pread(st, t, &last, 1, t->n_bytes - 1, &e) != TP_OK || last != p[t->n_bytes - 1]) abort();
            if (tp_st_pread(st, t, &last, 1, t->n_bytes, &e) == TP_OK) abort();
        }
    }
    sink += acc;
    tp_st_close(st);
    return 0;
}

#ifdef TP_FUZZ_STANDALONE
#include "common/common.h"
#include "fuzz_driver.h"

/* variant 0: valid; 1..: one corruption each */
static const char *const k_headers[] = {
    /* 0 valid */
    "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[32,40]},"
    "\"q\":{\"dtype\":\"U32\",\"shape\":[2,2],\"data_offsets\":[40,56]},"
    "\"e\":{\"dtype\":\"I8\",\"shape\":[0],\"data_offsets\":[56,56]},"
    "\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[56,58]}}",
    /* 1 bad JSON */
    "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]",
    /* 2 unknown dtype */
    "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2,4],\"data_offsets\":[0,32]}}",
    /* 3 shape mismatch */
    "{\"w\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,32]}}",
    /* 4 overlap */
    "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]},\"v\":{\"dtype\":\"U8\",\"shape\":[4],"
    "\"data_offsets\":[30,34]}}",
    /* 5 outside */
    "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[4096,4128]}}",
    /* 6 duplicate */
    "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"w\":{\"dtype\":\"U8\",\"shape\":[1],"
    "\"data_offsets\":[1,2]}}",
    /* 7 huge shape */
    "{\"w\":{\"dtype\":\"F64\",\"shape\":[9007199254740992,9007199254740992],\"data_offsets\":[0,8]}}",
};
#define N_SEEDS 9 /* + variant 8: header length past the end */

static void seed(struct tp_fuzz_buf *b, int variant)
{
    b->n = 0;
    const char *h = k_headers[variant < 8 ? variant : 0];
    uint64_t len = strlen(h);
    uint64_t hl = variant == 8 ? len + 1000 : len;
    tp_fuzz_put(b, &hl, 8);
    tp_fuzz_put(b, h, (size_t)len);
    for (int i = 0; i < 64; i++) tp_fuzz_put(b, &(uint8_t){(uint8_t)(i * 7)}, 1);
}

/* Byte mutations plus JSON-aware ones: digits and punctuation swapped in. */
static void mutate(uint8_t *p, size_t *n, size_t cap)
{
    static const char tokens[] = "0123456789[]{},:\"-.e";
    int k = 1 + (int)(tp_fuzz_rand() % 4);
    for (int i = 0; i < k && *n; i++) {
        size_t at = tp_fuzz_rand() % *n;
        switch (tp_fuzz_rand() % 7) {
        case 0: p[at] ^= (uint8_t)(1u << (tp_fuzz_rand() % 8)); break;
        case 1: p[at] = (uint8_t)tp_fuzz_rand(); break;
        case 2: p[at] = (uint8_t)tokens[tp_fuzz_rand() % (sizeof(tokens) - 1)]; break;
        case 3: *n = at; break; /* truncate */
        case 4:
            if (*n < cap) {
                memmove(p + at + 1, p + at, *n - at);
                p[at] = (uint8_t)tokens[tp_fuzz_rand() % (sizeof(tokens) - 1)];
                (*n)++;
            }
            break;
        case 5: { /* header length field */
            static const uint64_t vals[] = {0, 1, 2, 7, 0xffffffffffffffffull, 1ull << 32, 100ull << 20};
            uint64_t v = vals[tp_fuzz_rand() % 7];
            if (*n >= 8) memcpy(p, &v, 8);
            break;
        }
        default:
            if (at + 1 < *n) { /* delete a byte */
                memmove(p + at, p + at + 1, *n - at - 1);
                (*n)--;
            }
            break;
        }
    }
}

static uint8_t *seed_bytes(int i, size_t *n)
{
    struct tp_fuzz_buf b = {0};
    seed(&b, i);
    *n = b.n;
    return b.b;
}

/* The valid seed (0) must be accepted with its 5 tensors, every corrupt one refused. */
static int check_seeds(uint8_t *const *seeds, const size_t *sizes, int n_seeds)
{
    for (int v = 0; v < n_seeds; v++) {
        tp_st_t *st = NULL;
        enum tp_status rc = tp_st_open_mem("seed", seeds[v], sizes[v], &st, NULL);
        int bad = (v == 0) != (rc == TP_OK) || (v == 0 && tp_st_n_tensors(st) != 5);
        tp_st_close(st);
        if (bad) {
            fprintf(stderr, "fuzz_safetensors_replay: seed %d was %s\n", v, rc == TP_OK ? "accepted" : "refused");
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct tp_fuzz_target t = {"fuzz_safetensors_replay", ".safetensors", N_SEEDS, seed_bytes, mutate,
                                            check_seeds};
    return tp_fuzz_main(&t, argc, argv);
}
#endif
