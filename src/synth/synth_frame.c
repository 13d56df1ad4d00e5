/* synth_frame.c: the content of a synthetic clip (synth.h, docs/synth.md): its pixels,
 * dh_synth_frame_rgb, and the caption that describes them. Synthetic data sets are real
 * H.264/MP4 clips with moving, textured content, so that decoding them costs what decoding
 * real video costs; the pipeline's tests and benchmarks run on them before any real data
 * set is at hand.
 *
 * A frame is a palette-mapped procedural texture (two layers of one periodic 256x256 tile,
 * each translating, rotating and scaled on its own) plus a few solid shapes on Lissajous
 * paths, and the frame index drawn as a binary code in the top rows. Deterministic for
 * (seed, index). About 2 ns a pixel: the tile is computed once per process, a frame only
 * walks it in fixed point. The caption (dh__synth_caption) is drawn from the same seed as
 * the pixels, so it names the clip's colours, shapes and motion.
 */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datahelix/rng.h"
#include "datahelix/synth.h"
#include "core/internal.h"
#include "synth/synth_internal.h"

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
        ly->scale = dh__synth_uniform_in(&rng, 0.5, 1.5);
        ly->angle = dh__synth_uniform_in(&rng, 0, 6.283185307179586);
        ly->spin = dh__synth_uniform_in(&rng, 0.05, 0.4) * (dh_rng_below(&rng, 2) ? 1 : -1);
        ly->u0 = dh__synth_uniform_in(&rng, 0, TILE);
        ly->v0 = dh__synth_uniform_in(&rng, 0, TILE);
        double heading = dh__synth_uniform_in(&rng, 0, 6.283185307179586);
        double speed = dh__synth_uniform_in(&rng, 8, 40);
        ly->speed_u = speed * cos(heading);
        ly->speed_v = speed * sin(heading);
    }
    sc->shape_count = 3 + dh_rng_below(&rng, MAX_SHAPES - 2);
    for (size_t s = 0; s < sc->shape_count; s++) {
        shape_t *sh = &sc->shapes[s];
        sh->colour = dh_rng_below(&rng, DH_ARRAY_LEN(colours));
        sh->disc = dh_rng_below(&rng, 2) != 0;
        sh->radius_frac = dh__synth_uniform_in(&rng, 0.05, 0.14);
        sh->amp_x = dh__synth_uniform_in(&rng, 0.15, 0.38);
        sh->amp_y = dh__synth_uniform_in(&rng, 0.15, 0.38);
        sh->rate_x = dh__synth_uniform_in(&rng, 0.4, 2.0);
        sh->rate_y = dh__synth_uniform_in(&rng, 0.4, 2.0);
        sh->phase_x = dh__synth_uniform_in(&rng, 0, 6.283185307179586);
        sh->phase_y = dh__synth_uniform_in(&rng, 0, 6.283185307179586);
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

static const char *article(const char *word)
{
    return strchr("aeiou", word[0]) ? "an" : "a";
}

/* A short sentence about what the clip shows (its colours, shapes and motion), from the
 * same seed as its pixels. Plain lower-case ASCII words: no JSON escaping needed. */
void dh__synth_caption(uint64_t seed, char *out, size_t size)
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
