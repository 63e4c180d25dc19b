// SPDX-License-Identifier: Apache-2.0
// The compile queue (compile_queue.h): bounded slots, FIFO, one child
// `pcp compile` per compile, waiters sharing a key, kill on cancel.

#include "workloads/runtime/compile_queue.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "compile/compile.h"

extern char** environ;

// Input files hashed by the queue (no content_hash given) are capped like
// the compiler's input.
#define MAX_INPUT_BYTES PCP_COMPILE_MAX_MLIR_BYTES
#define MAX_ARGS (32 + PCP_WORKLOADS_COMPILE_MAX_IREE_FLAGS)
#define PATH_CAPACITY 1200

typedef enum entry_state_e {
  ENTRY_QUEUED = 0,
  ENTRY_RUNNING = 1,
  ENTRY_DONE = 2,
} entry_state_t;

// One compile: one key, one child, any number of waiters. Guarded by the
// queue's |mu|; freed when the last reference (a request or the slot thread
// running it) goes.
typedef struct entry_t {
  struct entry_t* next;   // in |queue->entries| (in flight) or FIFO order
  uint32_t references;    // requests + the running slot thread
  uint32_t live_waiters;  // requests not cancelled
  entry_state_t state;
  pid_t pid;  // RUNNING with a child not yet reaped; else 0
  bool killed;
  pcp_status_t status;  // DONE: the result (each waiter gets a clone)
  pthread_cond_t done_cv;
  // Requests with a notification to run when |e| finishes (linked through
  // notify_next; a cancel unlinks its request).
  struct pcp_workloads_compile_request_t* notify_head;
  char key[PCP_SHA256_HEX_LENGTH + 1];
  char vmfb_path[PATH_CAPACITY];
  char log_path[PATH_CAPACITY];
  char label[128];
  char program[16];
  char backend[32];
  char target[96];
  // argv for the child: pointers into |strings|.
  int argc;
  char* argv[MAX_ARGS + 1];
  char* strings;  // one allocation holding every argv string
} entry_t;

struct pcp_workloads_compile_request_t {
  pcp_workloads_compile_queue_t* queue;
  entry_t* entry;  // NULL for a cache hit
  bool cancelled;
  bool cache_hit;
  // pcp_workloads_compile_request_notify: run once, then cleared.
  void (*notify)(void* user_data);
  void* notify_user_data;
  struct pcp_workloads_compile_request_t* notify_next;
  char key[PCP_SHA256_HEX_LENGTH + 1];
  char vmfb_path[PATH_CAPACITY];
  char log_path[PATH_CAPACITY];
};

struct pcp_workloads_compile_queue_t {
  pcp_allocator_t allocator;
  pcp_workloads_compile_queue_options_t options;
  char pcp_path[PATH_CAPACITY];
  char artifact_dir[PATH_CAPACITY];
  char compiler_version[256];
  bool version_known;
  pcp_log_context_t log;

  pthread_mutex_t mu;
  // The creator's reference plus one per request not yet released: the
  // lock outlives destroy while a request still points at it.
  uint32_t references;
  pthread_cond_t work_cv;  // slot threads wait for a queued entry
  bool stopping;
  // Queued and running entries, in submit order (the FIFO is the queued
  // ones in this order).
  entry_t* entries;
  uint32_t in_flight;
  pcp_workloads_compile_queue_stats_t stats;
  uint32_t thread_count;
  pthread_t threads[PCP_WORKLOADS_COMPILE_MAX_SLOTS];
};

//===----------------------------------------------------------------------===//
// The key
//===----------------------------------------------------------------------===//

static bool string_ok(const char* s) {
  return !s || strlen(s) <= PCP_WORKLOADS_COMPILE_MAX_STRING_LENGTH;
}

static const char* or_dash(const char* s) {
  return s && s[0] ? s : "-";
}

