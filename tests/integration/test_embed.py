"""The packaged MiniLM through both backends."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from logicrank.pipelines.config.settings import EmbedConfig
from logicrank.pipelines.engines.embed import Embedder, ModelError, TokenizerFile, fixed_shape_batches
from tests.conftest import scifact_docs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A cache root holding the packaged model's OpenVINO conversion, for the tests of what is
    done with a converted encoder (the conversion's own tests make theirs)."""
    root = tmp_path_factory.mktemp("converted")
    previous = os.environ.get("LOGICRANK_CACHE")
    os.environ["LOGICRANK_CACHE"] = str(root)
    try:
        Embedder(EmbedConfig(backend="openvino"))
    finally:
        if previous is None:
            del os.environ["LOGICRANK_CACHE"]
        else:
            os.environ["LOGICRANK_CACHE"] = previous
    assert len(list(root.glob("openvino/*/model.xml"))) == 1
    return root


@pytest.mark.slow  # the encoder converted three times, and loaded from each
def test_openvino_matches_torch_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGICRANK_CACHE", str(tmp_path))
    texts = [d["title"] + " " + d["text"] for d in scifact_docs(24)] + ["short", "a b c"]
    ref = Embedder(EmbedConfig(backend="torch")).encode(texts)
    np.testing.assert_allclose(np.linalg.norm(ref, axis=1), 1, atol=1e-5)
    first = Embedder(EmbedConfig(backend="openvino"))
    converted = list(tmp_path.glob("openvino/*/model.xml"))  # the IR, under $LOGICRANK_CACHE
    assert len(converted) == 1
    written = converted[0].stat().st_mtime_ns
    again = Embedder(EmbedConfig(backend="openvino"))  # reads the cached IR
    assert list(tmp_path.glob("openvino/*/model.xml")) == converted and converted[0].stat().st_mtime_ns == written  # not converted again
    assert first.model is not None and again.model is None  # the cache alone: the model's weights not loaded
    for e in (first, again):
        got = e.encode(texts)
        assert got.shape == ref.shape
        # f32 inference: 2e-7 apart here. OpenVINO's bf16 default on CPUs with bf16 units was 1.1e-3 apart.
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    odd = ["", "   ", "Ünïcödé ﬁ ＦＵＬＬ width", "東京 の 研究 😀", "x" * 5000, "word " * 400, "tab\tand\nnewline", "MiXeD CaSe, punct!?"]
    assert np.array_equal(again.encode(texts + odd), first.encode(texts + odd))  # the same compiled model on the same token ids
    monkeypatch.setenv("LOGICRANK_CACHE", str(tmp_path / "window"))  # and with a window of the config's, truncated alike
    loaded, cached = (Embedder(EmbedConfig(backend="openvino", max_seq_length=16)) for _ in range(2))
    assert loaded.model is not None and cached.model is None
    assert np.array_equal(cached.encode(texts + odd), loaded.encode(texts + odd))


