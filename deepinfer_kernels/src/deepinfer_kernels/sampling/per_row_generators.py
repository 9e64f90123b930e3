"""``sample_with_generators``: one ``sample`` over a batch whose rows may carry their own seed.

An engine serves requests with a ``seed`` (their own random stream, vLLM's per-request
generator) beside requests that share the engine's stream. Rows without a generator are drawn
together from ``shared``, in row order; each seeded row is then drawn alone from its own
generator. So an unseeded row's draw does not depend on which seeded rows share its batch, and
a seeded request repeats itself exactly whatever else runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from deepinfer_kernels.sampling.sample import sample


def sample_with_generators(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    generators: Sequence[torch.Generator | None],
    shared: torch.Generator,
) -> list[int]:
    """One token per row of ``logits`` ``[B, V]`` with per-row ``[B]`` parameters, as
    :func:`sample` draws it; row ``b`` draws from ``generators[b]`` (``None``: ``shared``).

    Rows are drawn on each generator's device. When every row is greedy and finite no
    generator is touched: one pass gives each row's first maximal index, as ``sample`` picks
    (a row with NaN or +inf takes the full path and its error).

    Example::

        tokens = sample_with_generators(logits, t, k, p, m, [None, seeded_gen], engine_gen)
    """
    if len(generators) != logits.shape[0]:
        raise ValueError(f"generators: expected {logits.shape[0]} entries, got {len(generators)}")
    if logits.shape[0] and bool((temperature == 0).all()):
        best, index = logits.float().max(dim=-1)
        if bool(torch.isfinite(best).all()):
            return [int(t) for t in index.tolist()]
    out: list[int] = [0] * logits.shape[0]
    unseeded = [i for i, g in enumerate(generators) if g is None]
    groups: list[tuple[list[int], torch.Generator]] = [(unseeded, shared)] if unseeded else []
    groups.extend(([i], g) for i, g in enumerate(generators) if g is not None)
    for rows, gen in groups:
        drawn = sample(
            logits[rows].float().to(gen.device),
            *(t[rows].to(gen.device) for t in (temperature, top_k, top_p, min_p)),
            generator=gen,
        )
        for i, token in zip(rows, drawn.tolist()):
            out[i] = int(token)
    return out
