# SPDX-License-Identifier: Apache-2.0
"""`promtool check metrics` as the integration tests run it.

promtool's lint says "metric names should not contain ':'" for every
vllm:* family: the inference set keeps vLLM's names by default so vLLM
Grafana boards read it unchanged (docs/decisions.md), and vLLM's own
/metrics draws the same finding. That one finding, on vllm:* names only,
is accepted; any other lint finding or a parse error is a failure.
"""
import re
import subprocess

_COLON = re.compile(r"^vllm:[a-z0-9_]+ metric names should not contain ':'$")


def problems(promtool, text):
    """None when promtool accepts |text| (str or bytes); else its output."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    p = subprocess.run([promtool, "check", "metrics"], input=text,
                       capture_output=True, text=True, timeout=60)
    if p.returncode == 0:
        return None
    lines = (p.stdout + p.stderr).strip().splitlines()
    if p.returncode == 3:  # lint findings only (1: the text did not parse)
        rest = [line for line in lines if not _COLON.match(line)]
        if not rest:
            return None
        return "\n".join(rest[:20])
    return "rc=%d %s" % (p.returncode, "\n".join(lines[:20]))
