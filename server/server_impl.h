/*
 * server/server_impl.h - private: the pieces of the HTTP server shared by its
 * files (byte buffers, request errors, request validation, chat templates,
 * stop-string matching, SSE framing, metrics, the engine queue).  Everything
 * here is internal to tp_server; tests include it directly.
 *
 * Error convention: every fallible function returns enum tp_status (TP_OK on
 * success) and leaves its error text in a struct tp_error, or, for what
 * becomes an answer to a client, in a struct tp_api_error.  No function here
 * knows HTTP statuses: tp_http_error_kind (http.c) maps a status to the HTTP
 * status and OpenAI error type at the edge (docs/http.md has the table).
 */
#ifndef TP_SERVER_IMPL_H
#define TP_SERVER_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "model/model.h"
#include "parallel/parallel.h"
#include "grammar.h"
#include "tool_parse.h"
#include "server/server.h"
#include "server/spec.h"

/* ============================================================ buffers ===== */

/* Growable byte buffer, always NUL-terminated when data != NULL.  The appends
 * return TP_OK or TP_ERR_NOMEM (b unchanged then). */
struct tp_buf {
    char *data;
    size_t len, cap;
};
enum tp_status tp_buf_append(struct tp_buf *b, const char *s, size_t n);
enum tp_status tp_buf_puts(struct tp_buf *b, const char *s);
enum tp_status tp_buf_printf(struct tp_buf *b, const char *fmt, ...) TP_PRINTF(2, 3);
void tp_buf_free(struct tp_buf *b);
/* Nonzero when s[0..n) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
int tp_srv_utf8_valid(const char *s, size_t n);

/* ============================================================ errors ===== */

/*
 * An error to be answered to a client: what went wrong (status), the request
 * field it names and the message.  The edge turns it into
 * {"error":{"message","type","param","code"}} with the HTTP status of
 * tp_http_error_kind(status).
 */
struct tp_api_error {
    enum tp_status status; /* TP_OK: no error */
    const char *code;      /* static; NULL: the default code of the status (tp_http_error_kind) */
    char param[64];        /* request field the error names; "" -> null */
    char message[512];
    int n_prompt_tokens;   /* code "context_length_exceeded": the prompt's tokens, the reply limit asked for (0: */
    int n_max_tokens;      /* the prompt alone does not fit) and the context, which each API's error shape */
    int n_ctx;             /* shows; else 0 */
};
/* Fill e (code reset to NULL, counts to 0).  Returns st, for `return tp_api_err(...)`. */
enum tp_status tp_api_err(struct tp_api_error *e, enum tp_status st, const char *param, const char *fmt, ...)
    TP_PRINTF(4, 5);
/* Fill e from err (its status and message; no param).  Returns err's status. */
enum tp_status tp_api_err_from(struct tp_api_error *e, const struct tp_error *err);

/* What the HTTP edge answers for a status (http.c; the one place that maps statuses to HTTP). */
struct tp_http_error_kind {
    int http_status;           /* 400, 401, 404, 405, 413, 429, 431, 499 (client gone; logs only), 500, 503 */
    const char *type;          /* OpenAI error type: "invalid_request_error", "rate_limit_error", "server_error" */
    const char *code;          /* default OpenAI error code, NULL -> JSON null */
    const char *header_name;   /* extra header for the answer (Retry-After, Allow, WWW-Authenticate) or NULL */
    const char *header_value;
};
struct tp_http_error_kind tp_http_error_kind(enum tp_status st);
/* JSON text of e (malloc'd, caller frees); NULL on out of memory. */
char *tp_api_error_json(const struct tp_api_error *e);

/* ===================================================== JSON with NUL ===== */

/*
 * cJSON strings are NUL-terminated, so inside the server's cJSON trees U+0000
 * is written as the two bytes C0 80 (json_nul.c; C0 never occurs in valid
 * UTF-8).  tp_json_parse: the body must be valid UTF-8 without a raw NUL
 * byte and a JSON object; each \u0000 escape becomes C0 80 before cJSON
 * parses it.  Returns the tree (caller cJSON_Delete's it), or NULL with e
 * filled (TP_ERR_FORMAT; TP_ERR_NOMEM).
 */
