#!/usr/bin/env python3
"""The package against Dynamo's Python KV router (`RadixTree` from
ai-dynamo-runtime), and the binding's own overhead over the Rust calls.

    pip install ./crates/python ai-dynamo-runtime==1.6.1 msgspec
    python crates/python/bench/bench.py            # both parts, one run
    python crates/python/bench/bench.py --overhead         # the binding's overhead alone
    python crates/python/bench/bench.py --match-overhead   # Index.match's overhead alone

Part 1, the same workload through both indexes, each side in a fresh
process of its own (so memory is each index's alone): W workers, prompts
of L blocks of 16 tokens in groups sharing a system prompt, each worker
storing its share of prompts; then queries of every prompt. Each side gets
its own engine's wire format, encoded before the clock starts: vLLM's
msgpack batches with the tokens (cache_router rehashes them, as it does in
production) and Dynamo's JSON `KvCacheEvent`s with its block hashes
(computed with its `compute_block_hash_for_seq`). Reported: apply and
match cost per call (median of --repeats passes over every event/query)
and the resident memory the index added.

Part 2, the Python call overhead: `Router.pick` and `Index.match` from
Python against the same work looped in Rust (`_bench_pick`, `_bench_match`)
in the same process; the difference is what the binding costs per call.
"""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BS = 16
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def workload(args):
    rng = random.Random(args.seed)
    systems = [[rng.randrange(1000, 150000) for _ in range(BS * args.system_blocks)] for _ in range(args.groups)]
    prompts = []
    for i in range(args.prompts):
        own = [rng.randrange(1000, 150000) for _ in range(BS * (args.blocks - args.system_blocks))]
        prompts.append(systems[i % args.groups] + own)
    # Each prompt lands on `replicas` workers, as a router spreading load would.
    placement = [rng.sample(range(args.workers), args.replicas) for _ in prompts]
    return prompts, placement


def timed(calls, repeats):
    """Median seconds per call over `repeats` passes of `calls` (thunks)."""
    per = []
    for _ in range(repeats):
        t = time.perf_counter()
        for c in calls:
            c()
        per.append((time.perf_counter() - t) / len(calls))
    return statistics.median(per)


