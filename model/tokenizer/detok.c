/*
 * model/tokenizer/detok.c - streaming detokenizer.
 *
 * Each pushed id appends its piece (raw bytes) to a pending buffer; the
 * longest prefix made of complete UTF-8 characters is emitted and an
 * incomplete character at the end is held back until a later token
 * completes it.  Bytes that can never start or continue a valid character
 * (maximal subparts, as the Unicode standard defines them) become U+FFFD at
 * once; tp_detok_flush turns a held-back incomplete tail into U+FFFD too.
 * Control tokens (BOS, EOS, <|eot_id|> ...) produce no text; user-defined
 * added tokens produce their text.  SentencePiece: the first piece after
 * init/reset loses one leading space (the prefix space encoding added).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_core_impl.h"
#include "tokenizer/unicode_impl.h"

struct tp_detok {
    const struct tp_tokenizer *t;
    char *buf;        /* pending bytes [0, len) */
    size_t len, cap;
    int at_start;     /* nothing emitted since init/reset */
};

enum tp_status tp_detok_init(const tp_tokenizer_t *t, tp_detok_t **out)
{
    *out = NULL;
    if (!t) return TP_ERR_INVALID_ARG;
    struct tp_detok *d = calloc(1, sizeof(*d));
    if (!d) return TP_ERR_NOMEM;
    d->t = t;
    d->cap = (size_t)t->max_piece_len + 64;
    d->buf = malloc(d->cap);
    if (!d->buf) {
        free(d);
        return TP_ERR_NOMEM;
    }
    d->at_start = 1;
    *out = d;
    return TP_OK;
}

void tp_detok_free(tp_detok_t *d)
{
    if (!d) return;
    free(d->buf);
    free(d);
}

void tp_detok_reset(tp_detok_t *d)
{
    if (!d) return;
    d->len = 0;
    d->at_start = 1;
}

/* Move complete characters from the pending buffer to out (at most cap
 * bytes); ill-formed bytes become U+FFFD; final: incomplete tail too. */
static size_t drain(struct tp_detok *d, char *out, size_t cap, int final)
{
    const unsigned char *p = (const unsigned char *)d->buf;
    size_t i = 0, o = 0;
    while (i < d->len) {
        int r = tp_utf8_check_prefix(p + i, d->len - i);
        if (r == 0) {
            uint32_t cp;
            int k = tp_utf8_decode(p + i, d->len - i, &cp);
            if (o + (size_t)k > cap) break;
            memcpy(out + o, p + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else if (r > 0 || final) {
            if (o + 3 > cap) break;
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)(r > 0 ? r : -r);
        } else {
            break; /* incomplete: wait for more bytes */
        }
    }
    memmove(d->buf, d->buf + i, d->len - i);
    d->len -= i;
    return o;
}

size_t tp_detok_push(tp_detok_t *d, int id, char *out, size_t cap)
{
    if (!d) return 0;
    const struct tp_tokenizer *t = d->t;
    if (id >= 0 && id < t->n_vocab) {
        const struct tp_tok_entry *e = &t->toks[id];
        if (e->type != TP_TOKEN_TYPE_CONTROL && e->type != TP_TOKEN_TYPE_UNKNOWN && e->type != TP_TOKEN_TYPE_UNUSED) {
            const char *s = t->blob + e->piece_off;
            size_t l = e->piece_len;
            if (d->at_start && l > 0) {
                if (t->kind == TP_TOK_SPM && t->add_space_prefix && e->type != TP_TOKEN_TYPE_USER_DEFINED && s[0] == ' ') {
                    s++;
                    l--;
                }
                d->at_start = 0;
            }
            if (d->len + l > d->cap) { /* only when callers keep cap too small */
                size_t nc = (d->len + l) * 2;
                char *nb = realloc(d->buf, nc);
                if (!nb) return drain(d, out, cap, 0);
                d->buf = nb;
                d->cap = nc;
            }
            memcpy(d->buf + d->len, s, l);
            d->len += l;
        }
    }
    return drain(d, out, cap, 0);
}

size_t tp_detok_flush(tp_detok_t *d, char *out, size_t cap)
{
    if (!d) return 0;
    return drain(d, out, cap, 1);
}
