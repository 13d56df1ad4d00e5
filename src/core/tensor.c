/* tensor.c: the dtype table's functions and the tensor helpers (tensor.h).
 *
 * Every function here is generated from, or reads, DH_DTYPE_MAP: adding a dtype is one line
 * of the table. Pure; depends on nothing but the allocator.
 */
#include <stdio.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/tensor.h"

size_t dh_dtype_size(unsigned dtype)
{
    switch (dtype) {
#define DH__DTYPE_SIZE(name, code, str, size, dl_code, dl_bits, fmt)                               \
    case code:                                                                                     \
        return size;
        DH_DTYPE_MAP(DH__DTYPE_SIZE)
#undef DH__DTYPE_SIZE
    default:
        return 0;
    }
}

const char *dh_dtype_name(unsigned dtype)
{
    switch (dtype) {
#define DH__DTYPE_NAME(name, code, str, size, dl_code, dl_bits, fmt)                               \
    case code:                                                                                     \
        return str;
        DH_DTYPE_MAP(DH__DTYPE_NAME)
#undef DH__DTYPE_NAME
    default:
        return "dtype?";
    }
}

int dh_dtype_from_name(const char *name)
{
    if (!name)
        return -1;
#define DH__DTYPE_FROM_NAME(name_, code, str, size, dl_code, dl_bits, fmt)                         \
    if (strcmp(name, str) == 0)                                                                    \
        return code;
    DH_DTYPE_MAP(DH__DTYPE_FROM_NAME)
#undef DH__DTYPE_FROM_NAME
    return -1;
}

int dh_dtype_dlpack(unsigned dtype, uint8_t *code_out, uint8_t *bits_out)
{
    switch (dtype) {
#define DH__DTYPE_DLPACK(name, code, str, size, dl_code, dl_bits, fmt)                             \
    case code:                                                                                     \
        *code_out = dl_code;                                                                       \
        *bits_out = dl_bits;                                                                       \
        return 1;
        DH_DTYPE_MAP(DH__DTYPE_DLPACK)
#undef DH__DTYPE_DLPACK
    default:
        return 0;
    }
}

char dh_dtype_format(unsigned dtype)
{
    switch (dtype) {
#define DH__DTYPE_FORMAT(name, code, str, size, dl_code, dl_bits, fmt)                             \
    case code:                                                                                     \
        return fmt;
        DH_DTYPE_MAP(DH__DTYPE_FORMAT)
#undef DH__DTYPE_FORMAT
    default:
        return 0;
    }
}

void dh_tensor_set_name(dh_tensor_t *t, const char *name)
{
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
}

void dh_tensor_set_contiguous(dh_tensor_t *t)
{
    int64_t stride = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        t->strides[d] = stride;
        stride *= t->shape[d];
    }
    t->nbytes = (size_t)stride * dh_dtype_size(t->dtype);
}

void dh_tensor_clear(dh_tensor_t *t)
{
    if (!t)
        return;
    dh_free(t->data);
    memset(t, 0, sizeof *t);
}
