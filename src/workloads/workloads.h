// SPDX-License-Identifier: Apache-2.0
//
// workloads: the pieces of PCP's workloads that are plain host code, below
// the programs that run on workers. Parts, each under its own banner:
// DiLoCo / streaming DiLoCo (train/diloco.h: config, outer step, streaming
// schedule, checkpoints, wire accounting).

#ifndef PCP_WORKLOADS_WORKLOADS_H_
#define PCP_WORKLOADS_WORKLOADS_H_

#include "base/base.h"

//===--- DiLoCo / streaming DiLoCo (src/workloads/train/) ---===//
// Config, outer step, streaming schedule, checkpoints, wire accounting.
#include "workloads/train/diloco.h"  // IWYU pragma: export

#endif  // PCP_WORKLOADS_WORKLOADS_H_
