#!/usr/bin/env python3
"""A KV-cache event publisher speaking vLLM's wire protocol, for tests.

It plays N engine data-parallel ranks. Each has a ZeroMQ PUB socket sending
multipart [topic, seq (8-byte big-endian, from 0), payload (msgpack)] and a
ROUTER replay socket answering a DEALER's ["", start_seq] with every buffered
batch from start_seq on, then an end marker. Payloads are encoded with
msgspec from structs that follow vLLM 0.33's `vllm/distributed/kv_events.py`
field for field: the map encoding (tagged maps, vLLM >= 0.24 and SGLang) or
the older array encoding (vLLM <= 0.23).

On start it prints one JSON line with the endpoints, then reads JSON
commands from stdin, one per line:

  {"op": "batch", "pod": 0, "events": [...], "drop": false}
      events: {"kind": "stored", "hashes": [..], "parent": null,
               "tokens": [..], "block_size": 4, "medium": "GPU",
               "lora_name": null, "group_idx": 0,
               "kv_cache_spec_kind": "full_attention"}
              {"kind": "removed", "hashes": [..], "medium": "GPU"}
              {"kind": "cleared"}
      drop: buffer the batch for replay but do not send it (a lost message)
  {"op": "raw", "pod": 0, "payload_hex": ".."}    a garbage payload, next seq
  {"op": "frames", "pod": 0, "frames_hex": [..]}  arbitrary frames, no seq
  {"op": "restart", "pod": 0}   the engine restarts: its publisher is closed
                                 and bound again on the same port, its
                                 sequence starts from 0, its buffer is empty
  {"op": "sync"}                                  prints "ok" when done
  {"op": "quit"}

SGLang publishes the same map encoding with its own media names
("GPU", "CPU_PINNED", "DISK", "EXTERNAL"); give those as "medium".

Flags: --pods N, --encoding map|array, --buffer K (replay buffer per pod),
--replay-layout new|old (["", topic, seq, payload] or ["", seq, payload]),
--topic T.
"""

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Optional, Union

import msgspec
import zmq

END = (2**64 - 1).to_bytes(8, "big")
ExternalBlockHash = Union[bytes, int]


def structs(array_like: bool):
    """vLLM 0.33's event structs, in the chosen encoding."""

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]

    class KVEventBatch(EventBatch):
        data_parallel_rank: Optional[int] = None

    if array_like:
        base = dict(array_like=True, omit_defaults=True, gc=False, tag=True)
    else:
        base = dict(omit_defaults=False, gc=False, tag=True, tag_field="type")

    class KVCacheEvent(msgspec.Struct, **base):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        parent_block_hash: Optional[ExternalBlockHash]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str] = None
        extra_keys: Optional[list[Optional[Any]]] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[ExternalBlockHash]
        medium: Optional[str]
        group_idx: Optional[int] = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=1)
    ap.add_argument("--encoding", choices=["map", "array"], default="map")
    ap.add_argument("--buffer", type=int, default=10000)
    ap.add_argument("--replay-layout", choices=["new", "old"], default="new")
    ap.add_argument("--topic", default="kv-events")
    args = ap.parse_args()
    Batch, Stored, Removed, Cleared = structs(args.encoding == "array")
    enc = msgspec.msgpack.Encoder()
    topic = args.topic.encode()
    ctx = zmq.Context()
    pubs, routers, endpoints = [], [], []
    for _ in range(args.pods):
        pub = ctx.socket(zmq.PUB)
        p = pub.bind_to_random_port("tcp://127.0.0.1")
        router = ctx.socket(zmq.ROUTER)
        r = router.bind_to_random_port("tcp://127.0.0.1")
        pubs.append(pub)
        routers.append(router)
        endpoints.append({"pub": f"tcp://127.0.0.1:{p}", "replay": f"tcp://127.0.0.1:{r}"})
    buffers = [[] for _ in range(args.pods)]
    seqs = [0] * args.pods
    lock = threading.Lock()

    def serve_replay(i):
        router = routers[i]
        while True:
            try:
                frames = router.recv_multipart()
            except zmq.ContextTerminated:
                return
            ident, start = frames[0], int.from_bytes(frames[-1], "big")
            with lock:
                items = [(s, p) for s, p in buffers[i] if s >= start]
            for s, p in items:
                if args.replay_layout == "new":
                    router.send_multipart([ident, b"", topic, s.to_bytes(8, "big"), p])
                else:
                    router.send_multipart([ident, b"", s.to_bytes(8, "big"), p])
            if args.replay_layout == "new":
                router.send_multipart([ident, b"", b"", END, b""])
            else:
                router.send_multipart([ident, END, b""])

    for i in range(args.pods):
        threading.Thread(target=serve_replay, args=(i,), daemon=True).start()
    print(json.dumps({"pods": endpoints}), flush=True)

    def event(e):
        if e["kind"] == "stored":
            return Stored(
                block_hashes=e["hashes"], parent_block_hash=e.get("parent"),
                token_ids=e["tokens"], block_size=e.get("block_size", 16), lora_id=None,
                medium=e.get("medium", "GPU"), lora_name=e.get("lora_name"),
                extra_keys=e.get("extra_keys"), group_idx=e.get("group_idx", 0),
                kv_cache_spec_kind=e.get("kv_cache_spec_kind", "full_attention"))
        if e["kind"] == "removed":
            return Removed(block_hashes=e["hashes"], medium=e.get("medium", "GPU"),
                           group_idx=e.get("group_idx", 0))
        return Cleared()

    def next_seq(i):
        with lock:
            s = seqs[i]
            seqs[i] += 1
            return s

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "sync":
            print("ok", flush=True)
            continue
        i = cmd.get("pod", 0)
        if op == "batch":
            payload = enc.encode(Batch(ts=time.time(), events=[event(e) for e in cmd["events"]],
                                       data_parallel_rank=i))
            s = next_seq(i)
            with lock:
                buffers[i].append((s, payload))
                del buffers[i][:-args.buffer]
            if not cmd.get("drop"):
                pubs[i].send_multipart([topic, s.to_bytes(8, "big"), payload])
        elif op == "restart":
            endpoint = endpoints[i]["pub"]
            pubs[i].close(linger=0)
            for _ in range(100):
                try:
                    pub = ctx.socket(zmq.PUB)
                    pub.bind(endpoint)
                    break
                except zmq.ZMQError:
                    pub.close(linger=0)
                    time.sleep(0.02)
            pubs[i] = pub
            with lock:
                seqs[i] = 0
                buffers[i].clear()
        elif op == "raw":
            s = next_seq(i)
            pubs[i].send_multipart([topic, s.to_bytes(8, "big"), bytes.fromhex(cmd["payload_hex"])])
        elif op == "frames":
            pubs[i].send_multipart([bytes.fromhex(f) for f in cmd["frames_hex"]])
    # The replay threads sit in recv(); destroying the context under them
    # can hang, so leave at once (the OS closes the sockets).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
