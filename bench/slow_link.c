// SPDX-License-Identifier: Apache-2.0
// bench/slow_link: wall-clock to a target training loss of ddp against
// decoupled DiLoCo (int4 deltas) on the same model, with 4 CPU workers each
// behind its own 100 Mbit/s link (tools/cluster: network namespaces, veth
// pairs, tc tbf; needs root, and fails with a clear message where network
// namespaces are not available). The orchestration is Python
// (bench/slow_link.py), which this binary runs with the project's venv and
// the pcp binary, passing its own arguments on (--quick, --target, --steps,
// --rate, --budget-s).
//
// Last line (the Python's): `slow_link ratio=<x>`, x = ddp's seconds to the
// target / decoupled's (higher is better).

#include <stdio.h>
#include <unistd.h>

int main(int argc, char** argv) {
  enum { kMaxArgs = 32 };
  if (argc > kMaxArgs - 4) {
    fprintf(stderr, "slow_link: at most %d arguments\n", kMaxArgs - 4);
    return 2;
  }
  char* args[kMaxArgs];
  int n = 0;
  args[n++] = (char*)PCP_VENV_PYTHON;
  args[n++] = (char*)PCP_SOURCE_DIR "/bench/slow_link.py";
  args[n++] = (char*)PCP_BINARY_PATH;
  for (int i = 1; i < argc; ++i) {
    args[n++] = argv[i];
  }
  args[n] = NULL;
  execv(args[0], args);
  perror("slow_link: running " PCP_VENV_PYTHON);
  return 1;
}
