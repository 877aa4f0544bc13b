/*
 * server/spec.c - what the HTTP side reports about speculative decoding: a
 * request's usage details.  The drafting and verification live in the
 * scheduler (server/scheduler.c: slot_draft, slot_verify) and the draft
 * sources in server/spec_ngram.c.
 */
#include <cjson/cJSON.h>

#include "server_impl.h"

void tp_usage_add_spec(struct cJSON *usage, const struct tp_req *r)
{
    cJSON *d = cJSON_AddObjectToObject(usage, "completion_tokens_details");
    if (d) {
        cJSON_AddNumberToObject(d, "accepted_prediction_tokens", r->n_accepted);
        cJSON_AddNumberToObject(d, "rejected_prediction_tokens", r->n_drafted - r->n_accepted);
    }
    cJSON *sp = cJSON_AddObjectToObject(usage, "speculative");
    if (!sp) return;
    cJSON_AddStringToObject(sp, "mode", tp_spec_mode_name((enum tp_spec_mode)r->spec_mode));
    cJSON_AddNumberToObject(sp, "drafted", r->n_drafted);
    cJSON_AddNumberToObject(sp, "accepted", r->n_accepted);
    cJSON_AddNumberToObject(sp, "acceptance", r->n_drafted > 0 ? (double)r->n_accepted / r->n_drafted : 0.0);
    cJSON_AddNumberToObject(sp, "steps", r->n_decode_steps);
    cJSON_AddNumberToObject(sp, "tokens_per_step", r->n_decode_steps > 0 ? (double)r->n_toks / r->n_decode_steps : 0.0);
}
