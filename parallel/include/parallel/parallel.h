/*
 * parallel/include/parallel/parallel.h - tensor parallelism: sharding plans and the
 * distributed engine that runs one model across the ranks of a comm group.
 *
 * Knows comm/ and model/; nothing of HTTP.  Rank 0 drives: each step it
 * sends every rank one step descriptor (tokens, positions, sequences,
 * cleared sequences, KV copies between sequences); all ranks run the forward pass on their slice with two
 * all_sums per layer; rank 0 gets the logits.  Other ranks sit in
 * tp_parallel_worker_loop() until rank 0 shuts the group down or a peer
 * fails.  A world of size 1 is the plain single-rank engine (no comm).
 *
 * Sections: sharding plan (pure data) - engine.
 */
#ifndef TP_PARALLEL_H
#define TP_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "common/common.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ===================================================== sharding plan ===== */

/*
 * A sharding plan is pure data: tp_parallel_plan() is a deterministic
 * function of (hparams, weight types, world size, shard weights), so every
 * rank computes the same plan on its own and no network is involved.
 *
 *   column-parallel (output dim split): attn_q/k/v, ffn_gate/up, output head
 *   row-parallel (input dim split, then all_sum): attn_output, ffn_down
 *   replicated: norms, token embeddings (and the output head when tied)
 *
 * Attention is split by whole heads.  When world <= n_head_kv the split is by
 * whole KV groups (no KV head on two ranks); otherwise by Q heads, and each
 * rank holds the KV heads covering its Q heads' groups (KV replicated).
 * Row-parallel splits never cut a quantization block: attn_output's columns
 * move in units of whole heads whose width is a block multiple, ffn_down's in
 * multiples of its block (32 for Q4_0/Q8_0, 256 for K-quants); the plan
 * records the granularity and says in `note` when a boundary moved off the
 * ideal proportional split.  Shares follow the weights (largest remainder,
 * ties to the lower rank), every rank gets at least one unit of everything.
 */
#define TP_PLAN_MAX_RANKS 64

/*
 * Mixture of experts (hparams.n_expert > 0): how the experts are shared.
 *   TENSOR: every rank holds every expert's FFN columns [ff_begin, ff_end)
 *           (column slice of gate/up, row slice of down), block-aligned like a
 *           dense FFN; each rank computes every selected expert at 1/N width,
 *           so a decode step's work is balanced whatever the router picks.
 *   EXPERT: every rank holds whole experts [expert_begin, expert_end), as many
 *           as its weight's share (largest remainder, like heads); the router
 *           runs on every rank and a rank adds only its experts' outputs.
 *           No quantization block is ever cut.
 * Both sum the FFN output in the one all_sum a dense FFN uses.  A Qwen2-MoE
 * shared expert is split like a dense FFN in both (columns in ffn_down
 * blocks, by weight; whole on rank 0 when it has fewer blocks than ranks).
 *   AUTO:   TENSOR when every rank's column share lands on block boundaries
 *           exactly as its weight asks; else EXPERT when there are at least
 *           as many experts as ranks; else TENSOR with moved boundaries.  The
 *           plan's note says which and why.
 */
enum tp_moe_split { TP_MOE_SPLIT_AUTO = 0, TP_MOE_SPLIT_TENSOR, TP_MOE_SPLIT_EXPERT, TP_MOE_SPLIT_COUNT };
/* "auto", "tensor", "expert" */
const char *tp_moe_split_name(enum tp_moe_split s);
/* Parse one of those names; TP_ERR_INVALID_ARG (message naming them) otherwise. */
enum tp_status tp_moe_split_parse(const char *text, enum tp_moe_split *out, struct tp_error *err);

/* Weight types per tensor role (layer 0's types stand for every layer). */
struct tp_plan_types {
    enum tp_wtype attn_q, attn_k, attn_v, attn_o;
    enum tp_wtype ffn_gate, ffn_up, ffn_down;
    enum tp_wtype output;     /* ignored when hparams.tied_embeddings */
    enum tp_wtype token_embd;
};
/* All roles of type t (synthetic models, tests). */
struct tp_plan_types tp_plan_types_uniform(enum tp_wtype t);

struct tp_shard_rank_plan {
    struct tp_model_shard shard; /* ranges; all_sum hook left NULL */
    double weight;               /* normalised share (weights sum to 1) */
    uint64_t sharded_bytes;      /* this rank's slices of q/k/v/o/gate/up/down/output */
    uint64_t replicated_bytes;   /* norms, embeddings, biases of replicated parts */
    uint64_t expert_bytes;       /* mixture of experts: of sharded_bytes, this rank's experts (gate, up, down);
                                  * a decoded token reads about n_expert_used / n_expert of them */
};

struct tp_shard_plan {
    int world_size;
    int kv_replicated;   /* some KV head is held by more than one rank */
    int head_unit;       /* Q heads per indivisible unit (KV group and/or O block) */
    int ff_unit;         /* FFN columns per indivisible unit (ffn_down block) */
    int moved;           /* a boundary moved to a block/unit edge (see note) */
    uint64_t total_bytes;      /* weights of the whole model */
    uint64_t replicated_bytes; /* of which held by every rank */
    enum tp_moe_split moe_split; /* TENSOR or EXPERT for a mixture of experts; AUTO (0) for a dense model */
    char note[512];            /* one line on how the plan was made (never empty) */
    struct tp_shard_rank_plan ranks[TP_PLAN_MAX_RANKS]; /* [world_size] */
};

