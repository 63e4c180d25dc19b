// SPDX-License-Identifier: Apache-2.0
// Time to first token through the gateway against a direct call to the
// worker path: same program, same model, twin worker processes.
//
//   direct:  this process runs a fabric endpoint; a `pcp --worker` joins it;
//            the toy GPT's generation module (compiled here) gets @load once,
//            then each sample is one @prefill task of the prompt and the
//            argmax of its logits (what the first token needs, nothing more).
//   gateway: `pcp --gateway --model-dir` with its own fabric port and a twin
//            `pcp --worker`; each sample is POST /v1/completions
//            {max_tokens: 1, temperature: 0} on a keep-alive connection
//            (HTTP, JSON, tokenizer, queue, scheduler, the same @prefill,
//            sampling, the answer).
// The samples alternate (direct then gateway, then the other order), so a
// busy spell on the shared machine hits both sides alike; the gateway's
// first token must equal the direct argmax (checked).
// Null comparison: a third worker joins this process's endpoint too, and
// each round also times the same direct @prefill on it ("direct B"): the
// per-pair differences direct B - direct are what two twin workers differ
// by with no gateway at all, the floor under the gateway's figures (the
// rounds cycle through all six orders of the three samples). The direct
// side's time is split too: the worker's own time for the task (the
// result's elapsed_us) against transport and thread wake-ups. The overhead is
// judged on the PER-PAIR differences (each gateway sample minus the direct
// sample of the same pair), not on a difference of percentiles (which can be
// negative and pairs unrelated samples): p50 and p99 of those differences.
// Goal: per-pair p99 <= 1 ms (docs/performance.md); a miss fails under
// PCP_BENCH_CHECK=1 (tools/bench.sh --check). Last line: `gateway_overhead
// ratio=<direct p50 / (direct p50 + per-pair p50)>`, the share of the
// gateway's median time to first token that the worker path itself takes
// (1: the gateway adds nothing).

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "compile/compile.h"
#include "fabric/fabric.h"
#include "http/http.h"
#include "models/models.h"

#define SAMPLES 300
#define WARMUP 30
#define GOAL_P99_MS 1.0
#define PROMPT "hello world, how are you"
static const char kVocab[] =
    "\n !',.?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int compare_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double percentile(double* v, int n, double p) {
  qsort(v, (size_t)n, sizeof(double), compare_double);
  int i = (int)(p * (n - 1) + 0.5);
  return v[i];
}

static pid_t spawn(char* const argv[]) {
  pid_t child = fork();
  if (child == 0) {
    execv(argv[0], argv);
    _exit(127);
  }
  return child;
}

static void stop(pid_t pid) {
  if (pid > 0) {
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
  }
}

static int fail(pcp_status_t status, const char* what) {
  char text[1024];
  pcp_status_format(status, text, sizeof(text));
  fprintf(stderr, "gateway_overhead: %s: %s\n", what, text);
  pcp_status_ignore(status);
  return 1;
}

// A TCP port the kernel picks for us, released just before use.
static int free_port(void) {
  pcp_fabric_options_t probe;
  pcp_fabric_options_initialize(&probe);
  pcp_fabric_endpoint_t* pick = NULL;
  pcp_status_t status =
      pcp_fabric_endpoint_create(&probe, pcp_allocator_system(), &pick);
  if (status) {
    pcp_status_ignore(status);
    return 0;
  }
  int port = pcp_fabric_endpoint_port(pick);
  pcp_fabric_endpoint_release(pick);
  return port;
}

