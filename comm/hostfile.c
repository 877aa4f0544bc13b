/*
 * comm/hostfile.c - read and validate the JSON hostfile (format documented
 * in configs/README.md):
 *
 *   {"version": 1, "cluster_token": "optional secret",
 *    "hosts": [{"host": "mac-a", "ips": ["10.0.0.1"], "port": 29500, "rdma": ["rdma_en5"]}, ...]}
 *
 * The entry index is the rank.  A bare top-level array of host objects is
 * accepted too.  Every problem is reported with the file name and the entry.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "comm_impl.h"

#define HOSTFILE_MAX_BYTES (4u << 20)

void tp_hostfile_free(struct tp_hostfile *hf)
{
    if (!hf) return;
    free(hf->hosts);
    hf->hosts = NULL;
    hf->n = 0;
}

static char *read_all(const char *path, struct tp_error *err)
{
    char *buf = NULL;
    struct tp_error rerr = {0};
    enum tp_status rc = tp_read_file(path, HOSTFILE_MAX_BYTES, &buf, NULL, &rerr);
    if (rc == TP_ERR_NOT_FOUND || rc == TP_ERR_IO)
        tp_error_set(err, TP_ERR_NOT_FOUND,
                     "cannot open hostfile '%s' (check TP_HOSTFILE / --hostfile; see configs/README.md)", path);
    else if (rc == TP_ERR_FORMAT)
        tp_error_set(err, TP_ERR_FORMAT, "hostfile '%s' is larger than %u bytes", path, HOSTFILE_MAX_BYTES);
    else if (rc != TP_OK)
        tp_error_set(err, rc, "out of memory reading hostfile '%s'", path);
    return buf;
}

static enum tp_status first_string(const cJSON *arr, const char *key, char *out, size_t cap, const char *path,
                                   int idx, int required, struct tp_error *err)
{
    out[0] = '\0';
    if (!arr) {
        if (!required) return TP_OK;
        return tp_error_set(err, TP_ERR_FORMAT, "hostfile '%s': hosts[%d] has no \"%s\" (want [\"10.0.0.1\", ...])",
                            path, idx, key);
    }
    const cJSON *s = cJSON_IsArray(arr) ? cJSON_GetArrayItem(arr, 0) : arr;
    if (!cJSON_IsString(s) || !s->valuestring[0] || strlen(s->valuestring) >= cap)
        return tp_error_set(err, TP_ERR_FORMAT,
                            "hostfile '%s': hosts[%d].%s must be a non-empty string or array of strings (< %zu chars)",
                            path, idx, key, cap);
    snprintf(out, cap, "%s", s->valuestring);
    return TP_OK;
}

enum tp_status tp_hostfile_load(const char *path, struct tp_hostfile *out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    memset(out, 0, sizeof *out);
    cJSON *root = NULL;
    char *text = read_all(path, err);
    if (!text) return err ? err->status : TP_ERR_IO;
    root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= text ? (long)(at - text) : -1;
        rc = tp_error_set(err, TP_ERR_FORMAT, "hostfile '%s' is not valid JSON (near byte %ld)", path, off);
        goto out;
    }
    const cJSON *hosts = root;
    if (cJSON_IsObject(root)) {
        const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
        if (ver && (!cJSON_IsNumber(ver) || ver->valueint != 1)) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "hostfile '%s': unsupported \"version\" (this build reads 1)", path);
            goto out;
        }
        const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "cluster_token");
        if (tok) {
            if (!cJSON_IsString(tok) || strlen(tok->valuestring) >= sizeof out->token) {
                rc = tp_error_set(err, TP_ERR_FORMAT, "hostfile '%s': \"cluster_token\" must be a string (< %zu chars)",
                                  path, sizeof out->token);
                goto out;
            }
            snprintf(out->token, sizeof out->token, "%s", tok->valuestring);
        }
        hosts = cJSON_GetObjectItemCaseSensitive(root, "hosts");
    }
    if (!cJSON_IsArray(hosts) || cJSON_GetArraySize(hosts) < 1) {
        rc = tp_error_set(err, TP_ERR_FORMAT,
                          "hostfile '%s': want {\"hosts\": [{\"ips\": [...], \"port\": N}, ...]} with at least one entry",
                          path);
        goto out;
    }
    int n = cJSON_GetArraySize(hosts);
    if (n > 4096) {
        rc = tp_error_set(err, TP_ERR_FORMAT, "hostfile '%s': %d hosts (at most 4096)", path, n);
        goto out;
    }
    out->hosts = calloc((size_t)n, sizeof *out->hosts);
    if (!out->hosts) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for %d hostfile entries", n);
        goto out;
    }
    out->n = n;
    for (int i = 0; i < n; i++) {
        const cJSON *h = cJSON_GetArrayItem(hosts, i);
        struct tp_host *d = &out->hosts[i];
        if (!cJSON_IsObject(h)) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "hostfile '%s': hosts[%d] is not an object", path, i);
            goto out;
        }
        TP_CHECK_GOTO(first_string(cJSON_GetObjectItemCaseSensitive(h, "ips"), "ips", d->ip, sizeof d->ip, path, i, 1,
                                   err),
                      rc, out);
        TP_CHECK_GOTO(first_string(cJSON_GetObjectItemCaseSensitive(h, "rdma"), "rdma", d->rdma, sizeof d->rdma, path,
                                   i, 0, err),
                      rc, out);
        const cJSON *port = cJSON_GetObjectItemCaseSensitive(h, "port");
        if (!cJSON_IsNumber(port) || port->valuedouble != (double)port->valueint || port->valueint < 1 ||
            port->valueint > 65535) {
            rc = tp_error_set(err, TP_ERR_FORMAT, "hostfile '%s': hosts[%d].port must be an integer in 1..65535", path,
                              i);
            goto out;
        }
        d->port = port->valueint;
        for (int j = 0; j < i; j++)
            if (out->hosts[j].port == d->port && strcmp(out->hosts[j].ip, d->ip) == 0) {
                rc = tp_error_set(err, TP_ERR_INVALID_ARG,
                                  "hostfile '%s': duplicate address %s:%d for ranks %d and %d (each rank needs its own "
                                  "ip:port)",
                                  path, d->ip, d->port, j, i);
                goto out;
            }
    }
out:
    cJSON_Delete(root);
    free(text);
    if (rc != TP_OK) tp_hostfile_free(out);
    return rc;
}