static pcp_status_t spec_check(const pcp_workloads_compile_spec_t* spec) {
  if (!spec->mlir_path || !spec->mlir_path[0] || !spec->backend ||
      !spec->backend[0]) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "a compile needs an input file and a backend");
  }
  if (spec->iree_flag_count > PCP_WORKLOADS_COMPILE_MAX_IREE_FLAGS) {
    return pcp_make_status(
        PCP_STATUS_INVALID_ARGUMENT, "%zu extra iree flags (at most %d)",
        spec->iree_flag_count, PCP_WORKLOADS_COMPILE_MAX_IREE_FLAGS);
  }
  bool ok = string_ok(spec->mlir_path) && string_ok(spec->content_hash) &&
            string_ok(spec->program) && string_ok(spec->delta_dtype) &&
            string_ok(spec->backend) && string_ok(spec->target) &&
            string_ok(spec->log_dir) && string_ok(spec->label);
  for (size_t i = 0; ok && i < spec->iree_flag_count; ++i) {
    ok = spec->iree_flags[i] && string_ok(spec->iree_flags[i]);
  }
  if (!ok) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "a compile argument is over %d bytes",
                           PCP_WORKLOADS_COMPILE_MAX_STRING_LENGTH);
  }
  if (spec->program &&
      strlen(spec->program) >= sizeof(((entry_t*)0)->program)) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "program kind '%.32s' is too long", spec->program);
  }
  if (strlen(spec->backend) >= sizeof(((entry_t*)0)->backend) ||
      (spec->target && strlen(spec->target) >= sizeof(((entry_t*)0)->target))) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "backend or target name is too long");
  }
  return pcp_ok_status();
}

pcp_status_t pcp_workloads_compile_key_compute(
    const pcp_workloads_compile_spec_t* spec, const char* compiler_version,
    char out_key[PCP_SHA256_HEX_LENGTH + 1]) {
  out_key[0] = 0;
  PCP_RETURN_IF_ERROR_BARE(spec_check(spec));
  char content[PCP_SHA256_HEX_LENGTH + 1];
  if (spec->content_hash && spec->content_hash[0]) {
    snprintf(content, sizeof(content), "%s", spec->content_hash);
  } else {
    void* bytes = NULL;
    size_t length = 0;
    PCP_RETURN_IF_ERROR(
        pcp_file_read_all(spec->mlir_path, MAX_INPUT_BYTES, &bytes, &length),
        "compile input %s", spec->mlir_path);
    pcp_sha256_t digest;
    pcp_sha256_compute(bytes, length, &digest);
    pcp_allocator_free(pcp_allocator_system(), bytes);  // read_all: system
    pcp_sha256_to_hex(&digest, content);
  }
  // One line per component, each named, so no two specs share a text: a
  // value cannot contain a newline that would fake another component
  // (strings with control characters never reach here from a user: flags
  // are checked at submit; a backend or target is a table name).
  pcp_string_builder_t b;
  pcp_string_builder_initialize(pcp_allocator_system(), 64 << 10, &b);
  pcp_status_t status = pcp_string_builder_append_f(
      &b, PCP_WORKLOADS_COMPILE_KEY_VERSION "\ncontent=%s\nprogram=%s\n",
      content, or_dash(spec->program));
  if (!status && spec->program && spec->program[0]) {
    status = pcp_string_builder_append_f(
        &b,
        "inner_steps=%" PRId64 "\ndelta=%s\naccumulate=%" PRId64
        "\ninner_state=%s\n",
        spec->inner_steps, spec->delta_dtype ? spec->delta_dtype : "f32",
        spec->accumulation > 1 ? spec->accumulation : 1,
        spec->inner_state_keep ? "keep" : "reset");
  }
  for (size_t i = 0; !status && i < spec->iree_flag_count; ++i) {
    status = pcp_string_builder_append_f(&b, "flag=%s\n", spec->iree_flags[i]);
  }
  const char* env_flags = getenv(PCP_COMPILE_FLAGS_ENV);
  if (!status) {
    status = pcp_string_builder_append_f(
        &b, "env=%s\nbackend=%s\ntarget=%s\ncompiler=%s\n",
        env_flags ? env_flags : "", spec->backend,
        spec->target ? spec->target : "",
        compiler_version ? compiler_version : "");
  }
  if (!status) {
    pcp_sha256_t digest;
    pcp_sha256_compute(b.data, b.size, &digest);
    pcp_sha256_to_hex(&digest, out_key);
  }
  pcp_string_builder_deinitialize(&b);
  return status;
}

