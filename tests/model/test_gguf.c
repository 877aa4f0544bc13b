/*
 * tests/model/test_gguf.c - the GGUF reader: a handcrafted valid file read
 * back field by field, the bundled and vocab-only files, and handcrafted
 * corrupt files (bad magic, truncated header, string length past the end,
 * tensor past the end, absurd dims, unknown type, misaligned offset, ...)
 * each refused with an error naming the file, the field and the reason.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "tp_test.h"

/* ------------------------------------------------------------ file builder */

struct buf {
    uint8_t b[8192];
    size_t n;
};
static void put(struct buf *b, const void *p, size_t n)
{
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void str(struct buf *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* Knobs that corrupt one thing each. */
struct knobs {
    uint32_t magic, version;
    uint64_t key_len_override;  /* nonzero: length written for the first key */
    uint32_t kv_type_override;  /* nonzero: type of the first kv */
    uint32_t alignment;         /* general.alignment value */
    uint64_t arr_len_override;  /* nonzero: length of the int array */
    int nested_array;
    int dup_key;
    uint32_t n_dims;
    uint64_t ne0, ne1;
    uint32_t ttype;             /* tensor b's type */
    uint64_t off_b;             /* tensor b's offset */
    int cut_data;               /* bytes removed from the end */
    uint64_t n_tensors_override;
};

static struct knobs good(void)
{
    struct knobs k;
    memset(&k, 0, sizeof(k));
    k.magic = 0x46554747u;
    k.version = 3;
    k.alignment = 32;
    k.n_dims = 2;
    k.ne0 = 4;
    k.ne1 = 2;
    k.ttype = 8; /* q8_0 */
    k.off_b = 32;
    return k;
}

static void build(struct buf *b, const struct knobs *k)
{
    b->n = 0;
    u32(b, k->magic);
    u32(b, k->version);
    u64(b, k->n_tensors_override ? k->n_tensors_override : 2);
    u64(b, 6 + (k->dup_key ? 1 : 0));
    /* kv 0: general.architecture = "llama" */
    if (k->key_len_override) {
        u64(b, k->key_len_override);
        put(b, "general.architecture", 20);
    } else {
        str(b, "general.architecture");
    }
    u32(b, k->kv_type_override ? k->kv_type_override : 8);
    str(b, "llama");
    /* kv 1: alignment */
    str(b, "general.alignment");
    u32(b, 4);
    u32(b, k->alignment);
    /* kv 2: int32 array */
    str(b, "test.ints");
    u32(b, 9);
    if (k->nested_array) {
        u32(b, 9);
    } else {
        u32(b, 5);
    }
    u64(b, k->arr_len_override ? k->arr_len_override : 3);
    int32_t ints[3] = {1, -2, 3};
    put(b, ints, sizeof(ints));
    /* kv 3: string array */
    str(b, "test.strs");
    u32(b, 9);
    u32(b, 8);
    u64(b, 2);
    str(b, "a");
    str(b, "bc");
    /* kv 4: float32, kv 5: bool */
    str(b, "test.f");
    u32(b, 6);
    float f = 1.5f;
    put(b, &f, 4);
    str(b, "test.b");
    u32(b, 7);
    uint8_t t = 1;
    put(b, &t, 1);
    if (k->dup_key) {
        str(b, "test.f");
        u32(b, 6);
        put(b, &f, 4);
    }
    /* tensor a: f32 [ne0, ne1] at 0 */
    str(b, "a");
    u32(b, k->n_dims);
    u64(b, k->ne0);
    u64(b, k->ne1);
    for (uint32_t d = 2; d < k->n_dims && d < 8; d++) u64(b, 1);
    u32(b, 0);
    u64(b, 0);
    /* tensor b: [32] of ttype at off_b */
    str(b, "b");
    u32(b, 1);
    u64(b, 32);
    u32(b, k->ttype);
    u64(b, k->off_b);
    /* data: pad to 32, then 32 bytes of a + 34 bytes of b */
    while (b->n % 32) b->b[b->n++] = 0;
    for (int i = 0; i < 8; i++) {
        float v = (float)i;
        put(b, &v, 4);
    }
    for (int i = 0; i < 34; i++) b->b[b->n++] = (uint8_t)i;
    if (k->cut_data) b->n -= (size_t)k->cut_data;
}

static const char *write_tmp(const char *name, const struct buf *b)
{
    static char path[8][512];
    static int slot;
    char *p = path[slot++ % 8];
    snprintf(p, 512, "%s/%s", tp_test_tmpdir(), name);
    FILE *f = fopen(p, "wb");
    if (!f) return NULL;
    fwrite(b->b, 1, b->n, f);
    fclose(f);
    return p;
}

/* ------------------------------------------------------------ tests */

static void test_valid_file(void)
{
    struct buf b;
    struct knobs k = good();
    build(&b, &k);
    const char *path = write_tmp("valid.gguf", &b);
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    tp_gguf_t *g = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(path, &g, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_version(g), 3u);
    CU_ASSERT_EQUAL(tp_gguf_n_kv(g), 6);
    CU_ASSERT_EQUAL(tp_gguf_n_tensors(g), 2);
    CU_ASSERT_EQUAL(tp_gguf_alignment(g), 32u);
    CU_ASSERT_EQUAL(tp_gguf_data_offset(g) % 32, 0u);
    CU_ASSERT(tp_gguf_fd(g) >= 0);
    const char *s = NULL;
    CU_ASSERT_EQUAL(tp_gguf_get_str(g, "general.architecture", &s), TP_OK);
    CU_ASSERT_STRING_EQUAL(s, "llama");
    int64_t v = 0;
    CU_ASSERT_EQUAL(tp_gguf_get_int(g, "general.alignment", &v), TP_OK);
    CU_ASSERT_EQUAL(v, 32);
    double d = 0;
    CU_ASSERT_EQUAL(tp_gguf_get_float(g, "test.f", &d), TP_OK);
    CU_ASSERT_DOUBLE_EQUAL(d, 1.5, 1e-9);
    int bo = 0;
    CU_ASSERT_EQUAL(tp_gguf_get_bool(g, "test.b", &bo), TP_OK);
    CU_ASSERT_EQUAL(bo, 1);
    CU_ASSERT_EQUAL(tp_gguf_get_int(g, "missing.key", &v), TP_ERR_NOT_FOUND);
    /* wrong type: error text names key and types */
    CU_ASSERT_EQUAL(tp_gguf_get_int(g, "general.architecture", &v), TP_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_gguf_last_error(g), "general.architecture"));
    CU_ASSERT_PTR_NOT_NULL(strstr(tp_gguf_last_error(g), "string"));
    int ki = tp_gguf_find_key(g, "test.ints");
    CU_ASSERT(ki >= 0);
    CU_ASSERT_EQUAL(tp_gguf_arr_type(g, ki), TP_GGUF_INT32);
    CU_ASSERT_EQUAL(tp_gguf_arr_len(g, ki), 3u);
    int32_t iv[3];
    CU_ASSERT_EQUAL(tp_gguf_arr_copy_i32(g, ki, iv, 3), TP_OK);
    CU_ASSERT(iv[0] == 1 && iv[1] == -2 && iv[2] == 3);
    float fv[3];
    CU_ASSERT_EQUAL(tp_gguf_arr_copy_f32(g, ki, fv, 3), TP_OK);
    CU_ASSERT_DOUBLE_EQUAL(fv[1], -2.0, 1e-9);
    CU_ASSERT_EQUAL(tp_gguf_arr_copy_i32(g, ki, iv, 4), TP_ERR_FORMAT); /* too short */
    int si = tp_gguf_find_key(g, "test.strs");
    size_t len = 0;
    const char *e = tp_gguf_arr_str(g, si, 1, &len);
    CU_ASSERT_EQUAL(len, 2u);
    CU_ASSERT(e && memcmp(e, "bc", 2) == 0);
    CU_ASSERT_PTR_NULL(tp_gguf_arr_str(g, si, 2, &len));
    CU_ASSERT_PTR_NULL(tp_gguf_arr_str(g, ki, 0, &len)); /* not a string array */
    CU_ASSERT_EQUAL(tp_gguf_arr_copy_f32(g, si, fv, 1), TP_ERR_FORMAT);
    const struct tp_gguf_tensor *ta = tp_gguf_find_tensor(g, "a");
    CU_ASSERT_PTR_NOT_NULL_FATAL(ta);
    CU_ASSERT_EQUAL(ta->type, TP_WTYPE_F32);
    CU_ASSERT_EQUAL(ta->n_dims, 2);
    CU_ASSERT_EQUAL(ta->ne[0], 4);
    CU_ASSERT_EQUAL(ta->ne[1], 2);
    CU_ASSERT_EQUAL(ta->n_bytes, 32u);
    float a5;
    memcpy(&a5, (const uint8_t *)ta->data + 20, 4);
    CU_ASSERT_DOUBLE_EQUAL(a5, 5.0, 1e-9);
    const struct tp_gguf_tensor *tb = tp_gguf_find_tensor(g, "b");
    CU_ASSERT_PTR_NOT_NULL_FATAL(tb);
    CU_ASSERT_EQUAL(tb->type, TP_WTYPE_Q8_0);
    CU_ASSERT_EQUAL(tb->n_bytes, 34u);
    CU_ASSERT_EQUAL(tb->file_offset, tp_gguf_data_offset(g) + 32);
    CU_ASSERT_EQUAL(((const uint8_t *)tb->data)[33], 33);
    CU_ASSERT_PTR_NULL(tp_gguf_find_tensor(g, "c"));
    tp_gguf_close(g);
    tp_gguf_close(NULL);

    /* the same bytes from memory */
    CU_ASSERT_EQUAL(tp_gguf_open_mem("mem", b.b, b.n, &g, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_fd(g), -1);
    CU_ASSERT_EQUAL(tp_gguf_n_tensors(g), 2);
    tp_gguf_close(g);
}

static void test_real_files(void)
{
    tp_gguf_t *g = NULL;
    struct tp_error err = {0};
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(tp_test_repo_path("models/stories260K.gguf"), &g, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_n_tensors(g), 48);
    CU_ASSERT_EQUAL(tp_gguf_n_kv(g), 19);
    CU_ASSERT_EQUAL(tp_gguf_data_offset(g), 14176u);
    int ti = tp_gguf_find_key(g, "tokenizer.ggml.tokens");
    CU_ASSERT_EQUAL(tp_gguf_arr_len(g, ti), 512u);
    size_t len;
    const char *bos = tp_gguf_arr_str(g, ti, 1, &len);
    CU_ASSERT(bos && len == 3 && memcmp(bos, "<s>", 3) == 0);
    const struct tp_gguf_tensor *t = tp_gguf_find_tensor(g, "blk.0.attn_k.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT(t->ne[0] == 64 && t->ne[1] == 32);
    int32_t sep[1];
    CU_ASSERT_EQUAL(tp_gguf_get_int(g, "tokenizer.ggml.seperator_token_id", &(int64_t){0}), TP_OK);
    (void)sep;
    tp_gguf_close(g);
}

/* A vocab-only file from ../shared: 0 tensors, aligned data offset past EOF is fine. */
static void test_vocab_only_file(void)
{
    struct tp_error err = {0};
    tp_gguf_t *g = NULL;
    const char *voc = tp_test_shared_path("models/tokenizer-tests/llama.cpp/ggml-vocab-llama-spm.gguf");
    if (!voc) return; /* ../shared data absent: recorded as a skip */
    CU_ASSERT_EQUAL_FATAL(tp_gguf_open(voc, &g, &err), TP_OK);
    CU_ASSERT_EQUAL(tp_gguf_n_tensors(g), 0);
    CU_ASSERT(tp_gguf_data_offset(g) > tp_gguf_file_size(g));
    CU_ASSERT_EQUAL(tp_gguf_arr_len(g, tp_gguf_find_key(g, "tokenizer.ggml.tokens")), 32000u);
    tp_gguf_close(g);
}

/* Build with one knob changed, open, expect failure whose message has path + each needle. */
static void expect_bad(const char *name, const struct knobs *k, const char *needle1, const char *needle2)
{
    struct buf b;
    build(&b, k);
    const char *path = write_tmp(name, &b);
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    tp_gguf_t *g = (tp_gguf_t *)1;
    struct tp_error err = {0};
    enum tp_status rc = tp_gguf_open(path, &g, &err);
    CU_ASSERT_NOT_EQUAL(rc, TP_OK);
    CU_ASSERT_PTR_NULL(g);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, path));
    if (needle1 && !strstr(err.msg, needle1)) fprintf(stderr, "%s: message lacks '%s': %s\n", name, needle1, err.msg);
    if (needle1) CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, needle1));
    if (needle2 && !strstr(err.msg, needle2)) fprintf(stderr, "%s: message lacks '%s': %s\n", name, needle2, err.msg);
    if (needle2) CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, needle2));
    /* the same bytes from memory fail the same way */
    CU_ASSERT_NOT_EQUAL(tp_gguf_open_mem(name, b.b, b.n, &g, NULL), TP_OK);
}

