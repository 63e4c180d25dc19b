#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""deploy/grafana/pcp.json (issue 18): valid JSON shaped like a Grafana
dashboard (panels with unique ids, positions inside the 24-column grid,
targets with a query), every metric its PromQL queries use is in
tests/data/metrics_golden.txt (a histogram's _bucket/_sum/_count count as
its family), every label a selector matches is one of that metric's golden
labels, and the panels the issue asks for are there. The extractor is
checked first on queries with known answers, so a checker that sees no
metric at all cannot pass.

usage: grafana_dashboard_test.py [ROOT]
"""
import json
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "pcp.json")
GOLDEN = os.path.join(ROOT, "tests", "data", "metrics_golden.txt")
FAILURES = []

# PromQL words that are not metric names: aggregation and binary operators,
# modifiers, and Grafana's query functions.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right",
            "and", "or", "unless", "bool", "offset", "inf", "nan"}


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def metrics_in(expr):
    """Metric names an expression reads (functions, labels, strings,
    ranges, Grafana variables and keywords stripped)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # strings
    e = re.sub(r"\{[^}]*\}", " ", e)                      # matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                     # ranges
    e = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", " ", e)  # variables
    # Numbers and durations (0.95, 1e9, 5m after offset).
    e = re.sub(r"(?<![A-Za-z0-9_:])[0-9][A-Za-z0-9_.+-]*", " ", e)
    # by (...), without (...), on (...), ignoring (...), group_x (...)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*"
               r"\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function
        if word.lower() in KEYWORDS:
            continue
        # Grafana's label_values(metric, label): the label is not a metric.
        before = e[:m.start()].rstrip()
        if before.endswith(",") and "label_values" in e:
            continue
        names.add(word)
    return names


def golden_families():
    """{name: type} and {name: label names} (union over the roles)."""
    fams, labels = {}, {}
    with open(GOLDEN) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                _, name, kind, names = line.split()
                fams[name] = kind
                labels.setdefault(name, set()).update(
                    [] if names == "-" else names.split(","))
    return fams, labels


def matcher_labels(expr):
    """(metric, label) of every label matcher in a selector."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    out = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", e):
        for label in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)",
                                m.group(2)):
            out.append((m.group(1), label))
    return out


def family_labels(name, fams, labels):
    if name in fams:
        return labels.get(name, set())
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[:-len(suffix)]
        if name.endswith(suffix) and fams.get(base) == "histogram":
            return labels.get(base, set()) | ({"le"} if suffix == "_bucket"
                                              else set())
    return set()


def known(name, fams):
    if name in fams:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and \
                fams.get(name[:-len(suffix)]) == "histogram":
            return True
    return False


def queries(dash):
    """(where, expr) of every panel target and query variable."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append(("panel %r" % p.get("title"), t.get("expr", "")))
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            out.append(("variable %r" % v.get("name"),
                        q.get("query", "") if isinstance(q, dict) else q))
    return out


def main():
    # The extractor on queries with known answers.
    samples = {
        'histogram_quantile(0.95, sum by (le, model_name) (rate('
        'vllm:time_to_first_token_seconds_bucket{model_name=~"$m"}'
        '[$__rate_interval])))': {"vllm:time_to_first_token_seconds_bucket"},
        'sum(rate(a_total[5m])) / on (job) group_left b_info': {
            "a_total", "b_info"},
        'label_values(pcp_training_loss, job)': {"pcp_training_loss"},
        'time() - process_start_time_seconds': {"process_start_time_seconds"},
        'x > bool 0.5 or y offset 5m': {"x", "y"},
    }
    for expr, want in samples.items():
        got = metrics_in(expr)
        check(got == want, "extractor: %r -> %s (want %s)" %
              (expr, sorted(got), sorted(want)))
    fams, labels = golden_families()
    got = matcher_labels('rate(vllm:x_bucket{model_name=~"$m", le="0.1"}[5m])')
    check(got == [("vllm:x_bucket", "model_name"), ("vllm:x_bucket", "le")],
          "matcher labels extracted: %s" % got)
    check(len(fams) > 50, "golden list read (%d families)" % len(fams))
    check(not known("vllm:no_such_metric", fams) and
          not known("pcp_training_loss_bucket", fams),
          "an unknown name is reported (a gauge has no _bucket)")

    try:
        with open(DASHBOARD) as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        check(False, "%s is valid JSON: %s" % (DASHBOARD, e))
        return
    check(isinstance(dash.get("panels"), list) and dash["panels"],
          "the dashboard has panels")
    check(isinstance(dash.get("schemaVersion"), int) and dash.get("title"),
          "schemaVersion and title")
    ids = [p.get("id") for p in dash.get("panels", [])]
    check(len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids),
          "panel ids are unique integers")
    for p in dash.get("panels", []):
        g = p.get("gridPos", {})
        check(all(isinstance(g.get(k), int) for k in "hwxy") and
              g["x"] + g["w"] <= 24 and p.get("type") and p.get("title"),
              "panel %r: type, title, gridPos inside 24 columns" %
              p.get("title"))
        if p.get("type") != "row":
            check(p.get("targets") and all(t.get("expr") and t.get("refId")
                                           for t in p["targets"]),
                  "panel %r has queries" % p.get("title"))

    used = set()
    unknown = []
    for where, expr in queries(dash):
        for name in metrics_in(expr):
            used.add(name)
            if not known(name, fams):
                unknown.append("%s: %s" % (where, name))
    check(not unknown, "every metric the queries use is in the golden list: "
          "%s" % unknown)
    bad_labels = []
    for where, expr in queries(dash):
        for name, label in matcher_labels(expr):
            if label not in family_labels(name, fams, labels):
                bad_labels.append("%s: %s{%s}" % (where, name, label))
    check(not bad_labels, "every label a selector matches is one of its "
          "metric's golden labels: %s" % bad_labels)
    # The panels the issue asks for.
    for name in ("vllm:time_to_first_token_seconds_bucket",
                 "vllm:time_per_output_token_seconds_bucket",
                 "vllm:generation_tokens_total", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "pcp_training_loss", "pcp_training_val_loss",
                 "pcp_training_tokens_per_second",
                 "pcp_training_wire_bytes_total", "pcp_fabric_workers",
                 "process_cpu_seconds_total",
                 "process_resident_memory_bytes"):
        check(name in used, "the dashboard queries %s" % name)


if __name__ == "__main__":
    main()
    if FAILURES:
        print("%d failure(s)" % len(FAILURES))
        sys.exit(1)
    print("grafana dashboard: all checks passed")