//===----------------------------------------------------------------------===//
// Entries
//===----------------------------------------------------------------------===//

// The child's argv, copied into one allocation.
static pcp_status_t entry_argv_build(pcp_workloads_compile_queue_t* q,
                                     const pcp_workloads_compile_spec_t* spec,
                                     entry_t* e) {
  char steps[32];
  char accumulate[32];
  char timeout[32];
  snprintf(steps, sizeof(steps), "%" PRId64, spec->inner_steps);
  snprintf(accumulate, sizeof(accumulate), "%" PRId64, spec->accumulation);
  snprintf(timeout, sizeof(timeout), "%" PRId64, q->options.timeout_s);
  const char* args[MAX_ARGS];
  bool flag_arg[MAX_ARGS] = {0};  // prefixed with --iree-flag=
  int n = 0;
  args[n++] = q->pcp_path;
  args[n++] = "compile";
  bool has_program = spec->program && spec->program[0];
  if (has_program) {
    args[n++] = "--program";
    args[n++] = spec->program;
    args[n++] = "--inner-steps";
    args[n++] = steps;
    args[n++] = "--delta-dtype";
    args[n++] = spec->delta_dtype ? spec->delta_dtype : "f32";
    if (spec->accumulation > 1) {
      args[n++] = "--accumulate";
      args[n++] = accumulate;
    }
    if (spec->inner_state_keep) {
      args[n++] = "--inner-state";
      args[n++] = "keep";
    }
  }
  args[n++] = "--backend";
  args[n++] = spec->backend;
  if (spec->target && spec->target[0]) {
    args[n++] = "--target";
    args[n++] = spec->target;
  }
  for (size_t i = 0; i < spec->iree_flag_count; ++i) {
    flag_arg[n] = true;
    args[n++] = spec->iree_flags[i];
  }
  if (q->options.timeout_s > 0) {
    args[n++] = "--timeout-s";
    args[n++] = timeout;
  }
  args[n++] = "--cache-dir";
  args[n++] = q->artifact_dir;
  args[n++] = "-o";
  args[n++] = e->vmfb_path;
  args[n++] = spec->mlir_path;
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    total += strlen(args[i]) + 1 + (flag_arg[i] ? sizeof("--iree-flag=") : 0);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_malloc(q->allocator, total, (void**)&e->strings));
  char* p = e->strings;
  for (int i = 0; i < n; ++i) {
    int w = sprintf(p, "%s%s", flag_arg[i] ? "--iree-flag=" : "", args[i]);
    e->argv[i] = p;
    p += w + 1;
  }
  e->argc = n;
  e->argv[n] = NULL;
  return pcp_ok_status();
}

static void entry_free(pcp_workloads_compile_queue_t* q, entry_t* e) {
  pcp_status_ignore(e->status);
  pthread_cond_destroy(&e->done_cv);
  pcp_allocator_free(q->allocator, e->strings);
  pcp_allocator_free(q->allocator, e);
}

// With |mu|: drops one reference.
static void entry_unref(pcp_workloads_compile_queue_t* q, entry_t* e) {
  if (--e->references == 0) {
    entry_free(q, e);
  }
}

// With |mu|: takes |e| out of the in-flight list.
static void entry_unlink(pcp_workloads_compile_queue_t* q, entry_t* e) {
  for (entry_t** p = &q->entries; *p; p = &(*p)->next) {
    if (*p == e) {
      *p = e->next;
      e->next = NULL;
      --q->in_flight;
      return;
    }
  }
}

