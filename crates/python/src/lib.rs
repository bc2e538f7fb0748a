//! cache-router from Python: the native module `cache_router._native`.
//!
//! Thin shells over the Rust crates, so that Python gets the same answers
//! as a Rust caller:
//!
//! - `Tokenizer`: a model's Hugging Face tokenizer with the router's
//!   prompt handling (`router-hash`, `router-service`'s `prompt_tokens`);
//! - `BlockHasher`: cumulative block-hash chains (`router-hash`), given as
//!   `Chain`s, the hashes held natively (an immutable sequence of ints to
//!   Python) so that a match converts nothing;
//! - `Index`: the bitmap index (`router-index`) fed by engine event
//!   batches in their ZeroMQ bytes (`router-events`);
//! - `Router`: the library router (`router-service`) with its own tokio
//!   runtime, and `Pick`, one decision and its feedback (decided on the
//!   caller's thread, `pick_blocking`).
//!
//! The GIL is released around tokenizing, hashing, event ingestion, picking
//! and matches of long chains (a short match costs less than the release);
//! errors raise `CacheRouterError` with the Rust message. Conversions of
//! Python objects to JSON are bounded in depth.
// PyO3's macros expand to code that trips these workspace lints.
#![allow(unsafe_op_in_unsafe_fn, clippy::useless_conversion)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyBytes, PyDict, PyFloat, PyInt, PyIterator, PyList, PySlice, PyString, PyTuple,
};
use router_core::{
    BlockHash, BlockHasher as _, Namespace, PodDirectory, PodKey, PrefixIndex, PrefixMatch,
};
use router_events::{Ingestor, decode_batch};
use router_hash::{ChainHasher, ChatInput, ExtraKey, ModelTokenizer};
use router_index::{Index as BitmapIndex, IndexConfig};
use router_service::{Api, Config, PodConfig, Request};
use serde_json::{Map, Value};

create_exception!(
    _native,
    CacheRouterError,
    PyException,
    "An error from cache-router, with the Rust message."
);

/// How deep a Python object converted to JSON may nest (a chat message is
/// three or four levels; this bounds the recursion on hostile input).
const MAX_DEPTH: usize = 64;

/// Chains longer than this give the GIL up while the index matches them.
const DETACH_ABOVE_BLOCKS: usize = 1024;

/// A block hash from a Python int: exact ints straight through CPython's
/// conversion (no `__index__` call, no new reference), anything else
/// through PyO3's checked one.
fn hash_of(h: &Bound<'_, PyAny>) -> PyResult<u64> {
    if h.is_exact_instance_of::<PyInt>() {
        // SAFETY: `h` is a live, exact `int` and the GIL is held.
        let v = unsafe { pyo3::ffi::PyLong_AsUnsignedLongLong(h.as_ptr()) };
        if v == u64::MAX
            && let Some(e) = PyErr::take(h.py())
        {
            return Err(e);
        }
        return Ok(v);
    }
    h.extract::<u64>()
}

fn err(e: impl std::fmt::Display) -> PyErr {
    CacheRouterError::new_err(e.to_string())
}

/// A Python object as JSON: dicts with string keys, lists and tuples,
/// strings, integers, floats, booleans and None.
fn to_json(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(err(format!("nested deeper than {MAX_DEPTH} levels")));
    }
    // Strings first: the leaves of a chat (roles, contents) are.
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_cow()?.into_owned()));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    // bool before int: Python's True is an int.
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        if let Ok(v) = i.extract::<i64>() {
            return Ok(Value::from(v));
        }
        return Ok(Value::from(i.extract::<u64>()?));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return serde_json::Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| err("a float that is not finite"));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut m = Map::new();
        for (k, v) in d.iter() {
            let k = k
                .cast::<PyString>()
                .map_err(|_| err("a dict key that is not a string"))?;
            m.insert(k.to_cow()?.into_owned(), to_json(&v, depth + 1)?);
        }
        return Ok(Value::Object(m));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return l.iter().map(|v| to_json(&v, depth + 1)).collect();
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t.iter().map(|v| to_json(&v, depth + 1)).collect();
    }
    Err(err(format!(
        "cannot send a {} as JSON",
        obj.get_type().name()?
    )))
}