struct cJSON;
struct cJSON *tp_json_parse(const char *body, size_t len, struct tp_api_error *e);
/* String value v (C0 80 -> NUL) as malloc'd bytes *out[0..*len) (NUL-terminated
 * too; caller frees).  Not a string: "".  Returns TP_OK or TP_ERR_NOMEM. */
enum tp_status tp_json_bytes(const struct cJSON *v, char **out, size_t *len);
/* C0 80 -> NUL in place in s[0..n); returns the new length. */
size_t tp_json_decode_nul(char *s, size_t n);
/* Nonzero when the tree string s holds a NUL (C0 80). */
int tp_json_has_nul(const char *s);
/* Append bytes s[0..n) in tree form: NUL -> C0 80, invalid UTF-8 -> U+FFFD.
 * Returns TP_OK or TP_ERR_NOMEM. */
enum tp_status tp_json_encode_bytes(const char *s, size_t n, struct tp_buf *out);
/* A cJSON string of bytes s[0..n) (tree form), NULL on out of memory. */
struct cJSON *tp_json_string_bytes(const char *s, size_t n);
/* obj[key] = bytes s[0..n).  Returns TP_OK or TP_ERR_NOMEM. */
enum tp_status tp_json_add_bytes(struct cJSON *obj, const char *key, const char *s, size_t n);
/* cJSON_PrintUnformatted with each C0 80 written as \u0000 (malloc'd; NULL on out of memory). */
char *tp_json_print(const struct cJSON *root);

/* ====================================================== chat templates ===== */

enum tp_chat_family {
    TP_CHAT_UNKNOWN = 0,
    TP_CHAT_LLAMA2,
    TP_CHAT_LLAMA3,
    TP_CHAT_CHATML,
    TP_CHAT_QWEN3,
    TP_CHAT_MISTRAL,
    TP_CHAT_ZEPHYR,
    TP_CHAT_PLAIN, /* "<role>: <content>\n" lines (--chat-template plain only) */
    TP_CHAT_LLAMA31,      /* Llama 3.1 / 3.2 / 3.3: tools in the first user message, JSON calls */
    TP_CHAT_QWEN25,       /* Qwen2.5: ChatML with a default system message, Hermes <tool_call> */
    TP_CHAT_MISTRAL_NEMO, /* Mistral Nemo: [AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS] */
    TP_CHAT_LLAMA32,      /* Llama 3.2: Llama 3.1's with today's date in the system header */
    TP_CHAT_HARMONY,      /* gpt-oss (server/harmony.c): tools as a TypeScript namespace, calls on the
                           * commentary channel (read from the reply's channel tokens, not tool_parse.c) */
    TP_CHAT_MISTRAL_SMALL32, /* Mistral Small 3.2: [SYSTEM_PROMPT], calls as [TOOL_CALLS]name[CALL_ID]id[ARGS]{..} */
    TP_CHAT_DEVSTRAL,     /* Devstral Small (unsloth's template): calls as [TOOL_CALLS]name[ARGS]{..} */
    TP_CHAT_FAMILY_COUNT
};
/* One tool call of an assistant message in the history. */
struct tp_chat_call {
    const char *id;              /* the call's id as the client sent it ("" when absent) */
    const char *name;            /* function name */
    const struct cJSON *arguments; /* the arguments, parsed from the client's JSON text (templates print it
                                    * with tojson) */
};
struct tp_chat_msg {
    const char *role;    /* "system" | "user" | "assistant" | "tool" */
    const char *content; /* UTF-8 in tree form (NUL as C0 80, see tp_json_parse): templates treat it as one
                          * more character; tp_json_decode_nul the rendered text before tokenizing */
    const char *reasoning;            /* assistant: reasoning_content or NULL (qwen3, harmony render it) */
    const struct tp_chat_call *calls; /* assistant: (n_calls) tool calls; NULL when none */
    int n_calls;
    const char *tool_call_id;         /* tool: the id of the call this message answers ("" when absent) */
};
/* Family of a Jinja chat template by its markers; NULL or "" -> CHATML (llama-server's fallback for a model
 * without a template); unrecognised -> UNKNOWN. */
