/*
 * tests/fuzz/fuzz_hf_json.c - fuzz target for the JSON files of a Hugging
 * Face / MLX directory: config.json (model/hf_config.c: hyper-parameters;
 * model/mlx_load.c: the "quantization" block, replay build only) and
 * model.safetensors.index.json (model/safetensors.c: weight_map of a sharded
 * set).
 *
 * The first input byte picks the file (mod 4: 0 config.json, 1 the index;
 * replay build also 2 tokenizer.json (model/tokenizer_json.c, then an
 * encode/decode round of a few strings) and 3 tokenizer_config.json (the
 * chat template and BOS/EOS beside a fixed valid tokenizer.json)); the rest
 * is written as that file into a private temporary directory that
 * also holds a valid two-tensor shard "model-00001-of-00001.safetensors",
 * and the directory is opened as tpserve would.  Every refusal must carry a
 * message; accepted configs must have sane sizes; an accepted index must
 * resolve every tensor to data inside its file.
 *
 * Built two ways (tests/model.cmake):
 *   - with clang -fsanitize=fuzzer,address,undefined as `fuzz_hf_json`
 *     (config.json via hf_config.c and the index via safetensors.c only),
 *     run for a bounded time on the seed corpus;
 *   - with TP_FUZZ_STANDALONE as `fuzz_hf_json_replay` (linked with the
 *     whole model library, so the MLX quantization block is read too):
 *       fuzz_hf_json_replay --seeds DIR        write the seed corpus
 *       fuzz_hf_json_replay --mutate SECONDS   seeds (valid ones accepted, corrupt ones
 *                                              refused), then random mutations
 *       fuzz_hf_json_replay FILE...            replay files (crash reproducers)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "model/tensor_source.h"
#ifdef TP_FUZZ_STANDALONE
#include "model/mlx_quant.h"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[256];
static char g_cfg[300], g_index[300], g_tok[300], g_tokcfg[300];

/* A small valid byte-level BPE tokenizer.json (GPT-2 pattern: the 256 byte
 * tokens in GPT-2's byte-to-unicode spelling, "ab", two special tokens),
 * built by setup() for modes 2 and 3. */
static char k_tok_json[8192];

static void put_utf8(char **o, unsigned cp)
{
    if (cp < 0x80) *(*o)++ = (char)cp;
    else {
        *(*o)++ = (char)(0xC0 | (cp >> 6));
        *(*o)++ = (char)(0x80 | (cp & 0x3F));
    }
}

static void build_tok_json(void)
{
    char *o = k_tok_json;
    o += sprintf(o, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    unsigned extra = 0;
    for (unsigned byte = 0; byte < 256; byte++) {
        int printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
        unsigned cp = printable ? byte : 256 + extra++;
        *o++ = '"';
        if (cp == '"' || cp == '\\') *o++ = '\\';
        put_utf8(&o, cp);
        o += sprintf(o, "\":%u,", byte);
    }
    o += sprintf(o, "\"ab\":256},\"merges\":[\"a b\"]},\"added_tokens\":[{\"id\":257,\"content\":\"<s>\","
                    "\"special\":true},{\"id\":258,\"content\":\"</s>\",\"special\":true}],\"normalizer\":null,"
                    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}}");
}

static void cleanup_dir(void)
{
    char p[400];
    snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", g_dir);
    unlink(p);
    unlink(g_cfg);
    unlink(g_index);
    unlink(g_tok);
    unlink(g_tokcfg);
    rmdir(g_dir);
}

/* The temporary directory with a valid shard holding tensors "a" (F32 [2,2]) and "b" (U8 [3]). */
static void setup(void)
{
    if (g_dir[0]) return;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fuzz_hf_json.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_cfg, sizeof g_cfg, "%s/config.json", g_dir);
    snprintf(g_index, sizeof g_index, "%s/model.safetensors.index.json", g_dir);
    snprintf(g_tok, sizeof g_tok, "%s/tokenizer.json", g_dir);
    snprintf(g_tokcfg, sizeof g_tokcfg, "%s/tokenizer_config.json", g_dir);
    build_tok_json();
    atexit(cleanup_dir);
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]}}";
    uint64_t hl = strlen(h);
    char p[400];
    snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", g_dir);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, (size_t)hl, f);
    for (int i = 0; i < 19; i++) fputc(i, f);
    fclose(f);
}

static void write_file(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    fclose(f);
}

