/* tests/model/test_json_field.c - typed JSON fields (model/json_field.h):
 * absent / null, wrong kind, range and int limits, the value written only on success. */
#include <cjson/cJSON.h>

#include "model/json_field.h"
#include "tp_test.h"

static void test_int_field(void)
{
    cJSON *o = cJSON_Parse("{\"a\":7,\"n\":null,\"f\":2.5,\"s\":\"7\",\"neg\":-3,\"big\":3e9,\"t\":true}");
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    int v = 42;
    CU_ASSERT_EQUAL(tp_json_field_int(o, "a", 0, 10, &v), TP_OK);
    CU_ASSERT_EQUAL(v, 7);
    v = 42;
    CU_ASSERT_EQUAL(tp_json_field_int(o, "missing", 0, 10, &v), TP_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(tp_json_field_int(o, "n", 0, 10, &v), TP_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(tp_json_field_int(o, "f", 0, 10, &v), TP_ERR_FORMAT);
    CU_ASSERT_EQUAL(tp_json_field_int(o, "s", 0, 10, &v), TP_ERR_FORMAT);
    CU_ASSERT_EQUAL(tp_json_field_int(o, "t", 0, 10, &v), TP_ERR_FORMAT);
    CU_ASSERT_EQUAL(tp_json_field_int(o, "a", 8, 10, &v), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(tp_json_field_int(o, "neg", 0, 10, &v), TP_ERR_INVALID_ARG);
    /* a whole number beyond int is out of range even when [lo, hi] allows it */
    CU_ASSERT_EQUAL(tp_json_field_int(o, "big", -1e18, 1e18, &v), TP_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(v, 42); /* untouched by every failure */
    CU_ASSERT_EQUAL(tp_json_field_int(o, "neg", -5, 0, &v), TP_OK);
    CU_ASSERT_EQUAL(v, -3);
    cJSON_Delete(o);
}

static void test_bool_field(void)
{
    cJSON *o = cJSON_Parse("{\"y\":true,\"no\":false,\"n\":null,\"i\":1,\"s\":\"true\"}");
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    int v = 5;
    CU_ASSERT_EQUAL(tp_json_field_bool(o, "y", &v), TP_OK);
    CU_ASSERT_EQUAL(v, 1);
    CU_ASSERT_EQUAL(tp_json_field_bool(o, "no", &v), TP_OK);
    CU_ASSERT_EQUAL(v, 0);
    v = 5;
    CU_ASSERT_EQUAL(tp_json_field_bool(o, "n", &v), TP_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(tp_json_field_bool(o, "missing", &v), TP_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(tp_json_field_bool(o, "i", &v), TP_ERR_FORMAT);
    CU_ASSERT_EQUAL(tp_json_field_bool(o, "s", &v), TP_ERR_FORMAT);
    CU_ASSERT_EQUAL(v, 5);
    cJSON_Delete(o);
}

static const struct tp_test_case json_field_cases[] = {
    {"int_field", test_int_field},
    {"bool_field", test_bool_field},
    {NULL, NULL},
};

TP_TEST_SUITE(json_field, "unit", 30, json_field_cases)