/// JSON as a Python object.
fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let items = a
                .iter()
                .map(|x| to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

fn namespace(
    model: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
) -> Namespace {
    let mut ns = Namespace::default();
    ns.model = model;
    ns.lora_name = lora_name;
    ns.cache_salt = cache_salt;
    ns
}

/// A chain of block hashes held natively: what the hashers return and
/// [`Index.match`] reads without converting a thing. It behaves as an
/// immutable sequence of ints (length, indexing, slices, iteration,
/// equality with any sequence of the same ints, hashing as the tuple of
/// them, pickling).
#[pyclass(frozen, sequence, module = "cache_router._native")]
struct Chain {
    hashes: Vec<BlockHash>,
}

impl Chain {
    fn of(hashes: Vec<BlockHash>) -> Self {
        Chain { hashes }
    }

    fn ints(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.hashes.iter().map(|h| h.0)
    }
}

#[pymethods]
impl Chain {
    /// A chain of the ints of `hashes` (any iterable of ints of 64 bits).
    #[new]
    #[pyo3(signature = (hashes = None))]
    fn new(hashes: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(Chain::of(match hashes {
            Some(h) => hash_seq(h)?,
            None => Vec::new(),
        }))
    }

    fn __len__(&self) -> usize {
        self.hashes.len()
    }

    /// One hash by position (negative from the end), or a slice as a chain.
    fn __getitem__<'py>(&self, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = key.py();
        if let Ok(slice) = key.cast::<PySlice>() {
            let ix = slice.indices(self.hashes.len() as isize)?;
            let mut out = Vec::with_capacity(ix.slicelength);
            let mut i = ix.start;
            for _ in 0..ix.slicelength {
                out.push(self.hashes[i as usize]);
                i += ix.step;
            }
            return Ok(Bound::new(py, Chain::of(out))?.into_any());
        }
        let i: isize = key.extract()?;
        let n = self.hashes.len() as isize;
        let at = if i < 0 { i + n } else { i };
        if !(0..n).contains(&at) {
            return Err(PyIndexError::new_err("chain index out of range"));
        }
        Ok(self.hashes[at as usize].0.into_pyobject(py)?.into_any())
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        PyList::new(py, self.ints())?.into_any().try_iter()
    }

    fn __contains__(&self, h: &Bound<'_, PyAny>) -> bool {
        hash_of(h).is_ok_and(|h| self.hashes.contains(&BlockHash(h)))
    }

    /// Equal to another chain, or to any sequence (not a string) of the
    /// same ints in the same order.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(c) = other.cast::<Chain>() {
            return c.get().hashes == self.hashes;
        }
        if other.is_instance_of::<PyString>() || other.is_instance_of::<PyBytes>() {
            return false;
        }
        hash_seq(other).is_ok_and(|v| v == self.hashes)
    }

    /// The hash of the tuple of the same ints (equal objects hash alike).
    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        PyTuple::new(py, self.ints())?.hash()
    }

    fn __repr__(&self) -> String {
        let n = self.hashes.len();
        let show = |hs: &[BlockHash]| {
            hs.iter()
                .map(|h| h.0.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if n <= 6 {
            format!("Chain([{}])", show(&self.hashes))
        } else {
            format!(
                "Chain([{}, ... {} more ..., {}])",
                show(&self.hashes[..3]),
                n - 5,
                show(&self.hashes[n - 2..])
            )
        }
    }

    /// The hashes as a list of ints.
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.ints())
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyList>,))> {
        let py = slf.py();
        Ok((py.get_type::<Chain>().into_any(), (slf.get().tolist(py)?,)))
    }
}

