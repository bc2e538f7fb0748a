"""Shared fixtures of the package's tests: the checkout's data and the
vLLM event structs of scripts/kv_publisher.py (the real msgspec encoding)."""

import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_hash_golden  # noqa: E402  (the independent Python hash oracle)
import kv_publisher  # noqa: E402  (vLLM 0.33's event structs)


def data(name: str) -> Path:
    return ROOT / "crates" / "hash" / "tests" / "data" / name


def golden(name: str):
    return json.loads(data(name).read_text())


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tokenizers() -> Path:
    return ROOT / "assets" / "tokenizers"


class VllmEncoder:
    """vLLM's KV event batches as its engines put them on ZeroMQ."""

    def __init__(self, encoding: str = "map"):
        import msgspec

        self.Batch, self.Stored, self.Removed, self.Cleared = kv_publisher.structs(encoding == "array")
        self.enc = msgspec.msgpack.Encoder()

    def stored(self, engine_hashes, parent, tokens, block_size, lora_name=None):
        return self.Stored(
            block_hashes=list(engine_hashes),
            parent_block_hash=parent,
            token_ids=list(tokens),
            block_size=block_size,
            lora_id=None,
            medium="GPU",
            lora_name=lora_name,
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        )

    def removed(self, engine_hashes):
        return self.Removed(block_hashes=list(engine_hashes), medium="GPU", group_idx=0)

    def cleared(self):
        return self.Cleared()

    def batch(self, events, dp_rank=None) -> bytes:
        return self.enc.encode(self.Batch(ts=time.time(), events=list(events), data_parallel_rank=dp_rank))


@pytest.fixture()
def vllm():
    return VllmEncoder()
