/*
 * server/api_run.h - private: one engine request on behalf of an API other
 * than OpenAI's completions (Anthropic Messages, OpenAI Responses, Ollama).
 *
 * Each API translates its request body into the engine's request (struct
 * tp_req_params, usually by writing the equivalent chat-completions body and
 * passing it through tp_req_parse, so that every field is validated and
 * sampled exactly as chat completions do), then hands it to tp_run_request.
 * The runner renders the chat template, tokenizes, checks the context,
 * submits to the one engine (the same queue, batching, cancellation, limits
 * and ranks as chat completions), waits or streams, and calls back into the
 * API's formatter (struct tp_run_ops) to turn the engine's events into that
 * API's response or stream, and errors into that API's error shape.
 * Chat completions (api.c) shares the prompt builder (tp_run_tokens), the
 * waits and the walk over a streamed reply's tool calls.
 */
#ifndef TP_SERVER_API_RUN_H
#define TP_SERVER_API_RUN_H

#include "http_impl.h"

struct tp_run;

/* Where the stream of a reply that may hold tool calls stands. */
struct tp_call_cursor {
    size_t base;                         /* where the content starts in the reply: after </think> for a
                                          * reasoning reply (params.think), else 0 */
    size_t sent_text;                    /* content bytes streamed, from base */
    size_t sent_reasoning;               /* reasoning bytes streamed */
    int n_begun, n_done;                 /* calls begun (name sent), calls completed */
    size_t args_sent[TP_TOOL_MAX_CALLS]; /* argument bytes streamed of each begun call */
};
/* What a stream does with the pieces of such a reply (any may be NULL; ctx is the caller's). */
struct tp_call_sink {
    void (*text)(void *ctx, const char *text, size_t n);
    void (*reasoning)(void *ctx, const char *text, size_t n); /* a <think> reply's reasoning (params.think) */
    void (*begin)(void *ctx, int k, const char *name);
    void (*args)(void *ctx, int k, const char *args, size_t n);
    void (*done)(void *ctx, int k, const char *name, const char *args, size_t n);
};
/*
 * Stream what is new in r's reply (mu held) from a scan of its text in its tool format: the reasoning of a
 * <think> reply (params.think: the content and the calls come after </think>), content up to the first
 * call (a tail that could still become a call marker is held back), then each call as it begins (its name
 * complete), grows and completes, in order.  final: the reply ended.  Advances cur.
 */
void tp_run_stream_calls(const struct tp_req *r, int final, struct tp_call_cursor *cur,
                         const struct tp_call_sink *sink, void *ctx);
/* A chat-completions tool call {"id", "type": "function", "function": {"name", "arguments": args[0..n)}}
 * (NULL on out of memory). */
struct cJSON *tp_run_chat_call(const char *id, const char *name, const char *args, size_t n);

/* How one API shapes its answers.  Every callback that takes a struct tp_run
 * runs with the engine mutex held and appends to out; none may block. */
