// SPDX-License-Identifier: Apache-2.0
//
// roles: the long-running processes of `pcp`, selected by upstream's mode
// flags: `--gateway` (the default), `--federation-hub`, `--worker` (also
// implied by `--connect host:port`), `--node-manager`, and
// `--supervise -- <child args>` (checked first, so it wins over any mode
// flag). Each role has one config table (src/config) holding exactly the
// upstream flags that role uses; the gateway also loads its JSON config
// (--gateway-config) through one table per JSON object.
//
// Differences from upstream, on purpose (docs/decisions.md, "roles"):
// unknown flags, values that do not parse and legacy standalone-mode flags
// are errors (exit 2, one line plus "Try 'pcp --<role> --help'."), where
// upstream ignored them or fell back silently; `--dump-config` prints the
// effective config and exits 0.
//
// This module is mostly wiring: the roles' work lives in the modules below
// it. Each role logs one `msg="started"` line with its key settings and
// exits 0 after SIGTERM or SIGINT. The worker (src/roles/worker) runs the
// fabric runtime: a loop thread owning the gateway connection, a compute
// thread owning the IREE backend (docs/decisions.md, "worker").
//
// Thread-safety: pcp_roles_main is called once, from main(). The worker id
// functions are thread-safe when |getenv_fn| is.

#ifndef PCP_ROLES_ROLES_H_
#define PCP_ROLES_ROLES_H_

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

//===----------------------------------------------------------------------===//
// Entry point
//===----------------------------------------------------------------------===//

// Runs the role chosen by |argv| (the process arguments without the program
// name; argv[0] is the first flag). Returns the process exit code: 0 after
// a clean stop, --help or --dump-config; 2 for a usage or config error; 1
// when the role failed at run time.
int pcp_roles_main(int argc, char** argv);

// `pcp submit train EXP.json [--gateway URL] [--no-follow] ...`: posts a
// DiLoCo experiment to POST /v1/training/jobs and follows the job with a
// progress bar and a loss readout (src/roles/submit.c); `pcp submit rl
// EXP.json` posts a GRPO experiment to POST /v1/rl/jobs and follows it with
// iteration, reward, KL, clip fraction and tokens/s. Exit code 0 when the
// job succeeded (or was submitted, with --no-follow), 1 when it failed, was
// cancelled, the follow timed out or the gateway refused it, 2 for usage,
// 130 after Ctrl-C (the job is not cancelled).
int pcp_roles_submit_cli_main(int argc, char** argv);

// `pcp chat [flags] [PROMPT...]`: a terminal client for an OpenAI-compatible
// chat service (src/roles/chat.c; docs/api.md, "pcp chat"). With a prompt it
// streams one reply to stdout; without one it runs a multi-turn session on
// stdin. Exit code 0 when done, 1 for a server or network error (the
// server's message on stderr), 2 for usage, 130 after Ctrl-C (one-shot, or
// at the interactive prompt).
int pcp_roles_chat_cli_main(int argc, char** argv);

//===----------------------------------------------------------------------===//
// Role selection
//===----------------------------------------------------------------------===//

typedef enum pcp_roles_role_e {
  PCP_ROLES_ROLE_GATEWAY = 0,
  PCP_ROLES_ROLE_FEDERATION_HUB = 1,
  PCP_ROLES_ROLE_WORKER = 2,
  PCP_ROLES_ROLE_NODE_MANAGER = 3,
  PCP_ROLES_ROLE_SUPERVISE = 4,
} pcp_roles_role_t;

// "gateway", "federation-hub", "worker", "node-manager", "supervise": the
// mode flag without dashes, also the `role=` field of log lines.
const char* pcp_roles_role_name(pcp_roles_role_t role);

// Picks the role from |argv| (flags before a bare `--`): --supervise first,
// then the one mode flag given, then --connect (worker), else the gateway.
// Two different mode flags are INVALID_ARGUMENT naming both.
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_role_select(int argc, char* const* argv, pcp_roles_role_t* out_role);

// Returns INVALID_ARGUMENT with a hint when |argv| (before a bare `--`)
// holds a flag of upstream's removed standalone modes (--shepherd,
// --inference, --config, --inference-config, --model, --resume, --rl,
// --no-dashboard, --terminate, --streaming).
PCP_MUST_USE_RESULT pcp_status_t
pcp_roles_legacy_flags_check(int argc, char* const* argv);

//===----------------------------------------------------------------------===//
// Stable worker id (upstream s.1.4)
//===----------------------------------------------------------------------===//

// Reads one environment variable; NULL when unset. Lets tests run without
// touching the process environment.
typedef const char* (*pcp_roles_getenv_fn_t)(void* user_data, const char* name);

// getenv(3) as a pcp_roles_getenv_fn_t (|user_data| unused).
const char* pcp_roles_getenv_process(void* user_data, const char* name);

// Appends one id component to |builder|: blanks (" \t\r\n") trimmed from
// both ends, an empty result becomes "unknown", and every byte outside
// [A-Za-z0-9-_.] becomes '-'.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_id_append_sanitized(
    pcp_string_builder_t* builder, pcp_string_view_t value);

// Returns the |device_id|-th entry of the visible-devices variable for
// |backend| ("cuda": CUDA_VISIBLE_DEVICES; "rocm": the first set of
// HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, GPU_DEVICE_ORDINAL), counting
// comma-separated entries after trimming and skipping empty ones and "-1".
// Returns false (and an empty view) when there is no such entry.
bool pcp_roles_worker_id_visible_device(const char* backend, int64_t device_id,
                                        pcp_roles_getenv_fn_t getenv_fn,
                                        void* user_data,
                                        pcp_string_view_t* out_token);

// Builds the worker id: PCP_WORKER_ID sanitized when set, otherwise
// "{site}-{namespace}-{node}-{pod}-{backend}-{arch}-device-{dev}" from
// PCP_SITE_ID ("local"), POD_NAMESPACE ("default"), NODE_NAME
// ("unknown-node"), POD_NAME ("unknown-pod"), |target_arch| ("default" when
// NULL) and the visible-device entry (else the decimal |device_id|), each
// component sanitized. |out_id| is heap-allocated; free() it.
// RESOURCE_EXHAUSTED when the id would exceed 4 KiB.
PCP_MUST_USE_RESULT pcp_status_t pcp_roles_worker_id_build(
    const char* backend, const char* target_arch, int64_t device_id,
    pcp_roles_getenv_fn_t getenv_fn, void* user_data, char** out_id);

#ifdef __cplusplus
}
#endif

#endif  // PCP_ROLES_ROLES_H_