static void test_corrupt_files(void)
{
    struct knobs k;
    k = good(); k.magic = 0x464c457f; expect_bad("bad_magic.gguf", &k, "bad magic", NULL);
    k = good(); k.version = 1; expect_bad("v1.gguf", &k, "version 1", NULL);
    k = good(); k.version = 77; expect_bad("v77.gguf", &k, "version 77", NULL);
    k = good(); k.key_len_override = 1u << 30; expect_bad("keylen.gguf", &k, "metadata key #0", "past the end");
    k = good(); k.kv_type_override = 13; expect_bad("kvtype.gguf", &k, "general.architecture", "unknown value type 13");
    k = good(); k.alignment = 24; expect_bad("align.gguf", &k, "general.alignment", "power of two");
    k = good(); k.alignment = 0; expect_bad("align0.gguf", &k, "general.alignment", NULL);
    k = good(); k.arr_len_override = UINT64_MAX / 2; expect_bad("arrlen.gguf", &k, "test.ints", "past the end");
    k = good(); k.nested_array = 1; expect_bad("nested.gguf", &k, "test.ints", "nested");
    k = good(); k.dup_key = 1; expect_bad("dupkey.gguf", &k, "test.f", "twice");
    k = good(); k.n_dims = 5; expect_bad("ndims.gguf", &k, "tensor 'a'", "n_dims 5");
    k = good(); k.ne0 = 1ull << 40; k.ne1 = 1ull << 40; expect_bad("absurd.gguf", &k, "tensor 'a'", "overflow");
    k = good(); k.ne0 = UINT64_MAX; expect_bad("absurd2.gguf", &k, "tensor 'a'", "absurd");
    k = good(); k.ne0 = 1ull << 20; expect_bad("bigdims.gguf", &k, "tensor 'a'", "past the end of the file");
    k = good(); k.ttype = 77; expect_bad("type77.gguf", &k, "tensor 'b'", "unknown tensor type 77");
    k = good(); k.ttype = 4; expect_bad("type4.gguf", &k, "tensor 'b'", "type#4");
    k = good(); k.ttype = 12; expect_bad("q4k_row.gguf", &k, "tensor 'b'", "not a multiple");
    k = good(); k.off_b = 36; expect_bad("misaligned.gguf", &k, "tensor 'b'", "alignment");
    k = good(); k.off_b = 1u << 20; expect_bad("offpast.gguf", &k, "tensor 'b'", "past the end");
    k = good(); k.off_b = UINT64_MAX - 31; expect_bad("offwrap.gguf", &k, "tensor 'b'", "past the end");
    k = good(); k.cut_data = 1; expect_bad("tensor_past_end.gguf", &k, "tensor 'b'", "past the end");
    k = good(); k.n_tensors_override = 1ull << 60; expect_bad("ntensors.gguf", &k, "tensor count", "impossible");

    /* truncated headers: every prefix of the header fails cleanly */
    struct buf full;
    k = good();
    build(&full, &k);
    size_t hdr_end = full.n - 32 - 34;
    for (size_t cut = 0; cut < hdr_end; cut += (cut < 64 ? 1 : 7)) {
        tp_gguf_t *g = NULL;
        struct tp_error err = {0};
        CU_ASSERT_NOT_EQUAL(tp_gguf_open_mem("trunc", full.b, cut, &g, &err), TP_OK);
        CU_ASSERT_PTR_NULL(g);
        CU_ASSERT(err.msg[0] != '\0');
    }
    struct buf tr = full;
    tr.n = 20;
    const char *path = write_tmp("truncated.gguf", &tr);
    tp_gguf_t *g = NULL;
    struct tp_error err = {0};
    CU_ASSERT_NOT_EQUAL(tp_gguf_open(path, &g, &err), TP_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "truncated"));
    /* missing and empty files */
    memset(&err, 0, sizeof(err));
    CU_ASSERT_EQUAL(tp_gguf_open("/nonexistent/x.gguf", &g, &err), TP_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent/x.gguf"));
    tr.n = 0;
    path = write_tmp("empty.gguf", &tr);
    memset(&err, 0, sizeof(err));
    CU_ASSERT_EQUAL(tp_gguf_open(path, &g, &err), TP_ERR_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "too short"));
}

