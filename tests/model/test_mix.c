/* Tests of workload mixes and synthetic profile generation (src/model/mix.c) and of the
 * `datahelix gen-profiles` command built on them (run through $DH_CLI). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "dh_test.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/mix.h"
#include "datahelix/profile.h"

static dh_mix_t *load_mix(const char *name)
{
    dh_mix_t *mix = NULL;
    int rc = dh_mix_load(name, &mix);
    if (rc != 0)
        print_error("dh_mix_load(%s): %s\n", name, dh_last_error());
    assert_int_equal(rc, 0);
    assert_non_null(mix);
    return mix;
}

static dh_profile_set_t *generate(const char *mix_name, size_t count, uint64_t seed)
{
    dh_mix_t *mix = load_mix(mix_name);
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profiles_generate(mix, count, seed, set), 0);
    assert_int_equal(dh_profile_set_count(set), count);
    dh_mix_destroy(&mix);
    assert_null(mix);
    return set;
}

static void builtin_names_are_listed_and_load(void **state)
{
    const char *const *names = dh_mix_builtin_names();
    size_t n = 0;
    for (; names[n]; n++) {
        dh_mix_t *mix = load_mix(names[n]);
        assert_string_equal(mix->name, names[n]);
        assert_true(mix->count >= 1);
        for (size_t i = 0; i < mix->count; i++) {
            assert_true(mix->entries[i].frames > 0);
            assert_true(mix->entries[i].weight > 0);
            assert_true(mix->entries[i].fps >= 24 && mix->entries[i].fps <= 60);
        }
        dh_mix_destroy(&mix);
    }
    assert_int_equal(n, 5);
}

static void kinetics_mixes_have_the_paper_shapes(void **state)
{
    static const struct {
        const char *name;
        int32_t frames, side;
    } want[] = {{"kinetics-s", 16, 224}, {"kinetics-m", 32, 336}, {"kinetics-l", 64, 448}};
    dh_mix_t *mixed = load_mix("kinetics-mixed");
    assert_int_equal(mixed->count, 3);
    for (size_t i = 0; i < 3; i++) {
        dh_mix_t *mix = load_mix(want[i].name);
        assert_int_equal(mix->count, 1);
        assert_int_equal(mix->entries[0].frames, want[i].frames);
        assert_int_equal(mix->entries[0].height, want[i].side);
        assert_int_equal(mix->entries[0].width, want[i].side);
        assert_close(mix->entries[0].duration_s, 10.0, 1e-9);
        /* kinetics-mixed is S, M, L in equal parts. */
        assert_int_equal(mixed->entries[i].frames, want[i].frames);
        assert_int_equal(mixed->entries[i].height, want[i].side);
        assert_close(mixed->entries[i].weight, 1.0, 1e-12);
        dh_mix_destroy(&mix);
    }
    dh_mix_destroy(&mixed);
}

static void openvid_mix_is_a_wide_spread(void **state)
{
    dh_mix_t *mix = load_mix("openvid-mixed");
    assert_true(mix->count >= 6 && mix->count <= 10);
    int portrait = 0, landscape = 0;
    double min_d = 1e9, max_d = 0;
    int32_t min_f = 1 << 30, max_f = 0, min_short = 1 << 30, max_short = 0;
    for (size_t i = 0; i < mix->count; i++) {
        const dh_mix_entry_t *e = &mix->entries[i];
        portrait += e->height > e->width;
        landscape += e->width > e->height;
        min_d = fmin(min_d, e->duration_s);
        max_d = fmax(max_d, e->duration_s);
        min_f = e->frames < min_f ? e->frames : min_f;
        max_f = e->frames > max_f ? e->frames : max_f;
        int32_t s = e->height < e->width ? e->height : e->width;
        min_short = s < min_short ? s : min_short;
        max_short = s > max_short ? s : max_short;
    }
    assert_true(portrait >= 2);
    assert_true(landscape >= 2);
    assert_close(min_d, 2.0, 1e-9);
    assert_close(max_d, 20.0, 1e-9);
    assert_int_equal(min_f, 8);
    assert_int_equal(max_f, 64);
    assert_int_equal(min_short, 256);
    assert_int_equal(max_short, 720);
    dh_mix_destroy(&mix);
}

