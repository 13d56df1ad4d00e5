/* Tests of the wire codec: round trips of every message type, version refusal, truncation
 * at every byte, huge counts, bad tensors and values, a deterministic fuzz loop, and an
 * allocation-failure run; the encoded bytes of every message are pinned. Run under the ASan build:
 * every decode reads from buffers of the exact size, so a read past the end is caught. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "datahelix/wire.h"

#define DH_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- fixtures: one message of each type, built from static storage ---- */

static dh_wire_link_bw_t links[] = {{(char *)"node-b", 1.25e9, 250e-6},
                                    {(char *)"node-c", 0.0, 0.0}};
static dh_wire_sample_t samples[] = {
    {(char *)"kinetics/abc123", 16, 224, 224, (char *)"/data/k/abc123.mp4", (char *)"f16x224x224",
     0.125, 1500000, 2408448, 1024, 0x0123456789abcdefull},
    {(char *)"", 0, 0, 0, (char *)"", (char *)"", 0.0, 0, 0, 0, 0},
    {(char *)"ucf/\xc3\xa9t\xc3\xa9", 8, 0, 320, (char *)"error:x", (char *)"k", 3.5, UINT64_MAX, 7,
     INT64_MAX, UINT64_MAX},
};
static dh_wire_sample_result_t results[] = {
    {(char *)"kinetics/abc123", 1024, 0, (char *)"", 0.25, 0.125, 3u << 20},
    {(char *)"ucf/x", 0, DH_EIO, (char *)"sample 'ucf/x' (/data/ucf/x.mp4): moov atom not found", 0,
     0, 0},
};
static dh_wire_sample_status_t statuses[] = {
    {0, (char *)"", 0.375, 0.0625, 1u << 20},
    {DH_EPARSE, (char *)"ucf/x.mp4: moov atom not found", 0, 0, 0},
};
static uint8_t video_bytes[2 * 3 * 4];
static float mask_bytes[2 * 3];

static dh_wire_tensor_t tensors[] = {
    {.tensor = {.name = "video",
                .dtype = DH_DTYPE_UINT8,
                .ndim = 3,
                .shape = {2, 3, 4},
                .strides = {12, 4, 1}},
     .location = DH_WIRE_LOC_FRAME},
    {.tensor = {.name = "tokens", .dtype = DH_DTYPE_INT64, .ndim = 1, .shape = {5}, .strides = {1}},
     .location = DH_WIRE_LOC_SHM,
     .arena_id = 7,
     .offset = 4096,
     .length = 64,
     .generation = 0x1122334455667788ull},
    {.tensor =
         {.name = "mask", .dtype = DH_DTYPE_FLOAT32, .ndim = 2, .shape = {2, 3}, .strides = {3, 1}},
     .location = DH_WIRE_LOC_FRAME},
};

static dh_wire_tensor_t shm_tensors[] = {
    {.tensor =
         {.name = "frames", .dtype = DH_DTYPE_UINT8, .ndim = 1, .shape = {64}, .strides = {1}},
     .location = DH_WIRE_LOC_SHM,
     .arena_id = 9,
     .offset = 1 << 20,
     .length = 64,
     .generation = 3},
};
static dh_wire_real_t features[] = {{-1.5}, {2048}};
static dh_wire_rb_part_t rb_parts[] = {
    {0, 12, 1, 1024, 2408448, 0.125, DH_ARRAY_LEN(features), features, DH_ARRAY_LEN(shm_tensors),
     shm_tensors, 1, results, (char *)"ds-remote-2", 99},
    {1, 12, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, (char *)"", 0},
};
static dh_wire_rb_member_t rb_members[] = {
    {0, (char *)"node-a-rank0-1", (char *)"node-a", (char *)"tcp://10.0.0.1:7000", 1e-4, 0.75},
    {1, (char *)"node-b-rank1-2", (char *)"node-b", (char *)"tcp://10.0.0.2:7000", 0, 0},
};

static dh_wire_frame_t payload_frames[] = {
    {video_bytes, sizeof video_bytes},
    {mask_bytes, sizeof mask_bytes},
};

static dh_msg_request_t fixture_request(void)
{
    return (dh_msg_request_t){.client_id = (char *)"client-3",
                              .seq = 0x0102030405060708ull,
                              .rank = 3,
                              .deadline_ns = -1500000,
                              .delivery_node = (char *)"node-a",
                              .n_samples = DH_ARRAY_LEN(samples),
                              .samples = samples};
}

static dh_msg_t fixture(unsigned type)
{
    dh_msg_t m = {.type = (uint16_t)type, .sender_seq = 1000 + type};
    switch (type) {
    case DH_MSG_HELLO:
        m.hello = (dh_msg_hello_t){DH_WIRE_ROLE_REMOTE,
                                   (char *)"cpu-node-17",
                                   48,
                                   8ull << 30,
                                   (char *)"cpu-node-17-remote-4242",
                                   (char *)"tcp://10.0.0.17:7001",
                                   (char *)"datahelix-4242-0",
                                   4242,
                                   3,
                                   0x0123456789abcdefull};
        break;
    case DH_MSG_HEARTBEAT:
        m.heartbeat = (dh_msg_heartbeat_t){.workers = 32,
                                           .queue_depth = 9,
                                           .queue_work_s = 2.75,
                                           .speed_factor = 1.1,
                                           .recent_latency_s = 0.042,
                                           .dispatches_seen = 123456,
                                           .read_bytes_per_s = 1.5e9,
                                           .n_links = DH_ARRAY_LEN(links),
                                           .links = links};
        break;
    case DH_MSG_REQUEST:
        m.request = fixture_request();
        break;
    case DH_MSG_DISPATCH:
        m.dispatch =
            (dh_msg_dispatch_t){fixture_request(), (char *)"ds-remote-2", (char *)"ds-local-0",
                                (char *)"tcp://127.0.0.1:40001", 0.625};
        break;
    case DH_MSG_COMPLETE:
        m.complete = (dh_msg_complete_t){.client_id = (char *)"client-3",
                                         .seq = 77,
                                         .n_samples = DH_ARRAY_LEN(statuses),
                                         .samples = statuses,
                                         .cpu_s = 1.5,
                                         .bytes = 123456789,
                                         .queue_s = 0.25,
                                         .delivered = 1};
        break;
    case DH_MSG_DELIVER:
        m.deliver = (dh_msg_deliver_t){
            (char *)"client-3",    77,      DH_ARRAY_LEN(tensors), tensors,
            DH_ARRAY_LEN(results), results, 123456789012ull,       (char *)"ds-remote-2"};
        break;
    case DH_MSG_ERROR:
        m.error = (dh_msg_error_t){DH_ENOSERVER, (char *)"no live DataServer for rank 3"};
        break;
    case DH_MSG_REBALANCE:
        m.rebalance = (dh_msg_rebalance_t){.kind = DH_RB_ROUND,
                                           .group = 2,
                                           .round = 6,
                                           .rank = 1,
                                           .client_id = (char *)"node-b-rank1-2",
                                           .node = (char *)"node-b",
                                           .endpoint = (char *)"tcp://10.0.0.2:7000",
                                           .seq = 1ull << 63,
                                           .reason = (char *)"",
                                           .n_members = DH_ARRAY_LEN(rb_members),
                                           .members = rb_members,
                                           .n_parts = DH_ARRAY_LEN(rb_parts),
                                           .parts = rb_parts};
        break;
    case DH_MSG_GOODBYE:
        break;
    }
    return m;
}

