// SPDX-License-Identifier: Apache-2.0
//
// Child processes (uv_spawn) with exit callbacks, for the node manager.

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "net/net_impl.h"

struct pcp_loop_process_t {
  pcp_net_object_t base;
  pcp_loop_t* loop;
  uv_process_t uv;
  uv_pipe_t pipes[2];  // [0] stdout, [1] stderr
  bool piped[2];
  bool pipe_done[2];  // EOF seen or pipe closed
  int open_handles;   // process handle + initialized pipes
  bool exited;
  int64_t exit_status;
  int term_signal;
  bool reported;  // exit_fn has run, or must never run (spawn failed)
  bool group;     // leads its own process group
  bool cancelled;
  pcp_loop_process_output_fn_t output_fn;
  pcp_loop_process_exit_fn_t exit_fn;
  void* user_data;
};

static void on_process_handle_closed(uv_handle_t* handle) {
  pcp_loop_process_t* process = (pcp_loop_process_t*)handle->data;
  if (--process->open_handles > 0) {
    return;
  }
  if (!process->reported) {
    process->reported = true;
    process->exit_fn(process->user_data, process, PCP_STATUS_CANCELLED, 0, 0);
  }
  pcp_net_free(process->loop, process);
}

static void close_all(pcp_loop_process_t* process) {
  for (int i = 0; i < 2; ++i) {
    uv_handle_t* pipe = (uv_handle_t*)&process->pipes[i];
    if (process->piped[i] && !uv_is_closing(pipe)) {
      uv_close(pipe, on_process_handle_closed);
    }
  }
  if (!uv_is_closing((uv_handle_t*)&process->uv)) {
    uv_close((uv_handle_t*)&process->uv, on_process_handle_closed);
  }
}

// The exit callback waits for the exit and for EOF on every pipe, so a
// supervisor always has the child's last lines before it learns the child
// is gone.
static void maybe_report_exit(pcp_loop_process_t* process) {
  if (process->reported || !process->exited) {
    return;
  }
  for (int i = 0; i < 2; ++i) {
    if (process->piped[i] && !process->pipe_done[i]) {
      return;
    }
  }
  process->reported = true;
  process->exit_fn(process->user_data, process, PCP_STATUS_OK,
                   process->exit_status, process->term_signal);
  close_all(process);
}

static void on_exit_cb(uv_process_t* handle, int64_t exit_status,
                       int term_signal) {
  pcp_loop_process_t* process = (pcp_loop_process_t*)handle->data;
  process->exited = true;
  process->exit_status = exit_status;
  process->term_signal = term_signal;
  maybe_report_exit(process);
}

static void on_pipe_read(uv_stream_t* stream, ssize_t nread,
                         const uv_buf_t* buffer) {
  pcp_loop_process_t* process = (pcp_loop_process_t*)stream->data;
  pcp_loop_t* loop = process->loop;
  int index = stream == (uv_stream_t*)&process->pipes[0] ? 0 : 1;
  if (nread > 0) {
    process->output_fn(process->user_data, process, index + 1, buffer->base,
                       (size_t)nread);
  }
  pcp_net_read_buffer_release(loop, buffer);
  if (nread < 0) {
    // EOF, or a read error (treated the same: the stream is over).
    process->pipe_done[index] = true;
    process->output_fn(process->user_data, process, index + 1, NULL, 0);
    uv_close((uv_handle_t*)stream, on_process_handle_closed);
    maybe_report_exit(process);
  }
}

static void abort_process(pcp_net_object_t* object) {
  pcp_loop_process_t* process = (pcp_loop_process_t*)object;
  if (process->reported) {
    return;
  }
  process->cancelled = true;
  close_all(process);
}

static char** drop_const_array(const char* const* array) {
  union {
    const char* const* in;
    char** out;
  } cast = {.in = array};
  return cast.out;
}