/// Block hashes of a chain (as is), a list (the fast path) or any
/// iterable of ints.
fn hash_seq(hashes: &Bound<'_, PyAny>) -> PyResult<Vec<BlockHash>> {
    if let Ok(c) = hashes.cast::<Chain>() {
        return Ok(c.get().hashes.clone());
    }
    if let Ok(list) = hashes.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        let mut i = 0;
        // The length is read again each turn: a subclass's `__index__`
        // may shorten the list.
        while i < list.len() {
            // SAFETY: the GIL is held and `i` is below the list's length;
            // the borrowed item lives while the list holds it, and nothing
            // runs Python code before it is read (an exact int) or owned.
            let item = unsafe { pyo3::ffi::PyList_GetItem(list.as_ptr(), i as isize) };
            if item.is_null() {
                return Err(PyErr::fetch(list.py()));
            }
            // SAFETY: as above.
            let exact = unsafe { pyo3::ffi::PyLong_CheckExact(item) } != 0;
            let h = if exact {
                // SAFETY: an exact int, the GIL held; no Python code runs.
                let v = unsafe { pyo3::ffi::PyLong_AsUnsignedLongLong(item) };
                if v == u64::MAX
                    && let Some(e) = PyErr::take(list.py())
                {
                    return Err(e);
                }
                v
            } else {
                // SAFETY: a live item of the list; owned (a new reference)
                // before any Python code can run.
                let owned = unsafe { Bound::from_borrowed_ptr(list.py(), item) };
                hash_of(&owned)?
            };
            out.push(BlockHash(h));
            i += 1;
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    for h in hashes.try_iter()? {
        out.push(BlockHash(hash_of(&h?)?));
    }
    Ok(out)
}

/// A model's tokenizer (`tokenizer.json`, with `tokenizer_config.json`'s
/// chat template), encoding prompts exactly as the Router does.
#[pyclass(frozen, module = "cache_router._native")]
struct Tokenizer {
    inner: Arc<ModelTokenizer>,
}

#[pymethods]
impl Tokenizer {
    /// Loads the tokenizer files of a Hugging Face model directory.
    #[staticmethod]
    fn from_dir(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let inner = py.detach(|| ModelTokenizer::from_dir(&path)).map_err(err)?;
        Ok(Tokenizer {
            inner: Arc::new(inner),
        })
    }

    /// The token ids of `text`.
    #[pyo3(signature = (text, add_special_tokens = true))]
    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        py.detach(|| self.inner.encode(text, add_special_tokens))
            .map_err(err)
    }

    /// The token ids of a chat (a list of message dicts) rendered by the
    /// model's chat template, with the assistant turn opened.
    /// With `sanitize_control_tokens`, the template's control tokens inside
    /// message text are encoded as plain text, not as control tokens.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (messages, add_generation_prompt = true, *, tools = None, chat_template_kwargs = None, continue_final_message = None, sanitize_control_tokens = false))]
    fn encode_chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        add_generation_prompt: bool,
        tools: Option<&Bound<'_, PyAny>>,
        chat_template_kwargs: Option<&Bound<'_, PyAny>>,
        continue_final_message: Option<String>,
        sanitize_control_tokens: bool,
    ) -> PyResult<Vec<u32>> {
        let mut input = chat_input(
            messages,
            add_generation_prompt,
            tools,
            chat_template_kwargs,
            continue_final_message,
        )?;
        if sanitize_control_tokens {
            input = input.sanitized();
        }
        py.detach(|| self.inner.encode_chat(&input)).map_err(err)
    }

    /// The chat rendered by the model's template, as text.
    #[pyo3(signature = (messages, add_generation_prompt = true, *, tools = None, chat_template_kwargs = None, continue_final_message = None))]
    fn render_chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        add_generation_prompt: bool,
        tools: Option<&Bound<'_, PyAny>>,
        chat_template_kwargs: Option<&Bound<'_, PyAny>>,
        continue_final_message: Option<String>,
    ) -> PyResult<String> {
        let input = chat_input(
            messages,
            add_generation_prompt,
            tools,
            chat_template_kwargs,
            continue_final_message,
        )?;
        py.detach(|| self.inner.render_chat(&input)).map_err(err)
    }

    /// The prompt's token ids for an OpenAI request body (a dict), as the
    /// Router computes them: `api` is `"chat"` or `"completions"`.
    #[pyo3(signature = (body, api = "chat", sanitize_control_tokens = false))]
    fn prompt_tokens(
        &self,
        py: Python<'_>,
        body: &Bound<'_, PyAny>,
        api: &str,
        sanitize_control_tokens: bool,
    ) -> PyResult<Vec<u32>> {
        let api = parse_api(api)?;
        let body = to_json(body, 0)?;
        py.detach(|| {
            router_service::prompt_tokens(api, &body, &self.inner, sanitize_control_tokens)
        })
        .map_err(|e| err(format!("{}: {}", e.kind, e.message)))
    }

    /// The text of token ids.
    #[pyo3(signature = (ids, skip_special_tokens = false))]
    fn decode(&self, py: Python<'_>, ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        py.detach(|| self.inner.decode(&ids, skip_special_tokens))
            .map_err(err)
    }

    /// The vocabulary's size.
    #[getter]
    fn vocab_size(&self) -> u32 {
        self.inner.vocab_size()
    }

    /// The model's longest context (`model_max_length`), if it says.
    #[getter]
    fn model_max_length(&self) -> Option<u64> {
        self.inner.model_max_length()
    }
}

/// A chat as the template sees it: the messages, and optionally the tools
/// (a list), extra template variables (a dict, e.g. `enable_thinking`) and
/// the field of a final assistant message to continue rather than close.
fn chat_input(
    messages: &Bound<'_, PyAny>,
    add_generation_prompt: bool,
    tools: Option<&Bound<'_, PyAny>>,
    kwargs: Option<&Bound<'_, PyAny>>,
    continue_final_message: Option<String>,
) -> PyResult<ChatInput> {
    let Value::Array(messages) = to_json(messages, 0)? else {
        return Err(err("messages must be a list of dicts"));
    };
    let mut input = ChatInput::new(messages).with_generation_prompt(add_generation_prompt);
    if let Some(tools) = tools.filter(|t| !t.is_none()) {
        let Value::Array(tools) = to_json(tools, 0)? else {
            return Err(err("tools must be a list"));
        };
        input = input.with_tools(tools);
    }
    if let Some(kwargs) = kwargs.filter(|k| !k.is_none()) {
        let Value::Object(kwargs) = to_json(kwargs, 0)? else {
            return Err(err("chat_template_kwargs must be a dict"));
        };
        for (k, v) in kwargs {
            input = input.with_kwarg(k, v);
        }
    }
    if let Some(field) = continue_final_message {
        input = input.continue_final(field);
    }
    Ok(input)
}

