/* core/fetch.c: the fetch tally, what a sample's decode waited for remote bytes (issue 34,
 * "costs that include the fetch"; docs/remote.md, "The fetch tally"), and the source key a
 * sample's bytes are learned under (docs/profiles.md, "The fetch model").
 *
 * The tally is per thread: the DataServer's worker binds one around each sample it executes
 * (src/runtime/dataserver_task.c), the remote reader adds to it on the thread that waits for
 * the bytes (dh__fetch_note), and the worker copies it into the sample's result (fetch_s,
 * fetch_bytes) for the COMPLETE the coordinator learns from. A thread with no tally bound
 * (a probe, a test, the CLI) counts nothing. No locks, no allocation: O(1) per call.
 */
#include <ctype.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "core/internal.h"

static _Thread_local dh__fetch_tally_t *bound_tally;

dh__fetch_tally_t *dh__fetch_tally_bind(dh__fetch_tally_t *tally)
{
    dh__fetch_tally_t *previous = bound_tally;
    bound_tally = tally;
    return previous;
}

void dh__fetch_note(uint64_t wait_ns, uint64_t bytes)
{
    dh__fetch_tally_t *t = bound_tally;
    if (!t)
        return;
    t->wait_ns += wait_ns;
    t->bytes += bytes;
}

/* The length of a URL's scheme when uri starts with "scheme://" (RFC 3986: a letter, then
 * letters, digits, '+', '-', '.'), else 0. */
static size_t scheme_len(const char *uri)
{
    if (!isalpha((unsigned char)uri[0]))
        return 0;
    size_t n = 1;
    while (isalnum((unsigned char)uri[n]) || uri[n] == '+' || uri[n] == '-' || uri[n] == '.')
        n++;
    return strncmp(uri + n, "://", 3) == 0 ? n : 0;
}

/* Whether a scheme of n bytes at uri is one of the remote sources (issue 34): http, https,
 * s3. Others (file, synthetic, ...) are read where they lie, or not at all. */
static int remote_scheme(const char *uri, size_t n)
{
    static const char *const remote[] = {"http", "https", "s3"};
    for (size_t i = 0; i < sizeof remote / sizeof remote[0]; i++)
        if (strlen(remote[i]) == n && strncasecmp(uri, remote[i], n) == 0)
            return 1;
    return 0;
}

size_t dh__fetch_source_key(const char *uri, char out[DH__FETCH_SOURCE_MAX])
{
    size_t scheme = uri ? scheme_len(uri) : 0;
    if (scheme == 0 || !remote_scheme(uri, scheme)) {
        memcpy(out, DH__FETCH_SOURCE_LOCAL, sizeof DH__FETCH_SOURCE_LOCAL);
        return sizeof DH__FETCH_SOURCE_LOCAL - 1;
    }
    /* The authority: up to the path, query or fragment. Its user information (before the
     * last '@') is left out, so a password in a URL never reaches a key, a log or the
     * telemetry. */
    const char *host = uri + scheme + 3;
    size_t authority = strcspn(host, "/?#");
    for (size_t i = authority; i-- > 0;)
        if (host[i] == '@') {
            host += i + 1;
            authority -= i + 1;
            break;
        }
    size_t n = 0;
    for (size_t i = 0; i < scheme && n < DH__FETCH_SOURCE_MAX - 1; i++)
        out[n++] = (char)tolower((unsigned char)uri[i]);
    for (size_t i = 0; i < 3 && n < DH__FETCH_SOURCE_MAX - 1; i++)
        out[n++] = "://"[i];
    for (size_t i = 0; i < authority && n < DH__FETCH_SOURCE_MAX - 1; i++)
        out[n++] = (char)tolower((unsigned char)host[i]);
    out[n] = '\0';
    return n;
}
