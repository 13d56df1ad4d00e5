/* fuzz_pyworker.c: the Python worker's messages (src/runtime/dataserver_pyworker.c) on
 * untrusted JSON.
 *
 * The input is one message as the worker process sends it over its socket (<= 256 KiB,
 * dataserver_pyworker.c's MSG_CAP), parsed with dh__py_msg_parse; an accepted "alloc" message goes
 * through dh__py_take_alloc for a task of as many samples as its "samples" list holds (its
 * first two seeds: a matching count; anything else not a list: the count-mismatch path), a
 * "done" message's "samples" through dh__py_take_samples. Checked: a refused message leaves
 * nothing (DH_EPARSE, *out NULL); per sample, an error string exactly when its status is
 * DH_EDATASET, then no tokens, failed counting them, tokens and cpu_s >= 0; each accepted
 * tensor named (1..31 bytes), a carried dtype, at most DH_TENSOR_MAX_DIMS dimensions, and
 * nbytes = its elements x dtype size, at most 2^40 elements.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "datahelix/alloc.h"
#include "datahelix/tensor.h"
#include "runtime/dataserver_pyworker.h"

#define MAX_SAMPLES 64

static void check_samples(const dh__rt_result_t *out)
{
    uint32_t failed = 0;
    for (uint32_t i = 0; i < out->n_samples; i++) {
        const dh_wire_sample_result_t *r = &out->samples[i];
        FUZZ_CHECK((r->status != 0) == (r->error != NULL));
        FUZZ_CHECK(r->status == 0 || r->status == DH_EDATASET);
        FUZZ_CHECK(r->tokens >= 0);
        FUZZ_CHECK(r->status == 0 || r->tokens == 0);
        FUZZ_CHECK(out->sample_cpu_s[i] >= 0 && isfinite(out->sample_cpu_s[i]));
        if (r->error)
            (void)strlen(r->error);
        failed += r->status != 0;
    }
    FUZZ_CHECK(out->failed == failed);
}

static void check_tensors(const dh__rt_result_t *out)
{
    FUZZ_CHECK(out->n_tensors <= DH__RT_MAX_TENSORS);
    for (size_t t = 0; t < out->n_tensors; t++) {
        const dh_tensor_t *x = &out->tensors[t].tensor;
        size_t name_len = strnlen(x->name, DH_TENSOR_NAME_MAX);
        FUZZ_CHECK(name_len > 0 && name_len < DH_TENSOR_NAME_MAX);
        FUZZ_CHECK(dh_dtype_size(x->dtype) > 0);
        FUZZ_CHECK(x->ndim >= 0 && x->ndim <= DH_TENSOR_MAX_DIMS);
        FUZZ_CHECK(x->data == NULL);
        uint64_t elems = 1;
        for (int32_t d = 0; d < x->ndim; d++) {
            FUZZ_CHECK(x->shape[d] >= 0);
            elems *= (uint64_t)x->shape[d];
            FUZZ_CHECK(elems <= (uint64_t)1 << 40);
        }
        FUZZ_CHECK(x->nbytes == elems * dh_dtype_size(x->dtype));
    }
}

static void clear_samples(dh__rt_result_t *out)
{
    for (uint32_t i = 0; i < out->n_samples; i++) {
        dh_free(out->samples[i].error);
        out->samples[i].error = NULL;
        out->samples[i].status = 0;
        out->samples[i].tokens = 0;
        out->sample_cpu_s[i] = 0;
    }
    out->failed = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static dh_wire_sample_result_t samples[MAX_SAMPLES];
    static double cpu[MAX_SAMPLES];
    static char ids[MAX_SAMPLES][8];
    if (size > ((size_t)256 << 10))
        return 0;
    json_t *msg = (json_t *)1;
    int rc = dh__py_msg_parse((const char *)data, size, 0, 1, &msg);
    if (rc != 0) {
        FUZZ_CHECK(rc == DH_EPARSE || rc == DH_ENOMEM);
        FUZZ_CHECK(msg == NULL);
        return 0;
    }
    FUZZ_CHECK(json_is_object(msg));
    const char *op = json_string_value(json_object_get(msg, "op"));
    FUZZ_CHECK(op);
    json_t *list = json_object_get(msg, "samples");
    size_t n = json_is_array(list) ? json_array_size(list) : 3;
    dh__rt_result_t out = {.n_samples = (uint32_t)(n < MAX_SAMPLES ? n : MAX_SAMPLES),
                           .samples = samples,
                           .sample_cpu_s = cpu};
    for (uint32_t i = 0; i < MAX_SAMPLES; i++) {
        snprintf(ids[i], sizeof ids[i], "s%u", i);
        samples[i] = (dh_wire_sample_result_t){.id = ids[i]};
        cpu[i] = 0;
    }
    if (strcmp(op, "alloc") == 0) {
        rc = dh__py_take_alloc(msg, 0, &out);
        FUZZ_CHECK(rc == 0 || rc == DH_EPARSE || rc == DH_EDATASET || rc == DH_ENOMEM);
        if (rc == 0 || rc == DH_EDATASET)
            check_tensors(&out);
        if (rc == 0 || rc == DH_EDATASET)
            check_samples(&out);
        if (rc == DH_EPARSE)
            FUZZ_CHECK(n != out.n_samples || !json_is_array(list));
    } else if (strcmp(op, "done") == 0 && list) {
        rc = dh__py_take_samples(list, 0, &out);
        FUZZ_CHECK(rc == 0 || rc == DH_EPARSE || rc == DH_ENOMEM);
        if (rc == 0)
            check_samples(&out);
    }
    clear_samples(&out);
    json_decref(msg);
    return 0;
}
