// SPDX-License-Identifier: Apache-2.0
// Private to src/models: helpers shared by models.c, emit.c and tests.

#ifndef PCP_MODELS_MODELS_IMPL_H_
#define PCP_MODELS_MODELS_IMPL_H_

#include <stddef.h>
#include <stdint.h>

#include "models/models.h"

// Number of tensors the table of a validated |spec| holds.
size_t pcp_models_parameter_count_of(const pcp_models_spec_t* spec);

// f32 -> bf16 bits, rounded to nearest even (NaN stays NaN).
uint16_t pcp_models_f32_to_bf16(float value);

#endif  // PCP_MODELS_MODELS_IMPL_H_
