"""The index fed with real vLLM event batches (msgspec-encoded, as the
engines publish them) answers what a plain-dict model of every pod's cache
answers, and refuses bad input without changing."""

import random

import pytest

import cache_router as cr
from conftest import gen_hash_golden as oracle

BS = 4
NS = {"model": "Qwen/Qwen3-0.6B"}


def engine_hash(tokens):
    """An engine's own block hash: any function of the prefix (vLLM's differs
    from the router's, which rehashes from the tokens in the event)."""
    return hash(("engine", tuple(tokens))) & (2**63 - 1)


class Universe:
    """Documents sharing prefixes, with each block's engine and router hash."""

    def __init__(self, rng, docs=24):
        self.docs = []
        for _ in range(docs):
            if self.docs and rng.random() < 0.6:
                base = rng.choice(self.docs)
                keep = rng.randrange(0, len(base) // BS + 1) * BS
                tokens = base[:keep] + [rng.randrange(0, 1000) for _ in range(BS * rng.randrange(1, 6))]
            else:
                tokens = [rng.randrange(0, 1000) for _ in range(BS * rng.randrange(1, 8))]
            self.docs.append(tokens)
        self.router = [oracle.chain(NS, BS, d, []) for d in self.docs]
        self.engine = [[engine_hash(d[: (i + 1) * BS]) for i in range(len(d) // BS)] for d in self.docs]
        # engine hash -> (router hash, parent engine hash)
        self.block = {}
        for d in range(len(self.docs)):
            for i, e in enumerate(self.engine[d]):
                self.block[e] = (self.router[d][i], self.engine[d][i - 1] if i else None)


def model_match(held, chain):
    n = 0
    for h in chain:
        if h not in held:
            break
        n += 1
    return n


@pytest.mark.parametrize("seed", range(6))
def test_random_event_streams_match_a_dict_model(seed, vllm):
    rng = random.Random(seed)
    u = Universe(rng)
    pods = [("tcp://10.0.0.1:5557", 0), ("tcp://10.0.0.1:5557", 1), ("tcp://10.0.0.2:5557", 0)]
    idx = cr.Index(block_size=BS, **NS)
    for ep, rank in pods:
        idx.join(ep, rank)
    held = {p: set() for p in pods}  # engine hashes each pod holds
    for step in range(400):
        pod = rng.choice(pods)
        have = held[pod]
        events = []
        for _ in range(rng.randrange(1, 4)):
            r = rng.random()
            if r < 0.6:
                d = rng.randrange(len(u.docs))
                a = model_match(have, u.engine[d])
                if a == len(u.engine[d]):
                    continue
                b = min(len(u.engine[d]), a + rng.randrange(1, 4))
                parent = u.engine[d][a - 1] if a else None
                events.append(vllm.stored(u.engine[d][a:b], parent, u.docs[d][a * BS : b * BS], BS))
                have.update(u.engine[d][a:b])
            elif r < 0.95 and have:
                parents = {u.block[e][1] for e in have}
                leaves = sorted(e for e in have if e not in parents)
                gone = rng.sample(leaves, rng.randrange(1, min(3, len(leaves)) + 1))
                events.append(vllm.removed(gone))
                have.difference_update(gone)
            elif r >= 0.95:
                events.append(vllm.cleared())
                have.clear()
        if not events:
            continue
        assert idx.apply(pod[0], vllm.batch(events, pod[1]), pod[1]) == len(events)
        if step % 10 == 0 or step == 399:
            for d in range(len(u.docs)):
                want = {}
                for p in pods:
                    n = model_match({u.block[e][0] for e in held[p]}, u.router[d])
                    if n:
                        want[p] = n
                got = idx.match(u.router[d])
                assert {(ep, r): n for ep, r, n in got} == want, (step, d)
                assert [n for _, _, n in got] == sorted((n for _, _, n in got), reverse=True)
                assert idx.match_tokens(u.docs[d]) == got
    for p in pods:
        assert not idx.needs_resync(*p)
    s = idx.stats()
    assert s["pods_live"] == len(pods)
    assert s["residencies"] == sum(len(h) for h in held.values())
    assert s["ingest_unknown_parent"] == 0 and s["ingest_token_mismatch"] == 0


def test_join_leave_and_pods(vllm):
    idx = cr.Index(block_size=BS, **NS)
    tokens = list(range(16))
    chain = idx.hash_tokens(tokens)
    engine = [engine_hash(tokens[: (i + 1) * BS]) for i in range(4)]
    idx.join("a")
    idx.join("b")
    idx.join("a")  # a no-op
    assert idx.pods() == [("a", 0), ("b", 0)]
    idx.apply("a", vllm.batch([vllm.stored(engine, None, tokens, BS)]))
    idx.apply("b", vllm.batch([vllm.stored(engine[:2], None, tokens[:8], BS)]))
    assert idx.match(chain) == [("a", 0, 4), ("b", 0, 2)]
    assert idx.leave("a") is True
    assert idx.leave("a") is False
    assert idx.match(chain) == [("b", 0, 2)]
    assert idx.pods() == [("b", 0)]


def test_bad_input_raises_and_changes_nothing(vllm):
    idx = cr.Index(block_size=BS, **NS)
    idx.join("a")
    tokens = list(range(8))
    engine = [engine_hash(tokens[:4]), engine_hash(tokens)]
    idx.apply("a", vllm.batch([vllm.stored(engine, None, tokens, BS)]))
    before = idx.stats()
    for garbage in [b"", b"\xc1", b"\x93\x01\x02", b"\x92\xcb" + b"\x00" * 8 + b"\x91\xc0", bytes(range(64))]:
        with pytest.raises(cr.CacheRouterError):
            idx.apply("a", garbage)
    with pytest.raises(cr.CacheRouterError, match="unknown pod"):
        idx.apply("nobody", vllm.batch([vllm.cleared()]))
    with pytest.raises(cr.CacheRouterError, match="unknown pod"):
        idx.needs_resync("nobody")
    with pytest.raises(TypeError):
        idx.apply("a", "not bytes")
    assert idx.stats() == before
    assert idx.match_tokens(tokens) == [("a", 0, 2)]


def test_match_takes_any_64_bit_hash_and_refuses_what_is_not_one(vllm):
    idx = cr.Index(block_size=BS, **NS)
    idx.join("a")
    tokens = list(range(8))
    idx.apply("a", vllm.batch([vllm.stored([engine_hash(tokens[:4]), engine_hash(tokens)], None, tokens, BS)]))
    chain = idx.hash_tokens(tokens)
    assert idx.match(chain) == [("a", 0, 2)]
    # The same chain as a tuple, and with ints of a subclass (PyO3's path).
    assert idx.match(tuple(chain)) == [("a", 0, 2)]

    class Hash(int):
        pass

    assert idx.match([Hash(h) for h in chain]) == [("a", 0, 2)]
    # 2**64 - 1 is a hash like any other (the value CPython also uses to
    # signal an error); it matches nothing here.
    assert idx.match([2**64 - 1]) == []
    assert idx.match([chain[0], 2**64 - 1]) == [("a", 0, 1)]
    for bad in ([2**64], [-1], [chain[0], -(2**70)]):
        with pytest.raises(OverflowError):
            idx.match(bad)
    for bad in (["1"], [1.0], [None]):
        with pytest.raises(TypeError):
            idx.match(bad)
    assert idx.match(chain) == [("a", 0, 2)]


def test_a_block_whose_parent_was_never_stored_asks_for_a_resync(vllm):
    idx = cr.Index(block_size=BS, **NS)
    idx.join("a")
    # A removal of a block never stored is counted, not a reason to resync.
    idx.apply("a", vllm.batch([vllm.removed([12345])]))
    assert not idx.needs_resync("a")
    assert idx.stats()["ingest_unknown_removed"] == 1
    # A stored block whose parent the router never saw: a missed batch.
    idx.apply("a", vllm.batch([vllm.stored([777], 555, [1, 2, 3, 4], BS)]))
    assert idx.needs_resync("a")
    assert idx.stats()["ingest_unknown_parent"] == 1
    assert idx.match_tokens([1, 2, 3, 4]) == []


def test_sglang_media_and_the_array_encoding():
    from conftest import VllmEncoder

    old = VllmEncoder("array")
    idx = cr.Index(block_size=BS, **NS)
    idx.join("a")
    tokens = list(range(100, 108))
    engine = [engine_hash(tokens[:4]), engine_hash(tokens)]
    assert idx.apply("a", old.batch([old.stored(engine, None, tokens, BS)])) == 1
    assert idx.match_tokens(tokens) == [("a", 0, 2)]
