// SPDX-License-Identifier: Apache-2.0
// bench/train_step: tokens/s of one worker's fused inner loop: @train_steps
// (K AdamW steps in one call, `pcp compile --program train --inner-steps
// K`) of the ~1M-parameter char GPT (pcp model gpt --layers 4 --width 128
// --heads 4 --vocab 65 --block-size 64 --batch 8; 809,856 parameters),
// driven through pcp_backend_t the way a worker drives it: parameters and
// both moments resident on the device and fed back call after call, the
// K x B x T token ids and targets uploaded from the host each call, the K
// losses downloaded. Against, in the same run:
//
//   (a) jax.jit on CPU: the same architecture from tests/models/
//       jax_reference.py (written independently of the emitter), loss +
//       jax.grad + the same AdamW with global-norm clipping, the K steps
//       fused with lax.scan, state donated; compiled and warmed up first
//       (goal: pcp / jax >= 1.0)
//   (b) the same VMFB in a tight `iree.runtime` Python loop (resident
//       DeviceArrays fed back) with the same CPU worker set-up as the pcp
//       side (as many workers, unpinned; goal: pcp / iree >= 0.95); and,
//       for reference, the same loop with IREE's default set-up (one worker
//       pinned to each physical core)
//   (c) peak RSS of the pcp side's process against the iree.runtime
//       loop's (goal <= 1.2x)
//
// Each side is its own long-lived process (the pcp side is this binary
// re-executed with --pcp-side), warmed up, then driven over a pipe: ROUNDS
// rounds, each side running CALLS calls per round in turn, so that no two
// sides ever compete and the four runs of a round, seconds apart, see the
// same load from other work on the machine. The order cycles through a
// balanced Latin square (each side runs right after each other side equally
// often), with a pause between sides: a runtime's worker threads spin for a
// while after a call (XLA's pool does), and a fixed rotation made one side
// always run right after JAX, costing it 5-10%.
// A ratio is the median over rounds of that round's ratio (paired); the
// tokens/s printed are medians over rounds. CPU seconds per call (all
// threads) are printed too: on a loaded machine they show whether a side
// did more work or only waited longer for a core.
// All four start from the same parameters and data; their first-call
// losses must agree (a check that the same computation is timed).
//
// A `train_step goal ...: met|MISSED` line per goal (a miss exits 1 under
// PCP_BENCH_CHECK=1). Last line: `train_step ratio=<x>`, x = pcp / jax
// tokens/s.

// fdopen, mkdtemp and getline are POSIX.1-2008.
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "compile/compile.h"
#include "compute/compute.h"
#include "models/models.h"

#define K 10
#define SIDES 4
#define ROUNDS 8  // the 4 orders of a balanced Latin square, twice
#define CALLS 2
#define LR 1e-3
#define SEED 1

static void check(pcp_status_t status, const char* what) {
  pcp_bench_check("train_step", status, what);
}

static void model_spec(pcp_models_spec_t* spec) {
  pcp_models_spec_initialize(PCP_MODELS_ARCHITECTURE_GPT, spec);
  spec->layers = 4;
  spec->heads = 4;
  spec->width = 128;
  spec->vocab = 65;
  spec->block_size = 64;
  spec->batch = 8;
}

