/* s3_config.c: S3 settings and credentials resolved the way the AWS CLI resolves them
 * (docs/remote.md, "Credentials"): command-line options, then the environment
 * (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, AWS_REGION,
 * AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_SHARED_CREDENTIALS_FILE,
 * AWS_CONFIG_FILE), then the shared files' profile. No keys anywhere: anonymous access (a
 * public bucket), as `aws --no-sign-request`.
 *
 * Limit: no credential_process, SSO, web identity, role assumption or instance metadata
 * (IMDS): those need a process or a network call of their own; a profile that relies on one
 * fails naming the setting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/s3.h"

void dh__s3_config_clear(dh__s3_config_t *c)
{
    if (!c)
        return;
    if (c->secret_access_key) /* scrubbed, so a secret does not outlive its use in freed memory */
        explicit_bzero(c->secret_access_key, strlen(c->secret_access_key));
    dh_free(c->access_key_id);
    dh_free(c->secret_access_key);
    dh_free(c->session_token);
    dh_free(c->region);
    dh_free(c->endpoint_url);
    dh_free(c->source);
    memset(c, 0, sizeof(*c));
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static int set(char **field, const char *value)
{
    dh_free(*field);
    *field = NULL;
    if (!value)
        return 0;
    if (!(*field = dh_strdup(value)))
        return dh__set_error(DH_ENOMEM, "s3: out of memory reading the settings");
    return 0;
}

static int set_source(dh__s3_config_t *c, const char *fmt, const char *a, const char *b)
{
    char text[1024];
    snprintf(text, sizeof(text), fmt, a, b);
    return set(&c->source, text);
}

/* An endpoint is http(s)://host[:port] with nothing after but an optional '/'; it is kept
 * without that slash. */
static int check_endpoint(const char *url, const char *from)
{
    const char *rest = NULL;
    if (strncmp(url, "http://", 7) == 0)
        rest = url + 7;
    else if (strncmp(url, "https://", 8) == 0)
        rest = url + 8;
    if (!rest || !*rest || *rest == '/')
        return dh__set_error(DH_EINVAL, "%s: S3 endpoint '%s' is not http(s)://host[:port]", from,
                             url);
    const char *slash = strchr(rest, '/');
    if (slash && slash[1])
        return dh__set_error(
            DH_EINVAL, "%s: S3 endpoint '%s' has a path after the host (not supported)", from, url);
    if (strpbrk(rest, "?#@ "))
        return dh__set_error(DH_EINVAL,
                             "%s: S3 endpoint '%s' has a query, user or space (not supported)",
                             from, url);
    return 0;
}

static int set_endpoint(dh__s3_config_t *c, const char *url, const char *from)
{
    int rc = check_endpoint(url, from);
    if (rc < 0)
        return rc;
    if ((rc = set(&c->endpoint_url, url)) < 0)
        return rc;
    size_t n = strlen(c->endpoint_url);
    if (n && c->endpoint_url[n - 1] == '/')
        c->endpoint_url[n - 1] = '\0';
    return 0;
}

/* The shared files and the names of the profile's sections in them. */
typedef struct {
    char creds_path[4096], config_path[4096];
    dh__ini_t creds, config;
    bool have_creds, have_config;
    char config_section[512]; /* "default" or "profile NAME" */
} files_t;

static int load_file(const char *path, dh__ini_t *ini, bool *have)
{
    int rc = dh__ini_load(path, ini);
    *have = rc == 0;
    return rc == DH_ENOENT ? 0 : rc;
}

