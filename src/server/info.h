/* info.h — the server-information answers: GET /version and GET /props (the
 * shape of llama.cpp's /props: model path, context, slots, build, chat
 * template, default sampling). */
#ifndef LILAC_INFO_H
#define LILAC_INFO_H

#include "../util/sbuf.h"
#include "server.h"

/* {"version", "build_info", "compiler"} */
void info_version(sbuf *b);
/* b: the model is loaded; n_slots from the engine. */
void info_props(sbuf *b, const srv_options *o, const srv_backend *bk, int n_slots);

#endif
