# SPDX-License-Identifier: Apache-2.0
"""The built-in RL rewards (src/workloads/rl/reward.c) against independent
Python references, through reward_score_tool.

usage: rl_reward_test.py REWARD_SCORE_TOOL

- regex: a table of patterns in the subset where POSIX ERE (glibc regcomp,
  leftmost-longest) and Python's re (backtracking, leftmost-first) agree on
  *whether* a match exists: literals, ., bracket sets, * + ? {m,n}, |,
  groups, ^ and $, the i flag, and the m flag on ^/$ (POSIX REG_NEWLINE also
  stops . and [^...] at a newline; the table keeps . away from newlines
  under m). Match-or-not is all a reward reads, so where they pick
  different matches the answer is still the same.
- numeric: "the last number of the completion" re-derived with one Python
  regex and float(), on a table and on 400 seeded random strings over an
  alphabet of digits, signs, points, commas, exponents and letters.
- contains / not_contains / exact_match / length: Python's `in`, str.strip,
  str.lower and len on a table, case-insensitive cases included.
The table is the test's own; it asserts the two sides agree line by line.
"""

import json
import random
import re
import subprocess
import sys

# POSIX ERE and Python re agree on match-or-not for each of these.
REGEX_CASES = [
    ("abc", "", ["xxabcxx", "ab", "", "ABC"]),
    ("^abc$", "", ["abc", "abcd", " abc"]),
    ("a.c", "", ["abc", "a-c", "ac"]),
    ("colou?r", "", ["color", "colour", "colouur"]),
    ("ab+c", "", ["ac", "abc", "abbbbc"]),
    ("ab*c", "", ["ac", "abc", "abxc"]),
    ("x{2,3}y", "", ["xy", "xxy", "xxxxy"]),
    ("^x{2,3}y", "", ["xy", "xxy", "xxxy", "xxxxy"]),
    ("(cat|dog)s$", "", ["cats", "dogs", "cat", "hotdogs!"]),
    ("[0-9]+ apples", "", ["12 apples", "apples", "x 7 apples"]),
    ("^[^0-9]*$", "", ["no digits", "one 1", ""]),
    ("[0-9]{4}", "", ["year 2024", "123"]),
    ("^answer: [0-9]+$", "i", ["ANSWER: 12", "answer: x"]),
    ("^answer: [0-9]+$", "m", ["so\nanswer: 12\nbye", "so answer: 12"]),
    ("^(yes|no)$", "im", ["maybe\nYES", "yesno"]),
    ("(a|ab)(c|bcd)", "", ["abcd", "abc", "ad"]),
    ("h(e|a)llo w[o0]rld", "i", ["HALLO W0RLD", "hello word"]),
    ("\\.$", "", ["end.", "end"]),
    ("a|b|c", "", ["zzz", "zzc"]),
    ("^$", "", ["", "x"]),
]

# Where the two differ, the C side is pinned to POSIX (docs/rl.md says so):
# Python's $ also matches before a final newline and its . never matches a
# newline (without re.S); POSIX $ is the end of the text and . matches a
# newline unless the m flag (REG_NEWLINE) is set.
DIVERGENCES = [
    ("^abc$", "", "abc\n", 0.0),
    ("a.c", "", "a\nc", 1.0),
    ("a.c", "m", "a\nc", 0.0),
]

NUMBER = re.compile(
    r"(?:(?<![A-Za-z0-9])[-+])?(?:[0-9]+(?:,[0-9]{3}(?![0-9]))*"
    r"(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")

NUMBER_TABLE = [
    "The answer is 42.", "7 apples, then 42", "x = -3.5", "5-3",
    "1,234,567 units", "1,2", "12,3456", "6.02e23", "see .5", "1.2.3",
    "12e", "12e+", "12e-3", "abc123", "no number", "", "-.5", "+7",
    "x-7", "(-7)", "1,234.5", "1,23", "0.000", "##### 18", "3e-400",
]


def ref_last_number(text):
    last = None
    for m in NUMBER.finditer(text):
        token = m.group(0).replace(",", "")
        last = float(token)
    return last


def main():
    tool = sys.argv[1]
    lines, want = [], []

    def case(reward, completion, answer, expected, tokens=None):
        row = {"reward": reward, "completion": completion}
        if answer is not None:
            row["answer"] = answer
        if tokens is not None:
            row["tokens"] = tokens
        lines.append(json.dumps(row))
        want.append((expected, row))

    for pattern, flags, texts in REGEX_CASES:
        pyflags = (re.I if "i" in flags else 0) | (re.M if "m" in flags else 0)
        reward = {"type": "regex", "pattern": pattern}
        if flags:
            reward["flags"] = flags
        for text in texts:
            expected = 1.0 if re.search(pattern, text, pyflags) else 0.0
            case(reward, text, None, expected)

    for pattern, flags, text, c_expected in DIVERGENCES:
        reward = {"type": "regex", "pattern": pattern}
        if flags:
            reward["flags"] = flags
        case(reward, text, None, c_expected)

    rng = random.Random(16)
    alphabet = "0123456789" * 3 + ".,-+eE x"
    randoms = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
               for _ in range(400)]
    exact = {"type": "numeric", "tolerance": 0}
    for text in NUMBER_TABLE + randoms:
        value = ref_last_number(text)
        if value is None:
            case(exact, text, "0", 0.0)
            case(exact, text, "1", 0.0)
        elif value != value or value in (float("inf"), float("-inf")):
            case(exact, text, "0", 0.0)
        else:
            case(exact, text, repr(value), 1.0)
            case(exact, text, repr(value + max(1.0, abs(value))), 0.0)

    texts = ["Hello world", "  padded  ", "", "MiXeD CaSe", "tab\tsep\n"]
    needles = ["hello", "Hello", "d C", "\t", "x"]
    for text in texts:
        for needle in needles:
            for ci in (False, True):
                hay, pin = (text.lower(), needle.lower()) if ci else (text,
                                                                      needle)
                found = pin in hay
                case({"type": "contains", "text": needle,
                      "case_insensitive": ci}, text, None, float(found))
                case({"type": "not_contains", "text": needle,
                      "case_insensitive": ci}, text, None, float(not found))
        for answer in ["Hello world", "hello world", "padded", "", "x"]:
            for ci in (False, True):
                for trim in (False, True):
                    a, c = (answer.strip(), text.strip()) if trim else (answer,
                                                                        text)
                    if ci:
                        a, c = a.lower(), c.lower()
                    case({"type": "exact_match", "trim": trim,
                          "case_insensitive": ci}, text, answer, float(a == c))
        for lo, hi in [(0, 0), (1, 5), (5, 11), (11, 100)]:
            case({"type": "length", "min_chars": lo, "max_chars": hi}, text,
                 None, float(lo <= len(text) <= hi))
    for text in ["\u00e9t\u00e9", "\u65e5\u672c\u8a9e", "\U0001F600!"]:
        n = len(text)
        case({"type": "length", "min_chars": n, "max_chars": n}, text, None,
             1.0)
        case({"type": "length", "max_chars": n - 1}, text, None, 0.0)

    out = subprocess.run([tool], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=60,
                         check=True).stdout.splitlines()
    assert len(out) == len(want), (len(out), len(want))
    failures = 0
    for got, (expected, row) in zip(out, want):
        if got.startswith("error") or float(got) != expected:
            failures += 1
            print(f"MISMATCH {json.dumps(row)}: C {got}, Python {expected}")
    print(f"{len(want)} cases, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
