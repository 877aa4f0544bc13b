/*
 * server/include/server/server.h - the OpenAI-compatible HTTP API served by rank 0.
 *
 * HTTP threads (libmicrohttpd, one thread per connection, bounded) parse and
 * validate requests, tokenize them and hand them to the engine thread, which
 * batches all active sequences (continuous batching, chunked prefill) into
 * steps of the distributed engine (parallel/) and streams tokens back.
 *
 * Life cycle (rank 0):
 *     tp_server_init(&cfg, &srv, &err);   // HTTP up; API answers 503 "loading"
 *     ... tp_parallel_init(...) ...       // load the model (slow)
 *     tp_server_start(srv, engine);       // engine thread runs; API live
 *     tp_server_run(srv);                 // blocks until tp_server_stop()
 *     tp_server_free(srv);                // joins threads; engine not freed
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
 * GET /health, GET /metrics, GET /props, POST /tokenize, POST /detokenize, GET /v1/cluster
 * (per-rank JSON for the web page and scripts) and GET / (the web page;
 * server/web.c, docs/web.md).
 */
#ifndef TP_SERVER_H
#define TP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "parallel/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Server-wide generation defaults (llama-server's --temp --top-p --top-k
 * --min-p --seed --n-predict --repeat-penalty): what a request of any API
 * gets for a sampling field it leaves out.  set holds the TP_GEN_* bits of
 * the fields given; a field not given falls back to the model's own
 * defaults (GGUF general.sampling.*, an HF directory's generation_config.json)
 * and then to the engine's (temperature 1, top_p 1, top_k 0 (off), min_p 0,
 * repeat_penalty 1, a random seed per request, no token limit but the context).
 */
enum tp_gen_field {
    TP_GEN_TEMPERATURE = 1u << 0,
    TP_GEN_TOP_P = 1u << 1,
    TP_GEN_TOP_K = 1u << 2,
    TP_GEN_MIN_P = 1u << 3,
    TP_GEN_REPEAT_PENALTY = 1u << 4,
    TP_GEN_SEED = 1u << 5,
    TP_GEN_N_PREDICT = 1u << 6
};
struct tp_gen_defaults {
    unsigned set;         /* TP_GEN_* bits of the fields below that are given */
    float temperature;    /* 0..2 */
    float top_p;          /* (0, 1] */
    int top_k;            /* >= 0; 0: off */
    float min_p;          /* 0..1 */
    float repeat_penalty; /* (0, 10]; 1: off */
    uint64_t seed;
    int n_predict;        /* >= 1, or -1: until the end of text or the context */
};