struct tp_run_ops {
    const char *path;          /* for the request log, e.g. "/v1/messages" */
    const char *id_prefix;     /* request ids: "<prefix><hex>" ("msg_", "resp_") */
    const char *call_id_prefix; /* tool call ids (tp_run_call_id): "toolu_", "call_" */
    const char *stream_type;   /* Content-Type of a stream: "text/event-stream", "application/x-ndjson" */
    /* streaming: first events, before any text (may be NULL) */
    void (*begin)(struct tp_run *x, struct tp_buf *out);
    /* streaming: released content text[0..n) (for a reply that may hold tool calls, the content before them) */
    void (*text)(struct tp_run *x, const char *text, size_t n, struct tp_buf *out);
    /* streaming, a reply that may hold tool calls (tool_choice auto or forced; any may be NULL): call k (0, 1,
     * ... in order) began and its name is complete (id: tp_run_call_id); its arguments grew by args[0..n)
     * (the fragments concatenate to the JSON text the model wrote); its arguments are complete (args[0..n):
     * the whole value).  A call cut short by a limit gets no call_done: end closes what is open. */
    void (*call_begin)(struct tp_run *x, int k, const char *id, const char *name, struct tp_buf *out);
    void (*call_args)(struct tp_run *x, int k, const char *args, size_t n, struct tp_buf *out);
    void (*call_done)(struct tp_run *x, int k, const char *name, const char *args, size_t n, struct tp_buf *out);
    /* streaming: the request finished (not with an error): the closing events */
    void (*end)(struct tp_run *x, struct tp_buf *out);
    /* streaming: the engine failed the request after the stream began */
    void (*error)(struct tp_run *x, const struct tp_api_error *e, struct tp_buf *out);
    /* streaming: nothing was sent for a second (NULL: send nothing) */
    void (*keepalive)(struct tp_run *x, struct tp_buf *out);
    /* not streaming: the whole answer of a finished request (malloc'd JSON; NULL out of memory) */
    char *(*final_json)(struct tp_run *x);
    /* an error in this API's shape (malloc'd JSON; NULL out of memory) */
    char *(*error_json)(const struct tp_api_error *e);
};

/* One request in flight.  ctx is the API's own state (owned by the run; ctx_free'd with it). */
struct tp_run {
    struct tp_server *s;
    struct tp_req *r;
    const struct tp_run_ops *ops;
    void *ctx;
    void (*ctx_free)(void *ctx);
    struct MHD_Connection *conn;
    /* streaming state */
    struct tp_buf out;         /* formatted, not yet handed to MHD */
    size_t out_pos;
    int sent_toks;             /* tokens whose text has been formatted */
    struct tp_call_cursor calls; /* what of the reply was formatted: content bytes (calls.sent_text), tool calls */
    int begun, ended, complete;
    int status;                /* the status logged and counted: 200, or the mid-stream error's */
    uint64_t last_out_ns;
};

/*
 * The prompt of a parsed request as token ids, built exactly as chat
 * completions builds it: p's messages rendered with the server's chat
 * template (the tools shown to the model when its template has a place for
 * them; tool_choice "auto" gets the grammar of the family's call format,
 * tp_req_tools_grammar, which sets p->tool_format), or p's prompt text
 * tokenized, or p's prompt ids copied.  *ids (malloc'd, caller frees) and
 * their count *n.  Returns TP_OK, or with e filled TP_ERR_INVALID_ARG (the
 * template refuses the messages; param names the field to blame),
 * TP_ERR_UNSUPPORTED (what the template cannot do), TP_ERR_NOMEM.
 */
enum tp_status tp_run_tokens(struct tp_server *s, struct tp_req_params *p, const char *param, int32_t **ids,
                             int *n, struct tp_api_error *e);

/* The server's defaults for what p leaves out, for every API: the generation defaults (s->gen: the command
 * line's, then the model's; tp_req_apply_defaults) and --logit-bias when p has no logit_bias of its own
 * (not for an embedding).  TP_OK or TP_ERR_NOMEM (e filled). */
enum tp_status tp_run_apply_defaults(const struct tp_server *s, struct tp_req_params *p, struct tp_api_error *e);

/*
 * A prompt of n tokens against the context, the same for every API: an empty prompt is refused; a prompt
 * that leaves no room for one token of reply, or a reply limit the request set (p->set TP_GEN_N_PREDICT)
 * that does not fit after it, gets TP_ERR_INVALID_ARG with code "context_length_exceeded" and the counts
 * (e->n_prompt_tokens, e->n_ctx) for each API's error shape; a limit that came from the server's
 * defaults is lowered to what fits instead.  prompt_param / max_param name the fields to blame.
 */
/* e (already filled with its message) as "context_length_exceeded" with the counts each API's error shows:
 * n prompt tokens, n_max the reply limit asked for (0: the prompt alone does not fit), n_ctx the context. */
