"""What the HTTP front needs of the model: its directory, tokenizer and chat template.

The front tokenizes (routing needs the prompt's block hashes) but never loads weights: those
live in the replicas, which are started on the converted model directory this resolves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepinfer.models.chat_template import ChatTemplate, read_chat_template
from deepinfer.models.convert import convert_gguf
from deepinfer.models.registry import default_model_path
from deepinfer.models.tokenizer import Tokenizer


@dataclass
class Frontend:
    model_dir: Path
    name: str
    tokenizer: Tokenizer
    chat_template: ChatTemplate

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        prompt = self.chat_template.render(messages, add_generation_prompt=True)
        return self.tokenizer.encode(prompt, add_bos=False)


def load_frontend(
    model: str | None, served_name: str | None, cache_dir: str | os.PathLike[str] | None
) -> Frontend:
    source = default_model_path() if model is None else Path(model)
    if source.is_file() and source.suffix == ".gguf":
        model_dir = convert_gguf(source, cache_dir)
    elif source.is_dir():
        model_dir = source
    else:
        raise ValueError(f"model: {os.fspath(source)!r} is neither a .gguf file nor a directory")
    tokenizer = Tokenizer.from_file(model_dir / "tokenizer.json")
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if not tokenizer.eos_token_ids:
        eos = config.get("eos_token_id")
        if eos is not None:
            tokenizer.eos_token_ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
    template = read_chat_template(model_dir, tokenizer)
    name = served_name or (source.stem if model is not None else "SmolLM2-135M-Instruct")
    return Frontend(model_dir, name, tokenizer, template)
