/*
 * server/tool_parse.c - tool calls in a model's native output format
 * (tool_parse.h describes the formats and the interface).
 *
 * The scan is a small JSON reader that knows where a value ends without
 * building it: strings with escapes, nested objects and arrays, and bare
 * literals / numbers.  A call object is read member by member; "name" is
 * decoded, the arguments member ("arguments", or "parameters" for Llama 3)
 * is located as raw bytes, other members ("id") are skipped.
 */
#include <string.h>

#include "tool_parse.h"

static const char *const format_names[TP_TOOL_FORMAT_COUNT] = {"none", "json", "llama3", "hermes", "mistral",
                                                               "mistral-args", "name-args"};

const char *tp_tool_format_name(enum tp_tool_format f)
{
    return (unsigned)f < TP_TOOL_FORMAT_COUNT ? format_names[f] : "none";
}

const char *tp_tool_marker_token(enum tp_tool_format f)
{
    switch (f) {
    case TP_TOOL_FORMAT_LLAMA3: return "<|python_tag|>";
    case TP_TOOL_FORMAT_HERMES: return "<tool_call>";
    case TP_TOOL_FORMAT_MISTRAL:
    case TP_TOOL_FORMAT_MISTRAL_ARGS: return "[TOOL_CALLS]";
    default: return NULL;
    }
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static size_t skip_ws(const char *t, size_t n, size_t p)
{
    while (p < n && is_ws(t[p])) p++;
    return p;
}

/* Result of reading one piece: complete, the text ended first, or not JSON. */
enum rd { RD_OK = 1, RD_MORE = 0, RD_BAD = -1 };

/* A JSON string starting at t[p] == '"': *end one past the closing quote. */
static enum rd read_string(const char *t, size_t n, size_t p, size_t *end)
{
    if (p >= n) return RD_MORE;
    if (t[p] != '"') return RD_BAD;
    for (size_t i = p + 1; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '\\') {
            i++;
            continue;
        }
        if (c < 0x20) return RD_BAD;
        if (c == '"') {
            *end = i + 1;
            return RD_OK;
        }
    }
    return RD_MORE;
}

/* Any JSON value starting at t[p] (no leading whitespace): *end one past it.
 * A bare literal or number that reaches the end of the text is RD_MORE unless
 * final (it could still grow). */
static enum rd read_value(const char *t, size_t n, size_t p, int final, size_t *end)
{
    if (p >= n) return RD_MORE;
    char c = t[p];
    if (c == '"') return read_string(t, n, p, end);
    if (c == '{' || c == '[') {
        char stack[64];
        int depth = 0;
        for (size_t i = p; i < n; i++) {
            char d = t[i];
            if (d == '"') {
                size_t e;
                enum rd r = read_string(t, n, i, &e);
                if (r != RD_OK) return r;
                i = e - 1;
            } else if (d == '{' || d == '[') {
                if (depth == (int)sizeof stack) return RD_BAD;
                stack[depth++] = d == '{' ? '}' : ']';
            } else if (d == '}' || d == ']') {
                if (depth == 0 || stack[depth - 1] != d) return RD_BAD;
                if (--depth == 0) {
                    *end = i + 1;
                    return RD_OK;
                }
            }
        }
        return RD_MORE;
    }
    if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
        size_t i = p;
        while (i < n && (strchr("+-.eE0123456789", t[i]) || (t[i] >= 'a' && t[i] <= 'z'))) i++;
        if (i == n && !final) return RD_MORE;
        *end = i;
        return RD_OK;
    }
    return RD_BAD;
}

/* Decode the JSON string t[p, e) (quotes included) into out (cap bytes). 0, or -1 when it does not fit. */
static int decode_string(const char *t, size_t p, size_t e, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = p + 1; i + 1 < e; i++) {
        unsigned cp = (unsigned char)t[i];
        if (cp == '\\') {
            char x = t[++i];
            switch (x) {
            case 'n': cp = '\n'; break;
            case 't': cp = '\t'; break;
            case 'r': cp = '\r'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'u':
                cp = 0;
                for (int j = 0; j < 4 && i + 1 < e - 1; j++) {
                    char h = t[++i];
                    cp = cp * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
                }
                break;
            default: cp = (unsigned char)x; break;
            }
            if (cp >= 0x80) { /* as UTF-8 (lone surrogates kept as their 3 bytes) */
                char u[3];
                size_t m = 0;
                if (cp < 0x800) {
                    u[m++] = (char)(0xC0 | (cp >> 6));
                } else {
                    u[m++] = (char)(0xE0 | (cp >> 12));
                    u[m++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                }
                u[m++] = (char)(0x80 | (cp & 0x3F));
                if (k + m >= cap) return -1;
                memcpy(out + k, u, m);
                k += m;
                continue;
            }
        }
        if (k + 1 >= cap) return -1;
        out[k++] = (char)cp;
    }
    out[k] = '\0';
    return 0;
}

/* The arguments value at t[i] into v (its bytes so far; args_done when complete).
 * *end one past it when RD_OK. */
