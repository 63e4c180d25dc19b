// SPDX-License-Identifier: Apache-2.0
// Generation driver: a compiled @prefill/@decode module on a pcp_backend_t
// with the weights and both KV caches resident on the device. It lives with
// the inference workload, not in src/models: building a program (models)
// never runs it.
//
// Each call passes the resident caches in and keeps the returned ones (the
// old references are released), so no cache byte crosses to the host; only
// the ids, positions and the logits do. Slot lengths live here, on the host:
// they are the %positions of the next call.

#include "workloads/infer/generate.h"

#include <stdlib.h>
#include <string.h>

#include "compute/compute.h"
#include "models/models.h"

struct pcp_infer_generator_t {
  pcp_allocator_t allocator;
  pcp_program_t* program;  // borrowed
  pcp_models_spec_t spec;
  pcp_models_generation_t gen;
  size_t parameter_count;
  pcp_tensor_t** parameters;  // resident
  pcp_tensor_t* k_cache;      // resident [layers, slots, kv, L, hd]
  pcp_tensor_t* v_cache;
  int64_t* lengths;  // tokens in each slot's cache
  // Host staging for one call (slots x prefill_length ids and so on).
  int32_t* ids;
  int32_t* positions;
  int32_t* chunk_lengths;
  pcp_value_t* inputs;
};

static pcp_status_t upload_zeros(pcp_backend_t* backend,
                                 const pcp_tensor_shape_t* shape,
                                 pcp_tensor_t** out_tensor) {
  pcp_host_tensor_t host;
  PCP_RETURN_IF_ERROR_BARE(pcp_host_tensor_allocate(shape, &host));
  pcp_status_t status = pcp_tensor_upload(backend, &host, out_tensor);
  pcp_host_tensor_deinitialize(&host);
  return status;
}

pcp_status_t pcp_infer_generator_create(pcp_backend_t* backend,
                                        pcp_program_t* program,
                                        const pcp_models_spec_t* spec,
                                        const pcp_models_generation_t* gen,
                                        const void* const* parameters,
                                        pcp_allocator_t allocator,
                                        pcp_infer_generator_t** out_generator) {
  *out_generator = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_models_generation_validate(spec, gen));
  pcp_models_parameter_table_t table;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_models_parameter_table_initialize(spec, allocator, &table));
  pcp_infer_generator_t* g = NULL;
  pcp_status_t status = pcp_allocator_calloc(allocator, sizeof(*g), (void**)&g);
  if (!status) {
    g->allocator = allocator;
    g->program = program;
    g->spec = *spec;
    g->gen = *gen;
    g->parameter_count = table.count;
    size_t slots = (size_t)gen->slots;
    size_t chunk = slots * (size_t)gen->prefill_length;
    status = pcp_allocator_calloc(allocator, table.count * sizeof(void*),
                                  (void**)&g->parameters);
    if (!status) {
      status = pcp_allocator_calloc(allocator, slots * sizeof(int64_t),
                                    (void**)&g->lengths);
    }
    if (!status) {
      status = pcp_allocator_calloc(allocator, chunk * sizeof(int32_t),
                                    (void**)&g->ids);
    }
    if (!status) {
      status = pcp_allocator_calloc(allocator, slots * sizeof(int32_t),
                                    (void**)&g->positions);
    }
    if (!status) {
      status = pcp_allocator_calloc(allocator, slots * sizeof(int32_t),
                                    (void**)&g->chunk_lengths);
    }
    if (!status) {
      status = pcp_allocator_calloc(allocator,
                                    (table.count + 5) * sizeof(pcp_value_t),
                                    (void**)&g->inputs);
    }
  }
  for (size_t i = 0; !status && i < table.count; ++i) {
    const pcp_models_parameter_t* p = &table.parameters[i];
    pcp_tensor_shape_t shape = {.element_type = p->element_type,
                                .rank = p->rank,
                                .dims = {p->dims[0], p->dims[1]}};
    pcp_host_tensor_t host;
    status = pcp_host_tensor_wrap(&shape, (void*)parameters[i], p->byte_length,
                                  &host);
    if (!status) {
      status = pcp_tensor_upload(backend, &host, &g->parameters[i]);
      pcp_host_tensor_deinitialize(&host);
    }
    if (status) {
      status = pcp_status_annotate_f(status, "parameter %s", p->name);
    }
  }
  if (!status) {
    pcp_tensor_shape_t cache = {
        .element_type = spec->dtype,
        .rank = 5,
        .dims = {spec->layers, gen->slots, pcp_models_spec_kv_heads(spec),
                 gen->max_length, pcp_models_spec_head_dim(spec)}};
    status = upload_zeros(backend, &cache, &g->k_cache);
    if (!status) {
      status = upload_zeros(backend, &cache, &g->v_cache);
    }
  }
  pcp_models_parameter_table_deinitialize(&table);
  if (status) {
    pcp_infer_generator_release(g);
    return status;
  }
  *out_generator = g;
  return pcp_ok_status();
}

