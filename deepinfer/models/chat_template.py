"""Render a model's Jinja chat template (from GGUF or tokenizer_config.json) in a sandbox."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deepinfer.models.tokenizer import Tokenizer

# Used when a model ships no template: ChatML, which SmolLM2 and Qwen2 were tuned on.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template raised (``raise_exception``) or failed to render."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template.

    Runs in Jinja's immutable sandbox (a template from a downloaded file cannot reach Python
    internals), with the same whitespace settings and helpers (``raise_exception``,
    ``strftime_now``) that Hugging Face templates are written against.

    Example::

        tpl = ChatTemplate(None)  # ChatML fallback
        text = tpl.render([{"role": "user", "content": "Hi"}])
        assert text.endswith("<|im_start|>assistant\\n")
    """

    def __init__(
        self, source: str | None, *, bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source = source if source else CHATML_TEMPLATE
        self.is_fallback = not source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(self.source)
        except Exception as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages`` (each a dict with ``role`` and ``content``)."""
        if not messages:
            raise ValueError("messages must hold at least one message")
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                raise ValueError(f"messages[{i}] must be a dict with a string 'role'")
            if not isinstance(message.get("content"), str):
                raise ValueError(f"messages[{i}]['content'] must be a string")
        try:
            return str(
                self._template.render(
                    messages=[dict(m) for m in messages],
                    add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                    **extra,
                )
            )
        except ChatTemplateError:
            raise
        except Exception as exc:
            raise ChatTemplateError(f"chat template failed to render: {exc}") from exc


def read_chat_template(directory: Path, tokenizer: Tokenizer) -> ChatTemplate:
    """A converted model directory's chat template (``chat_template.jinja``, else
    ``tokenizer_config.json``'s ``chat_template``; none: the template-less default), with the
    tokenizer's BOS and first EOS token as ``bos_token``/``eos_token``."""
    source = None
    jinja_file = directory / "chat_template.jinja"
    meta_file = directory / "tokenizer_config.json"
    if jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    elif meta_file.is_file():
        raw = json.loads(meta_file.read_text(encoding="utf-8")).get("chat_template")
        source = raw if isinstance(raw, str) else None
    eos = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
    return ChatTemplate(
        source,
        bos_token=tokenizer.id_to_token(tokenizer.bos_token_id),
        eos_token=tokenizer.id_to_token(eos),
    )
