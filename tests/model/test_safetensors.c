/*
 * tests/model/test_safetensors.c - the safetensors reader (model/safetensors.c):
 * a valid file built by hand (header + data) read back value for value, a
 * sharded set through model.safetensors.index.json, and one handcrafted
 * corrupt variant per check, each refused with a message naming the problem.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/safetensors.h"
#include "tests/tp_test.h"

/* Build header JSON + data into a malloc'd file image.  hlen_override != 0 writes
 * that header length instead of the real one. */
static uint8_t *make_st(const char *json, const void *data, size_t data_len, uint64_t hlen_override, size_t *out_len)
{
    size_t hl = strlen(json);
    size_t n = 8 + hl + data_len;
    uint8_t *b = malloc(n ? n : 1);
    uint64_t h = hlen_override ? hlen_override : hl;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
    memcpy(b + 8, json, hl);
    if (data_len) memcpy(b + 8 + hl, data, data_len);
    *out_len = n;
    return b;
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_FATAL(fwrite(buf, 1, len, f) == len);
    fclose(f);
}

static const char *k_valid =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"q\":{\"dtype\":\"U32\",\"shape\":[2,1],\"data_offsets\":[32,40]},"
    "\"e\":{\"dtype\":\"I8\",\"shape\":[0],\"data_offsets\":[40,40]}}  ";

static void fill_data(uint8_t *d)
{
    float f[6] = {1, 2, 3, 4, 5, 6};
    memcpy(d, f, 24);
    for (int i = 0; i < 4; i++) {
        uint16_t h = tp_f32_to_bf16((float)(i + 10));
        memcpy(d + 24 + 2 * i, &h, 2);
    }
    uint32_t u[2] = {0xdeadbeefu, 7};
    memcpy(d + 32, u, 8);
}

static void test_valid(void)
{
    uint8_t data[40];
    fill_data(data);
    size_t len;
    uint8_t *img = make_st(k_valid, data, sizeof(data), 0, &len);
    char path[512];
    snprintf(path, sizeof(path), "%s/valid.safetensors", tp_test_tmpdir());
    write_file(path, img, len);
    for (int pass = 0; pass < 2; pass++) {
        tp_st_t *st = NULL;
        struct tp_error err = {0};
        enum tp_status rc = pass ? tp_st_open_mem("mem", img, len, &st, &err) : tp_st_open(path, &st, &err);
        CU_ASSERT_EQUAL_FATAL(rc, TP_OK);
        CU_ASSERT_EQUAL(tp_st_n_tensors(st), 4);
        CU_ASSERT_EQUAL(tp_st_n_files(st), 1);
        CU_ASSERT_STRING_EQUAL(tp_st_metadata(st, "format"), "pt");
        CU_ASSERT_PTR_NULL(tp_st_metadata(st, "nope"));
        CU_ASSERT_STRING_EQUAL(tp_st_tensor(st, 0)->name, "a"); /* sorted */
        const struct tp_st_tensor *b = tp_st_find(st, "b");
        CU_ASSERT_PTR_NOT_NULL_FATAL(b);
        CU_ASSERT_EQUAL(b->dtype, TP_ST_F32);
        CU_ASSERT_EQUAL(b->n_dims, 2);
        CU_ASSERT_EQUAL(b->shape[0], 2);
        CU_ASSERT_EQUAL(b->shape[1], 3);
        CU_ASSERT_EQUAL(b->n_elems, 6);
        CU_ASSERT_EQUAL(b->n_bytes, 24);
        CU_ASSERT_EQUAL(b->file_offset, 8 + strlen(k_valid));
        float f[6];
        memcpy(f, b->data, 24);
        CU_ASSERT_EQUAL(f[5], 6.0f);
        /* slice read: row 1 of b, then bytes past the end refused */
        float row[3];
        CU_ASSERT_EQUAL(tp_st_pread(st, b, row, 12, 12, &err), TP_OK);
        CU_ASSERT_EQUAL(row[0], 4.0f);
        CU_ASSERT_EQUAL(row[2], 6.0f);
        struct tp_error e2 = {0};
        CU_ASSERT_EQUAL(tp_st_pread(st, b, row, 12, 16, &e2), TP_ERR_INVALID_ARG);
        CU_ASSERT_PTR_NOT_NULL(strstr(e2.msg, "outside"));
        const struct tp_st_tensor *a = tp_st_find(st, "a");
        uint16_t h;
        memcpy(&h, (const uint8_t *)a->data + 6, 2);
        CU_ASSERT_EQUAL(tp_bf16_to_f32(h), 13.0f);
        const struct tp_st_tensor *q = tp_st_find(st, "q");
        uint32_t u;
        memcpy(&u, q->data, 4);
        CU_ASSERT_EQUAL(u, 0xdeadbeefu);
        CU_ASSERT_EQUAL(q->dtype, TP_ST_U32);
        const struct tp_st_tensor *e = tp_st_find(st, "e");
        CU_ASSERT_EQUAL(e->n_bytes, 0);
        CU_ASSERT_PTR_NULL(e->data);
        CU_ASSERT_PTR_NULL(tp_st_find(st, "c"));
        tp_st_close(st);
    }
    free(img);
    tp_st_close(NULL);
}