// With |mu|: runs |r|'s notification, at most once.
static void request_notify(struct pcp_workloads_compile_request_t* r) {
  void (*notify)(void*) = r->notify;
  r->notify = NULL;
  r->notify_next = NULL;
  if (notify) {
    notify(r->notify_user_data);
  }
}

// With |mu|: |e| is done with |status| (taken); wakes its waiters.
static void entry_finish(pcp_workloads_compile_queue_t* q, entry_t* e,
                         pcp_status_t status) {
  entry_unlink(q, e);
  e->state = ENTRY_DONE;
  e->status = status;
  pthread_cond_broadcast(&e->done_cv);
  struct pcp_workloads_compile_request_t* r = e->notify_head;
  e->notify_head = NULL;
  while (r) {
    struct pcp_workloads_compile_request_t* next = r->notify_next;
    request_notify(r);
    r = next;
  }
}

// With |mu|: nobody waits for |e| any more; a queued compile is dropped, a
// running child killed (it is not reaped yet: |pid| is still ours).
static void entry_abandon(pcp_workloads_compile_queue_t* q, entry_t* e) {
  if (e->state == ENTRY_QUEUED) {
    --q->stats.queued;
    entry_finish(q, e,
                 pcp_make_status(PCP_STATUS_CANCELLED, "compile cancelled"));
  } else if (e->state == ENTRY_RUNNING && e->pid > 0 && !e->killed) {
    kill(e->pid, SIGKILL);
    e->killed = true;
    ++q->stats.children_killed;
  }
}

//===----------------------------------------------------------------------===//
// Slot threads
//===----------------------------------------------------------------------===//

// Without |mu|: starts the child of |e|, its output in the log file.
static pcp_status_t child_start(pcp_workloads_compile_queue_t* q, entry_t* e,
                                pid_t* out_pid) {
  int fd = open(e->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return pcp_status_from_errno(errno, "open %s", e->log_path);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fd, STDERR_FILENO);
  int rc = posix_spawn(out_pid, q->pcp_path, &actions, NULL, e->argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fd);
  if (rc != 0) {
    return pcp_status_from_errno(rc, "starting %s compile", q->pcp_path);
  }
  return pcp_ok_status();
}

// The end of a failed child's log (the compiler's diagnostics come last),
// for the status message; "" when unreadable.
#define LOG_TAIL_BYTES 1024
static void log_tail_read(const char* path, char* buffer, size_t capacity) {
  buffer[0] = 0;
  FILE* f = fopen(path, "rb");
  if (!f) {
    return;
  }
  if (fseek(f, 0, SEEK_END) == 0) {
    long size = ftell(f);
    long start = size > (long)capacity - 1 ? size - (long)capacity + 1 : 0;
    if (size >= 0 && fseek(f, start, SEEK_SET) == 0) {
      size_t n = fread(buffer, 1, capacity - 1, f);
      buffer[n] = 0;
      // One line: job errors are stored and shown as one line (the store
      // refuses control bytes).
      for (size_t i = 0; i < n; ++i) {
        unsigned char c = (unsigned char)buffer[i];
        if (c < 0x20 || c == 0x7f) {
          buffer[i] = ' ';
        }
      }
    }
  }
  fclose(f);
}

static pcp_status_t exit_status(entry_t* e, int wait_status,
                                const char* log_tail) {
  if (e->killed) {
    return pcp_make_status(PCP_STATUS_CANCELLED, "compile cancelled");
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) {
    return pcp_ok_status();
  }
  return pcp_make_status(
      WIFEXITED(wait_status) ? PCP_STATUS_INVALID_ARGUMENT
                             : PCP_STATUS_INTERNAL,
      "pcp compile --program %s for %s/%s failed (%s %d); see %s%s%s",
      e->program[0] ? e->program : "-", e->backend, e->target,
      WIFEXITED(wait_status) ? "exit" : "signal",
      WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : WTERMSIG(wait_status),
      e->log_path, log_tail[0] ? ": " : "", log_tail);
}

