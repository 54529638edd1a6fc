/* json_brief.c — see json_brief.h. */
#include "json_brief.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void json_brief(const json_t *v, char *buf, size_t cap) {
    if (!v) {
        snprintf(buf, cap, "nothing (field absent)");
        return;
    }
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) {
        snprintf(buf, cap, "(unprintable)");
        return;
    }
    if (strlen(s) > 48)
        snprintf(buf, cap, "%.45s...", s);
    else
        snprintf(buf, cap, "%s", s);
    free(s);
}