/*
 * Compute the plan.  weights: world_size relative shares (> 0, finite), or
 * NULL for equal shares.  Refuses with TP_ERR_INVALID_ARG / TP_ERR_UNSUPPORTED
 * and a message in err naming the problem and the fix: world size out of
 * [1, TP_PLAN_MAX_RANKS], more ranks than attention units or FFN units, a
 * zero/negative weight, a weight so small that its rank would get nothing,
 * unknown block sizes.  Pure: no I/O, no allocation.
 */
enum tp_status tp_parallel_plan(const struct tp_hparams *hp, const struct tp_plan_types *types, int world_size,
                                const double *weights, struct tp_shard_plan *out, struct tp_error *err);
/* The same with the experts' split chosen (tp_parallel_plan: AUTO; ignored for dense
 * models).  A split that cannot be made (TENSOR: fewer expert-FFN blocks than ranks;
 * EXPERT: fewer experts than ranks) is refused with a message naming the other. */
enum tp_status tp_parallel_plan_moe(const struct tp_hparams *hp, const struct tp_plan_types *types, int world_size,
                                    const double *weights, enum tp_moe_split split, struct tp_shard_plan *out,
                                    struct tp_error *err);

/* Parse "2,1,1" into n_ranks weights (must have exactly that many, each > 0). */
enum tp_status tp_parallel_parse_weights(const char *text, int n_ranks, double *out, struct tp_error *err);

/* One line per rank ("rank 1: q heads [4,8) kv [2,4) ffn [96,192) vocab ..., 1.2 MiB + 0.3 MiB"),
 * written into buf (always NUL-terminated); returns the length it needed. */
size_t tp_shard_plan_describe(const struct tp_shard_plan *plan, char *buf, size_t cap);

/* 64-bit FNV-1a hash of the plan's ranges and world size (consistency checks). */
uint64_t tp_shard_plan_hash(const struct tp_shard_plan *plan);

/*
 * Shard files (`tpserve shard`): cut model_path into `world` GGUF files in
 * out_dir (which must exist), one per rank, named by tp_parallel_shard_name
 * ("<stem>.rank<R>-of-<N>.gguf").  Each holds the source's metadata, the
 * tpserve.shard.* keys (rank, world_size, weights, plan, plan_hash, source)
 * and only that rank's slices of the sharded tensors (whole blocks, never
 * re-quantized); replicated tensors whole.  tp_parallel_init accepts such a
 * file in place of the model and refuses one cut for another rank, world
 * size or --shard-weights, on every rank.
 */
enum tp_status tp_parallel_write_shards(const char *model_path, int world, const char *shard_weights,
                                        const char *out_dir, struct tp_error *err);
/* The same with the experts' split chosen for a mixture-of-experts GGUF (tp_parallel_write_shards:
 * AUTO, the plan's choice; ignored for dense models).  Each file then holds only its rank's experts
 * or its column slice of every expert, and records the split and every rank's expert ranges, so
 * tp_parallel_init runs the files with that split and refuses another --moe-split.  Hugging Face
 * mixture-of-experts directories are refused (TP_ERR_UNSUPPORTED): cut the GGUF. */
enum tp_status tp_parallel_write_shards_moe(const char *model_path, int world, const char *shard_weights,
                                            enum tp_moe_split split, const char *out_dir, struct tp_error *err);
/* File name (no directory) of rank's shard; returns the length needed. */
size_t tp_parallel_shard_name(const char *model_path, int rank, int world, char *buf, size_t cap);

/* Activation dtype on the wire for the per-layer all_sums. */
enum tp_wire_dtype { TP_WIRE_F32 = 0, TP_WIRE_F16, TP_WIRE_BF16, TP_WIRE_Q8, TP_WIRE_COUNT };

/*
 * Communication of one greedy decode step of one token as the engine runs
 * it (tp_parallel_step_greedy, the path `bench gen` and greedy requests
 * take): the step header broadcast from rank 0, 2 n_layer all_sums of n_embd
 * activations in wire dtype dt (q8: an all_gather of the packed blocks), and
 * each rank's (max, id) gathered to rank 0.  Per collective, the cost comm/
 * reports for its algorithm (tp_comm_op_cost) on `rank` and the most any
 * rank sends.  Pure.
 */
struct tp_parallel_coll_cost {
    const char *what;           /* "step header", "all_sum", "argmax gather" */
    int times;                  /* calls per token */
    enum tp_comm_op op;         /* the call: collective, root 0, count elements of dt */
    size_t count;
    enum tp_dtype dt;
    struct tp_comm_cost cost;   /* one call on this rank */
    uint64_t max_bytes_sent;    /* one call, the busiest rank */
};
struct tp_parallel_decode_cost {
    int n;                                /* entries of c */
    struct tp_parallel_coll_cost c[3];
    uint64_t bytes_sent;                  /* this rank, per token: sum of times * bytes */
};
void tp_parallel_decode_cost(int n_layer, int n_embd, enum tp_wire_dtype dt, int world, int rank,
                             struct tp_parallel_decode_cost *out);

/* ================================================= capacity planning ===== */

