// SPDX-License-Identifier: Apache-2.0
//
// Generation driver (part of the workloads module; included from
// workloads.h): runs a compiled generation module (src/models emits it:
// @prefill, @decode, @load) on a local pcp_backend_t with the weights and
// both KV caches resident on the device. It sits with the inference
// workload because running a program is a workload's business; src/models
// only builds programs and never includes compute.
//
// Parameters are uploaded once, the two
// caches live on the device and are replaced by each call's results, slot
// lengths are kept here. A session owns a slot: prefill appends its prompt
// (in chunks of prefill_length), decode advances every active slot by one
// token in one batched call.
//
// Threading: thread-compatible (the backend's rule: one thread at a time).
// Ownership: |backend| and |program| are borrowed and must outlive the
// generator; |parameters| are copied to the device during create.

#ifndef PCP_WORKLOADS_INFER_GENERATE_H_
#define PCP_WORKLOADS_INFER_GENERATE_H_

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "models/models.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcp_backend_t pcp_backend_t;
typedef struct pcp_program_t pcp_program_t;
typedef struct pcp_infer_generator_t pcp_infer_generator_t;

// |parameters[i]|: the bytes of table parameter i (the spec's dtype).
// Caches start zeroed. Errors: validation (INVALID_ARGUMENT), uploads.
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_generator_create(
    pcp_backend_t* backend, pcp_program_t* program,
    const pcp_models_spec_t* spec, const pcp_models_generation_t* gen,
    const void* const* parameters, pcp_allocator_t allocator,
    pcp_infer_generator_t** out_generator);
void pcp_infer_generator_release(pcp_infer_generator_t* generator);

// Tokens in |slot|'s cache; reset frees the slot for a new session (O(1):
// stale rows are masked, then overwritten).
int64_t pcp_infer_generator_slot_length(const pcp_infer_generator_t* generator,
                                        int64_t slot);
void pcp_infer_generator_slot_reset(pcp_infer_generator_t* generator,
                                    int64_t slot);

// Device bytes of the k and v caches divided by the slots: what one session
// costs (compare pcp_models_generation_cache_byte_length).
uint64_t pcp_infer_generator_session_cache_byte_length(
    const pcp_infer_generator_t* generator);

// Appends |count| tokens to |slot| and writes the logits of the last one to
// |out_logits| [vocab]. |scratch_logits| holds slots x vocab floats. Other
// slots' caches are untouched. OUT_OF_RANGE when the slot would pass
// max_length; INVALID_ARGUMENT for a bad slot.
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_generator_prefill(
    pcp_infer_generator_t* generator, int64_t slot, const int32_t* tokens,
    int64_t count, float* out_logits, float* scratch_logits);

// One decode step of all slots: slot b consumes |tokens[b]| when
// |active[b]|; |out_logits| [slots x vocab] receives each slot's next-token
// logits (rows of inactive slots are meaningless). OUT_OF_RANGE when an
// active slot is full.
PCP_MUST_USE_RESULT pcp_status_t pcp_infer_generator_decode(
    pcp_infer_generator_t* generator, const int32_t* tokens, const bool* active,
    float* out_logits);

#ifdef __cplusplus
}
#endif

#endif  // PCP_WORKLOADS_INFER_GENERATE_H_
