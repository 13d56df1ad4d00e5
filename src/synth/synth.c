/* synth.c: synthetic video data sets (synth.h, docs/design.md §6).
 *
 * Real H.264/MP4 clips with moving, textured content, so that decoding them costs what
 * decoding real video costs; the pipeline's tests and benchmarks run on them before any
 * real data set is at hand. Three parts:
 *
 *   content   dh_synth_frame_rgb: a palette-mapped procedural texture (two layers of one
 *             periodic 256x256 tile, each translating, rotating and scaled on its own) plus
 *             a few solid shapes on Lissajous paths, and the frame index drawn as a binary
 *             code in the top rows. Deterministic for (seed, index). About 2 ns a pixel:
 *             the tile is computed once per process, a frame only walks it in fixed point.
 *   encoding  dh_synth_write_clip: RGB24 -> yuv420p (libswscale) -> libx264 (one thread,
 *             preset ultrafast with CABAC and deblocking, CRF 23, fixed GOP, B-frames as
 *             the clip's encoding says, no scene-cut keyframes) -> MP4 (libavformat), written to
 * PATH.part and renamed into place. A 10 s 448x448 clip at 30 fps takes about 0.8 s. data sets
 * dh_synth_dataset_write: draws every clip's shape from the mix first (so the result does not
 * depend on the number of threads), encodes with `jobs` pthreads pulling clip numbers from an
 * atomic counter, reports progress from the calling thread, and writes manifest.jsonl last.
 *
 * FFmpeg types stay inside this file.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/error.h>
#include <libavutil/log.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/rng.h"
#include "datahelix/synth.h"
#include "core/internal.h"

/* ---- limits ------------------------------------------------------------------------- */

#define SYNTH_MIN_SIDE 16    /* below this the code band and the shapes make no sense */
#define SYNTH_MAX_SIDE 8192  /* H.264 level 6.2 tops out near 8192x4320 */
#define SYNTH_MAX_FPS 1000.0 /* typo guard */
#define SYNTH_MAX_FRAMES 1000000
#define SYNTH_PRESET "ultrafast" /* see docs/synth.md "Encoder settings" for the timings */
#define SYNTH_CRF "23"           /* libx264's default quality */

/* ---- encodings ---------------------------------------------------------------------- */

static const char *const encoding_names[] = {"flat-b", "x264-default", "no-b"};

const char *dh_synth_encoding_name(dh_synth_encoding_t encoding)
{
    return (unsigned)encoding < DH_ARRAY_LEN(encoding_names) ? encoding_names[encoding] : NULL;
}

/* ---- the texture tile --------------------------------------------------------------- */

/* One 256x256 intensity tile shared by every clip (64 KiB, built once per process in about
 * 2 ms). Every wave has an integer number of periods across the tile, so it wraps without
 * seams and a frame can sample it with `& 255`. Sines give large-scale structure, the
 * checker gives edges and the hashed noise gives the fine detail that makes the encoder and
 * the decoder work. */
#define TILE 256
#define BLOTCH_AMP 0.35
#define NOISE_AMP 0.08

static uint8_t tile[TILE][TILE];
static pthread_once_t tile_once = PTHREAD_ONCE_INIT;

static uint32_t hash32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* Hash noise smoothed over a (2r+1)^2 periodic box: blotches about r texels across. */
static double blotch(int x, int y, int r, uint32_t salt)
{
    double sum = 0;
    for (int dy = -r; dy <= r; dy++)
        for (int dx = -r; dx <= r; dx++) {
            uint32_t tx = (uint32_t)(x + dx) & (TILE - 1), ty = (uint32_t)(y + dy) & (TILE - 1);
            sum += (double)(hash32((ty * TILE + tx) ^ salt) & 1023) / 1023.0 - 0.5;
        }
    return sum / ((2 * r + 1) * (2 * r + 1)) * (2 * r + 1); /* keep some contrast */
}

static void tile_build(void)
{
    static const struct {
        int kx, ky;
        double amp;
    } waves[] = {{1, 2, 0.30}, {-3, 2, 0.25}, {7, -5, 0.18}, {13, 11, 0.12}, {-23, 17, 0.08}};
    const double two_pi = 6.283185307179586;
    for (int y = 0; y < TILE; y++) {
        for (int x = 0; x < TILE; x++) {
            double v = 0, total = 0;
            for (size_t w = 0; w < DH_ARRAY_LEN(waves); w++) {
                v += waves[w].amp * sin(two_pi * (waves[w].kx * x + waves[w].ky * y) / TILE);
                total += waves[w].amp;
            }
            v += 0.20 * ((((x >> 5) ^ (y >> 5)) & 1) ? 1.0 : -1.0);
            total += 0.20;
            v += BLOTCH_AMP * blotch(x, y, 2, 0x9e3779b9U);
            total += BLOTCH_AMP;
            v += NOISE_AMP * ((double)(hash32((uint32_t)(y * TILE + x)) & 1023) / 1023.0 - 0.5) * 2;
            total += NOISE_AMP;
            long level = lround(127.5 + 127.5 * v / total);
            tile[y][x] = (uint8_t)(level < 0 ? 0 : level > 255 ? 255 : level);
        }
    }
}

/* FFmpeg's libx264 wrapper logs several informational lines per clip; a data set of 200
 * clips would bury the progress output. Lower the level once, and only if the application
 * left it at FFmpeg's default. */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_quiet(void)
{
    if (av_log_get_level() == AV_LOG_INFO)
        av_log_set_level(AV_LOG_WARNING);
}

/* ---- the scene of a clip ------------------------------------------------------------ */

typedef struct named_colour {
    const char *name;
    uint8_t rgb[3];
} named_colour_t;

