/* media/media_lib.h: what the rest of the library (the runtime's tasks) uses of the media
 * module beyond include/datahelix/pipeline.h (dh__ prefix, not exported). The pipeline's own
 * internals are in media/pipeline_internal.h, which no other module includes. */
#ifndef DH_MEDIA_LIB_H
#define DH_MEDIA_LIB_H

#include <stdint.h>

#include "datahelix/pipeline.h"

/* A byte range of a file (a tar member read in place, manifest.h): for
 * "subfile,,start,S,end,E,,:FILE" returns FILE with *start = S and *end = E; any other path
 * is returned as it is, with *start = *end = -1. Pure string parsing. */
const char *dh__subfile_range(const char *path, long long *start, long long *end);

/* This thread's decode deadline (dh_clock_now_ns time; 0 = none): FFmpeg's interrupt callback
 * of every container the thread opens from now on says stop past it, so a protocol that
 * waits in FFmpeg's own loop (network reads) gives up by itself (runtime: sample_timeout).
 * A read blocked in the kernel is not interrupted by it. */
void dh__decode_set_deadline(uint64_t deadline_ns);

/* Clears `sample` as dh_sample_clear does, but keeps its frame buffer in `pipeline` for the
 * pipeline's later samples (warm pages: no first-touch page faults for a fresh buffer). For
 * samples `pipeline` decoded; same thread as the pipeline. Safe on a zeroed sample. */
void dh__pipeline_recycle(dh_pipeline_t *pipeline, dh_sample_t *sample);

#endif
