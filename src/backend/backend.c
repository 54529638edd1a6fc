/* backend.c — pick a backend by name. */
#include "backend.h"

const lilac_backend *lilac_backend_get(const char *name, lilac_err *err) {
    if (!name || !strcmp(name, "auto") || !strcmp(name, "cpu")) return &lilac_backend_cpu;
    lilac_fail(err, "unknown backend \"%s\" (available: cpu)", name);
    return NULL;
}