static void tokens_visual_follows_the_formula(void **state)
{
    assert_int_equal(dh_tokens_visual(16, 224, 224), 512);
    assert_int_equal(dh_tokens_visual(32, 336, 336), 2304);
    assert_int_equal(dh_tokens_visual(64, 448, 448), 8192);
    /* Rounding: ceil(15/2)=8, ceil(225/14)=17, ceil(100/14)=8 -> 8*17*8/4 = 272. */
    assert_int_equal(dh_tokens_visual(15, 225, 100), 272);
    /* 1 frame, 1x1: 1*1*1/4 = 0 (integer division). */
    assert_int_equal(dh_tokens_visual(1, 1, 1), 0);
    assert_int_equal(dh_tokens_visual(1, 28, 28), 1);
}

static void generate_is_deterministic_for_a_seed(void **state)
{
    dh_profile_set_t *a = generate("openvid-mixed", 500, 42);
    dh_profile_set_t *b = generate("openvid-mixed", 500, 42);
    dh_profile_set_t *c = generate("openvid-mixed", 500, 43);
    dh_profile_set_t *prefix = generate("openvid-mixed", 100, 42);
    size_t differ = 0;
    for (size_t i = 0; i < 500; i++) {
        const dh_profile_row_t *ra = dh_profile_set_row(a, i), *rb = dh_profile_set_row(b, i),
                               *rc = dh_profile_set_row(c, i);
        assert_string_equal(ra->id, rb->id);
        assert_string_equal(ra->profile_key, rb->profile_key);
        assert_true(ra->cpu_s_est == rb->cpu_s_est);
        assert_int_equal(ra->tokens_est, rb->tokens_est);
        assert_int_equal(ra->in_bytes, rb->in_bytes);
        assert_true(ra->duration_s == rb->duration_s);
        differ += ra->cpu_s_est != rc->cpu_s_est;
        if (i < 100) /* row i does not depend on the count drawn */
            assert_true(ra->cpu_s_est == dh_profile_set_row(prefix, i)->cpu_s_est);
    }
    assert_true(differ > 450);
    dh_profile_set_destroy(&a);
    dh_profile_set_destroy(&b);
    dh_profile_set_destroy(&c);
    dh_profile_set_destroy(&prefix);
}

static void generated_rows_follow_the_cost_model(void **state)
{
    dh_profile_set_t *set = generate("kinetics-mixed", 3000, 7);
    assert_int_equal(dh_profile_set_key_count(set), 3);
    double cpu_sum[3] = {0};
    size_t per_key[3] = {0};
    for (size_t i = 0; i < 3000; i++) {
        const dh_profile_row_t *r = dh_profile_set_row(set, i);
        char id[16], uri[64], key[32];
        snprintf(id, sizeof id, "s%07zu", i);
        snprintf(uri, sizeof uri, "synthetic://%s.mp4", id);
        snprintf(key, sizeof key, "f%dx%dx%d", r->frames, r->height, r->width);
        assert_string_equal(r->id, id);
        assert_string_equal(r->uri, uri);
        assert_string_equal(r->profile_key, key);
        assert_string_equal(r->codec, "h264");
        assert_null(r->extra);
        assert_true(r->text_len >= 10 && r->text_len <= 300);
        assert_int_equal(r->tokens_est,
                         dh_tokens_visual(r->frames, r->height, r->width) + r->text_len);
        assert_int_equal(r->out_bytes, (int64_t)r->frames * r->height * r->width * 3);
        assert_true(r->duration_s >= 5.0 && r->duration_s <= 15.0);
        assert_true(r->fps == 25.0 || r->fps == 30.0);
        assert_true(r->cpu_s_est > 0.002 && r->cpu_s_est < 2.0);
        assert_true(r->in_bytes > 0);
        int k = r->frames == 16 ? 0 : r->frames == 32 ? 1 : 2;
        cpu_sum[k] += r->cpu_s_est;
        per_key[k]++;
    }
    /* Equal weights: each third within a few standard deviations (sd ~26). */
    for (int k = 0; k < 3; k++)
        assert_true(per_key[k] > 880 && per_key[k] < 1120);
    /* Bigger shapes cost more CPU on average. */
    double s = cpu_sum[0] / per_key[0], m = cpu_sum[1] / per_key[1], l = cpu_sum[2] / per_key[2];
    assert_true(s < m);
    assert_true(m < l);
    assert_true(l / s > 2.5);
    dh_profile_set_destroy(&set);
}