static size_t fixture_payloads(unsigned type)
{
    return type == DH_MSG_DELIVER ? DH_ARRAY_LEN(payload_frames) : 0;
}

/* An encoded message in exact-size heap buffers (so ASan sees any overread). */
typedef struct encoded {
    uint8_t header[DH_WIRE_HEADER_SIZE];
    uint8_t *body;
    size_t body_len;
} encoded_t;

static encoded_t encode(const dh_msg_t *m)
{
    encoded_t e;
    assert_int_equal(dh_wire_encode(m, e.header, &e.body, &e.body_len), 0);
    return e;
}

/* Decodes header + body[0..len), copying both into exact-size buffers first. */
static int decode_copy(const uint8_t *header, size_t header_size, const uint8_t *body, size_t len,
                       const dh_wire_frame_t *payloads, size_t n_payloads, dh_msg_t *out)
{
    uint8_t *h = dh_malloc(header_size);
    uint8_t *b = dh_malloc(len);
    assert_non_null(h);
    assert_non_null(b);
    memcpy(h, header, header_size);
    if (len)
        memcpy(b, body, len);
    int rc = dh_wire_decode(h, header_size, b, len, payloads, n_payloads, out);
    dh_free(h);
    dh_free(b);
    return rc;
}

static void set_body_len(uint8_t header[DH_WIRE_HEADER_SIZE], uint32_t len)
{
    for (int i = 0; i < 4; i++)
        header[8 + i] = (uint8_t)(len >> (8 * i));
}

/* ---- deep comparison ---- */

static void assert_request_equal(const dh_msg_request_t *a, const dh_msg_request_t *b)
{
    assert_string_equal(a->client_id, b->client_id);
    assert_int_equal(a->seq, b->seq);
    assert_int_equal(a->rank, b->rank);
    assert_int_equal(a->deadline_ns, b->deadline_ns);
    assert_string_equal(a->delivery_node, b->delivery_node);
    assert_int_equal(a->n_samples, b->n_samples);
    for (uint32_t i = 0; i < a->n_samples; i++) {
        assert_string_equal(a->samples[i].id, b->samples[i].id);
        assert_int_equal(a->samples[i].frames, b->samples[i].frames);
        assert_int_equal(a->samples[i].height, b->samples[i].height);
        assert_int_equal(a->samples[i].width, b->samples[i].width);
        assert_string_equal(a->samples[i].uri, b->samples[i].uri);
        assert_string_equal(a->samples[i].key, b->samples[i].key);
        assert_true(a->samples[i].cpu_s == b->samples[i].cpu_s);
        assert_int_equal(a->samples[i].in_bytes, b->samples[i].in_bytes);
        assert_int_equal(a->samples[i].out_bytes, b->samples[i].out_bytes);
        assert_int_equal(a->samples[i].tokens, b->samples[i].tokens);
    }
}