static const named_colour_t colours[] = {
    {"red", {220, 40, 40}},     {"orange", {240, 140, 30}}, {"yellow", {235, 220, 50}},
    {"green", {50, 170, 70}},   {"teal", {30, 150, 150}},   {"blue", {40, 80, 210}},
    {"violet", {140, 70, 200}}, {"pink", {240, 130, 180}},  {"brown", {130, 80, 40}},
    {"grey", {128, 128, 128}},  {"navy", {20, 30, 90}},     {"olive", {120, 130, 40}},
};

#define MAX_SHAPES 5

typedef struct shape {
    size_t colour;         /* index into colours[] */
    bool disc;             /* disc, else axis-aligned square */
    double radius_frac;    /* half-size, as a fraction of min(width, height) */
    double amp_x, amp_y;   /* path amplitude, as a fraction of the frame */
    double rate_x, rate_y; /* path angular speed, rad/s */
    double phase_x, phase_y;
} shape_t;

typedef struct layer {
    double scale;            /* texels per pixel */
    double angle, spin;      /* rad at t = 0, rad/s */
    double u0, v0;           /* texel offset at t = 0 */
    double speed_u, speed_v; /* texels/s */
} layer_t;

typedef struct scene {
    size_t stops[3]; /* palette: colours[] indices of a 3-stop gradient */
    uint8_t palette[256][3];
    layer_t layers[2];
    size_t shape_count;
    shape_t shapes[MAX_SHAPES];
    size_t motion_word, texture_word; /* caption words */
} scene_t;

static double uniform_in(dh_rng_t *rng, double lo, double hi)
{
    return lo + (hi - lo) * dh_rng_uniform(rng);
}

/* Everything about a clip's look follows from its seed; about 60 draws, 1 us. */
static void scene_make(uint64_t seed, scene_t *sc)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, dh_rng_mix(seed, 0x73796e74685f7363ULL /* "synth_sc" */));
    /* Three distinct stops, so the texture never collapses to one flat colour (and the
     * caption's "X and Y background" names two colours). */
    sc->stops[0] = dh_rng_below(&rng, DH_ARRAY_LEN(colours));
    sc->stops[1] =
        (sc->stops[0] + 1 + dh_rng_below(&rng, DH_ARRAY_LEN(colours) - 1)) % DH_ARRAY_LEN(colours);
    do
        sc->stops[2] = dh_rng_below(&rng, DH_ARRAY_LEN(colours));
    while (sc->stops[2] == sc->stops[1] || sc->stops[2] == sc->stops[0]);
    for (int t = 0; t < 256; t++) {
        const uint8_t *a = colours[sc->stops[t < 128 ? 0 : 1]].rgb;
        const uint8_t *b = colours[sc->stops[t < 128 ? 1 : 2]].rgb;
        int f = t < 128 ? t * 2 : (t - 128) * 2; /* 0..254 */
        for (int c = 0; c < 3; c++)
            sc->palette[t][c] = (uint8_t)((a[c] * (255 - f) + b[c] * f) / 255);
    }
    for (int l = 0; l < 2; l++) {
        layer_t *ly = &sc->layers[l];
        ly->scale = uniform_in(&rng, 0.5, 1.5);
        ly->angle = uniform_in(&rng, 0, 6.283185307179586);
        ly->spin = uniform_in(&rng, 0.05, 0.4) * (dh_rng_below(&rng, 2) ? 1 : -1);
        ly->u0 = uniform_in(&rng, 0, TILE);
        ly->v0 = uniform_in(&rng, 0, TILE);
        double heading = uniform_in(&rng, 0, 6.283185307179586);
        double speed = uniform_in(&rng, 8, 40);
        ly->speed_u = speed * cos(heading);
        ly->speed_v = speed * sin(heading);
    }
    sc->shape_count = 3 + dh_rng_below(&rng, MAX_SHAPES - 2);
    for (size_t s = 0; s < sc->shape_count; s++) {
        shape_t *sh = &sc->shapes[s];
        sh->colour = dh_rng_below(&rng, DH_ARRAY_LEN(colours));
        sh->disc = dh_rng_below(&rng, 2) != 0;
        sh->radius_frac = uniform_in(&rng, 0.05, 0.14);
        sh->amp_x = uniform_in(&rng, 0.15, 0.38);
        sh->amp_y = uniform_in(&rng, 0.15, 0.38);
        sh->rate_x = uniform_in(&rng, 0.4, 2.0);
        sh->rate_y = uniform_in(&rng, 0.4, 2.0);
        sh->phase_x = uniform_in(&rng, 0, 6.283185307179586);
        sh->phase_y = uniform_in(&rng, 0, 6.283185307179586);
    }
    sc->motion_word = dh_rng_below(&rng, 4);
    sc->texture_word = dh_rng_below(&rng, 4);
}

/* ---- the frame-index code ----------------------------------------------------------- */

/* 16 bits of the frame index in a band of cells at the top of the frame, each bit followed
 * (one cell-row below) by its complement so a reader can tell a code from texture. Cells are
 * at least 8x8 pixels (an H.264 transform block), so compression at CRF 23 leaves their
 * inner means far from the threshold. Width >= 128: one row of 16 bits; width 64..127: two
 * rows of 8 bits. The band is 2 or 4 cell-rows high (16..32 pixels). */
#define CODE_BITS 16

typedef struct code_layout {
    int32_t cols, bit_rows; /* cols x bit_rows = CODE_BITS */
    int32_t cell_w, cell_h;
} code_layout_t;

static bool code_layout(int32_t width, int32_t height, code_layout_t *lay)
{
    if (width < 64)
        return false;
    lay->cols = width >= 128 ? 16 : 8;
    lay->bit_rows = CODE_BITS / lay->cols;
    lay->cell_w = width / lay->cols;
    lay->cell_h = lay->cell_w < 8 ? 8 : lay->cell_w > 16 ? 16 : lay->cell_w;
    return 2 * lay->bit_rows * lay->cell_h <= height;
}

/* Cell (row, col) of the band: bit rows 0..bit_rows-1 hold the bits, rows bit_rows.. their
 * complements. Bit b (LSB first) is at row b / cols, col b % cols. */
