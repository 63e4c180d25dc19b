// SPDX-License-Identifier: Apache-2.0
#include "base/base.h"
int main(void) { return 0; }
