/*
 * model/json_field.h - typed fields of a parsed JSON object (cJSON), one rule
 * for every JSON reader (Hugging Face config.json, model shapes, API
 * requests): a key that is absent or JSON null is TP_ERR_NOT_FOUND, a value
 * of the wrong kind TP_ERR_FORMAT, and *out is written only on TP_OK.  No
 * error text: each caller names the field in its own terms.
 */
#ifndef TP_MODEL_JSON_FIELD_H
#define TP_MODEL_JSON_FIELD_H

#include "common/common.h"

struct cJSON;

/* obj[key] as an int.  TP_ERR_FORMAT: not a finite whole number;
 * TP_ERR_INVALID_ARG: a whole number outside [lo, hi] or outside int's range. */
enum tp_status tp_json_field_int(const struct cJSON *obj, const char *key, double lo, double hi, int *out);
/* obj[key] as 0 / 1.  TP_ERR_FORMAT: not true or false. */
enum tp_status tp_json_field_bool(const struct cJSON *obj, const char *key, int *out);

#endif /* TP_MODEL_JSON_FIELD_H */
