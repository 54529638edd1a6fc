/* cpu_mtp.h — the MTP head on the CPU (cpu_mtp.c) and the hooks cpu_forward.c
 * gives it: the session's scratch, its extra KV slot (kcache[n_layers]) and the
 * decoder layer code of the main model. */
#ifndef LILAC_CPU_MTP_H
#define LILAC_CPU_MTP_H

#include "../backend.h"

/* Rows of one MTP pass; at most cpu_forward.c's CHUNK (the session's scratch). */
#define CPU_MTP_ROWS 256

typedef struct cpu_mtp cpu_mtp; /* a session's MTP state */

extern const lilac_mtp_ops cpu_mtp_ops;
void cpu_mtp_reset(cpu_mtp *st);
/* The session was rewound to pos: committed MTP rows past it are dropped. */
void cpu_mtp_truncate(cpu_mtp *st, int64_t pos);
void cpu_mtp_free(cpu_mtp *st);

/* cpu_forward.c */
cpu_mtp **cpu_session_mtp(lilac_session *s);
const lilac_model *cpu_session_model(const lilac_session *s);
int64_t cpu_session_max_seq(const lilac_session *s);
void cpu_hidden_record(lilac_session *s, float *hidden, int cap);
/* The decoder layer ly (full attention + MoE) over T <= CPU_MTP_ROWS residual rows x [T][hidden], in
 * place, at positions pos.., its KV rows written to the MTP cache slot. */
void cpu_mtp_layer(lilac_session *s, const lilac_layer *ly, float *x, int T, int64_t pos);

#endif