/*
 * Planning a deployment before wiring machines (`tpserve plan`): does a model
 * of this shape and weight type fit on these nodes, which shard weights to
 * use, how much memory each node needs, what decode speed to expect.  Pure
 * functions (parallel/capacity.c) on top of tp_parallel_plan(): the shares
 * are rounded to whole heads / blocks exactly as the engine would.
 *
 * Memory per node = weights (its slices + replicated parts, from the plan)
 *                 + KV cache (n_ctx * n_seq positions of its KV heads)
 *                 + runtime overhead (fixed + activation scratch).
 * Usable memory   = physical - max(reserve_min_bytes, reserve_frac * physical).
 * Shares are proportional to what each node has left after the parts every
 * node holds anyway (usable - replicated - overhead).
 * Decode time per token = max over nodes (bytes read per token / (bw * eff))
 *                 + communication: the collectives of one greedy decode step
 *                   (tp_parallel_decode_cost: step header broadcast, 2 n_layer
 *                   all_sums of n_embd activations, argmax gather) with the
 *                   algorithm comm/ runs for each size (decode all_sums: one
 *                   mesh round, each rank sending n_embd values to every
 *                   peer), each call = rounds * latency + the busiest rank's
 *                   bytes / link rate; or, given allsum_us (`tpserve bench
 *                   comm` on the same hosts), that measured time per all_sum.
 * It is a first-order model (no compute bound, no overlap): use it to compare
 * set-ups, and `tpserve bench nodes` to measure.
 */
#define TP_CAP_MAX_NODES TP_PLAN_MAX_RANKS

struct tp_cap_node {
    char name[48];        /* "mac1" (or "node0" when not given) */
    uint64_t mem_bytes;   /* physical memory */
    double mem_bw_gbs;    /* peak memory bandwidth, GB/s (1e9 bytes/s) */
};

struct tp_cap_link {
    char name[16];        /* profile name ("tb5", "10gbe", ...) */
    double gbit;          /* link rate, Gbit/s */
    double latency_us;    /* one-way latency of one message, microseconds */
};

/* Known link profiles: tb5 (TCP over a Thunderbolt 5 bridge), tb4, 10gbe, 25gbe,
 * 1gbe, roce100 (RDMA), local (loopback / one host), none (= local).
 * TP_ERR_INVALID_ARG naming the known ones otherwise. */
enum tp_status tp_capacity_link_profile(const char *name, struct tp_cap_link *out, struct tp_error *err);

/* Peak memory bandwidth (GB/s) of a machine class ("m2-ultra", "m4-max",
 * "ddr5-2ch", ...); 0 if unknown.  tp_capacity_classes() lists them. */
double tp_capacity_class_bw(const char *cls);
const char *tp_capacity_classes(void);

/*
 * Parse "mac1:192G,mac2:128G:m2-ultra,64G:400" into nodes: [NAME:]MEM[:BW]
 * with MEM in K/M/G/T (binary: 192G = 192 GiB) and BW a class name or GB/s.
 * Nodes without BW get default_bw_gbs.  At most max nodes.  Errors name the
 * bad item and the expected form.
 */
enum tp_status tp_capacity_parse_nodes(const char *text, double default_bw_gbs, struct tp_cap_node *out, int max,
                                       int *n_out, struct tp_error *err);

struct tp_cap_config {
    struct tp_hparams hp;          /* model shape (arch-specific fields unused) */
    enum tp_wtype wtype;           /* type of every weight matrix */
    int n_ctx;                     /* KV positions per sequence */
    int n_seq;                     /* sequences in the KV cache */
    int n_batch;                   /* prefill chunk (activation scratch) */
    enum tp_kv_type kv_type;       /* KV cache element type (default f16); a sliding-window model
                                    * (hp.sliding_window) keeps min(n_ctx, window + n_batch) positions on its
                                    * windowed layers (all, or per hp.swa_period) */
    double reserve_frac;           /* memory left to the OS: max(frac * mem, min) */
    uint64_t reserve_min_bytes;
    uint64_t overhead_bytes;       /* fixed runtime per node (code, threads, HTTP, buffers) */
    double bw_efficiency;          /* fraction of peak bandwidth a decode step attains */
    struct tp_cap_link link;
    enum tp_moe_split moe_split;   /* mixture of experts (hp.n_expert > 0): the split to plan (AUTO) */
    enum tp_wire_dtype wire_dtype; /* activations on the wire (default f32) */
    double allsum_us;              /* > 0: measured time of one decode all_sum on these hosts (replaces the
                                    * link model for it; its latency sets the round time of the rest) */
    double header_us, gather_us;   /* > 0: measured times of the step header broadcast and of the argmax
                                    * gather (`bench comm --decode`), replacing the model for those */
    int n_nodes;
    struct tp_cap_node nodes[TP_CAP_MAX_NODES];
};
/* n_ctx 4096, n_seq 1, n_batch 512, f16 KV, reserve max(12.5%, 2 GiB),
 * overhead 512 MiB, efficiency 0.7, link "local", no nodes, wtype q4_0. */
struct tp_cap_config tp_capacity_default_config(void);

struct tp_cap_node_result {
    uint64_t usable_bytes;     /* physical minus reserve */
    uint64_t weight_bytes;     /* sharded + replicated weights held */
    uint64_t kv_bytes;         /* KV cache */
    uint64_t overhead_bytes;   /* runtime + scratch */
    uint64_t need_bytes;       /* weight + kv + overhead */
    double share;              /* normalised shard weight */
    int n_q_heads, n_kv_heads, n_ff; /* what the plan gives this node */
    double compute_ms;         /* per decoded token */
    uint64_t read_bytes_per_token; /* weights and KV cache read by this node per decoded token */
    uint64_t wire_bytes_per_token; /* sent by this node per decoded token */
};