static void assert_msg_equal(const dh_msg_t *a, const dh_msg_t *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->sender_seq, b->sender_seq);
    switch (a->type) {
    case DH_MSG_HELLO:
        assert_int_equal(a->hello.role, b->hello.role);
        assert_string_equal(a->hello.node, b->hello.node);
        assert_int_equal(a->hello.workers, b->hello.workers);
        assert_int_equal(a->hello.arena_bytes, b->hello.arena_bytes);
        assert_string_equal(a->hello.name, b->hello.name);
        assert_string_equal(a->hello.endpoint, b->hello.endpoint);
        assert_string_equal(a->hello.shm_socket, b->hello.shm_socket);
        assert_int_equal(a->hello.pid, b->hello.pid);
        assert_int_equal(a->hello.rank, b->hello.rank);
        break;
    case DH_MSG_HEARTBEAT:
        assert_int_equal(a->heartbeat.workers, b->heartbeat.workers);
        assert_int_equal(a->heartbeat.queue_depth, b->heartbeat.queue_depth);
        assert_true(a->heartbeat.queue_work_s == b->heartbeat.queue_work_s);
        assert_true(a->heartbeat.speed_factor == b->heartbeat.speed_factor);
        assert_true(a->heartbeat.recent_latency_s == b->heartbeat.recent_latency_s);
        assert_int_equal(a->heartbeat.dispatches_seen, b->heartbeat.dispatches_seen);
        assert_true(a->heartbeat.read_bytes_per_s == b->heartbeat.read_bytes_per_s);
        assert_int_equal(a->heartbeat.n_links, b->heartbeat.n_links);
        for (uint32_t i = 0; i < a->heartbeat.n_links; i++) {
            assert_string_equal(a->heartbeat.links[i].node, b->heartbeat.links[i].node);
            assert_true(a->heartbeat.links[i].bytes_per_s == b->heartbeat.links[i].bytes_per_s);
            assert_true(a->heartbeat.links[i].latency_s == b->heartbeat.links[i].latency_s);
        }
        break;
    case DH_MSG_REQUEST:
        assert_request_equal(&a->request, &b->request);
        break;
    case DH_MSG_DISPATCH:
        assert_request_equal(&a->dispatch.request, &b->dispatch.request);
        assert_string_equal(a->dispatch.server, b->dispatch.server);
        assert_string_equal(a->dispatch.target, b->dispatch.target);
        assert_string_equal(a->dispatch.target_endpoint, b->dispatch.target_endpoint);
        assert_true(a->dispatch.pred_cpu_s == b->dispatch.pred_cpu_s);
        break;
    case DH_MSG_COMPLETE:
        assert_string_equal(a->complete.client_id, b->complete.client_id);
        assert_int_equal(a->complete.seq, b->complete.seq);
        assert_int_equal(a->complete.n_samples, b->complete.n_samples);
        for (uint32_t i = 0; i < a->complete.n_samples; i++) {
            assert_int_equal(a->complete.samples[i].status, b->complete.samples[i].status);
            assert_string_equal(a->complete.samples[i].error, b->complete.samples[i].error);
            assert_true(a->complete.samples[i].cpu_s == b->complete.samples[i].cpu_s);
            assert_true(a->complete.samples[i].fetch_s == b->complete.samples[i].fetch_s);
            assert_int_equal(a->complete.samples[i].fetch_bytes,
                             b->complete.samples[i].fetch_bytes);
        }
        assert_true(a->complete.cpu_s == b->complete.cpu_s);
        assert_int_equal(a->complete.bytes, b->complete.bytes);
        assert_true(a->complete.queue_s == b->complete.queue_s);
        assert_int_equal(a->complete.delivered, b->complete.delivered);
        break;
    case DH_MSG_DELIVER:
        assert_string_equal(a->deliver.client_id, b->deliver.client_id);
        assert_int_equal(a->deliver.seq, b->deliver.seq);
        assert_int_equal(a->deliver.n_tensors, b->deliver.n_tensors);
        for (uint32_t i = 0; i < a->deliver.n_tensors; i++) {
            const dh_wire_tensor_t *x = &a->deliver.tensors[i], *y = &b->deliver.tensors[i];
            assert_string_equal(x->tensor.name, y->tensor.name);
            assert_int_equal(x->tensor.dtype, y->tensor.dtype);
            assert_int_equal(x->tensor.ndim, y->tensor.ndim);
            assert_int_equal(x->location, y->location);
            for (int32_t d = 0; d < x->tensor.ndim; d++) {
                assert_int_equal(x->tensor.shape[d], y->tensor.shape[d]);
                assert_int_equal(x->tensor.strides[d], y->tensor.strides[d]);
            }
            if (x->location == DH_WIRE_LOC_SHM) {
                assert_int_equal(x->arena_id, y->arena_id);
                assert_int_equal(x->offset, y->offset);
                assert_int_equal(x->length, y->length);
                assert_int_equal(x->generation, y->generation);
            }
        }
        assert_int_equal(a->deliver.n_samples, b->deliver.n_samples);
        for (uint32_t i = 0; i < a->deliver.n_samples; i++) {
            assert_string_equal(a->deliver.samples[i].id, b->deliver.samples[i].id);
            assert_int_equal(a->deliver.samples[i].tokens, b->deliver.samples[i].tokens);
            assert_int_equal(a->deliver.samples[i].status, b->deliver.samples[i].status);
            assert_string_equal(a->deliver.samples[i].error, b->deliver.samples[i].error);
            assert_true(a->deliver.samples[i].cpu_s == b->deliver.samples[i].cpu_s);
            assert_true(a->deliver.samples[i].fetch_s == b->deliver.samples[i].fetch_s);
            assert_int_equal(a->deliver.samples[i].fetch_bytes, b->deliver.samples[i].fetch_bytes);
        }
        assert_int_equal(a->deliver.ready_ns, b->deliver.ready_ns);
        assert_string_equal(a->deliver.server, b->deliver.server);
        break;
    case DH_MSG_ERROR:
        assert_int_equal(a->error.code, b->error.code);
        assert_string_equal(a->error.message, b->error.message);
        break;
    }
}

static void round_trip(unsigned type)
{
    dh_msg_t in = fixture(type);
    encoded_t e = encode(&in);
    dh_msg_t out;
    int rc = decode_copy(e.header, sizeof e.header, e.body, e.body_len, payload_frames,
                         fixture_payloads(type), &out);
    if (rc)
        print_error("%s: %s\n", dh_msg_type_name(type), dh_last_error());
    assert_int_equal(rc, 0);
    assert_msg_equal(&in, &out);
    /* The encoding is canonical: re-encoding the decoded message gives the same bytes. */
    encoded_t again = encode(&out);
    assert_memory_equal(again.header, e.header, sizeof e.header);
    assert_int_equal(again.body_len, e.body_len);
    if (e.body_len)
        assert_memory_equal(again.body, e.body, e.body_len);
    dh_msg_clear(&out);
    assert_int_equal(out.type, 0);
    dh_free(again.body);
    dh_free(e.body);
}

static void wire_round_trips_hello(void **state)
{
    round_trip(DH_MSG_HELLO);
}

static void wire_round_trips_heartbeat(void **state)
{
    round_trip(DH_MSG_HEARTBEAT);
}

static void wire_round_trips_request(void **state)
{
    round_trip(DH_MSG_REQUEST);
}

static void wire_round_trips_dispatch(void **state)
{
    round_trip(DH_MSG_DISPATCH);
}

static void wire_round_trips_complete(void **state)
{
    round_trip(DH_MSG_COMPLETE);
}

static void wire_round_trips_error_and_goodbye(void **state)
{
    round_trip(DH_MSG_ERROR);
    round_trip(DH_MSG_GOODBYE);
}

static void wire_round_trips_deliver_with_payloads(void **state)
{
    round_trip(DH_MSG_DELIVER);
    /* The payload frames are borrowed, not copied; the shm tensor has none. */
    dh_msg_t in = fixture(DH_MSG_DELIVER), out;
    encoded_t e = encode(&in);
    assert_int_equal(
        dh_wire_decode(e.header, sizeof e.header, e.body, e.body_len, payload_frames, 2, &out), 0);
    assert_ptr_equal(out.deliver.tensors[0].tensor.data, video_bytes);
    assert_int_equal(out.deliver.tensors[0].tensor.nbytes, sizeof video_bytes);
    assert_null(out.deliver.tensors[1].tensor.data);
    assert_ptr_equal(out.deliver.tensors[2].tensor.data, mask_bytes);
    assert_int_equal(out.deliver.tensors[2].tensor.nbytes, sizeof mask_bytes);
    dh_msg_clear(&out);
    dh_free(e.body);
}

