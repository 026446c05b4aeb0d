"""A tiny random Llama and byte-level BPE tokenizer, built offline in seconds for tests.

vLLM loads it like any checkpoint. Its outputs are random: assert on structure (parses,
row counts, agreement with transformers), never on content.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _training_text() -> list[str]:
    import gzip

    from logicrank.pipelines.datasets import scifact

    lines = []
    with gzip.open(scifact().corpus, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i == 400:
                break
            doc = json.loads(line)
            lines.append(f"{doc['title']} {doc['text'][:600]}")
    # the label tokens and the query language's keywords become single tokens
    lines += ['Answer: True False "a" AND "b" OR NOT ("c") {"atoms": [{"id": "a1", "text": "{x} is"}], "form": "a1"}'] * 200
    return lines


def build_tiny_llm(path: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_training_text(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=2048, eos_token_id=eos, pad_token_id=fast.pad_token_id,
        bos_token_id=None, tie_word_embeddings=False, initializer_range=0.2,  # wide enough that P(True) varies
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    GenerationConfig(eos_token_id=eos, pad_token_id=fast.pad_token_id).save_pretrained(path)
    return path
