/* Tests of synthetic video data sets (src/synth/) and of the `datahelix synth`
 * command (run through $DH_CLI). Clips are decoded back with libavformat/libavcodec here,
 * independently of the library's own decode pipeline. Clips are small (64x64 to 160x128,
 * under a second) so the whole file runs in a few seconds. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libswscale/swscale.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/synth.h"

/* ---- helpers ------------------------------------------------------------------------ */

#define DH_ARRAY_LEN_TEST(a) (sizeof(a) / sizeof((a)[0]))

/* A path in this process's scratch directory, the caller's to free. */
static char *scratch(const char *name)
{
    char *p = strdup(dh_test_path(name));
    assert_non_null(p);
    return p;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static char *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s: %s", path, strerror(errno));
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    if (size)
        *size = (size_t)n;
    return buf;
}

static void write_clip_ok(const char *path, const dh_synth_clip_t *clip)
{
    int rc = dh_synth_write_clip(path, clip);
    if (rc != 0)
        print_error("dh_synth_write_clip(%s): %s (%s)\n", path, dh_err_name(rc), dh_last_error());
    assert_int_equal(rc, 0);
}

/* What a clip file says about itself, and what decoding all of it finds. */
typedef struct clip_info {
    enum AVCodecID codec;
    int width, height;
    int64_t nb_frames; /* as the container records it */
    double fps;        /* avg_frame_rate */
    int64_t decoded;   /* frames decoded */
    int64_t misread;   /* decoded frames whose drawn index was not their position */
    int64_t keyframes; /* decoded keyframes */
    int64_t off_grid;  /* keyframes not at a multiple of gop */
} clip_info_t;

/* Opens the clip with libavformat and decodes every frame in order, converting each to
 * RGB24 and reading its index back. gop > 0 also checks where the keyframes fall. */
static clip_info_t decode_clip(const char *path, int gop)
{
    clip_info_t info = {0};
    AVFormatContext *fmt = NULL;
    int rc = avformat_open_input(&fmt, path, NULL, NULL);
    if (rc < 0)
        fail_msg("avformat_open_input(%s): %s", path, av_err2str(rc));
    assert_true(avformat_find_stream_info(fmt, NULL) >= 0);
    int si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    assert_true(si >= 0);
    AVStream *st = fmt->streams[si];
    info.codec = st->codecpar->codec_id;
    info.width = st->codecpar->width;
    info.height = st->codecpar->height;
    info.nb_frames = st->nb_frames;
    info.fps = av_q2d(st->avg_frame_rate);

    const AVCodec *dec = avcodec_find_decoder(st->codecpar->codec_id);
    assert_non_null(dec);
    AVCodecContext *c = avcodec_alloc_context3(dec);
    assert_non_null(c);
    assert_true(avcodec_parameters_to_context(c, st->codecpar) >= 0);
    c->thread_count = 1;
    assert_true(avcodec_open2(c, dec, NULL) >= 0);
    AVPacket *pkt = av_packet_alloc();
    AVFrame *frame = av_frame_alloc();
    uint8_t *rgb = malloc((size_t)info.width * info.height * 3);
    assert_true(pkt && frame && rgb);
    struct SwsContext *sws = NULL;
    bool flushing = false;
    for (;;) {
        if (!flushing) {
            rc = av_read_frame(fmt, pkt);
            if (rc == AVERROR_EOF) {
                flushing = true;
                assert_true(avcodec_send_packet(c, NULL) >= 0);
            } else {
                assert_true(rc >= 0);
                if (pkt->stream_index == si)
                    assert_true(avcodec_send_packet(c, pkt) >= 0);
                av_packet_unref(pkt);
            }
        }
        for (;;) {
            rc = avcodec_receive_frame(c, frame);
            if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF)
                break;
            assert_true(rc >= 0);
            sws = sws_getCachedContext(sws, frame->width, frame->height, frame->format, info.width,
                                       info.height, AV_PIX_FMT_RGB24, SWS_POINT, NULL, NULL, NULL);
            assert_non_null(sws);
            uint8_t *dst[1] = {rgb};
            int dst_stride[1] = {info.width * 3};
            sws_scale(sws, (const uint8_t *const *)frame->data, frame->linesize, 0, frame->height,
                      dst, dst_stride);
            int64_t got = dh_synth_frame_index(rgb, info.width, info.height);
            if (got != info.decoded) {
                if (info.misread < 5)
                    print_error("%s: frame %lld reads as %lld\n", path, (long long)info.decoded,
                                (long long)got);
                info.misread++;
            }
            if (frame->key_frame) {
                info.keyframes++;
                if (gop > 0 && info.decoded % gop != 0)
                    info.off_grid++;
            }
            info.decoded++;
            av_frame_unref(frame);
        }
        if (flushing && rc == AVERROR_EOF)
            break;
    }
    sws_freeContext(sws);
    free(rgb);
    av_frame_free(&frame);
    av_packet_free(&pkt);
    avcodec_free_context(&c);
    avformat_close_input(&fmt);
    return info;
}