/* The packet form (the local notice channel): header and body in one buffer, shared-memory
 * handles only. */
static void wire_round_trips_packets(void **state)
{
    dh_msg_t in = fixture(DH_MSG_DELIVER), out;
    in.deliver.n_tensors = 1;
    in.deliver.tensors = &tensors[1]; /* the shm tensor */
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(dh_wire_encode_packet(&in, &buf, &len), 0);
    encoded_t e = encode(&in);
    assert_int_equal(len, DH_WIRE_HEADER_SIZE + e.body_len);
    assert_memory_equal(buf, e.header, DH_WIRE_HEADER_SIZE);
    assert_memory_equal(buf + DH_WIRE_HEADER_SIZE, e.body, e.body_len);
    assert_int_equal(dh_wire_decode_packet(buf, len, &out), 0);
    assert_int_equal(out.type, DH_MSG_DELIVER);
    assert_string_equal(out.deliver.client_id, "client-3");
    assert_int_equal(out.deliver.n_tensors, 1);
    assert_int_equal(out.deliver.tensors[0].offset, 4096);
    assert_int_equal(out.deliver.tensors[0].generation, 0x1122334455667788ull);
    assert_int_equal(out.deliver.n_samples, in.deliver.n_samples);
    dh_msg_clear(&out);
    /* Every truncation, and one trailing byte, is refused with nothing owned. */
    for (size_t n = 0; n < len; n++) {
        uint8_t *cut = dh_malloc(n ? n : 1);
        memcpy(cut, buf, n);
        assert_int_equal(dh_wire_decode_packet(cut, n, &out), DH_EPARSE);
        assert_int_equal(out.type, 0);
        dh_free(cut);
    }
    uint8_t *longer = dh_malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0;
    assert_int_equal(dh_wire_decode_packet(longer, len + 1, &out), DH_EPARSE);
    dh_free(longer);
    dh_free(buf);
    dh_free(e.body);
    /* A DELIVER with payload frames cannot travel as a packet. */
    dh_msg_t framed = fixture(DH_MSG_DELIVER);
    assert_int_equal(dh_wire_encode_packet(&framed, &buf, &len), DH_EINVAL);
    assert_null(buf);
    assert_non_null(strstr(dh_last_error(), "payload frame"));
    /* Any other message travels too. */
    dh_msg_t hello = fixture(DH_MSG_HELLO);
    assert_int_equal(dh_wire_encode_packet(&hello, &buf, &len), 0);
    assert_int_equal(dh_wire_decode_packet(buf, len, &out), 0);
    assert_int_equal(out.type, DH_MSG_HELLO);
    dh_msg_clear(&out);
    dh_free(buf);
}

/* The bytes of every message are pinned: the encoder and decoder are expanded from one field
 * table per message (src/wire/codec.c), so a reordered or retyped row would still round-trip
 * but change the format. A deliberate change to these bytes is a new DH_WIRE_VERSION. */
static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void wire_bodies_keep_their_bytes(void **state)
{
    static const struct {
        size_t len;
        uint64_t fnv1a;
    } want[DH_MSG_TYPE_MAX + 1] = {
        /* 115: the coordinator's incarnation (u64) */
        [DH_MSG_HELLO] = {115, 0xa8435da906a79b8bull},
        /* 104: dispatches_seen (u64) and read_bytes_per_s (f64), and each link's latency_s
         * (f64) after its bytes_per_s (2 links) */
        [DH_MSG_HEARTBEAT] = {104, 0x1c07837b9886e9a7ull},
        /* 299: each sample's seed (u64, 3 samples) */
        [DH_MSG_REQUEST] = {299, 0x099caf7387e8b944ull},
        [DH_MSG_DISPATCH] = {361, 0x285e841c680645cdull},
        /* 143: each sample status's fetch_s (f64) and fetch_bytes (u64, 2 statuses) */
        [DH_MSG_COMPLETE] = {143, 0x9bd50d07088008a0ull},
        /* 376: each sample result's fetch_s (f64) and fetch_bytes (u64) after its cpu_s
         * (2 results) */
        [DH_MSG_DELIVER] = {376, 0x2b8e269d7af667ebull},
        /* 505: the parts' sample results' fetch_s and fetch_bytes (1 result) */
        [DH_MSG_REBALANCE] = {505, 0x72fa263d20be9de7ull},
        [DH_MSG_ERROR] = {37, 0xcdfb63b239f772cfull},
        [DH_MSG_GOODBYE] = {0, 0xcbf29ce484222325ull},
    };
    for (unsigned type = 1; type <= DH_MSG_TYPE_MAX; type++) {
        dh_msg_t in = fixture(type);
        encoded_t e = encode(&in);
        if (e.body_len != want[type].len || fnv1a(e.body, e.body_len) != want[type].fnv1a)
            print_error("%s: %zu bytes, FNV-1a %016llx\n", dh_msg_type_name(type), e.body_len,
                        (unsigned long long)fnv1a(e.body, e.body_len));
        assert_int_equal(e.body_len, want[type].len);
        assert_int_equal(fnv1a(e.body, e.body_len), want[type].fnv1a);
        dh_free(e.body);
    }
    /* One spelled out: ERROR is an i32 code then a string. */
    dh_msg_t err = fixture(DH_MSG_ERROR);
    encoded_t e = encode(&err);
    const uint8_t code_and_length[8] = {0xcd, 0x8a, 0xff, 0xff, 29, 0, 0, 0}; /* -30003, 29 */
    assert_memory_equal(e.body, code_and_length, sizeof code_and_length);
    assert_memory_equal(e.body + 8, "no live DataServer for rank 3", 29);
    dh_free(e.body);
}