fn parse_api(api: &str) -> PyResult<Api> {
    match api {
        "chat" => Ok(Api::Chat),
        "completions" => Ok(Api::Completions),
        other => Err(err(format!(
            "unknown api {other:?}: expected \"chat\" or \"completions\""
        ))),
    }
}

/// Cumulative block hashes of token ids: block `i`'s hash covers every
/// token up to the end of block `i`, in the namespace of a model, LoRA
/// adapter and cache salt. A trailing partial block gets no hash.
#[pyclass(frozen, module = "cache_router._native")]
struct BlockHasher {
    hasher: ChainHasher,
    namespace: Namespace,
}

#[pymethods]
impl BlockHasher {
    #[new]
    #[pyo3(signature = (block_size = 16, model = None, lora_name = None, cache_salt = None))]
    fn new(
        block_size: usize,
        model: Option<String>,
        lora_name: Option<String>,
        cache_salt: Option<String>,
    ) -> PyResult<Self> {
        Ok(BlockHasher {
            hasher: ChainHasher::new(block_size).map_err(err)?,
            namespace: namespace(model, lora_name, cache_salt),
        })
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.hasher.block_size()
    }

    /// The namespace's root hash (the parent of block 0).
    fn root(&self) -> u64 {
        self.hasher.root(&self.namespace).0
    }

    /// The chain of `tokens`; `extras` are `(start, end, key)` spans of
    /// token positions whose blocks also hash `key` (a multimodal input's
    /// content hash).
    #[pyo3(signature = (tokens, extras = None))]
    fn hash_tokens(
        &self,
        py: Python<'_>,
        tokens: Vec<u32>,
        extras: Option<Vec<(usize, usize, u64)>>,
    ) -> Chain {
        let extras: Vec<ExtraKey> = extras
            .unwrap_or_default()
            .into_iter()
            .map(|(s, e, k)| ExtraKey::new(s, e, k))
            .collect();
        py.detach(|| {
            let chain = if extras.is_empty() {
                self.hasher.chain(&self.namespace, &tokens)
            } else {
                self.hasher
                    .chain_with_extras(&self.namespace, &tokens, &extras)
            };
            Chain::of(chain)
        })
    }
}

/// A joined pod as a match answers it: its id, endpoint and rank.
type Named = (router_core::PodId, Py<PyString>, u32);

/// The ingestion side of an [`Index`]: engine hashes to router hashes.
type Ingest = Ingestor<ChainHasher, Arc<BitmapIndex>>;

/// The cache index: which pod holds which block, fed by the engines' KV
/// event batches, answering the longest cached prefix per pod.
///
/// Pods are named by their endpoint and data-parallel rank. Events are
/// applied in the order given, one pod's batches in their sequence.
#[pyclass(frozen, module = "cache_router._native")]
struct Index {
    index: Arc<BitmapIndex>,
    ingest: Mutex<Ingest>,
    hasher: ChainHasher,
    namespace: Namespace,
    /// The pods joined and not left, as `(endpoint, dp_rank)`.
    joined: Mutex<std::collections::BTreeSet<(String, u32)>>,
    /// By slot: each joined pod's id, its endpoint as a Python string (made
    /// once at join, so that answering a match makes no strings) and rank.
    names: Mutex<Vec<Option<Named>>>,
}

impl Index {
    fn pod(&self, endpoint: &str, dp_rank: u32) -> PyResult<router_core::PodId> {
        self.index
            .pod_id(&PodKey::new(endpoint, dp_rank))
            .ok_or_else(|| {
                err(format!(
                    "unknown pod {endpoint} (rank {dp_rank}): join it first"
                ))
            })
    }

    fn answer<'py>(&self, py: Python<'py>, m: &PrefixMatch) -> PyResult<Bound<'py, PyList>> {
        let names = self.names.lock();
        let mut rows = Vec::with_capacity(m.pods().len());
        for p in m.pods() {
            let known = names
                .get(usize::from(p.pod.slot()))
                .and_then(Option::as_ref)
                .filter(|(id, _, _)| *id == p.pod);
            let row = match known {
                Some((_, name, rank)) => (name.clone_ref(py).into_any(), *rank, p.blocks),
                // A pod left between the match and here: answered as the
                // index names it, if it still does.
                None => match self.index.pod_key(p.pod) {
                    Some(key) => (
                        PyString::new(py, key.endpoint()).into_any().unbind(),
                        key.dp_rank(),
                        p.blocks,
                    ),
                    None => continue,
                },
            };
            rows.push(row);
        }
        PyList::new(py, rows)
    }
}