void pcp_infer_generator_release(pcp_infer_generator_t* generator) {
  if (!generator) {
    return;
  }
  pcp_allocator_t allocator = generator->allocator;
  for (size_t i = 0; generator->parameters && i < generator->parameter_count;
       ++i) {
    if (generator->parameters[i]) {
      pcp_tensor_release(generator->parameters[i]);
    }
  }
  if (generator->k_cache) {
    pcp_tensor_release(generator->k_cache);
  }
  if (generator->v_cache) {
    pcp_tensor_release(generator->v_cache);
  }
  pcp_allocator_free(allocator, generator->parameters);
  pcp_allocator_free(allocator, generator->lengths);
  pcp_allocator_free(allocator, generator->ids);
  pcp_allocator_free(allocator, generator->positions);
  pcp_allocator_free(allocator, generator->chunk_lengths);
  pcp_allocator_free(allocator, generator->inputs);
  pcp_allocator_free(allocator, generator);
}

int64_t pcp_infer_generator_slot_length(const pcp_infer_generator_t* generator,
                                        int64_t slot) {
  PCP_ASSERT(slot >= 0 && slot < generator->gen.slots);
  return generator->lengths[slot];
}

void pcp_infer_generator_slot_reset(pcp_infer_generator_t* generator,
                                    int64_t slot) {
  PCP_ASSERT(slot >= 0 && slot < generator->gen.slots);
  // Stale rows need no clearing: the next prefill overwrites rows from 0 and
  // rows past a slot's position are masked.
  generator->lengths[slot] = 0;
}

uint64_t pcp_infer_generator_session_cache_byte_length(
    const pcp_infer_generator_t* generator) {
  uint64_t total = (uint64_t)pcp_tensor_byte_length(generator->k_cache) +
                   (uint64_t)pcp_tensor_byte_length(generator->v_cache);
  return total / (uint64_t)generator->gen.slots;
}

// One call of |function| with the staged ids/positions (and lengths for
// @prefill); keeps the new caches and downloads the logits [slots, V].
static pcp_status_t invoke(pcp_infer_generator_t* g, bool prefill,
                           float* out_logits) {
  int64_t s = prefill ? g->gen.prefill_length : 1;
  pcp_tensor_shape_t ids_shape = {.element_type = PCP_ELEMENT_TYPE_I32,
                                  .rank = 2,
                                  .dims = {g->gen.slots, s}};
  pcp_tensor_shape_t vec_shape = {
      .element_type = PCP_ELEMENT_TYPE_I32, .rank = 1, .dims = {g->gen.slots}};
  size_t slots = (size_t)g->gen.slots;
  pcp_host_tensor_t ids, positions, lengths;
  PCP_RETURN_IF_ERROR_BARE(pcp_host_tensor_wrap(
      &ids_shape, g->ids, slots * (size_t)s * sizeof(int32_t), &ids));
  PCP_RETURN_IF_ERROR_BARE(pcp_host_tensor_wrap(
      &vec_shape, g->positions, slots * sizeof(int32_t), &positions));
  PCP_RETURN_IF_ERROR_BARE(pcp_host_tensor_wrap(
      &vec_shape, g->chunk_lengths, slots * sizeof(int32_t), &lengths));
  size_t n = 0;
  for (size_t i = 0; i < g->parameter_count; ++i) {
    g->inputs[n++] = pcp_value_resident(g->parameters[i]);
  }
  g->inputs[n++] = pcp_value_host(&ids);
  g->inputs[n++] = pcp_value_host(&positions);
  if (prefill) {
    g->inputs[n++] = pcp_value_host(&lengths);
  }
  g->inputs[n++] = pcp_value_resident(g->k_cache);
  g->inputs[n++] = pcp_value_resident(g->v_cache);
  pcp_tensor_t* results[3] = {NULL, NULL, NULL};
  size_t result_count = 0;
  pcp_status_t status =
      pcp_program_invoke(g->program, prefill ? "prefill" : "decode", g->inputs,
                         n, results, PCP_ARRAYSIZE(results), &result_count);
  if (!status && result_count != 3) {
    status = pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                             "expected 3 results, got %zu", result_count);
  }
  if (!status) {
    status = pcp_tensor_download(results[0], out_logits,
                                 slots * (size_t)g->spec.vocab * sizeof(float));
  }
  if (!status) {
    pcp_tensor_release(g->k_cache);
    pcp_tensor_release(g->v_cache);
    g->k_cache = results[1];
    g->v_cache = results[2];
    results[1] = results[2] = NULL;
  }
  for (size_t i = 0; i < result_count; ++i) {
    if (results[i]) {
      pcp_tensor_release(results[i]);
    }
  }
  return status;
}