static void wire_header_layout_is_little_endian(void **state)
{
    dh_msg_t in = fixture(DH_MSG_GOODBYE);
    in.sender_seq = 0x1122334455667788ull;
    encoded_t e = encode(&in);
    const uint8_t want[DH_WIRE_HEADER_SIZE] = {
        'D', 'H', 'X', '1', 6, 0, 8, 0, 0, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
    assert_memory_equal(e.header, want, sizeof want);
    assert_int_equal(e.body_len, 0);
    dh_wire_header_t h;
    assert_int_equal(dh_wire_decode_header(e.header, sizeof e.header, &h), 0);
    assert_int_equal(h.version, DH_WIRE_VERSION);
    assert_int_equal(h.type, DH_MSG_GOODBYE);
    assert_int_equal(h.sender_seq, 0x1122334455667788ull);
    dh_free(e.body);
}

static void wire_refuses_another_version(void **state)
{
    dh_msg_t in = fixture(DH_MSG_HELLO), out;
    encoded_t e = encode(&in);
    e.header[4] = 1; /* version 1 (before the feedback fields), little-endian */
    assert_int_equal(decode_copy(e.header, sizeof e.header, e.body, e.body_len, NULL, 0, &out),
                     DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "version 1"));
    assert_non_null(strstr(dh_last_error(), "version 6"));
    e.header[4] = 0;
    e.header[5] = 1; /* version 256 */
    assert_int_equal(decode_copy(e.header, sizeof e.header, e.body, e.body_len, NULL, 0, &out),
                     DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "version 256"));
    assert_int_equal(out.type, 0);
    dh_free(e.body);
}

static void wire_rejects_bad_headers(void **state)
{
    dh_msg_t in = fixture(DH_MSG_ERROR), out;
    encoded_t e = encode(&in);
    uint8_t h[DH_WIRE_HEADER_SIZE + 1];
    memcpy(h, e.header, sizeof e.header);
    h[DH_WIRE_HEADER_SIZE] = 0;
    /* Every header size but 20. */
    for (size_t n = 0; n <= DH_WIRE_HEADER_SIZE + 1; n++) {
        if (n == DH_WIRE_HEADER_SIZE)
            continue;
        assert_int_equal(decode_copy(h, n, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
        assert_non_null(strstr(dh_last_error(), "header frame"));
    }
    memcpy(h, "DHX2", 4);
    assert_int_equal(decode_copy(h, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "magic"));
    memcpy(h, e.header, 20);
    h[6] = 0;
    assert_int_equal(decode_copy(h, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "unknown message type 0"));
    h[6] = DH_MSG_TYPE_MAX + 1;
    assert_int_equal(decode_copy(h, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "unknown message type 10"));
    /* Body length disagreeing with the frame. */
    memcpy(h, e.header, 20);
    set_body_len(h, (uint32_t)e.body_len + 1);
    assert_int_equal(decode_copy(h, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "ERROR: header says the body is"));
    /* Payload frames on a type other than DELIVER. */
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, payload_frames, 1, &out),
                     DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "only DELIVER"));
    dh_free(e.body);
}

/* Every body length short of the full one is refused, with the header's length patched to
 * match (so the body parser itself meets the truncation) and unpatched. */
static void wire_rejects_truncation_at_every_byte(void **state)
{
    for (unsigned type = 1; type <= DH_MSG_TYPE_MAX; type++) {
        dh_msg_t in = fixture(type), out;
        encoded_t e = encode(&in);
        for (size_t len = 0; len < e.body_len; len++) {
            uint8_t h[DH_WIRE_HEADER_SIZE];
            memcpy(h, e.header, sizeof h);
            set_body_len(h, (uint32_t)len);
            int rc =
                decode_copy(h, sizeof h, e.body, len, payload_frames, fixture_payloads(type), &out);
            if (rc != DH_EPARSE)
                print_error("%s truncated to %zu of %zu bytes: rc %d\n", dh_msg_type_name(type),
                            len, e.body_len, rc);
            assert_int_equal(rc, DH_EPARSE);
            assert_non_null(strstr(dh_last_error(), dh_msg_type_name(type)));
            assert_int_equal(out.type, 0);
            assert_int_equal(decode_copy(e.header, sizeof e.header, e.body, len, payload_frames,
                                         fixture_payloads(type), &out),
                             DH_EPARSE);
        }
        if (type == DH_MSG_DELIVER) {
            /* A missing payload frame, an extra one. */
            dh_wire_frame_t three[3] = {payload_frames[0], payload_frames[1], payload_frames[1]};
            assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, three, 1, &out),
                             DH_EPARSE);
            assert_non_null(strstr(dh_last_error(), "payload frame 1"));
            assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, three, 3, &out),
                             DH_EPARSE);
            assert_non_null(strstr(dh_last_error(), "3 payload frames for 2 FRAME tensors"));
        }
        dh_free(e.body);
    }
}

static void wire_rejects_trailing_bytes(void **state)
{
    for (unsigned type = 1; type <= DH_MSG_TYPE_MAX; type++) {
        dh_msg_t in = fixture(type), out;
        encoded_t e = encode(&in);
        uint8_t *longer = dh_malloc(e.body_len + 1);
        assert_non_null(longer);
        if (e.body_len)
            memcpy(longer, e.body, e.body_len);
        longer[e.body_len] = 0;
        set_body_len(e.header, (uint32_t)e.body_len + 1);
        assert_int_equal(decode_copy(e.header, 20, longer, e.body_len + 1, payload_frames,
                                     fixture_payloads(type), &out),
                         DH_EPARSE);
        assert_non_null(strstr(dh_last_error(), "1 trailing bytes"));
        dh_free(longer);
        dh_free(e.body);
    }
}

/* Overwrites 4 bytes at off with v (little-endian). */
static void poke_u32(uint8_t *p, size_t off, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[off + (size_t)i] = (uint8_t)(v >> (8 * i));
}

static int decode_poked(const dh_msg_t *in, size_t off, uint32_t v, const char *want_field)
{
    encoded_t e = encode(in);
    poke_u32(e.body, off, v);
    dh_msg_t out;
    int rc = decode_copy(e.header, 20, e.body, e.body_len, payload_frames,
                         fixture_payloads(in->type), &out);
    if (rc == DH_EPARSE && !strstr(dh_last_error(), want_field))
        print_error("wanted field '%s' in: %s\n", want_field, dh_last_error());
    if (rc == DH_EPARSE)
        assert_non_null(strstr(dh_last_error(), want_field));
    if (rc == 0)
        dh_msg_clear(&out);
    dh_free(e.body);
    return rc;
}

