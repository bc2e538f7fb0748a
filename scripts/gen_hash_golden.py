#!/usr/bin/env python3
"""Golden vectors for the router's block-hash algorithm, version 1.

This is a second, independent implementation of the algorithm documented in
crates/hash/src/lib.rs, written from that text with the `xxhash` package. The
Rust tests (crates/hash/tests/hash/golden.rs) must reproduce every value, so
the documented byte layout and the code cannot drift apart.

    .venv/bin/python scripts/gen_hash_golden.py          # rewrite the file
    .venv/bin/python scripts/gen_hash_golden.py --check  # compare only
"""

import json
import struct
import sys
from pathlib import Path

import xxhash

SEED = 0x6361_6368_6552_5431
ROOT_TAG = b"cache-router/root/v1"
OUT = Path(__file__).resolve().parent.parent / "crates" / "hash" / "tests" / "data" / "hash_golden.json"


def h(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=SEED)


def root(model, lora, salt) -> int:
    buf = bytearray(ROOT_TAG)
    for field in (model, lora, salt):
        if field is None:
            buf.append(0)
        else:
            raw = field.encode("utf-8")
            buf.append(1)
            buf += struct.pack("<I", len(raw)) + raw
    return h(bytes(buf))


def block(parent: int, tokens, extras) -> int:
    buf = struct.pack("<QI", parent, len(tokens))
    buf += struct.pack(f"<{len(tokens)}I", *tokens)
    buf += struct.pack("<I", len(extras))
    buf += struct.pack(f"<{len(extras)}Q", *extras)
    return h(buf)


def chain(ns, block_size, tokens, extras):
    extras = sorted({(e["start"], e["end"], e["key"]) for e in extras})
    parent = root(ns.get("model"), ns.get("lora_name"), ns.get("cache_salt"))
    out = []
    for i in range(len(tokens) // block_size):
        lo, hi = i * block_size, (i + 1) * block_size
        keys = [k for (s, e, k) in extras if s < hi and lo < e]
        parent = block(parent, tokens[lo:hi], keys)
        out.append(parent)
    return out


CASES = [
    ("empty_namespace", {}, 4, list(range(1, 10)), []),
    ("qwen3_block16", {"model": "Qwen/Qwen3-8B"}, 16, [(i * 7919) % 151643 for i in range(64)], []),
    ("lora_and_salt", {"model": "Qwen/Qwen3-8B", "lora_name": "sql-adapter", "cache_salt": "tenant-42"},
     4, [5, 6, 7, 8, 9, 10, 11, 12], []),
    ("empty_model_string", {"model": ""}, 4, [1, 2, 3, 4], []),
    ("utf8_names", {"model": "模型/東京-🚀"}, 2, [0, 4294967295, 7, 8], []),
    ("image_extra_keys", {"model": "Qwen/Qwen2.5-VL-7B"}, 4, list(range(100, 116)),
     [{"start": 3, "end": 9, "key": 0xDEADBEEFCAFEF00D}, {"start": 8, "end": 12, "key": 7}]),
    ("large_block_heap_path", {"model": "m"}, 300, [(i * 31) % 50000 for i in range(601)], []),
    ("partial_only", {"model": "m"}, 16, list(range(15)), []),
]


def generate():
    cases = []
    for name, ns, bs, tokens, extras in CASES:
        cases.append({
            "name": name,
            "namespace": ns,
            "block_size": bs,
            "tokens": tokens,
            "extras": extras,
            "root": f"{root(ns.get('model'), ns.get('lora_name'), ns.get('cache_salt')):016x}",
            "hashes": [f"{x:016x}" for x in chain(ns, bs, tokens, extras)],
        })
    return json.dumps({"algorithm": "cache-router block hash v1", "cases": cases}, ensure_ascii=False, indent=1) + "\n"


if __name__ == "__main__":
    text = generate()
    if "--check" in sys.argv[1:]:
        if json.loads(OUT.read_text()) != json.loads(text):
            sys.exit(f"{OUT} differs from the independent implementation")
    else:
        OUT.write_text(text)
        print(f"wrote {OUT}")