static void generate_respects_weights(void **state)
{
    const char *path = dh_test_path("weights.json");
    dh_test_write_file(path,
                       "[{\"frames\": 8, \"height\": 256, \"width\": 256, \"duration_s\": 2,"
                       "  \"weight\": 3},"
                       " {\"frames\": 16, \"height\": 256, \"width\": 256, \"duration_s\": 2}]");
    dh_mix_t *mix = load_mix(path);
    assert_close(mix->entries[1].weight, 1.0, 0); /* default weight */
    assert_close(mix->entries[1].fps, 30.0, 0);   /* default fps */
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profiles_generate(mix, 4000, 1, set), 0);
    size_t eights = 0;
    for (size_t i = 0; i < 4000; i++)
        eights += dh_profile_set_row(set, i)->frames == 8;
    /* Expect 3000 (sd ~27). */
    assert_true(eights > 2850 && eights < 3150);
    /* Appending continues the ids. */
    assert_int_equal(dh_profiles_generate(mix, 2, 1, set), 0);
    assert_string_equal(dh_profile_set_row(set, 4001)->id, "s0004001");
    dh_profile_set_destroy(&set);
    dh_mix_destroy(&mix);
}

static void generate_empty_mix_is_einval(void **state)
{
    dh_mix_t empty = {.name = "empty", .entries = NULL, .count = 0};
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profiles_generate(&empty, 10, 1, set), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "empty"));
    assert_int_equal(dh_profile_set_count(set), 0);
    dh_profile_set_destroy(&set);
}

static void unknown_mix_name_is_eunknown(void **state)
{
    dh_mix_t *mix = NULL;
    assert_int_equal(dh_mix_load("kinetics-xl", &mix), DH_EUNKNOWN);
    assert_null(mix);
    assert_non_null(strstr(dh_last_error(), "kinetics-xl"));
    assert_non_null(strstr(dh_last_error(), "kinetics-mixed"));
}

/* Loads text as a mix file and expects err with a message holding needle. */
static void expect_mix_error(const char *text, int err, const char *needle)
{
    const char *path = dh_test_path("mix.json");
    dh_test_write_file(path, text);
    dh_mix_t *mix = NULL;
    int rc = dh_mix_load(path, &mix);
    if (rc != err || !strstr(dh_last_error(), needle) || !strstr(dh_last_error(), "mix.json"))
        print_error("text %s: rc %s, message '%s', wanted '%s'\n", text, dh_err_name(rc),
                    dh_last_error(), needle);
    assert_int_equal(rc, err);
    assert_null(mix);
    assert_non_null(strstr(dh_last_error(), needle));
    assert_non_null(strstr(dh_last_error(), "mix.json"));
}

static void mix_file_errors_name_entry_and_field(void **state)
{
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"width\": 256, \"duration_s\": 2},"
                     " {\"frames\": 8, \"height\": -1, \"width\": 256, \"duration_s\": 2}]",
                     DH_ESCHEMA, "entry [1]: field 'height'");
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"duration_s\": 2}]", DH_ESCHEMA,
                     "entry [0]: field 'width': missing");
    expect_mix_error("[{\"frames\": 8.5, \"height\": 256, \"width\": 256, \"duration_s\": 2}]",
                     DH_ESCHEMA, "entry [0]: field 'frames': expected an integer");
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"width\": 256}]", DH_ESCHEMA,
                     "entry [0]: field 'duration_s': missing");
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"width\": 256, \"duration_s\": 0}]",
                     DH_ESCHEMA, "entry [0]: field 'duration_s': expected a number in (0, 86400]");
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"width\": 256, \"duration_s\": 2,"
                     " \"fps\": \"30\"}]",
                     DH_ESCHEMA, "entry [0]: field 'fps'");
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"width\": 256, \"duration_s\": 2,"
                     " \"weight\": -2}]",
                     DH_ESCHEMA, "entry [0]: field 'weight'");
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"width\": 256, \"duration_s\": 2,"
                     " \"weigth\": 2}]",
                     DH_ESCHEMA, "entry [0]: unknown field 'weigth'");
    expect_mix_error("[{\"frames\": 8, \"height\": 99999, \"width\": 256, \"duration_s\": 2}]",
                     DH_ESCHEMA, "entry [0]: field 'height': expected an integer in [1, 16384]");
    expect_mix_error("[3]", DH_ESCHEMA, "entry [0]: expected an object");
    expect_mix_error("[]", DH_ESCHEMA, "no entries");
    expect_mix_error("{\"frames\": 8}", DH_ESCHEMA, "expected a JSON list");
    expect_mix_error("[{\"frames\": 8,\n \"height\" 256}]", DH_EPARSE, "mix.json:2: not JSON");
}

/* dh_mix_parse reads the same text as a file, names its source, and rejects what a file
 * would (a syntax error names the line). */