static void code_draw(const code_layout_t *lay, int32_t width, int64_t index, uint8_t *rgb)
{
    for (int32_t b = 0; b < CODE_BITS; b++) {
        int bit = (int)(((uint64_t)index >> b) & 1);
        for (int half = 0; half < 2; half++) {
            uint8_t level = (bit ^ half) ? 255 : 0;
            int32_t row = b / lay->cols + half * lay->bit_rows, col = b % lay->cols;
            for (int32_t y = row * lay->cell_h; y < (row + 1) * lay->cell_h; y++)
                memset(rgb + ((size_t)y * width + (size_t)col * lay->cell_w) * 3, level,
                       (size_t)lay->cell_w * 3);
        }
    }
}

/* Mean of R+G+B (0..765) over the inner part of a cell (a quarter of the cell trimmed on
 * each side, to stay clear of chroma bleeding and ringing at the cell's edges). */
static int cell_mean(const code_layout_t *lay, const uint8_t *rgb, int32_t width, int32_t row,
                     int32_t col)
{
    int32_t mx = lay->cell_w / 4, my = lay->cell_h / 4;
    int32_t x0 = col * lay->cell_w + mx, x1 = (col + 1) * lay->cell_w - mx;
    int32_t y0 = row * lay->cell_h + my, y1 = (row + 1) * lay->cell_h - my;
    long sum = 0, n = 0;
    for (int32_t y = y0; y < y1; y++) {
        const uint8_t *p = rgb + ((size_t)y * width + (size_t)x0) * 3;
        for (int32_t x = x0; x < x1; x++, p += 3, n++)
            sum += p[0] + p[1] + p[2];
    }
    return (int)(sum / n);
}

int64_t dh_synth_frame_index(const uint8_t *rgb, int32_t width, int32_t height)
{
    code_layout_t lay;
    if (!rgb || !code_layout(width, height, &lay))
        return -1;
    /* A bit is read when its cell and its complement are clearly on opposite sides of mid
     * grey (a margin of 1/4 of the range); texture almost never passes all 16 pairs. */
    const int mid = 3 * 128, margin = 3 * 64;
    int64_t index = 0;
    for (int32_t b = 0; b < CODE_BITS; b++) {
        int32_t row = b / lay.cols, col = b % lay.cols;
        int bit = cell_mean(&lay, rgb, width, row, col);
        int inverse = cell_mean(&lay, rgb, width, row + lay.bit_rows, col);
        if (bit > mid + margin && inverse < mid - margin)
            index |= (int64_t)1 << b;
        else if (!(bit < mid - margin && inverse > mid + margin))
            return -1;
    }
    return index;
}

/* ---- frames ------------------------------------------------------------------------- */

/* A double texel coordinate as 16.16 fixed point, reduced mod the tile, so the per-pixel
 * walk can add in uint32 and wrap freely. */
static uint32_t fixed_wrapped(double texels)
{
    double r = fmod(texels, TILE);
    if (r < 0)
        r += TILE;
    return (uint32_t)(r * 65536.0);
}

static uint32_t fixed_step(double texels)
{
    return (uint32_t)(int32_t)lround(texels * 65536.0);
}

static void draw_background(const scene_t *sc, const dh_synth_clip_t *clip, double t_s,
                            uint8_t *rgb)
{
    int32_t w = clip->width, h = clip->height;
    double cx = w / 2.0, cy = h / 2.0;
    /* Per layer: texel (u, v) = R(angle) * S * (pixel - centre) + offset(t). */
    uint32_t du_dx[2], dv_dx[2], du_dy[2], dv_dy[2], u_origin[2], v_origin[2];
    for (int l = 0; l < 2; l++) {
        const layer_t *ly = &sc->layers[l];
        double angle = ly->angle + ly->spin * t_s;
        double c = cos(angle) * ly->scale, s = sin(angle) * ly->scale;
        du_dx[l] = fixed_step(c);
        dv_dx[l] = fixed_step(s);
        du_dy[l] = fixed_step(-s);
        dv_dy[l] = fixed_step(c);
        /* Texel at pixel (0, 0). */
        u_origin[l] = fixed_wrapped(ly->u0 + ly->speed_u * t_s - c * cx + s * cy);
        v_origin[l] = fixed_wrapped(ly->v0 + ly->speed_v * t_s - s * cx - c * cy);
    }
    for (int32_t y = 0; y < h; y++) {
        uint32_t u0 = u_origin[0] + du_dy[0] * (uint32_t)y,
                 v0 = v_origin[0] + dv_dy[0] * (uint32_t)y;
        uint32_t u1 = u_origin[1] + du_dy[1] * (uint32_t)y,
                 v1 = v_origin[1] + dv_dy[1] * (uint32_t)y;
        uint8_t *p = rgb + (size_t)y * w * 3;
        for (int32_t x = 0; x < w; x++, p += 3) {
            unsigned a = tile[(v0 >> 16) & (TILE - 1)][(u0 >> 16) & (TILE - 1)];
            unsigned b = tile[(v1 >> 16) & (TILE - 1)][(u1 >> 16) & (TILE - 1)];
            const uint8_t *colour = sc->palette[(a + b) >> 1];
            p[0] = colour[0];
            p[1] = colour[1];
            p[2] = colour[2];
            u0 += du_dx[0];
            v0 += dv_dx[0];
            u1 += du_dx[1];
            v1 += dv_dx[1];
        }
    }
}

