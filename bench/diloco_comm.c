// SPDX-License-Identifier: Apache-2.0
// bench/diloco_comm: bytes on the wire per worker of DDP, classic DiLoCo,
// streaming DiLoCo and decoupled DiLoCo with int4 deltas, measured on real
// training jobs (a `pcp --gateway` and 4 `pcp --worker` on loopback, the
// same model and tokens per worker), from the fabric's own per-worker byte
// counters and the jobs' sync payload counters, with the loss of each final
// model on held-out text (scored by the JAX reference). The orchestration is
// Python (bench/diloco_comm.py), which this binary runs with the project's
// venv and the pcp binary, passing its own arguments on (--quick, --steps,
// --tau, --modes, --workers, --budget-s, --experiment-json,
// --decoupled-json, --eval-windows).
//
// Last line (the Python's): `diloco_comm ratio=<x>`, x = ddp's bytes per
// worker per token / decoupled+int4's (programs excluded); goal x >= 500
// at tau 100 with decoupled's held-out loss within 2% of ddp's.

#include <stdio.h>
#include <unistd.h>

int main(int argc, char** argv) {
  enum { kMaxArgs = 32 };
  if (argc > kMaxArgs - 4) {
    fprintf(stderr, "diloco_comm: at most %d arguments\n", kMaxArgs - 4);
    return 2;
  }
  char* args[kMaxArgs];
  int n = 0;
  args[n++] = (char*)PCP_VENV_PYTHON;
  args[n++] = (char*)PCP_SOURCE_DIR "/bench/diloco_comm.py";
  args[n++] = (char*)PCP_BINARY_PATH;
  for (int i = 1; i < argc; ++i) {
    args[n++] = argv[i];
  }
  args[n] = NULL;
  execv(args[0], args);
  perror("diloco_comm: running " PCP_VENV_PYTHON);
  return 1;
}
