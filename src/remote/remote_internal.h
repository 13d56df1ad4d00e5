/* remote/remote_internal.h: what the files of src/remote share and no other module uses. */
#ifndef DH_REMOTE_INTERNAL_H
#define DH_REMOTE_INTERNAL_H

#include <stdint.h>

#include "remote/remote_lib.h"

/* Adds n to the process-wide count of bytes remote files handed their readers
 * (dh__remote_stats_t.bytes_read; http.c keeps the counters). */
void dh__remote_count_read(uint64_t n);

/* Bytes this file handed its reader, and bytes its fetches received (reader.c; for tests). */
uint64_t dh__remote_file_bytes_read(const dh__remote_file_t *f);
uint64_t dh__remote_file_bytes_fetched(const dh__remote_file_t *f);

/* read-ahead's counters into a stats record (readahead.c, for cache_fetch.c). */
void dh__remote_readahead_counts(dh__remote_cache_stats_t *out);

#endif