struct tp_cap_result {
    int fits;                  /* 1: every node holds its part */
    uint64_t need_bytes;       /* total over nodes */
    uint64_t usable_bytes;     /* total over nodes */
    uint64_t short_bytes;      /* when !fits: what is missing (total, or on the worst node) */
    char reason[512];          /* when !fits: why, by how much, and what to change */
    char shard_weights[256];   /* "3,2,1": pass to `tpserve serve --shard-weights` */
    double compute_ms;         /* slowest node per token */
    double comm_ms;            /* per token */
    double tg_tps;             /* projected decode tokens/s, one sequence */
    uint64_t wire_bytes_per_token; /* per decoded token, by the node that sends most (rank 0) */
    int comm_rounds_per_token;     /* network latencies paid one after another per token */
    int max_ctx;                   /* the longest n_ctx (positions per sequence, n_seq sequences) whose KV
                                    * cache fits next to the weights on every node, at most the trained
                                    * context; 0 when not even the weights fit or no plan was made */
    struct tp_cap_node_result nodes[TP_CAP_MAX_NODES];
    struct tp_shard_plan plan; /* valid when the plan could be made (plan.world_size > 0) */
};

/*
 * Communication ms per decoded token of one sequence over `world` ranks (the
 * model in the comment above; link rate and latency, or allsum_us > 0 a
 * measured decode all_sum); *rounds (may be NULL) gets the network rounds.
 * 0 for one rank.  Pure.
 */
double tp_capacity_comm_ms(const struct tp_hparams *hp, enum tp_wire_dtype dt, int world,
                           const struct tp_cap_link *link, double allsum_us, int *rounds);

/*
 * Plan cfg.  TP_OK with out->fits 0/1 for a valid question (a model that
 * does not fit is an answer, with the reason and the shortfall);
 * TP_ERR_INVALID_ARG with err set for an invalid one (no nodes, bad shape,
 * unknown type).  Pure: no I/O, no allocation.
 */
enum tp_status tp_capacity_plan(const struct tp_cap_config *cfg, struct tp_cap_result *out, struct tp_error *err);

/* ====================================== re-planning after a lost rank ===== */

/*
 * --on-rank-loss replan: when a rank of a group stays gone, can the survivors
 * hold the model between them?  Pure (parallel/capacity.c): the plan over the
 * world - 1 surviving ranks (their shard weights kept, the lost rank's dropped;
 * the same split as before for a mixture of experts), and per survivor the
 * memory it needs (its slices + replicated parts from the plan + its KV cache,
 * n_seq x held KV heads x tp_kv_head_bytes: every layer's positions, sliding-window rings and the cache
 * type's row size counted as tp_model_init allocates them)
 * against what it has:
 *   - its own offer (mem_limit_bytes) when set;
 *   - its machine's usable memory (physical minus max(12.5%, 2 GiB), as
 *     tp_capacity_plan reserves), shared by every survivor with the same host
 *     name and physical memory: their needs together must fit it.
 * Survivors are renumbered in order (rank r > drop becomes r - 1).
 */
struct tp_replan_rank {
    uint64_t mem_total_bytes; /* physical memory of its machine (0: unknown: only mem_limit_bytes counts) */
    uint64_t mem_limit_bytes; /* what it offers the model (0: not set) */
    char host[32];            /* host name (ranks on one machine share its memory) */
};
struct tp_replan_input {
    const struct tp_hparams *hp;
    const struct tp_plan_types *types;
    enum tp_moe_split moe_split; /* the split the group runs (mixture of experts) */
    int world;                   /* ranks of the group that failed, 3..TP_PLAN_MAX_RANKS (2: rank 0 alone) */
    int drop;                    /* its lost rank, 1..world-1 */
    const double *weights;       /* (world) shard weights, or NULL: equal */
    int n_ctx, n_seq, n_batch;   /* KV positions per sequence, sequences, tokens per forward call */
    enum tp_kv_type kv_type;     /* the KV cache's element type */
    int is_shard;                /* the ranks load shard files (cut for this world: cannot re-plan) */
    struct tp_replan_rank ranks[TP_PLAN_MAX_RANKS]; /* (world) indexed by the old rank */
};
struct tp_replan_result {
    int fits;                    /* 1: re-plan; 0: wait for the lost rank (reason says why) */
    char reason[512];            /* fits: what each survivor will hold; else why not, by how much */
    struct tp_shard_plan plan;   /* over world - 1 ranks (valid when plan.world_size > 0) */
    uint64_t need_bytes[TP_PLAN_MAX_RANKS];  /* (world - 1) by new rank: weights + KV cache */
    uint64_t avail_bytes[TP_PLAN_MAX_RANKS]; /* (world - 1) by new rank: its limit, or its share of the machine */
};
/* TP_OK with out->fits 0/1 (a plan that does not fit, or cannot be made, is an
 * answer with its reason); TP_ERR_INVALID_ARG for a malformed question. */
enum tp_status tp_parallel_replan_check(const struct tp_replan_input *in, struct tp_replan_result *out,
                                        struct tp_error *err);

/* ========================================== where a draft model runs ===== */

/*
 * Speculative decoding with a draft model (server/spec.h): the draft runs on
 * rank 0 alone, or sharded over every rank like the model (a second
 * parallel model on the same group: its own slice per rank from
 * tp_parallel_plan, one pair of all_sums per draft layer and drafted
 * position).  Per drafted token (a decode pass reads each weight once):
 *   rank 0:  R0 / bw_0, R0 = the whole draft's read bytes (its matrices, the
 *            norms, the output head; the embedding table only when tied);
 *   sharded: max over ranks of R_r / bw_r  +  (2 L + 2) x allsum_us
 *            (R_r = rank r's slices of the plan + the replicated parts read;
 *            2 L all_sums, the step header broadcast and the argmax gather,
 *            each priced at one decode all_sum).
 * AUTO takes sharded when that is at least 10% faster (the model is first
 * order: no compute bound, no overlap), rank 0 otherwise, and always rank 0
 * in a world of one or when the draft cannot be split over the ranks.
 */