static int load_files(files_t *f, const char *profile)
{
    const char *home = env("HOME");
    const char *cp = env("AWS_SHARED_CREDENTIALS_FILE");
    const char *gp = env("AWS_CONFIG_FILE");
    if (cp)
        snprintf(f->creds_path, sizeof(f->creds_path), "%s", cp);
    else if (home)
        snprintf(f->creds_path, sizeof(f->creds_path), "%s/.aws/credentials", home);
    if (gp)
        snprintf(f->config_path, sizeof(f->config_path), "%s", gp);
    else if (home)
        snprintf(f->config_path, sizeof(f->config_path), "%s/.aws/config", home);
    if (strcmp(profile, "default") == 0)
        snprintf(f->config_section, sizeof(f->config_section), "default");
    else
        snprintf(f->config_section, sizeof(f->config_section), "profile %s", profile);
    int rc = 0;
    if (f->creds_path[0] && (rc = load_file(f->creds_path, &f->creds, &f->have_creds)) < 0)
        return rc;
    if (f->config_path[0] && (rc = load_file(f->config_path, &f->config, &f->have_config)) < 0)
        return rc;
    return 0;
}

/* A setting of the profile: the credentials file first (it holds keys), then config. */
static const char *profile_get(const files_t *f, const char *profile, const char *key,
                               const char **path, size_t *line)
{
    const char *v = NULL;
    if (f->have_creds && (v = dh__ini_get(&f->creds, profile, key, line))) {
        *path = f->creds_path;
        return v;
    }
    if (f->have_config && (v = dh__ini_get(&f->config, f->config_section, key, line))) {
        *path = f->config_path;
        return v;
    }
    return NULL;
}

static int from_profile(dh__s3_config_t *c, const files_t *f, const char *profile, bool named,
                        bool want_keys)
{
    bool exists = (f->have_creds && dh__ini_has_section(&f->creds, profile)) ||
                  (f->have_config && dh__ini_has_section(&f->config, f->config_section));
    if (!exists) {
        if (!named)
            return 0;
        return dh__set_error(
            DH_ENOENT, "s3: profile '%s' is in neither %s nor %s (section [%s] or [%s])", profile,
            f->creds_path[0] ? f->creds_path : "(no credentials file)",
            f->config_path[0] ? f->config_path : "(no config file)", profile, f->config_section);
    }
    const char *path = NULL;
    size_t line = 0;
    int rc;
    if (want_keys) {
        const char *id = profile_get(f, profile, "aws_access_key_id", &path, &line);
        const char *id_path = path;
        size_t id_line = line;
        const char *secret = profile_get(f, profile, "aws_secret_access_key", &path, &line);
        if (id && !secret)
            return dh__set_error(DH_ESCHEMA,
                                 "%s:%zu: profile '%s' has aws_access_key_id but no "
                                 "aws_secret_access_key",
                                 id_path, id_line, profile);
        if (!id && secret)
            return dh__set_error(DH_ESCHEMA,
                                 "%s:%zu: profile '%s' has aws_secret_access_key but no "
                                 "aws_access_key_id",
                                 path, line, profile);
        if (id) {
            const char *token = profile_get(f, profile, "aws_session_token", &path, &line);
            if ((rc = set(&c->access_key_id, id)) < 0 ||
                (rc = set(&c->secret_access_key, secret)) < 0 ||
                (rc = set(&c->session_token, token)) < 0 ||
                (rc = set_source(c, "profile '%s' in %s", profile, id_path)) < 0)
                return rc;
        } else {
            static const char *const unsupported[] = {"credential_process", "sso_start_url",
                                                      "sso_session", "role_arn",
                                                      "web_identity_token_file"};
            for (size_t i = 0; i < DH_ARRAY_LEN(unsupported); i++)
                if (profile_get(f, profile, unsupported[i], &path, &line))
                    return dh__set_error(DH_ESCHEMA,
                                         "%s:%zu: profile '%s' gets its keys through %s, "
                                         "which is not supported: give "
                                         "aws_access_key_id and aws_secret_access_key",
                                         path, line, profile, unsupported[i]);
            if (named)
                return dh__set_error(DH_ESCHEMA,
                                     "s3: profile '%s' has no aws_access_key_id in %s or %s",
                                     profile, f->creds_path, f->config_path);
        }
    }
    const char *v;
    if (!c->region && (v = profile_get(f, profile, "region", &path, &line)) &&
        (rc = set(&c->region, v)) < 0)
        return rc;
    if (!c->endpoint_url) {
        v = profile_get(f, profile, "s3.endpoint_url", &path, &line);
        if (!v)
            v = profile_get(f, profile, "endpoint_url", &path, &line);
        if (v) {
            char from[4200];
            snprintf(from, sizeof(from), "%s:%zu", path, line);
            if ((rc = set_endpoint(c, v, from)) < 0)
                return rc;
        }
    }
    if (c->style == DH__S3_STYLE_AUTO &&
        (v = profile_get(f, profile, "s3.addressing_style", &path, &line))) {
        if (strcasecmp(v, "path") == 0)
            c->style = DH__S3_STYLE_PATH;
        else if (strcasecmp(v, "virtual") == 0)
            c->style = DH__S3_STYLE_VIRTUAL;
        else if (strcasecmp(v, "auto") != 0)
            return dh__set_error(DH_EINVAL,
                                 "%s:%zu: addressing_style '%s' is not auto, path or virtual", path,
                                 line, v);
    }
    return 0;
}