struct bad_case {
    const char *what;
    const char *json;
    size_t data_len;
    uint64_t hlen_override;
    const char *expect; /* substring of the error */
};

static void test_corrupt(void)
{
    static const struct bad_case cases[] = {
        {"header length past the end", "{}", 0, 4096, "runs past the end of the file"},
        {"header length absurd", "{}", 0, (uint64_t)1 << 40, "exceeds"},
        {"bad JSON", "{\"a\":{\"dtype\":\"F32\",", 0, 0, "not valid JSON"},
        {"not an object", "[1,2]   ", 0, 0, "does not start with '{'"},
        {"trailing garbage", "{} x", 0, 0, "trailing bytes"},
        {"unknown dtype", "{\"w\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0,
         "tensor 'w': unknown dtype 'F12'"},
        {"dtype/shape mismatch", "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24, 0,
         "tensor 'w': dtype F16 x shape [2, 3] is 12 bytes but data_offsets [0, 24] span 24"},
        {"out-of-file offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 16, 0,
         "tensor 'w': data_offsets [8, 24] lie outside the data section (16 bytes"},
        {"overlapping tensors",
         "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
         16, 0, "tensors 'x' and 'y' overlap"},
        {"offsets reversed", "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, 0,
         "end before they begin"},
        {"negative shape", "{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, 0,
         "shape[0] is not a non-negative integer"},
        {"fractional offset", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.5,1]}}", 1, 0,
         "data_offsets must be"},
        {"shape overflow",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, 0,
         "overflows"},
        {"missing field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, 0, "needs \"dtype\""},
        {"duplicate name",
         "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
         2, 0, "tensor 'w' appears twice"},
        {"metadata not strings", "{\"__metadata__\":{\"n\":3}}", 0, 0, "'__metadata__' entry 'n' is not a string"},
        {"too many dims", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, 0,
         "9 dimensions"},
    };
    uint8_t data[64] = {0};
    for (size_t i = 0; i < TP_ARRAY_LEN(cases); i++) {
        size_t len;
        uint8_t *img = make_st(cases[i].json, data, cases[i].data_len, cases[i].hlen_override, &len);
        tp_st_t *st = NULL;
        struct tp_error err = {0};
        enum tp_status rc = tp_st_open_mem("bad.safetensors", img, len, &st, &err);
        if (rc == TP_OK || !strstr(err.msg, cases[i].expect) || !strstr(err.msg, "bad.safetensors"))
            fprintf(stderr, "case '%s': rc %d, message '%s' (want '%s')\n", cases[i].what, (int)rc, err.msg,
                    cases[i].expect);
        CU_ASSERT_NOT_EQUAL(rc, TP_OK);
        CU_ASSERT_PTR_NULL(st);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, cases[i].expect));
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "bad.safetensors"));
        free(img);
    }
    /* too short for the length field */
    tp_st_t *st = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL(tp_st_open_mem("short", "abc", 3, &st, &err), TP_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "too short"));
    /* a file that is not there */
    struct tp_error e2 = {0};
    CU_ASSERT_EQUAL(tp_st_open("/nonexistent/x.safetensors", &st, &e2), TP_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(e2.msg, "cannot open"));
}