// User + system CPU seconds of this process, all threads.
static double cpu_seconds(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return (double)usage.ru_utime.tv_sec + (double)usage.ru_stime.tv_sec +
         1e-6 * (double)(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

//===----------------------------------------------------------------------===//
// The pcp side (child process): the worker's inner loop
//===----------------------------------------------------------------------===//

static pcp_status_t read_npy(const char* dir, const char* name,
                             pcp_element_type_t type, pcp_host_tensor_t* out) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  return pcp_host_tensor_read_npy(path, type, out);
}

static int pcp_side(const char* dir) {
  pcp_models_spec_t spec;
  model_spec(&spec);
  pcp_models_parameter_table_t table;
  check(pcp_models_parameter_table_initialize(&spec, pcp_allocator_system(),
                                              &table),
        "table");
  size_t n = table.count;
  char path[4096];
  snprintf(path, sizeof(path), "%s/train.vmfb", dir);
  void* vmfb = NULL;
  size_t vmfb_length = 0;
  check(pcp_file_read_all(path, PCP_MAX_PROGRAM_BYTES, &vmfb, &vmfb_length),
        "read vmfb");
  pcp_backend_options_t options = {.driver = "cpu"};
  pcp_backend_t* backend = NULL;
  check(pcp_backend_create(&options, &backend), "backend");
  pcp_program_t* program = NULL;
  check(pcp_program_load(backend, vmfb, vmfb_length, &program), "load");
  free(vmfb);

  // params, m, v: uploaded once, then only ever the previous call's results.
  pcp_tensor_t** state = calloc(3 * n, sizeof(pcp_tensor_t*));
  pcp_tensor_t** results = calloc(3 * n + 2, sizeof(pcp_tensor_t*));
  pcp_value_t* inputs = calloc(3 * n + 4, sizeof(pcp_value_t));
  if (!state || !results || !inputs) {
    fprintf(stderr, "train_step: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    snprintf(name, sizeof(name), "params/%03zu.npy", i);
    pcp_host_tensor_t host;
    check(read_npy(dir, name, PCP_ELEMENT_TYPE_F32, &host), "params");
    check(pcp_tensor_upload(backend, &host, &state[i]), "upload");
    memset(host.data, 0, host.byte_length);
    check(pcp_tensor_upload(backend, &host, &state[n + i]), "upload");
    check(pcp_tensor_upload(backend, &host, &state[2 * n + i]), "upload");
    pcp_host_tensor_deinitialize(&host);
  }
  pcp_host_tensor_t ids, targets, step, lr;
  check(read_npy(dir, "ids.npy", PCP_ELEMENT_TYPE_I32, &ids), "ids");
  check(read_npy(dir, "targets.npy", PCP_ELEMENT_TYPE_I32, &targets),
        "targets");
  pcp_tensor_shape_t scalar = {.element_type = PCP_ELEMENT_TYPE_F32};
  check(pcp_host_tensor_allocate(&scalar, &step), "step");
  // One rate per fused step (constant here: the schedule is the caller's).
  pcp_tensor_shape_t rates = {
      .element_type = PCP_ELEMENT_TYPE_F32, .rank = 1, .dims = {K}};
  check(pcp_host_tensor_allocate(&rates, &lr), "lr");
  for (int s = 0; s < K; ++s) ((float*)lr.data)[s] = (float)LR;
  float losses[K];
  float next_step = 1.0f;

  // One call, as a worker makes it each round: state resident, data and
  // scalars from the host, the new state kept, the losses downloaded.
#define CALL()                                                              \
  do {                                                                      \
    *(float*)step.data = next_step;                                         \
    for (size_t i = 0; i < 3 * n; ++i)                                      \
      inputs[i] = pcp_value_resident(state[i]);                             \
    inputs[3 * n] = pcp_value_host(&step);                                  \
    inputs[3 * n + 1] = pcp_value_host(&lr);                                \
    inputs[3 * n + 2] = pcp_value_host(&ids);                               \
    inputs[3 * n + 3] = pcp_value_host(&targets);                           \
    size_t count = 0;                                                       \
    check(pcp_program_invoke(program, "train_steps", inputs, 3 * n + 4,     \
                             results, 3 * n + 2, &count),                   \
          "train_steps");                                                   \
    for (size_t i = 0; i < 3 * n; ++i) {                                    \
      pcp_tensor_release(state[i]);                                         \
      state[i] = results[i];                                                \
    }                                                                       \
    pcp_tensor_release(results[3 * n]); /* step + K: counted on the host */ \
    check(pcp_tensor_download(results[3 * n + 1], losses, sizeof(losses)),  \
          "losses");                                                        \
    pcp_tensor_release(results[3 * n + 1]);                                 \
    next_step += (float)K;                                                  \
  } while (0)

  CALL();  // warm-up
  printf("ready %.6f %.6f\n", (double)losses[0], (double)losses[K - 1]);
  fflush(stdout);
  double tokens = (double)K * (double)spec.batch * (double)spec.block_size;
  pcp_clock_t clock = pcp_clock_system();
  char line[64];
  int rc = 1;
  while (fgets(line, sizeof(line), stdin)) {
    if (strncmp(line, "go ", 3) == 0) {
      int calls = atoi(line + 3);
      double cpu = cpu_seconds();
      int64_t start = pcp_clock_now_ns(clock);
      for (int c = 0; c < calls; ++c) {
        CALL();
      }
      double seconds = (double)(pcp_clock_now_ns(clock) - start) * 1e-9;
      printf("rate %.3f %.6f\n", calls * tokens / seconds,
             (cpu_seconds() - cpu) / calls);
      fflush(stdout);
    } else if (strncmp(line, "quit", 4) == 0) {
      printf("rss %lld\n", (long long)pcp_bench_status_kib("VmHWM:"));
      fflush(stdout);
      rc = 0;
      break;
    }
  }
#undef CALL
  for (size_t i = 0; i < 3 * n; ++i) pcp_tensor_release(state[i]);
  free(state);
  free(results);
  free(inputs);
  pcp_host_tensor_deinitialize(&ids);
  pcp_host_tensor_deinitialize(&targets);
  pcp_host_tensor_deinitialize(&step);
  pcp_host_tensor_deinitialize(&lr);
  pcp_program_release(program);
  pcp_backend_release(backend);
  pcp_models_parameter_table_deinitialize(&table);
  return rc;
}

//===----------------------------------------------------------------------===//
// The driver (parent)
//===----------------------------------------------------------------------===//

typedef struct side_t {
  const char* name;
  pid_t pid;
  FILE* to;    // the child's stdin
  FILE* from;  // the child's stdout
  double first_loss, last_loss;
  double rates[ROUNDS];
  double cpu_per_call[ROUNDS];  // CPU seconds per call, all threads
  double median;
  long long rss_kib;
} side_t;

static void side_start(side_t* side, char* const argv[]) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) {
    perror("pipe");
    exit(1);
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(1);
  }
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    execv(argv[0], argv);
    perror(argv[0]);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  // Later children must not inherit this side's pipe ends: a side sees EOF
  // (and exits) when this process closes its stdin or dies.
  fcntl(in[1], F_SETFD, FD_CLOEXEC);
  fcntl(out[0], F_SETFD, FD_CLOEXEC);
  side->pid = pid;
  side->to = fdopen(in[1], "w");
  side->from = fdopen(out[0], "r");
}

