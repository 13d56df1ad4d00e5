/* test_s3_config.c: settings and credentials resolved as AWS tools do: the environment, the
 * profile of the shared files (with their overrides), the precedence between them, anonymous
 * access, and errors that name the variable, file and line or profile, never the secret. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datahelix/error.h"
#include "dh_test.h"
#include "remote/s3.h"

static const char *const VARS[] = {"AWS_ACCESS_KEY_ID",
                                   "AWS_SECRET_ACCESS_KEY",
                                   "AWS_SESSION_TOKEN",
                                   "AWS_PROFILE",
                                   "AWS_REGION",
                                   "AWS_DEFAULT_REGION",
                                   "AWS_ENDPOINT_URL",
                                   "AWS_ENDPOINT_URL_S3",
                                   "AWS_SHARED_CREDENTIALS_FILE",
                                   "AWS_CONFIG_FILE"};

/* A clean environment: no AWS variable, HOME at an empty scratch folder (no ~/.aws). */
static int clean_env(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(VARS) / sizeof(VARS[0]); i++)
        unsetenv(VARS[i]);
    setenv("HOME", dh_test_path("home-empty"), 1);
    return 0;
}

static void files(const char *creds, const char *config)
{
    const char *cp = dh_test_path("credentials");
    dh_test_write_file(cp, creds);
    setenv("AWS_SHARED_CREDENTIALS_FILE", cp, 1);
    const char *gp = dh_test_path("config");
    dh_test_write_file(gp, config);
    setenv("AWS_CONFIG_FILE", gp, 1);
}

static void nothing_is_anonymous_in_us_east_1(void **state)
{
    (void)state;
    dh__s3_config_t c;
    assert_int_equal(dh__s3_config_load(&c, NULL), 0);
    assert_null(c.access_key_id);
    assert_null(c.secret_access_key);
    assert_string_equal(c.region, "us-east-1");
    assert_null(c.endpoint_url);
    assert_string_equal(c.source, "anonymous");
    dh__s3_config_clear(&c);
}

static void environment_keys(void **state)
{
    (void)state;
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
    setenv("AWS_SESSION_TOKEN", "envtoken", 1);
    setenv("AWS_DEFAULT_REGION", "eu-west-2", 1);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
    files("[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = filesecret\n",
          "[default]\nregion = ap-south-1\n");
    dh__s3_config_t c;
    assert_int_equal(dh__s3_config_load(&c, NULL), 0);
    assert_string_equal(c.access_key_id, "AKIDENV");
    assert_string_equal(c.secret_access_key, "envsecret");
    assert_string_equal(c.session_token, "envtoken");
    assert_string_equal(c.region, "eu-west-2");
    assert_string_equal(c.endpoint_url, "http://127.0.0.1:9000");
    assert_string_equal(c.source, "environment (AWS_ACCESS_KEY_ID)");
    dh__s3_config_clear(&c);
    /* AWS_REGION wins over AWS_DEFAULT_REGION; AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL. */
    setenv("AWS_REGION", "eu-north-1", 1);
    setenv("AWS_ENDPOINT_URL_S3", "https://s3.example.test", 1);
    assert_int_equal(dh__s3_config_load(&c, NULL), 0);
    assert_string_equal(c.region, "eu-north-1");
    assert_string_equal(c.endpoint_url, "https://s3.example.test");
    dh__s3_config_clear(&c);
    /* Options win over everything. */
    dh__s3_options_t o = {.region = "us-west-2", .endpoint_url = "http://[::1]:8000"};
    assert_int_equal(dh__s3_config_load(&c, &o), 0);
    assert_string_equal(c.region, "us-west-2");
    assert_string_equal(c.endpoint_url, "http://[::1]:8000");
    dh__s3_config_clear(&c);
}

static void default_profile_from_files(void **state)
{
    (void)state;
    files("[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = filesecret\n"
          "aws_session_token = filetoken\n",
          "[default]\nregion = ap-south-1\ns3 =\n  endpoint_url = http://127.0.0.1:9100\n"
          "  addressing_style = virtual\n");
    dh__s3_config_t c;
    assert_int_equal(dh__s3_config_load(&c, NULL), 0);
    assert_string_equal(c.access_key_id, "AKIDFILE");
    assert_string_equal(c.secret_access_key, "filesecret");
    assert_string_equal(c.session_token, "filetoken");
    assert_string_equal(c.region, "ap-south-1");
    assert_string_equal(c.endpoint_url, "http://127.0.0.1:9100");
    assert_int_equal(c.style, DH__S3_STYLE_VIRTUAL);
    assert_non_null(strstr(c.source, "profile 'default' in "));
    assert_non_null(strstr(c.source, "credentials"));
    dh__s3_config_clear(&c);
}

/* ~/.aws under HOME is read when no override names the files. */
static void home_aws_files(void **state)
{
    (void)state;
    char path[4096];
    mkdir(dh_test_path("home"), 0755);
    mkdir(dh_test_path("home/.aws"), 0755);
    snprintf(path, sizeof(path), "%s/.aws/credentials", dh_test_path("home"));
    dh_test_write_file(path, "[work]\naws_access_key_id = AKIDHOME\n"
                             "aws_secret_access_key = homesecret\n");
    snprintf(path, sizeof(path), "%s/.aws/config", dh_test_path("home"));
    dh_test_write_file(path, "[profile work]\nregion = sa-east-1\nendpoint_url = http://h:1\n");
    setenv("HOME", dh_test_path("home"), 1);
    setenv("AWS_PROFILE", "work", 1);
    dh__s3_config_t c;
    assert_int_equal(dh__s3_config_load(&c, NULL), 0);
    assert_string_equal(c.access_key_id, "AKIDHOME");
    assert_string_equal(c.region, "sa-east-1");
    assert_string_equal(c.endpoint_url, "http://h:1");
    dh__s3_config_clear(&c);
}

