/* codec_internal.h: what the wire codec's two files share (codec.c: the messages, each
 * described once; codec_values.c: the values they are made of): the writer, the
 * bounds-checked reader, and one write and one checked read per kind of value. Private to
 * src/wire/ (docs/wire-protocol.md, docs/conventions.md "Names").
 */
#ifndef DH_WIRE_CODEC_INTERNAL_H
#define DH_WIRE_CODEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "datahelix/wire.h"

/* ---- the writer ---- */

/* Writes into p, or only counts when p is NULL (the sizing pass). */
typedef struct dh__wire_writer {
    uint8_t *p;
    size_t len;
    bool too_big; /* a string longer than UINT32_MAX */
} dh__wire_writer_t;

/* n bytes of src. */
void dh__wire_put_bytes(dh__wire_writer_t *w, const void *src, size_t n);
/* The low nbytes of v, little-endian. */
void dh__wire_put_u64(dh__wire_writer_t *w, uint64_t v, int nbytes);

#define dh__wire_put_u8(w, v) dh__wire_put_u64(w, (uint8_t)(v), 1)
#define dh__wire_put_u32(w, v) dh__wire_put_u64(w, (uint32_t)(v), 4)
#define dh__wire_put_i32(w, v) dh__wire_put_u64(w, (uint32_t)(int32_t)(v), 4)
#define dh__wire_put_i64(w, v) dh__wire_put_u64(w, (uint64_t)(int64_t)(v), 8)
#define dh__wire_put_u64_8(w, v) dh__wire_put_u64(w, v, 8) /* the U64 kind */

/* v's IEEE 754 bits, as a u64. */
void dh__wire_put_f64(dh__wire_writer_t *w, double v);
/* A u32 length and the bytes of s (NULL encodes as ""); sets too_big past UINT32_MAX. */
void dh__wire_put_str(dh__wire_writer_t *w, const char *s);
/* One DELIVER tensor: name, dtype, ndim, location, shape, strides in bytes, the handle. */
void dh__wire_put_tensor(dh__wire_writer_t *w, const dh_wire_tensor_t *wt);

/* ---- the reader ---- */

typedef struct dh__wire_reader {
    const uint8_t *p;
    size_t len, pos;
    const char *type;                /* message type name, for messages */
    const char *elem;                /* array being read ("samples"), or NULL */
    uint32_t index;                  /* element of it */
    const dh_wire_frame_t *payloads; /* the message's payload frames (DELIVER) */
    size_t n_payloads, frame;        /* how many; the next one a FRAME tensor takes */
} dh__wire_reader_t;

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

/* Each reads one value named `field` at r->pos and advances past it; 0, or DH_EPARSE with a
 * message naming the message type, the field (elem[index].field in an array) and its offset
 * ("truncated", a value out of its range). */

/* An unsigned little-endian integer of nbytes. */
int dh__wire_get_uint(dh__wire_reader_t *r, const char *field, int nbytes, uint64_t *out);
int dh__wire_get_u8(dh__wire_reader_t *r, const char *field, uint8_t *out);
int dh__wire_get_u32(dh__wire_reader_t *r, const char *field, uint32_t *out);
int dh__wire_get_u64(dh__wire_reader_t *r, const char *field, uint64_t *out);
int dh__wire_get_i64(dh__wire_reader_t *r, const char *field, int64_t *out);
/* A double, finite and >= 0 (seconds, bytes per second, a speed factor). */
int dh__wire_get_f64(dh__wire_reader_t *r, const char *field, double *out);
/* A double, finite, of any sign (a feature of a user's feature function). */
int dh__wire_get_finite(dh__wire_reader_t *r, const char *field, double *out);
/* The checked integers: a dh_rb_kind_t, a dh_wire_role_t, 0 or 1, 0 or a negative DH_E*
 * code, a negative DH_E* code, a token count >= 0. */
int dh__wire_get_rbkind(dh__wire_reader_t *r, const char *field, uint8_t *out);
int dh__wire_get_role(dh__wire_reader_t *r, const char *field, uint8_t *out);
int dh__wire_get_flag(dh__wire_reader_t *r, const char *field, uint8_t *out);
int dh__wire_get_status(dh__wire_reader_t *r, const char *field, int32_t *out);
int dh__wire_get_errcode(dh__wire_reader_t *r, const char *field, int32_t *out);
int dh__wire_get_tokens(dh__wire_reader_t *r, const char *field, int64_t *out);
/* A u32-length-prefixed string without NUL, copied out NUL-terminated (the caller's,
 * dh_free); DH_ENOMEM too. */
int dh__wire_get_str(dh__wire_reader_t *r, const char *field, char **out);
/* An array's count (count_field), refused when the bytes left cannot hold that many elements
 * of at least min_size bytes, and a zeroed allocation of that many elements of `size` bytes
 * (NULL for 0; the caller's). *n is set once *out holds them. DH_ENOMEM too. */
int dh__wire_get_array(dh__wire_reader_t *r, const char *count_field, const char *field,
                       size_t min_size, size_t size, uint32_t *n, void **out);

/* A TENSORS element's smallest encoding: name, dtype, ndim, location. */
#define DH__WIRE_MIN_FRAME_TENSOR (4 + 3)
/* A TENSORS element: the tensor, its shape and strides checked against its bytes, and for a
 * FRAME one the message's next payload frame, which must hold exactly its bytes (the data is
 * borrowed from it). */
int dh__wire_get_frame_tensor(dh__wire_reader_t *r, dh_wire_tensor_t *t);
/* After the tensors: every payload frame was taken by one. */
int dh__wire_all_frames_taken(const dh__wire_reader_t *r);

#endif
