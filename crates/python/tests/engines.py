"""The simulated engines of the bundled command (`cache-router --listen`):
vLLM-compatible HTTP servers that publish real KV events on ZeroMQ."""

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODEL = "Qwen/Qwen3-0.6B"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engines:
    """Starts the bundled command's engines and lists them as [[pods]]."""

    def __init__(self):
        binary = Path(os.environ.get("CACHE_ROUTER_BIN", ROOT / "target" / "debug" / "cache-router"))
        if not binary.exists():
            raise RuntimeError(f"{binary} is missing: run `cargo build -p cache-router-cli` first")
        port = free_port()
        self.log = open(ROOT / "target" / f"pytest-engines-{port}.log", "wb")
        self.proc = subprocess.Popen([str(binary), "--listen", f"127.0.0.1:{port}"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the simulated engines did not start")
            time.sleep(0.1)
        self.pods = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/pods", timeout=5))

    def config(self, pods=None) -> str:
        return config_of(self.pods if pods is None else pods)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def config_of(pods) -> str:
    """A router config (the gateway's TOML) with `pods` as its [[pods]]."""
    tok = ROOT / "assets" / "tokenizers" / "qwen3"
    out = [f'[gateway]\nmodel = "{MODEL}"\ntokenizer = "{tok}"\n']
    for p in pods:
        out.append(
            f'[[pods]]\nname = "{p["name"]}"\nurl = "{p["url"]}"\nevents = "{p["events"]}"\n'
            f'replay = "{p["replay"]}"\ntopic = "{p["topic"]}"\n'
        )
    return "\n".join(out)


def gateway_pods(port: int) -> list:
    """The pods of a running `cache-router --listen` (its admin API)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no gateway answered on port {port}")
        time.sleep(0.1)
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/pods", timeout=5))


def chat(url: str, messages, max_tokens=8) -> dict:
    """One chat completion from an engine, as a proxy would send it."""
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def cached_tokens(response: dict) -> int:
    usage = response.get("usage") or {}
    return ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0


if __name__ == "__main__":
    # `python engines.py PORT`: the config of a running `cache-router --listen`.
    import sys

    print(config_of(gateway_pods(int(sys.argv[1]))))