enum tp_draft_placement {
    TP_DRAFT_PLACEMENT_AUTO = 0,
    TP_DRAFT_PLACEMENT_RANK0,
    TP_DRAFT_PLACEMENT_SHARDED,
    TP_DRAFT_PLACEMENT_COUNT
};
/* "auto", "rank0", "sharded" */
const char *tp_draft_placement_name(enum tp_draft_placement pl);
/* Parse one of those names; TP_ERR_INVALID_ARG (message naming them) otherwise. */
enum tp_status tp_draft_placement_parse(const char *text, enum tp_draft_placement *out, struct tp_error *err);

struct tp_draft_place_input {
    const struct tp_hparams *hp;       /* the draft model's shape */
    const struct tp_plan_types *types; /* its weight types */
    int world;                         /* ranks of the group, 1..TP_PLAN_MAX_RANKS */
    const double *weights;             /* (world) the model's shard weights, or NULL: equal */
    enum tp_draft_placement asked;     /* AUTO decides; RANK0 / SHARDED are kept (SHARDED checked) */
    const double *mem_bw_gbs;          /* (world) each rank's memory read bandwidth, GB/s (> 0) */
    double allsum_us;                  /* one decode all_sum of the draft's activations, microseconds (>= 0) */
};
struct tp_draft_place_result {
    enum tp_draft_placement placement; /* RANK0 or SHARDED */
    double rank0_ms;                   /* per drafted token on rank 0 alone */
    double sharded_ms;                 /* per drafted token sharded (0 when it cannot be split) */
    double sharded_comm_ms;            /* of which the collectives */
    int collectives;                   /* per drafted token sharded: 2 n_layer + 2 */
    uint64_t rank0_read_bytes;         /* read per drafted token on rank 0 alone */
    uint64_t rank_read_bytes_max;      /* read per drafted token by the busiest rank, sharded */
    double allsum_us, mem_bw_gbs_min;  /* the figures it used */
    char reason[512];                  /* one line: the decision and why, with both costs */
};
/*
 * Decide where the draft runs (the cost model above).  TP_OK with out filled
 * for every valid question (AUTO falls back to rank 0 with its reason when
 * the draft cannot be split); TP_ERR_INVALID_ARG for a malformed one (world
 * out of range, a bandwidth <= 0) or SHARDED asked for a draft the plan
 * cannot split over world (the message says why and names rank0).  Pure: no
 * I/O, no allocation.
 */
enum tp_status tp_parallel_draft_placement(const struct tp_draft_place_input *in, struct tp_draft_place_result *out,
                                           struct tp_error *err);

/* ============================================================ engine ===== */

struct tp_parallel_config {
    struct tp_model_config model;  /* path, threads, n_ctx, n_seq, n_batch (shard is filled in by the plan);
                                    * "{rank}" in path becomes this rank's number, so one command line can
                                    * give every rank of a launch/mpirun group its own shard file:
                                    * -m dir/model.rank{rank}-of-4.gguf */
    struct tp_comm_config comm;    /* backend, rank, world size ... (world 1: no network) */
    const char *shard_weights;     /* "2,1,1": relative share per rank; NULL: equal */
    enum tp_moe_split moe_split;   /* mixture of experts: how experts are shared (default AUTO) */
    enum tp_wire_dtype wire_dtype; /* default f32 */
    uint64_t mem_limit_bytes;      /* memory this rank offers the model (weights + KV cache) when rank 0
                                    * decides whether a re-plan over fewer ranks fits (tp_parallel_replan_check);
                                    * 0: its machine's usable memory.  Reported to rank 0 with the stats. */
    /* Speculative decoding's draft model (NULL: none).  tp_parallel_init decides where it runs
     * (tp_parallel_draft_placement, the decision in tp_parallel_draft_decision): rank 0 alone (the
     * caller loads it there, e.g. tp_spec_draft_init) or sharded (every rank loads its slice of it
     * next to the model's, same group; tp_parallel_draft_step runs it).  Every rank gives the same. */
    const char *draft_path;
    enum tp_draft_placement draft_placement; /* default AUTO */
    double draft_mem_bw_gbs;       /* > 0: this rank's memory bandwidth for the decision; 0: measured at init */
    double draft_allsum_us;        /* > 0: the time of one all_sum (`tpserve bench comm`); 0: rank 0 times a few
                                    * all_sums of the draft's width at init */
};
/* Defaults: tp_model_default_config(), tp_comm_default_config() then
 * tp_comm_config_from_env() is NOT applied (the caller decides). */
struct tp_parallel_config tp_parallel_default_config(void);

typedef struct tp_parallel tp_parallel_t;

/*
 * Collective over all ranks: form the group, compute the plan, load this
 * rank's slice.  Every rank validates the same things, so a bad combination
 * (wrong shard file, a model that cannot be split as asked) fails on every
 * rank with the same message and nobody hangs.
 */