static void* slot_main(void* opaque) {
  pcp_workloads_compile_queue_t* q = opaque;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    entry_t* e = NULL;
    for (entry_t* it = q->entries; it && !e; it = it->next) {
      if (it->state == ENTRY_QUEUED) {
        e = it;
      }
    }
    if (!e) {
      if (q->stopping) {
        break;
      }
      pthread_cond_wait(&q->work_cv, &q->mu);
      continue;
    }
    e->state = ENTRY_RUNNING;
    ++e->references;
    --q->stats.queued;
    ++q->stats.running;
    if (q->stats.running > q->stats.running_peak) {
      q->stats.running_peak = q->stats.running;
    }
    pthread_mutex_unlock(&q->mu);

    PCP_LOG(PCP_LOG_INFO, &q->log,
            "compiling label=%s program=%s backend=%s target=%s key=%.12s",
            e->label[0] ? e->label : "-", e->program[0] ? e->program : "module",
            e->backend, e->target[0] ? e->target : "default", e->key);
    int64_t start_ns = pcp_clock_now_ns(q->options.clock);
    pid_t pid = 0;
    char log_tail[LOG_TAIL_BYTES];
    log_tail[0] = 0;
    pcp_status_t status = child_start(q, e, &pid);
    int wait_status = 0;
    if (!status) {
      pthread_mutex_lock(&q->mu);
      ++q->stats.children_started;
      e->pid = pid;
      // Cancelled while starting: nobody will signal it otherwise.
      if (e->live_waiters == 0 || q->stopping) {
        entry_abandon(q, e);
      }
      pthread_mutex_unlock(&q->mu);
      // Wait for the exit without reaping it: the pid stays ours (a
      // zombie) until |mu| is held below, so a kill under |mu| never
      // reaches another process.
      siginfo_t info;
      memset(&info, 0, sizeof(info));
      while (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) < 0 &&
             errno == EINTR) {
      }
      // The log is complete now (the child has exited).
      if (info.si_code != CLD_EXITED || info.si_status != 0) {
        log_tail_read(e->log_path, log_tail, sizeof(log_tail));
      }
    }
    pthread_mutex_lock(&q->mu);
    if (pid > 0) {
      e->pid = 0;
      while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
      status = exit_status(e, wait_status, log_tail);
    }
    q->stats.last_compile_ns = pcp_clock_now_ns(q->options.clock) - start_ns;
    --q->stats.running;
    if (!status) {
      PCP_LOG(PCP_LOG_INFO, &q->log,
              "program compiled label=%s key=%.12s seconds=%.1f",
              e->label[0] ? e->label : "-", e->key,
              (double)q->stats.last_compile_ns / 1e9);
    }
    entry_finish(q, e, status);
    entry_unref(q, e);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

//===----------------------------------------------------------------------===//
// The queue
//===----------------------------------------------------------------------===//

pcp_status_t pcp_workloads_compile_queue_create(
    const pcp_workloads_compile_queue_options_t* options,
    pcp_allocator_t allocator, pcp_workloads_compile_queue_t** out_queue) {
  *out_queue = NULL;
  if (!options->pcp_path || !options->pcp_path[0] || !options->artifact_dir ||
      !options->artifact_dir[0] || strlen(options->pcp_path) >= PATH_CAPACITY ||
      strlen(options->artifact_dir) >= PATH_CAPACITY - 100 ||
      options->slot_count > PCP_WORKLOADS_COMPILE_MAX_SLOTS ||
      options->timeout_s < 0) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "compile queue: pcp_path, artifact_dir and at most "
                           "%d slots",
                           PCP_WORKLOADS_COMPILE_MAX_SLOTS);
  }
  PCP_RETURN_IF_ERROR(pcp_file_make_directories(options->artifact_dir),
                      "artifact directory");
  pcp_workloads_compile_queue_t* q = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(allocator, sizeof(*q), (void**)&q));
  q->allocator = allocator;
  q->options = *options;
  if (!q->options.clock.now_ns) {
    q->options.clock = pcp_clock_system();
  }
  if (q->options.slot_count == 0) {
    q->options.slot_count = 2;
  }
  if (q->options.max_pending == 0) {
    q->options.max_pending = 256;
  }
  snprintf(q->pcp_path, sizeof(q->pcp_path), "%s", options->pcp_path);
  snprintf(q->artifact_dir, sizeof(q->artifact_dir), "%s",
           options->artifact_dir);
  if (options->compiler_version) {
    snprintf(q->compiler_version, sizeof(q->compiler_version), "%s",
             options->compiler_version);
    q->version_known = true;
  }
  q->options.pcp_path = q->pcp_path;
  q->options.artifact_dir = q->artifact_dir;
  q->options.compiler_version = NULL;
  q->log = options->log;
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->work_cv, NULL);
  q->references = 1;
  for (uint32_t i = 0; i < q->options.slot_count; ++i) {
    if (pthread_create(&q->threads[i], NULL, slot_main, q) != 0) {
      pcp_workloads_compile_queue_destroy(q);
      return pcp_make_status(PCP_STATUS_UNAVAILABLE, "compile slot thread");
    }
    ++q->thread_count;
  }
  *out_queue = q;
  return pcp_ok_status();
}