#[pymethods]
impl Index {
    /// An empty index hashing blocks of `block_size` tokens in the
    /// namespace of `model` (as the engines' events are rehashed).
    #[new]
    #[pyo3(signature = (block_size = 16, model = None, lora_name = None, cache_salt = None))]
    fn new(
        block_size: u32,
        model: Option<String>,
        lora_name: Option<String>,
        cache_salt: Option<String>,
    ) -> PyResult<Self> {
        let hasher = ChainHasher::new(block_size as usize).map_err(err)?;
        let index = BitmapIndex::new(IndexConfig::default());
        let ingest = Ingestor::new(hasher, index.clone(), model.clone(), block_size);
        Ok(Index {
            index,
            ingest: Mutex::new(ingest),
            hasher,
            namespace: namespace(model, lora_name, cache_salt),
            joined: Mutex::default(),
            names: Mutex::default(),
        })
    }

    /// Adds a pod (a no-op for one already joined).
    #[pyo3(signature = (endpoint, dp_rank = 0))]
    fn join(&self, py: Python<'_>, endpoint: &str, dp_rank: u32) -> PyResult<()> {
        let pod = self
            .index
            .join(&PodKey::new(endpoint, dp_rank))
            .map_err(err)?;
        self.joined.lock().insert((endpoint.to_owned(), dp_rank));
        let mut names = self.names.lock();
        let slot = usize::from(pod.slot());
        if names.len() <= slot {
            names.resize_with(slot + 1, || None);
        }
        names[slot] = Some((pod, PyString::new(py, endpoint).unbind(), dp_rank));
        Ok(())
    }

    /// Takes a pod out: it answers no match from now on and its blocks are
    /// swept in the background. False if it was not joined.
    #[pyo3(signature = (endpoint, dp_rank = 0))]
    fn leave(&self, py: Python<'_>, endpoint: &str, dp_rank: u32) -> PyResult<bool> {
        let Some(pod) = self.index.pod_id(&PodKey::new(endpoint, dp_rank)) else {
            return Ok(false);
        };
        self.joined.lock().remove(&(endpoint.to_owned(), dp_rank));
        if let Some(e) = self.names.lock().get_mut(usize::from(pod.slot())) {
            *e = None;
        }
        py.detach(|| {
            self.ingest.lock().forget_pod(pod);
            self.index.shutdown(pod)
        })
        .map(|()| true)
        .map_err(err)
    }

    /// Applies one event batch of a pod, as its engine publishes it on
    /// ZeroMQ (vLLM's or SGLang's msgpack bytes); returns the events in it.
    /// A malformed batch raises and changes nothing.
    #[pyo3(signature = (endpoint, payload, dp_rank = 0))]
    fn apply(
        &self,
        py: Python<'_>,
        endpoint: &str,
        payload: &[u8],
        dp_rank: u32,
    ) -> PyResult<usize> {
        let pod = self.pod(endpoint, dp_rank)?;
        py.detach(|| {
            let batch = decode_batch(payload)?;
            self.ingest.lock().apply_batch(pod, &batch);
            Ok::<_, router_events::DecodeError>(batch.events.len())
        })
        .map_err(err)
    }

    /// Whether the pod missed events (a stored block whose parent the
    /// index never saw) and should be replayed, or left and joined again.
    #[pyo3(signature = (endpoint, dp_rank = 0))]
    fn needs_resync(&self, endpoint: &str, dp_rank: u32) -> PyResult<bool> {
        let pod = self.pod(endpoint, dp_rank)?;
        Ok(self.ingest.lock().needs_resync(pod))
    }