static void wire_rejects_huge_counts_and_lengths(void **state)
{
    const uint32_t huge[] = {0xffffffffu, 0x80000000u, 0x10000000u, 0x00100000u};
    for (size_t i = 0; i < DH_ARRAY_LEN(huge); i++) {
        dh_msg_t hb = fixture(DH_MSG_HEARTBEAT);
        /* workers 4, depth 4, 3 x f64, dispatches_seen 8, read_bytes_per_s 8 = 48: the
         * link count. */
        assert_int_equal(decode_poked(&hb, 48, huge[i], "n_links"), DH_EPARSE);
        dh_msg_t rq = fixture(DH_MSG_REQUEST);
        /* client_id (4 + 8) seq 8 rank 4 deadline 8 node (4 + 6) = 42: the sample count. */
        assert_int_equal(decode_poked(&rq, 42, huge[i], "n_samples"), DH_EPARSE);
        assert_int_equal(decode_poked(&rq, 0, huge[i], "client_id"), DH_EPARSE);
        dh_msg_t cp = fixture(DH_MSG_COMPLETE);
        assert_int_equal(decode_poked(&cp, 20, huge[i], "n_samples"), DH_EPARSE);
        dh_msg_t dl = fixture(DH_MSG_DELIVER);
        assert_int_equal(decode_poked(&dl, 20, huge[i], "n_tensors"), DH_EPARSE);
        /* The first tensor's name length. */
        assert_int_equal(decode_poked(&dl, 24, huge[i], "tensors[0].name"), DH_EPARSE);
        dh_msg_t er = fixture(DH_MSG_ERROR);
        assert_int_equal(decode_poked(&er, 4, huge[i], "message"), DH_EPARSE);
    }
    /* A count that fits the bytes left but not the elements: refused when the elements run
     * out, not by an allocation of the claimed size. */
    dh_msg_t rq = fixture(DH_MSG_REQUEST);
    dh_wire_sample_t longer[DH_ARRAY_LEN(samples)]; /* bytes enough for a 4th sample's minimum */
    memcpy(longer, samples, sizeof longer);
    longer[1].uri = (char *)"/a/path/long/enough/for/the/minimum/of/one/more/sample.mp4";
    rq.request.samples = longer;
    assert_int_equal(decode_poked(&rq, 42, 4, "samples[3].id"), DH_EPARSE);
    /* A count as large as the bytes left: each sample takes more than one byte, so the count
     * check itself refuses it (before allocating count x element size), naming the count,
     * not an element that ran out. */
    encoded_t e = encode(&rq);
    uint32_t left = (uint32_t)(e.body_len - 46); /* after the count at 42 */
    dh_free(e.body);
    assert_true(left >= 2);
    assert_int_equal(decode_poked(&rq, 42, left, "n_samples"), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "needs at least"));
}

/* Decodes the DELIVER fixture after edit() changes one tensor; expects DH_EPARSE naming want. */
static void expect_tensor_fault(void (*edit)(dh_wire_tensor_t *t), size_t tensor,
                                const dh_wire_frame_t *frames, size_t n_frames, const char *want)
{
    dh_wire_tensor_t copy[DH_ARRAY_LEN(tensors)];
    memcpy(copy, tensors, sizeof copy);
    if (edit)
        edit(&copy[tensor]);
    dh_msg_t in = fixture(DH_MSG_DELIVER), out;
    in.deliver.tensors = copy;
    encoded_t e = encode(&in);
    int rc = decode_copy(e.header, 20, e.body, e.body_len, frames, n_frames, &out);
    if (rc != DH_EPARSE || !strstr(dh_last_error(), want))
        print_error("want '%s', got %d: %s\n", want, rc, dh_last_error());
    assert_int_equal(rc, DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), want));
    dh_free(e.body);
}

static void dtype_99(dh_wire_tensor_t *t)
{
    t->tensor.dtype = 99;
}
static void location_5(dh_wire_tensor_t *t)
{
    t->location = 5;
}
static void shape_overflow(dh_wire_tensor_t *t)
{
    t->tensor.shape[0] = INT64_MAX / 2;
    t->tensor.shape[1] = 4;
}
static void negative_stride(dh_wire_tensor_t *t)
{
    t->tensor.strides[0] = -12;
}
static void stride_too_long(dh_wire_tensor_t *t)
{
    t->tensor.strides[0] = 13;
}
static void stride_overflow(dh_wire_tensor_t *t)
{
    t->tensor.strides[0] = INT64_MAX;
}
static void shm_too_short(dh_wire_tensor_t *t)
{
    t->length = 39;
}
static void shm_wraps(dh_wire_tensor_t *t)
{
    t->offset = UINT64_MAX - 10;
}
static void bigger_shape(dh_wire_tensor_t *t)
{
    t->tensor.shape[0] = 3;
}

static void wire_rejects_bad_tensors(void **state)
{
    /* ndim 7 would read past DH_WIRE_MAX_NDIM: the encoder asserts, so poke the byte. */
    dh_msg_t in = fixture(DH_MSG_DELIVER), out;
    encoded_t e = encode(&in);
    /* client_id (4 + 8) seq 8 count 4, name (4 + 5), dtype: offset 33, ndim 34. */
    assert_int_equal(e.body[34], 3);
    e.body[34] = 7;
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, payload_frames, 2, &out),
                     DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "DELIVER: field 'tensors[0].ndim'"));
    assert_non_null(strstr(dh_last_error(), "at most 6"));
    dh_free(e.body);

    /* Strides travel in bytes: one that is not a whole number of elements is refused.
     * tensor 0 ends at 84, tensor 1 (shm) at 145; tensor 2's strides[0] at 145 + 8 + 3 + 16. */
    e = encode(&in);
    assert_int_equal(e.body[172], 12); /* mask f32 [2][3]: 3 elements = 12 bytes */
    e.body[172] = 13;
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, payload_frames, 2, &out),
                     DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "tensors[2].strides"));
    assert_non_null(strstr(dh_last_error(), "multiple of 4"));
    dh_free(e.body);

    expect_tensor_fault(dtype_99, 0, payload_frames, 2, "tensors[0].dtype");
    expect_tensor_fault(location_5, 0, payload_frames, 2, "tensors[0].location");
    expect_tensor_fault(shape_overflow, 2, payload_frames, 2, "tensors[2].shape");
    expect_tensor_fault(negative_stride, 0, payload_frames, 2, "tensors[0].strides");
    expect_tensor_fault(stride_too_long, 0, payload_frames, 2, "tensors[0].strides");
    expect_tensor_fault(stride_overflow, 0, payload_frames, 2, "tensors[0].strides");
    expect_tensor_fault(shm_too_short, 1, payload_frames, 2, "tensors[1].length");
    expect_tensor_fault(shm_wraps, 1, payload_frames, 2, "tensors[1].length");
    /* The shape product against the payload frame's size. */
    expect_tensor_fault(bigger_shape, 0, payload_frames, 2, "tensors[0].shape");
    dh_wire_frame_t short_frames[2] = {{video_bytes, sizeof video_bytes - 1}, payload_frames[1]};
    expect_tensor_fault(NULL, 0, short_frames, 2, "payload frame 0 has 23");
}