def side_ours(args):
    import msgspec

    sys.path.insert(0, str(ROOT / "scripts"))
    import kv_publisher

    import cache_router as cr

    Batch, Stored, _, _ = kv_publisher.structs(False)
    enc = msgspec.msgpack.Encoder()
    prompts, placement = workload(args)
    events = []  # (endpoint, payload)
    for p, workers in zip(prompts, placement):
        engine = [hash(("e", tuple(p[: (i + 1) * BS]))) & (2**63 - 1) for i in range(len(p) // BS)]
        for w in workers:
            ev = Stored(block_hashes=engine, parent_block_hash=None, token_ids=p, block_size=BS, lora_id=None,
                        medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention")
            events.append((f"tcp://10.0.0.{w}:5557", enc.encode(Batch(ts=0.0, events=[ev]))))
    hasher = cr.BlockHasher(BS, model="m")
    queries = [hasher.hash_tokens(p) for p in prompts]
    base = rss_kib()
    idx = cr.Index(BS, model="m")
    for w in range(args.workers):
        idx.join(f"tcp://10.0.0.{w}:5557")
    t = time.perf_counter()
    for ep, payload in events:
        idx.apply(ep, payload)
    apply_s = (time.perf_counter() - t) / len(events)
    mem = rss_kib() - base
    hits = sum(len(idx.match(q)) for q in queries)
    match_s = timed([lambda q=q: idx.match(q) for q in queries], args.repeats)
    return {"apply_us": apply_s * 1e6, "match_us": match_s * 1e6, "rss_mib": mem / 1024, "events": len(events),
            "queries": len(queries), "pods_matched": hits}


def side_dynamo(args):
    from dynamo.llm import RadixTree, compute_block_hash_for_seq

    prompts, placement = workload(args)
    local = [compute_block_hash_for_seq(p, BS) for p in prompts]
    events = []
    n = 0
    for p, h, workers in zip(prompts, local, placement):
        engine = [hash(("e", tuple(p[: (i + 1) * BS]))) & (2**63 - 1) for i in range(len(p) // BS)]
        blocks = [{"block_hash": e, "tokens_hash": t} for e, t in zip(engine, h)]
        for w in workers:
            n += 1
            ev = {"event_id": n, "data": {"stored": {"parent_hash": None, "blocks": blocks}}}
            events.append((w, json.dumps(ev).encode()))
    base = rss_kib()
    tree = RadixTree()
    t = time.perf_counter()
    for w, payload in events:
        tree.apply_event(w, payload)
    apply_s = (time.perf_counter() - t) / len(events)
    # Its applies go to a background thread: a match after the last one
    # sees them all (the thread serves requests in order).
    hits = sum(len(tree.find_matches(q).scores) for q in local)
    apply_s = max(apply_s, 0.0)
    mem = rss_kib() - base
    match_s = timed([lambda q=q: tree.find_matches(q) for q in local], args.repeats)
    return {"apply_us": apply_s * 1e6, "match_us": match_s * 1e6, "rss_mib": mem / 1024, "events": len(events),
            "queries": len(local), "pods_matched": hits}


def overhead(args):
    import cache_router as cr

    sys.path.insert(0, str(ROOT / "crates" / "python" / "tests"))
    from engines import Engines

    out = {}
    engines = Engines()
    try:
        with cr.Router(engines.config()) as router:
            for key, content in (("pick", "What is a KV cache? " * 8), ("pick_word", "Hi")):
                msgs = [{"role": "user", "content": content}]

                def py_pick():
                    router.pick(messages=msgs).finish()

                for _ in range(200):
                    py_pick()
                # Single calls in adjacent pairs (one from Python, timed
                # around the call; one in Rust, timed inside), the overhead
                # the median of the pairs' differences: the machine's speed
                # drifts by more than the overhead between passes far apart.
                clock = time.perf_counter
                empty = min(-(clock() - clock()) for _ in range(1000))
                rust, py = [], []
                for _ in range(args.calls * args.repeats):
                    rust.append(router._bench_pick(content, 1))
                    t = clock()
                    py_pick()
                    py.append(clock() - t - empty)
                out[key] = (statistics.median(rust) * 1e6, statistics.median(py) * 1e6,
                            statistics.median(p - r for p, r in zip(py, rust)) * 1e6)
            # Apart, after: the async path's threads would otherwise share
            # the passes above.
            content = "What is a KV cache? " * 8
            hop = [router._bench_pick(content, args.calls, hop=True) for _ in range(args.repeats)]
            out["pick_hop"] = statistics.median(hop) * 1e6
    finally:
        engines.close()
    idx, q = match_index(args)
    as_list = q.tolist()
    for name, chain in (("match", q), ("match_list", as_list)):
        rust, py = [], []
        for _ in range(4 * args.repeats):
            rust.append(cr._native._bench_match(idx, chain, args.calls * 3))
            t = time.perf_counter()
            for _ in range(args.calls * 3):
                idx.match(chain)
            py.append((time.perf_counter() - t) / (args.calls * 3))
        out[name] = (statistics.median(rust) * 1e6, statistics.median(py) * 1e6,
                     statistics.median(p - r for p, r in zip(py, rust)) * 1e6)
    return out


def match_index(args):
    """Part 1's workload in one `cache_router.Index`, and the chain of its
    first prompt (64 blocks matching 16 pods with the defaults)."""
    import cache_router as cr
    import msgspec

    sys.path.insert(0, str(ROOT / "scripts"))
    import kv_publisher

    prompts, placement = workload(args)
    hasher = cr.BlockHasher(BS, model="m")
    idx = cr.Index(BS, model="m")
    Batch, Stored, _, _ = kv_publisher.structs(False)
    enc = msgspec.msgpack.Encoder()
    for w in range(args.workers):
        idx.join(f"w{w}")
    for p, workers in zip(prompts, placement):
        engine = [hash(("e", tuple(p[: (i + 1) * BS]))) & (2**63 - 1) for i in range(len(p) // BS)]
        for w in workers:
            ev = Stored(block_hashes=engine, parent_block_hash=None, token_ids=p, block_size=BS, lora_id=None,
                        medium="GPU", group_idx=0, kv_cache_spec_kind="full_attention")
            idx.apply(f"w{w}", enc.encode(Batch(ts=0.0, events=[ev])))
    return idx, hasher.hash_tokens(prompts[0])


def match_overhead(args):
    """`Index.match` alone, no engines: 9 passes of 20,000 calls, each less
    the same match looped in Rust, of the hasher's answer (a `Chain`, where
    the wheel has them) and of the same hashes in a list; then where a
    call's time goes (an empty chain, one block matching every holder, the
    whole chain). Run it with one wheel, then another, in turn, to compare
    two builds."""
    import timeit

    import cache_router as cr

    idx, q = match_index(args)
    n = 20000
    kinds = [("a list of ints", list(q))]
    if hasattr(cr, "Chain"):
        kinds.insert(0, ("a Chain", q))
    for kind, chain in kinds:
        ov = []
        for _ in range(9):
            r = cr._native._bench_match(idx, chain, n)
            t = time.perf_counter()
            for _ in range(n):
                idx.match(chain)
            ov.append((time.perf_counter() - t) / n - r)
        print(f"match overhead over {len(q)} blocks as {kind}, {len(idx.match(q))} pods: "
              f"median {statistics.median(ov) * 1e6:.2f} us, fastest pass {min(ov) * 1e6:.2f} us")
    for name, chain in [("match([])", []), (f"match(1 block, {len(idx.match(q[:1]))} pods)", q[:1]),
                        (f"match({len(q)} blocks)", q)]:
        t = min(timeit.repeat(lambda: idx.match(chain), number=50000, repeat=5)) / 50000
        print(f"  {name}: {t * 1e6:.2f} us per call")


def main():
    ap = argparse.ArgumentParser(description="cache_router vs Dynamo's RadixTree, and the binding's overhead")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=4000)
    ap.add_argument("--blocks", type=int, default=64, help="blocks per prompt (16 tokens each)")
    ap.add_argument("--system-blocks", type=int, default=16)
    ap.add_argument("--groups", type=int, default=32, help="distinct system prompts")
    ap.add_argument("--replicas", type=int, default=2, help="workers holding each prompt")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000, help="picks per overhead pass")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--side", choices=["ours", "dynamo"], help=argparse.SUPPRESS)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--match-overhead", action="store_true",
                    help="only Index.match's overhead and its split (no Dynamo, no engines)")
    ap.add_argument("--overhead", action="store_true",
                    help="only the binding's overhead over the Rust calls (no Dynamo)")
    args = ap.parse_args()
    if args.match_overhead:
        match_overhead(args)
        return
    if args.overhead:
        print_overhead(overhead(args))
        return
    if args.side:
        print(json.dumps(side_ours(args) if args.side == "ours" else side_dynamo(args)))
        return
    argv = [a for a in sys.argv[1:] if a != "--skip-overhead"]
    res = {}
    for side in ("ours", "dynamo"):
        out = subprocess.run([sys.executable, __file__, "--side", side] + argv, capture_output=True, text=True,
                             timeout=1800)
        if out.returncode != 0:
            sys.exit(f"{side} failed:\n{out.stderr}")
        res[side] = json.loads(out.stdout.strip().splitlines()[-1])
    o, d = res["ours"], res["dynamo"]
    print(f"workload: {args.workers} workers, {args.prompts} prompts of {args.blocks} blocks "
          f"({args.system_blocks} shared by {args.groups} groups), each on {args.replicas} workers: "
          f"{o['events']} stored events, {o['queries']} queries")
    print(f"| per call | cache_router | dynamo RadixTree | ratio |\n|---|---|---|---|")
    for k, name, unit in [("apply_us", "apply one event batch", "us"), ("match_us", "match one prompt", "us"),
                          ("rss_mib", "index memory (RSS added)", "MiB")]:
        print(f"| {name} | {o[k]:.2f} {unit} | {d[k]:.2f} {unit} | {d[k] / max(o[k], 1e-9):.1f}x |")
    print(f"pods matched (sum over queries): cache_router {o['pods_matched']}, dynamo {d['pods_matched']}")
    if not args.skip_overhead:
        print_overhead(overhead(args))


def print_overhead(ov):
    print("pick: medians of single calls in adjacent pairs; match: of 20 passes in adjacent pairs; "
          "overhead: the median of the pairs' differences")
    print("| call | Rust loop | from Python | overhead |\n|---|---|---|---|")
    for k, name in (("pick", "pick (a 40-word message)"), ("pick_word", "pick (a one-word message)"),
                    ("match", "match (a Chain)"), ("match_list", "match (a list of ints)")):
        r, p, d = ov[k]
        print(f"| {name} | {r:.2f} us | {p:.2f} us | {d:.2f} us |")
    print(f"the Rust loop of the async pick (its tokenizing on the router's threads): {ov['pick_hop']:.2f} us")

if __name__ == "__main__":
    main()
