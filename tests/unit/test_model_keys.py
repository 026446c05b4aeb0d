"""The keys of what is derived from a model directory (the OpenVINO encoder's converted copy,
pipelines/engines/embed.py; a checkpoint's LLM model id, pipelines/llm/models.py, which keys
the prompt cache and the stages' reruns): weights saved over a model in place, with the old
size and modification time put back (``touch -r``, or a tool that keeps times), are another
model, never served from the old one's cache."""

import os

from logicrank.pipelines.engines.embed import _ov_cache_dir
from logicrank.pipelines.llm.models import resolve


def _saved_over(path, name: str) -> None:
    """Rewrite ``path/name`` with other bytes of the same size, its times put back."""
    f = path / name
    st = f.stat()
    probe = path.parent / "probe"
    probe.touch()
    while probe.stat().st_ctime_ns <= st.st_ctime_ns:  # the file system's clock (a few ms a tick) past the file's change time
        probe.touch()
    f.write_bytes(os.urandom(st.st_size))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns


def test_weights_saved_over_with_their_times_kept_are_another_model(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGICRANK_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(os.urandom(1000))
    converted, model_id = _ov_cache_dir(str(model)), resolve(str(model), log=lambda m: None).model_id
    assert _ov_cache_dir(str(model)) == converted and resolve(str(model), log=lambda m: None).model_id == model_id  # stable
    _saved_over(model, "model.safetensors")
    assert _ov_cache_dir(str(model)) != converted
    assert resolve(str(model), log=lambda m: None).model_id != model_id