enum tp_chat_family tp_chat_detect(const char *tmpl);
/* "llama3" -> TP_CHAT_LLAMA3; UNKNOWN for other names. */
enum tp_chat_family tp_chat_family_parse(const char *name);
const char *tp_chat_family_name(enum tp_chat_family f);
/*
 * Render msgs as the family's reference template does (Hugging Face Jinja,
 * trim_blocks + lstrip_blocks).  bos/eos: the special token texts.  Appends
 * to out.  Returns TP_OK, TP_ERR_INVALID_ARG with the template's message in
 * err (it would raise, e.g. roles that do not alternate), TP_ERR_NOMEM.
 */
enum tp_status tp_chat_render(enum tp_chat_family f, const struct tp_chat_msg *msgs, int n_msgs,
                              int add_generation_prompt, const char *bos, const char *eos, const char *default_system,
                              struct tp_buf *out, struct tp_error *err);
/* Everything a template reads besides the messages. */
struct tp_chat_opts {
    int add_generation_prompt;
    const char *bos, *eos;          /* special token texts; NULL: "" */
    const char *default_system;     /* see tp_chat_default_system; NULL: none */
    const struct cJSON *tools;      /* the request's tools, a JSON array of {"type": "function", "function": {...}}
                                     * in tree form, rendered as the family's template does; NULL: none */
    const char *date;               /* "25 Nov 2026": the date templates that print today's date show
                                     * (llama3.2); NULL: today, local time */
    const char *reasoning_effort;   /* harmony's "Reasoning:" line ("low" | "medium" | "high"); NULL: the
                                     * template's "medium" */
};
/* tp_chat_render with options.  Families without a tools block refuse tools,
 * tool calls and tool messages (TP_ERR_INVALID_ARG with a message) rather
 * than drop them. */
enum tp_status tp_chat_render_opts(enum tp_chat_family f, const struct tp_chat_msg *msgs, int n_msgs,
                                   const struct tp_chat_opts *o, struct tp_buf *out, struct tp_error *err);
/* 1 when family f renders tools and tool messages. */
int tp_chat_has_tools(enum tp_chat_family f);
/* The format family f's models write tool calls in (TP_TOOL_FORMAT_NONE: none). */
enum tp_tool_format tp_chat_tool_format(enum tp_chat_family f);
/* Jinja's tojson as @huggingface/jinja writes it: ", " and ": " separators,
 * numbers as JavaScript prints them, strings as JSON.stringify escapes them
 * (tree-form NUL as \u0000); indent > 0: one member per line.  TP_OK or TP_ERR_NOMEM. */
enum tp_status tp_chat_tojson(const struct cJSON *v, int indent, struct tp_buf *out);
/*
 * ChatML templates that open with a default system message when the
 * conversation has none (Qwen2: "You are a helpful assistant.", Qwen2.5:
 * "You are Qwen, created by Alibaba Cloud. ..."): the text of the string
 * literal '<|im_start|>system\n...<|im_end|>' in the template.  Returns 1
 * and fills out (passed to tp_chat_render as default_system), or 0.
 */
int tp_chat_default_system(const char *tmpl, char *out, size_t cap);

/* ============================================ harmony (gpt-oss) format ===== */

struct tp_harmony_opts {
    const char *reasoning_effort; /* "low" | "medium" | "high"; NULL: the template's "medium" */
    const char *date;             /* "YYYY-MM-DD" for "Current date:"; NULL: today, local time */
    const struct cJSON *tools;    /* the request's tools list (validated), or NULL */
    int add_generation_prompt;
};
/* Nonzero for "low", "medium", "high". */
int tp_harmony_effort_valid(const char *effort);
/*
 * Render msgs as openai-gpt-oss-120b.jinja does (see server/harmony.c for
 * how the request maps onto the template and where it is refused).
 * Appends to out.  Returns TP_OK, TP_ERR_INVALID_ARG with the reason in err
 * (what the template would raise, or input it would drop), TP_ERR_NOMEM.
 */
