/* npy.h — write NumPy .npy v1.0 files (little-endian float32 / int32, C order). */
#ifndef LILAC_NPY_H
#define LILAC_NPY_H
#include "common.h"

/* descr: "<f4" or "<i4". Returns 0 or -1 + err. */
int npy_write(const char *path, const char *descr, const void *data, int ndim, const int64_t *shape, lilac_err *err);
#endif