/* Counts pixels (outside the top `skip_rows`) whose RGB differ between two frames. */
static size_t pixels_differing(const uint8_t *a, const uint8_t *b, int width, int height,
                               int skip_rows)
{
    size_t n = 0;
    for (size_t i = (size_t)skip_rows * width; i < (size_t)width * height; i++)
        n += memcmp(a + 3 * i, b + 3 * i, 3) != 0;
    return n;
}

/* A small two-entry mix for data-set tests: square 64 and an odd 97x65 (encoded 98x66). */
static const dh_mix_entry_t small_entries[] = {
    {4, 64, 64, 0.5, 10.0, 1.0},
    {8, 65, 97, 0.4, 15.0, 2.0},
};
static const dh_mix_t small_mix = {(char *)"small-test", (dh_mix_entry_t *)small_entries, 2};

static void dataset_ok(const char *dir, const dh_mix_t *mix, size_t count, uint64_t seed,
                       unsigned jobs)
{
    int rc = dh_synth_dataset(dir, mix, count, seed, jobs, NULL, NULL);
    if (rc != 0)
        print_error("dh_synth_dataset(%s): %s (%s)\n", dir, dh_err_name(rc), dh_last_error());
    assert_int_equal(rc, 0);
}

static char *child_path(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    assert_non_null(p);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* ---- clips -------------------------------------------------------------------------- */

static void clip_is_h264_mp4_with_its_size_frames_and_rate(void **state)
{
    char *path = scratch("shape.mp4");
    dh_synth_clip_t clip = {.width = 160, .height = 128, .fps = 12, .duration_s = 1.0, .seed = 1};
    write_clip_ok(path, &clip);
    clip_info_t info = decode_clip(path, 0);
    assert_int_equal(info.codec, AV_CODEC_ID_H264);
    assert_int_equal(info.width, 160);
    assert_int_equal(info.height, 128);
    assert_in_range(info.nb_frames, 11, 13);
    assert_int_equal(info.decoded, 12);
    assert_close(info.fps, 12.0, 1e-6);
    /* No .part file is left beside it. */
    char part[1024];
    snprintf(part, sizeof part, "%s.part", path);
    assert_false(exists(part));
    free(path);
}

static void clip_keeps_a_fractional_frame_rate(void **state)
{
    char *path = scratch("ntsc.mp4");
    dh_synth_clip_t clip = {
        .width = 64, .height = 64, .fps = 30000.0 / 1001, .duration_s = 0.5, .seed = 2};
    write_clip_ok(path, &clip);
    clip_info_t info = decode_clip(path, 0);
    assert_close(info.fps, 29.97, 0.001);
    assert_int_equal(info.decoded, 15); /* round(0.5 x 29.97) */
    free(path);
}

static void every_decoded_frame_reads_back_its_own_index(void **state)
{
    /* 128 wide: one row of 16 cells of 8 pixels, the narrowest single-row layout; 64 wide:
     * two rows of 8; 160x128: cells of 10. */
    static const int32_t sizes[][2] = {{128, 96}, {64, 64}, {160, 128}};
    for (size_t s = 0; s < 3; s++) {
        char name[32];
        snprintf(name, sizeof name, "index%zu.mp4", s);
        char *path = scratch(name);
        dh_synth_clip_t clip = {.width = sizes[s][0],
                                .height = sizes[s][1],
                                .fps = 25,
                                .duration_s = 1.2,
                                .seed = 100 + s};
        write_clip_ok(path, &clip);
        clip_info_t info = decode_clip(path, 0);
        assert_int_equal(info.decoded, 30);
        assert_int_equal(info.misread, 0);
        free(path);
    }
}

static void keyframes_fall_every_gop_frames(void **state)
{
    char *path = scratch("gop.mp4");
    dh_synth_clip_t clip = {
        .width = 64, .height = 64, .fps = 10, .duration_s = 2.0, .gop = 5, .seed = 3};
    write_clip_ok(path, &clip);
    clip_info_t info = decode_clip(path, 5);
    assert_int_equal(info.decoded, 20);
    assert_int_equal(info.keyframes, 4);
    assert_int_equal(info.off_grid, 0);
    /* gop 0 means 2 seconds' worth: 20 frames at 10 fps, so one keyframe in 2 s... */
    dh_synth_clip_t two_s = clip;
    two_s.gop = 0;
    two_s.duration_s = 3.0;
    write_clip_ok(path, &two_s);
    info = decode_clip(path, 20);
    assert_int_equal(info.keyframes, 2); /* ...frames 0 and 20 of 30 */
    assert_int_equal(info.off_grid, 0);
    free(path);
}

static void frame_rgb_is_deterministic_for_seed_and_index(void **state)
{
    dh_synth_clip_t clip = {.width = 160, .height = 128, .fps = 30, .duration_s = 1, .seed = 9};
    size_t size = 160 * 128 * 3;
    uint8_t *a = malloc(size), *b = malloc(size);
    assert_true(a && b);
    memset(b, 0x5a, size);
    dh_synth_frame_rgb(&clip, 17, a);
    dh_synth_frame_rgb(&clip, 17, b);
    assert_memory_equal(a, b, size);
    /* Another seed is another scene. */
    dh_synth_clip_t other = clip;
    other.seed = 10;
    dh_synth_frame_rgb(&other, 17, b);
    assert_true(pixels_differing(a, b, 160, 128, 16) > 160 * 112 / 2);
    free(a);
    free(b);
}

static void frame_rgb_moves_and_is_textured(void **state)
{
    dh_synth_clip_t clip = {.width = 160, .height = 128, .fps = 30, .duration_s = 1, .seed = 4};
    size_t size = 160 * 128 * 3;
    uint8_t *a = malloc(size), *b = malloc(size);
    assert_true(a && b);
    dh_synth_frame_rgb(&clip, 0, a);
    dh_synth_frame_rgb(&clip, 1, b);
    /* Consecutive frames: most pixels below the code band change (the texture moves). */
    size_t moved = pixels_differing(a, b, 160, 128, 16);
    if (moved < 160 * 112 / 2)
        print_error("only %zu of %d pixels changed between frames 0 and 1\n", moved, 160 * 112);
    assert_true(moved >= 160 * 112 / 2);
    /* Textured: neighbouring pixels differ on average (by 2 to 6 levels over seeds 0..7,
     * depending on the palette's contrast; a flat frame or a smooth gradient is under 1). */
    double grad = 0;
    for (int y = 16; y < 128; y++)
        for (int x = 1; x < 160; x++)
            for (int c = 0; c < 3; c++)
                grad += abs(a[(y * 160 + x) * 3 + c] - a[(y * 160 + x - 1) * 3 + c]);
    grad /= 112.0 * 159 * 3;
    if (grad < 1.5)
        print_error("mean horizontal gradient %.2f\n", grad);
    assert_true(grad >= 1.5);
    free(a);
    free(b);
}

static void frame_index_reads_uncompressed_codes_at_every_layout(void **state)
{
    static const int32_t sizes[][2] = {{64, 32},  {100, 48},  {127, 64},
                                       {128, 16}, {224, 224}, {1280, 720}};
    static const int64_t indices[] = {0, 1, 2, 255, 12345, 65535};
    for (size_t s = 0; s < DH_ARRAY_LEN_TEST(sizes); s++) {
        dh_synth_clip_t clip = {
            .width = sizes[s][0], .height = sizes[s][1], .fps = 30, .duration_s = 1, .seed = s};
        uint8_t *rgb = malloc((size_t)clip.width * clip.height * 3);
        assert_non_null(rgb);
        for (size_t k = 0; k < DH_ARRAY_LEN_TEST(indices); k++) {
            dh_synth_frame_rgb(&clip, indices[k], rgb);
            int64_t got = dh_synth_frame_index(rgb, clip.width, clip.height);
            if (got != indices[k])
                print_error("%dx%d: index %lld reads as %lld\n", (int)clip.width, (int)clip.height,
                            (long long)indices[k], (long long)got);
            assert_int_equal(got, indices[k]);
        }
        free(rgb);
    }
}

static void frame_index_is_minus_one_without_a_code(void **state)
{
    uint8_t *rgb = malloc(160 * 128 * 3);
    assert_non_null(rgb);
    memset(rgb, 128, 160 * 128 * 3); /* flat grey */
    assert_int_equal(dh_synth_frame_index(rgb, 160, 128), -1);
    memset(rgb, 255, 160 * 128 * 3); /* all white: bits and complements agree */
    assert_int_equal(dh_synth_frame_index(rgb, 160, 128), -1);
    for (size_t i = 0; i < 160 * 128 * 3; i++) /* noise */
        rgb[i] = (uint8_t)((i * 2654435761u) >> 24);
    assert_int_equal(dh_synth_frame_index(rgb, 160, 128), -1);
    /* A coded frame read at a size with no room for the code. */
    dh_synth_clip_t clip = {.width = 160, .height = 128, .fps = 30, .duration_s = 1, .seed = 1};
    dh_synth_frame_rgb(&clip, 7, rgb);
    assert_int_equal(dh_synth_frame_index(rgb, 160, 128), 7);
    assert_int_equal(dh_synth_frame_index(rgb, 48, 128), -1); /* narrower than 64 */
    assert_int_equal(dh_synth_frame_index(rgb, 128, 8), -1);  /* lower than the band */
    assert_int_equal(dh_synth_frame_index(NULL, 160, 128), -1);
    free(rgb);
}

static void write_clip_rejects_bad_input_naming_the_path(void **state)
{
    char *path = scratch("bad.mp4");
    const dh_synth_clip_t good = {.width = 64, .height = 64, .fps = 10, .duration_s = 0.5};
    dh_synth_clip_t bad[8];
    for (size_t i = 0; i < 8; i++)
        bad[i] = good;
    bad[0].width = 65;            /* odd */
    bad[1].height = 0;            /* zero */
    bad[2].width = 8;             /* too small */
    bad[3].fps = 0;               /* no rate */
    bad[4].fps = NAN;             /* not a number */
    bad[5].duration_s = 0;        /* no frames */
    bad[6].duration_s = INFINITY; /* endless */
    bad[7].gop = -1;
    for (size_t i = 0; i < 8; i++) {
        dh_clear_error();
        int rc = dh_synth_write_clip(path, &bad[i]);
        if (rc != DH_EINVAL)
            print_error("case %zu: %s (%s)\n", i, dh_err_name(rc), dh_last_error());
        assert_int_equal(rc, DH_EINVAL);
        assert_non_null(strstr(dh_last_error(), path));
        assert_false(exists(path));
    }
    free(path);
}

static void write_clip_into_a_missing_directory_fails_naming_the_path(void **state)
{
    /* Root ignores permission bits, so "unwritable" is a path under a regular file (ENOTDIR)
     * or under a directory that does not exist (ENOENT). */
    char *file = scratch("plain-file");
    dh_test_write_file(file, "not a directory\n");
    char *under_file = child_path(file, "clip.mp4");
    char *missing = scratch("no-such-dir/clip.mp4");
    const dh_synth_clip_t clip = {.width = 64, .height = 64, .fps = 10, .duration_s = 0.5};

    int rc = dh_synth_write_clip(under_file, &clip);
    assert_int_equal(rc, -ENOTDIR);
    assert_non_null(strstr(dh_last_error(), under_file));
    rc = dh_synth_write_clip(missing, &clip);
    assert_int_equal(rc, -ENOENT);
    assert_non_null(strstr(dh_last_error(), missing));
    assert_non_null(strstr(dh_last_error(), "No such file or directory")); /* FFmpeg's words */
    free(file);
    free(under_file);
    free(missing);
}

typedef struct alloc_case {
    const char *path;
    dh_synth_clip_t clip;
} alloc_case_t;

static int write_small_clip(void *ctx)
{
    alloc_case_t *ac = ctx;
    unlink(ac->path);
    int rc = dh_synth_write_clip(ac->path, &ac->clip);
    /* A failed write leaves nothing under the real name. */
    if (rc < 0)
        assert_false(exists(ac->path));
    return rc;
}

static void write_clip_survives_each_allocation_failure(void **state)
{
    char *path = scratch("alloc.mp4");
    alloc_case_t ac = {path, {.width = 64, .height = 64, .fps = 10, .duration_s = 0.3}};
    long made = dh_test_each_allocation_failure(write_small_clip, &ac);
    assert_true(made >= 2); /* the .part name and the RGB frame */
    clip_info_t info = decode_clip(path, 0);
    assert_int_equal(info.decoded, 3);
    free(path);
}

/* ---- data sets ---------------------------------------------------------------------- */

static void dataset_is_the_same_for_one_and_two_jobs(void **state)
{
    char *one = scratch("jobs1"), *two = scratch("jobs2");
    dataset_ok(one, &small_mix, 6, 77, 1);
    dataset_ok(two, &small_mix, 6, 77, 2);
    char *m1 = child_path(one, "manifest.jsonl"), *m2 = child_path(two, "manifest.jsonl");
    size_t n1, n2;
    char *a = read_all(m1, &n1), *b = read_all(m2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a);
    free(b);
    for (size_t i = 0; i < 6; i++) {
        char name[64];
        snprintf(name, sizeof name, "clips/v%07zu.mp4", i);
        char *p1 = child_path(one, name), *p2 = child_path(two, name);
        a = read_all(p1, &n1);
        b = read_all(p2, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(a, b, n1);
        free(a);
        free(b);
        free(p1);
        free(p2);
    }
    /* Another seed gives another manifest. */
    dataset_ok(two, &small_mix, 6, 78, 2);
    b = read_all(m2, &n2);
    a = read_all(m1, &n1);
    assert_true(n1 != n2 || memcmp(a, b, n1) != 0);
    free(a);
    free(b);
    free(m1);
    free(m2);
    free(one);
    free(two);
}

static void dataset_manifest_lines_are_json_with_the_fields(void **state)
{
    char *dir = scratch("manifest");
    dataset_ok(dir, &small_mix, 8, 5, 0);
    char *manifest = child_path(dir, "manifest.jsonl");
    FILE *f = fopen(manifest, "r");
    assert_non_null(f);
    char line[1024];
    size_t n = 0, per_entry[2] = {0, 0};
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *row = json_loads(line, 0, &err);
        if (!row)
            fail_msg("line %zu: %s: %s", n + 1, err.text, line);
        char want_id[16], want_path[32];
        snprintf(want_id, sizeof want_id, "v%07zu", n);
        snprintf(want_path, sizeof want_path, "clips/v%07zu.mp4", n);
        assert_int_equal(json_object_size(row), 6);
        assert_string_equal(json_string_value(json_object_get(row, "id")), want_id);
        assert_string_equal(json_string_value(json_object_get(row, "path")), want_path);
        const char *caption = json_string_value(json_object_get(row, "caption"));
        assert_non_null(caption);
        assert_true(strlen(caption) > 10);
        json_int_t frames = json_integer_value(json_object_get(row, "frames"));
        json_int_t height = json_integer_value(json_object_get(row, "height"));
        json_int_t width = json_integer_value(json_object_get(row, "width"));
        /* The sampling plan is the entry's, as written in the mix (not rounded). */
        size_t e = frames == 4 ? 0 : 1;
        assert_int_equal(frames, small_entries[e].frames);
        assert_int_equal(height, small_entries[e].height);
        assert_int_equal(width, small_entries[e].width);
        per_entry[e]++;
        /* The clip exists and has the entry's size rounded to even, and a duration within
         * the +-20% jitter. */
        char *clip = child_path(dir, want_path);
        clip_info_t info = decode_clip(clip, 0);
        assert_int_equal(info.width, (small_entries[e].width + 1) / 2 * 2);
        assert_int_equal(info.height, (small_entries[e].height + 1) / 2 * 2);
        assert_close(info.fps, small_entries[e].fps, 1e-6);
        double duration = (double)info.decoded / small_entries[e].fps;
        assert_true(duration >= 0.8 * small_entries[e].duration_s - 1 / small_entries[e].fps);
        assert_true(duration <= 1.2 * small_entries[e].duration_s + 1 / small_entries[e].fps);
        free(clip);
        json_decref(row);
        n++;
    }
    fclose(f);
    assert_int_equal(n, 8);
    assert_true(per_entry[0] > 0 && per_entry[1] > 0); /* 8 draws at 1:2 */
    free(manifest);
    free(dir);
}

static void dataset_of_fewer_clips_is_a_prefix(void **state)
{
    char *small = scratch("prefix2"), *large = scratch("prefix5");
    dataset_ok(small, &small_mix, 2, 11, 1);
    dataset_ok(large, &small_mix, 5, 11, 2);
    char *ms = child_path(small, "manifest.jsonl"), *ml = child_path(large, "manifest.jsonl");
    size_t ns, nl;
    char *a = read_all(ms, &ns), *b = read_all(ml, &nl);
    assert_true(ns < nl);
    assert_memory_equal(a, b, ns);
    free(a);
    free(b);
    free(ms);
    free(ml);
    free(small);
    free(large);
}

typedef struct progress_log {
    pthread_t caller;
    size_t calls, last_done, total;
    bool in_order, on_caller;
} progress_log_t;

static void record_progress(size_t done, size_t total, void *ctx)
{
    progress_log_t *log = ctx;
    log->in_order = log->in_order && done == log->last_done + 1;
    log->on_caller = log->on_caller && pthread_equal(pthread_self(), log->caller);
    log->last_done = done;
    log->total = total;
    log->calls++;
}

static void dataset_reports_progress_on_the_calling_thread(void **state)
{
    char *dir = scratch("progress");
    progress_log_t log = {.caller = pthread_self(), .in_order = true, .on_caller = true};
    dh_synth_totals_t totals;
    int rc = dh_synth_dataset_write(dir, &small_mix, 5, 3, 2, record_progress, &log, &totals);
    assert_int_equal(rc, 0);
    assert_int_equal(log.calls, 5);
    assert_int_equal(log.last_done, 5);
    assert_int_equal(log.total, 5);
    assert_true(log.in_order);
    assert_true(log.on_caller);
    assert_int_equal(totals.clips, 5);
    assert_true(totals.frames >= 5 * 3);
    assert_true(totals.video_s > 5 * 0.8 * 0.4 - 0.5);
    /* bytes = the sum of the clip files' sizes. */
    uint64_t bytes = 0;
    for (size_t i = 0; i < 5; i++) {
        char name[64];
        snprintf(name, sizeof name, "clips/v%07zu.mp4", i);
        char *p = child_path(dir, name);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        bytes += (uint64_t)st.st_size;
        free(p);
    }
    assert_int_equal(totals.bytes, bytes);
    free(dir);
}

static void dataset_of_zero_clips_writes_an_empty_manifest(void **state)
{
    char *dir = scratch("zero");
    dataset_ok(dir, &small_mix, 0, 1, 0);
    char *manifest = child_path(dir, "manifest.jsonl");
    size_t n;
    char *text = read_all(manifest, &n);
    assert_int_equal(n, 0);
    free(text);
    free(manifest);
    free(dir);
}

/* `synth --out out/large/video` on a fresh clone: the folders above DIR are made, as
 * `mkdir -p` would (before, a missing parent failed with "cannot create the directory"). */
static void dataset_makes_the_folders_above_its_directory(void **state)
{
    char *top = scratch("parents");
    char *dir = child_path(top, "a/b/set");
    dataset_ok(dir, &small_mix, 1, 1, 1);
    char *manifest = child_path(dir, "manifest.jsonl");
    assert_true(exists(manifest));
    free(manifest);
    free(dir);
    free(top);
}

static void dataset_into_a_file_fails_naming_it(void **state)
{
    char *file = scratch("a-file");
    dh_test_write_file(file, "x\n");
    int rc = dh_synth_dataset(file, &small_mix, 1, 1, 1, NULL, NULL);
    assert_int_equal(rc, -ENOTDIR);
    assert_non_null(strstr(dh_last_error(), file));
    char *under = child_path(file, "set");
    rc = dh_synth_dataset(under, &small_mix, 1, 1, 1, NULL, NULL);
    assert_int_equal(rc, -ENOTDIR);
    assert_non_null(strstr(dh_last_error(), under));
    free(under);
    free(file);
}

static void dataset_rejects_bad_mixes_before_writing(void **state)
{
    char *dir = scratch("bad-mix");
    dh_mix_t empty = {(char *)"empty", NULL, 0};
    assert_int_equal(dh_synth_dataset(dir, &empty, 1, 1, 1, NULL, NULL), DH_EINVAL);
    /* An entry too small to encode: the error names the first clip drawn from it. */
    dh_mix_entry_t tiny = {4, 8, 8, 1.0, 10.0, 1.0};
    dh_mix_t tiny_mix = {(char *)"tiny", &tiny, 1};
    assert_int_equal(dh_synth_dataset(dir, &tiny_mix, 3, 1, 1, NULL, NULL), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "clips/v0000000.mp4"));
    assert_false(exists(dir)); /* nothing was created */
    free(dir);
}

