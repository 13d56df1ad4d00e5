/* fault.c: numbered fault-injection sites (see fault.h). */
#include <stdatomic.h>

#include "datahelix/fault.h"
#include "core/internal.h"

static atomic_long hits[DH_FAULT_SITE_COUNT];
/* The hit count that fails, plus one; 0 = disarmed (so that zero-initialised is disarmed). */
static atomic_long fire_at[DH_FAULT_SITE_COUNT];

int dh_fault_enabled(void)
{
#ifdef DH_ENABLE_FAULTS
    return 1;
#else
    return 0;
#endif
}

void dh_fault_arm(dh_fault_site_t site, long skip)
{
    if ((unsigned)site < DH_FAULT_SITE_COUNT)
        atomic_store(&fire_at[site], atomic_load(&hits[site]) + skip + 1);
}

void dh_fault_disarm_all(void)
{
    for (int i = 0; i < DH_FAULT_SITE_COUNT; i++)
        atomic_store(&fire_at[i], 0);
}

long dh_fault_hits(dh_fault_site_t site)
{
    return (unsigned)site < DH_FAULT_SITE_COUNT ? atomic_load(&hits[site]) : 0;
}

int dh__fault_fire(int site)
{
    if ((unsigned)site >= DH_FAULT_SITE_COUNT)
        return 0;
    long n = atomic_fetch_add(&hits[site], 1);
    return n + 1 == atomic_load(&fire_at[site]);
}
