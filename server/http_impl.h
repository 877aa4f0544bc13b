/*
 * server/http_impl.h - private: the server handle and the helpers shared by
 * http.c (daemon, routing, small endpoints) and api.c (completions).
 */
#ifndef TP_SERVER_HTTP_IMPL_H
#define TP_SERVER_HTTP_IMPL_H

#include <netinet/in.h>

#include <microhttpd.h>

#include "server_impl.h"

enum tp_srv_state { TP_SRV_LOADING = 0, TP_SRV_READY, TP_SRV_FAILED };

/*
 * Memory charged to the server-wide budget per POST request, reserved when its
 * headers arrive: TP_HTTP_WORK_FACTOR times the body (its Content-Length, or
 * --max-body for a chunked body) plus TP_HTTP_WORK_CONST.  It covers the body
 * buffer (grown by doubling), the parsed JSON, token ids and the response
 * buffers; docs/http.md states the bounds.
 */
#define TP_HTTP_WORK_FACTOR 10
#define TP_HTTP_WORK_CONST ((size_t)256 * 1024)

/* One open TCP connection, for the header/body deadlines and eviction (http.c). */
struct tp_http_conn;
/* The listening socket and the connections still sending their first header block (http_gate.c). */
struct tp_http_gate;

struct tp_server {
    struct tp_server_config cfg;      /* strings owned (copied) */
    struct MHD_Daemon *daemon;
    int port;
    pthread_mutex_t state_mu;         /* guards state, fail_reason */
    enum tp_srv_state state;
    char fail_reason[512];
    tp_parallel_t *par;               /* not owned */
    tp_tokenizer_t *tok;              /* owned by the model */
    pthread_mutex_t tok_mu;           /* encode from HTTP threads */
    struct tp_engine *engine;
    struct tp_metrics *metrics;
    enum tp_chat_family chat;
    struct tp_harmony_ids harmony; /* TP_CHAT_HARMONY: the control tokens the reply is split by */
    char bos_text[64], eos_text[64];
    char default_system[512];         /* ChatML default system message, "" if none */
    int has_default_system;
    char *model_id;                   /* owned */
    int n_ctx, n_vocab;
    int64_t created;
    uint64_t next_id;                 /* request ids (atomic add) */
    int stop_pipe[2];
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    /* connections (guarded by conn_mu; the watchdog thread cuts late ones) */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;           /* wakes the watchdog to stop */
    struct tp_http_conn *conns;       /* doubly linked, oldest last */
    int n_conns, n_cut;               /* open; cut but not yet closed by MHD */
    uint64_t n_cut_total;
    int watchdog_started, watchdog_stop;
    pthread_t watchdog;
    size_t mem_used;                  /* bytes reserved against cfg.mem_budget_bytes (atomic) */
    struct tp_http_gate *gate;        /* owned */
    struct tp_web *web;               /* owned: the web page's and /v1/cluster's state (web.c) */
    struct tp_resp_store *resp_store; /* owned: finished Responses for previous_response_id (api_responses.c) */
    int n_bias;                       /* --logit-bias entries (tp_server_config.logit_bias) */
    int32_t *bias_id;                 /* (n_bias) token ids, ascending, distinct (owned) */
    float *bias_val;                  /* (n_bias) -100..100 (owned) */
    struct tp_gen_defaults gen;       /* every field filled: the command line's, else the model's, else the
                                       * engine's; set: the bits requests take (tp_run_apply_defaults) */
    const char *gen_from[7];          /* per TP_GEN_* bit (in bit order): where gen's value comes from
                                       * ("command line", "built-in" (static) or model_gen_source) */
    char model_gen_source[32];        /* the model's recommended settings' file ("" when it has none) */
    char build_info[64];              /* "b<commits>-<commit>" (llama-server's build_info) */
    char fingerprint[24];             /* system_fingerprint: "fp_" + 10 hex of SHA-256(build, model identity) */
    char model_sha[65];               /* the model identity: SHA-256 of the file's size, metadata and sampled
                                       * bytes (props.c), hex */
};

enum MHD_Result tp_http_send(struct tp_server *s, struct MHD_Connection *c, int status, const char *content_type,
                             const char *body, size_t len, const char *extra_name, const char *extra_value);
/* MHD_queue_response plus the server-wide headers (CORS when --cors-origin is set). */
enum MHD_Result tp_http_queue(struct tp_server *s, struct MHD_Connection *c, int status, struct MHD_Response *r);