    /// The pods holding a prefix of the chain `hashes` (router block
    /// hashes, as [`BlockHasher.hash_tokens`] computes them), each as
    /// `(endpoint, dp_rank, blocks)`, longest first.
    #[pyo3(name = "match")]
    fn match_hashes<'py>(
        &self,
        py: Python<'py>,
        hashes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        // A chain is read where it lies; anything else is converted.
        let owned;
        let chain: &[BlockHash] = match hashes.cast::<Chain>() {
            Ok(c) => &c.get().hashes,
            Err(_) => {
                owned = hash_seq(hashes)?;
                &owned
            }
        };
        // A match is a binary search per pod: well under a microsecond for
        // chains of real prompts, less than releasing and taking back the
        // GIL costs. Only a very long chain gives the GIL up meanwhile.
        let m = if chain.len() > DETACH_ABOVE_BLOCKS {
            py.detach(|| self.index.match_prefix(chain))
        } else {
            self.index.match_prefix(chain)
        };
        self.answer(py, &m)
    }

    /// [`Index.match`] of the chain of `tokens` in the index's namespace.
    fn match_tokens<'py>(&self, py: Python<'py>, tokens: Vec<u32>) -> PyResult<Bound<'py, PyList>> {
        let m = py.detach(|| {
            let chain = self.hasher.chain(&self.namespace, &tokens);
            self.index.match_prefix(&chain)
        });
        self.answer(py, &m)
    }

    /// The router hashes of `tokens` in the index's namespace.
    fn hash_tokens(&self, py: Python<'_>, tokens: Vec<u32>) -> Chain {
        py.detach(|| Chain::of(self.hasher.chain(&self.namespace, &tokens)))
    }

    /// The pods joined, as `(endpoint, dp_rank)`.
    fn pods(&self) -> Vec<(String, u32)> {
        self.joined.lock().iter().cloned().collect()
    }

    /// Counts: distinct blocks, (block, pod) residencies, bytes, live pods,
    /// events applied and skipped, and the ingestion's own counts.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.index.stats();
        let i = self.ingest.lock().stats();
        let d = PyDict::new(py);
        d.set_item("entries", s.entries)?;
        d.set_item("residencies", s.residencies)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("pods_live", s.pods_live)?;
        d.set_item("events_applied", s.events_applied)?;
        d.set_item("skipped_unknown_pod", s.skipped_unknown_pod)?;
        d.set_item("skipped_dead_pod", s.skipped_dead_pod)?;
        for (k, v) in [
            ("batches", i.batches),
            ("blocks_stored", i.blocks_stored),
            ("blocks_removed", i.blocks_removed),
            ("unknown_parent", i.unknown_parent),
            ("other_group", i.other_group),
            ("group_blocks_stored", i.group_blocks_stored),
            ("group_blocks_removed", i.group_blocks_removed),
            ("unsupported_group", i.unsupported_group),
            ("unresolved_group_blocks", i.unresolved_group_blocks),
            ("unknown_medium", i.unknown_medium),
            ("token_mismatch", i.token_mismatch),
            ("unknown_removed", i.unknown_removed),
            ("sink_refused", i.sink_refused),
            ("unknown_events", i.unknown_events),
        ] {
            d.set_item(format!("ingest_{k}"), v)?;
        }
        Ok(d)
    }
}

/// The library router: the pods of a config file, their events, health
/// and load; decides where each request goes. It runs on its own tokio
/// runtime (two worker threads); every call that waits on it releases the
/// GIL.
#[pyclass(frozen, module = "cache_router._native")]
struct Router {
    router: Mutex<Option<Arc<router_service::Router>>>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    model: String,
}

impl Router {
    fn get(&self) -> PyResult<Arc<router_service::Router>> {
        self.router
            .lock()
            .clone()
            .ok_or_else(|| err("the router is closed"))
    }

    fn handle(&self) -> PyResult<tokio::runtime::Handle> {
        self.runtime
            .lock()
            .as_ref()
            .map(|r| r.handle().clone())
            .ok_or_else(|| err("the router is closed"))
    }

    fn block_on<T>(&self, py: Python<'_>, f: impl Future<Output = T> + Send) -> PyResult<T>
    where
        T: Send,
    {
        let handle = self.handle()?;
        Ok(py.detach(|| handle.block_on(f)))
    }
}

fn start(py: Python<'_>, config: Config) -> PyResult<Router> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cache-router")
        .enable_all()
        .build()
        .map_err(err)?;
    let router = py
        .detach(|| runtime.block_on(router_service::Router::start(config)))
        .map_err(err)?;
    Ok(Router {
        model: router.model().to_owned(),
        router: Mutex::new(Some(Arc::new(router))),
        runtime: Mutex::new(Some(runtime)),
    })
}

#[pymethods]
impl Router {
    /// A router from the text of a config file (TOML, the gateway's
    /// format: `[gateway]`, `[[pods]]`, profiles); relative paths in it
    /// resolve against `base_dir`.
    #[new]
    #[pyo3(signature = (config, base_dir = None))]
    fn new(py: Python<'_>, config: &str, base_dir: Option<PathBuf>) -> PyResult<Self> {
        let base = base_dir.unwrap_or_else(|| PathBuf::from("."));
        let config = Config::parse(config, &base).map_err(err)?;
        start(py, config)
    }