enum tp_status tp_parallel_init(const struct tp_parallel_config *cfg, tp_parallel_t **out, struct tp_error *err);
/* Rank 0: tells workers to leave (if still connected), then frees. Others: frees. NULL safe. */
void tp_parallel_free(tp_parallel_t *p);
const char *tp_parallel_last_error(const tp_parallel_t *p);

int tp_parallel_rank(const tp_parallel_t *p);
/* The group's size as tp_parallel_get_view() gives it.  Any thread. */
int tp_parallel_size(const tp_parallel_t *p);
/* The world group (NULL in a world of one).  The engine thread only: a
 * re-form (tp_parallel_rejoin / tp_parallel_replan) frees and replaces it;
 * other threads use tp_parallel_silent_rank() / tp_parallel_get_view(). */
const tp_comm_t *tp_parallel_comm(const tp_parallel_t *p);
/*
 * tp_comm_silent_rank() / tp_comm_lost_rank() on the current group, safe
 * against a re-form replacing it (a lock held only while the group pointer
 * is swapped): -1 while no group is formed (a re-form in progress), in a
 * world of one and under mpi.  Any thread.
 */
int tp_parallel_silent_rank(const tp_parallel_t *p, uint32_t silent_ms, uint32_t *silent_for_ms);
int tp_parallel_lost_rank(const tp_parallel_t *p, uint32_t silent_ms, uint32_t *silent_for_ms);
/*
 * What threads other than the engine's may read about the group (/health,
 * /v1/cluster, /metrics): one consistent state, the last group that formed
 * completely (while a re-form or re-plan runs, the group before it; once it
 * succeeded, the new one, its size and plan together).  Copied under the
 * lock of tp_parallel_silent_rank().  Any thread.
 */
struct tp_parallel_view {
    int world;                 /* ranks in the group */
    uint32_t epoch;            /* its epoch (0 in a world of one and under mpi) */
    const char *backend;       /* "ring", "rdma", "mpi", or "local" in a world of one (static) */
    const char *transport;     /* how this rank moves the collectives' data (tp_comm_transport: "tcp", "shm",
                                  "rdma", "mpi"), "none" in a world of one (static) */
    struct tp_shard_plan plan; /* the plan its ranks agreed on */
};
void tp_parallel_get_view(const tp_parallel_t *p, struct tp_parallel_view *out);
tp_model_t *tp_parallel_model(const tp_parallel_t *p);         /* this rank's slice */
tp_tokenizer_t *tp_parallel_tokenizer(const tp_parallel_t *p);
const struct tp_hparams *tp_parallel_hparams(const tp_parallel_t *p);

/*
 * One engine step, rank 0 only.  Every rank first truncates the sequences in
 * clear_seq (cancelled or finished; positions >= clear_from[i], usually 0),
 * then copies, in list order, positions [0, copy_len[i]) of sequence
 * copy_src[i] into sequence copy_dst[i] (prefix sharing between slots,
 * tp_model_kv_copy on every rank's slice), then runs batch.  A copy reads the
 * source as it is after the clears and the earlier copies of the list.
 * n_copy 0 (a zero-initialised step): no copies, exactly the old step.  logits receives n_vocab floats (the FULL vocabulary)
 * per token with batch.logits[i] != 0, in batch order.  Allocates nothing.
 * On a comm failure the engine is poisoned: this and every later call
 * return the error (TP_ERR_PEER / TP_ERR_TIMEOUT / TP_ERR_POISONED).
 */
struct tp_step {
    struct tp_batch batch;
    int n_clear;
    const int32_t *clear_seq;  /* (n_clear) */
    const int32_t *clear_from; /* (n_clear) */
    int n_copy;                /* 0..n_seq; each within [0, n_seq), dst != src, len 0..n_ctx */
    const int32_t *copy_dst;   /* (n_copy) */
    const int32_t *copy_src;   /* (n_copy) */
    const int32_t *copy_len;   /* (n_copy) */
    /* logit_bias, applied by every rank to its slice of the vocabulary right
     * after the forward pass, before the logits gather, the distributed
     * argmax and the distributed top-k (tp_logit_bias_apply): n_bias entries
     * (row, token id, bias), row = index among the tokens with
     * batch.logits != 0, id in [0, n_vocab), bias in [-100, 100] (-100 bans).
     * At most min(n_batch, n_seq x TP_PARALLEL_ROWS_PER_SEQ) x
     * TP_PARALLEL_BIAS_PER_ROW entries per step.  0: none. */
    int n_bias;
    const int32_t *bias_row;   /* (n_bias) */
    const int32_t *bias_id;    /* (n_bias) */
    const float *bias_val;     /* (n_bias) */
    /* Token masks (constrained decoding), applied by every rank to its slice
     * right after logit_bias: row mask_row[m] keeps the tokens whose bit is
     * set in mask[m * W .. (m + 1) * W), W = (n_vocab + 31) / 32 words, bit
     * (id % 32) of word id / 32; the others get -inf.  Each mask allows at
     * least one token.  At most min(n_batch, n_seq x TP_PARALLEL_ROWS_PER_SEQ)
     * rows; 0: none. */
    int n_mask;
    const int32_t *mask_row;   /* (n_mask) */
    const uint32_t *mask;      /* (n_mask x W) */
};
#define TP_PARALLEL_BIAS_PER_ROW 1024
/* Logits rows per sequence slot a step may bias or mask: a speculative
 * verification asks for 1 + (up to 16 drafted tokens) rows of one sequence,
 * each with its own mask and the request's logit_bias (see
 * docs/speculative.md).  Rows past the first of a sequence are positions
 * that follow each other: the batch feeds (last token, drafts) at
 * consecutive positions, the attention among them is causal as in a
 * prefill chunk, and a clear of the next step (clear_from = first rejected
 * position) drops the rejected positions' K/V. */