// One direct sample: the @prefill task and the argmax of its logits;
// *out_compute_seconds: the worker's own time for the task (the result's
// elapsed_us), the rest of *out_seconds is transport and thread wake-ups.
static pcp_status_t direct_sample(pcp_fabric_endpoint_t* endpoint,
                                  const pcp_fabric_task_params_t* prefill,
                                  int64_t vocab, int32_t* out_token,
                                  double* out_seconds,
                                  double* out_compute_seconds) {
  double t0 = now_s();
  pcp_fabric_task_t* task = NULL;
  PCP_RETURN_IF_ERROR_BARE(pcp_fabric_task_submit(endpoint, prefill, &task));
  pcp_fabric_task_wait(task, -1);
  const pcp_proto_section_t* outputs = NULL;
  size_t count = 0;
  pcp_status_t status = pcp_fabric_task_outputs(task, &outputs, &count);
  if (!status) {
    *out_token = pcp_models_logits_argmax(outputs[0].data, vocab);
  } else {
    status = pcp_status_clone(status);
  }
  pcp_fabric_task_info_t info;
  pcp_fabric_task_info_query(task, &info);
  pcp_fabric_task_release(task);
  *out_seconds = now_s() - t0;
  *out_compute_seconds = (double)info.elapsed_us / 1e6;
  return status;
}

// One gateway sample: POST /v1/completions for one greedy token on the
// keep-alive connection; *out_matches when the answer holds |want|.
static pcp_status_t gateway_sample(pcp_http_client_t* client, const char* url,
                                   const char* want, bool* out_matches,
                                   double* out_seconds) {
  static const char kBody[] = "{\"model\":\"bench\",\"prompt\":\"" PROMPT
                              "\",\"max_tokens\":1,\"temperature\":0}";
  static const char* const kHeaders[] = {"Content-Type: application/json",
                                         NULL};
  pcp_http_client_request_t post = {.method = "POST",
                                    .url = url,
                                    .headers = kHeaders,
                                    .body = kBody,
                                    .body_length = sizeof(kBody) - 1};
  pcp_http_client_response_t response;
  double t0 = now_s();
  pcp_status_t status = pcp_http_client_send(client, &post, &response);
  *out_seconds = now_s() - t0;
  if (!status && response.http_status != 200) {
    status = pcp_make_status(PCP_STATUS_INTERNAL, "HTTP %d: %s",
                             response.http_status,
                             response.body ? response.body : "");
  }
  *out_matches = !status && response.body && strstr(response.body, want);
  pcp_http_client_response_deinitialize(&response);
  return status;
}

