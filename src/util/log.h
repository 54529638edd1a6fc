/* log.h — leveled log lines on stderr, for the server and the commands that
 * run for a while. A line is written whole (one fputs of a formatted buffer) so
 * lines from connection threads never interleave. */
#ifndef LILAC_LOG_H
#define LILAC_LOG_H

#include <stdbool.h>

typedef enum { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG } lilac_log_level;

/* Lines above this level are dropped (default LOG_INFO). */
extern lilac_log_level lilac_log_threshold;

/* "error" | "warn" | "info" | "debug" (also "warning"): 0, else -1. */
int lilac_log_parse(const char *s, lilac_log_level *out);
const char *lilac_log_name(lilac_log_level lv);
static inline bool lilac_log_on(lilac_log_level lv) { return lv <= lilac_log_threshold; }

/* "<UTC time> <level> <who>: <message>\n", when lv is on. */
void lilac_log(lilac_log_level lv, const char *who, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