#ifdef TP_FUZZ_STANDALONE
/* Modes 2 (tokenizer.json) and 3 (tokenizer_config.json beside a valid tokenizer.json). */
static int run_tokenizer(int mode, const uint8_t *p, size_t n)
{
    struct tp_error err = {0};
    if (mode == 2) {
        write_file(g_tok, p, n);
    } else {
        write_file(g_tok, (const uint8_t *)k_tok_json, strlen(k_tok_json));
        write_file(g_tokcfg, p, n);
        char *tmpl = NULL;
        if (tp_hf_chat_template(g_dir, &tmpl, &err) != TP_OK && err.msg[0] == '\0') abort();
        free(tmpl);
        tp_error_clear(&err);
    }
    tp_tokenizer_t *t = NULL;
    enum tp_status rc = tp_tokenizer_from_json(g_tok, mode == 3 ? g_tokcfg : NULL, &t, &err);
    if (rc != TP_OK) {
        if (err.msg[0] == '\0' || t) abort();
        return 0;
    }
    static const char *const texts[] = {"ab c", "", "<s>a</s>", "\xc3\xa9\xe2\x82\xac \xf0\x9f\x98\x80", "  \n\t 123"};
    int32_t ids[256];
    char out[1024];
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int k = tp_tokenizer_encode(t, texts[i], strlen(texts[i]), 1, 1, ids, 256);
        if (k < -1 || k > 256) abort();
        tp_detok_t *d = NULL;
        if (k > 0 && tp_detok_init(t, &d) == TP_OK) {
            for (int j = 0; j < k; j++) {
                if (ids[j] < 0 || ids[j] >= tp_tokenizer_n_vocab(t)) abort();
                tp_detok_push(d, ids[j], out, sizeof out);
            }
            while (tp_detok_flush(d, out, sizeof out) > 0) {
            }
            tp_detok_free(d);
        }
    }
    tp_tokenizer_free(t);
    return 1;
}
#endif

/* Returns 1 when the file was accepted. */
static int run_one(const uint8_t *data, size_t size)
{
    setup();
    if (size < 1) return 0;
    const int mode = data[0] & 3, index = mode == 1;
    struct tp_error err = {0};
    if (mode >= 2) {
#ifdef TP_FUZZ_STANDALONE
        return run_tokenizer(mode, data + 1, size - 1);
#else
        return 0; /* the libFuzzer build links only the config and safetensors readers */
#endif
    }
    unlink(g_cfg);
    unlink(g_index);
    write_file(index ? g_index : g_cfg, data + 1, size - 1);
    if (!index) {
        struct tp_hf_config hc;
        enum tp_status rc = tp_hf_read_config(g_dir, &hc, &err);
        int ok = rc == TP_OK;
        if (!ok && err.msg[0] == '\0') abort(); /* every refusal says why */
        if (ok) {
            const struct tp_hparams *hp = &hc.hp;
            if (hp->n_embd < 1 || hp->n_layer < 1 || hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_ff < 1 ||
                hp->n_vocab < 1 || hp->head_dim < 1 || hp->n_head % hp->n_head_kv != 0 || hp->rope_dim > hp->head_dim ||
                hp->rope_dim < 0 || !(hp->rope_theta > 0))
                abort();
        }
#ifdef TP_FUZZ_STANDALONE
        struct tp_mlx_quant *q = NULL;
        tp_error_clear(&err);
        if (tp_mlx_read_quant(g_dir, &q, &err) == TP_OK) {
            if (q && (q->n_over < 0 || (q->n_over > 0 && !q->over))) abort();
            tp_mlx_quant_free(q);
        } else if (err.msg[0] == '\0' || q) {
            abort();
        }
#endif
        return ok;
    }
    tp_st_t *st = NULL;
    enum tp_status rc = tp_st_open(g_dir, &st, &err);
    if (rc != TP_OK) {
        if (err.msg[0] == '\0' || st) abort();
        return 0;
    }
    for (int i = 0; i < tp_st_n_tensors(st); i++) {
        const struct tp_st_tensor *t = tp_st_tensor(st, i);
        if (tp_st_find(st, t->name) != t) abort();
        if (t->n_bytes) {
            uint8_t last;
            struct tp_error e = {0};
            if (tp_st_pread(st, t, &last, 1, t->n_bytes - 1, &e) != TP_OK) abort();
        }
    }
    tp_st_close(st);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run_one(data, size);
    return 0;
}

#ifdef TP_FUZZ_STANDALONE
#include "common/common.h"
#include "fuzz_driver.h"