static void wire_rejects_bad_values(void **state)
{
    dh_msg_t in, out;
    encoded_t e;

    in = fixture(DH_MSG_HEARTBEAT);
    in.heartbeat.speed_factor = NAN;
    e = encode(&in);
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "HEARTBEAT: field 'speed_factor'"));
    dh_free(e.body);

    in = fixture(DH_MSG_HEARTBEAT);
    in.heartbeat.links[1].bytes_per_s = -1.0;
    e = encode(&in);
    in.heartbeat.links[1].bytes_per_s = 0.0;
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "links[1].bytes_per_s"));
    dh_free(e.body);

    in = fixture(DH_MSG_COMPLETE);
    in.complete.cpu_s = INFINITY;
    e = encode(&in);
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "cpu_s"));
    dh_free(e.body);

    in = fixture(DH_MSG_COMPLETE);
    dh_wire_sample_status_t bad_status[1] = {{5, (char *)"", 0, 0, 0}};
    in.complete.samples = bad_status;
    in.complete.n_samples = 1;
    e = encode(&in);
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "samples[0].status"));
    dh_free(e.body);

    in = fixture(DH_MSG_HELLO);
    in.hello.role = 3;
    e = encode(&in);
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "HELLO: field 'role'"));
    dh_free(e.body);

    in = fixture(DH_MSG_REQUEST);
    dh_wire_sample_t neg[1] = {{(char *)"a", 1, 1, 1, (char *)"u", (char *)"k", 0.1, 1, 1, -5, 0}};
    in.request.samples = neg;
    in.request.n_samples = 1;
    e = encode(&in);
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "REQUEST: field 'samples[0].tokens'"));
    dh_free(e.body);

    in = fixture(DH_MSG_COMPLETE);
    in.complete.delivered = 2;
    e = encode(&in);
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "COMPLETE: field 'delivered'"));
    dh_free(e.body);

    /* a sample's fetch seconds are finite and >= 0, as every f64 (wire version 6) */
    dh_wire_sample_status_t bad_fetch[1] = {{0, (char *)"", 0.5, -0.25, 100}};
    in = fixture(DH_MSG_COMPLETE);
    in.complete.samples = bad_fetch;
    in.complete.n_samples = 1;
    e = encode(&in);
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "COMPLETE: field 'samples[0].fetch_s'"));
    dh_free(e.body);

    dh_wire_sample_result_t bad_results[3][1] = {{{(char *)"a", -1, 0, (char *)"", 0, 0, 0}},
                                                 {{(char *)"a", 0, 3, (char *)"x", 0, 0, 0}},
                                                 {{(char *)"a", 0, 0, (char *)"", 0, NAN, 7}}};
    const char *const bad_field[3] = {"samples[0].tokens", "samples[0].status",
                                      "samples[0].fetch_s"};
    for (int k = 0; k < 3; k++) {
        in = fixture(DH_MSG_DELIVER);
        in.deliver.samples = bad_results[k];
        in.deliver.n_samples = 1;
        e = encode(&in);
        assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, payload_frames,
                                     DH_ARRAY_LEN(payload_frames), &out),
                         DH_EPARSE);
        assert_non_null(strstr(dh_last_error(), bad_field[k]));
        dh_free(e.body);
    }

    in = fixture(DH_MSG_ERROR);
    in.error.code = 0;
    e = encode(&in);
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "ERROR: field 'code'"));
    dh_free(e.body);

    /* A NUL inside a string. */
    in = fixture(DH_MSG_HELLO);
    e = encode(&in);
    e.body[1 + 4 + 3] = 0; /* role, length, "cpu" */
    assert_int_equal(decode_copy(e.header, 20, e.body, e.body_len, NULL, 0, &out), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "HELLO: field 'node'"));
    assert_non_null(strstr(dh_last_error(), "NUL"));
    dh_free(e.body);
}

/* ---- fuzzing ---- */

/* Checks a message the decoder accepted: it must be one we could have sent (re-encoding
 * gives the same bytes, and decoding those gives an equal message). */
static void check_accepted(const dh_msg_t *m, const uint8_t *body, size_t body_len,
                           const dh_wire_frame_t *frames, size_t n_frames)
{
    encoded_t again = encode(m);
    assert_int_equal(again.body_len, body_len);
    if (body_len)
        assert_memory_equal(again.body, body, body_len);
    dh_msg_t twice;
    assert_int_equal(
        dh_wire_decode(again.header, 20, again.body, again.body_len, frames, n_frames, &twice), 0);
    assert_msg_equal(m, &twice);
    dh_msg_clear(&twice);
    dh_free(again.body);
}

