"""cache-router from Python: route LLM requests to the pod that holds the
longest cached KV prefix of the prompt.

- ``Tokenizer``: a model's tokenizer with the router's prompt handling.
- ``BlockHasher``: cumulative block-hash chains of token ids, as ``Chain``
  objects (immutable sequences of ints held natively, which ``Index.match``
  reads without converting them).
- ``Index``: which pod holds which block, fed by the engines' KV event
  batches (vLLM's or SGLang's ZeroMQ msgpack bytes); longest prefix per pod.
- ``Router``: the library router built from a config file; ``pick`` decides
  where a request goes and returns a ``Pick`` to report back on.

Calls that can take long (tokenizing, hashing, applying events, picking,
matching a chain of over 1,024 blocks) release the GIL while Rust works;
errors raise ``CacheRouterError`` with the Rust message.
"""

from ._native import (
    BlockHasher,
    CacheRouterError,
    Chain,
    Index,
    Pick,
    Router,
    Tokenizer,
    __version__,
)

__all__ = [
    "BlockHasher",
    "CacheRouterError",
    "Chain",
    "Index",
    "Pick",
    "Router",
    "Tokenizer",
    "__version__",
]
