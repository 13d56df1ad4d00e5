/* fault.h: numbered fault-injection sites (docs/conventions.md "Tests").
 *
 * Code that talks to the outside world marks the places where it can fail with
 * DH_FAULT(site) (src/core/internal.h). Built with -DDH_ENABLE_FAULTS=ON, a test arms a site
 * so that its N-th hit fails as the real failure would (a read error, a short write), and
 * checks that the caller gets a clean error naming the thing at fault, with no crash and no
 * leak. In a normal build the sites compile to nothing and arming is a no-op.
 * Allocation failures have their own hook: dh_alloc_fail_after() in alloc.h.
 */
#ifndef DATAHELIX_FAULT_H
#define DATAHELIX_FAULT_H

#include "datahelix/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The numbered sites. Numbers are stable: tests and bug reports refer to them. */
typedef enum {
    DH_FAULT_PROFILE_READ = 1,   /* reading a profile JSONL file fails (EIO) */
    DH_FAULT_PROFILE_WRITE = 2,  /* writing a profile JSONL file fails (ENOSPC) */
    DH_FAULT_COORD_BOOK = 3,     /* the coordinator cannot grow its book for a request (ENOMEM) */
    DH_FAULT_RB_SEND = 4,        /* a client's REBALANCE SEND to its DataServer fails (EIO) */
    DH_FAULT_RB_TAKE_OVER = 5,   /* a client cannot take a reference on a tensor of a part of
                                  * its node (the handle refused: ESTALE) */
    DH_FAULT_SHM_SEND_FD = 6,    /* sendmsg of an arena's memfd fails (EPIPE: the peer is gone) */
    DH_FAULT_SHM_RECV_FD = 7,    /* recvmsg of an arena's memfd fails (ECONNRESET) */
    DH_FAULT_SHM_CREATE = 8,     /* a step of making an arena fails: memfd_create (EMFILE),
                                  * ftruncate or fallocate (ENOSPC), mmap (ENOMEM) */
    DH_FAULT_SHM_ATTACH = 9,     /* a step of attaching to an arena fails: dup (EMFILE), mmap
                                  * (ENOMEM) */
    DH_FAULT_SHM_RESERVE = 10,   /* fallocate of an allocation's new slabs fails (ENOSPC) */
    DH_FAULT_WIRE_SEND = 11,     /* dh_wire_send: ZeroMQ refuses a message's first frame
                                  * (EHOSTUNREACH, as a ROUTER for a peer that is gone) */
    DH_FAULT_WIRE_RECV = 12,     /* dh_wire_recv: receiving a message's first frame fails (ETERM,
                                  * as when the context shuts down); the message stays queued */
    DH_FAULT_WIRE_KEY_READ = 13, /* reading a CURVE key file fails (EIO) */
    DH_FAULT_MEDIA_OPEN = 14,    /* avformat_open_input of a clip fails (AVERROR(EIO)) */
    DH_FAULT_MEDIA_READ = 15,    /* av_read_frame of a clip fails (AVERROR(EIO): a disk or network
                                  * file system read error) */
    DH_FAULT_MEDIA_DECODE = 16,  /* avcodec_send_packet refuses a packet (AVERROR_INVALIDDATA) */
    DH_FAULT_MANIFEST_READ = 17, /* reading a line of a manifest file fails (EIO) */
    DH_FAULT_PY_SPAWN = 18,      /* posix_spawnp of a Python worker process fails (EAGAIN, as
                                  * at RLIMIT_NPROC) */
    DH_FAULT_PY_SEND = 19,       /* sendmsg to a Python worker process fails (EPIPE: it died) */
    DH_FAULT_PY_RECV = 20,       /* recv from a Python worker process fails (ECONNRESET: it died) */
    DH_FAULT_WIRE_ZAP_START = 21, /* a step of starting the ZAP handler fails: its socket
                                   * (EMFILE), binding inproc://zeromq.zap.01 or its control
                                   * pair (ENOMEM), its thread (EAGAIN) */
    DH_FAULT_WIRE_ZAP_IO = 22,    /* the ZAP handler's receive of a request or send of its reply
                                   * is interrupted (EINTR); the request stays queued */
    DH_FAULT_WIRE_PROBE = 23,     /* the connect probe's socket (EMFILE) or its read of the
                                   * peer's greeting (ECONNRESET) fails */
    DH_FAULT_CLI_WRITE = 24,      /* a CLI output file: a line's write (ENOSPC), its close or
                                   * its rename into place (EIO) */
    DH_FAULT_NOTICE_SEND = 25,    /* a DataServer's send of a DELIVER on a client's notice
                                   * channel fails (EAGAIN: the channel is full) */
    DH_FAULT_NOTICE_RECV = 26,    /* a client's read of a notice packet fails (ENOMEM: the
                                   * kernel is short of memory) */
    DH_FAULT_METRICS_HTTP = 27,   /* a step of answering GET /metrics fails for lack of memory:
                                   * the render (a 500), the response (the connection closed) */
    DH_FAULT_CACHE_WRITE = 28,    /* writing a block of the remote cache's temporary file fails
                                   * (ENOSPC) */
    DH_FAULT_CACHE_RENAME = 29,   /* renaming a written block into the cache fails (EIO) */
    DH_FAULT_SITE_COUNT = 30,
} dh_fault_site_t;

/* 1 if this build has the sites compiled in (DH_ENABLE_FAULTS), else 0. */
DH_EXTERN int dh_fault_enabled(void);

/* Arms a site: its next `skip` hits pass, the one after fails, later ones pass again.
 * Process-global; not thread-safe against concurrent arming (tests arm from one thread). */
DH_EXTERN void dh_fault_arm(dh_fault_site_t site, long skip);

/* Disarms every site. */
DH_EXTERN void dh_fault_disarm_all(void);

/* How many times a site has been hit since start-up (counts only in a faults build). */
DH_EXTERN long dh_fault_hits(dh_fault_site_t site);

#ifdef __cplusplus
}
#endif
#endif
