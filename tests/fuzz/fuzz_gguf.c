/*
 * tests/fuzz/fuzz_gguf.c - fuzz target for the GGUF reader (model/gguf.c).
 *
 * LLVMFuzzerTestOneInput opens the input with tp_gguf_open_mem and, when it
 * is accepted, walks every accessor (keys, scalars, arrays, tensor data
 * first/last bytes): any out-of-bounds read is a sanitizer report.
 *
 * Built two ways (tests/model.cmake):
 *   - with clang -fsanitize=fuzzer,address,undefined as `fuzz_gguf` (libFuzzer
 *     main), run for a bounded time on the seed corpus;
 *   - with TP_FUZZ_STANDALONE as `fuzz_gguf_replay`, a plain driver:
 *       fuzz_gguf_replay --seeds DIR          write the seed corpus
 *       fuzz_gguf_replay --mutate SECONDS [FILE...]
 *                                             replay the built-in seeds and the
 *                                             files, then random mutations of them
 *       fuzz_gguf_replay FILE...              replay files (crash reproducers)
 * The seeds are handcrafted: a valid file with every value type, string and
 * numeric arrays and two tensors, plus corrupt variants of it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_gguf_t *g = NULL;
    struct tp_error err = {0};
    if (tp_gguf_open_mem("fuzz", data, size, &g, &err) != TP_OK) {
        if (err.msg[0] == '\0') abort(); /* every refusal must say why */
        return 0;
    }
    uint64_t acc = 0;
    for (int i = 0; i < tp_gguf_n_kv(g); i++) {
        const char *key = tp_gguf_key(g, i);
        acc += strlen(key);
        int64_t iv;
        uint64_t uv;
        double dv;
        int bv;
        const char *sv;
        if (tp_gguf_get_int(g, key, &iv) == TP_OK) acc += (uint64_t)iv;
        if (tp_gguf_get_u64(g, key, &uv) == TP_OK) acc += uv;
        if (tp_gguf_get_float(g, key, &dv) == TP_OK) acc += (uint64_t)(dv != dv);
        if (tp_gguf_get_bool(g, key, &bv) == TP_OK) acc += (uint64_t)bv;
        if (tp_gguf_get_str(g, key, &sv) == TP_OK) acc += strlen(sv);
        uint64_t n = tp_gguf_arr_len(g, i);
        if (tp_gguf_arr_type(g, i) == TP_GGUF_STRING) {
            for (uint64_t j = 0; j < n && j < 4096; j++) {
                size_t len;
                const char *s = tp_gguf_arr_str(g, i, j, &len);
                if (!s) abort();
                if (len) acc += (uint8_t)s[0] + (uint8_t)s[len - 1];
            }
        } else if (n) {
            uint64_t m = n < 4096 ? n : 4096;
            float f[4096];
            int32_t q[4096];
            if (tp_gguf_arr_copy_f32(g, i, f, m) == TP_OK) acc += (uint64_t)(f[m - 1] != f[m - 1]);
            if (tp_gguf_arr_copy_i32(g, i, q, m) == TP_OK) acc += (uint64_t)q[m - 1];
        }
    }
    for (int i = 0; i < tp_gguf_n_tensors(g); i++) {
        const struct tp_gguf_tensor *t = tp_gguf_tensor(g, i);
        if (tp_gguf_find_tensor(g, t->name) != t) abort();
        if (t->n_bytes) {
            const uint8_t *p = t->data;
            if (t->file_offset + t->n_bytes > size) abort();
            acc += p[0] + p[t->n_bytes - 1];
        }
    }
    sink += acc;
    tp_gguf_close(g);
    return 0;
}

#ifdef TP_FUZZ_STANDALONE
#include "common/common.h"
#include "fuzz_driver.h"

static void u32(struct tp_fuzz_buf *b, uint32_t v) { tp_fuzz_put(b, &v, 4); }
static void u64(struct tp_fuzz_buf *b, uint64_t v) { tp_fuzz_put(b, &v, 8); }
static void str(struct tp_fuzz_buf *b, const char *s)
{
    u64(b, strlen(s));
    tp_fuzz_put(b, s, strlen(s));
}