@pytest.mark.slow  # the encoder converted twice, then loaded again for each of five damaged copies
def test_a_process_with_the_converted_encoder_cached_loads_neither_torch_nor_the_model(tmp_path, monkeypatch):
    """The encoder of a fresh process (a CLI job's, an embedding actor's) from the cache alone:
    no torch, no sentence-transformers, and the vectors of the process that converted it,
    whatever window that one's config set. A copy that lost or cut a file is not read: the
    model is loaded (the same vectors), and the copy replaced for the next process."""
    import json

    monkeypatch.setenv("LOGICRANK_CACHE", str(tmp_path))
    texts = [d["title"] + " " + d["text"] for d in scifact_docs(12)] + ["short", "東京 😀", "word " * 400]
    np.save(tmp_path / "texts.npy", np.array(texts, dtype=object), allow_pickle=True)
    converting = Embedder(EmbedConfig(backend="openvino", max_seq_length=128))
    reference = Embedder(EmbedConfig(backend="openvino")).encode(texts)  # the model's own window, from the cache
    np.save(tmp_path / "reference.npy", reference)
    child = ("import sys, numpy as np; from logicrank.pipelines.engines.embed import Embedder; "
             "from logicrank.pipelines.config.settings import EmbedConfig\n"
             "e = Embedder(EmbedConfig(backend='openvino'))\n"
             "heavy = sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules)\n"
             "assert e.model is None and not heavy, heavy\n"
             "assert np.array_equal(e.encode(list(np.load(sys.argv[1], allow_pickle=True))), np.load(sys.argv[2]))\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path / "texts.npy"), str(tmp_path / "reference.npy")], cwd=root,
                          capture_output=True, text=True, env={**os.environ, "LOGICRANK_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert converting.model is not None and not np.array_equal(converting.encode(texts), reference)  # (its window cut the long text)
    (copy,) = tmp_path.glob("openvino/*/")
    assert json.loads((copy / "encoder.json").read_text())["max_seq_length"] == 256  # the model's own window recorded
    def garbled(f: Path) -> None:  # a whole copy that does not load: the tokenizer's file at its size, not a tokenizer
        f.write_bytes(b"\0" * f.stat().st_size)

    def no_pad_token(f: Path) -> None:  # a whole copy that does not load: its record's pad token is not in the vocabulary
        meta = json.loads(f.read_text())
        f.write_text(json.dumps(meta | {"tokenizer": meta["tokenizer"] | {"pad_token": "[NO-SUCH-PAD]"}}))

    def no_such_side(f: Path) -> None:  # a whole copy that does not load: a padding side the tokenizers library refuses
        meta = json.loads(f.read_text())
        f.write_text(json.dumps(meta | {"tokenizer": meta["tokenizer"] | {"padding_side": "middle"}}))

    for name, damage in [("tokenizer/tokenizer.json", Path.unlink), ("model.bin", lambda f: f.write_bytes(f.read_bytes()[:1000])),
                         ("tokenizer/tokenizer.json", garbled), ("encoder.json", no_pad_token), ("encoder.json", no_such_side)]:
        damage(copy / name)
        for from_cache in (False, True):  # loaded and the copy replaced; then served from the copy
            e = Embedder(EmbedConfig(backend="openvino"))
            assert (e.model is None) == from_cache and np.array_equal(e.encode(texts), reference), (name, from_cache)
        assert [p.name for p in tmp_path.glob("openvino/*")] == [copy.name], name  # the damaged copy removed


def test_the_tokenizer_file_gives_the_models_tokenizers_ids_in_every_batch(tmp_path):
    """The cached encoder tokenizes with the ``tokenizers`` library alone (TokenizerFile): the
    same token ids, type ids and masks as the model's own transformers tokenizer, for both
    calls the encoder makes (lengths, then fixed-shape padded batches), at the model's window
    and a short one, on texts that stress normalisation and truncation."""
    tokenizer = Embedder(EmbedConfig(backend="torch")).model.tokenizer
    inputs = list(tokenizer(["an example"], padding=True).keys())
    tokenizer.save_pretrained(str(tmp_path))
    replay = TokenizerFile(tmp_path / "tokenizer.json", TokenizerFile.settings(tokenizer, inputs))
    texts = [d["title"] + " " + d["text"] for d in scifact_docs(40)] + [
        "", "   ", "Ünïcödé ﬁ ＦＵＬＬ width", "東京 の 研究 😀", "x" * 5000, "word " * 400, "tab\tand\nnewline", "MiXeD CaSe, punct!?",
        "[CLS] [SEP] [PAD] [MASK] [UNK]", "naïve café résumé", "e.g. U.S.A. 3.14159 -- don't"]
    for max_len in (256, 16):
        ours, theirs = (list(fixed_shape_batches(t, texts, max_len, 8, "np")) for t in (replay, tokenizer))
        assert [idx.tolist() for idx, _ in ours] == [idx.tolist() for idx, _ in theirs]
        for (_, a), (_, b) in zip(ours, theirs, strict=True):
            assert sorted(k for k in a if k in inputs) == sorted(b.keys())
            for k in b:
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (max_len, k)


def test_a_tokenizer_its_file_does_not_replay_is_not_cached(tmp_path, monkeypatch):
    """A tokenizer whose calls its file and settings do not give (here: settings that would cut
    texts from the other side, as a class doing more in Python than its file says would) is
    found at conversion, on probe texts: nothing is cached, with a warning, and the vectors
    are the loaded model's."""
    monkeypatch.setenv("LOGICRANK_CACHE", str(tmp_path))
    texts = ["short", "word " * 400]
    reference = Embedder(EmbedConfig(backend="torch")).encode(texts)
    settings = TokenizerFile.settings
    monkeypatch.setattr(TokenizerFile, "settings", classmethod(lambda cls, tok, inputs: settings(tok, inputs) | {"truncation_side": "left"}))
    with pytest.warns(RuntimeWarning, match="could not be cached"):
        e = Embedder(EmbedConfig(backend="openvino"))
    assert e.model is not None and not list(tmp_path.glob("openvino/*"))
    np.testing.assert_allclose(e.encode(texts), reference, atol=1e-5, rtol=0)


def test_openvino_encoders_made_and_dropped_in_one_process_never_deadlock(converted):
    """Jobs build an encoder per use (question dedup, query encoding) in a long-lived process.
    With a Python callback on OpenVINO's threads (AsyncInferQueue), dropping a model whose
    thread still waited for the GIL hung the process within two rounds of this loop, every
    time; a hang here is a failure at pytest's per-test timeout, not a stuck suite."""
    child = ("from logicrank.pipelines.engines.embed import Embedder; from logicrank.pipelines.config.settings import EmbedConfig\n"
             "texts = [f'text {i} about things ' * (i % 7 + 1) for i in range(40)]\n"
             "for _ in range(10):\n"
             "    assert Embedder(EmbedConfig(backend='openvino')).encode(texts).shape == (40, 384)\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", child], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "LOGICRANK_CACHE": str(converted)})
    assert done.returncode == 0, done.stderr[-2000:]