static void test_type_names(void)
{
    CU_ASSERT_STRING_EQUAL(tp_gguf_wtype_name(2), "q4_0");
    CU_ASSERT_STRING_EQUAL(tp_gguf_wtype_name(5), "type#5");
    CU_ASSERT_STRING_EQUAL(tp_gguf_wtype_name(1000), "unknown type");
    CU_ASSERT_EQUAL(tp_gguf_wtype_block_bytes(8), 34u);
    CU_ASSERT_EQUAL(tp_gguf_wtype_block_elems(12), 256);
    CU_ASSERT_EQUAL(tp_gguf_wtype_block_bytes(14), 210u);
    CU_ASSERT_STRING_EQUAL(tp_gguf_type_name(TP_GGUF_STRING), "string");
    CU_ASSERT_STRING_EQUAL(tp_gguf_type_name((enum tp_gguf_type)99), "unknown value type");
}

static const struct tp_test_case gguf_cases[] = {
    {"valid_file", test_valid_file},
    {"real_files", test_real_files},
    {"corrupt_files", test_corrupt_files},
    {"type_names", test_type_names},
    {NULL, NULL}};
TP_TEST_SUITE(gguf, "unit", 60, gguf_cases)
static const struct tp_test_case gguf_shared_cases[] = {{"vocab_only_file", test_vocab_only_file}, {NULL, NULL}};
TP_TEST_SUITE(gguf_shared, "unit", 60, gguf_shared_cases)
