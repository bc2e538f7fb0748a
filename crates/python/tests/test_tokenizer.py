"""Token ids and chat prompts from Python equal the reference stack's
(transformers + tokenizers + jinja2), as recorded in the parity golden files
that the Rust tests also check."""

import pytest

import cache_router as cr
from conftest import golden


@pytest.fixture(scope="module", params=["gpt2", "qwen3"])
def model(request, tokenizers):
    return request.param, cr.Tokenizer.from_dir(tokenizers / request.param)


def test_text_ids(model):
    name, tok = model
    cases = golden(f"parity_{name}.json")["text_cases"]
    assert len(cases) >= 20
    for case in cases:
        got = tok.encode(case["text"], add_special_tokens=case["add_special_tokens"])
        assert got == case["ids"], case["name"]


def chat_kwargs(case):
    kw = {"tools": case.get("tools"), "chat_template_kwargs": case.get("kwargs") or None}
    if case.get("continue_final_message"):
        kw["continue_final_message"] = case["continue_final_message"]
    return kw


def test_qwen3_chat_prompts_and_ids(tokenizers):
    tok = cr.Tokenizer.from_dir(tokenizers / "qwen3")
    cases = golden("parity_qwen3.json")["chat_cases"]
    assert len(cases) >= 12
    for case in cases:
        kw = chat_kwargs(case)
        gen = case["add_generation_prompt"]
        assert tok.render_chat(case["messages"], gen, **kw) == case["prompt"], case["name"]
        assert tok.encode_chat(case["messages"], gen, **kw) == case["ids"], case["name"]


def test_qwen3_sanitized_chats(tokenizers):
    tok = cr.Tokenizer.from_dir(tokenizers / "qwen3")
    cases = golden("parity_qwen3.json")["sanitize_cases"]
    assert len(cases) >= 6
    for case in cases:
        kw = chat_kwargs(case)
        gen = case["add_generation_prompt"]
        assert tok.encode_chat(case["messages"], gen, **kw) == case["unsanitized_ids"], case["name"]
        assert tok.encode_chat(case["messages"], gen, sanitize_control_tokens=True, **kw) == case["ids"], case["name"]


def test_prompt_tokens_of_request_bodies(tokenizers):
    tok = cr.Tokenizer.from_dir(tokenizers / "qwen3")
    messages = [{"role": "user", "content": "Hi there!"}]
    assert tok.prompt_tokens({"model": "m", "messages": messages}) == tok.encode_chat(messages)
    assert tok.prompt_tokens({"prompt": "Hello"}, api="completions") == tok.encode("Hello")
    assert tok.prompt_tokens({"prompt": [1, 2, 3]}, api="completions") == [1, 2, 3]
    assert tok.decode(tok.encode("Hello, world")) == "Hello, world"
    with pytest.raises(cr.CacheRouterError, match="prompt"):
        tok.prompt_tokens({"prompt": ["a", "b"]}, api="completions")
    with pytest.raises(cr.CacheRouterError, match="unknown api"):
        tok.prompt_tokens({"prompt": "x"}, api="embeddings")
    with pytest.raises(cr.CacheRouterError):
        tok.prompt_tokens({"prompt": [tok.vocab_size + 10]}, api="completions")


def test_missing_tokenizer_dir_raises(tmp_path):
    with pytest.raises(cr.CacheRouterError):
        cr.Tokenizer.from_dir(tmp_path / "nowhere")