static void configure_stdio(pcp_loop_stdio_t mode, int fd, uv_pipe_t* pipe,
                            uv_stdio_container_t* out) {
  switch (mode) {
    case PCP_LOOP_STDIO_PIPE:
      out->flags = (uv_stdio_flags)(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
      out->data.stream = (uv_stream_t*)pipe;
      break;
    case PCP_LOOP_STDIO_IGNORE:
      out->flags = UV_IGNORE;
      break;
    case PCP_LOOP_STDIO_INHERIT:
    default:
      out->flags = UV_INHERIT_FD;
      out->data.fd = fd;
      break;
  }
}

pcp_status_t pcp_loop_process_spawn(pcp_loop_t* loop,
                                    const pcp_loop_process_options_t* options,
                                    pcp_loop_process_t** out_process) {
  *out_process = NULL;
  if (!options->file || !options->args || !options->args[0] ||
      !options->exit_fn) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "spawn needs file, args (with args[0]) and exit_fn");
  }
  bool piped[2] = {options->stdout_mode == PCP_LOOP_STDIO_PIPE,
                   options->stderr_mode == PCP_LOOP_STDIO_PIPE};
  if ((piped[0] || piped[1]) && !options->output_fn) {
    return pcp_make_status(PCP_STATUS_INVALID_ARGUMENT,
                           "spawn of %s: PIPE needs output_fn", options->file);
  }
  PCP_RETURN_IF_ERROR_BARE(
      pcp_net_check_not_releasing(loop, "pcp_loop_process_spawn"));
  pcp_loop_process_t* process = NULL;
  PCP_RETURN_IF_ERROR(pcp_net_calloc(loop, sizeof(*process), (void**)&process),
                      "allocating a process");
  process->base.abort = abort_process;
  process->loop = loop;
  process->output_fn = options->output_fn;
  process->exit_fn = options->exit_fn;
  process->user_data = options->user_data;

  uv_stdio_container_t stdio[3];
  memset(stdio, 0, sizeof(stdio));
  stdio[0].flags = UV_IGNORE;
  for (int i = 0; i < 2; ++i) {
    if (piped[i]) {
      PCP_ASSERT(uv_pipe_init(&loop->uv, &process->pipes[i], 0) == 0);
      process->pipes[i].data = process;
      process->piped[i] = true;
      ++process->open_handles;
    }
  }
  configure_stdio(options->stdout_mode, 1, &process->pipes[0], &stdio[1]);
  configure_stdio(options->stderr_mode, 2, &process->pipes[1], &stdio[2]);

  uv_process_options_t uv_options;
  memset(&uv_options, 0, sizeof(uv_options));
  uv_options.exit_cb = on_exit_cb;
  uv_options.file = options->file;
  // libuv takes char** but only reads the arrays (they go to execvp in the
  // child before uv_spawn returns); the casts drop const, nothing writes.
  uv_options.args = drop_const_array(options->args);
  uv_options.env = drop_const_array(options->env);
  uv_options.cwd = options->cwd;
  uv_options.stdio_count = 3;
  uv_options.stdio = stdio;
  if (options->new_process_group) {
    // libuv's "detached" is setsid() in the child; the exit is still
    // watched while the loop runs.
    uv_options.flags |= UV_PROCESS_DETACHED;
    process->group = true;
  }
  process->uv.data = process;
  int err = uv_spawn(&loop->uv, &process->uv, &uv_options);
  ++process->open_handles;  // libuv initialized the process handle either way
  if (err != 0) {
    // Closing is asynchronous; the struct is freed by the last close
    // callback, and no exit callback runs (the contract for a failed
    // submit).
    process->reported = true;
    close_all(process);
    return pcp_net_status_from_uv(err, options->file);
  }
  for (int i = 0; i < 2; ++i) {
    if (!piped[i]) {
      continue;
    }
    err = uv_read_start((uv_stream_t*)&process->pipes[i],
                        pcp_net_read_buffer_alloc, on_pipe_read);
    if (err != 0) {
      // Treat an unreadable pipe as ended; the exit is still reported.
      process->pipe_done[i] = true;
      uv_close((uv_handle_t*)&process->pipes[i], on_process_handle_closed);
    }
  }
  *out_process = process;
  return pcp_ok_status();
}

int64_t pcp_loop_process_pid(pcp_loop_process_t* process) {
  return (int64_t)process->uv.pid;
}

pcp_status_t pcp_loop_process_kill(pcp_loop_process_t* process, int signum) {
  if (process->reported || (process->exited && !process->group)) {
    return pcp_make_status(PCP_STATUS_FAILED_PRECONDITION,
                           "process %d has already exited", process->uv.pid);
  }
  int err = process->group ? uv_kill(-process->uv.pid, signum)
                           : uv_process_kill(&process->uv, signum);
  if (err != 0) {
    char what[64];
    snprintf(what, sizeof(what), "kill %s%d", process->group ? "group " : "",
             process->uv.pid);
    return pcp_net_status_from_uv(err, what);
  }
  return pcp_ok_status();
}
