/* inprocess.c: the table of DataServers whose loop runs in this process (inprocess.h). A fixed
 * table under one mutex: a process runs a handful of DataServers, and the coordinator asks
 * once per server per liveness tick (every 20 ms), O(64) string compares at most. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "runtime/inprocess.h"

#define INPROCESS_CAP 64
#define INPROCESS_NAME_CAP 128

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static char table_names[INPROCESS_CAP][INPROCESS_NAME_CAP];
static unsigned table_refs[INPROCESS_CAP]; /* loops of that name running (0: a free row) */

static int find(const char *name)
{
    for (int i = 0; i < INPROCESS_CAP; i++)
        if (table_refs[i] && strncmp(table_names[i], name, INPROCESS_NAME_CAP - 1) == 0)
            return i;
    return -1;
}

void dh__inprocess_enter(const char *name)
{
    pthread_mutex_lock(&table_lock);
    int i = find(name);
    for (int j = 0; i < 0 && j < INPROCESS_CAP; j++)
        if (!table_refs[j]) {
            snprintf(table_names[j], INPROCESS_NAME_CAP, "%s", name);
            i = j;
        }
    if (i >= 0)
        table_refs[i]++;
    pthread_mutex_unlock(&table_lock);
}

void dh__inprocess_leave(const char *name)
{
    pthread_mutex_lock(&table_lock);
    int i = find(name);
    if (i >= 0)
        table_refs[i]--;
    pthread_mutex_unlock(&table_lock);
}

bool dh__inprocess_has(const char *name)
{
    pthread_mutex_lock(&table_lock);
    bool has = find(name) >= 0;
    pthread_mutex_unlock(&table_lock);
    return has;
}