static enum rd read_args(const char *t, size_t n, size_t i, int final, struct tp_tool_call_view *v, size_t *end)
{
    v->args_off = i;
    enum rd r = read_value(t, n, i, final, end);
    if (r == RD_MORE) v->args_len = n - i;
    if (r != RD_OK) return r;
    v->args_len = *end - i;
    v->args_done = 1;
    return RD_OK;
}

/* One call object at t[p] == '{' whose arguments member is named akey.  Fills v;
 * *end one past the closing '}' when RD_OK. */
static enum rd read_call(const char *t, size_t n, size_t p, const char *akey, int final, struct tp_tool_call_view *v,
                         size_t *end)
{
    memset(v, 0, sizeof *v);
    v->call_off = p;
    if (p >= n) return RD_MORE;
    if (t[p] != '{') return RD_BAD;
    size_t i = skip_ws(t, n, p + 1);
    int have_name = 0, have_args = 0;
    for (;;) {
        if (i >= n) return RD_MORE;
        if (t[i] == '}') break;
        size_t ke;
        enum rd r = read_string(t, n, i, &ke);
        if (r != RD_OK) return r;
        size_t kl = ke - i - 2;
        const char *k = t + i + 1;
        i = skip_ws(t, n, ke);
        if (i >= n) return RD_MORE;
        if (t[i] != ':') return RD_BAD;
        i = skip_ws(t, n, i + 1);
        if (i >= n) return RD_MORE;
        size_t ve = 0;
        if (kl == 4 && memcmp(k, "name", 4) == 0) {
            r = read_string(t, n, i, &ve);
            if (r != RD_OK) return r;
            if (decode_string(t, i, ve, v->name, sizeof v->name) != 0) return RD_BAD;
            have_name = 1;
        } else if (kl == strlen(akey) && memcmp(k, akey, kl) == 0) {
            if ((r = read_args(t, n, i, final, v, &ve)) != RD_OK) return r;
            have_args = 1;
        } else {
            r = read_value(t, n, i, final, &ve);
            if (r != RD_OK) return r;
        }
        i = skip_ws(t, n, ve);
        if (i >= n) return RD_MORE;
        if (t[i] == ',') {
            i = skip_ws(t, n, i + 1);
            continue;
        }
        if (t[i] != '}') return RD_BAD;
    }
    if (!have_name || !have_args || !v->name[0]) return RD_BAD;
    v->complete = 1;
    *end = i + 1;
    return RD_OK;
}

/* Length of the longest tail of t[0, n) that is a proper prefix of m (could still grow into m). */
static size_t partial_tail(const char *t, size_t n, const char *m)
{
    size_t ml = strlen(m);
    for (size_t k = ml - 1; k > 0; k--)
        if (k <= n && memcmp(t + n - k, m, k) == 0) return k;
    return 0;
}

static const char *find(const char *t, size_t n, size_t from, const char *m)
{
    size_t ml = strlen(m);
    for (size_t i = from; i + ml <= n; i++)
        if (t[i] == m[0] && memcmp(t + i, m, ml) == 0) return t + i;
    return NULL;
}

int tp_tool_marker_find(enum tp_tool_format f, const char *t, size_t n, size_t from, size_t *json_off)
{
    if (f == TP_TOOL_FORMAT_JSON || f == TP_TOOL_FORMAT_NAME_ARGS) {
        *json_off = 0;
        return from == 0;
    }
    if (f == TP_TOOL_FORMAT_LLAMA3) {
        if (from > 0) return 0;
        size_t i = skip_ws(t, n, 0);
        static const char tag[] = "<|python_tag|>";
        if (n - i >= sizeof tag - 1 && memcmp(t + i, tag, sizeof tag - 1) == 0) {
            *json_off = skip_ws(t, n, i + sizeof tag - 1);
            return 1;
        }
        if (i < n && t[i] == '{') {
            *json_off = i;
            return 1;
        }
        return 0;
    }
    if (f == TP_TOOL_FORMAT_HERMES || f == TP_TOOL_FORMAT_MISTRAL || f == TP_TOOL_FORMAT_MISTRAL_ARGS) {
        const char *m = tp_tool_marker_token(f);
        const char *hit = find(t, n, from, m);
        if (!hit) return 0;
        *json_off = skip_ws(t, n, (size_t)(hit - t) + strlen(m));
        return 1;
    }
    return 0;
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
}

/* One MISTRAL_ARGS call at t[p] (after [TOOL_CALLS]): name, an optional
 * [ARGS], the arguments value.  Fills v; *end one past the arguments. */