static void queue_unref(pcp_workloads_compile_queue_t* q) {
  pthread_mutex_lock(&q->mu);
  bool last = --q->references == 0;
  pthread_mutex_unlock(&q->mu);
  if (last) {
    pthread_cond_destroy(&q->work_cv);
    pthread_mutex_destroy(&q->mu);
    pcp_allocator_free(q->allocator, q);
  }
}

void pcp_workloads_compile_queue_shutdown(pcp_workloads_compile_queue_t* q) {
  if (!q) {
    return;
  }
  pthread_mutex_lock(&q->mu);
  q->stopping = true;
  // Every waiter is woken (CANCELLED); running children are killed.
  entry_t* next = NULL;
  for (entry_t* e = q->entries; e; e = next) {
    next = e->next;
    e->live_waiters = 0;
    entry_abandon(q, e);
  }
  pthread_cond_broadcast(&q->work_cv);
  uint32_t count = q->thread_count;
  q->thread_count = 0;  // joined once, by this caller
  pthread_mutex_unlock(&q->mu);
  for (uint32_t i = 0; i < count; ++i) {
    pthread_join(q->threads[i], NULL);
  }
}

void pcp_workloads_compile_queue_destroy(pcp_workloads_compile_queue_t* q) {
  if (!q) {
    return;
  }
  pcp_workloads_compile_queue_shutdown(q);
  queue_unref(q);
}

// With |mu| not held: the compiler version, probed once.
static pcp_status_t version_get(pcp_workloads_compile_queue_t* q, char* buffer,
                                size_t capacity) {
  pthread_mutex_lock(&q->mu);
  bool known = q->version_known;
  if (known) {
    snprintf(buffer, capacity, "%s", q->compiler_version);
  }
  pthread_mutex_unlock(&q->mu);
  if (known) {
    return pcp_ok_status();
  }
  char version[256];
  PCP_RETURN_IF_ERROR(pcp_compile_compiler_version(version, sizeof(version)),
                      "compiler version for the artifact key");
  pthread_mutex_lock(&q->mu);
  snprintf(q->compiler_version, sizeof(q->compiler_version), "%s", version);
  q->version_known = true;
  pthread_mutex_unlock(&q->mu);
  snprintf(buffer, capacity, "%s", version);
  return pcp_ok_status();
}