// Reads the child's next line and checks its first word.
static void side_expect(side_t* side, const char* word, char* line,
                        size_t capacity) {
  if (!fgets(line, (int)capacity, side->from) ||
      strncmp(line, word, strlen(word)) != 0) {
    fprintf(stderr, "train_step: %s side: expected '%s', got '%s'\n",
            side->name, word, line);
    exit(1);
  }
}

static void side_round(side_t* side, int round) {
  char line[128] = "";
  fprintf(side->to, "go %d\n", CALLS);
  fflush(side->to);
  side_expect(side, "rate ", line, sizeof(line));
  if (sscanf(line + 5, "%lf %lf", &side->rates[round],
             &side->cpu_per_call[round]) != 2) {
    fprintf(stderr, "train_step: %s side: bad line '%s'\n", side->name, line);
    exit(1);
  }
}

static int compare_doubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(const double* values, int count) {
  double sorted[ROUNDS];
  memcpy(sorted, values, (size_t)count * sizeof(double));
  qsort(sorted, (size_t)count, sizeof(double), compare_doubles);
  return count % 2 ? sorted[count / 2]
                   : 0.5 * (sorted[count / 2 - 1] + sorted[count / 2]);
}

// Median over rounds of a's rate / b's rate in the same round.
static double paired_ratio(const side_t* a, const side_t* b) {
  double ratios[ROUNDS];
  for (int r = 0; r < ROUNDS; ++r) ratios[r] = a->rates[r] / b->rates[r];
  return median(ratios, ROUNDS);
}