static void draw_shapes(const scene_t *sc, const dh_synth_clip_t *clip, double t_s, uint8_t *rgb)
{
    int32_t w = clip->width, h = clip->height;
    double side = w < h ? w : h;
    for (size_t s = 0; s < sc->shape_count; s++) {
        const shape_t *sh = &sc->shapes[s];
        double cx = w * (0.5 + sh->amp_x * sin(sh->rate_x * t_s + sh->phase_x));
        double cy = h * (0.5 + sh->amp_y * sin(sh->rate_y * t_s + sh->phase_y));
        double r = sh->radius_frac * side;
        int32_t x0 = (int32_t)floor(cx - r), x1 = (int32_t)ceil(cx + r);
        int32_t y0 = (int32_t)floor(cy - r), y1 = (int32_t)ceil(cy + r);
        x0 = x0 < 0 ? 0 : x0;
        y0 = y0 < 0 ? 0 : y0;
        x1 = x1 > w ? w : x1;
        y1 = y1 > h ? h : y1;
        const uint8_t *colour = colours[sh->colour].rgb;
        /* One span per row (a square's is its box, a disc's from one sqrt): no per-pixel
         * test, so a shape costs its area in byte stores. */
        for (int32_t y = y0; y < y1; y++) {
            int32_t xa = x0, xb = x1;
            if (sh->disc) {
                double dy = y + 0.5 - cy, half_sq = r * r - dy * dy;
                if (half_sq <= 0)
                    continue;
                double half = sqrt(half_sq);
                /* Pixel x is inside when |x + 0.5 - cx| <= half. */
                xa = (int32_t)ceil(cx - half - 0.5);
                xb = (int32_t)floor(cx + half - 0.5) + 1;
                xa = xa < 0 ? 0 : xa;
                xb = xb > w ? w : xb;
            }
            uint8_t *p = rgb + ((size_t)y * w + (size_t)(xa > 0 ? xa : 0)) * 3;
            for (int32_t x = xa; x < xb; x++, p += 3) {
                p[0] = colour[0];
                p[1] = colour[1];
                p[2] = colour[2];
            }
        }
    }
}

void dh_synth_frame_rgb(const dh_synth_clip_t *clip, int64_t index, uint8_t *rgb)
{
    assert(clip && rgb && clip->width > 0 && clip->height > 0);
    pthread_once(&tile_once, tile_build);
    scene_t sc;
    scene_make(clip->seed, &sc);
    double fps = clip->fps > 0 ? clip->fps : 1.0;
    double t_s = (double)index / fps;
    draw_background(&sc, clip, t_s, rgb);
    draw_shapes(&sc, clip, t_s, rgb);
    code_layout_t lay;
    if (code_layout(clip->width, clip->height, &lay))
        code_draw(&lay, clip->width, index, rgb);
}

/* ---- encoding ----------------------------------------------------------------------- */

typedef struct encoder {
    const char *path; /* the final path, for messages */
    AVFormatContext *mux;
    AVCodecContext *codec;
    AVStream *stream;
    struct SwsContext *sws;
    AVFrame *yuv;
    AVPacket *packet;
} encoder_t;

/* An FFmpeg failure as our code and message. FFmpeg's own allocations do not go through
 * dh_malloc, but an out-of-memory from it is still DH_ENOMEM. */
static int av_fail(const char *path, const char *what, int averr)
{
    char msg[AV_ERROR_MAX_STRING_SIZE];
    av_strerror(averr, msg, sizeof msg);
    return dh__set_error(averr == AVERROR(ENOMEM) ? DH_ENOMEM : DH_EIO, "%s: %s: %s", path, what,
                         msg);
}

/* Frame count and keyframe interval of a valid clip, or DH_EINVAL naming the path. */
static int clip_check(const char *path, const dh_synth_clip_t *clip, int64_t *frames, int *gop)
{
    if (clip->width < SYNTH_MIN_SIDE || clip->width > SYNTH_MAX_SIDE || clip->width % 2 ||
        clip->height < SYNTH_MIN_SIDE || clip->height > SYNTH_MAX_SIDE || clip->height % 2)
        return dh__set_error(DH_EINVAL,
                             "%s: size %dx%d: expected even numbers in [%d, %d] (yuv420p)", path,
                             (int)clip->width, (int)clip->height, SYNTH_MIN_SIDE, SYNTH_MAX_SIDE);
    if (!isfinite(clip->fps) || clip->fps <= 0 || clip->fps > SYNTH_MAX_FPS)
        return dh__set_error(DH_EINVAL, "%s: fps %g: expected a number in (0, %g]", path, clip->fps,
                             SYNTH_MAX_FPS);
    double n = round(clip->duration_s * clip->fps);
    if (!isfinite(clip->duration_s) || clip->duration_s <= 0 || n > SYNTH_MAX_FRAMES)
        return dh__set_error(DH_EINVAL, "%s: duration %g s at %g fps: expected 0 < frames <= %d",
                             path, clip->duration_s, clip->fps, SYNTH_MAX_FRAMES);
    if (clip->gop < 0)
        return dh__set_error(DH_EINVAL, "%s: gop %d: expected >= 0", path, (int)clip->gop);
    *frames = n < 1 ? 1 : (int64_t)n;
    long two_seconds = lround(2 * clip->fps);
    *gop = clip->gop > 0 ? (int)clip->gop : two_seconds < 1 ? 1 : (int)two_seconds;
    return 0;
}