enum tp_status tp_harmony_render(const struct tp_chat_msg *msgs, int n_msgs, const struct tp_harmony_opts *opt,
                                 struct tp_buf *out, struct tp_error *err);

/* The harmony control tokens of a vocabulary (-1 when absent). */
struct tp_harmony_ids {
    int32_t start, end, message, channel, constrain, ret, call;
};
/* Fill h; returns 1 when the vocabulary has <|start|> <|end|> <|message|> <|channel|>
 * <|return|> and <|call|>, else 0. */
int tp_harmony_ids_init(const tp_tokenizer_t *t, struct tp_harmony_ids *h);

enum tp_harmony_kind { TP_HARMONY_REASONING = 0, TP_HARMONY_CONTENT, TP_HARMONY_CALL };
/* One message body of a reply: its text is reply_text[b, e). */
struct tp_harmony_seg {
    enum tp_harmony_kind kind;
    size_t b, e;
    size_t name_b, name_e; /* CALL: the function name (after "to=functions.") in the reply text */
    int closed;            /* its end token (<|end|>, <|return|>, <|call|>) was generated */
};
/*
 * Split a reply into message bodies.  toks[i] is the i-th generated token
 * (its id, and text_end: the reply's text length after it; control tokens
 * add no text); text[0, text_len) is the reply's text.  done: the reply is finished (a
 * reply that never opened a message body is then one content segment: a
 * model that ignores the format still answers).  Writes up to max_segs
 * segments, returns how many there are.  Stateless: call it again on a
 * longer reply to stream.
 */
struct tp_gen_tok;
int tp_harmony_scan(const struct tp_harmony_ids *h, const struct tp_gen_tok *toks, int n, const char *text,
                    size_t text_len, int done, struct tp_harmony_seg *segs, int max_segs);

/*
 * The assistant message of a finished reply (its tokens and text as for
 * tp_harmony_scan): adds role, content (null when the reply is only tool
 * calls), reasoning_content (when there is any) and tool_calls ({id
 * "call_<req_id>_<k>", type, function {name, arguments}}) to msg; *n_calls
 * set.  Returns TP_OK, TP_ERR_NOMEM.
 */
enum tp_status tp_harmony_message(const struct tp_harmony_ids *h, const struct tp_gen_tok *toks, int n,
                                  const char *text, size_t text_len, const char *req_id, struct cJSON *msg,
                                  int *n_calls);
/* Where a stream stands: the body being sent, bytes of it sent, its call announced, calls finished. */
struct tp_harmony_cursor {
    int seg;
    size_t pos;
    int announced, calls;
};
/*
 * Stream deltas for what is new in a reply since cur (zeroed at the start):
 * appends OpenAI delta objects to the cJSON array deltas ({"reasoning_content":
 * text}, {"content": text}, a call announced as {"tool_calls": [{index, id,
 * type, function {name, arguments: ""}}]} once its header is complete, then
 * {"tool_calls": [{index, function {arguments: text}}]} as it grows) and
 * advances cur.  Returns TP_OK, TP_ERR_NOMEM.
 */
enum tp_status tp_harmony_deltas(const struct tp_harmony_ids *h, const struct tp_gen_tok *toks, int n,
                                 const char *text, size_t text_len, int done, const char *req_id,
                                 struct tp_harmony_cursor *cur, struct cJSON *deltas);

/* ==================================== <think> reasoning (qwen3 family) ===== */

/* A reply split into reasoning and answer: text[reasoning_b, reasoning_e) and
 * text[content_b, content_e). */
struct tp_think_parts {
    int thinking;                /* the reply opens with <think> */
    int closed;                  /* </think> seen */
    size_t reasoning_b, reasoning_e;
    size_t content_b, content_e;
};
/*
 * Split the reply so far, text[0, len) (server/think.c).  done: the reply is
 * finished (text held back as a possible tag is then released).  The parts
 * only grow as the reply does, so a stream sends each part's new bytes.
 */
void tp_think_split(const char *text, size_t len, int done, struct tp_think_parts *p);

/* ================================================== request parameters ===== */

/* How an embedding request pools its tokens' final hidden states. */
enum tp_pooling { TP_POOL_NONE = 0, TP_POOL_MEAN, TP_POOL_LAST, TP_POOL_CLS, TP_POOL_COUNT };