/* ---- web.c: GET / (the page), GET /v1/cluster, CORS preflights ---- */
/* State for web.c; NULL on out of memory. */
struct tp_web *tp_web_new(void);
void tp_web_free(struct tp_web *w); /* NULL safe */
/* Answers the request when it is web.c's (returns 1, *ret set), else 0.
 * Called with the request line and headers, before the route table. */
int tp_web_route(struct tp_server *s, struct MHD_Connection *c, const char *url, const char *method,
                 enum MHD_Result *ret);
/* GET /v1/cluster's JSON (cluster.c); malloc'd, NULL on out of memory. */
char *tp_cluster_json(struct tp_server *s);
/* Nonzero when origin is '*' or scheme://host[:port] in printable ASCII. */
int tp_web_origin_valid(const char *origin);
/* Nonzero when the request carries the API key (or none is configured). */
int tp_http_check_auth(struct tp_server *s, struct MHD_Connection *c);
enum MHD_Result tp_http_send_json(struct tp_server *s, struct MHD_Connection *c, int status, const char *json);
/* Answer e with the HTTP status, type and header of tp_http_error_kind(e->status); counted and logged. */
enum MHD_Result tp_http_send_error(struct tp_server *s, struct MHD_Connection *c, const struct tp_api_error *e);
/* Write e as a whole HTTP response with "Connection: close" on fd, waiting at
 * most timeout_ms for socket space (0: only what fits now); counted in
 * /metrics and logged.  The caller shuts down and closes the connection. */
void tp_http_refuse_fd(struct tp_server *s, int fd, const struct tp_api_error *e, int timeout_ms);
/* Bind sa, listen, and start the gate thread that hands connections with a
 * complete first header block to s->daemon; sets s->port.  On failure the
 * caller still calls tp_http_gate_stop. */
enum tp_status tp_http_gate_start(struct tp_server *s, const struct sockaddr_in *sa, struct tp_error *err);
/* Stop the gate thread, close the connections still waiting and the listening socket.  Idempotent. */
void tp_http_gate_stop(struct tp_server *s);
/* Nonzero when the client's connection was reset (see http.c). */
int tp_http_client_gone(struct MHD_Connection *c);
/* One line per finished request (text or JSON per --log-format); n_cached: prompt tokens not prefilled. */
void tp_http_log_request(struct tp_server *s, const char *id, const char *path, int status, int n_prompt,
                         int n_cached, int n_gen, double ttft_s, double tps);
/* Encode text[0..len) (NUL is an ordinary byte; special tokens parsed) into *out (malloc'd, caller frees)
 * and *n_out.  Returns TP_OK, or with e filled TP_ERR_INVALID_ARG (cannot be tokenized) or TP_ERR_NOMEM. */
enum tp_status tp_server_tokenize(struct tp_server *s, const char *text, size_t len, int add_bos, int32_t **out,
                                  int *n_out, struct tp_api_error *e);
/* Append s[0..n) with invalid UTF-8 bytes replaced by U+FFFD. */
void tp_srv_utf8_sanitize(const char *s, size_t n, struct tp_buf *out);
/* ---- props.c: GET /props, the generation defaults, system_fingerprint ---- */
/* Fill s->gen and gen_from from s->cfg.gen and the model's recommended settings (engine and model attached). */
void tp_server_gen_init(struct tp_server *s);
/* Fill s->build_info, s->model_sha and s->fingerprint (reads the model file's metadata and a few KiB of its
 * weights, once). */
void tp_server_identity_init(struct tp_server *s);
/* GET /props: llama-server's shape (docs/api.md). */
enum MHD_Result tp_api_props(struct tp_server *s, struct MHD_Connection *c);
/* x as the shortest decimal within 1e-6 (0.95f prints as 0.95, not 0.949999988). */
double tp_srv_num(float x);
/* Parameter count of a model of shape hp (embeddings, attention, feed-forward, experts, norms). */
uint64_t tp_srv_n_params(const struct tp_hparams *hp);

/* POST /v1/completions (chat 0) and /v1/chat/completions (chat 1). */
enum MHD_Result tp_api_handle_completion(struct tp_server *s, struct MHD_Connection *c, int chat, const char *body,
                                         size_t len);

#endif /* TP_SERVER_HTTP_IMPL_H */