pcp_status_t pcp_infer_generator_prefill(pcp_infer_generator_t* generator,
                                         int64_t slot, const int32_t* tokens,
                                         int64_t count, float* out_logits,
                                         float* scratch_logits) {
  pcp_infer_generator_t* g = generator;
  if (slot < 0 || slot >= g->gen.slots) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT, "slot %lld of %lld",
                           (long long)slot, (long long)g->gen.slots);
  }
  if (count < 1 || g->lengths[slot] + count > g->gen.max_length) {
    return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                           "%lld tokens after %lld do not fit in %lld",
                           (long long)count, (long long)g->lengths[slot],
                           (long long)g->gen.max_length);
  }
  int64_t p = g->gen.prefill_length;
  for (int64_t done = 0; done < count;) {
    int64_t chunk = count - done < p ? count - done : p;
    memset(g->ids, 0, (size_t)(g->gen.slots * p) * sizeof(int32_t));
    memset(g->chunk_lengths, 0, (size_t)g->gen.slots * sizeof(int32_t));
    for (int64_t b = 0; b < g->gen.slots; ++b) {
      g->positions[b] = (int32_t)g->lengths[b];
    }
    memcpy(g->ids + slot * p, tokens + done, (size_t)chunk * sizeof(int32_t));
    g->chunk_lengths[slot] = (int32_t)chunk;
    PCP_RETURN_IF_ERROR(invoke(g, true, scratch_logits), "prefill slot %lld",
                        (long long)slot);
    g->lengths[slot] += chunk;
    done += chunk;
  }
  memcpy(out_logits, scratch_logits + slot * g->spec.vocab,
         (size_t)g->spec.vocab * sizeof(float));
  return pcp_ok_status();
}

pcp_status_t pcp_infer_generator_decode(pcp_infer_generator_t* generator,
                                        const int32_t* tokens,
                                        const bool* active, float* out_logits) {
  pcp_infer_generator_t* g = generator;
  for (int64_t b = 0; b < g->gen.slots; ++b) {
    if (active[b] && g->lengths[b] >= g->gen.max_length) {
      return pcp_make_status(PCP_STATUS_OUT_OF_RANGE,
                             "slot %lld is full (%lld tokens)", (long long)b,
                             (long long)g->gen.max_length);
    }
    // An inactive slot still runs (one batch shape) and writes row
    // lengths[b]; that row is past its position, so it is masked now and
    // overwritten by the slot's next real token.
    g->ids[b] = active[b] ? tokens[b] : 0;
    g->positions[b] = (int32_t)g->lengths[b];
  }
  PCP_RETURN_IF_ERROR_BARE(invoke(g, false, out_logits));
  for (int64_t b = 0; b < g->gen.slots; ++b) {
    if (active[b]) {
      g->lengths[b] += 1;
    }
  }
  return pcp_ok_status();
}