#define TP_MAX_STOP 16
#define TP_MAX_STOP_BYTES 256
#define TP_MAX_LOGIT_BIAS 1024 /* logit_bias entries per request */

struct tp_req_params {
    int chat;                      /* 1: /v1/chat/completions */
    char *model;                   /* owned; NULL when absent */
    char *prompt;                  /* completions, text prompt (owned, may hold NUL) or NULL */
    size_t prompt_len;             /* bytes of prompt */
    int32_t *prompt_ids;           /* completions, token prompt (owned) or NULL */
    int n_prompt_ids;
    struct tp_chat_msg *msgs;      /* chat (owned, strings owned too) */
    int n_msgs;
    int max_tokens;                /* -1: until the context is full */
    unsigned set;                  /* TP_GEN_* bits (server.h) of the sampling fields the request gave
                                    * (max_tokens: TP_GEN_N_PREDICT); the others take the server's defaults
                                    * (tp_req_apply_defaults) */
    float temperature, top_p, min_p;
    int top_k;
    float presence_penalty, frequency_penalty, repetition_penalty;
    int has_seed;
    uint64_t seed;                 /* any integer in [-2^63, 2^64 - 1], negative ones taken modulo 2^64 */
    int n_logit_bias;              /* logit_bias entries, 0..TP_MAX_LOGIT_BIAS */
    int32_t *bias_id;              /* (n_logit_bias) token ids, ascending, distinct (owned) */
    float *bias_val;               /* (n_logit_bias) -100..100; -100 bans the token (owned) */
    int logprobs;                  /* chat: 0/1; completions: 1 when logprobs given (>= 0) */
    int top_logprobs;              /* alternatives per token, 0..20 */
    int stream, include_usage, ignore_eos;
    char *stop[TP_MAX_STOP];       /* owned, may hold NUL */
    size_t stop_len[TP_MAX_STOP];  /* bytes of each stop string */
    int n_stop;
    struct tp_grammar *grammar;    /* response_format json_object / json_schema: the reply's automaton (owned);
                                    * NULL: unconstrained */
    int embed;                     /* enum tp_pooling: nonzero: an embedding request: the prompt is read and its
                                    * final hidden states pooled into tp_req.embd; nothing is generated */
    int tool_call;                 /* tool_choice required / named: the reply is {"name", "arguments"} under grammar,
                                    * returned as tool_calls */
    char *tool_name;               /* tool_choice names this function (owned); NULL: "required" or no forced call */
    struct cJSON *tools;           /* chat: the request's tools (owned, tree form) when the model may see them
                                    * (tool_choice other than "none"); NULL otherwise */
    int tool_auto;                 /* tool_choice "auto" with tools: the reply may hold calls in the family's
                                    * format; grammar (built by tp_req_tools_grammar) is switched on where a
                                    * call begins */
    int parallel_tool_calls;       /* 0: at most one call per reply (the reply ends after it) */
    int harmony_calls;             /* gpt-oss with tool_choice auto: grammar (name bytes, then arguments) constrains a
                                    * message body whose header addresses to=functions.NAME */
    int short_call_ids;            /* tool call ids are 9 alphanumerics (the Mistral families' templates need them) */
    int think;                     /* with tool_auto: the reply may open with <think> reasoning (the qwen3
                                    * family), returned as reasoning_content; calls are looked for after it */
    enum tp_tool_format tool_format; /* the format the reply's calls are read in: JSON for forced calls, the
                                      * family's format with tool_auto, NONE: no calls */
    struct tp_chat_call *calls;    /* (n_calls) every history tool call, referenced by msgs (owned, with their
                                    * strings and arguments) */
    int n_calls;
    char *reasoning_effort;        /* "low" | "medium" | "high" (owned) or NULL */
    int speculative;               /* "speculative": 1 true: draft and verify (n-gram lookup), -1 false: plain
                                    * decoding, 0 (absent): the server's --spec */
};
/*
 * Parse and validate a JSON body.  n_vocab bounds token ids, n_ctx bounds
 * max_tokens.  Returns TP_OK, or with e filled: TP_ERR_INVALID_ARG /
 * TP_ERR_FORMAT (a bad field, named in e->param), TP_ERR_UNSUPPORTED (a field
 * this server refuses), TP_ERR_NOMEM; p is freed then (freeing it again is harmless).
 */
