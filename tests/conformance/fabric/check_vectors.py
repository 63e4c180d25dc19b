#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the fabric golden vectors against docs/protocol.md with an
implementation written from the spec alone (no code shared with src/proto):
header layout and CRC32C, payload prefix and JSON checksum, the JSON part,
section alignment, lengths, checksums and zero padding, exact frame length.

Prints one line per vector and exits non-zero on the first violation.
"""
import glob
import json
import os
import struct
import sys

ELEMENT_BYTES = {1: 4, 2: 2, 3: 2, 4: 8, 5: 1, 6: 1, 7: 2, 8: 4, 9: 8,
                 10: 1, 11: 2, 12: 4, 13: 8}
KNOWN_TYPES = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 17, 18, 19, 32, 33, 34, 35}


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def read_hex(path):
    digits = "".join(line.strip() for line in open(path, encoding="ascii")
                     if not line.startswith("#"))
    return bytes.fromhex(digits)


def check(frame):
    assert crc32c(b"123456789") == 0xE3069283
    assert len(frame) >= 40, "shorter than header + prefix"
    magic, version, mtype, flags, hcrc, request_id, payload_length = \
        struct.unpack_from("<IHHIIQQ", frame, 0)
    assert frame[:4] == b"PCPF" and magic == 0x46504350, "magic"
    header = bytearray(frame[:32])
    header[12:16] = b"\0\0\0\0"
    assert hcrc == crc32c(bytes(header)), "header CRC32C"
    assert version == 1, "version"
    assert mtype in KNOWN_TYPES, "type %d" % mtype
    assert flags == 0, "flags must be 0 in version 1"
    assert len(frame) == 32 + payload_length, "payload_length"
    payload = frame[32:]
    json_length, json_crc = struct.unpack_from("<II", payload, 0)
    text = payload[8:8 + json_length]
    assert len(text) == json_length, "JSON overruns the payload"
    assert json_crc == crc32c(text), "JSON CRC32C"
    control = json.loads(text.decode("utf-8"))
    assert isinstance(control, dict), "control part must be an object"
    if mtype == 1:
        assert request_id == 0, "HELLO carries request id 0"
        for key in ("min_version", "max_version", "role"):
            assert key in control, "HELLO key " + key
    if mtype == 18:
        # BLOB_CHUNK (s.1.4, s.3.10): a program's last chunk carries the
        # whole blob's SHA-256; tensor chunks carry none (per-chunk CRC32C).
        assert control["kind"] in ("program", "tensor"), "kind"
        assert 0 <= control["index"] < control["count"], "index"
        last = control["index"] + 1 == control["count"]
        if control["kind"] == "program" and last:
            assert len(control["sha256"]) == 64, "program sha256"
        if control["kind"] == "tensor":
            assert "sha256" not in control, "tensor chunk with sha256"
        names = [s["name"] for s in control.get("sections", [])]
        assert names == ["data"], "one section named data"
    sections = control.get("sections", [])
    if not sections:
        assert payload_length == 8 + json_length, "bytes after the JSON"
        return mtype, 0
    data_area = (8 + json_length + 63) // 64 * 64
    assert payload[8 + json_length:data_area] == bytes(
        data_area - 8 - json_length), "padding after JSON"
    data = payload[data_area:]
    end = 0
    for s in sections:
        count = 1
        for dim in s["shape"]:
            assert dim >= 0
            count *= dim
        assert 0 < len(s["name"]) <= 256
        assert s["length"] == count * ELEMENT_BYTES[s["dtype"]], "length"
        assert s["offset"] % 64 == 0 and s["offset"] >= end, "offset"
        assert data[end:s["offset"]] == bytes(s["offset"] - end), "padding"
        body = data[s["offset"]:s["offset"] + s["length"]]
        assert len(body) == s["length"], "section overruns the frame"
        assert crc32c(body) == s["crc32c"], "section CRC32C"
        end = s["offset"] + s["length"]
    assert end == len(data), "bytes after the last section"
    return mtype, len(sections)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    paths = sorted(glob.glob(os.path.join(here, "*.hex")))
    if not paths:
        print("no vectors")
        return 1
    for path in paths:
        try:
            mtype, count = check(read_hex(path))
        except (AssertionError, KeyError, ValueError) as e:
            print("FAIL %s: %s" % (os.path.basename(path), e))
            return 1
        print("ok %s: type %d, %d sections" % (os.path.basename(path), mtype,
                                                count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
