/*
 * server/chat_impl.h - private to the chat template files: the string
 * helpers every family's renderer uses (chat_template.c) and the renderers
 * that live in their own files, one per family group (chat_llama3.c,
 * chat_qwen.c, chat_mistral.c).  The dispatch (tp_chat_render_opts) adds a
 * family in one case line.  Each renderer appends to o and returns TP_OK,
 * TP_ERR_INVALID_ARG with the reference template's own message in err (what
 * it would raise), or TP_ERR_NOMEM.
 */
#ifndef TP_SERVER_CHAT_IMPL_H
#define TP_SERVER_CHAT_IMPL_H

#include "server_impl.h"

/* Append s / [b, e) / s without surrounding Unicode whitespace (Jinja's trim, JS String.trim's set).
 * TP_OK or TP_ERR_NOMEM. */
enum tp_status tp_chat_put(struct tp_buf *o, const char *s);
enum tp_status tp_chat_putn(struct tp_buf *o, const char *b, const char *e);
enum tp_status tp_chat_put_trim(struct tp_buf *o, const char *s);
/* What the reference template's raise_exception would say: msg into err; returns TP_ERR_INVALID_ARG. */
enum tp_status tp_chat_raise(struct tp_error *err, const char *msg);

/* Append, or return TP_ERR_NOMEM. */
#define TP_CHAT_P(x)                               \
    do {                                           \
        if ((x) != TP_OK) return TP_ERR_NOMEM;     \
    } while (0)

struct tp_chat_ctx {
    const struct tp_chat_msg *m; /* (n) */
    int n;
    int add_gen;
    const char *bos, *eos;       /* never NULL */
    const char *default_system;  /* NULL: none */
    const struct cJSON *tools;   /* array, NULL: none */
    char date[32];               /* today's date as the family prints it: llama3.2 "25 Nov 2026",
                                  * mistral-small-3.2 "2026-11-25" */
    struct tp_error *err;
};

enum tp_status tp_chat_render_llama3(const struct tp_chat_ctx *c, struct tp_buf *o);
/* date: the date line ("25 Nov 2026"); NULL: the template's default, 26 Jul 2024 (Llama 3.1 / 3.3). */
enum tp_status tp_chat_render_llama31(const struct tp_chat_ctx *c, const char *date, struct tp_buf *o);
enum tp_status tp_chat_render_chatml(const struct tp_chat_ctx *c, struct tp_buf *o);
enum tp_status tp_chat_render_qwen3(const struct tp_chat_ctx *c, struct tp_buf *o);
enum tp_status tp_chat_render_qwen25(const struct tp_chat_ctx *c, struct tp_buf *o);
enum tp_status tp_chat_render_mistral(const struct tp_chat_ctx *c, struct tp_buf *o);
enum tp_status tp_chat_render_mistral_nemo(const struct tp_chat_ctx *c, struct tp_buf *o);
/* c->date: today as "2026-11-25" (the default system message prints it). */
enum tp_status tp_chat_render_mistral_small32(const struct tp_chat_ctx *c, struct tp_buf *o);
enum tp_status tp_chat_render_devstral(const struct tp_chat_ctx *c, struct tp_buf *o);

#endif /* TP_SERVER_CHAT_IMPL_H */