enum tp_status tp_req_parse(const char *body, size_t len, int chat, int n_vocab, int n_ctx, struct tp_req_params *p,
                 struct tp_api_error *e);
void tp_req_params_free(struct tp_req_params *p);
/*
 * The one place where server-wide generation defaults reach a request: every
 * field of d that is given (d->set) and that p left out (p->set) is copied
 * into p (seed: has_seed set; n_predict: max_tokens, its bit left clear in
 * p->set so that the context check clamps it instead of refusing it).
 * Embedding requests are left alone.  d may be NULL.
 */
void tp_req_apply_defaults(struct tp_req_params *p, const struct tp_gen_defaults *d);
/*
 * tool_choice "auto": compile p->grammar for calls written in format f (the
 * chat family's; each call's arguments under its tool's parameters schema)
 * and set p->tool_format.  Returns TP_OK, or with e filled:
 * TP_ERR_UNSUPPORTED (the family has no tool format), TP_ERR_INVALID_ARG (a
 * schema outside the subset), TP_ERR_NOMEM.
 */
enum tp_status tp_req_tools_grammar(struct tp_req_params *p, enum tp_tool_format f, const char *family,
                                    struct tp_api_error *e);
/*
 * A forced call (tool_choice required / named) for gpt-oss: the reply is
 * generated after the prompt's "<|channel|>commentary to=functions." as the
 * function's name and then its arguments object (format NAME_ARGS), under
 * the tools' grammar.  Replaces p->grammar.  TP_OK or as tp_req_tools_grammar.
 */
enum tp_status tp_req_forced_name_args(struct tp_req_params *p, struct tp_api_error *e);
/* gpt-oss, tool_choice auto: the same grammar for the bodies of the calls the
 * model addresses to=functions.NAME (the scheduler feeds NAME first; sets
 * p->harmony_calls).  TP_OK or as tp_req_tools_grammar. */
enum tp_status tp_req_harmony_calls_grammar(struct tp_req_params *p, struct tp_api_error *e);

/* ======================================================= stop strings ===== */

/*
 * Generated text so far is text[0..len).  Returns how many bytes may be sent
 * to the client: everything except a tail that could still grow into a stop
 * string.  When a stop string occurs (searching at offsets >= from), *hit = 1
 * and the return value is where it starts (the stop string is never sent).
 */
size_t tp_stop_scan(const char *text, size_t len, size_t from, char *const *stops, const size_t *stop_lens, int n_stop,
                    int *hit);

/* ================================================================ SSE ===== */

/* Append one event; TP_OK or TP_ERR_NOMEM. */
enum tp_status tp_sse_data(struct tp_buf *b, const char *json);    /* "data: <json>\n\n" */
enum tp_status tp_sse_done(struct tp_buf *b);                      /* "data: [DONE]\n\n" */
enum tp_status tp_sse_comment(struct tp_buf *b, const char *text); /* ": <text>\n\n" */

/* ============================================================ metrics ===== */

struct tp_metrics;
struct tp_metrics *tp_metrics_new(void);
void tp_metrics_free(struct tp_metrics *m);
void tp_metrics_request(struct tp_metrics *m, int http_status);
void tp_metrics_finished(struct tp_metrics *m, int n_prompt, int n_gen, double ttft_s, double tpot_s);
/* Prompt tokens of a finished request that were not prefilled (KV cache reuse / prefix sharing). */
void tp_metrics_prompt_cached(struct tp_metrics *m, int n_cached);
void tp_metrics_tokens_per_s(struct tp_metrics *m, double tps);
#define TP_METRICS_RANKS_MAX 64 /* per-rank series shown (larger groups: the first 64) */
/* Rank losses and recoveries of the engine (counters since start). */
struct tp_engine_recovery_stats {
    uint64_t n_losses;          /* ranks lost (steps or pings that failed in a group that can re-form) */
    uint64_t n_recoveries;      /* times the group re-formed */
    uint64_t n_failed_by_loss;  /* requests that were generating when a rank was lost (ended with 503) */
    uint64_t n_expired;         /* queued requests that waited out --recover-wait (503) */
    double recovery_s_total;    /* sum over recoveries of loss -> group re-formed */
    double last_recovery_s;
    uint64_t n_replans;         /* times the group re-formed without a lost rank (--on-rank-loss replan) */
};

