"""`ProfileGrid`: which steps an offline profile times, and the rows it builds from timings."""

from __future__ import annotations

import pytest

from deepinfer_sched.costmodel import (
    EngineLimits,
    ProfileGrid,
    decode_row,
    fit_profile,
    profile_header,
)


def _limits(**overrides: int) -> EngineLimits:
    values = {
        "max_batched_tokens": 256,
        "max_num_seqs": 4,
        "capacity_tokens": 1024,
        "max_model_len": 512,
        "block_size": 16,
    }
    values.update(overrides)
    return EngineLimits(**values)


def test_shapes_the_engine_cannot_hold_are_left_out() -> None:
    grid = ProfileGrid(
        prefill_lens=(16, 256, 300, 1024), batch_sizes=(1, 4, 8), context_lens=(64, 256)
    )
    # 300 > max_batched_tokens; 1024 is past the model length too.
    assert grid.prefill_lens_within(_limits()) == [16, 256]
    assert grid.prefill_lens_within(_limits(max_model_len=256)) == [16]  # a prompt < the limit
    assert grid.prefill_lens_within(_limits(capacity_tokens=256)) == [16]  # + its first token
    # 8 sequences > max_num_seqs; 4 x (256 + 6 + 16) > 1024 tokens of KV; 1 x 262 fits.
    assert grid.decode_shapes_within(_limits()) == [(1, 64), (1, 256), (4, 64)]
    # A sequence's prompt plus its generated tokens must stay under the model length.
    assert grid.decode_shapes_within(_limits(max_model_len=262)) == [(1, 64), (4, 64)]


def test_run_times_each_admitted_shape_and_builds_rows_the_fit_reads() -> None:
    grid = ProfileGrid(
        prefill_lens=(16, 64, 4096),
        batch_sizes=(1, 2),
        context_lens=(32,),
        decode_steps=3,
        repeats=2,
    )
    prefills: list[int] = []

    def time_prefill(n: int) -> float:
        prefills.append(n)
        return 1e-3 + n * 1e-5

    def time_decode(b: int, ctx: int) -> list[float]:
        # One pure step more than asked for: the grid keeps ``decode_steps`` of them.
        return [1e-3 * b + ctx * 1e-6] * (grid.decode_steps + 1) if b == 1 else []

    rows = grid.run(_limits(), time_prefill, time_decode)
    assert prefills == [16, 16, 64, 64]  # ``repeats`` per admitted length, 4096 left out
    assert [r["new_tokens"] for r in rows["prefill"]] == [16, 64]
    assert rows["prefill"][1] == {"new_tokens": 64, "cached_tokens": 0, "seconds": [0.00164] * 2}
    # Batch 2 timed no pure step: no row. Batch 1: 3 steps, context at the middle one.
    assert rows["decode"] == [decode_row(1, 32, [0.001032] * 3)]
    assert rows["decode"][0]["context_tokens"] == 1 * (32 + 2 + 1)
    header = profile_header({}, kv_bytes_per_token=64, kv_capacity_tokens=1024)
    cm = fit_profile({**header, **rows})
    assert cm.prefill_time(64, 0) > cm.prefill_time(16, 0) > 0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"prefill_lens": (16, 0)}, "prefill_lens"),
        ({"batch_sizes": (1.5,)}, "batch_sizes"),
        ({"context_lens": (True,)}, "context_lens"),
        ({"decode_steps": 0}, "decode_steps"),
        ({"repeats": -1}, "repeats"),
    ],
)
def test_bad_grids_and_limits_name_the_argument(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ProfileGrid(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size"):
        _limits(block_size=0)
