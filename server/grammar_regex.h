/*
 * server/grammar_regex.h - private to server/grammar*.c: a string schema's
 * `pattern` and `format` compiled into a DFA over the characters of the
 * string, with its minLength / maxLength folded in, trimmed to the states
 * that can still reach a match (no dead ends) and with the bytes of the
 * shortest completion from every state (the closing cost).
 *
 * The alphabet is the characters the server generates in such a string:
 * printable ASCII other than '"' and '\' (no escape sequences are written),
 * one symbol per byte, and TP_RX_OTHER for any non-ASCII character of the
 * generated set (tp_rx_lead: U+00C0-U+07FF and U+4000-U+CFFF, none of them
 * whitespace or a line terminator, all one UTF-16 unit).  A pattern has no
 * non-ASCII literals, so every character class holds either all of those
 * characters or none of them.  docs/structured-output.md lists the syntax.
 */
#ifndef TP_SERVER_GRAMMAR_REGEX_H
#define TP_SERVER_GRAMMAR_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define TP_RX_OTHER 128 /* the symbol of a generated non-ASCII character */
#define TP_RX_SYMS 129
#define TP_RX_DEAD 0xFFFFu

struct tp_rx {
    int n_states;            /* state 0 is the start; every state can reach an accepting one */
    int n_cls;               /* symbol classes (symbols no pattern tells apart) */
    uint8_t cls[TP_RX_SYMS]; /* symbol -> class */
    uint16_t *next;          /* (n_states, n_cls): the next state, or TP_RX_DEAD; owned */
    uint8_t *accept;         /* (n_states); owned */
    int32_t *dist;           /* (n_states): bytes of the shortest completion to an accepting state; owned */
};

/*
 * Compile pattern (ECMA-262 subset, NULL: none) and format (NULL: none)
 * intersected, with min_chars (>= 0) and max_chars (-1: none) characters.
 * Returns 0; -1 with err naming the unsupported construct or saying that no
 * string the server can generate matches; -2 out of memory (err set too).
 */
int tp_rx_compile(const char *pattern, const char *format, int min_chars, int max_chars, struct tp_rx *out,
                  char *err, size_t err_cap);
void tp_rx_free(struct tp_rx *rx); /* the arrays; rx itself is the caller's */

static inline unsigned tp_rx_step(const struct tp_rx *rx, unsigned q, int sym)
{
    return rx->next[(size_t)q * (size_t)rx->n_cls + rx->cls[sym]];
}

/* Continuation bytes after lead byte c of a generated non-ASCII character
 * (C3-DF: 1, E4-EC: 2), or 0 when c starts none. */
static inline int tp_rx_lead(int c)
{
    if (c >= 0xC3 && c <= 0xDF) return 1;
    if (c >= 0xE4 && c <= 0xEC) return 2;
    return 0;
}

#endif