// Threads of process |pid| named "iree-worker-N" (IREE's task workers).
static int worker_thread_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR* dir = opendir(path);
  int count = 0;
  for (struct dirent* entry = dir ? readdir(dir) : NULL; entry;
       entry = readdir(dir)) {
    if (entry->d_name[0] == '.')
      continue;
    char comm_path[64 + sizeof(entry->d_name) + 8], comm[64] = "";
    snprintf(comm_path, sizeof(comm_path), "%s/%s/comm", path, entry->d_name);
    FILE* f = fopen(comm_path, "r");
    if (f) {
      if (fgets(comm, sizeof(comm), f) &&
          strncmp(comm, "iree-worker-", 12) == 0) {
        ++count;
      }
      fclose(f);
    }
  }
  if (dir)
    closedir(dir);
  return count > 0 ? count : 1;
}

static void write_npy(const char* dir, const char* name,
                      const pcp_tensor_shape_t* shape, void* data) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  size_t length = 0;
  check(pcp_tensor_shape_byte_length(shape, &length), "shape");
  pcp_host_tensor_t tensor;
  check(pcp_host_tensor_wrap(shape, data, length, &tensor), "wrap");
  check(pcp_host_tensor_write_npy(&tensor, path, false), "write npy");
}

// The training module: forward-loss module -> autodiff + AdamW + K fused
// steps -> VMFB (the artifact cache makes later runs skip the compiler).
static void build_program(const pcp_models_spec_t* spec, const char* dir) {
  pcp_string_builder_t text;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &text);
  check(pcp_models_module_emit(spec, &text), "emit");
  pcp_compile_training_options_t options;
  pcp_compile_training_options_initialize(&options);
  options.program = PCP_COMPILE_PROGRAM_TRAIN;
  options.inner_steps = K;
  char* training = NULL;
  size_t training_length = 0;
  check(pcp_compile_training_module_build(
            pcp_string_builder_cstring(&text), text.size, "train_step.mlir",
            &options, pcp_allocator_system(), &training, &training_length),
        "autodiff");
  pcp_string_builder_deinitialize(&text);
  pcp_compile_request_t request = {.mlir_text = training,
                                   .mlir_byte_length = training_length,
                                   .source_name = "train_step.mlir",
                                   .backend = PCP_COMPILE_BACKEND_CPU};
  pcp_compile_result_t result;
  check(pcp_compile_module(&request, &result), "compile");
  printf("program: @train_steps, K=%d, %s (%.1f s), %zu byte VMFB\n", K,
         result.cache_hit ? "artifact cache hit" : "compiled",
         result.compile_seconds, result.vmfb_byte_length);
  char path[4096];
  snprintf(path, sizeof(path), "%s/train.vmfb", dir);
  check(pcp_file_write_atomic(path, result.vmfb, result.vmfb_byte_length),
        "write vmfb");
  pcp_compile_result_deinitialize(&result);
  pcp_allocator_free(pcp_allocator_system(), training);
}

