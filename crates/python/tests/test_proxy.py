"""examples/python/proxy.py: a real chat through it reaches an engine and
its cached tokens reach the router; bad HTTP gets a clear status, not a hang
or a crash. (CI also runs the load generator through it.)"""

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from engines import ROOT, Engines, free_port


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    engines = Engines()
    cfg = tmp_path_factory.mktemp("proxy") / "router.toml"
    cfg.write_text(engines.config())
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "python" / "proxy.py"), str(cfg), "--listen", f"127.0.0.1:{port}"]
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the proxy did not start"
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        engines.close()


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def post(port, body: dict):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.headers, json.load(r)


def metric(port, name):
    t = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", t, re.M))


def test_a_chat_goes_through_and_its_cache_hits_are_reported(proxy):
    messages = [{"role": "user", "content": "Summarise the causes of the French revolution. " * 30}]
    body = {"model": "Qwen/Qwen3-0.6B", "messages": messages, "max_tokens": 8}
    headers, first = post(proxy, body)
    pod = headers["x-cache-router-pod"]
    assert first["choices"][0]["message"]["content"]
    cached = 0
    for _ in range(100):  # the engine's events reach the index asynchronously
        headers, again = post(proxy, body)
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        if headers["x-cache-router-pod"] == pod and cached > 0:
            break
        time.sleep(0.05)
    assert headers["x-cache-router-pod"] == pod and cached >= 128
    assert metric(proxy, "cache_router_actual_cached_tokens_total") >= cached
    assert metric(proxy, "cache_router_pod_in_flight") == 0


def test_streamed_answers_pass_through(proxy):
    body = {
        "model": "Qwen/Qwen3-0.6B",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    data = json.dumps(body).encode()
    out = raw(proxy, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              + f"content-length: {len(data)}\r\n\r\n".encode() + data)
    assert out.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" in out and b'"usage"' in out


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"garbage\r\n\r\n", b"400"),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /v1/chat/completions HTTP/1.1\r\n\r\n", b"411"),
        (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 99999999999\r\n\r\n", b"413"),
        (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 5\r\n\r\n{oops", b"400"),
        (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n[]", b"400"),
        (b'POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 14\r\n\r\n{"messages":1}', b"400"),
        (b"POST /v1/chat/completions HTTP/1.1\r\n" + b"x-big: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
    ],
)
def test_bad_http_gets_a_clear_status(proxy, request_bytes, status):
    out = raw(proxy, request_bytes)
    assert out.split(b" ", 2)[1] == status, out[:200]
    # And the proxy still serves.
    assert urllib.request.urlopen(f"http://127.0.0.1:{proxy}/health", timeout=5).status == 200
