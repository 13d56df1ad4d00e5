/* gen_wire_corpus.c: writes the wire codec's seed inputs (tests/fuzz/corpus/wire/) in the
 * layout fuzz_wire.c reads: u8 payload-frame count, 20-byte header, body, then each payload
 * frame as a u16 LE length and its bytes. One message of each type, encoded by the real
 * encoder (dh_wire_encode), so the seeds start the fuzzer inside every body's decoder.
 *
 *   build-fuzz/tests/fuzz/gen_wire_corpus tests/fuzz/corpus/wire
 *
 * The checked-in seeds were written this way; rerun it after a change of the wire format.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/wire.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static dh_wire_link_bw_t links[] = {{(char *)"node-b", 1.25e9, 250e-6}};
static dh_wire_sample_t samples[] = {
    {(char *)"k/abc", 16, 224, 224, (char *)"/d/abc.mp4", (char *)"f16x224x224", 0.125, 1500000,
     2408448, 1024, 42},
    {(char *)"", 0, 0, 0, (char *)"", (char *)"", 0.0, 0, 0, 0, 0},
};
static dh_wire_sample_status_t statuses[] = {{0, (char *)"", 0.375, 0.0625, 1u << 20},
                                             {DH_EPARSE, (char *)"x.mp4: bad", 0, 0, 0}};
static dh_wire_sample_result_t results[] = {
    {(char *)"k/abc", 1024, 0, (char *)"", 0.25, 0.125, 3u << 20},
    {(char *)"u/x", 0, DH_EIO, (char *)"moov", 0, 0, 0}};
static uint8_t video[2 * 3 * 4];
static float mask[2 * 3];
static dh_wire_tensor_t frame_tensors[] = {
    {.tensor = {.name = "video",
                .dtype = DH_DTYPE_UINT8,
                .ndim = 3,
                .shape = {2, 3, 4},
                .strides = {12, 4, 1}},
     .location = DH_WIRE_LOC_FRAME},
    {.tensor =
         {.name = "mask", .dtype = DH_DTYPE_FLOAT32, .ndim = 2, .shape = {2, 3}, .strides = {3, 1}},
     .location = DH_WIRE_LOC_FRAME},
};
static dh_wire_tensor_t shm_tensors[] = {
    {.tensor = {.name = "tokens", .dtype = DH_DTYPE_INT64, .ndim = 1, .shape = {5}, .strides = {1}},
     .location = DH_WIRE_LOC_SHM,
     .arena_id = 7,
     .offset = 4096,
     .length = 64,
     .generation = 3},
};
static dh_wire_real_t features[] = {{-1.5}, {2048}};
static dh_wire_rb_part_t parts[] = {
    {0, 12, 1, 1024, 2408448, 0.125, LEN(features), features, LEN(shm_tensors), shm_tensors, 1,
     results, (char *)"ds-2", 99},
};
static dh_wire_rb_member_t members[] = {
    {0, (char *)"a-rank0", (char *)"node-a", (char *)"tcp://10.0.0.1:7000", 1e-4, 0.75},
    {1, (char *)"b-rank1", (char *)"node-b", (char *)"tcp://10.0.0.2:7000", 0, 0},
};

static dh_msg_request_t request(void)
{
    return (dh_msg_request_t){(char *)"client-3", 42,           3,      -1500000,
                              (char *)"node-a",   LEN(samples), samples};
}

static void write_seed(const char *dir, const char *name, const dh_msg_t *msg,
                       const dh_wire_frame_t *frames, size_t n_frames)
{
    uint8_t header[DH_WIRE_HEADER_SIZE];
    uint8_t *body = NULL;
    size_t body_len = 0;
    if (dh_wire_encode(msg, header, &body, &body_len) != 0) {
        fprintf(stderr, "gen_wire_corpus: %s: %s\n", name, dh_last_error());
        exit(1);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputc((int)n_frames, f);
    fwrite(header, 1, sizeof header, f);
    fwrite(body, 1, body_len, f);
    for (size_t i = 0; i < n_frames; i++) {
        fputc((int)(frames[i].size & 0xff), f);
        fputc((int)(frames[i].size >> 8), f);
        fwrite(frames[i].data, 1, frames[i].size, f);
    }
    if (fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    dh_free(body);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_wire_corpus DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    dh_msg_t m;

    m = (dh_msg_t){.type = DH_MSG_HELLO, .sender_seq = 1};
    m.hello = (dh_msg_hello_t){DH_WIRE_ROLE_REMOTE,
                               (char *)"cpu-17",
                               48,
                               8ull << 30,
                               (char *)"cpu-17-remote",
                               (char *)"tcp://10.0.0.17:7001",
                               (char *)"datahelix-4242-0",
                               4242,
                               3,
                               0x0123456789abcdefull};
    write_seed(dir, "hello", &m, NULL, 0);

    m = (dh_msg_t){.type = DH_MSG_HEARTBEAT, .sender_seq = 2};
    m.heartbeat = (dh_msg_heartbeat_t){32, 9, 2.75, 1.1, 0.042, 123456, 1.5e9, LEN(links), links};
    write_seed(dir, "heartbeat", &m, NULL, 0);

    m = (dh_msg_t){.type = DH_MSG_REQUEST, .sender_seq = 3};
    m.request = request();
    write_seed(dir, "request", &m, NULL, 0);

    m = (dh_msg_t){.type = DH_MSG_DISPATCH, .sender_seq = 4};
    m.dispatch = (dh_msg_dispatch_t){request(), (char *)"ds-remote-2", (char *)"ds-local-a",
                                     (char *)"tcp://10.0.0.1:7000", 0.5};
    write_seed(dir, "dispatch", &m, NULL, 0);

    m = (dh_msg_t){.type = DH_MSG_COMPLETE, .sender_seq = 5};
    m.complete =
        (dh_msg_complete_t){(char *)"client-3", 42, LEN(statuses), statuses, 0.5, 4096, 0.01, 1};
    write_seed(dir, "complete", &m, NULL, 0);

    dh_wire_frame_t frames[] = {{video, sizeof video}, {mask, sizeof mask}};
    m = (dh_msg_t){.type = DH_MSG_DELIVER, .sender_seq = 6};
    m.deliver =
        (dh_msg_deliver_t){(char *)"client-3", 42,      LEN(frame_tensors), frame_tensors,
                           LEN(results),       results, 123456789,          (char *)"ds-remote-2"};
    write_seed(dir, "deliver-frames", &m, frames, LEN(frames));

    m.deliver.n_tensors = LEN(shm_tensors);
    m.deliver.tensors = shm_tensors;
    write_seed(dir, "deliver-shm", &m, NULL, 0);

    m = (dh_msg_t){.type = DH_MSG_ERROR, .sender_seq = 7};
    m.error = (dh_msg_error_t){DH_ENOSERVER, (char *)"no live DataServer"};
    write_seed(dir, "error", &m, NULL, 0);

    m = (dh_msg_t){.type = DH_MSG_GOODBYE, .sender_seq = 8};
    write_seed(dir, "goodbye", &m, NULL, 0);

    m = (dh_msg_t){.type = DH_MSG_REBALANCE, .sender_seq = 9};
    m.rebalance = (dh_msg_rebalance_t){.kind = DH_RB_OFFER,
                                       .group = 1,
                                       .round = 5,
                                       .rank = 0,
                                       .client_id = (char *)"a-rank0",
                                       .node = (char *)"",
                                       .endpoint = (char *)"",
                                       .reason = (char *)"",
                                       .n_members = LEN(members),
                                       .members = members,
                                       .n_parts = LEN(parts),
                                       .parts = parts};
    write_seed(dir, "rebalance-offer", &m, NULL, 0);
    m.rebalance.kind = DH_RB_END;
    m.rebalance.reason = (char *)"timed out";
    m.rebalance.n_parts = 0;
    write_seed(dir, "rebalance-end", &m, NULL, 0);
    m.rebalance.kind = DH_RB_SEND;
    m.rebalance.node = (char *)"node-b";
    m.rebalance.endpoint = (char *)"tcp://10.0.0.2:7000";
    m.rebalance.seq = 77;
    m.rebalance.reason = (char *)"";
    m.rebalance.n_parts = LEN(parts);
    write_seed(dir, "rebalance-send", &m, NULL, 0);
    return 0;
}
