/* export.h: DH_EXTERN marks the public C API.
 *
 * The library is built with -fvisibility=hidden, so only declarations marked DH_EXTERN (the
 * dh_* functions of include/datahelix/) are exported from libdatahelix.so; the dh__
 * internals shared between source files stay inside it. Marking is harmless for a static
 * link and for a program that includes the headers. The lib.exports test
 * (tests/check_exports.cmake) holds the shared library to exactly the DH_EXTERN
 * declarations.
 */
#ifndef DATAHELIX_EXPORT_H
#define DATAHELIX_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define DH_EXTERN __attribute__((visibility("default")))
#else
#define DH_EXTERN
#endif

#endif