static void mix_parse_reads_text_and_names_the_source(void **state)
{
    static const char text[] = "[{\"frames\": 8, \"height\": 256, \"width\": 448, "
                               "\"duration_s\": 2, \"fps\": 24, \"weight\": 2}]trailing";
    dh_mix_t *mix = NULL;
    /* Only `len` bytes are read: the trailing text is not part of it. */
    assert_int_equal(dh_mix_parse(text, strlen(text) - strlen("trailing"), "--mix", &mix), 0);
    assert_string_equal(mix->name, "--mix");
    assert_int_equal(mix->count, 1);
    assert_int_equal(mix->entries[0].width, 448);
    assert_true(mix->entries[0].fps == 24.0 && mix->entries[0].weight == 2.0);
    dh_mix_destroy(&mix);
    assert_int_equal(dh_mix_parse(text, strlen(text), "--mix", &mix), DH_EPARSE);
    assert_null(mix);
    assert_non_null(strstr(dh_last_error(), "--mix:1: not JSON"));
    assert_int_equal(dh_mix_parse("[{\"frames\": 8}]", 15, NULL, &mix), DH_ESCHEMA);
    assert_null(mix);
    assert_non_null(strstr(dh_last_error(), "mix: entry [0]: field 'height': missing"));
}

/* Found by fuzzing (tests/fuzz/fuzz_mix.c; the input is tests/fuzz/corpus/mix/
 * regression-huge-duration): a mix accepted with "duration_s": 1e33 made
 * dh_profiles_generate fail with DH_ESCHEMA (in_bytes overflowed int64 to a negative
 * count), which mix.h does not allow for a loaded mix. duration_s, fps and weight now have
 * upper bounds that keep every drawn row valid; a mix at every bound draws valid rows. */
static void mix_bounds_keep_generated_rows_valid(void **state)
{
    expect_mix_error("[{\"frames\": 100000, \"height\": 16384, \"width\": 1, "
                     "\"duration_s\": 1e33}]",
                     DH_ESCHEMA, "entry [0]: field 'duration_s': expected a number in (0, 86400]");
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"width\": 256, \"duration_s\": 2,"
                     " \"fps\": 1000.5}]",
                     DH_ESCHEMA, "entry [0]: field 'fps': expected a number in (0, 1000]");
    expect_mix_error("[{\"frames\": 8, \"height\": 256, \"width\": 256, \"duration_s\": 2,"
                     " \"weight\": 1e300}, {\"frames\": 8, \"height\": 256, \"width\": 256,"
                     " \"duration_s\": 2, \"weight\": 1e300}]",
                     DH_ESCHEMA, "entry [0]: field 'weight': expected a number in (0, 1e+12]");
    static const char *const at_bounds[] = {
        "[{\"frames\": 100000, \"height\": 16384, \"width\": 1, \"duration_s\": 86400, "
        "\"fps\": 1000, \"weight\": 1e12},"
        " {\"frames\": 100000, \"height\": 16384, \"width\": 16384, \"duration_s\": 86400,"
        " \"fps\": 1000, \"weight\": 1e12},"
        " {\"frames\": 1, \"height\": 1, \"width\": 16384, \"duration_s\": 1e-300,"
        " \"fps\": 1e-300, \"weight\": 1e-300}]",
    };
    const char *path = dh_test_path("bounds-mix.json");
    dh_test_write_file(path, at_bounds[0]);
    dh_mix_t *mix = load_mix(path);
    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    int rc = dh_profiles_generate(mix, 200, 11, set);
    if (rc != 0)
        print_error("dh_profiles_generate: %s\n", dh_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(dh_profile_set_count(set), 200);
    for (size_t i = 0; i < 200; i++) {
        const dh_profile_row_t *r = dh_profile_set_row(set, i);
        assert_true(r->in_bytes >= 0 && r->out_bytes >= 0 && r->tokens_est >= 0);
        assert_true(isfinite(r->cpu_s_est) && r->cpu_s_est >= 0);
    }
    dh_profile_set_destroy(&set);
    dh_mix_destroy(&mix);
}

static int mix_load_and_generate(void *ctx)
{
    dh_mix_t *mix = NULL;
    dh_profile_set_t *set = NULL;
    int rc = dh_mix_load(ctx, &mix);
    if (rc == 0)
        rc = dh_profile_set_new(&set);
    if (rc == 0)
        rc = dh_profiles_generate(mix, 100, 3, set);
    dh_profile_set_destroy(&set);
    dh_mix_destroy(&mix);
    return rc;
}

