/*
 * engine.h - the background engine thread that runs asynchronous collectives.
 */
#ifndef HPCDL_ENGINE_H
#define HPCDL_ENGINE_H

#include "common.h"

int hpcdl_engine_start(hpcdl_ctx *ctx);
void hpcdl_engine_stop(hpcdl_ctx *ctx);

#endif // HPCDL_ENGINE_H
