// SPDX-License-Identifier: Apache-2.0
// Children of a supervisor end with it, even when it is SIGKILLed: the
// runner passes its pid in PCP_SUPERVISOR_PID, and the child, first thing
// in main, asks the kernel for SIGTERM when its parent dies
// (PR_SET_PDEATHSIG). Done in the child because uv_spawn offers no hook
// between fork and exec.

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "roles/nodemgr/supervision_impl.h"

pcp_status_t pcp_roles_supervisor_death_watch(void) {
  const char* value = getenv(PCP_ROLES_SUPERVISOR_PID_ENV);
  if (!value) {
    return pcp_ok_status();
  }
  int64_t supervisor_pid = 0;
  bool parsed = pcp_string_view_parse_int64(pcp_make_cstring_view(value),
                                            &supervisor_pid) &&
                supervisor_pid > 1;
  // Our own children (compilers, a nested supervisor) must not inherit it:
  // their parent is us.
  unsetenv(PCP_ROLES_SUPERVISOR_PID_ENV);
  if (!parsed) {
    return pcp_ok_status();
  }
  if (getppid() != (pid_t)supervisor_pid) {
    // A wrapper between us (a script that did not exec): watching our real
    // parent would be wrong, so do nothing, unless the supervisor is
    // already gone.
    if (kill((pid_t)supervisor_pid, 0) != 0 && errno == ESRCH) {
      return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                             "supervisor %lld exited before this process "
                             "started",
                             (long long)supervisor_pid);
    }
    return pcp_ok_status();
  }
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
    return pcp_status_from_errno(errno, "prctl(PR_SET_PDEATHSIG)");
  }
  // The supervisor may have died between fork and the prctl above; then
  // no signal will come, and we are an orphan already.
  if (getppid() != (pid_t)supervisor_pid) {
    return pcp_make_status(PCP_STATUS_UNAVAILABLE,
                           "supervisor %lld exited while this process "
                           "started",
                           (long long)supervisor_pid);
  }
  return pcp_ok_status();
}
