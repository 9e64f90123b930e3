"""`StructuredOutputsParams`: what shape a request's output must take (vLLM's field names).

Exactly one constraint is given: a JSON schema (``json``), any JSON object (``json_object``), a
regular expression (``regex``), one of a list of strings (``choice``), or a Lark grammar
(``grammar``). :class:`~deepinfer_kernels.sampling.grammar.GrammarCompiler` compiles it with
llguidance into a matcher whose packed token bitmask ``apply_token_bitmask`` applies to the logits
(before sampling, and before speculative verification). ``deepinfer`` re-exports this class as
the ``structured_outputs`` field of its ``SamplingParams``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One output constraint.

    Example::

        from deepinfer_kernels.sampling import StructuredOutputsParams

        schema = {"type": "object", "properties": {"name": {"type": "string"}}}
        constraint = StructuredOutputsParams(json=schema)
    """

    json: str | Mapping[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                "structured_outputs: give exactly one of json, json_object, regex, choice, "
                f"grammar; got {given or 'none'}"
            )
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    parsed = json.loads(self.json)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
                if not isinstance(parsed, (dict, bool)):
                    raise ValueError("structured_outputs.json must be a JSON schema object")
            elif not isinstance(self.json, Mapping):
                raise TypeError(
                    "structured_outputs.json must be a schema dict or its JSON text, got "
                    f"{type(self.json).__name__}"
                )
            else:
                try:
                    json.dumps(self.json)
                except (TypeError, ValueError) as exc:
                    raise ValueError(
                        f"structured_outputs.json is not JSON-serialisable: {exc}"
                    ) from None
        if not isinstance(self.json_object, bool):
            raise TypeError(
                f"structured_outputs.json_object must be a bool, got {self.json_object!r}"
            )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty str")
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice):
                raise TypeError("structured_outputs.choice must be a list of str")
            if not self.choice:
                raise ValueError("structured_outputs.choice must not be empty")
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (for crossing a process boundary)."""
        return {
            "json": self.json
            if isinstance(self.json, str) or self.json is None
            else dict(self.json),
            "json_object": self.json_object,
            "regex": self.regex,
            "choice": list(self.choice) if self.choice is not None else None,
            "grammar": self.grammar,
        }
