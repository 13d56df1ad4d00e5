/* descriptor.h: a sample's descriptor in its three forms, and the one place that converts
 * between them: the profile row (profile.h) the client plans with, the wire sample of a
 * REQUEST (wire.h) the coordinator costs and the DataServer executes, and the per-sample
 * overrides (pipeline.h) the decoder takes. Strings are borrowed, never copied. */
#ifndef DH_RUNTIME_DESCRIPTOR_H
#define DH_RUNTIME_DESCRIPTOR_H

#include "datahelix/pipeline.h"
#include "datahelix/profile.h"
#include "datahelix/wire.h"

/* The REQUEST descriptor of a profile row: id, uri, key, frames/height/width, and the
 * predictions (cpu_s, in/out bytes, tokens), a negative prediction sent as 0. */
void dh__rt_sample_of_row(const dh_profile_row_t *row, dh_wire_sample_t *out);

/* The profile row a REQUEST descriptor stands for (what the cost model predicts from); an
 * empty or absent key becomes "?". Fields the wire does not carry are 0. */
void dh__rt_row_of_sample(const dh_wire_sample_t *sample, dh_profile_row_t *out);

/* The decoder's overrides of a REQUEST descriptor (0 = the pipeline's default). */
dh_sample_overrides_t dh__rt_overrides_of_sample(const dh_wire_sample_t *sample);

#endif