/* Sets up the muxer, the encoder and the converter; opens path_part for writing. */
static int encoder_open(encoder_t *e, const char *path_part, const dh_synth_clip_t *clip, int gop,
                        dh_synth_encoding_t encoding)
{
    int rc = avformat_alloc_output_context2(&e->mux, NULL, "mp4", path_part);
    if (rc < 0)
        return av_fail(e->path, "cannot set up the mp4 muxer", rc);
    const AVCodec *x264 = avcodec_find_encoder_by_name("libx264");
    if (!x264)
        return dh__set_error(DH_EIO, "%s: FFmpeg has no libx264 encoder", e->path);
    e->codec = avcodec_alloc_context3(x264);
    e->stream = avformat_new_stream(e->mux, NULL);
    e->yuv = av_frame_alloc();
    e->packet = av_packet_alloc();
    if (!e->codec || !e->stream || !e->yuv || !e->packet)
        return av_fail(e->path, "cannot set up the encoder", AVERROR(ENOMEM));

    /* A rational rate close to fps: 25 -> 25/1, 29.97 -> 30000/1001. Frame i has pts i. */
    AVRational rate = av_d2q(clip->fps, 1001000);
    AVCodecContext *c = e->codec;
    c->width = clip->width;
    c->height = clip->height;
    c->pix_fmt = AV_PIX_FMT_YUV420P;
    c->time_base = av_inv_q(rate);
    c->framerate = rate;
    c->gop_size = gop;
    c->keyint_min = gop;
    /* Three non-reference B-frames between reference frames (IBBBPBBBP...: x264's default
     * count, without its B-pyramid), as in most H.264 found in the wild (camera and web
     * encodes): a decoder that knows which frames it needs can skip unneeded B-frames, and
     * a data set without them would hide that. */
    c->max_b_frames = 3;
    /* One thread per encoder: a data set runs one encoder per core instead, which scales
     * better than x264's frame threads on small frames and keeps the output independent of
     * the machine. */
    c->thread_count = 1;
    if (e->mux->oformat->flags & AVFMT_GLOBALHEADER)
        c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    /* Scene cuts would add keyframes off the GOP grid; the pipeline's seek cost model wants
     * keyframes exactly every `gop` frames. Ultrafast turns CABAC and the deblocking filter
     * off; they are put back (about +50% encode time) because they are a large part of what
     * decoding real H.264 costs, and decode cost is what these clips are for. */
    const char *params = "scenecut=0:cabac=1:deblock=0,0:bframes=3:b-adapt=0:b-pyramid=none";
    if (encoding == DH_SYNTH_ENC_X264_DEFAULT)
        params = "scenecut=0:cabac=1:deblock=0,0:bframes=3:b-adapt=1:b-pyramid=normal";
    else if (encoding == DH_SYNTH_ENC_NO_B) {
        params = "scenecut=0:cabac=1:deblock=0,0:bframes=0";
        c->max_b_frames = 0;
    }
    if ((rc = av_opt_set(c->priv_data, "preset", SYNTH_PRESET, 0)) < 0 ||
        (rc = av_opt_set(c->priv_data, "crf", SYNTH_CRF, 0)) < 0 ||
        (rc = av_opt_set(c->priv_data, "x264-params", params, 0)) < 0)
        return av_fail(e->path, "cannot set libx264 options", rc);
    if ((rc = avcodec_open2(c, x264, NULL)) < 0)
        return av_fail(e->path, "cannot open libx264", rc);
    if ((rc = avcodec_parameters_from_context(e->stream->codecpar, c)) < 0)
        return av_fail(e->path, "cannot set the stream parameters", rc);
    e->stream->time_base = c->time_base;
    e->stream->avg_frame_rate = rate;

    e->sws = sws_getContext(clip->width, clip->height, AV_PIX_FMT_RGB24, clip->width, clip->height,
                            AV_PIX_FMT_YUV420P, SWS_POINT, NULL, NULL, NULL);
    if (!e->sws)
        return dh__set_error(DH_EIO, "%s: cannot set up RGB24 -> yuv420p conversion", e->path);
    e->yuv->format = AV_PIX_FMT_YUV420P;
    e->yuv->width = clip->width;
    e->yuv->height = clip->height;
    if ((rc = av_frame_get_buffer(e->yuv, 0)) < 0)
        return av_fail(e->path, "cannot allocate a frame", rc);

    if ((rc = avio_open(&e->mux->pb, path_part, AVIO_FLAG_WRITE)) < 0) {
        char msg[AV_ERROR_MAX_STRING_SIZE];
        av_strerror(rc, msg, sizeof msg);
        /* AVERROR(e) is -e for system errors: those are -errno, as the header promises. */
        return dh__set_error(rc > -4096 ? rc : DH_EIO, "%s: cannot create %s: %s", e->path,
                             path_part, msg);
    }
    if ((rc = avformat_write_header(e->mux, NULL)) < 0)
        return av_fail(e->path, "cannot write the mp4 header", rc);
    return 0;
}

/* Moves every packet the encoder has ready into the muxer. */
static int encoder_drain(encoder_t *e)
{
    for (;;) {
        int rc = avcodec_receive_packet(e->codec, e->packet);
        if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF)
            return 0;
        if (rc < 0)
            return av_fail(e->path, "libx264 failed", rc);
        av_packet_rescale_ts(e->packet, e->codec->time_base, e->stream->time_base);
        e->packet->stream_index = e->stream->index;
        /* Takes the packet's reference whatever it returns. */
        if ((rc = av_interleaved_write_frame(e->mux, e->packet)) < 0)
            return av_fail(e->path, "cannot write a packet", rc);
    }
}

static int encoder_frame(encoder_t *e, const uint8_t *rgb, int64_t index)
{
    int rc = av_frame_make_writable(e->yuv);
    if (rc < 0)
        return av_fail(e->path, "cannot allocate a frame", rc);
    const uint8_t *src[1] = {rgb};
    const int src_stride[1] = {e->codec->width * 3};
    sws_scale(e->sws, src, src_stride, 0, e->codec->height, e->yuv->data, e->yuv->linesize);
    e->yuv->pts = index;
    if ((rc = avcodec_send_frame(e->codec, e->yuv)) < 0)
        return av_fail(e->path, "libx264 failed", rc);
    return encoder_drain(e);
}

static int encoder_finish(encoder_t *e)
{
    int rc = avcodec_send_frame(e->codec, NULL);
    if (rc < 0)
        return av_fail(e->path, "libx264 failed to flush", rc);
    if ((rc = encoder_drain(e)) < 0)
        return rc;
    if ((rc = av_write_trailer(e->mux)) < 0)
        return av_fail(e->path, "cannot write the mp4 index", rc);
    if ((rc = avio_closep(&e->mux->pb)) < 0)
        return av_fail(e->path, "cannot close", rc);
    return 0;
}