static enum rd read_args_call(const char *t, size_t n, size_t p, int final, struct tp_tool_call_view *v, size_t *end)
{
    static const char args[] = "[ARGS]";
    memset(v, 0, sizeof *v);
    v->call_off = p;
    size_t i = p;
    while (i < n && is_name_char(t[i])) i++;
    if (i == n) return RD_MORE;
    if (i == p || i - p >= sizeof v->name) return RD_BAD;
    size_t name_end = i;
    size_t rest = n - i < sizeof args - 1 ? n - i : sizeof args - 1;
    if (memcmp(t + i, args, rest) == 0) {
        if (rest < sizeof args - 1) return RD_MORE;
        i += sizeof args - 1;
    }
    if (i == n) return RD_MORE;
    if (t[i] != '{') return RD_BAD;
    memcpy(v->name, t + p, name_end - p);
    v->name[name_end - p] = '\0';
    enum rd r = read_args(t, n, i, final, v, end);
    v->complete = r == RD_OK;
    return r;
}

/* Calls from t[p] in format f until the text ends or something else follows. */
static void scan_calls(enum tp_tool_format f, const char *t, size_t n, size_t p, int final, struct tp_tool_scan *o)
{
    const char *akey = f == TP_TOOL_FORMAT_LLAMA3 ? "parameters" : "arguments";
    size_t i = skip_ws(t, n, p);
    if (f == TP_TOOL_FORMAT_MISTRAL) {
        if (i >= n) return;
        if (t[i] != '[') {
            o->malformed = 1;
            return;
        }
        i = skip_ws(t, n, i + 1);
    }
    while (o->n_calls < TP_TOOL_MAX_CALLS) {
        if (i >= n) return;
        size_t end = 0;
        enum rd r = f == TP_TOOL_FORMAT_MISTRAL_ARGS || f == TP_TOOL_FORMAT_NAME_ARGS ? read_args_call(t, n, i, final, &o->calls[o->n_calls], &end)
                                                     : read_call(t, n, i, akey, final, &o->calls[o->n_calls], &end);
        if (r == RD_BAD) {
            if (o->n_calls == 0) o->malformed = 1;
            return;
        }
        o->n_calls++;
        if (r == RD_MORE) return;
        i = skip_ws(t, n, end);
        /* what may come between two calls */
        if (f == TP_TOOL_FORMAT_JSON || f == TP_TOOL_FORMAT_NAME_ARGS) return;
        if (f == TP_TOOL_FORMAT_LLAMA3) {
            if (i < n && t[i] == ';') i = skip_ws(t, n, i + 1);
            if (i >= n || t[i] != '{') return;
        } else if (f == TP_TOOL_FORMAT_HERMES) {
            static const char close[] = "</tool_call>", open[] = "<tool_call>";
            if (n - i >= sizeof close - 1 && memcmp(t + i, close, sizeof close - 1) == 0)
                i = skip_ws(t, n, i + sizeof close - 1);
            if (n - i < sizeof open - 1 || memcmp(t + i, open, sizeof open - 1) != 0) return;
            i = skip_ws(t, n, i + sizeof open - 1);
        } else if (f == TP_TOOL_FORMAT_MISTRAL_ARGS) {
            static const char next[] = "[TOOL_CALLS]";
            if (n - i < sizeof next - 1 || memcmp(t + i, next, sizeof next - 1) != 0) return;
            i += sizeof next - 1;
        } else { /* MISTRAL */
            if (i >= n || t[i] != ',') return;
            i = skip_ws(t, n, i + 1);
        }
    }
}

void tp_tool_scan(enum tp_tool_format f, const char *t, size_t n, int final, struct tp_tool_scan *o)
{
    memset(o, 0, sizeof *o);
    o->content_end = n;
    if (f <= TP_TOOL_FORMAT_NONE || f >= TP_TOOL_FORMAT_COUNT) return;
    size_t json_off = 0;
    if (f == TP_TOOL_FORMAT_JSON || f == TP_TOOL_FORMAT_NAME_ARGS) {
        o->content_end = 0;
        o->started = 1;
        scan_calls(f, t, n, 0, final, o);
    } else if (f == TP_TOOL_FORMAT_LLAMA3) {
        if (tp_tool_marker_find(f, t, n, 0, &json_off)) {
            o->content_end = 0;
            o->started = 1;
            scan_calls(f, t, n, json_off, final, o);
        } else if (!final) {
            /* hold back leading whitespace and a partial <|python_tag|> */
            size_t i = skip_ws(t, n, 0);
            static const char tag[] = "<|python_tag|>";
            size_t rest = n - i;
            if (rest < sizeof tag - 1 && memcmp(t + i, tag, rest) == 0) o->content_end = 0;
            else if (rest >= sizeof tag - 1 && memcmp(t + i, tag, sizeof tag - 1) == 0) o->content_end = 0;
        }
    } else {
        const char *m = tp_tool_marker_token(f);
        const char *hit = find(t, n, 0, m);
        if (hit) {
            o->content_end = (size_t)(hit - t);
            o->started = 1;
            scan_calls(f, t, n, o->content_end + strlen(m), final, o);
        } else if (!final) {
            o->content_end = n - partial_tail(t, n, m);
        }
    }
    if (final && o->started) {
        int any = 0;
        for (int k = 0; k < o->n_calls; k++) any |= o->calls[k].complete;
        if (!any) o->malformed = 1;
    }
    if (o->malformed && final) {
        o->content_end = n;
        o->n_calls = 0;
    }
}
