/* tensor.h: the one tensor and dtype vocabulary of DataHelix.
 *
 * A decoded tensor keeps this one struct from the decoder to Python: the pipeline fills it
 * (pipeline.h), the runtime places its bytes in a slab or a frame, the wire carries it with
 * its location (wire.h), the client hands it out in a batch (client.h) and the Python
 * binding exposes its shape and strides to DLPack as they are.
 *
 * Strides count ELEMENTS, as DLPack's do (a row-major T x H x W uint8 tensor has strides
 * {H*W, W, 1}); the buffer protocol and the wire multiply by dh_dtype_size(). Strides are
 * never negative.
 *
 * DH_DTYPE_MAP(XX) is the one dtype table: it generates the enum (whose values are the wire
 * codes, docs/wire-protocol.md), dh_dtype_size(), dh_dtype_name(), the DLPack type and the
 * buffer-protocol format, as DH_ERRNO_MAP generates the error table (error.h).
 */
#ifndef DATAHELIX_TENSOR_H
#define DATAHELIX_TENSOR_H

#include "datahelix/export.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DH_TENSOR_MAX_DIMS 6
/* Bytes of a tensor's name, NUL included: names are at most 31 bytes ("frames", "mask"). */
#define DH_TENSOR_NAME_MAX 32

/* XX(NAME, wire code, name, bytes per element, DLPack type code, DLPack bits, buffer format)
 * DLPack codes: 0 kDLInt, 1 kDLUInt, 2 kDLFloat, 4 kDLBfloat, 6 kDLBool (DLPack 0.8; torch reads
 * it as torch.bool). Format 0: Python's buffer
 * protocol has no character for the type (bfloat16). The wire codes never change. */
#define DH_DTYPE_MAP(XX)                                                                           \
    XX(UINT8, 1, "uint8", 1, 1, 8, 'B')                                                            \
    XX(INT8, 2, "int8", 1, 0, 8, 'b')                                                              \
    XX(UINT16, 3, "uint16", 2, 1, 16, 'H')                                                         \
    XX(INT16, 4, "int16", 2, 0, 16, 'h')                                                           \
    XX(UINT32, 5, "uint32", 4, 1, 32, 'I')                                                         \
    XX(INT32, 6, "int32", 4, 0, 32, 'i')                                                           \
    XX(UINT64, 7, "uint64", 8, 1, 64, 'Q')                                                         \
    XX(INT64, 8, "int64", 8, 0, 64, 'q')                                                           \
    XX(FLOAT16, 9, "float16", 2, 2, 16, 'e')                                                       \
    XX(BFLOAT16, 10, "bfloat16", 2, 4, 16, 0)                                                      \
    XX(FLOAT32, 11, "float32", 4, 2, 32, 'f')                                                      \
    XX(FLOAT64, 12, "float64", 8, 2, 64, 'd')                                                      \
    XX(BOOL, 13, "bool", 1, 6, 8, '?')

typedef enum {
#define DH__DTYPE_ENUM(name, code, str, size, dl_code, dl_bits, fmt) DH_DTYPE_##name = (code),
    DH_DTYPE_MAP(DH__DTYPE_ENUM)
#undef DH__DTYPE_ENUM
} dh_dtype_t;

/* Bytes per element of a dtype, or 0 for a value that is not in the table (a peer's bad
 * code). Any unsigned value may be passed. Thread-safe. */
DH_EXTERN size_t dh_dtype_size(unsigned dtype);

/* "uint8", "float32", ...; "dtype?" for a value not in the table. Static storage. */
DH_EXTERN const char *dh_dtype_name(unsigned dtype);

/* The dtype named `name` ("uint8", "float32", ...: dh_dtype_name's names), or -1 for a name
 * not in the table (or NULL). Thread-safe. */
DH_EXTERN int dh_dtype_from_name(const char *name);

/* The DLPack type of a dtype: returns 1 and fills *code (kDL*) and *bits, or 0 for a value
 * not in the table. Lanes are always 1. */
DH_EXTERN int dh_dtype_dlpack(unsigned dtype, uint8_t *code, uint8_t *bits);

/* The buffer-protocol format character ('B', 'f', ...), or 0 when Python has none (bfloat16)
 * or the value is not in the table. */
DH_EXTERN char dh_dtype_format(unsigned dtype);

/* A dense, named tensor. `data` belongs to whoever holds the struct: the pipeline's samples
 * and batches own it (dh_tensor_clear frees it); a decoded wire tensor borrows it from its
 * payload frame; a client batch's tensors point into the shared-memory arena or a buffer of
 * the batch. */
typedef struct dh_tensor {
    char name[DH_TENSOR_NAME_MAX]; /* "frames", "mask" (video); "sizes", "payload" (synthetic) */
    dh_dtype_t dtype;
    int32_t ndim; /* 0 .. DH_TENSOR_MAX_DIMS */
    int64_t shape[DH_TENSOR_MAX_DIMS];
    int64_t strides[DH_TENSOR_MAX_DIMS]; /* in elements, >= 0 */
    void *data;                          /* NULL when nbytes == 0 (or not resolved yet) */
    size_t nbytes;                       /* product of shape x dh_dtype_size(dtype) */
} dh_tensor_t;

/* Sets the tensor's name (truncated to DH_TENSOR_NAME_MAX - 1 bytes). */
DH_EXTERN void dh_tensor_set_name(dh_tensor_t *tensor, const char *name);

/* Sets row-major (C-contiguous) strides for the tensor's shape and nbytes to the product of
 * the shape and the element size. The caller keeps the shape within size_t. */
DH_EXTERN void dh_tensor_set_contiguous(dh_tensor_t *tensor);

/* Frees data (dh_free: only for a tensor that owns a dh_malloc'd buffer) and zeroes the
 * tensor. Safe on NULL and on a zeroed tensor. */
DH_EXTERN void dh_tensor_clear(dh_tensor_t *tensor);

#ifdef __cplusplus
}
#endif
#endif