static void encoder_close(encoder_t *e)
{
    if (e->mux && e->mux->pb)
        avio_closep(&e->mux->pb);
    avformat_free_context(e->mux);
    avcodec_free_context(&e->codec);
    sws_freeContext(e->sws);
    av_frame_free(&e->yuv);
    av_packet_free(&e->packet);
}

int dh_synth_write_clip(const char *path, const dh_synth_clip_t *clip)
{
    return dh_synth_write_clip_encoded(path, clip, DH_SYNTH_ENC_FLAT_B);
}

int dh_synth_write_clip_encoded(const char *path, const dh_synth_clip_t *clip,
                                dh_synth_encoding_t encoding)
{
    assert(path && clip);
    if (!dh_synth_encoding_name(encoding))
        return dh__set_error(DH_EINVAL, "%s: encoding %d: expected a dh_synth_encoding_t", path,
                             (int)encoding);
    int64_t frames = 0;
    int gop = 0;
    int rc = clip_check(path, clip, &frames, &gop);
    if (rc < 0)
        return rc;
    pthread_once(&log_once, log_quiet);

    /* Written under PATH.part and renamed when complete, so a reader (or an interrupted
     * data set) never sees a half-written clip under the real name. */
    size_t path_len = strlen(path);
    char *path_part = dh_malloc(path_len + sizeof ".part");
    /* libswscale's SIMD readers may read up to 16 bytes past the last pixel: padding. */
    uint8_t *rgb = dh_malloc((size_t)clip->width * clip->height * 3 + 64);
    encoder_t e = {.path = path};
    if (!path_part || !rgb) {
        rc = dh__set_error(DH_ENOMEM, "%s: out of memory for a %dx%d frame", path, (int)clip->width,
                           (int)clip->height);
        goto out;
    }
    memcpy(path_part, path, path_len);
    memcpy(path_part + path_len, ".part", sizeof ".part");
    if ((rc = encoder_open(&e, path_part, clip, gop, encoding)) < 0)
        goto out;
    for (int64_t i = 0; i < frames; i++) {
        dh_synth_frame_rgb(clip, i, rgb);
        if ((rc = encoder_frame(&e, rgb, i)) < 0)
            goto out;
    }
    if ((rc = encoder_finish(&e)) < 0)
        goto out;
    if (rename(path_part, path) != 0)
        rc = dh__set_error(-errno, "%s: cannot rename %s into place: %s", path, path_part,
                           strerror(errno));
out:
    encoder_close(&e);
    if (rc < 0 && path_part)
        unlink(path_part); /* whatever stage failed; ENOENT when it was never created */
    dh_free(path_part);
    dh_free(rgb);
    return rc;
}

/* ---- data sets ---------------------------------------------------------------------- */

/* Everything about clip i, drawn before any encoding starts. */
typedef struct clip_plan {
    size_t entry;         /* mix entry it was drawn from */
    dh_synth_clip_t clip; /* what to encode */
    dh_synth_encoding_t encoding;
    int64_t frames; /* frames it will have */
} clip_plan_t;

/* Clip i's draws come from a stream seeded by (seed, i) alone, so a data set of 100 clips
 * is the first 100 of one of 200 with the same seed, and `jobs` cannot change anything. */
static void plan_clip(const dh_mix_t *mix, double total_weight, uint64_t seed, size_t i,
                      clip_plan_t *plan)
{
    dh_rng_t rng;
    dh_rng_seed(&rng, dh_rng_mix(seed, (uint64_t)i));
    double pick = dh_rng_uniform(&rng) * total_weight;
    size_t e = 0;
    while (e + 1 < mix->count && pick >= mix->entries[e].weight) {
        pick -= mix->entries[e].weight;
        e++;
    }
    const dh_mix_entry_t *entry = &mix->entries[e];
    plan->entry = e;
    /* Even sizes for yuv420p: round to the nearest even number, at least 2. */
    plan->clip.width = entry->width < 2 ? 2 : (entry->width + 1) / 2 * 2;
    plan->clip.height = entry->height < 2 ? 2 : (entry->height + 1) / 2 * 2;
    plan->clip.fps = entry->fps;
    plan->clip.duration_s = entry->duration_s * uniform_in(&rng, 0.8, 1.2);
    plan->clip.gop = 0; /* 2 seconds */
    plan->clip.seed = dh_rng_next(&rng);
    double n = round(plan->clip.duration_s * plan->clip.fps);
    plan->frames = n < 1 ? 1 : (int64_t)n;
}

static const char *article(const char *word)
{
    return strchr("aeiou", word[0]) ? "an" : "a";
}

/* A short sentence about what the clip shows (its colours, shapes and motion), from the
 * same seed as its pixels. Plain lower-case ASCII words: no JSON escaping needed. */
static void caption_make(uint64_t seed, char *out, size_t size)
{
    static const char *const motions[] = {"drift", "glide", "wander", "bounce"};
    static const char *const textures[] = {"mottled", "rippled", "swirling", "speckled"};
    scene_t sc;
    scene_make(seed, &sc);
    const shape_t *a = &sc.shapes[0], *b = &sc.shapes[1];
    const char *a_name = colours[a->colour].name, *b_name = colours[b->colour].name;
    char subject[96];
    if (a->colour == b->colour && a->disc == b->disc)
        snprintf(subject, sizeof subject, "two %s %s", a_name, a->disc ? "discs" : "squares");
    else
        snprintf(subject, sizeof subject, "%s %s %s and %s %s %s", article(a_name), a_name,
                 a->disc ? "disc" : "square", article(b_name), b_name, b->disc ? "disc" : "square");
    /* texel = R(angle) x pixel, so the picture turns by -angle: anticlockwise on a y-down
     * screen when layer 0's spin is positive. */
    const char *turn = sc.layers[0].spin > 0 ? "anticlockwise" : "clockwise";
    snprintf(out, size, "%s %s over a %s %s and %s background that turns %s", subject,
             motions[sc.motion_word], textures[sc.texture_word], colours[sc.stops[0]].name,
             colours[sc.stops[2]].name, turn);
}

