/* url.c: parses and redacts the URLs of remote sources (remote_lib.h): http://, https:// and
 * s3://bucket/key. Pure string work, no allocation: a parsed URL points into its string.
 *
 * Limits: no userinfo (credentials in a URL would be printed in every error), no percent-
 * decoding (the path is sent as written, so it must already be encoded), no IDN. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "datahelix/error.h"
#include "core/internal.h"
#include "remote/remote_lib.h"

static const struct {
    const char *prefix;
    dh__url_scheme_t scheme;
    int port;
} schemes[] = {
    {"http://", DH_URL_HTTP, 80}, {"https://", DH_URL_HTTPS, 443}, {"s3://", DH_URL_S3, 0}};

dh__url_scheme_t dh__url_scheme(const char *path)
{
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
        if (strncasecmp(path, schemes[i].prefix, strlen(schemes[i].prefix)) == 0)
            return schemes[i].scheme;
    return DH_URL_NONE;
}

const char *dh__url_redact(const char *url, char *buf, size_t size)
{
    if (size == 0)
        return buf;
    size_t keep = strcspn(url, "?#");
    if (url[keep] == '?')
        snprintf(buf, size, "%.*s?...", (int)keep, url);
    else
        snprintf(buf, size, "%s", url);
    return buf;
}

static int refuse(const char *url, const char *why)
{
    char shown[512];
    return dh__set_error(DH_EINVAL, "%s: not a usable URL: %s",
                         dh__url_redact(url, shown, sizeof shown), why);
}

int dh__url_check_host(const char *url)
{
    const char *sep = strstr(url, "://");
    if (!sep || !sep[3] || sep[3] == '/' || sep[3] == '?' || sep[3] == '#')
        return dh__set_error(DH_EINVAL, "%.200s: names no host or bucket", url);
    return 0;
}

int dh__url_parse(const char *url, dh__url_t *out)
{
    memset(out, 0, sizeof *out);
    size_t i = 0;
    for (; i < sizeof schemes / sizeof schemes[0]; i++)
        if (strncasecmp(url, schemes[i].prefix, strlen(schemes[i].prefix)) == 0)
            break;
    if (i == sizeof schemes / sizeof schemes[0])
        return refuse(url, "the scheme is not http://, https:// or s3://");
    out->scheme = schemes[i].scheme;
    out->port = schemes[i].port;
    for (const unsigned char *c = (const unsigned char *)url; *c; c++)
        if (*c <= ' ' || *c == 0x7f)
            return refuse(url, "it holds a space or a control character (percent-encode it)");

    const char *auth = url + strlen(schemes[i].prefix);
    size_t auth_len = strcspn(auth, "/?#");
    const char *at = memchr(auth, '@', auth_len);
    if (at) { /* printed without them */
        char shown[512], tail[400];
        dh__url_redact(at + 1, tail, sizeof tail);
        snprintf(shown, sizeof shown, "%s...@%s", schemes[i].prefix, tail);
        return dh__set_error(DH_EINVAL,
                             "%s: not a usable URL: credentials in a URL are not accepted "
                             "(they would be printed in errors); give them to the scheme's "
                             "settings",
                             shown);
    }
    const char *host = auth, *port = NULL;
    size_t host_len;
    if (auth_len > 0 && auth[0] == '[') { /* an IPv6 literal */
        const char *close = memchr(auth, ']', auth_len);
        if (!close)
            return refuse(url, "an IPv6 host without its ']'");
        host = auth + 1;
        host_len = (size_t)(close - host);
        if (close + 1 < auth + auth_len) {
            if (close[1] != ':')
                return refuse(url, "text after the IPv6 host's ']'");
            port = close + 2;
        }
    } else {
        const char *colon = memchr(auth, ':', auth_len);
        host_len = colon ? (size_t)(colon - auth) : auth_len;
        port = colon ? colon + 1 : NULL;
    }
    if (host_len == 0)
        return refuse(url, out->scheme == DH_URL_S3 ? "no bucket" : "no host");
    if (host_len >= sizeof out->host)
        return refuse(url, "the host is longer than 255 bytes");
    for (size_t k = 0; k < host_len; k++)
        out->host[k] = (char)tolower((unsigned char)host[k]);
    if (port) {
        if (out->scheme == DH_URL_S3)
            return refuse(url, "an s3:// URL names a bucket, not a host and port");
        size_t digits = (size_t)(auth + auth_len - port);
        long value = 0;
        if (digits == 0 || digits > 5)
            return refuse(url, "a bad port");
        for (size_t k = 0; k < digits; k++) {
            if (!isdigit((unsigned char)port[k]))
                return refuse(url, "a bad port");
            value = value * 10 + (port[k] - '0');
        }
        if (value < 1 || value > 65535)
            return refuse(url, "the port is outside 1..65535");
        out->port = (int)value;
        out->port_given = true;
    }

    const char *rest = auth + auth_len;
    size_t path_len = strcspn(rest, "?#");
    out->path = path_len ? rest : "/";
    out->path_len = path_len ? path_len : 1;
    if (path_len && rest[0] != '/')
        return refuse(url, "a bad path"); /* not reached: the authority stops at '/' */
    if (rest[path_len] == '?') {
        out->query = rest + path_len + 1;
        out->query_len = strcspn(out->query, "#");
    }
    return 0;
}
