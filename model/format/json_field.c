/* model/format/json_field.c - typed JSON object fields (see model/json_field.h). */
#include <limits.h>
#include <math.h>

#include <cjson/cJSON.h>

#include "model/json_field.h"

static const cJSON *field(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

enum tp_status tp_json_field_int(const struct cJSON *obj, const char *key, double lo, double hi, int *out)
{
    const cJSON *v = field(obj, key);
    if (!v) return TP_ERR_NOT_FOUND;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || floor(v->valuedouble) != v->valuedouble)
        return TP_ERR_FORMAT;
    double d = v->valuedouble;
    if (d < lo || d > hi || d < (double)INT_MIN || d > (double)INT_MAX) return TP_ERR_INVALID_ARG;
    *out = (int)d;
    return TP_OK;
}

enum tp_status tp_json_field_bool(const struct cJSON *obj, const char *key, int *out)
{
    const cJSON *v = field(obj, key);
    if (!v) return TP_ERR_NOT_FOUND;
    if (!cJSON_IsBool(v)) return TP_ERR_FORMAT;
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return TP_OK;
}