static void mix_file_survives_each_allocation_failure(void **state)
{
    const char *path = dh_test_path("alloc-mix.json");
    dh_test_write_file(path, "[{\"frames\": 8, \"height\": 256, \"width\": 448, \"duration_s\": 2,"
                             " \"fps\": 24, \"weight\": 2},"
                             " {\"frames\": 16, \"height\": 640, \"width\": 360,"
                             " \"duration_s\": 6}]");
    assert_true(dh_test_each_allocation_failure(mix_load_and_generate, (void *)path) > 5);
}

/* ---- the gen-profiles command ---------------------------------------------------------- */

/* Runs "$DH_CLI args" with stderr to a file; returns the exit status. */
static int run_cli(const char *args, const char *stderr_path)
{
    const char *cli = getenv("DH_CLI");
    if (!cli || !*cli)
        fail_msg("DH_CLI is not set (run the tests through ctest)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>'%s' >/dev/null", cli, args, stderr_path);
    int status = system(cmd);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void gen_profiles_cli_writes_a_loadable_file(void **state)
{
    char out[1024], err[1024], args[3000];
    snprintf(out, sizeof out, "%s", dh_test_path("gen.jsonl"));
    snprintf(err, sizeof err, "%s", dh_test_path("gen.err"));
    snprintf(args, sizeof args, "gen-profiles --mix kinetics-mixed --count 300 --seed 5 -o '%s'",
             out);
    assert_int_equal(run_cli(args, err), 0);
    const char *summary = read_file(err);
    assert_non_null(strstr(summary, "wrote 300 rows"));
    assert_non_null(strstr(summary, "f16x224x224="));
    assert_non_null(strstr(summary, "f64x448x448="));

    dh_profile_set_t *set = NULL;
    assert_int_equal(dh_profile_set_new(&set), 0);
    assert_int_equal(dh_profile_set_load(set, out), 0);
    assert_int_equal(dh_profile_set_count(set), 300);
    /* Same rows as the library draws for the same seed. */
    dh_profile_set_t *lib = generate("kinetics-mixed", 300, 5);
    for (size_t i = 0; i < 300; i++) {
        const dh_profile_row_t *a = dh_profile_set_row(set, i), *b = dh_profile_set_row(lib, i);
        assert_string_equal(a->id, b->id);
        assert_true(a->cpu_s_est == b->cpu_s_est);
        assert_int_equal(a->tokens_est, b->tokens_est);
    }
    /* The summary counts agree with the file. */
    for (size_t k = 0; k < dh_profile_set_key_count(set); k++) {
        size_t n = 0;
        for (size_t i = 0; i < 300; i++)
            n += dh_profile_set_row(set, i)->key_index == k;
        char needle[64];
        snprintf(needle, sizeof needle, "%s=%zu", dh_profile_set_key(set, k), n);
        assert_non_null(strstr(summary, needle));
    }
    dh_profile_set_destroy(&set);
    dh_profile_set_destroy(&lib);
}

static void gen_profiles_cli_reports_usage_errors(void **state)
{
    char err[1024];
    snprintf(err, sizeof err, "%s", dh_test_path("usage.err"));
    assert_int_equal(run_cli("gen-profiles --mix kinetics-s --count -1", err), 2);
    assert_non_null(strstr(read_file(err), "--count"));
    assert_int_equal(run_cli("gen-profiles --count 5", err), 2);
    assert_non_null(strstr(read_file(err), "--mix is required"));
    assert_int_equal(run_cli("gen-profiles --mix no-such-mix --count 5", err), 1);
    assert_non_null(strstr(read_file(err), "no-such-mix"));
    assert_int_equal(run_cli("gen-profiles --help", err), 0);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(builtin_names_are_listed_and_load),
    cmocka_unit_test(kinetics_mixes_have_the_paper_shapes),
    cmocka_unit_test(openvid_mix_is_a_wide_spread),
    cmocka_unit_test(tokens_visual_follows_the_formula),
    cmocka_unit_test(generate_is_deterministic_for_a_seed),
    cmocka_unit_test(generated_rows_follow_the_cost_model),
    cmocka_unit_test(generate_respects_weights),
    cmocka_unit_test(generate_empty_mix_is_einval),
    cmocka_unit_test(unknown_mix_name_is_eunknown),
    cmocka_unit_test(mix_file_errors_name_entry_and_field),
    cmocka_unit_test(mix_parse_reads_text_and_names_the_source),
    cmocka_unit_test(mix_bounds_keep_generated_rows_valid),
    cmocka_unit_test(mix_file_survives_each_allocation_failure),
    cmocka_unit_test(gen_profiles_cli_writes_a_loadable_file),
    cmocka_unit_test(gen_profiles_cli_reports_usage_errors),
};
DH_TEST_MAIN(tests)