pcp_status_t pcp_workloads_compile_queue_submit(
    pcp_workloads_compile_queue_t* q, const pcp_workloads_compile_spec_t* spec,
    pcp_workloads_compile_request_t** out_request) {
  *out_request = NULL;
  char version[256];
  PCP_RETURN_IF_ERROR_BARE(version_get(q, version, sizeof(version)));
  pcp_workloads_compile_request_t* r = NULL;
  PCP_RETURN_IF_ERROR_BARE(
      pcp_allocator_calloc(q->allocator, sizeof(*r), (void**)&r));
  r->queue = q;
  pcp_status_t status =
      pcp_workloads_compile_key_compute(spec, version, r->key);
  if (status) {
    pcp_allocator_free(q->allocator, r);
    return status;
  }
  snprintf(r->vmfb_path, sizeof(r->vmfb_path),
           "%.1100s/" PCP_WORKLOADS_COMPILE_ARTIFACT_PREFIX "%.32s.vmfb",
           q->artifact_dir, r->key);
  snprintf(r->log_path, sizeof(r->log_path), "%.1100s/compile-%.12s.log",
           spec->log_dir ? spec->log_dir : q->artifact_dir, r->key);

  pthread_mutex_lock(&q->mu);
  entry_t* e = NULL;
  if (q->stopping) {
    status = pcp_make_status(PCP_STATUS_CANCELLED, "compile queue stopping");
  }
  for (entry_t* it = q->entries; !status && it && !e; it = it->next) {
    // A killed child (every waiter cancelled) is not joined: it ends
    // "compile cancelled"; this request gets a child of its own.
    if (!it->killed && strcmp(it->key, r->key) == 0) {
      e = it;
    }
  }
  if (!status && e) {
    // Same program in flight: one child, one more waiter. Its log is the
    // first submitter's.
    ++e->references;
    ++e->live_waiters;
    ++q->stats.joined;
    r->entry = e;
    snprintf(r->log_path, sizeof(r->log_path), "%s", e->log_path);
  } else if (!status && pcp_file_exists(r->vmfb_path)) {
    // Written by an earlier compile (renamed into place, so complete).
    r->cache_hit = true;
    ++q->stats.cache_hits;
  } else if (!status && q->in_flight >= q->options.max_pending) {
    status = pcp_make_status(PCP_STATUS_RESOURCE_EXHAUSTED,
                             "%u compiles in flight (the queue's limit)",
                             q->in_flight);
  } else if (!status) {
    status = pcp_allocator_calloc(q->allocator, sizeof(*e), (void**)&e);
    if (!status) {
      memcpy(e->key, r->key, sizeof(e->key));
      snprintf(e->vmfb_path, sizeof(e->vmfb_path), "%s", r->vmfb_path);
      snprintf(e->log_path, sizeof(e->log_path), "%s", r->log_path);
      snprintf(e->label, sizeof(e->label), "%s",
               spec->label ? spec->label : "");
      snprintf(e->program, sizeof(e->program), "%s",
               spec->program ? spec->program : "");
      snprintf(e->backend, sizeof(e->backend), "%s", spec->backend);
      snprintf(e->target, sizeof(e->target), "%s",
               spec->target ? spec->target : "");
      status = entry_argv_build(q, spec, e);
      if (status) {
        pcp_allocator_free(q->allocator, e);
        e = NULL;
      }
    }
    if (!status) {
      pthread_cond_init(&e->done_cv, NULL);
      e->references = 1;
      e->live_waiters = 1;
      e->state = ENTRY_QUEUED;
      entry_t** tail = &q->entries;
      while (*tail) {
        tail = &(*tail)->next;
      }
      *tail = e;
      ++q->in_flight;
      ++q->stats.queued;
      r->entry = e;
      pthread_cond_signal(&q->work_cv);
    }
  }
  if (!status) {
    ++q->references;
  }
  pthread_mutex_unlock(&q->mu);
  if (status) {
    pcp_allocator_free(q->allocator, r);
    return status;
  }
  *out_request = r;
  return pcp_ok_status();
}

// With |mu|: finished (done or cancelled).
static bool request_finished(const pcp_workloads_compile_request_t* r) {
  return !r->entry || r->cancelled || r->entry->state == ENTRY_DONE;
}

// With |mu|: the answer of a finished request.
static pcp_status_t request_answer(const pcp_workloads_compile_request_t* r) {
  if (!r->entry) {
    return pcp_ok_status();
  }
  if (r->cancelled && r->entry->state != ENTRY_DONE) {
    return pcp_make_status(PCP_STATUS_CANCELLED, "compile cancelled");
  }
  return pcp_status_clone(r->entry->status);
}

