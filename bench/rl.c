// SPDX-License-Identifier: Apache-2.0
// bench/rl: rollout tokens per second of a GRPO job (POST /v1/rl/jobs on a
// gateway with two CPU workers) against the inference engine's aggregate
// decode rate on the same model and workers, and the job's weight-refresh
// time against its bytes over the loopback bandwidth measured in the same
// run (issue 16, Benchmark). The orchestration (processes, HTTP, the
// loopback transfer) is Python: bench/rl.py, which this binary runs with the
// project's venv and the pcp binary, passing its own arguments on
// (--iterations, --budget-s, --keep).
//
// Last line: `rl ratio=<x>`, x = rollout tokens/s / decode tokens/s (goal
// >= 0.8).

#include <stdio.h>
#include <unistd.h>

int main(int argc, char** argv) {
  enum { kMaxArgs = 32 };
  if (argc > kMaxArgs - 4) {
    fprintf(stderr, "rl: at most %d arguments\n", kMaxArgs - 4);
    return 2;
  }
  char* args[kMaxArgs];
  int n = 0;
  args[n++] = (char*)PCP_VENV_PYTHON;
  args[n++] = (char*)PCP_SOURCE_DIR "/bench/rl.py";
  args[n++] = (char*)PCP_BINARY_PATH;
  for (int i = 1; i < argc; ++i) {
    args[n++] = argv[i];
  }
  args[n] = NULL;
  execv(args[0], args);
  perror("rl: running " PCP_VENV_PYTHON);
  return 1;
}
