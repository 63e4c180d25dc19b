// SPDX-License-Identifier: Apache-2.0
// bench/time_to_loss: wall-clock time to validation loss 2.0 on
// tiny_shakespeare, PCP (a gateway and two CPU workers, DiLoCo, the
// quickstart's model and schedule) against an independent single-process
// JAX loop of the same model, batch and schedule on the same cores, in one
// run. The orchestration (processes, HTTP, the JAX loop) is Python:
// bench/time_to_loss.py, which this binary runs with the project's venv
// and the pcp binary, passing its own arguments on (--goal, --eval-every,
// --experiment, --budget-s).
//
// Last line: `time_to_loss ratio=<x>`, x = jax seconds / pcp seconds.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char** argv) {
  enum { kMaxArgs = 32 };
  if (argc > kMaxArgs - 4) {
    fprintf(stderr, "time_to_loss: at most %d arguments\n", kMaxArgs - 4);
    return 2;
  }
  char* args[kMaxArgs];
  int n = 0;
  args[n++] = (char*)PCP_VENV_PYTHON;
  args[n++] = (char*)PCP_SOURCE_DIR "/bench/time_to_loss.py";
  args[n++] = (char*)PCP_BINARY_PATH;
  for (int i = 1; i < argc; ++i) {
    args[n++] = argv[i];
  }
  args[n] = NULL;
  execv(args[0], args);
  perror("time_to_loss: running " PCP_VENV_PYTHON);
  return 1;
}
