/* runtime/inprocess.h: the DataServers whose loop runs in this process (inprocess.c).
 *
 * A coordinator that shares its process with a DataServer (the embedded mode of a world-size-1
 * loader, start_cluster) cannot tell from the clock whether that server is alive: a late
 * heartbeat there means a busy machine, not a dead process, and a dead process takes the
 * coordinator with it. The DataServer's loop enters its name here while it runs; the
 * coordinator asks (docs/runtime.md, "Liveness"). Thread-safe (one mutex).
 */
#ifndef DH_RUNTIME_INPROCESS_H
#define DH_RUNTIME_INPROCESS_H

#include <stdbool.h>

/* The loop of DataServer `name` runs in this process from now on. A full table (64 at once)
 * records nothing: that server is then judged by its heartbeats like any other. */
void dh__inprocess_enter(const char *name);

/* ... and no longer (its loop returned). */
void dh__inprocess_leave(const char *name);

/* Whether the loop of a DataServer named `name` runs in this process now. */
bool dh__inprocess_has(const char *name);

#endif
