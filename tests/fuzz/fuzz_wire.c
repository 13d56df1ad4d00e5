/* fuzz_wire.c: the wire codec's validating decoder (src/wire/codec.c, its reader in
 * codec_values.c) on untrusted frames.
 *
 * Input layout (tests/fuzz/gen_wire_corpus.c writes the seeds this way):
 *
 *   u8 k (the low 2 bits: 0..3 payload frames) | 20-byte header | body | k x (u16 LE length,
 *   that many bytes: a payload frame)
 *
 * The body is as long as the header's body_len says, cut at the end of the input; a short
 * input is decoded with what there is. Each frame is exactly sized (its own allocation), so
 * ASan sees a read one past its end. Checked on an accepted message: encoding it again gives
 * the same header and body bytes (the decoder takes exactly what the encoder writes), and
 * with no payload frames the packet form decodes alike.
 */
#include <string.h>

#include "fuzz.h"
#include "datahelix/alloc.h"
#include "datahelix/wire.h"

/* An exact-size heap copy of [p, p+n): ASan then bounds every read of the frame. */
static uint8_t *frame_copy(const uint8_t *p, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1);
    FUZZ_CHECK(copy);
    if (n)
        memcpy(copy, p, n);
    return copy;
}

static uint32_t read_le(const uint8_t *p, int bytes)
{
    uint32_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void check_reencodes(const dh_msg_t *msg, const uint8_t *header, const uint8_t *body,
                            size_t body_len)
{
    uint8_t header2[DH_WIRE_HEADER_SIZE];
    uint8_t *body2 = NULL;
    size_t body2_len = 0;
    FUZZ_CHECK(dh_wire_encode(msg, header2, &body2, &body2_len) == 0);
    FUZZ_CHECK(memcmp(header2, header, DH_WIRE_HEADER_SIZE) == 0);
    FUZZ_CHECK(body2_len == body_len);
    FUZZ_CHECK(body_len == 0 || memcmp(body2, body, body_len) == 0);
    dh_free(body2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t k = data[0] & 3;
    const uint8_t *p = data + 1, *end = data + size;
    size_t header_len =
        (size_t)(end - p) < DH_WIRE_HEADER_SIZE ? (size_t)(end - p) : DH_WIRE_HEADER_SIZE;
    uint8_t *header = frame_copy(p, header_len);
    p += header_len;
    size_t body_len = header_len == DH_WIRE_HEADER_SIZE ? read_le(header + 8, 4) : 0;
    if (body_len > (size_t)(end - p))
        body_len = (size_t)(end - p);
    uint8_t *body = frame_copy(p, body_len);
    p += body_len;
    dh_wire_frame_t frames[3];
    uint8_t *frame_data[3] = {NULL, NULL, NULL};
    for (size_t i = 0; i < k; i++) {
        size_t n = end - p >= 2 ? read_le(p, 2) : 0;
        p += end - p >= 2 ? 2 : end - p;
        if (n > (size_t)(end - p))
            n = (size_t)(end - p);
        frame_data[i] = frame_copy(p, n);
        frames[i] = (dh_wire_frame_t){frame_data[i], n};
        p += n;
    }

    dh_msg_t msg;
    int rc = dh_wire_decode(header, header_len, body, body_len, frames, k, &msg);
    if (rc == 0) {
        check_reencodes(&msg, header, body, body_len);
        dh_msg_clear(&msg);
    } else {
        /* A refused message owns nothing and is zeroed (wire.h). */
        dh_msg_t zero;
        memset(&zero, 0, sizeof zero);
        FUZZ_CHECK(memcmp(&msg, &zero, sizeof msg) == 0);
    }

    if (k == 0) { /* the packet form: header and body in one buffer */
        uint8_t *packet = malloc(header_len + body_len + 1);
        FUZZ_CHECK(packet);
        memcpy(packet, header, header_len);
        if (body_len)
            memcpy(packet + header_len, body, body_len);
        dh_msg_t from_packet;
        int packet_rc = dh_wire_decode_packet(packet, header_len + body_len, &from_packet);
        FUZZ_CHECK(packet_rc == rc);
        if (packet_rc == 0) {
            uint8_t *again = NULL;
            size_t again_len = 0;
            FUZZ_CHECK(dh_wire_encode_packet(&from_packet, &again, &again_len) == 0);
            FUZZ_CHECK(again_len == header_len + body_len);
            FUZZ_CHECK(memcmp(again, packet, again_len) == 0);
            dh_free(again);
            dh_msg_clear(&from_packet);
        }
        free(packet);
    }

    for (size_t i = 0; i < k; i++)
        free(frame_data[i]);
    free(body);
    free(header);
    return 0;
}
