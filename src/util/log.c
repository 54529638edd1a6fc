/* log.c — see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

lilac_log_level lilac_log_threshold = LOG_INFO;

static const char *const NAMES[] = {"error", "warn", "info", "debug"};

int lilac_log_parse(const char *s, lilac_log_level *out) {
    if (!s) return -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, NAMES[i])) {
            *out = (lilac_log_level)i;
            return 0;
        }
    if (!strcmp(s, "warning")) {
        *out = LOG_WARN;
        return 0;
    }
    return -1;
}

const char *lilac_log_name(lilac_log_level lv) { return lv <= LOG_DEBUG ? NAMES[lv] : "?"; }

void lilac_log(lilac_log_level lv, const char *who, const char *fmt, ...) {
    if (!lilac_log_on(lv)) return;
    char line[8192];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    int k = snprintf(line + n, sizeof line - n, ".%03dZ %s %s: ", (int)(tv.tv_usec / 1000), NAMES[lv], who);
    if (k > 0) n += (size_t)k;
    if (n < sizeof line) {
        va_list ap;
        va_start(ap, fmt);
        k = vsnprintf(line + n, sizeof line - n, fmt, ap);
        va_end(ap);
        if (k > 0) n += (size_t)k;
    }
    if (n > sizeof line - 2) n = sizeof line - 2; /* a cut line still ends in a newline */
    /* one line: embedded newlines (from a message) become spaces */
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
    line[n++] = '\n';
    line[n] = 0;
    fputs(line, stderr);
    fflush(stderr);
}