int dh__s3_config_load(dh__s3_config_t *out, const dh__s3_options_t *opts)
{
    static const dh__s3_options_t none = {0};
    if (!opts)
        opts = &none;
    memset(out, 0, sizeof(*out));
    files_t *f = dh_calloc(1, sizeof(*f));
    if (!f)
        return dh__set_error(DH_ENOMEM, "s3: out of memory reading the settings");
    int rc = 0;
    out->style = opts->style;
    const char *region = opts->region ? opts->region : env("AWS_REGION");
    if (!region)
        region = env("AWS_DEFAULT_REGION");
    if ((rc = set(&out->region, region)) < 0)
        goto done;
    if (opts->endpoint_url) {
        if ((rc = set_endpoint(out, opts->endpoint_url, "--s3-endpoint")) < 0)
            goto done;
    } else if (env("AWS_ENDPOINT_URL_S3")) {
        if ((rc = set_endpoint(out, env("AWS_ENDPOINT_URL_S3"), "AWS_ENDPOINT_URL_S3")) < 0)
            goto done;
    } else if (env("AWS_ENDPOINT_URL")) {
        if ((rc = set_endpoint(out, env("AWS_ENDPOINT_URL"), "AWS_ENDPOINT_URL")) < 0)
            goto done;
    }

    /* Keys: from the environment unless a profile was named on the command line. */
    bool want_keys = !opts->anonymous;
    const char *id = env("AWS_ACCESS_KEY_ID"), *secret = env("AWS_SECRET_ACCESS_KEY");
    if (want_keys && !opts->profile && (id || secret)) {
        if (!id || !secret) {
            rc = dh__set_error(DH_ESCHEMA, "s3: %s is set but %s is not",
                               id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                               id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
            goto done;
        }
        if ((rc = set(&out->access_key_id, id)) < 0 ||
            (rc = set(&out->secret_access_key, secret)) < 0 ||
            (rc = set(&out->session_token, env("AWS_SESSION_TOKEN"))) < 0 ||
            (rc = set(&out->source, "environment (AWS_ACCESS_KEY_ID)")) < 0)
            goto done;
        want_keys = false;
    }
    const char *profile = opts->profile ? opts->profile : env("AWS_PROFILE");
    bool named = profile != NULL;
    if (!profile)
        profile = "default";
    if ((rc = load_files(f, profile)) < 0)
        goto done;
    if ((rc = from_profile(out, f, profile, named, want_keys)) < 0)
        goto done;
    if (!out->region && (rc = set(&out->region, "us-east-1")) < 0)
        goto done;
    if (!out->access_key_id && (rc = set(&out->source, "anonymous")) < 0)
        goto done;
done:
    dh__ini_clear(&f->creds);
    dh__ini_clear(&f->config);
    dh_free(f);
    if (rc < 0)
        dh__s3_config_clear(out);
    return rc;
}