int main(void) {
  const char* pcp = PCP_BINARY_PATH;
  char dir[] = "/tmp/pcp-bench-gwo-XXXXXX";
  if (!mkdtemp(dir)) {
    return 1;
  }
  setenv("PCP_WORKER_JOIN_TOKEN", "bench-join", 1);
  setenv("PCP_LOG_LEVEL", "warn", 1);

  // The model directory (random toy GPT, char tokenizer).
  pcp_models_spec_t spec;
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_GPT, &spec);
  spec.layers = 2;
  spec.heads = 4;
  spec.width = 64;
  spec.vocab = (int64_t)strlen(kVocab);
  spec.block_size = 96;
  spec.batch = 1;
  pcp_models_generation_t gen = {
      .slots = 4, .max_length = 96, .prefill_length = 32};
  pcp_models_parameter_table_t table;
  pcp_status_t status = pcp_models_parameter_table_initialize(
      &spec, pcp_allocator_system(), &table);
  if (status)
    return fail(status, "table");
  void** params = calloc(table.count, sizeof(void*));
  pcp_proto_section_t* sections = calloc(table.count, sizeof(*sections));
  char(*names)[16] = calloc(table.count, sizeof(*names));
  if (!params || !sections || !names) {
    free(params);
    free(sections);
    free(names);
    return 1;
  }
  for (size_t i = 0; i < table.count; ++i) {
    if (posix_memalign(&params[i], 64, table.parameters[i].byte_length)) {
      fprintf(stderr, "gateway_overhead: out of memory\n");
      exit(1);
    }
  }
  pcp_models_parameters_initialize(&table, 7, params);
  char path[512];
  snprintf(path, sizeof(path), "%s/model", dir);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/model/model.safetensors", dir);
  status =
      pcp_models_safetensors_save(&table, (const void* const*)params, path);
  if (status)
    return fail(status, "weights");
  snprintf(path, sizeof(path), "%s/model/model.json", dir);
  FILE* f = fopen(path, "w");
  fprintf(f,
          "{\"name\":\"bench\",\"architecture\":\"gpt\",\"layers\":2,"
          "\"heads\":4,\"width\":64,\"vocab\":%lld,\"block_size\":96,"
          "\"max_length\":96,\"slots\":4,\"prefill_length\":32,"
          "\"tokenizer\":{\"kind\":\"char\",\"vocab\":\"\\n !',.?"
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\"}}",
          (long long)spec.vocab);
  fclose(f);
  int32_t prompt[64];
  int n = (int)strlen(PROMPT);
  for (int i = 0; i < n; ++i) {
    prompt[i] = (int32_t)(strchr(kVocab, PROMPT[i]) - kVocab);
  }

  // --- Direct: our endpoint, the worker, @load, then @prefill samples.
  pcp_fabric_options_t options;
  pcp_fabric_options_initialize(&options);
  options.heartbeat_interval_ms = 200;
  pcp_fabric_endpoint_t* endpoint = NULL;
  status =
      pcp_fabric_endpoint_create(&options, pcp_allocator_system(), &endpoint);
  if (status)
    return fail(status, "endpoint");
  int fabric_port = pcp_fabric_endpoint_port(endpoint);
  char connect[64], cache[512];
  snprintf(connect, sizeof(connect), "127.0.0.1:%d", fabric_port);
  snprintf(cache, sizeof(cache), "%s/worker-cache", dir);
  char* worker_argv[] = {(char*)pcp,    "--worker", "--connect", connect,
                         "--cache-dir", cache,      NULL};
  pid_t worker = spawn(worker_argv);
  // The null comparison's twin on this endpoint (workers on one host
  // differ by --device-id).
  char cache_c[512];
  snprintf(cache_c, sizeof(cache_c), "%s/worker-cache-c", dir);
  char* worker_c_argv[] = {(char*)pcp,    "--worker",    "--connect",
                           connect,       "--cache-dir", cache_c,
                           "--device-id", "1",           NULL};
  pid_t worker_c = spawn(worker_c_argv);
  pcp_fabric_worker_info_t infos[2];
  memset(infos, 0, sizeof(infos));
  bool joined = false;
  for (int i = 0; i < 600 && !joined; ++i) {
    joined = pcp_fabric_worker_list(endpoint, infos, 2, NULL) == 2 &&
             infos[0].state == PCP_FABRIC_WORKER_CONNECTED &&
             infos[1].state == PCP_FABRIC_WORKER_CONNECTED;
    if (!joined) {
      pcp_sleep_ms(50);
    }
  }
  if (!joined) {
    fprintf(stderr, "gateway_overhead: the workers did not join\n");
    stop(worker);
    stop(worker_c);
    return 1;
  }
  pcp_fabric_worker_info_t info = infos[0];
  pcp_string_builder_t text;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &text);
  status = pcp_models_generation_module_emit(&spec, &gen, &text);
  if (status)
    return fail(status, "emit");
  char artifacts[512];
  snprintf(artifacts, sizeof(artifacts), "%s/state", dir);
  mkdir(artifacts, 0755);
  snprintf(artifacts, sizeof(artifacts), "%s/state/artifacts", dir);
  pcp_compile_request_t request = {.mlir_text = text.data,
                                   .mlir_byte_length = text.size,
                                   .source_name = "generate.mlir",
                                   .backend = PCP_COMPILE_BACKEND_CPU,
                                   .target = info.target,
                                   .cache_dir = artifacts};
  pcp_compile_result_t compiled = {0};
  status = pcp_compile_module(&request, &compiled);
  if (status)
    return fail(status, "compile");
  uint8_t program[PCP_SHA256_BYTE_LENGTH];
  status = pcp_fabric_program_register(endpoint, compiled.vmfb,
                                       compiled.vmfb_byte_length, info.backend,
                                       info.target, program);
  if (status)
    return fail(status, "register");
  pcp_proto_keep_resident_t* keep = calloc(table.count + 2, sizeof(*keep));
  for (size_t i = 0; i < table.count; ++i) {
    const pcp_models_parameter_t* p = &table.parameters[i];
    snprintf(names[i], sizeof(names[i]), "p%u", (unsigned)i);
    sections[i] = (pcp_proto_section_t){.name = names[i],
                                        .element_type = p->element_type,
                                        .rank = (uint32_t)p->rank,
                                        .shape = {p->dims[0], p->dims[1]},
                                        .byte_length = p->byte_length,
                                        .data = params[i]};
    keep[i] = (pcp_proto_keep_resident_t){(uint32_t)i, names[i]};
  }
  keep[table.count] = (pcp_proto_keep_resident_t){(uint32_t)table.count, "k"};
  keep[table.count + 1] =
      (pcp_proto_keep_resident_t){(uint32_t)table.count + 1, "v"};
  pcp_fabric_task_params_t load = {
      .function = "load",
      .inputs = sections,
      .input_count = (uint32_t)table.count,
      .keep_resident = keep,
      .keep_resident_count = (uint32_t)table.count + 2,
      .worker_id = info.worker_id,
      .session_id = "bench",
      .max_attempts = 1,
  };
  memcpy(load.program, program, sizeof(program));
  for (int w = 0; w < 2; ++w) {
    load.worker_id = infos[w].worker_id;
    pcp_fabric_task_t* task = NULL;
    status = pcp_fabric_task_submit(endpoint, &load, &task);
    if (status)
      return fail(status, "load");
    pcp_fabric_task_wait(task, -1);
    status = pcp_fabric_task_status(task);
    if (status)
      return fail(pcp_status_clone(status), "load");
    pcp_fabric_task_release(task);
  }

  int32_t ids[4 * 32] = {0}, positions[4] = {0}, lengths[4] = {0};
  memcpy(ids, prompt, (size_t)n * sizeof(int32_t));
  lengths[0] = n;
  pcp_proto_section_t step[3] = {
      {.name = "input_ids",
       .element_type = PCP_ELEMENT_TYPE_I32,
       .rank = 2,
       .shape = {4, 32},
       .byte_length = sizeof(ids),
       .data = ids},
      {.name = "positions",
       .element_type = PCP_ELEMENT_TYPE_I32,
       .rank = 1,
       .shape = {4},
       .byte_length = sizeof(positions),
       .data = positions},
      {.name = "lengths",
       .element_type = PCP_ELEMENT_TYPE_I32,
       .rank = 1,
       .shape = {4},
       .byte_length = sizeof(lengths),
       .data = lengths},
  };
  pcp_proto_tensor_ref_t refs[64];
  size_t r = 0;
  for (size_t i = 0; i < table.count; ++i) {
    refs[r++] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                         .name = names[i]};
  }
  for (uint32_t i = 0; i < 3; ++i) {
    refs[r++] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_SECTION,
                                         .section = i};
  }
  refs[r++] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                       .name = "k"};
  refs[r++] = (pcp_proto_tensor_ref_t){.kind = PCP_PROTO_TENSOR_REF_RESIDENT,
                                       .name = "v"};
  static const pcp_proto_keep_resident_t kKeep[2] = {{1, "k"}, {2, "v"}};
  pcp_fabric_task_params_t prefill = {
      .function = "prefill",
      .inputs = step,
      .input_count = 3,
      .input_refs = refs,
      .input_ref_count = (uint32_t)r,
      .keep_resident = kKeep,
      .keep_resident_count = 2,
      .worker_id = info.worker_id,
      .session_id = "bench",
      .max_attempts = 1,
  };
  memcpy(prefill.program, program, sizeof(program));
  pcp_fabric_task_params_t prefill_c = prefill;
  prefill_c.worker_id = infos[1].worker_id;
  // The direct side's first token (and a check that @prefill runs).
  int32_t direct_token = -1, token_c = -1;
  double unused = 0, unused_compute = 0;
  status = direct_sample(endpoint, &prefill, spec.vocab, &direct_token, &unused,
                         &unused_compute);
  if (!status) {
    status = direct_sample(endpoint, &prefill_c, spec.vocab, &token_c, &unused,
                           &unused_compute);
  }
  if (status)
    return fail(status, "prefill");
  if (token_c != direct_token) {
    fprintf(stderr, "gateway_overhead: the twin workers disagree\n");
    return 1;
  }

  // --- Gateway: its own fabric port and a twin worker (same binary, same
  // program, same model), so both sides are measured in the same minutes:
  // the samples alternate direct / gateway (order swapped every pair), and
  // a busy spell on the shared cores hits both. (Measuring one side after
  // the other let 4-12 ms swings of p99 decide the comparison.)
  int gateway_fabric_port = free_port();
  int api_port = free_port();
  char config[512];
  snprintf(config, sizeof(config), "%s/g.json", dir);
  f = fopen(config, "w");
  fprintf(f,
          "{\"gateway_id\":\"bench\",\"lab_id\":\"bench\",\"state_dir\":"
          "\"%s/state\",\"worker_fabric\":{\"host\":\"127.0.0.1\","
          "\"port\":%d,\"heartbeat_ms\":200}}",
          dir, gateway_fabric_port);
  fclose(f);
  char model_dir[512];
  snprintf(model_dir, sizeof(model_dir), "%s/model", dir);
  char api_text[16];
  snprintf(api_text, sizeof(api_text), "%d", api_port);
  char* gateway_argv[] = {(char*)pcp,    "--gateway",  "--gateway-config",
                          config,        "--api-port", api_text,
                          "--model-dir", model_dir,    NULL};
  pid_t gateway = spawn(gateway_argv);
  char connect_b[64], cache_b[512];
  snprintf(connect_b, sizeof(connect_b), "127.0.0.1:%d", gateway_fabric_port);
  snprintf(cache_b, sizeof(cache_b), "%s/worker-cache-b", dir);
  char* twin_argv[] = {(char*)pcp,    "--worker", "--connect", connect_b,
                       "--cache-dir", cache_b,    NULL};
  pid_t twin = spawn(twin_argv);
  pcp_http_client_t* client = NULL;
  pcp_http_client_options_t client_options = {.timeout_ms = 60000};
  status =
      pcp_http_client_create(&client_options, pcp_allocator_system(), &client);
  if (status)
    return fail(status, "client");
  char url[128];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/readyz", api_port);
  bool ready = false;
  for (int i = 0; i < 1200 && !ready; ++i) {
    pcp_http_client_request_t get = {.url = url};
    pcp_http_client_response_t response;
    pcp_status_t s = pcp_http_client_send(client, &get, &response);
    ready = !s && response.http_status == 200;
    pcp_status_ignore(s);
    pcp_http_client_response_deinitialize(&response);
    if (!ready)
      pcp_sleep_ms(100);
  }
  if (!ready) {
    fprintf(stderr, "gateway_overhead: the gateway did not become ready\n");
    stop(gateway);
    stop(twin);
    stop(worker);
    stop(worker_c);
    return 1;
  }
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/completions", api_port);
  char want[32];
  snprintf(want, sizeof(want), "\"text\":\"%c\"", kVocab[direct_token]);
  int wrong = 0;
  // Side 0: direct, 1: direct B (null comparison), 2: gateway.
  static const int kOrders[6][3] = {{0, 1, 2}, {1, 2, 0}, {2, 0, 1},
                                    {0, 2, 1}, {2, 1, 0}, {1, 0, 2}};
  double direct[SAMPLES], gateway_times[SAMPLES], paired[SAMPLES];
  double null_paired[SAMPLES], compute[SAMPLES], transport[SAMPLES];
  for (int i = -WARMUP; i < SAMPLES; ++i) {
    double d = 0, c = 0, g = 0, dc = 0, cc = 0;
    bool matches = true;
    int32_t token = -1, token_b = -1;
    for (int k = 0; k < 3 && !status; ++k) {
      int side = kOrders[(i + WARMUP) % 6][k];
      if (side == 0) {
        status = direct_sample(endpoint, &prefill, spec.vocab, &token, &d, &dc);
      } else if (side == 1) {
        status =
            direct_sample(endpoint, &prefill_c, spec.vocab, &token_b, &c, &cc);
      } else {
        status = gateway_sample(client, url, want, &matches, &g);
      }
    }
    if (status) {
      stop(gateway);
      stop(twin);
      stop(worker);
      stop(worker_c);
      return fail(status, "sample");
    }
    if ((kVocab[direct_token] != '\n' && !matches) || token != direct_token ||
        token_b != direct_token) {
      ++wrong;
    }
    if (i >= 0) {
      direct[i] = d;
      gateway_times[i] = g;
      paired[i] = g - d;
      null_paired[i] = c - d;
      compute[i] = dc;
      transport[i] = d - dc;
    }
  }
  pcp_http_client_release(client);
  pcp_fabric_endpoint_release(endpoint);
  stop(gateway);
  stop(twin);
  stop(worker);
  stop(worker_c);

  double d50 = percentile(direct, SAMPLES, 0.5);
  double d99 = percentile(direct, SAMPLES, 0.99);
  double g50 = percentile(gateway_times, SAMPLES, 0.5);
  double g99 = percentile(gateway_times, SAMPLES, 0.99);
  double a50 = percentile(paired, SAMPLES, 0.5);
  double a90 = percentile(paired, SAMPLES, 0.9);
  double a99 = percentile(paired, SAMPLES, 0.99);
  double n50 = percentile(null_paired, SAMPLES, 0.5);
  double n90 = percentile(null_paired, SAMPLES, 0.9);
  double n99 = percentile(null_paired, SAMPLES, 0.99);
  int negative = 0;
  for (int i = 0; i < SAMPLES; ++i) {
    negative += paired[i] < 0;
  }
  printf(
      "prompt %d tokens, %d pairs after %d warm-up ones, first token '%c' "
      "(%d rounds with a token that differs)\n",
      n, SAMPLES, WARMUP, kVocab[direct_token], wrong);
  printf("direct  (fabric task @prefill + argmax): p50 %.3f ms  p99 %.3f ms\n",
         d50 * 1e3, d99 * 1e3);
  printf("gateway (POST /v1/completions, 1 token): p50 %.3f ms  p99 %.3f ms\n",
         g50 * 1e3, g99 * 1e3);
  printf(
      "added per pair (gateway - direct of the same pair): p50 %.3f ms  "
      "p90 %.3f ms  p99 %.3f ms (%d of %d pairs negative)\n",
      a50 * 1e3, a90 * 1e3, a99 * 1e3, negative, SAMPLES);
  printf(
      "null comparison (direct B - direct of the same round, no gateway): "
      "p50 %.3f ms  p90 %.3f ms  p99 %.3f ms\n",
      n50 * 1e3, n90 * 1e3, n99 * 1e3);
  printf(
      "direct split: worker compute (result's elapsed) p50 %.3f ms  p90 "
      "%.3f ms  p99 %.3f ms; transport and wake-ups p50 %.3f ms  p90 %.3f "
      "ms  p99 %.3f ms\n",
      percentile(compute, SAMPLES, 0.5) * 1e3,
      percentile(compute, SAMPLES, 0.9) * 1e3,
      percentile(compute, SAMPLES, 0.99) * 1e3,
      percentile(transport, SAMPLES, 0.5) * 1e3,
      percentile(transport, SAMPLES, 0.9) * 1e3,
      percentile(transport, SAMPLES, 0.99) * 1e3);
  char goal[96];
  snprintf(goal, sizeof(goal), "per-pair p99 added <= %.1f ms (%.3f ms)",
           GOAL_P99_MS, a99 * 1e3);
  bool met = pcp_bench_goal("gateway_overhead", a99 * 1e3 <= GOAL_P99_MS, goal);
  met &= pcp_bench_goal("gateway_overhead", wrong == 0,
                        "every token equals the direct argmax");
  printf("gateway_overhead ratio=%.3f\n", d50 / (d50 + (a50 > 0 ? a50 : 0)));
  pcp_compile_result_deinitialize(&compiled);
  pcp_string_builder_deinitialize(&text);
  for (size_t i = 0; i < table.count; ++i) {
    free(params[i]);
  }
  free(params);
  free(sections);
  free(names);
  free(keep);
  pcp_models_parameter_table_deinitialize(&table);
  return wrong ? 1 : pcp_bench_exit_code(met);
}
