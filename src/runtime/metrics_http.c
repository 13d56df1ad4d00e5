/* metrics_http.c: the HTTP endpoint a coordinator or a DataServer serves its metrics on
 * (`--metrics-listen HOST:PORT`; runtime/metrics.h; docs/operations.md, "Metrics").
 *
 * libmicrohttpd does the HTTP (request parsing, keep-alive, timeouts, limits) on one thread
 * of its own, polling with epoll where it can (MHD_USE_AUTO), so no descriptor limit of
 * select() applies. Its only handler answers GET (and HEAD) /metrics with the registry
 * rendered; the render takes the registry's lock for a few microseconds and reads the
 * daemon's state only through atomics, so a scrape never stalls the daemon's loop. Anything
 * else is 404 (another path) or 405 (another method). Connections are capped (16) and time
 * out after 10 s idle: a scraper that hangs cannot hold the thread.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "core/internal.h"
#include "datahelix/alloc.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/log.h"
#include "runtime/metrics.h"

#define WHO_CAP 160

struct dh__metrics_http {
    struct MHD_Daemon *daemon;
    dh__metrics_t *registry;
    uint16_t port;
    char who[WHO_CAP];
};

static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    const dh__metrics_http_t *h = cls;
    char text[512];
    vsnprintf(text, sizeof text, fmt, ap);
    size_t n = strlen(text);
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        text[--n] = '\0';
    dh_log_warn("%s: metrics endpoint: %s", h->who, text);
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned int status, const char *body,
                               size_t len, const char *content_type)
{
    /* Out of memory for the response (fault site DH_FAULT_METRICS_HTTP): MHD_NO, and MHD
     * closes the connection without an answer (the scraper sees it closed and retries). */
    struct MHD_Response *r =
        DH_FAULT(DH_FAULT_METRICS_HTTP)
            ? NULL
            : MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    (void)upload_data;
    dh__metrics_http_t *h = cls;
    /* The first call of a request only announces it (its headers read); a body (which a GET
     * does not have) comes in the calls after, and is dropped; the answer goes in the last
     * call, when no body is left. */
    if (*con_cls == NULL) {
        *con_cls = (void *)1;
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    static const char text_plain[] = "text/plain; charset=utf-8";
    if (strcmp(url, "/metrics") != 0) {
        static const char body[] = "not found: the metrics are at /metrics\n";
        return respond(conn, MHD_HTTP_NOT_FOUND, body, sizeof body - 1, text_plain);
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        static const char body[] = "method not allowed: GET /metrics\n";
        return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, body, sizeof body - 1, text_plain);
    }
    size_t len = 0;
    char *text = DH_FAULT(DH_FAULT_METRICS_HTTP) ? NULL /* out of memory rendering */
                                                 : dh__metrics_render(h->registry, &len);
    if (!text) {
        static const char body[] = "out of memory rendering the metrics\n";
        return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, body, sizeof body - 1, text_plain);
    }
    enum MHD_Result ret =
        respond(conn, MHD_HTTP_OK, text, len, "text/plain; version=0.0.4; charset=utf-8");
    dh_free(text);
    return ret;
}

/* Splits HOST:PORT ("[v6]:PORT" for an IPv6 address) into host and port. 0 or DH_EINVAL. */
static int split_listen(const char *listen, const char *who, char *host, size_t host_cap,
                        char *port, size_t port_cap)
{
    const char *colon = NULL, *h = listen, *h_end;
    if (listen[0] == '[') {
        const char *close = strchr(listen, ']');
        if (!close || close[1] != ':')
            goto bad;
        h = listen + 1;
        h_end = close;
        colon = close + 1;
    } else {
        colon = strrchr(listen, ':');
        if (!colon)
            goto bad;
        h_end = colon;
    }
    size_t hn = (size_t)(h_end - h), pn = strlen(colon + 1);
    if (hn == 0 || hn >= host_cap || pn == 0 || pn >= port_cap ||
        strspn(colon + 1, "0123456789") != pn)
        goto bad;
    memcpy(host, h, hn);
    host[hn] = '\0';
    memcpy(port, colon + 1, pn + 1);
    if (strtoul(port, NULL, 10) > 65535)
        goto bad;
    return 0;
bad:
    return dh__set_error(DH_EINVAL,
                         "%s: --metrics-listen '%s': expected HOST:PORT (127.0.0.1:9464, "
                         "0.0.0.0:0 for any free port, [::1]:9464)",
                         who, listen);
}

int dh__metrics_http_start(dh__metrics_http_t **out, dh__metrics_t *m, const char *listen,
                           const char *who)
{
    *out = NULL;
    char host[256], port[8];
    int rc = split_listen(listen, who, host, sizeof host, port, sizeof port);
    if (rc)
        return rc;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0 || !ai)
        return dh__set_error(DH_EINVAL, "%s: --metrics-listen '%s': cannot resolve '%s': %s", who,
                             listen, host, gai_strerror(gai));
    dh__metrics_http_t *h = dh_calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return dh__set_error(DH_ENOMEM, "out of memory for the metrics endpoint");
    }
    h->registry = m;
    snprintf(h->who, sizeof h->who, "%s", who);
    unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* MHD logs a failure to bind through its logger too; errno says why. */
    errno = 0;
    h->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
                                 log_mhd, h, /* first: MHD wants it so */
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                                 16u, MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    int err = errno;
    freeaddrinfo(ai);
    if (!h->daemon) {
        dh_free(h);
        if (err == 0)
            err = EADDRNOTAVAIL;
        return dh__set_error(-err, "%s: cannot serve metrics on %s: %s", who, listen,
                             strerror(err));
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : 0;
    *out = h;
    return 0;
}

int dh__metrics_http_start_unbound(dh__metrics_http_t **out, dh__metrics_t *m, const char *who)
{
    *out = NULL;
    dh__metrics_http_t *h = dh_calloc(1, sizeof *h);
    if (!h)
        return dh__set_error(DH_ENOMEM, "out of memory for the metrics endpoint");
    h->registry = m;
    snprintf(h->who, sizeof h->who, "%s", who);
    h->daemon =
        MHD_start_daemon(MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, h,
                         MHD_OPTION_EXTERNAL_LOGGER, log_mhd, h, MHD_OPTION_CONNECTION_LIMIT, 16u,
                         MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!h->daemon) {
        dh_free(h);
        return dh__set_error(DH_ENOMEM, "%s: cannot start the metrics endpoint", who);
    }
    *out = h;
    return 0;
}

int dh__metrics_http_add(dh__metrics_http_t *h, int fd)
{
    struct sockaddr_in peer = {
        .sin_family = AF_INET, .sin_port = htons(1), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (MHD_add_connection(h->daemon, fd, (const struct sockaddr *)&peer, sizeof peer) != MHD_YES)
        return dh__set_error(DH_EIO, "%s: metrics endpoint: connection refused", h->who);
    return 0;
}

size_t dh__metrics_http_run(dh__metrics_http_t *h)
{
    MHD_run(h->daemon);
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return info ? info->num_connections : 0;
}

uint16_t dh__metrics_http_port(const dh__metrics_http_t *h)
{
    return h->port;
}

void dh__metrics_http_stop(dh__metrics_http_t **ph)
{
    if (!ph || !*ph)
        return;
    dh__metrics_http_t *h = *ph;
    MHD_stop_daemon(h->daemon);
    dh_free(h);
    *ph = NULL;
}
