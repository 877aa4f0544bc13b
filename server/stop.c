/*
 * server/stop.c - stop strings matched across token boundaries.
 *
 * The engine appends each token's text to the sequence's text and asks how
 * much may be released to the client.  A stop string may be split over
 * several tokens, so a tail of the text that is a prefix of some stop string
 * is held back until the next token decides it.  The stop string itself is
 * never released.  Text and stop strings are byte strings with lengths (NUL
 * is an ordinary byte).
 */
#include <string.h>

#include "server_impl.h"

size_t tp_stop_scan(const char *text, size_t len, size_t from, char *const *stops, const size_t *stop_lens, int n_stop,
                    int *hit)
{
    *hit = 0;
    if (n_stop <= 0) return len;
    /* 1. a complete occurrence starting at >= from (earliest wins) */
    size_t best = len;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = stop_lens[i];
        if (sl == 0 || sl > len) continue;
        for (size_t p = from; p + sl <= len && p < best; p++)
            if (text[p] == stops[i][0] && memcmp(text + p, stops[i], sl) == 0) {
                best = p;
                break;
            }
    }
    if (best < len) {
        *hit = 1;
        return best;
    }
    /* 2. hold back the longest tail that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = stop_lens[i];
        if (sl == 0) continue;
        size_t maxk = sl - 1 < len ? sl - 1 : len;
        for (size_t k = maxk; k > hold; k--)
            if (memcmp(text + len - k, stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return len - hold;
}
