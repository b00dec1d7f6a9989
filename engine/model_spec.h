/* The parameter list of a model now lives in its description
 * (engine/model_desc.h); this header keeps the older name working for the
 * code that includes it. */
#ifndef MT_ENGINE_MODEL_SPEC_H
#define MT_ENGINE_MODEL_SPEC_H

#include "engine/model_desc.h"

#endif
