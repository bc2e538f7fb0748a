"""Type stubs of the native module (PyO3, crates/python/src/lib.rs)."""

from os import PathLike
from types import TracebackType
from typing import Any, Iterable, Iterator, Optional, Sequence, Union, overload

__version__: str

Json = Any
StrPath = Union[str, "PathLike[str]"]

class CacheRouterError(Exception):
    """An error from cache-router, with the Rust message."""

class Tokenizer:
    """A model's tokenizer, encoding prompts exactly as the Router does."""

    @staticmethod
    def from_dir(path: StrPath) -> "Tokenizer":
        """Loads tokenizer.json (and tokenizer_config.json) from a model directory."""
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def encode_chat(
        self,
        messages: Sequence[dict[str, Json]],
        add_generation_prompt: bool = True,
        *,
        tools: Optional[Sequence[dict[str, Json]]] = None,
        chat_template_kwargs: Optional[dict[str, Json]] = None,
        continue_final_message: Optional[str] = None,
        sanitize_control_tokens: bool = False,
    ) -> list[int]:
        """Token ids of a chat rendered by the model's chat template.

        With sanitize_control_tokens, control tokens inside message text are
        encoded as plain text."""
    def render_chat(
        self,
        messages: Sequence[dict[str, Json]],
        add_generation_prompt: bool = True,
        *,
        tools: Optional[Sequence[dict[str, Json]]] = None,
        chat_template_kwargs: Optional[dict[str, Json]] = None,
        continue_final_message: Optional[str] = None,
    ) -> str: ...
    def prompt_tokens(self, body: dict[str, Json], api: str = "chat", sanitize_control_tokens: bool = False) -> list[int]:
        """The prompt's ids for an OpenAI request body; api is "chat" or "completions"."""
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def model_max_length(self) -> Optional[int]: ...

class Chain(Sequence[int]):
    """Block hashes held natively: an immutable sequence of ints that
    Index.match reads without converting. Equal to any sequence of the same
    ints; hashes as their tuple; pickles."""

    def __init__(self, hashes: Optional[Iterable[int]] = None) -> None: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> "Chain": ...
    def __iter__(self) -> Iterator[int]: ...
    def __contains__(self, h: object) -> bool: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def tolist(self) -> list[int]: ...

class BlockHasher:
    """Cumulative block hashes of token ids in a (model, LoRA, salt) namespace."""

    def __init__(
        self,
        block_size: int = 16,
        model: Optional[str] = None,
        lora_name: Optional[str] = None,
        cache_salt: Optional[str] = None,
    ) -> None: ...
    @property
    def block_size(self) -> int: ...
    def root(self) -> int:
        """The namespace's root hash (the parent of block 0)."""
    def hash_tokens(self, tokens: Sequence[int], extras: Optional[Sequence[tuple[int, int, int]]] = None) -> Chain:
        """One hash per full block; extras are (start, end, key) token spans."""

class Index:
    """Which pod holds which block, fed by engine event batches."""

    def __init__(
        self,
        block_size: int = 16,
        model: Optional[str] = None,
        lora_name: Optional[str] = None,
        cache_salt: Optional[str] = None,
    ) -> None: ...
    def join(self, endpoint: str, dp_rank: int = 0) -> None: ...
    def leave(self, endpoint: str, dp_rank: int = 0) -> bool: ...
    def apply(self, endpoint: str, payload: bytes, dp_rank: int = 0) -> int:
        """Applies one ZeroMQ event batch (msgpack bytes); returns its event count."""
    def needs_resync(self, endpoint: str, dp_rank: int = 0) -> bool:
        """Whether the pod missed events (a stored block with an unknown parent)."""
    def match(self, hashes: Union[Chain, Sequence[int]]) -> list[tuple[str, int, int]]:
        """(endpoint, dp_rank, blocks) of every pod holding a prefix, longest
        first. A Chain is read as it is; a list or other sequence of ints is
        converted first."""
    def match_tokens(self, tokens: Sequence[int]) -> list[tuple[str, int, int]]: ...
    def hash_tokens(self, tokens: Sequence[int]) -> Chain: ...
    def pods(self) -> list[tuple[str, int]]: ...
    def stats(self) -> dict[str, int]: ...

class Pick:
    """One decision: report the first token, cached tokens, then finish."""

    @property
    def pod(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def predicted_cached_tokens(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def finished(self) -> bool: ...
    def first_token(self) -> None: ...
    def cached_tokens(self, cached: int) -> None: ...
    def finish(self, ok: bool = True) -> None: ...
    def __enter__(self) -> "Pick": ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException] = None,
        tb: Optional[TracebackType] = None,
    ) -> bool: ...

class Router:
    """The library router, from a config file's text (TOML)."""

    def __init__(self, config: str, base_dir: Optional[StrPath] = None) -> None: ...
    @staticmethod
    def from_file(path: StrPath) -> "Router": ...
    @property
    def model(self) -> str: ...
    def pick(
        self,
        *,
        messages: Optional[Sequence[dict[str, Json]]] = None,
        prompt: Union[str, Sequence[int], None] = None,
        body: Optional[dict[str, Json]] = None,
        api: Optional[str] = None,
        model: Optional[str] = None,
        session: Optional[str] = None,
        max_tokens: Optional[int] = None,
    ) -> Pick: ...
    def add_pod(
        self,
        name: str,
        url: str,
        events: Optional[str] = None,
        replay: Optional[str] = None,
        topic: str = "",
        role: str = "both",
    ) -> None: ...
    def remove_pod(self, name: str) -> bool: ...
    def pods(self) -> list[dict[str, Json]]: ...
    def health(self) -> dict[str, Any]: ...
    def metrics_text(self) -> str: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Router": ...
    def __exit__(self, *exc: object) -> bool: ...
    def _bench_pick(self, content: str, n: int, hop: bool = False) -> float: ...

def _bench_match(index: Index, hashes: Union[Chain, Sequence[int]], n: int) -> float: ...
