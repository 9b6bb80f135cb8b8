/*
 * engine.h - the background engine thread that runs asynchronous collectives.
 */
#ifndef HPCDL_ENGINE_H
#define HPCDL_ENGINE_H

#include "common.h"

#define HPCDL_PROGRESS_NAMES 4

// What one rank's engine has done, as the stall inspector exchanges it.
typedef struct {
    int64_t submitted, completed;  // operations queued / finished so far
    double waited_s;               // how long the oldest unfinished one has waited; 0 = none
    int32_t stopping;              // this rank is shutting the context down
    int32_t pad;
    char pending[HPCDL_PROGRESS_NAMES][48]; // names of the oldest unfinished operations
} hpcdl_progress;

int hpcdl_engine_start(hpcdl_ctx *ctx);
void hpcdl_engine_progress(hpcdl_ctx *ctx, hpcdl_progress *out);

// A blocking collective on the caller's thread counts for the stall inspector
// as one operation: submitted at begin, named and timed while it runs,
// finished at end. Every rank makes the same calls, so counts stay comparable.
void hpcdl_engine_blocking_begin(hpcdl_ctx *ctx, const char *name);
void hpcdl_engine_blocking_end(hpcdl_ctx *ctx);
void hpcdl_engine_stop(hpcdl_ctx *ctx);

#endif // HPCDL_ENGINE_H
