/*
 * server/server.h - the OpenAI-compatible HTTP API served by rank 0.
 *
 * HTTP threads (libmicrohttpd) parse and validate requests and hand them to
 * the engine thread, which batches all active sequences into steps of the
 * distributed engine (parallel/).  (The server issue fills this header in.)
 */
#ifndef TP_SERVER_H
#define TP_SERVER_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* TP_SERVER_H */
