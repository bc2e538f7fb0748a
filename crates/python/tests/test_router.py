"""The library Router from Python, in front of the bundled simulated
engines (real HTTP, real ZeroMQ KV events): picks, feedback, metrics."""

import re
import threading
import time

import pytest

import cache_router as cr
from engines import Engines, cached_tokens, chat


@pytest.fixture(scope="module")
def engines():
    e = Engines()
    yield e
    e.close()


def total(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def converse(router, messages):
    """One turn as a proxy does it: pick, send to the pick's URL, report."""
    with router.pick(messages=messages, session="s1") as pick:
        response = chat(pick.url, messages)
        pick.first_token()
        pick.cached_tokens(cached_tokens(response))
    assert pick.finished
    return pick, response


def test_a_conversation_returns_to_the_pod_that_holds_its_history(engines):
    with cr.Router(engines.config()) as router:
        assert router.model == "Qwen/Qwen3-0.6B"
        assert {p["name"] for p in router.pods()} == {p["name"] for p in engines.pods}
        messages = [{"role": "user", "content": "Tell me about the history of the printing press. " * 20}]
        first, response = converse(router, messages)
        assert first.prompt_tokens > 100
        assert first.url in {p["url"] for p in engines.pods}
        messages += [
            {"role": "assistant", "content": response["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And then?"},
        ]
        # The engine's stored events reach the index asynchronously: wait
        # (bounded) until the router predicts the history it holds.
        deadline = time.monotonic() + 20
        while True:
            pick = router.pick(messages=messages)
            predicted = pick.predicted_cached_tokens
            pick.finish()
            if predicted > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert predicted >= 64, predicted
        second, response = converse(router, messages)
        assert second.pod == first.pod
        assert cached_tokens(response) >= 64
        m = router.metrics_text()
        assert total(m, "cache_router_prompt_tokens_total") >= first.prompt_tokens + second.prompt_tokens
        assert total(m, "cache_router_actual_cached_tokens_total") >= 64
        assert total(m, "cache_router_predicted_cached_tokens_total") >= 64


def test_pick_accepts_prompts_bodies_and_token_ids(engines):
    with cr.Router(engines.config()) as router:
        for kwargs in [
            {"prompt": "Once upon a time"},
            {"prompt": [1, 2, 3, 4, 5]},
            {"body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}},
            {"body": {"prompt": "hello"}, "api": "completions"},
        ]:
            with router.pick(**kwargs) as p:
                assert p.pod and p.url.startswith("http://127.0.0.1:"), kwargs
                assert p.prompt_tokens > 0
        with pytest.raises(cr.CacheRouterError, match="exactly one"):
            router.pick()
        with pytest.raises(cr.CacheRouterError, match="exactly one"):
            router.pick(prompt="a", messages=[])
        with pytest.raises(cr.CacheRouterError):
            router.pick(messages="not a list")
        with pytest.raises(cr.CacheRouterError):
            router.pick(body={"prompt": "x"}, api="embeddings")


def test_pods_join_and_leave(engines):
    first, rest = engines.pods[0], engines.pods[1:]
    with cr.Router(engines.config(pods=rest)) as router:
        assert first["name"] not in {p["name"] for p in router.pods()}
        router.add_pod(first["name"], first["url"], events=first["events"], replay=first["replay"], topic=first["topic"])
        assert first["name"] in {p["name"] for p in router.pods()}
        with pytest.raises(cr.CacheRouterError):
            router.add_pod(first["name"], first["url"])  # the name is taken
        with pytest.raises(cr.CacheRouterError):
            router.add_pod("x", "http://127.0.0.1:1", role="janitor")
        assert router.remove_pod(first["name"]) is True
        assert router.remove_pod(first["name"]) is False
        for _ in range(20):
            with router.pick(prompt="where to?") as p:
                assert p.pod != first["name"]


def test_an_unfinished_pick_frees_its_load_and_a_failed_one_counts(engines):
    with cr.Router(engines.config()) as router:
        p = router.pick(prompt="a")
        del p  # dropped unfinished: ends as failed, the load is released
        with pytest.raises(RuntimeError):
            with router.pick(prompt="b"):
                raise RuntimeError("the engine went away")
        held = router.pick(prompt="c")
        assert total(router.metrics_text(), "cache_router_pod_in_flight") == 1
        held.finish()
        held.finish()  # idempotent
        assert held.finished
        assert total(router.metrics_text(), "cache_router_pod_in_flight") == 0


def test_a_closed_router_and_a_bad_config_raise(engines, tmp_path):
    router = cr.Router(engines.config())
    router.close()
    router.close()
    with pytest.raises(cr.CacheRouterError, match="closed"):
        router.pick(prompt="x")
    with pytest.raises(cr.CacheRouterError):
        cr.Router("[gateway]\nmodel = 3\n")
    with pytest.raises(cr.CacheRouterError):
        cr.Router("not toml [")
    with pytest.raises(cr.CacheRouterError):
        cr.Router.from_file(tmp_path / "missing.toml")
    path = tmp_path / "router.toml"
    path.write_text(engines.config())
    with cr.Router.from_file(path) as r:
        assert r.health()["pods"] == len(engines.pods)


def test_picks_run_concurrently_from_threads(engines):
    """The GIL is released while Rust routes: picks from many threads all
    complete, and every pick's load is released at the end."""
    with cr.Router(engines.config()) as router:
        errors = []

        def worker(i):
            try:
                for j in range(25):
                    with router.pick(prompt=f"thread {i} request {j} " * 8, session=str(i)):
                        pass
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
        assert all(not t.is_alive() for t in threads)
        m = router.metrics_text()
        assert total(m, "cache_router_decision_seconds_count") == 8 * 25
        assert total(m, "cache_router_pod_in_flight") == 0