#define TP_PARALLEL_ROWS_PER_SEQ 17
enum tp_status tp_parallel_step(tp_parallel_t *p, const struct tp_step *step, float *logits);

/*
 * Rank 0: like tp_parallel_step, but for greedy decoding: instead of
 * gathering whole logits rows, each rank sends only the (max, index) of its
 * vocabulary range per row; ids[i] / max_logit[i] (either may be NULL) get
 * the argmax over the full vocabulary of the i-th row with batch.logits != 0
 * (the lowest id on ties, same as a scan of the full row).
 */
enum tp_status tp_parallel_step_greedy(tp_parallel_t *p, const struct tp_step *step, int32_t *ids,
                                       float *max_logit);

/*
 * Rank 0: distributed top-k for samplers that only need the best k tokens
 * (top-k / top-p / min-p within k, logprobs): each rank sends per row its k
 * best (logit, id) and (max, sum of exp) of its vocabulary range instead of
 * the range itself.  top (n_out x k) gets the k highest logits of each row
 * over the full vocabulary, highest first (lower id first on ties); lse
 * (n_out, may be NULL) the row's log-sum-exp, so logprob = logit - lse.
 * k in [1, TP_PARALLEL_TOPK_MAX].
 */
#define TP_PARALLEL_TOPK_MAX 64
struct tp_parallel_cand {
    int32_t id;
    float logit;
};
enum tp_status tp_parallel_step_topk(tp_parallel_t *p, const struct tp_step *step, int k,
                                     struct tp_parallel_cand *top, float *lse);

/* Rank 0: a no-op step that proves every rank is alive (for /health when idle).
 * Rank 0 also pings on its own (a keepalive thread) whenever no step ran for a
 * quarter of the comm op timeout, so idle workers never time out; steps,
 * pings and the keepalive are serialized by a mutex inside the engine. */
enum tp_status tp_parallel_ping(tp_parallel_t *p);

/* Ranks > 0: run steps sent by rank 0 until it shuts down (TP_OK) or fails. */
enum tp_status tp_parallel_worker_loop(tp_parallel_t *p);

/* Nonzero after a failure: the group cannot be used any more (until rejoined). */
int tp_parallel_is_poisoned(const tp_parallel_t *p);

/*
 * Re-form the group after a rank was lost (ring/rdma), keeping this rank's
 * loaded slice.  Collective over the NEW group: rank 0 leaves the old group
 * (closing its links, so every survivor's next call fails at once), listens
 * again and runs a new group epoch (tp_comm_config.epoch, authenticated in
 * the handshake, so a rank of the old epoch cannot join); a surviving worker
 * joins with epoch 0 (whatever rank 0 runs now); a replacement process
 * joins with a plain tp_parallel_init.  Every rank then runs the same
 * agreement as tp_parallel_init (plan hash: the state check; load sync
 * while a replacement loads; load verdict), so a rank with another model,
 * plan or config is refused with the usual message.  Waits at most
 * connect_timeout_ms (0: the configured one) for the group to form.  On
 * success the engine is usable again (not poisoned); its KV caches keep
 * stale contents, so the caller must clear every sequence before reuse.
 * On failure the engine stays poisoned and the call may be retried.
 * TP_ERR_UNSUPPORTED for the mpi backend and a world of one.
 * Threads: the engine thread only; no other thread may use the group (or
 * tp_parallel_comm()) meanwhile; tp_parallel_silent_rank(),
 * tp_parallel_get_view() and tp_parallel_size() stay safe.
 */
enum tp_status tp_parallel_rejoin(tp_parallel_t *p, uint32_t connect_timeout_ms);
/*
 * Rank 0 only: would the group fit without its rank `drop`?  tp_parallel_replan_check
 * on this engine's model, plan and config and every rank's memory as last reported
 * (tp_parallel_get_rank_stats).  Engine thread.
 */
enum tp_status tp_parallel_replan_query(tp_parallel_t *p, int drop, struct tp_replan_result *out);
/*
 * Rank 0 only, after the group failed (ring backend): re-form it WITHOUT its rank
 * `drop` (1..world-1).  Like tp_parallel_rejoin, in a new epoch, but the survivors
 * (workers in tp_parallel_rejoin) are renumbered in order (tp_comm_config.drop_rank),
 * every rank re-plans over world - 1 ranks (the shard weights of the others kept),
 * agrees on the new plan, frees its slice and loads its new one (tp_model_reload;
 * load-sync rounds meanwhile) and agrees on the load.  A group of 2 becomes rank 0
 * alone (no network).  The lost rank, if it comes back, is refused (restart the job to
 * bring it back).  On success the engine serves with world - 1 ranks
 * (tp_parallel_size); its KV caches are empty.  On failure before the group formed
 * the engine stays poisoned and the call may be retried (or tp_parallel_rejoin);
 * once the smaller group formed, a failure is final: TP_ERR_UNSUPPORTED from then on.
 * TP_ERR_UNSUPPORTED too for shard files, the mpi / rdma backends and world < 2.
 * Threads: the engine thread only.
 */
enum tp_status tp_parallel_replan(tp_parallel_t *p, int drop, uint32_t connect_timeout_ms);
/* What a rejoin in progress is doing: 0 none, 1 forming the group (waiting
 * for ranks), 2 the group formed and a rank is loading its slice.  Any thread. */