void tp_run_context_error(struct tp_api_error *e, int n, int n_max, int n_ctx);
enum tp_status tp_run_check_context(const struct tp_server *s, struct tp_req_params *p, int n, const char *prompt_param,
                                    const char *max_param, struct tp_api_error *e);

/*
 * Wait (mu held, released while waiting) until r is done; every 100 ms
 * checks whether the client of c went away, and then cancels r and returns
 * -1 with mu held again.  Returns 0 when r is done.
 */
int tp_run_wait_done(struct tp_server *s, struct MHD_Connection *c, struct tp_req *r);

/* A streaming content callback's first move: hand MHD (buf, at most max bytes) what is formatted in
 * out[*pos..] and return how many bytes (> 0; out emptied once all went), or 0 when nothing is buffered.
 * *last_out_ns: when bytes last went out. */
size_t tp_run_drain(struct tp_buf *out, size_t *pos, char *buf, size_t max, uint64_t *last_out_ns);

/*
 * A streaming content callback waiting for news (mu held): returns when r has
 * tokens beyond sent_toks or is done (0), when nothing was sent for a second
 * and keepalive is set (1: the caller sends a keep-alive), or when the client
 * went away (-1: r cancelled, mu released).
 */
int tp_run_wait_news(struct tp_server *s, struct MHD_Connection *c, struct tp_req *r, int sent_toks,
                     uint64_t last_out_ns, int keepalive);

/*
 * Run p (owned from here on, also on failure) as one engine request and answer
 * c: streamed when p->stream, else one JSON object.  ctx/ctx_free: the API's
 * state, owned from here on.  ids (owned) may carry an already tokenized
 * prompt (n_ids > 0); NULL: tokenized here with tp_run_tokens.
 * max_tokens_param names the field to blame when prompt + max_tokens exceed
 * the context.  Errors before the stream begins use ops->error_json.
 */
enum MHD_Result tp_run_request(struct tp_server *s, struct MHD_Connection *c, const struct tp_run_ops *ops,
                               struct tp_req_params *p, int32_t *ids, int n_ids, const char *max_tokens_param,
                               void *ctx, void (*ctx_free)(void *));

/* Send e in the API's shape (ops->error_json), counted in /metrics and logged. */
enum MHD_Result tp_run_send_error(struct tp_server *s, struct MHD_Connection *c, const struct tp_run_ops *ops,
                                  const struct tp_api_error *e);

/* A token-counting endpoint's answer for the parsed request p (freed here): the prompt tp_run_tokens builds
 * (param names the field an error blames), answered as {"<object_kv>""input_tokens":N} (object_kv: "" or
 * the JSON members to put first, each followed by a comma), or the error in the API's shape. */
enum MHD_Result tp_run_count_tokens(struct tp_server *s, struct MHD_Connection *c, const struct tp_run_ops *ops,
                                    struct tp_req_params *p, const char *param, const char *object_kv);

/*
 * Parse an OpenAI chat-completions body (text of `req`, printed with
 * tp_json_print) into p: tp_req_parse with the server's vocabulary and
 * context (a completions request when it has a "prompt").  On failure e names the chat-completions field; rename maps such
 * names to the calling API's ({from, to} pairs, NULL-terminated), applied to
 * e->param and the message.
 */
int tp_run_parse_chat(struct tp_server *s, const struct cJSON *req, const char *const (*rename)[2],
                      struct tp_req_params *p, struct tp_api_error *e);

/* The finished reply of r read for tool calls in its format (tp_tool_scan, final) from *base (after
 * </think> in a reasoning reply, params.think; else 0): sc->calls[0, sc->n_calls) with complete set are the
 * calls (their offsets from base), r->text[base, base + sc->content_end) the content before them.  A reply
 * without calls (none asked for, or text that does not parse as calls) is all content.  Returns the number
 * of complete calls. */
int tp_run_reply_calls(const struct tp_req *r, struct tp_tool_scan *sc, size_t *base);