/* Seeds: mode byte + file text; the first N_VALID are accepted, the rest refused. */
static const char *const k_seeds[] = {
    /* valid */
    "0{\"architectures\":[\"MistralForCausalLM\"],\"hidden_act\":\"silu\",\"hidden_size\":4096,"
    "\"intermediate_size\":14336,\"max_position_embeddings\":32768,\"model_type\":\"mistral\","
    "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,"
    "\"rope_theta\":10000.0,\"tie_word_embeddings\":false,\"vocab_size\":32000}",
    "0{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":2048,\"intermediate_size\":8192,"
    "\"num_attention_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,\"head_dim\":64,"
    "\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
    "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,"
    "\"tie_word_embeddings\":true,\"vocab_size\":128256,"
    "\"quantization\":{\"group_size\":64,\"bits\":4,\"model.layers.0.mlp.down_proj\":{\"group_size\":32,\"bits\":8},"
    "\"model.embed_tokens\":false}}",
    "0{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":896,\"intermediate_size\":4864,"
    "\"num_attention_heads\":14,\"num_hidden_layers\":24,\"num_key_value_heads\":2,\"rope_theta\":1000000.0,"
    "\"tie_word_embeddings\":true,\"vocab_size\":151936,\"quantization_config\":{\"group_size\":32,\"bits\":8}}",
    "1{\"metadata\":{\"total_size\":19},\"weight_map\":{\"a\":\"model-00001-of-00001.safetensors\","
    "\"b\":\"model-00001-of-00001.safetensors\"}}",
    "2@", /* the generated tokenizer.json (k_tok_json) */
    "3{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_bos_token\":true,"
    "\"chat_template\":\"{% for m in messages %}{{ m['content'] }}{% endfor %}\"}",
    /* refused */
    "2{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}",
    "2{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]},"
    "\"pre_tokenizer\":{\"type\":\"Whitespace\"}}",
    "0{\"architectures\":[\"MixtralForCausalLM\"],\"hidden_size\":4096,\"num_local_experts\":8}",
    "0{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096,\"num_attention_heads\":0}",
    "0{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":4096,\"num_attention_heads\":32,"
    "\"num_key_value_heads\":7,\"num_hidden_layers\":2,\"intermediate_size\":11008,\"vocab_size\":32000}",
    "0{\"architectures\":[\"LlamaForCausalLM\"]",
    "0[]",
    "1{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\"}}",
    "1{\"weight_map\":{\"zz\":\"model-00001-of-00001.safetensors\"}}",
    "1{\"weight_map\":{\"a\":\"../../etc/passwd\"}}",
    "1{\"weight_map\":[]}",
};
#define N_SEEDS ((int)(sizeof k_seeds / sizeof k_seeds[0]))
#define N_VALID 6

/* Byte mutations plus JSON-aware ones (digits, punctuation, keywords). */
static void mutate(uint8_t *p, size_t *n, size_t cap)
{
    static const char tokens[] = "0123456789[]{},:\"-.etrufalsn";
    static const char *const words[] = {"null", "true", "-1", "1e308", "4294967296", "\"\"", "[]", "{}", "0.0"};
    int k = 1 + (int)(tp_fuzz_rand() % 4);
    for (int i = 0; i < k && *n > 1; i++) {
        size_t at = 1 + tp_fuzz_rand() % (*n - 1); /* keep the mode byte */
        switch (tp_fuzz_rand() % 6) {
        case 0: p[at] ^= (uint8_t)(1u << (tp_fuzz_rand() % 8)); break;
        case 1: p[at] = (uint8_t)tokens[tp_fuzz_rand() % (sizeof(tokens) - 1)]; break;
        case 2: *n = at; break; /* truncate */
        case 3: {
            const char *w = words[tp_fuzz_rand() % (sizeof words / sizeof words[0])];
            size_t wl = strlen(w);
            if (*n + wl <= cap) {
                memmove(p + at + wl, p + at, *n - at);
                memcpy(p + at, w, wl);
                *n += wl;
            }
            break;
        }
        case 4:
            if (at + 1 < *n) { /* delete a byte */
                memmove(p + at, p + at + 1, *n - at - 1);
                (*n)--;
            }
            break;
        default: p[0] ^= (uint8_t)(1u + tp_fuzz_rand() % 3u); break; /* another file */
        }
    }
}

/* A seed as fuzzer input: its first character is the mode ('0' even, '1' odd). */
static size_t seed_bytes(int i, uint8_t *out, size_t cap)
{
    setup();
    const char *text = strcmp(k_seeds[i], "2@") == 0 ? k_tok_json : k_seeds[i] + 1;
    size_t n = strlen(text) + 1;
    if (n > cap) n = cap;
    memcpy(out + 1, text, n - 1);
    out[0] = (uint8_t)(k_seeds[i][0] - '0');
    return n;
}

static uint8_t *seed_alloc(int i, size_t *n)
{
    uint8_t *p = malloc(1 << 14);
    if (p) *n = seed_bytes(i, p, 1 << 14);
    return p;
}

/* The first N_VALID seeds are accepted, the rest refused. */
static int check_seeds(uint8_t *const *seeds, const size_t *sizes, int n_seeds)
{
    for (int i = 0; i < n_seeds; i++) {
        int ok = run_one(seeds[i], sizes[i]);
        if (ok != (i < N_VALID)) {
            fprintf(stderr, "fuzz_hf_json_replay: seed %d was %s\n", i, ok ? "accepted" : "refused");
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    tp_log_set_level(TP_LOG_LEVEL_COUNT); /* refusals are expected: no log noise */
    static const struct tp_fuzz_target t = {"fuzz_hf_json_replay", ".json", N_SEEDS, seed_alloc, mutate, check_seeds};
    return tp_fuzz_main(&t, argc, argv);
}
#endif
