/*
 * server/think.c - the reasoning of <think> models (Qwen3, QwQ: the qwen3 chat
 * family) split from their answer, the way llama.cpp and vLLM return it: a reply
 * "<think>\nREASONING</think>\n\nANSWER" becomes reasoning_content "REASONING"
 * and content "ANSWER".  Leading newlines of the reasoning and leading
 * whitespace of the answer are dropped (the template writes them back when the
 * turn returns in the history).  A reply that does not open with <think> is all
 * content.  Stateless over the reply so far, so that a stream's deltas add up to
 * the finished reply's fields: text that may still become a tag is held back
 * until it is decided or the reply ends.
 */
#include <string.h>

#include "server_impl.h"

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Length of the longest suffix of s[0,n) that is a proper prefix of tag. */
static size_t partial_suffix(const char *s, size_t n, const char *tag)
{
    size_t tl = strlen(tag);
    for (size_t k = tl - 1; k > 0; k--)
        if (k <= n && memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

void tp_think_split(const char *text, size_t len, int done, struct tp_think_parts *p)
{
    memset(p, 0, sizeof *p);
    size_t i = 0;
    while (i < len && is_ws(text[i])) i++;
    size_t rest = len - i, ol = sizeof OPEN - 1;
    if (rest < ol && memcmp(text + i, OPEN, rest) == 0 && !done) {
        /* undecided: nothing yet */
        p->content_b = p->content_e = 0;
        return;
    }
    if (rest < ol || memcmp(text + i, OPEN, ol) != 0) {
        p->content_b = 0;
        p->content_e = len;
        return;
    }
    p->thinking = 1;
    size_t rb = i + ol;
    while (rb < len && text[rb] == '\n') rb++;
    p->reasoning_b = rb;
    const char *close = NULL;
    for (size_t k = rb; k + (sizeof CLOSE - 1) <= len; k++)
        if (memcmp(text + k, CLOSE, sizeof CLOSE - 1) == 0) {
            close = text + k;
            break;
        }
    if (!close) {
        p->reasoning_e = done ? len : len - partial_suffix(text + rb, len - rb, CLOSE);
        if (p->reasoning_e < rb) p->reasoning_e = rb;
        p->content_b = p->content_e = len;
        return;
    }
    p->closed = 1;
    p->reasoning_e = (size_t)(close - text);
    size_t cb = p->reasoning_e + sizeof CLOSE - 1;
    while (cb < len && is_ws(text[cb])) cb++;
    p->content_b = cb;
    p->content_e = len;
}
