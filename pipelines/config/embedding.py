"""The encoder's config, alone in its module: the code that makes vectors
(pipelines/engines/embed.py) imports it, and an edit to that code's closure embeds every stored
document again (pipelines/codedigest.py), so nothing else lives here."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from logicrank.pipelines.config.base import Config


class EmbedConfig(Config):
    """The sentence-transformers encoder."""

    model: str = Field("all-MiniLM-L6-v2", description="The encoder: a registered embedding model name or a local model directory.")
    backend: Literal["auto", "torch", "openvino"] = Field(
        "auto", description="auto: openvino on a CPU where it is installed, torch on a GPU (or without openvino)."
    )
    batch_size: int = Field(16, ge=1, description="Texts per forward pass (16 suits CPUs; on GPUs give more, e.g. 256).")
    max_seq_length: int | None = Field(None, ge=8, description="Token window; None keeps the model's own.")
    title_sep: str = Field(
        " ", max_length=8, description="Joins a document's title and text when embedding (BEIR/MTEB: a space); the table records it, and indexing into it with another is refused."
    )
    device: str = Field(
        "auto", description="auto: cuda for the index job's encoders on GPU nodes (each holds one), else cpu (query encoders "
        "hold no GPU); or a torch device name."
    )
    threads: int | None = Field(
        None, ge=1, description="Threads per encoder (torch's, or OpenVINO's inference threads); None uses every core of the node."
    )