/* The id of tool call k of request r: prefix, the request id's unique part and k ("call_<id>_<k>"), or
 * the 9 alphanumeric characters Mistral's templates take (params.short_call_ids; derived from the same
 * two).  out: at least 96 bytes. */
void tp_run_call_id(const struct tp_server *s, const struct tp_req *r, int k, const char *prefix, char *out,
                    size_t cap);

/* e's message for the APIs whose errors have no param field (Anthropic's, Ollama's): "<param>: <message>"
 * when the message does not name the param, in buf (cap bytes); returns buf. */
const char *tp_run_error_text(const struct tp_api_error *e, char *buf, size_t cap);

/* Which stop string ended r ("" when EOS or a limit ended it; never NULL). */
const char *tp_run_stop_string(const struct tp_req *r, size_t *len);

/* Seconds since the epoch, and a random-looking suffix for ids (call_..., msg_...). */
void tp_run_make_id(struct tp_server *s, const char *prefix, char *out, size_t cap);

/* The routes of the APIs above (http.c's table sends them here): path and
 * method as routed, body of a POST. */
enum MHD_Result tp_api_route_ext(struct tp_server *s, struct MHD_Connection *c, const char *path, const char *body,
                                 size_t len);

/* e as JSON in the shape of the API that path belongs to: Anthropic's for /v1/messages..., Ollama's for
 * /api/..., else OpenAI's (malloc'd; NULL on out of memory).  For answers given before the body is read. */
char *tp_api_error_json_for(const char *path, const struct tp_api_error *e);

/* ---- the APIs (each in its own file) ---- */
enum MHD_Result tp_api_messages(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len);
enum MHD_Result tp_api_messages_count(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len);
/* The Anthropic error shape {"type":"error","error":{"type","message"}} (malloc'd). */
char *tp_api_messages_error_json(const struct tp_api_error *e);

enum MHD_Result tp_api_responses(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len);
enum MHD_Result tp_api_responses_input_tokens(struct tp_server *s, struct MHD_Connection *c, const char *body,
                                              size_t len);
/* GET /v1/responses/{id}, DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items from the store:
 * method "GET" / "DELETE", rest what follows "/v1/responses/". */
enum MHD_Result tp_api_responses_stored(struct tp_server *s, struct MHD_Connection *c, const char *method,
                                        const char *rest);
/* Ollama's error shape {"error": "..."} (malloc'd). */
char *tp_api_ollama_error_json(const struct tp_api_error *e);
/* Ollama's routes: /api/version, /api/tags, /api/ps, /api/show, /api/chat, /api/generate. */
enum MHD_Result tp_api_ollama(struct tp_server *s, struct MHD_Connection *c, const char *path, const char *body,
                              size_t len);
/* POST /v1/embeddings (ollama 0) and /api/embed (ollama 1). */
enum MHD_Result tp_api_embeddings(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len,
                                  int ollama);
/* The pooling of embeddings (enum tp_pooling): --pooling, else the model's GGUF pooling_type, else mean; 0
 * with e filled when the model gives no embeddings (a reranker). */
int tp_api_pooling(struct tp_server *s, struct tp_api_error *e);
/* Fill-in-the-middle (api_infill.c): POST /infill, and /v1/completions bodies with a non-empty suffix
 * (tp_api_is_fim_completion), whose FIM prompt goes on to tp_api_handle_completion as token ids. */
enum MHD_Result tp_api_infill(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len);
int tp_api_is_fim_completion(const char *body, size_t len);
enum MHD_Result tp_api_completion_fim(struct tp_server *s, struct MHD_Connection *c, const char *body, size_t len);
/* The Responses store (previous_response_id): cap entries, oldest evicted first; 0 stores nothing.
 * NULL on out of memory.  Thread safe. */
struct tp_resp_store *tp_resp_store_new(int cap);
void tp_resp_store_free(struct tp_resp_store *st); /* NULL safe */

#endif /* TP_SERVER_API_RUN_H */