/* Shared between the workers and the calling thread. */
typedef struct dataset_run {
    const char *out_dir;
    const clip_plan_t *plans;
    size_t count;
    atomic_size_t next;   /* next clip number to take */
    atomic_bool stop;     /* a clip failed: take no more */
    pthread_mutex_t lock; /* guards what follows */
    pthread_cond_t changed;
    size_t done;
    unsigned running; /* workers still running */
    uint64_t bytes;
    size_t failed_clip; /* lowest failed clip number, count if none */
    int failed_rc;
    char failed_msg[1024]; /* its message (dh_last_error is per thread) */
} dataset_run_t;

static void *dataset_worker(void *arg)
{
    dataset_run_t *run = arg;
    size_t dir_len = strlen(run->out_dir);
    char *path = dh_malloc(dir_len + 32);
    for (;;) {
        size_t i = atomic_fetch_add(&run->next, 1);
        if (i >= run->count || atomic_load(&run->stop))
            break;
        int rc;
        struct stat st = {0};
        if (!path)
            rc = dh__set_error(DH_ENOMEM, "%s/clips/v%07zu.mp4: out of memory", run->out_dir, i);
        else {
            snprintf(path, dir_len + 32, "%s/clips/v%07zu.mp4", run->out_dir, i);
            rc = dh_synth_write_clip_encoded(path, &run->plans[i].clip, run->plans[i].encoding);
            if (rc == 0 && stat(path, &st) != 0)
                rc = dh__set_error(-errno, "%s: cannot stat: %s", path, strerror(errno));
        }
        pthread_mutex_lock(&run->lock);
        if (rc < 0) {
            atomic_store(&run->stop, true);
            if (i < run->failed_clip) {
                run->failed_clip = i;
                run->failed_rc = rc;
                snprintf(run->failed_msg, sizeof run->failed_msg, "%s", dh_last_error());
            }
        } else {
            run->done++;
            run->bytes += (uint64_t)st.st_size;
        }
        pthread_cond_signal(&run->changed);
        pthread_mutex_unlock(&run->lock);
        if (rc < 0)
            break;
    }
    dh_free(path);
    pthread_mutex_lock(&run->lock);
    run->running--;
    pthread_cond_signal(&run->changed);
    pthread_mutex_unlock(&run->lock);
    return NULL;
}

/* mkdir that accepts an existing directory; -errno naming the path otherwise. The folders
 * above it are made first (dh__make_parent_dirs), as `mkdir -p` would. */
static int make_dir(const char *path)
{
    if (mkdir(path, 0777) == 0)
        return 0;
    int err = errno;
    struct stat st;
    if (err == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    if (err == EEXIST)
        err = ENOTDIR;
    return dh__set_error(-err, "%s: cannot create the directory: %s", path, strerror(err));
}

/* Writes DIR/manifest.jsonl through DIR/manifest.jsonl.part and a rename. */
static int manifest_write(const char *out_dir, const clip_plan_t *plans, const dh_mix_t *mix,
                          size_t count)
{
    size_t dir_len = strlen(out_dir);
    char *path = dh_malloc(dir_len + sizeof "/manifest.jsonl");
    char *path_part = dh_malloc(dir_len + sizeof "/manifest.jsonl.part");
    int rc = 0;
    FILE *f = NULL;
    if (!path || !path_part) {
        rc = dh__set_error(DH_ENOMEM, "%s/manifest.jsonl: out of memory", out_dir);
        goto out;
    }
    sprintf(path, "%s/manifest.jsonl", out_dir);
    sprintf(path_part, "%s/manifest.jsonl.part", out_dir);
    if (!(f = fopen(path_part, "w"))) {
        rc = dh__set_error(-errno, "%s: cannot create: %s", path_part, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        const dh_mix_entry_t *entry = &mix->entries[plans[i].entry];
        char caption[256];
        caption_make(plans[i].clip.seed, caption, sizeof caption);
        fprintf(f,
                "{\"id\":\"v%07zu\",\"path\":\"clips/v%07zu.mp4\",\"caption\":\"%s\","
                "\"frames\":%d,\"height\":%d,\"width\":%d}\n",
                i, i, caption, (int)entry->frames, (int)entry->height, (int)entry->width);
    }
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) {
        f = NULL;
        rc = dh__set_error(DH_EIO, "%s: cannot write: %s", path_part, strerror(errno));
        goto out;
    }
    f = NULL;
    if (rename(path_part, path) != 0)
        rc = dh__set_error(-errno, "%s: cannot rename into place: %s", path, strerror(errno));
out:
    if (rc < 0 && path_part)
        unlink(path_part);
    dh_free(path);
    dh_free(path_part);
    return rc;
}

/* Number of online CPUs, at least 1. */
static unsigned cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (unsigned)n;
}

#define SYNTH_MAX_JOBS 256

int dh_synth_dataset_write(const char *out_dir, const dh_mix_t *mix, size_t count, uint64_t seed,
                           unsigned jobs, dh_synth_progress_fn progress, void *ctx,
                           dh_synth_totals_t *totals)
{
    return dh_synth_dataset_encoded(out_dir, mix, count, seed, jobs, DH_SYNTH_ENC_FLAT_B, progress,
                                    ctx, totals);
}

