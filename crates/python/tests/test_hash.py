"""Block hashing from Python equals the Rust crate's, on the golden vectors
(which the Rust tests also reproduce) and on random chains checked against
the independent Python implementation in scripts/gen_hash_golden.py."""

import random

import pytest

import cache_router as cr
from conftest import gen_hash_golden as oracle
from conftest import golden


def hasher_of(ns, block_size):
    return cr.BlockHasher(
        block_size=block_size,
        model=ns.get("model"),
        lora_name=ns.get("lora_name"),
        cache_salt=ns.get("cache_salt"),
    )


def test_golden_vectors():
    cases = golden("hash_golden.json")["cases"]
    assert len(cases) >= 8
    for case in cases:
        h = hasher_of(case["namespace"], case["block_size"])
        assert f"{h.root():016x}" == case["root"], case["name"]
        extras = [(e["start"], e["end"], e["key"]) for e in case["extras"]]
        got = [f"{x:016x}" for x in h.hash_tokens(case["tokens"], extras)]
        assert got == case["hashes"], case["name"]


def test_random_chains_against_the_python_oracle():
    rng = random.Random(20261206)
    for _ in range(300):
        block_size = rng.choice([1, 2, 4, 16, 64])
        ns = {}
        for field in ("model", "lora_name", "cache_salt"):
            if rng.random() < 0.4:
                ns[field] = rng.choice(["", "Qwen/Qwen3-0.6B", "adapter-7", "salt\u00e9"])
        tokens = [rng.randrange(0, 2**32) for _ in range(rng.randrange(0, 8 * block_size))]
        extras = []
        for _ in range(rng.choice([0, 0, 1, 3])):
            s = rng.randrange(0, max(1, len(tokens)))
            extras.append({"start": s, "end": s + rng.randrange(1, 40), "key": rng.randrange(0, 2**64)})
        want = oracle.chain(ns, block_size, tokens, extras)
        h = hasher_of(ns, block_size)
        assert h.root() == oracle.root(ns.get("model"), ns.get("lora_name"), ns.get("cache_salt"))
        got = h.hash_tokens(tokens, [(e["start"], e["end"], e["key"]) for e in extras])
        assert got == want, (block_size, ns, len(tokens), extras)
        # The index hashes in the namespace it was built with.
        if not extras:
            idx = cr.Index(block_size=block_size, **ns)
            assert idx.hash_tokens(tokens) == want


def test_a_trailing_partial_block_has_no_hash():
    h = cr.BlockHasher(block_size=4)
    assert len(h.hash_tokens(list(range(11)))) == 2
    assert h.hash_tokens([]) == []
    # Cumulative: the second block's hash depends on the first block.
    assert h.hash_tokens([1, 2, 3, 4, 5, 6, 7, 8])[1] != h.hash_tokens([0, 2, 3, 4, 5, 6, 7, 8])[1]


def test_bad_arguments_raise():
    with pytest.raises(cr.CacheRouterError):
        cr.BlockHasher(block_size=0)
    with pytest.raises(OverflowError):
        cr.BlockHasher().hash_tokens([-1])
    with pytest.raises(TypeError):
        cr.BlockHasher().hash_tokens(["a"])