struct tp_metrics_gauges {
    int queue_depth, active_seqs, n_parallel, healthy;
    int recovering;                              /* a rank is lost and the group is re-forming */
    struct tp_engine_recovery_stats recovery;
    int n_ranks;
    uint64_t n_steps;                            /* rank 0's engine steps */
    uint64_t n_generated;                        /* tokens generated for requests since start */
    int n_rank_stats;                            /* entries of the arrays below */
    uint64_t ns_comm[TP_METRICS_RANKS_MAX];      /* per rank (workers: as last collected, ~1 s lag) */
    uint64_t ns_compute[TP_METRICS_RANKS_MAX];
    uint64_t bytes_sent[TP_METRICS_RANKS_MAX];
    /* speculative decoding and decode efficiency (engine counters since start) */
    uint64_t spec_drafted, spec_accepted;         /* drafted tokens verified, of which accepted */
    uint64_t spec_grammar_cuts;                   /* verification walks ended by an accepted draft that switched
                                                   * the grammar on or off (tool_choice "auto") */
    uint64_t decode_seq_steps;                    /* (sequence, step) pairs that chose tokens */
    uint64_t step_collectives;                    /* collectives of the engine's steps (rank 0's comm ops) */
};
/* Prometheus text exposition format 0.0.4. Returns TP_OK or TP_ERR_NOMEM. */
enum tp_status tp_metrics_render(struct tp_metrics *m, const struct tp_metrics_gauges *g, struct tp_buf *out);

/* ================================================ speculative decoding ===== */

/* usage of a request that drafted (tp_req.spec): completion_tokens_details
 * {accepted_prediction_tokens, rejected_prediction_tokens} as OpenAI's
 * predicted outputs report them, and "speculative" {drafted, accepted,
 * acceptance, steps, tokens_per_step} (server/spec.c).  Out of memory leaves
 * fields out. */
struct tp_req;
void tp_usage_add_spec(struct cJSON *usage, const struct tp_req *r);

/* ======================================================= engine queue ===== */

enum tp_req_state { TP_REQ_QUEUED = 0, TP_REQ_RUNNING, TP_REQ_DONE };
enum tp_finish { TP_FINISH_NONE = 0, TP_FINISH_STOP, TP_FINISH_LENGTH, TP_FINISH_ERROR, TP_FINISH_CANCELLED };

/* One generated token as seen by the HTTP side. */
struct tp_gen_tok {
    int32_t id;
    float logprob;
    size_t text_end;               /* released text length after this token */
    int n_top;
    struct tp_logprob top[20];
};

/*
 * A request handed from an HTTP thread to the engine.  Fields above `mu
 * protected` are written by the HTTP thread before tp_engine_submit and then
 * read-only; the rest are guarded by the engine's mutex.  Two references
 * (HTTP side, engine side); freed by whichever releases last.
 */