int dh_synth_dataset_encoded(const char *out_dir, const dh_mix_t *mix, size_t count, uint64_t seed,
                             unsigned jobs, dh_synth_encoding_t encoding,
                             dh_synth_progress_fn progress, void *ctx, dh_synth_totals_t *totals)
{
    assert(out_dir && mix);
    if (totals)
        *totals = (dh_synth_totals_t){0};
    if (mix->count == 0)
        return dh__set_error(DH_EINVAL, "mix %s: no entries", mix->name ? mix->name : "?");
    if (!dh_synth_encoding_name(encoding))
        return dh__set_error(DH_EINVAL, "%s: encoding %d: expected a dh_synth_encoding_t", out_dir,
                             (int)encoding);
    double total_weight = 0;
    for (size_t e = 0; e < mix->count; e++) {
        if (!(mix->entries[e].weight > 0) || !isfinite(mix->entries[e].weight))
            return dh__set_error(DH_EINVAL, "mix %s: entry [%zu]: weight must be > 0",
                                 mix->name ? mix->name : "?", e);
        total_weight += mix->entries[e].weight;
    }

    int rc;
    size_t dir_len = strlen(out_dir);
    char *clips_dir = dh_malloc(dir_len + sizeof "/clips");
    char *manifest = dh_malloc(dir_len + sizeof "/manifest.jsonl");
    clip_plan_t *plans = dh_calloc(count ? count : 1, sizeof *plans);
    pthread_t *threads = NULL;
    unsigned started = 0;
    dataset_run_t run = {.out_dir = out_dir, .plans = plans, .count = count, .failed_clip = count};
    if (!clips_dir || !manifest || !plans) {
        rc = dh__set_error(DH_ENOMEM, "%s: out of memory planning %zu clips", out_dir, count);
        goto out;
    }
    sprintf(clips_dir, "%s/clips", out_dir);
    sprintf(manifest, "%s/manifest.jsonl", out_dir);

    /* Check every clip before creating anything: a mix entry the encoder refuses (a side
     * under 16 pixels...) fails fast, naming the first clip it would have made. */
    for (size_t i = 0; i < count; i++) {
        plan_clip(mix, total_weight, seed, i, &plans[i]);
        plans[i].encoding = encoding;
        int64_t frames;
        int gop;
        char name[64];
        snprintf(name, sizeof name, "clips/v%07zu.mp4 (mix entry [%zu])", i, plans[i].entry);
        if ((rc = clip_check(name, &plans[i].clip, &frames, &gop)) < 0)
            goto out;
    }
    if ((rc = dh__make_parent_dirs(out_dir)) < 0 || (rc = make_dir(out_dir)) < 0 ||
        (rc = make_dir(clips_dir)) < 0)
        goto out;
    if (unlink(manifest) != 0 && errno != ENOENT) {
        rc = dh__set_error(-errno, "%s: cannot remove the old manifest: %s", manifest,
                           strerror(errno));
        goto out;
    }

    if (jobs == 0)
        jobs = cpu_count();
    if (jobs > SYNTH_MAX_JOBS)
        jobs = SYNTH_MAX_JOBS;
    if (jobs > count)
        jobs = count ? (unsigned)count : 1;
    threads = dh_calloc(jobs, sizeof *threads);
    if (!threads) {
        rc = dh__set_error(DH_ENOMEM, "%s: out of memory starting %u jobs", out_dir, jobs);
        goto out;
    }
    pthread_mutex_init(&run.lock, NULL);
    pthread_cond_init(&run.changed, NULL);
    atomic_init(&run.next, 0);
    atomic_init(&run.stop, false);
    int create_rc = 0;
    for (; started < jobs; started++) {
        pthread_mutex_lock(&run.lock);
        run.running++;
        pthread_mutex_unlock(&run.lock);
        if ((create_rc = pthread_create(&threads[started], NULL, dataset_worker, &run)) != 0) {
            pthread_mutex_lock(&run.lock);
            run.running--;
            pthread_mutex_unlock(&run.lock);
            break;
        }
    }
    if (started == 0) {
        rc = dh__set_error(-create_rc, "%s: cannot start an encoder thread: %s", out_dir,
                           strerror(create_rc));
    } else {
        /* Fewer threads than asked for is slower, not wrong. Report progress here, on the
         * calling thread, one call per finished clip. */
        size_t reported = 0;
        pthread_mutex_lock(&run.lock);
        for (;;) {
            if (reported < run.done) {
                size_t done = run.done;
                pthread_mutex_unlock(&run.lock);
                while (progress && reported < done)
                    progress(++reported, count, ctx);
                reported = done;
                pthread_mutex_lock(&run.lock);
                continue;
            }
            if (run.running == 0)
                break;
            pthread_cond_wait(&run.changed, &run.lock);
        }
        pthread_mutex_unlock(&run.lock);
        rc = 0;
    }
    for (unsigned t = 0; t < started; t++)
        pthread_join(threads[t], NULL);
    pthread_cond_destroy(&run.changed);
    pthread_mutex_destroy(&run.lock);
    if (rc < 0)
        goto out;
    if (run.failed_clip < count) {
        rc = dh__set_error(run.failed_rc, "%s", run.failed_msg);
        goto out;
    }
    if ((rc = manifest_write(out_dir, plans, mix, count)) < 0)
        goto out;
    if (totals) {
        totals->clips = count;
        totals->bytes = run.bytes;
        for (size_t i = 0; i < count; i++) {
            totals->frames += plans[i].frames;
            totals->video_s += (double)plans[i].frames / plans[i].clip.fps;
        }
    }
out:
    dh_free(threads);
    dh_free(plans);
    dh_free(manifest);
    dh_free(clips_dir);
    return rc;
}

int dh_synth_encoding_parse(const char *name, dh_synth_encoding_t *out)
{
    for (size_t i = 0; name && i < DH_ARRAY_LEN(encoding_names); i++)
        if (strcmp(name, encoding_names[i]) == 0) {
            *out = (dh_synth_encoding_t)i;
            return 0;
        }
    return dh__set_error(DH_EINVAL, "encoding '%s': expected flat-b, x264-default or no-b",
                         name ? name : "(null)");
}

int dh_synth_dataset(const char *out_dir, const dh_mix_t *mix, size_t count, uint64_t seed,
                     unsigned jobs, dh_synth_progress_fn progress, void *ctx)
{
    return dh_synth_dataset_write(out_dir, mix, count, seed, jobs, progress, ctx, NULL);
}