pcp_status_t pcp_workloads_compile_request_wait(
    pcp_workloads_compile_request_t* r) {
  pcp_workloads_compile_queue_t* q = r->queue;
  pthread_mutex_lock(&q->mu);
  while (!request_finished(r)) {
    pthread_cond_wait(&r->entry->done_cv, &q->mu);
  }
  pcp_status_t status = request_answer(r);
  pthread_mutex_unlock(&q->mu);
  return status;
}

bool pcp_workloads_compile_request_wait_for(pcp_workloads_compile_request_t* r,
                                            int64_t timeout_ms) {
  pcp_workloads_compile_queue_t* q = r->queue;
  struct timespec until = pcp_realtime_deadline_ms(timeout_ms);
  pthread_mutex_lock(&q->mu);
  while (!request_finished(r)) {
    if (pthread_cond_timedwait(&r->entry->done_cv, &q->mu, &until) ==
        ETIMEDOUT) {
      break;
    }
  }
  bool finished = request_finished(r);
  pthread_mutex_unlock(&q->mu);
  return finished;
}

void pcp_workloads_compile_request_notify(pcp_workloads_compile_request_t* r,
                                          void (*notify)(void* user_data),
                                          void* user_data) {
  pcp_workloads_compile_queue_t* q = r->queue;
  pthread_mutex_lock(&q->mu);
  r->notify = notify;
  r->notify_user_data = user_data;
  if (request_finished(r)) {
    request_notify(r);
  } else {
    r->notify_next = r->entry->notify_head;
    r->entry->notify_head = r;
  }
  pthread_mutex_unlock(&q->mu);
}

void pcp_workloads_compile_request_cancel(pcp_workloads_compile_request_t* r) {
  pcp_workloads_compile_queue_t* q = r->queue;
  pthread_mutex_lock(&q->mu);
  entry_t* e = r->entry;
  if (e && !r->cancelled && e->state != ENTRY_DONE) {
    r->cancelled = true;
    // Wakes this waiter (and, harmlessly, the others sharing |e|).
    pthread_cond_broadcast(&e->done_cv);
    for (pcp_workloads_compile_request_t** link = &e->notify_head; *link;
         link = &(*link)->notify_next) {
      if (*link == r) {
        *link = r->notify_next;
        break;
      }
    }
    request_notify(r);
    if (e->live_waiters > 0 && --e->live_waiters == 0) {
      entry_abandon(q, e);
    }
  }
  pthread_mutex_unlock(&q->mu);
}

const char* pcp_workloads_compile_request_vmfb_path(
    const pcp_workloads_compile_request_t* r) {
  return r->vmfb_path;
}

const char* pcp_workloads_compile_request_log_path(
    const pcp_workloads_compile_request_t* r) {
  return r->log_path;
}

const char* pcp_workloads_compile_request_key(
    const pcp_workloads_compile_request_t* r) {
  return r->key;
}

bool pcp_workloads_compile_request_cache_hit(
    const pcp_workloads_compile_request_t* r) {
  return r->cache_hit;
}

void pcp_workloads_compile_request_release(pcp_workloads_compile_request_t* r) {
  if (!r) {
    return;
  }
  pcp_workloads_compile_request_cancel(r);
  pcp_workloads_compile_queue_t* q = r->queue;
  pthread_mutex_lock(&q->mu);
  if (r->entry) {
    entry_unref(q, r->entry);
  }
  pthread_mutex_unlock(&q->mu);
  pcp_allocator_free(q->allocator, r);
  queue_unref(q);
}

void pcp_workloads_compile_queue_stats(
    pcp_workloads_compile_queue_t* q,
    pcp_workloads_compile_queue_stats_t* out_stats) {
  pthread_mutex_lock(&q->mu);
  *out_stats = q->stats;
  pthread_mutex_unlock(&q->mu);
}