static void wire_survives_random_mutations(void **state)
{
    long live = dh_alloc_live();
    encoded_t corpus[DH_MSG_TYPE_MAX];
    for (unsigned t = 1; t <= DH_MSG_TYPE_MAX; t++) {
        dh_msg_t m = fixture(t);
        corpus[t - 1] = encode(&m);
    }
    dh_rng_t rng;
    dh_rng_seed(&rng, 20240607);
    long accepted = 0, rejected = 0;
    const int iterations = 20000;
    for (int it = 0; it < iterations; it++) {
        const encoded_t *src = &corpus[dh_rng_below(&rng, DH_MSG_TYPE_MAX)];
        uint8_t header[DH_WIRE_HEADER_SIZE];
        memcpy(header, src->header, sizeof header);
        size_t len = src->body_len;
        size_t cap = len + 64;
        uint8_t *body = dh_malloc(cap);
        assert_non_null(body);
        if (len)
            memcpy(body, src->body, len);
        unsigned edits = 1 + (unsigned)dh_rng_below(&rng, 6);
        for (unsigned k = 0; k < edits; k++) {
            switch (dh_rng_below(&rng, 7)) {
            case 0: /* flip a bit */
                if (len)
                    body[dh_rng_below(&rng, len)] ^= (uint8_t)(1u << dh_rng_below(&rng, 8));
                break;
            case 1: /* a random byte */
                if (len)
                    body[dh_rng_below(&rng, len)] = (uint8_t)dh_rng_next(&rng);
                break;
            case 2: /* truncate */
                len = len ? dh_rng_below(&rng, len) : 0;
                break;
            case 3: /* append random bytes */
                for (size_t n = dh_rng_below(&rng, 9); n > 0 && len < cap; n--)
                    body[len++] = (uint8_t)dh_rng_next(&rng);
                break;
            case 4: /* an extreme 32-bit value where a count or length may be */
                if (len >= 4) {
                    static const uint32_t extremes[] = {0,           1,  0x7fffffff, 0x80000000u,
                                                        0xffffffffu, 64, 255};
                    poke_u32(body, dh_rng_below(&rng, len - 3),
                             extremes[dh_rng_below(&rng, DH_ARRAY_LEN(extremes))]);
                }
                break;
            case 5: /* a header bit (sometimes version, type or magic) */
                header[dh_rng_below(&rng, 8)] ^= (uint8_t)(1u << dh_rng_below(&rng, 8));
                break;
            default: /* a different type over the same body */
                header[6] = (uint8_t)(1 + dh_rng_below(&rng, DH_MSG_TYPE_MAX));
                break;
            }
        }
        /* Mostly keep the header's length in step, so the body parser meets the mutation. */
        if (dh_rng_below(&rng, 8) != 0)
            set_body_len(header, (uint32_t)len);
        /* Payload frames: usually the right ones, sometimes fewer, more or resized. */
        dh_wire_frame_t frames[3] = {payload_frames[0], payload_frames[1], payload_frames[1]};
        size_t n_frames = header[6] == DH_MSG_DELIVER ? 2 : 0;
        if (dh_rng_below(&rng, 16) == 0)
            n_frames = dh_rng_below(&rng, 4);
        if (dh_rng_below(&rng, 16) == 0)
            frames[0].size = dh_rng_below(&rng, sizeof video_bytes + 1);

        dh_msg_t out;
        int rc = decode_copy(header, sizeof header, body, len, frames, n_frames, &out);
        if (rc != 0 && rc != DH_EPARSE)
            print_error("iteration %d: rc %d (%s)\n", it, rc, dh_last_error());
        assert_true(rc == 0 || rc == DH_EPARSE);
        if (rc == 0) {
            accepted++;
            check_accepted(&out, body, len, frames, n_frames);
            dh_msg_clear(&out);
        } else {
            rejected++;
            assert_int_equal(out.type, 0);
            assert_true(strlen(dh_last_error()) > 0);
        }
        dh_free(body);
    }
    for (unsigned t = 0; t < DH_MSG_TYPE_MAX; t++)
        dh_free(corpus[t].body);
    assert_int_equal(dh_alloc_live(), live);
    print_message("%ld mutations accepted, %ld rejected\n", accepted, rejected);
    /* Both outcomes happen, so the loop exercises the parser and not only the header check. */
    assert_true(accepted > 100);
    assert_true(rejected > iterations / 2);
}

/* ---- allocation failures ---- */

static int encode_and_decode_all(void *ctx)
{
    for (unsigned t = 1; t <= DH_MSG_TYPE_MAX; t++) {
        dh_msg_t in = fixture(t), out;
        uint8_t header[DH_WIRE_HEADER_SIZE];
        uint8_t *body;
        size_t len;
        int rc = dh_wire_encode(&in, header, &body, &len);
        if (rc)
            return rc;
        rc = dh_wire_decode(header, sizeof header, body, len, payload_frames, fixture_payloads(t),
                            &out);
        dh_free(body);
        if (rc) {
            assert_int_equal(out.type, 0);
            return rc;
        }
        assert_msg_equal(&in, &out);
        dh_msg_clear(&out);
    }
    return 0;
}

static void wire_survives_each_allocation_failure(void **state)
{
    /* 8 bodies + every string and array of the fixtures. */
    assert_true(dh_test_each_allocation_failure(encode_and_decode_all, NULL) > 30);
}

static void wire_names_types_and_dtypes(void **state)
{
    assert_string_equal(dh_msg_type_name(DH_MSG_DELIVER), "DELIVER");
    assert_string_equal(dh_msg_type_name(0), "type?");
    assert_string_equal(dh_msg_type_name(99), "type?");
    assert_int_equal(dh_dtype_size(DH_DTYPE_BFLOAT16), 2);
    assert_int_equal(dh_dtype_size(DH_DTYPE_FLOAT64), 8);
    assert_int_equal(dh_dtype_size(0), 0);
    assert_int_equal(dh_dtype_size(14), 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(wire_round_trips_hello),
    cmocka_unit_test(wire_round_trips_heartbeat),
    cmocka_unit_test(wire_round_trips_request),
    cmocka_unit_test(wire_round_trips_dispatch),
    cmocka_unit_test(wire_round_trips_complete),
    cmocka_unit_test(wire_round_trips_error_and_goodbye),
    cmocka_unit_test(wire_round_trips_deliver_with_payloads),
    cmocka_unit_test(wire_round_trips_packets),
    cmocka_unit_test(wire_bodies_keep_their_bytes),
    cmocka_unit_test(wire_header_layout_is_little_endian),
    cmocka_unit_test(wire_refuses_another_version),
    cmocka_unit_test(wire_rejects_bad_headers),
    cmocka_unit_test(wire_rejects_truncation_at_every_byte),
    cmocka_unit_test(wire_rejects_trailing_bytes),
    cmocka_unit_test(wire_rejects_huge_counts_and_lengths),
    cmocka_unit_test(wire_rejects_bad_tensors),
    cmocka_unit_test(wire_rejects_bad_values),
    cmocka_unit_test(wire_survives_random_mutations),
    cmocka_unit_test(wire_survives_each_allocation_failure),
    cmocka_unit_test(wire_names_types_and_dtypes),
};
DH_TEST_MAIN(tests)