/* A sharded set: two files + index; then index variants that must be refused. */
static void test_index(void)
{
    char dir[512], p[600];
    snprintf(dir, sizeof(dir), "%s/sharded", tp_test_tmpdir());
    mkdir(dir, 0755);
    uint8_t data[16];
    float f[4] = {1, 2, 3, 4};
    memcpy(data, f, 16);
    size_t len;
    uint8_t *img = make_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", data, 16, 0, &len);
    snprintf(p, sizeof(p), "%s/model-00001-of-00002.safetensors", dir);
    write_file(p, img, len);
    free(img);
    img = make_st("{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"z\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[4,16]}}",
                  data, 16, 0, &len);
    snprintf(p, sizeof(p), "%s/model-00002-of-00002.safetensors", dir);
    write_file(p, img, len);
    free(img);
    const char *good = "{\"metadata\":{\"total_size\":32},\"weight_map\":{"
                       "\"x\":\"model-00001-of-00002.safetensors\",\"y\":\"model-00002-of-00002.safetensors\","
                       "\"z\":\"model-00002-of-00002.safetensors\"}}";
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
    write_file(p, good, strlen(good));
    tp_st_t *st = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_st_open(dir, &st, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_st_n_files(st), 2);
    CU_ASSERT_EQUAL(tp_st_n_tensors(st), 3);
    const struct tp_st_tensor *z = tp_st_find(st, "z");
    CU_ASSERT_PTR_NOT_NULL_FATAL(z);
    CU_ASSERT_EQUAL(z->file, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_st_file_path(st, z->file), "model-00002-of-00002.safetensors"));
    float v[3];
    CU_ASSERT_EQUAL(tp_st_pread(st, z, v, 12, 0, &err), TP_OK);
    CU_ASSERT_EQUAL(v[0], 2.0f);
    CU_ASSERT_EQUAL(v[2], 4.0f);
    CU_ASSERT(tp_st_file_fd(st, 0) >= 0);
    tp_st_close(st);

    static const struct {
        const char *json, *expect;
    } bad[] = {
        {"{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\",\"w\":\"model-00003-of-00002.safetensors\"}}",
         "names file 'model-00003-of-00002.safetensors' (for tensor 'w'), which does not exist"},
        {"{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\",\"q\":\"model-00002-of-00002.safetensors\"}}",
         "tensor 'q' is listed in weight_map for"},
        {"{\"weight_map\":{\"x\":\"model-00002-of-00002.safetensors\",\"y\":\"model-00001-of-00002.safetensors\"}}",
         "weight_map puts tensor"},
        {"{\"weight_map\":{\"x\":\"../etc/passwd\"}}", "files must sit beside the index"},
        {"{\"metadata\":{}}", "no \"weight_map\""},
        {"{\"weight_map\":", "not a valid JSON object"},
        {"{\"weight_map\":{\"x\":3}}", "weight_map entry 'x' is not a file name"},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(bad); i++) {
        write_file(p, bad[i].json, strlen(bad[i].json));
        struct tp_error e = {0};
        st = NULL;
        enum tp_status rc = tp_st_open(dir, &st, &e);
        if (rc == TP_OK || !strstr(e.msg, bad[i].expect))
            fprintf(stderr, "index case %zu: rc %d, message '%s' (want '%s')\n", i, (int)rc, e.msg, bad[i].expect);
        CU_ASSERT_NOT_EQUAL(rc, TP_OK);
        CU_ASSERT_PTR_NULL(st);
        CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, bad[i].expect));
    }
    /* a tensor in two shard files */
    img = make_st("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 16, 0, &len);
    snprintf(p, sizeof(p), "%s/model-00002-of-00002.safetensors", dir);
    write_file(p, img, len);
    free(img);
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
    const char *dup = "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\",\"y\":\"model-00002-of-00002.safetensors\"}}";
    write_file(p, dup, strlen(dup));
    struct tp_error e = {0};
    CU_ASSERT_NOT_EQUAL(tp_st_open(dir, &st, &e), TP_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "tensor 'x' appears in both"));
    /* a directory with neither file */
    snprintf(p, sizeof(p), "%s/empty", tp_test_tmpdir());
    mkdir(p, 0755);
    struct tp_error e3 = {0};
    CU_ASSERT_EQUAL(tp_st_open(p, &st, &e3), TP_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(e3.msg, "neither model.safetensors.index.json nor model.safetensors"));
}

static void test_dtypes(void)
{
    enum tp_st_dtype d;
    CU_ASSERT_EQUAL(tp_st_dtype_parse("BF16", &d), TP_OK);
    CU_ASSERT_EQUAL(d, TP_ST_BF16);
    CU_ASSERT_EQUAL(tp_st_dtype_size(d), 2);
    CU_ASSERT_EQUAL(tp_st_dtype_parse("U32", &d), TP_OK);
    CU_ASSERT_EQUAL(tp_st_dtype_size(d), 4);
    CU_ASSERT_EQUAL(tp_st_dtype_parse("bf16", &d), TP_ERR_NOT_FOUND);
    for (int i = 0; i < TP_ST_DTYPE_COUNT; i++) {
        CU_ASSERT_EQUAL(tp_st_dtype_parse(tp_st_dtype_name((enum tp_st_dtype)i), &d), TP_OK);
        CU_ASSERT_EQUAL((int)d, i);
    }
}

static const struct tp_test_case st_cases[] = {
    {"valid", test_valid}, {"corrupt", test_corrupt}, {"index", test_index}, {"dtypes", test_dtypes}, {NULL, NULL}};
TP_TEST_SUITE(safetensors, "unit", 60, st_cases)