static void failed_dataset_leaves_no_manifest(void **state)
{
    char *dir = scratch("fails");
    /* A stale manifest from an earlier run, and a directory squatting on clip 1's name so
     * that renaming it into place fails. */
    assert_int_equal(mkdir(dir, 0755), 0);
    char *clips = child_path(dir, "clips");
    assert_int_equal(mkdir(clips, 0755), 0);
    char *squat = child_path(dir, "clips/v0000001.mp4");
    assert_int_equal(mkdir(squat, 0755), 0);
    char *manifest = child_path(dir, "manifest.jsonl");
    dh_test_write_file(manifest, "{\"id\":\"stale\"}\n");

    int rc = dh_synth_dataset(dir, &small_mix, 4, 1, 2, NULL, NULL);
    assert_true(rc < 0);
    assert_non_null(strstr(dh_last_error(), "clips/v0000001.mp4"));
    assert_false(exists(manifest));
    char *part = child_path(dir, "clips/v0000001.mp4.part");
    assert_false(exists(part));
    free(part);
    free(manifest);
    free(squat);
    free(clips);
    free(dir);
}

/* ---- the synth command -------------------------------------------------------------- */

/* Runs "$DH_CLI synth args" with stderr to a file; returns the exit status. */
static int run_cli(const char *args, const char *stderr_path)
{
    const char *cli = getenv("DH_CLI");
    if (!cli || !*cli)
        fail_msg("DH_CLI is not set (run the tests through ctest)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' synth %s 2>'%s' >/dev/null", cli, args, stderr_path);
    int status = system(cmd);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void cli_usage_errors_exit_2_naming_the_option(void **state)
{
    static const struct {
        const char *args, *names;
    } cases[] = {
        {"--mix kinetics-s --count 1", "--out"},
        {"--out /tmp/x --count 1", "--mix"},
        {"--out /tmp/x --mix kinetics-s", "--count"},
        {"--out /tmp/x --mix kinetics-s --count many", "--count"},
        {"--out /tmp/x --mix kinetics-s --count -1", "--count"},
        {"--out /tmp/x --mix kinetics-s --count 1 --jobs 100000", "--jobs"},
        {"--out /tmp/x --mix kinetics-s --count 1 --seed x", "--seed"},
        {"--out /tmp/x --mix kinetics-s --count 1 --frobnicate", "frobnicate"},
        {"--out /tmp/x --mix kinetics-s --count 1 extra", "extra"},
    };
    char *err_path = scratch("usage.err");
    for (size_t i = 0; i < DH_ARRAY_LEN_TEST(cases); i++) {
        int status = run_cli(cases[i].args, err_path);
        char *err = read_all(err_path, NULL);
        if (status != 2 || !strstr(err, cases[i].names))
            print_error("'%s': exit %d, stderr: %s\n", cases[i].args, status, err);
        assert_int_equal(status, 2);
        assert_non_null(strstr(err, cases[i].names));
        free(err);
    }
    free(err_path);
}

static void cli_help_exits_0_and_names_every_option(void **state)
{
    const char *cli = getenv("DH_CLI");
    if (!cli || !*cli)
        fail_msg("DH_CLI is not set (run the tests through ctest)");
    char *out_path = scratch("help.out");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' synth --help >'%s'", cli, out_path);
    int status = system(cmd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char *help = read_all(out_path, NULL);
    static const char *const options[] = {"--out",  "--mix",  "--count",
                                          "--seed", "--jobs", "--help"};
    for (size_t i = 0; i < DH_ARRAY_LEN_TEST(options); i++)
        assert_non_null(strstr(help, options[i]));
    free(help);
    free(out_path);
}

static void cli_writes_a_data_set_and_a_summary(void **state)
{
    char *mix_path = scratch("tiny-mix.json");
    dh_test_write_file(mix_path, "[{\"frames\": 4, \"height\": 64, \"width\": 96, "
                                 "\"duration_s\": 0.4, \"fps\": 10}]\n");
    char *dir = scratch("cli-set"), *err_path = scratch("cli.err");
    char args[2048];
    snprintf(args, sizeof args, "--out '%s' --mix '%s' --count 3 --seed 2 --jobs 2", dir, mix_path);
    int status = run_cli(args, err_path);
    char *err = read_all(err_path, NULL);
    if (status != 0)
        print_error("exit %d: %s\n", status, err);
    assert_int_equal(status, 0);
    assert_non_null(strstr(err, "3/3 clips"));
    assert_non_null(strstr(err, "wrote 3 clips"));
    assert_non_null(strstr(err, "s of video"));
    char *manifest = child_path(dir, "manifest.jsonl");
    char *text = read_all(manifest, NULL);
    size_t lines = 0;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 3);
    free(text);
    free(manifest);
    free(err);
    free(dir);
    free(err_path);
    free(mix_path);
}

static void cli_fails_with_1_naming_an_unknown_mix(void **state)
{
    char *err_path = scratch("unknown.err");
    int status = run_cli("--out /tmp/never --mix no-such-mix --count 1", err_path);
    char *err = read_all(err_path, NULL);
    assert_int_equal(status, 1);
    assert_non_null(strstr(err, "no-such-mix"));
    free(err);
    free(err_path);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(clip_is_h264_mp4_with_its_size_frames_and_rate),
    cmocka_unit_test(clip_keeps_a_fractional_frame_rate),
    cmocka_unit_test(every_decoded_frame_reads_back_its_own_index),
    cmocka_unit_test(keyframes_fall_every_gop_frames),
    cmocka_unit_test(frame_rgb_is_deterministic_for_seed_and_index),
    cmocka_unit_test(frame_rgb_moves_and_is_textured),
    cmocka_unit_test(frame_index_reads_uncompressed_codes_at_every_layout),
    cmocka_unit_test(frame_index_is_minus_one_without_a_code),
    cmocka_unit_test(write_clip_rejects_bad_input_naming_the_path),
    cmocka_unit_test(write_clip_into_a_missing_directory_fails_naming_the_path),
    cmocka_unit_test(write_clip_survives_each_allocation_failure),
    cmocka_unit_test(dataset_is_the_same_for_one_and_two_jobs),
    cmocka_unit_test(dataset_manifest_lines_are_json_with_the_fields),
    cmocka_unit_test(dataset_of_fewer_clips_is_a_prefix),
    cmocka_unit_test(dataset_reports_progress_on_the_calling_thread),
    cmocka_unit_test(dataset_of_zero_clips_writes_an_empty_manifest),
    cmocka_unit_test(dataset_makes_the_folders_above_its_directory),
    cmocka_unit_test(dataset_into_a_file_fails_naming_it),
    cmocka_unit_test(dataset_rejects_bad_mixes_before_writing),
    cmocka_unit_test(failed_dataset_leaves_no_manifest),
    cmocka_unit_test(cli_usage_errors_exit_2_naming_the_option),
    cmocka_unit_test(cli_help_exits_0_and_names_every_option),
    cmocka_unit_test(cli_writes_a_data_set_and_a_summary),
    cmocka_unit_test(cli_fails_with_1_naming_an_unknown_mix),
};

DH_TEST_MAIN(tests)
