/* datahelix.h: the whole public C API of DataHelix (libdatahelix), one include.
 *
 * synth.h is not here: synthetic data sets are the separate datahelix_synth library of the
 * tests, the benchmarks and `datahelix synth`, not part of libdatahelix. */
#ifndef DATAHELIX_H
#define DATAHELIX_H

#include "datahelix/alloc.h"
#include "datahelix/calibrate.h"
#include "datahelix/cluster.h"
#include "datahelix/client.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/deadline.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/log.h"
#include "datahelix/manifest.h"
#include "datahelix/metrics.h"
#include "datahelix/mix.h"
#include "datahelix/pipeline.h"
#include "datahelix/place.h"
#include "datahelix/plan.h"
#include "datahelix/probe.h"
#include "datahelix/profile.h"
#include "datahelix/rebalance.h"
#include "datahelix/rng.h"
#include "datahelix/runtime.h"
#include "datahelix/sampler.h"
#include "datahelix/shm.h"
#include "datahelix/stats.h"
#include "datahelix/tensor.h"
#include "datahelix/wire.h"

#endif
