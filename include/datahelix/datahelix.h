/* datahelix.h: the whole public C API of DataHelix, one include. */
#ifndef DATAHELIX_H
#define DATAHELIX_H

#include "datahelix/alloc.h"
#include "datahelix/clock.h"
#include "datahelix/cost.h"
#include "datahelix/error.h"
#include "datahelix/fault.h"
#include "datahelix/log.h"
#include "datahelix/manifest.h"
#include "datahelix/mix.h"
#include "datahelix/pipeline.h"
#include "datahelix/place.h"
#include "datahelix/plan.h"
#include "datahelix/probe.h"
#include "datahelix/calibrate.h"
#include "datahelix/profile.h"
#include "datahelix/rng.h"
#include "datahelix/sampler.h"
#include "datahelix/shm.h"
#include "datahelix/stats.h"
#include "datahelix/synth.h"
#include "datahelix/wire.h"

#endif