struct tp_req {
    char id[48];
    int chat;
    struct tp_req_params params;
    int32_t *prompt;               /* (n_prompt) token ids, owned */
    int n_prompt;
    int max_tokens;                /* effective, >= 1 */
    uint64_t seed;
    uint64_t t_submit_ns;
    /* ---- mu protected ---- */
    enum tp_req_state state;
    enum tp_finish finish;
    int stop_idx;                  /* with TP_FINISH_STOP: 1 + the index of the stop string that ended it; 0: EOS,
                                    * a complete grammar value or no stop string */
    int cancelled;                 /* set by the HTTP side (client gone) */
    struct tp_error err;           /* with TP_FINISH_ERROR: why (TP_ERR_PEER rank lost, TP_ERR_BUSY stopping,
                                    * TP_ERR_TIMEOUT recovery wait over, TP_ERR_NOMEM, TP_ERR_INTERNAL, ...) */
    struct tp_gen_tok *toks;       /* (max_tokens), owned */
    int n_toks;
    struct tp_buf text;            /* released text */
    float *embd;                   /* (n_embd) with params.embed: the pooled hidden state, L2-normalised when the
                                    * request is done (owned; allocated zeroed by the submitter) */
    int n_prefilled;               /* prompt tokens processed so far */
    int n_cached;                  /* prompt tokens not prefilled: reused from the slot's own KV cache or
                                    * copied from another slot's (prefix sharing) */
    uint64_t t_first_ns, t_done_ns;
    int spec;                      /* the request drafts and verifies (speculative decoding) */
    int spec_mode;                 /* enum tp_spec_mode its drafts come from */
    int n_decode_steps;            /* engine steps that chose at least one of its tokens */
    int n_drafted, n_accepted;     /* drafted tokens verified, of which accepted */
    int refs;
    pthread_cond_t cond;           /* signalled on every change */
};

struct tp_engine;
struct tp_engine_config {
    int n_parallel;
    int max_queue;
    int n_batch;       /* max tokens per step */
    int prefill_chunk; /* max prompt tokens per step while others generate; 0: n_batch */
    int prefix_share_min; /* copy a prompt prefix from another slot's KV cache when it is at least this
                           * many tokens longer than the chosen slot's own; 0: no cross-slot sharing */
    uint32_t recover_wait_ms; /* after a rank was lost, a queued request waits at most this long for the
                               * group to re-form, then gets 503; 0: 60000 */
    int replan;               /* --on-rank-loss replan: a rank gone for replan_after_ms is left out when the
                               * survivors have the memory (tp_parallel_replan_query); 0: wait for it */
    uint32_t replan_after_ms; /* 0: 10000 */
    int spec;                 /* enum tp_spec_mode: the default of requests without "speculative" */
    int draft_max;            /* drafted tokens per sequence and step, 1..TP_SPEC_DRAFT_MAX; 0: 4 */
    const char *draft_model;  /* spec TP_SPEC_DRAFT: the draft model's file (loaded by tp_engine_init) */
};
/* Starts the engine thread on p (not owned). */
enum tp_status tp_engine_init(const struct tp_engine_config *cfg, tp_parallel_t *p, struct tp_metrics *metrics,
                              struct tp_engine **out, struct tp_error *err);
/* Stops the thread and fails queued/running requests (503); later submits get
 * 503.  The handle stays valid for tp_engine_release/cancel.  Idempotent. */
void tp_engine_stop(struct tp_engine *e);
/* tp_engine_stop, then frees.  NULL safe. */
void tp_engine_free(struct tp_engine *e);
/* New request with refs = 2 (caller + engine after submit). NULL on out of memory. */
struct tp_req *tp_req_new(void);
/* Drop the caller's reference (frees at 0). */
void tp_engine_release(struct tp_engine *e, struct tp_req *r);
/* Queue r.  Returns TP_OK, or with err filled: TP_ERR_FULL (queue full),
 * TP_ERR_BUSY (a rank is silent, or stopping), TP_ERR_POISONED (the engine failed). */
enum tp_status tp_engine_submit(struct tp_engine *e, struct tp_req *r, struct tp_api_error *err);
/* Client gone: the engine frees the slot at its next step. */
void tp_engine_cancel(struct tp_engine *e, struct tp_req *r);
pthread_mutex_t *tp_engine_mutex(struct tp_engine *e);
/* Nonzero when healthy; otherwise reason filled. */
int tp_engine_healthy(struct tp_engine *e, char *reason, size_t cap);
void tp_engine_gauges(struct tp_engine *e, struct tp_metrics_gauges *g);
/* Every rank's counters (tp_parallel_get_rank_stats) as the engine thread last
 * read them: after steps (at most every 250 ms), when it goes idle and after
 * each ping; never waits on the group.  out[r] for r < min(world, max, 64).
 * Returns the world size. */
int tp_engine_rank_stats(struct tp_engine *e, struct tp_parallel_stats *out, int max);

#endif /* TP_SERVER_IMPL_H */
