import pyarrow as pa
import pytest
from pydantic import ValidationError

from pipelines.pipeline import PipelineError
from schemas.config import IndexConfig, RetrieveConfig
from schemas.tables import QRELS, SchemaError, conform, require_columns


def test_missing_columns_are_named_with_the_stage():
    t = pa.table({"query_id": ["1"], "docid": ["d"]})
    with pytest.raises(SchemaError) as exc:
        require_columns(t, QRELS, "evaluate")
    msg = str(exc.value)
    assert "evaluate" in msg and "'doc_id'" in msg and "'docid'" in msg


def test_conform_casts_and_rejects_nulls_without_mutating_input():
    t = pa.table({"relevance": [1, 0], "doc_id": ["a", "b"], "query_id": ["q", "q"], "extra": [1, 2]})
    out = conform(t, QRELS, "x")
    assert out.schema == QRELS and t.num_columns == 4
    with pytest.raises(SchemaError, match="null"):
        conform(pa.table({"query_id": ["q", None], "doc_id": ["a", "b"], "relevance": [1, 1]}), QRELS, "x")


def test_configs_validate_at_start():
    with pytest.raises(PipelineError, match="unknown method 'sparse'; presets: bm25, dense"):
        RetrieveConfig.preset(("dense", "sparse"), queries="q", db="d")
    with pytest.raises(PipelineError, match="repeat"):
        RetrieveConfig.preset(("dense", "dense"), queries="q", db="d")
    with pytest.raises(ValidationError):
        IndexConfig(corpus="c", db="d", max_reject_fraction=2)
    a, b = IndexConfig(corpus="c", db="d"), IndexConfig(corpus="c", db="d")
    assert a.digest() == b.digest() != IndexConfig(corpus="c", db="d", table="t").digest()