/* variant 0: valid; 1..: one field corrupted */
static void seed(struct tp_fuzz_buf *b, int variant)
{
    b->n = 0;
    u32(b, variant == 1 ? 0x12345678u : 0x46554747u);
    u32(b, variant == 2 ? 1 : 3);
    u64(b, 2);
    u64(b, 8);
    str(b, "general.architecture");
    u32(b, 8);
    str(b, "llama");
    str(b, "general.alignment");
    u32(b, 4);
    u32(b, variant == 3 ? 24 : 32);
    str(b, "t.u8");
    u32(b, 0);
    tp_fuzz_put(b, "\x07", 1);
    str(b, "t.i16");
    u32(b, 3);
    tp_fuzz_put(b, "\xff\xff", 2);
    str(b, "t.u64");
    u32(b, 10);
    u64(b, variant == 4 ? UINT64_MAX : 42);
    str(b, "t.f64");
    u32(b, 12);
    double d = 2.5;
    tp_fuzz_put(b, &d, 8);
    str(b, "t.strs");
    u32(b, 9);
    u32(b, 8);
    u64(b, 3);
    str(b, "x");
    str(b, "");
    str(b, "yz");
    str(b, "t.floats");
    u32(b, 9);
    u32(b, 6);
    u64(b, variant == 5 ? 1000000 : 2);
    float f[2] = {1.0f, -1.0f};
    tp_fuzz_put(b, f, 8);
    str(b, "w");
    u32(b, 2);
    u64(b, 32);
    u64(b, 2);
    u32(b, variant == 6 ? 99 : 8);
    u64(b, 0);
    str(b, "v");
    u32(b, 1);
    u64(b, variant == 7 ? (1ull << 62) : 4);
    u32(b, 0);
    u64(b, variant == 8 ? 8 : 96);
    while (b->n % 32) tp_fuzz_put(b, "", 1);
    for (int i = 0; i < 96 + 16; i++) tp_fuzz_put(b, &(uint8_t){(uint8_t)i}, 1);
    if (variant == 9) b->n -= 5;
}
#define N_SEEDS 10

static void mutate(uint8_t *p, size_t *n, size_t cap)
{
    int k = 1 + (int)(tp_fuzz_rand() % 4);
    for (int i = 0; i < k && *n; i++) {
        size_t at = tp_fuzz_rand() % *n;
        switch (tp_fuzz_rand() % 6) {
        case 0: p[at] ^= (uint8_t)(1u << (tp_fuzz_rand() % 8)); break;
        case 1: p[at] = (uint8_t)tp_fuzz_rand(); break;
        case 2: { /* interesting u64 */
            static const uint64_t vals[] = {0, 1, 31, 32, 0x7fffffffffffffffull, 0xffffffffffffffffull, 1ull << 32, 255};
            uint64_t v = vals[tp_fuzz_rand() % 8];
            if (at + 8 <= *n) memcpy(p + at, &v, 8);
            break;
        }
        case 3: *n = at; break; /* truncate */
        case 4: if (*n < cap) { memmove(p + at + 1, p + at, *n - at); p[at] = (uint8_t)tp_fuzz_rand(); (*n)++; } break;
        default: { uint32_t v = (uint32_t)(tp_fuzz_rand() % 40); if (at + 4 <= *n) memcpy(p + at, &v, 4); break; }
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

/* The valid seed (0) must be accepted. */
static int check_seeds(uint8_t *const *seeds, const size_t *sizes, int n_seeds)
{
    (void)n_seeds;
    tp_gguf_t *g = NULL;
    if (tp_gguf_open_mem("seed0", seeds[0], sizes[0], &g, NULL) != TP_OK || tp_gguf_n_tensors(g) != 2) {
        fprintf(stderr, "fuzz_gguf_replay: the valid seed was refused\n");
        tp_gguf_close(g);
        return 1;
    }
    tp_gguf_close(g);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct tp_fuzz_target t = {"fuzz_gguf_replay", ".gguf", N_SEEDS, seed_bytes, mutate, check_seeds};
    return tp_fuzz_main(&t, argc, argv);
}
#endif
