"""`Chain`, the hashers' native answer, behaves as the immutable sequence of
its ints (checked against a plain list on random chains and operations),
and the index matches it exactly as it matches the same ints in a list."""

import pickle
import random

import pytest

import cache_router as cr


def test_a_chain_is_the_sequence_of_its_ints():
    rng = random.Random(11)
    for _ in range(300):
        ints = [rng.choice([0, 1, 2**63, 2**64 - 1, rng.randrange(0, 2**64)]) for _ in range(rng.randrange(0, 12))]
        c = cr.Chain(ints)
        assert len(c) == len(ints) and bool(c) == bool(ints)
        assert list(c) == ints and c.tolist() == ints
        assert c == ints and ints == c and c == tuple(ints) and c == cr.Chain(iter(ints))
        assert hash(c) == hash(tuple(ints))
        for i in range(-len(ints), len(ints)):
            assert c[i] == ints[i]
        for _ in range(5):
            start = rng.choice([None, rng.randrange(-15, 15)])
            stop = rng.choice([None, rng.randrange(-15, 15)])
            step = rng.choice([None, 1, 2, 3, -1, -2])
            part = c[start:stop:step]
            assert isinstance(part, cr.Chain)
            assert part.tolist() == ints[start:stop:step]
        if ints:
            assert ints[-1] in c
            assert c != ints[:-1] and c != ints + [0]
        assert pickle.loads(pickle.dumps(c)) == c


def test_a_chain_refuses_what_is_not_a_64_bit_hash():
    with pytest.raises(IndexError):
        cr.Chain([1, 2])[2]
    with pytest.raises(IndexError):
        cr.Chain([1, 2])[-3]
    with pytest.raises(TypeError):
        cr.Chain([1, 2])["0"]
    with pytest.raises(OverflowError):
        cr.Chain([2**64])
    with pytest.raises(OverflowError):
        cr.Chain([-1])
    with pytest.raises(TypeError):
        cr.Chain(["a"])
    with pytest.raises(TypeError):
        cr.Chain(3)
    assert cr.Chain() == [] and len(cr.Chain()) == 0
    # Not equal to what is not a sequence of the same ints.
    assert cr.Chain([97]) != "a" and cr.Chain([97]) != b"a" and cr.Chain([1]) != 1
    assert cr.Chain([1]) != [1.5] and cr.Chain([1]) != None  # noqa: E711
    assert "a" not in cr.Chain([97])
    assert repr(cr.Chain([1, 2])) == "Chain([1, 2])"
    assert "more" in repr(cr.Chain(range(20)))


def test_the_hashers_give_chains_and_the_index_matches_them_as_lists(vllm):
    bs = 4
    idx = cr.Index(block_size=bs, model="m")
    hasher = cr.BlockHasher(bs, model="m")
    rng = random.Random(5)
    docs = [[rng.randrange(0, 1000) for _ in range(bs * rng.randrange(1, 9))] for _ in range(12)]
    for p in range(4):
        idx.join(f"p{p}")
    for d, tokens in enumerate(docs):
        n = len(tokens) // bs
        engine = [hash(("e", d, i)) & (2**63 - 1) for i in range(n)]
        for p in rng.sample(range(4), 2):
            keep = rng.randrange(1, n + 1)
            idx.apply(f"p{p}", vllm.batch([vllm.stored(engine[:keep], None, tokens[: keep * bs], bs)]))
    for tokens in docs:
        chain = hasher.hash_tokens(tokens)
        assert isinstance(chain, cr.Chain) and chain == idx.hash_tokens(tokens)
        want = idx.match(chain.tolist())
        assert want and idx.match(chain) == want == idx.match_tokens(tokens)
        # A slice of a chain is the chain of the shorter prompt.
        assert idx.match(chain[:1]) == idx.match(chain.tolist()[:1])
        assert chain[:1] == hasher.hash_tokens(tokens[:bs])