    /// A router from a config file.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let config = Config::load(&path).map_err(err)?;
        start(py, config)
    }

    /// The model served.
    #[getter]
    fn model(&self) -> &str {
        &self.model
    }

    /// Decides where a request goes, without sending it. Give a chat
    /// (`messages`, a list of dicts), a completion (`prompt`: text or token
    /// ids), or a whole OpenAI request `body` (a dict; `api` names which).
    /// The pod's load counts the request until the pick finishes.
    #[pyo3(signature = (*, messages = None, prompt = None, body = None, api = None, model = None, session = None, max_tokens = None))]
    #[allow(clippy::too_many_arguments)]
    fn pick(
        &self,
        py: Python<'_>,
        messages: Option<&Bound<'_, PyAny>>,
        prompt: Option<&Bound<'_, PyAny>>,
        body: Option<&Bound<'_, PyAny>>,
        api: Option<&str>,
        model: Option<&str>,
        session: Option<String>,
        max_tokens: Option<u64>,
    ) -> PyResult<Pick> {
        let model = model.unwrap_or(&self.model);
        let (api, mut body) = match (messages, prompt, body) {
            (Some(m), None, None) => (
                Api::Chat,
                serde_json::json!({"model": model, "messages": to_json(m, 0)?}),
            ),
            (None, Some(p), None) => (
                Api::Completions,
                serde_json::json!({"model": model, "prompt": to_json(p, 0)?}),
            ),
            (None, None, Some(b)) => {
                let b = to_json(b, 0)?;
                let api = match api {
                    Some(a) => parse_api(a)?,
                    None if b.get("messages").is_some() => Api::Chat,
                    None => Api::Completions,
                };
                (api, b)
            }
            _ => {
                return Err(err("give exactly one of messages=, prompt= or body="));
            }
        };
        if body.get("model").is_none()
            && let Value::Object(m) = &mut body
        {
            m.insert("model".into(), Value::String(model.to_owned()));
        }
        if let Some(n) = max_tokens {
            body["max_tokens"] = Value::from(n);
        }
        let mut request =
            Request::from_json(api, body).map_err(|e| err(format!("{}: {}", e.kind, e.message)))?;
        if let Some(s) = session {
            request = request.with_session(s);
        }
        let router = self.get()?;
        let handle = self.handle()?;
        // Decided on this thread with the GIL released (no hop to the
        // router's tokenizer threads and back), inside the runtime's
        // context for whatever the decision starts there.
        let pick = py
            .detach(|| {
                let _in = handle.enter();
                router.pick_blocking(request)
            })
            .map_err(err)?;
        Ok(Pick {
            pod: pick.pod.clone(),
            url: pick.url.clone(),
            predicted_cached_tokens: pick.predicted_cached_tokens,
            prompt_tokens: pick.prompt_tokens,
            inner: Mutex::new(Some(pick)),
        })
    }

    /// Adds a pod: `name`, its OpenAI base `url`, its KV-event publisher
    /// `events` (a ZeroMQ endpoint) and `replay` endpoint, `topic`, `role`
    /// (`"both"`, `"prefill"` or `"decode"`).
    #[pyo3(signature = (name, url, events = None, replay = None, topic = "", role = "both"))]
    #[allow(clippy::too_many_arguments)]
    fn add_pod(
        &self,
        py: Python<'_>,
        name: &str,
        url: &str,
        events: Option<&str>,
        replay: Option<&str>,
        topic: &str,
        role: &str,
    ) -> PyResult<()> {
        let pod: PodConfig = serde_json::from_value(serde_json::json!({
            "name": name, "url": url, "events": events, "replay": replay,
            "topic": topic, "role": role,
        }))
        .map_err(err)?;
        let router = self.get()?;
        self.block_on(py, async move { router.add_pod(pod).map(|_| ()) })?
            .map_err(err)
    }

    /// Takes a pod out by name; false if there was none.
    fn remove_pod(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        let router = self.get()?;
        let name = name.to_owned();
        self.block_on(py, async move { router.remove_pod(&name) })
    }