/* A profile named on the command line takes its keys from the files even when the
 * environment has keys (as `aws --profile`). */
static void named_profile_beats_environment_keys(void **state)
{
    (void)state;
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
    files("[dev]\naws_access_key_id = AKIDDEV\naws_secret_access_key = devsecret\n", "");
    dh__s3_options_t o = {.profile = "dev"};
    dh__s3_config_t c;
    assert_int_equal(dh__s3_config_load(&c, &o), 0);
    assert_string_equal(c.access_key_id, "AKIDDEV");
    assert_null(c.session_token);
    dh__s3_config_clear(&c);
    /* Asked for anonymous: no keys at all. */
    dh__s3_options_t anon = {.anonymous = true};
    assert_int_equal(dh__s3_config_load(&c, &anon), 0);
    assert_null(c.access_key_id);
    assert_string_equal(c.source, "anonymous");
    dh__s3_config_clear(&c);
}

static void errors_name_the_place_never_the_secret(void **state)
{
    (void)state;
    dh__s3_config_t c;
    /* A named profile that no file has. */
    files("[default]\naws_access_key_id = A\naws_secret_access_key = topsecret1\n", "");
    setenv("AWS_PROFILE", "nope", 1);
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_ENOENT);
    assert_non_null(strstr(dh_last_error(), "profile 'nope'"));
    assert_non_null(strstr(dh_last_error(), dh_test_path("credentials")));
    /* A key without its secret, with the line. */
    files("[default]\n\naws_access_key_id = A\n", "");
    unsetenv("AWS_PROFILE");
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_ESCHEMA);
    char want[4200];
    snprintf(want, sizeof(want),
             "%s:3: profile 'default' has aws_access_key_id but no "
             "aws_secret_access_key",
             dh_test_path("credentials"));
    assert_string_equal(dh_last_error(), want);
    /* A secret without its key. */
    files("[default]\naws_secret_access_key = topsecret2\n", "");
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_ESCHEMA);
    assert_null(strstr(dh_last_error(), "topsecret2"));
    assert_non_null(strstr(dh_last_error(), "credentials:2:"));
    /* A malformed line of the config file. */
    files("", "[default]\nregion\n");
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_EPARSE);
    assert_non_null(strstr(dh_last_error(), "config:2:"));
    /* Only one of the two variables. */
    files("", "");
    setenv("AWS_SECRET_ACCESS_KEY", "topsecret3", 1);
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_ESCHEMA);
    assert_string_equal(dh_last_error(), "s3: AWS_SECRET_ACCESS_KEY is set but "
                                         "AWS_ACCESS_KEY_ID is not");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    /* An endpoint that is not http(s)://host[:port], naming where it came from. */
    setenv("AWS_ENDPOINT_URL", "ftp://host", 1);
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "AWS_ENDPOINT_URL: S3 endpoint 'ftp://host'"));
    setenv("AWS_ENDPOINT_URL", "http://host/base/path", 1);
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_EINVAL);
    unsetenv("AWS_ENDPOINT_URL");
    /* A profile that gets its keys some unsupported way. */
    files("", "[profile sso]\nsso_session = corp\n");
    setenv("AWS_PROFILE", "sso", 1);
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_ESCHEMA);
    assert_non_null(strstr(dh_last_error(), "config:2: profile 'sso' gets its keys through "
                                            "sso_session"));
}

static void addressing_style_value_checked(void **state)
{
    (void)state;
    files("[x]\naws_access_key_id = A\naws_secret_access_key = s\n",
          "[profile x]\ns3 =\n  addressing_style = sideways\n");
    setenv("AWS_PROFILE", "x", 1);
    dh__s3_config_t c;
    assert_int_equal(dh__s3_config_load(&c, NULL), DH_EINVAL);
    assert_non_null(strstr(dh_last_error(), "config:3: addressing_style 'sideways'"));
}

static int load_from_files(void *ctx)
{
    (void)ctx;
    dh__s3_config_t c;
    int rc = dh__s3_config_load(&c, NULL);
    dh__s3_config_clear(&c);
    return rc;
}

static void config_allocation_failures(void **state)
{
    (void)state;
    files("[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = filesecret\n",
          "[default]\nregion = ap-south-1\ns3 =\n  endpoint_url = http://127.0.0.1:9100\n");
    assert_true(dh_test_each_allocation_failure(load_from_files, NULL) > 10);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup(nothing_is_anonymous_in_us_east_1, clean_env),
    cmocka_unit_test_setup(environment_keys, clean_env),
    cmocka_unit_test_setup(default_profile_from_files, clean_env),
    cmocka_unit_test_setup(home_aws_files, clean_env),
    cmocka_unit_test_setup(named_profile_beats_environment_keys, clean_env),
    cmocka_unit_test_setup(errors_name_the_place_never_the_secret, clean_env),
    cmocka_unit_test_setup(addressing_style_value_checked, clean_env),
    cmocka_unit_test_setup(config_allocation_failures, clean_env),
};
DH_TEST_MAIN(tests)