struct tp_server_config {
    const char *host;          /* bind address, default "127.0.0.1" */
    int port;                  /* default 8080; 0: any free port (see tp_server_port) */
    int n_parallel;            /* sequences decoded together, default 8 (<= engine n_seq) */
    int max_queue;             /* waiting requests before 429, default 64 */
    size_t max_body_bytes;     /* request bodies above this get 413, default 1 MiB */
    const char *api_key;       /* NULL: no authentication; else "Authorization: Bearer KEY" on /v1/ routes, /tokenize, /detokenize */
    const char *chat_template; /* NULL: detect from model metadata; else a family name (tp_server_chat_template_names) */
    const char *model_id;      /* id reported by /v1/models; NULL: the model's name */
    int log_json;              /* per-request log lines as JSON objects */
    int max_connections;       /* connections waiting for their first header block, and connections being
                                * served, each at most this many, default 256.  A new waiting one evicts the
                                * one waiting longest; a served one over it evicts the connection idle longest
                                * between requests, else it is answered 503 */
    int max_conn_per_ip;       /* the same two counts per client address, default 32 (more are closed) */
    unsigned conn_timeout_s;   /* idle connection timeout (no bytes moving), default 60 */
    unsigned header_timeout_s; /* a complete header block must arrive within this many seconds of the
                                * connection opening (or of the previous response on it), default 10 */
    unsigned body_timeout_s;   /* a request body must be complete this many seconds after its headers, default 30 */
    size_t mem_budget_bytes;   /* request bodies and their per-request work held at once (see docs/http.md);
                                * a request that would exceed it gets 503, default 256 MiB */
    int n_batch;               /* max tokens per engine step (prefill chunk budget), default 256 */
    int prefill_chunk;         /* max prompt tokens per step while other sequences generate, default 64 */
    int prefix_share_min;      /* copy a prompt prefix held in another slot's KV cache when it saves at least
                                * this many tokens more than the chosen slot's own cache, default 32; 0: off */
    unsigned recover_wait_s;   /* after a worker was lost, a queued request waits at most this long for the
                                * group to re-form, then gets 503 with Retry-After (docs/recovery.md), default 60 */
    int on_rank_loss_replan;   /* 1: a rank gone for replan_after_s is left out when the surviving ranks have the
                                * memory for the model (they re-plan and reload); 0 (default): wait for it */
    unsigned replan_after_s;   /* default 10 */
    const char *cors_origin;   /* NULL: no CORS headers (browsers refuse cross-origin calls); else every answer
                                * carries Access-Control-Allow-Origin: this, and OPTIONS preflights get 204 */
    int pooling;               /* /v1/embeddings: 0 the model's (GGUF pooling_type; mean when it has none),
                                * 1 mean, 2 last token, 3 first token (cls) */
    int responses_store;       /* finished /v1/responses kept in memory for previous_response_id, oldest evicted
                                * first, default 256; 0: none */
    int spec;                  /* speculative decoding of requests that do not say ("speculative"): enum
                                * tp_spec_mode of server/spec.h, default TP_SPEC_OFF */
    const char *draft_model;   /* spec TP_SPEC_DRAFT: the draft model's GGUF (same vocabulary), loaded on rank 0
                                * by tp_server_start */
    int draft_max;             /* drafted tokens per sequence and step, 1..TP_SPEC_DRAFT_MAX, default 4 */
    const char *logit_bias;    /* NULL: none; else "ID+BIAS,ID-BIAS,..." (llama-server's --logit-bias): added to
                                * every request of every API that sends no logit_bias of its own; a bias of
                                * -100 or below bans the token.  Checked against the vocabulary at start */
    struct tp_gen_defaults gen; /* generation defaults given on the command line (set 0: none); they win over
                                 * the model's own (see struct tp_gen_defaults) */
};
struct tp_server_config tp_server_default_config(void);

/* "llama2, llama3, chatml, qwen3, mistral, zephyr, plain" (static text). */
const char *tp_server_chat_template_names(void);

typedef struct tp_server tp_server_t;

/* Bind and start HTTP (every API call answers 503 "loading" until
 * tp_server_start).  Strings in cfg are copied. */
enum tp_status tp_server_init(const struct tp_server_config *cfg, tp_server_t **out, struct tp_error *err);
/* Port actually bound (useful with port 0). */
int tp_server_port(const tp_server_t *s);
/* Attach the engine (not owned; must outlive the server) and start the engine
 * thread.  Fails (and the server keeps answering 503) on an unknown chat
 * template or a bad n_parallel; the message is in err. */
enum tp_status tp_server_start(tp_server_t *s, tp_parallel_t *engine, struct tp_error *err);
/* Rank 0's loading progress for GET /v1/cluster (bytes of its slice read of
 * total); callable from the loading thread while HTTP threads answer. */
void tp_server_load_progress(tp_server_t *s, uint64_t done, uint64_t total);
/* Mark loading as failed: /health and the API answer 503 with reason. */
void tp_server_set_failed(tp_server_t *s, const char *reason);
/* Block until tp_server_stop(). */
enum tp_status tp_server_run(tp_server_t *s);
/* Ask tp_server_run to return.  Async-signal-safe. */
void tp_server_stop(tp_server_t *s);
/* Stop HTTP, fail pending requests, join the engine thread, free.  NULL safe. */
void tp_server_free(tp_server_t *s);

#ifdef __cplusplus
}
#endif
#endif /* TP_SERVER_H */