    /// The pods: configuration, index id, health, blocks held.
    fn pods<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v = serde_json::to_value(self.get()?.pods()).map_err(err)?;
        to_py(py, &v)
    }

    /// `{"pods", "answering", "probed"}`: pods configured, answering their
    /// probes, and whether any was probed yet.
    fn health<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = self.get()?.health();
        let d = PyDict::new(py);
        d.set_item("pods", h.pods)?;
        d.set_item("answering", h.answering)?;
        d.set_item("probed", h.probed)?;
        Ok(d)
    }

    /// The router's metrics in Prometheus' text format.
    fn metrics_text(&self) -> PyResult<String> {
        Ok(self.get()?.metrics_text())
    }

    /// Stops the router's tasks and runtime (picks still held keep their
    /// accounting until dropped). Idempotent.
    fn close(&self, py: Python<'_>) {
        let router = self.router.lock().take();
        let runtime = self.runtime.lock().take();
        py.detach(move || {
            drop(router);
            if let Some(r) = runtime {
                r.shutdown_timeout(std::time::Duration::from_secs(1));
            }
        });
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    /// Measures the Rust side of [`Router.pick`] on its own, for the
    /// binding-overhead benchmark: `n` picks of a chat of one user message
    /// `content`, each finished at once, on this thread as `pick` makes
    /// them (`pick_blocking`), or with `hop` through the async `pick` and
    /// the router's tokenizer threads; returns seconds per pick.
    #[pyo3(signature = (content, n, hop = false))]
    fn _bench_pick(&self, py: Python<'_>, content: String, n: u32, hop: bool) -> PyResult<f64> {
        let router = self.get()?;
        let model = self.model.clone();
        let n = n.max(1);
        if hop {
            return self.block_on(py, async move {
                let start = Instant::now();
                for _ in 0..n {
                    let r = Request::chat(&model, [("user", content.as_str())]);
                    if let Ok(p) = router.pick(r).await {
                        p.finish(true);
                    }
                }
                start.elapsed().as_secs_f64() / f64::from(n)
            });
        }
        let handle = self.handle()?;
        Ok(py.detach(|| {
            let _in = handle.enter();
            let start = Instant::now();
            for _ in 0..n {
                let r = Request::chat(&model, [("user", content.as_str())]);
                if let Ok(p) = router.pick_blocking(r) {
                    p.finish(true);
                }
            }
            start.elapsed().as_secs_f64() / f64::from(n)
        }))
    }
}

/// One decision of [`Router.pick`]: the pod, its URL, what the index
/// predicted. Report the first token and the engine's cached tokens, then
/// [`Pick.finish`] (or use it as a context manager, which finishes with
/// `ok` = no exception). A pick dropped unfinished ends as failed.
#[pyclass(frozen, module = "cache_router._native")]
struct Pick {
    #[pyo3(get)]
    pod: String,
    #[pyo3(get)]
    url: String,
    #[pyo3(get)]
    predicted_cached_tokens: u64,
    #[pyo3(get)]
    prompt_tokens: u64,
    inner: Mutex<Option<router_service::Pick>>,
}

#[pymethods]
impl Pick {
    /// The first token arrived (records time to first token; the pod's
    /// queued prefill ends).
    fn first_token(&self) {
        if let Some(p) = self.inner.lock().as_mut() {
            p.first_token();
        }
    }

    /// The engine reported `cached` prompt tokens served from its cache
    /// (`usage.prompt_tokens_details.cached_tokens`).
    fn cached_tokens(&self, cached: u64) {
        if let Some(p) = self.inner.lock().as_mut() {
            p.cached_tokens(cached);
        }
    }

    /// The request ended; `ok`: the pod served it. Later calls do nothing.
    #[pyo3(signature = (ok = true))]
    fn finish(&self, ok: bool) {
        if let Some(p) = self.inner.lock().take() {
            p.finish(ok);
        }
    }

    /// Whether [`Pick.finish`] was called.
    #[getter]
    fn finished(&self) -> bool {
        self.inner.lock().is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        self.finish(exc_type.is_none_or(|t| t.is_none()));
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Pick(pod={:?}, url={:?}, predicted_cached_tokens={}, prompt_tokens={})",
            self.pod, self.url, self.predicted_cached_tokens, self.prompt_tokens
        )
    }
}

/// Measures the Rust side of [`Index.match`] on its own, for the
/// binding-overhead benchmark: `n` matches of `hashes`; seconds per match.
#[pyfunction]
fn _bench_match(py: Python<'_>, index: &Index, hashes: &Bound<'_, PyAny>, n: u32) -> PyResult<f64> {
    let chain = hash_seq(hashes)?;
    Ok(py.detach(|| {
        let start = Instant::now();
        let mut found = 0usize;
        for _ in 0..n.max(1) {
            found += index.index.match_prefix(&chain).pods().len();
        }
        std::hint::black_box(found);
        start.elapsed().as_secs_f64() / f64::from(n.max(1))
    }))
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CacheRouterError", m.py().get_type::<CacheRouterError>())?;
    m.add_class::<Tokenizer>()?;
    m.add_class::<BlockHasher>()?;
    m.add_class::<Chain>()?;
    m.add_class::<Index>()?;
    m.add_class::<Router>()?;
    m.add_class::<Pick>()?;
    m.add_function(wrap_pyfunction!(_bench_match, m)?)?;
    Ok(())
}
