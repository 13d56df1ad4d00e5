/* descriptor.c: conversions between a sample's profile row, its REQUEST descriptor and the
 * decoder's overrides (see descriptor.h). */
#include <string.h>

#include "runtime/descriptor.h"

void dh__rt_sample_of_row(const dh_profile_row_t *row, dh_wire_sample_t *out)
{
    memset(out, 0, sizeof *out);
    out->id = (char *)row->id;
    out->uri = (char *)row->uri;
    out->key = (char *)row->profile_key;
    out->frames = (uint32_t)row->frames;
    out->height = (uint32_t)row->height;
    out->width = (uint32_t)row->width;
    out->cpu_s = row->cpu_s_est > 0 ? row->cpu_s_est : 0;
    out->in_bytes = (uint64_t)(row->in_bytes > 0 ? row->in_bytes : 0);
    out->out_bytes = (uint64_t)(row->out_bytes > 0 ? row->out_bytes : 0);
    out->tokens = row->tokens_est > 0 ? row->tokens_est : 0;
}

void dh__rt_row_of_sample(const dh_wire_sample_t *sample, dh_profile_row_t *out)
{
    memset(out, 0, sizeof *out);
    out->id = sample->id;
    out->uri = sample->uri;
    out->profile_key = sample->key && sample->key[0] ? sample->key : "?";
    out->frames = (int32_t)sample->frames;
    out->height = (int32_t)sample->height;
    out->width = (int32_t)sample->width;
    out->tokens_est = sample->tokens;
    out->cpu_s_est = sample->cpu_s;
    out->in_bytes = (int64_t)sample->in_bytes;
    out->out_bytes = (int64_t)sample->out_bytes;
}

dh_sample_overrides_t dh__rt_overrides_of_sample(const dh_wire_sample_t *sample)
{
    return (dh_sample_overrides_t){.frames = (int32_t)sample->frames,
                                   .height = (int32_t)sample->height,
                                   .width = (int32_t)sample->width};
}