// Parameters (the built-in seeded init), data ([K, B, T] ids and the next
// token as targets, from a fixed pseudo-random text) and the JAX side's
// parameter table.
static void write_inputs(const pcp_models_spec_t* spec, const char* dir) {
  pcp_models_parameter_table_t table;
  check(pcp_models_parameter_table_initialize(spec, pcp_allocator_system(),
                                              &table),
        "table");
  char params_dir[4096];
  snprintf(params_dir, sizeof(params_dir), "%s/params", dir);
  check(pcp_file_make_directories(params_dir), "mkdir");
  void** buffers = calloc(table.count, sizeof(void*));
  for (size_t i = 0; i < table.count; ++i) {
    buffers[i] = malloc(table.parameters[i].byte_length);
    if (!buffers[i]) {
      fprintf(stderr, "train_step: out of memory\n");
      exit(1);
    }
  }
  pcp_models_parameters_initialize(&table, SEED, buffers);
  for (size_t i = 0; i < table.count; ++i) {
    const pcp_models_parameter_t* p = &table.parameters[i];
    pcp_tensor_shape_t shape = {.element_type = PCP_ELEMENT_TYPE_F32,
                                .rank = p->rank};
    for (int32_t d = 0; d < p->rank; ++d) shape.dims[d] = p->dims[d];
    char name[64];
    snprintf(name, sizeof(name), "params/%03zu.npy", i);
    write_npy(dir, name, &shape, buffers[i]);
    free(buffers[i]);
  }
  free(buffers);
  printf(
      "model: gpt, %lld parameters in %zu tensors, batch %lld x block "
      "%lld, %d steps per call (%lld tokens)\n",
      (long long)table.total_elements, table.count, (long long)spec->batch,
      (long long)spec->block_size, K,
      (long long)(K * spec->batch * spec->block_size));

  int64_t b = spec->batch, t = spec->block_size;
  size_t count = (size_t)(K * b * t);
  int32_t* ids = calloc(count, sizeof(int32_t));
  int32_t* targets = calloc(count, sizeof(int32_t));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  int32_t previous = 0;
  for (size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids[i] = previous;
    previous = (int32_t)(x % (uint64_t)spec->vocab);
    targets[i] = previous;
  }
  pcp_tensor_shape_t data = {
      .element_type = PCP_ELEMENT_TYPE_I32, .rank = 3, .dims = {K, b, t}};
  write_npy(dir, "ids.npy", &data, ids);
  write_npy(dir, "targets.npy", &data, targets);
  free(ids);
  free(targets);

  pcp_string_builder_t json;
  pcp_string_builder_initialize(pcp_allocator_system(), 0, &json);
  check(pcp_models_parameter_table_format_json(spec, &table, &json), "json");
  char path[4096];
  snprintf(path, sizeof(path), "%s/table.json", dir);
  check(pcp_file_write_atomic(path, json.data, json.size), "write json");
  pcp_string_builder_deinitialize(&json);
  pcp_models_parameter_table_deinitialize(&table);
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--pcp-side") == 0) {
    return pcp_side(argv[2]);
  }
  if (argc != 1) {
    fprintf(stderr, "usage: %s\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  char dir[] = "/tmp/pcp-bench-train-step-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  pcp_models_spec_t spec;
  model_spec(&spec);
  write_inputs(&spec, dir);
  build_program(&spec, dir);

  char self[4096];
  ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) {
    perror("readlink /proc/self/exe");
    return 1;
  }
  self[length] = '\0';
  char script[] = PCP_SOURCE_DIR "/bench/train_step_baseline.py";
  char python[] = PCP_VENV_PYTHON;
  char k_text[16], lr_text[32];
  snprintf(k_text, sizeof(k_text), "%d", K);
  snprintf(lr_text, sizeof(lr_text), "%.9g", LR);
  char pcp_flag[] = "--pcp-side", iree_word[] = "iree", jax_word[] = "jax";
  side_t sides[SIDES] = {{.name = "pcp"},
                         {.name = "iree.runtime"},
                         {.name = "iree default"},
                         {.name = "jax.jit"}};
  char workers_flag[64] = "";
  char* pcp_argv[] = {self, pcp_flag, dir, NULL};
  char* iree_argv[] = {python, script,  iree_word,    dir,
                       k_text, lr_text, workers_flag, NULL};
  char* iree_default_argv[] = {python, script,  iree_word, dir,
                               k_text, lr_text, NULL};
  char* jax_argv[] = {python, script, jax_word, dir, k_text, lr_text, NULL};
  char** argvs[SIDES] = {pcp_argv, iree_argv, iree_default_argv, jax_argv};
  // One at a time, so that each warms up (and JAX compiles) alone.
  for (int s = 0; s < SIDES; ++s) {
    if (s == 1) {
      // The matched loop gets as many workers as the pcp side runs, and
      // an explicit count, which leaves them unpinned as pcp's are.
      int workers = worker_thread_count(sides[0].pid);
      printf("pcp side: %d IREE worker threads, unpinned\n", workers);
      snprintf(workers_flag, sizeof(workers_flag),
               "--task_topology_group_count=%d", workers);
    }
    side_start(&sides[s], argvs[s]);
    char line[128] = "";
    side_expect(&sides[s], "ready ", line, sizeof(line));
    if (sscanf(line + 6, "%lf %lf", &sides[s].first_loss,
               &sides[s].last_loss) != 2) {
      fprintf(stderr, "train_step: %s side: bad line '%s'\n", sides[s].name,
              line);
      return 1;
    }
  }
  // The same model, data and optimizer: step 1's loss (before any update)
  // and step K's (after K - 1 updates) must agree across the sides.
  bool same = true;
  for (int s = 1; s < SIDES; ++s) {
    same = same && fabs(sides[s].first_loss - sides[0].first_loss) <= 1e-4 &&
           fabs(sides[s].last_loss - sides[0].last_loss) <= 1e-3;
  }
  printf(
      "first call's loss, step 1 / step %d: pcp %.5f / %.5f, "
      "iree.runtime %.5f / %.5f, jax %.5f / %.5f%s\n",
      K, sides[0].first_loss, sides[0].last_loss, sides[1].first_loss,
      sides[1].last_loss, sides[3].first_loss, sides[3].last_loss,
      same ? "" : "  MISMATCH");
  if (!same) {
    return 1;
  }
  static const int kOrders[4][SIDES] = {
      {0, 1, 3, 2}, {1, 2, 0, 3}, {2, 3, 1, 0}, {3, 0, 2, 1}};
  for (int r = 0; r < ROUNDS; ++r) {
    for (int j = 0; j < SIDES; ++j) {
      nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
      side_round(&sides[kOrders[r % 4][j]], r);
    }
  }
  for (int s = 0; s < SIDES; ++s) {
    char line[128] = "";
    fprintf(sides[s].to, "quit\n");
    fflush(sides[s].to);
    side_expect(&sides[s], "rss ", line, sizeof(line));
    sides[s].rss_kib = strtoll(line + 4, NULL, 10);
    fclose(sides[s].to);
    fclose(sides[s].from);
    int wstatus = 0;
    waitpid(sides[s].pid, &wstatus, 0);
    sides[s].median = median(sides[s].rates, ROUNDS);
  }
  for (int s = 0; s < SIDES; ++s) {
    double low = sides[s].rates[0], high = sides[s].rates[0];
    for (int r = 1; r < ROUNDS; ++r) {
      low = fmin(low, sides[s].rates[r]);
      high = fmax(high, sides[s].rates[r]);
    }
    printf(
        "%-13s tokens/s: median %.0f over %d rounds of %d calls "
        "(min %.0f, max %.0f); CPU per call %.3f s (median)\n",
        sides[s].name, sides[s].median, ROUNDS, CALLS, low, high,
        median(sides[s].cpu_per_call, ROUNDS));
  }
  double to_iree = paired_ratio(&sides[0], &sides[1]);
  double to_iree_default = paired_ratio(&sides[0], &sides[2]);
  double to_jax = paired_ratio(&sides[0], &sides[3]);
  double rss = (double)sides[0].rss_kib / (double)sides[1].rss_kib;
  printf(
      "pcp vs iree.runtime loop: %.3f (median of per-round ratios; goal "
      ">= 0.95)\n",
      to_iree);
  printf(
      "pcp vs iree.runtime loop with IREE's default pinned workers: "
      "%.3f\n",
      to_iree_default);
  printf(
      "peak RSS: pcp side %.1f MB, iree.runtime loop %.1f MB (default "
      "set-up %.1f MB), jax %.1f MB; pcp / iree.runtime %.3f (goal <= "
      "1.2)\n",
      sides[0].rss_kib / 1024.0, sides[1].rss_kib / 1024.0,
      sides[2].rss_kib / 1024.0, sides[3].rss_kib / 1024.0, rss);
  printf("pcp vs jax.jit: %.3f (median of per-round ratios; goal >= 1.0)\n",
         to_jax);
  char cleanup[4200];
  snprintf(cleanup, sizeof(cleanup), "rm -rf %s", dir);
  if (system(cleanup) != 0) {
    fprintf(stderr, "could not remove %s\n", dir);
  }
  char goal[96];
  snprintf(goal, sizeof(goal), "pcp / iree.runtime loop >= 0.95 (%.3f)",
           to_iree);
  bool met = pcp_bench_goal("train_step", to_iree >= 0.95, goal);
  snprintf(goal, sizeof(goal), "pcp / jax.jit >= 1.0 (%.3f)", to_jax);
  met &= pcp_bench_goal("train_step", to_jax >= 1.0, goal);
  snprintf(goal, sizeof(goal), "peak RSS pcp / iree.runtime <= 1.2 (%.3f)",
           rss);
  met &= pcp_bench_goal("train_step", rss <= 1.2, goal);
  printf("train_step ratio=%.3f\n", to_jax);
  return pcp_bench_exit_code(met);
}
