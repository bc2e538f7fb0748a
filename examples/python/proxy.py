#!/usr/bin/env python3
"""A cache-aware proxy for vLLM in Python, on the cache_router package.

    pip install ./crates/python
    python examples/python/proxy.py my-router.toml --listen 127.0.0.1:8080

The config is the gateway's (`[gateway]` keys, the engines as `[[pods]]`).
Each POST to /v1/chat/completions or /v1/completions is routed by
`Router.pick` to the pod holding the longest cached prefix of its prompt,
balanced against load; the request goes there unchanged and the engine's
answer (whole or streamed) comes back byte for byte. The proxy reports the
first token and the engine's `cached_tokens` to the pick, so the router's
metrics (GET /metrics) compare what it predicted with what the engine did.

Standard library only (asyncio): one connection per request (the proxy
answers with `Connection: close`), bounded header and body sizes, timeouts
on slow clients and engines, at most --max-connections at once.
"""

import argparse
import asyncio
import json
import re
import sys
from urllib.parse import urlsplit

import cache_router

MAX_HEADER = 64 * 1024
MAX_BODY = 16 * 1024 * 1024
CLIENT_TIMEOUT = 30.0
ENGINE_TIMEOUT = 600.0
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')


def reply(status: int, reason: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


def error(status: int, reason: str, message: str) -> bytes:
    body = {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error", "code": status}}
    return reply(status, reason, json.dumps(body).encode())


class Proxy:
    def __init__(self, router: cache_router.Router, max_connections: int):
        self.router = router
        self.slots = asyncio.Semaphore(max_connections)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        async with self.slots:
            try:
                await self.serve(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass  # the client went away
            except asyncio.TimeoutError:
                writer.write(error(408, "Request Timeout", "the request was not sent in time"))
            finally:
                try:
                    await writer.drain()
                except ConnectionError:
                    pass
                writer.close()

    async def serve(self, reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLIENT_TIMEOUT)
        except asyncio.LimitOverrunError:
            writer.write(error(431, "Request Header Fields Too Large", "headers over 64 KiB"))
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            writer.write(error(400, "Bad Request", "malformed request line"))
            return
        method, target, _ = parts
        headers = {}
        for line in lines[1:]:
            if line:
                name, sep, value = line.partition(":")
                if not sep:
                    writer.write(error(400, "Bad Request", "malformed header"))
                    return
                headers[name.strip().lower()] = value.strip()
        path = target.split("?", 1)[0]
        if method == "GET" and path == "/metrics":
            writer.write(reply(200, "OK", self.router.metrics_text().encode(), "text/plain; version=0.0.4"))
            return
        if method == "GET" and path == "/health":
            h = self.router.health()
            ok = h["answering"] > 0 or not h["probed"]
            writer.write(reply(200 if ok else 503, "OK" if ok else "Service Unavailable", json.dumps(h).encode()))
            return
        api = ROUTES.get(path)
        if api is None or method != "POST":
            writer.write(error(404, "Not Found", f"no route for {method} {path}"))
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            writer.write(error(411, "Length Required", "send the body with content-length"))
            return
        try:
            length = int(headers.get("content-length", ""))
        except ValueError:
            writer.write(error(411, "Length Required", "content-length is required"))
            return
        if not 0 <= length <= MAX_BODY:
            writer.write(error(413, "Payload Too Large", "bodies are limited to 16 MiB"))
            return
        raw = await asyncio.wait_for(reader.readexactly(length), CLIENT_TIMEOUT)
        try:
            body = json.loads(raw)
        except ValueError as e:
            writer.write(error(400, "Bad Request", f"the body is not JSON: {e}"))
            return
        if not isinstance(body, dict):
            writer.write(error(400, "Bad Request", "the body must be a JSON object"))
            return
        loop = asyncio.get_running_loop()
        try:
            # Tokenizing and deciding release the GIL: run them off the loop.
            pick = await loop.run_in_executor(None, lambda: self.router.pick(body=body, api=api))
        except cache_router.CacheRouterError as e:
            writer.write(error(400, "Bad Request", str(e)))
            return
        ok = False
        try:
            ok = await self.forward(pick, target, raw, writer)
        finally:
            pick.finish(ok=ok)

    async def forward(self, pick, target, raw, writer) -> bool:
        """Sends the request to the pick's pod and relays the answer; true
        if the engine answered 2xx in full."""
        url = urlsplit(pick.url)
        base = url.path.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(url.hostname, url.port or 80), CLIENT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as e:
            writer.write(error(502, "Bad Gateway", f"pod {pick.pod} unreachable: {e}"))
            return False
        sent = False
        try:
            up_w.write(
                f"POST {base}{target} HTTP/1.1\r\nhost: {url.netloc}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(raw)}\r\nconnection: close\r\n\r\n".encode()
                + raw
            )
            await up_w.drain()
            head = await asyncio.wait_for(up_r.readuntil(b"\r\n\r\n"), ENGINE_TIMEOUT)
            status = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"502"
            # The engine's headers pass through, but this connection closes.
            kept = [h for h in head.split(b"\r\n")[1:] if h and not h.lower().startswith((b"connection:", b"keep-alive:"))]
            writer.write(head.split(b"\r\n", 1)[0] + b"\r\n" + b"".join(h + b"\r\n" for h in kept))
            writer.write(b"x-cache-router-pod: " + pick.pod.encode() + b"\r\nconnection: close\r\n\r\n")
            sent = True
            tail, first = b"", True
            while True:
                chunk = await asyncio.wait_for(up_r.read(65536), ENGINE_TIMEOUT)
                if not chunk:
                    break
                if first:
                    pick.first_token()
                    first = False
                writer.write(chunk)
                await writer.drain()
                tail = (tail + chunk)[-4096:]  # usage comes last: keep a bounded tail
            found = CACHED.findall(tail)
            if found:
                pick.cached_tokens(int(found[-1]))
            return status.startswith(b"2")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as e:
            if not sent:  # else the client sees the answer cut short
                writer.write(error(502, "Bad Gateway", f"pod {pick.pod} failed: {e!r}"))
            return False
        finally:
            up_w.close()


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="the router's config file (TOML, the gateway's format)")
    ap.add_argument("--listen", default="127.0.0.1:8080", help="host:port to serve on")
    ap.add_argument("--max-connections", type=int, default=256)
    args = ap.parse_args()
    host, _, port = args.listen.rpartition(":")
    with cache_router.Router.from_file(args.config) as router:
        proxy = Proxy(router, args.max_connections)
        server = await asyncio.start_server(proxy.handle, host or "127.0.0.1", int(port), limit=MAX_HEADER)
        print(f"cache_router {cache_router.__version__} proxy on http://{args.listen} for {router.model}", flush=True)
        async with server:
            await server.serve_forever()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(0)
