"""Result type shared by the verification ops."""

from __future__ import annotations

from typing import Any, NamedTuple


class VerifyResult(NamedTuple):
    """What one verification step emits per request.

    * ``output_ids`` ``[B, G+1]`` int64: the accepted drafts followed by one corrected or bonus
      token, padded with -1. Row ``b`` holds exactly ``num_emitted[b]`` valid ids.
    * ``num_accepted`` ``[B]`` int64: drafts accepted (``0..num_draft_tokens[b]``).
    * ``num_emitted`` ``[B]`` int64: ``num_accepted + 1``.

    With DLPack inputs the three fields are arrays of the caller's kind.
    """

    output_ids: Any
    num_accepted: Any
    num_emitted: Any