def test_unknown_model_lists_the_registry():
    with pytest.raises(ModelError, match=r"unknown model 'nope'; registered: \['all-MiniLM-L6-v2'\]"):
        Embedder(EmbedConfig(model="nope"))


@pytest.mark.parametrize("backend", ["torch", "openvino"])
def test_a_texts_vector_is_the_same_in_any_batch(backend, converted, monkeypatch):
    """A query's vector must not move with the texts encoded beside it: padded to its batch's
    longest, SciFact queries got vectors 1.6e-7 apart between one call and two halves (36 of
    200 differed), enough for two documents 3.9e-7 apart to swap ranks between ``--shards 1``
    and ``--shards 2``. Bit for bit, on purpose: equal vectors give equal runs on any machine."""
    import json

    from logicrank.pipelines.datasets import scifact

    monkeypatch.setenv("LOGICRANK_CACHE", str(converted))
    with open(scifact().queries, encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for line in f][:120]
    docs = [d["title"] + " " + d["text"] for d in scifact_docs(8)]  # longer texts: other length buckets
    texts = queries + docs
    encoder = Embedder(EmbedConfig(backend=backend, batch_size=16))
    whole = encoder.encode(texts)
    assert np.array_equal(np.concatenate([encoder.encode(texts[:50]), encoder.encode(texts[50:])]), whole)
    assert np.array_equal(encoder.encode(texts[::-1])[::-1], whole)
    assert np.array_equal(np.stack([encoder.encode([t])[0] for t in texts[::9]]), whole[::9])
    other = Embedder(EmbedConfig(backend=backend, batch_size=5, threads=1))  # another batch size and thread count
    assert np.array_equal(other.encode(texts), whole)