int tp_parallel_rejoin_phase(const tp_parallel_t *p);
/* The current group epoch (0 in a world of one or under mpi), as tp_parallel_get_view()
 * gives it.  Any thread. */
uint32_t tp_parallel_epoch(const tp_parallel_t *p);

struct tp_parallel_stats {
    uint64_t n_steps;
    uint64_t n_tokens;
    uint64_t ns_compute;   /* forward pass minus communication */
    uint64_t ns_comm;      /* all_sums, step broadcast, logits gather */
    uint64_t bytes_sent;   /* by this rank */
    /* what this rank holds, set at load (rss_bytes: when the counters were taken) */
    uint64_t weight_bytes;    /* its slice of the weights (tp_model_weight_bytes) */
    uint64_t kv_bytes;        /* its KV cache (tp_model_kv_bytes) */
    uint64_t rss_bytes;       /* resident set of its process */
    uint64_t mem_total_bytes; /* physical memory of its machine */
    uint64_t mem_limit_bytes; /* what it offers the model (tp_parallel_config.mem_limit_bytes); 0: not set */
    char host[32];            /* its host name (gethostname, cut to 31 bytes) */
};
void tp_parallel_get_stats(const tp_parallel_t *p, struct tp_parallel_stats *out);
/*
 * Rank 0: every rank's counters.  out[r] for r < min(world, max); rank 0's
 * entry is live, the others' are as last collected: rank 0 asks the workers
 * for them with a step (at most once a second while steps run) and with
 * every ping (the idle keepalive, /health), so they lag by about a second
 * while busy.  On other ranks only their own entry is filled (others zero).
 * Returns the world size.
 */
int tp_parallel_get_rank_stats(const tp_parallel_t *p, struct tp_parallel_stats *out, int max);

/*
 * A caller-defined action every rank runs at the same moment between steps
 * (benchmarks: a memory-bandwidth probe of each rank's own machine while
 * the others probe theirs, as they all read weights at once in a step).
 * Each rank registers its hook before it runs steps or the worker loop
 * (tp_parallel_set_hook, not thread safe against a running step); rank 0
 * calls tp_parallel_run_hook(p, arg, values, max): every rank, rank 0
 * included, calls hook(ud, arg, out) on its engine thread and rank 0 gets
 * each rank's TP_PARALLEL_HOOK_VALUES doubles in values[r *
 * TP_PARALLEL_HOOK_VALUES ...] for r < min(world, max).  A rank without a
 * hook, or whose hook fails, reports NaN; a failing hook does not stop the
 * engine.  Comm failures poison it as a step's would.
 */
#define TP_PARALLEL_HOOK_VALUES 4
typedef enum tp_status (*tp_parallel_hook_fn)(void *ud, int32_t arg, double out[TP_PARALLEL_HOOK_VALUES]);
void tp_parallel_set_hook(tp_parallel_t *p, tp_parallel_hook_fn fn, void *ud);
enum tp_status tp_parallel_run_hook(tp_parallel_t *p, int32_t arg, double *values, int max);

/*
 * The draft model's placement as decided at init (NULL when the config named no draft model): the same
 * on every rank.  Valid until tp_parallel_free.
 */
const struct tp_draft_place_result *tp_parallel_draft_decision(const tp_parallel_t *p);
/* This rank's slice of a sharded draft model (NULL unless the decision is SHARDED). */
tp_model_t *tp_parallel_draft_model(const tp_parallel_t *p);
/*
 * Rank 0, a sharded draft model: one greedy step of the DRAFT model on every rank (the step header
 * says which model steps).  Every rank first truncates the draft's sequences in clear_seq (positions
 * >= clear_from[i]; the draft's KV cache, not the model's), then runs batch on its draft slice
 * (2 all_sums per draft layer); ids[i] gets the argmax over the full vocabulary of the i-th row with
 * batch.logits != 0 (lowest id on ties).  step->n_copy, n_bias and n_mask must be 0; at most
 * tp_parallel_draft_batch() tokens.  Failures as tp_parallel_step (a comm failure poisons the
 * engine).  TP_ERR_INVALID_ARG without a sharded draft.
 */
enum tp_status tp_parallel_draft_step(tp_parallel_t *p, const struct tp_step *step, int32_t *ids);
/* Tokens one draft step takes (0 without a sharded draft). */
int tp_parallel_draft_batch(const tp_parallel_t *p);

/* This rank's model path ("{rank}" expanded); valid until tp_parallel_free. */
const char *tp_parallel_model_path(const tp_parallel_t *p);

/* The plan every rank agreed on (valid until tp_parallel_free).  The engine thread's (a re-plan
 * rewrites it); other threads read tp_parallel_get_view(). */
const struct tp_shard_plan *tp_parallel_get_plan(const tp_parallel_t *p);
enum tp_wire_dtype tp_parallel_wire_dtype(const tp_parallel_t *p);
/* The group's comm backend ("ring", "rdma", "mpi"), or "local" in a world of one (static).  Any thread. */
const char *tp_parallel_backend_name(const tp_parallel_t *p);
/* "f32" | "f16" | "bf16" | "q8" <-> enum; parse gives TP_ERR_INVALID_ARG otherwise. */
const char *tp_wire_dtype_name(enum tp_wire_dtype dt);
enum tp_status tp_wire_dtype_parse(const char *s, enum tp_wire_dtype *out);

#ifdef __cplusplus
}
#endif
#endif /* TP_PARALLEL_H */
