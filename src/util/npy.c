/* npy.c — see npy.h. Format: magic "\x93NUMPY", version 1.0, u16 header length,
 * a Python dict literal padded with spaces to a multiple of 64 bytes, '\n'. */
#include "npy.h"

#include <errno.h>
#include <stdio.h>

int npy_write(const char *path, const char *descr, const void *data, int ndim, const int64_t *shape, lilac_err *err) {
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
        count *= (size_t)shape[i];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return lilac_fail(err, "%s: %s", path, strerror(errno));
    uint16_t hlen = (uint16_t)(n + pad + 1);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t wrote = fwrite(data, 4, count, f);
    if (fclose(f) != 0 || wrote != count) return lilac_fail(err, "%s: write failed", path);
    return 0;
}
