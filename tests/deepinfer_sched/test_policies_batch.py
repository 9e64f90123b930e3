"""ContinuousBatchPolicy: hand-built iterations plus property-based invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_sched.policies import BatchConfig, BatchPlan, ContinuousBatchPolicy, SeqState


def _dec(i: int, ctx: int, prio: int = 0, arrival: float = 0.0) -> SeqState:
    return SeqState(
        i,
        prompt_len=ctx,
        num_computed_tokens=ctx,
        num_generated=1,
        max_tokens=100,
        priority=prio,
        arrival=arrival,
    )


def test_decode_first_then_chunked_prefill_under_budget() -> None:
    pol = ContinuousBatchPolicy(BatchConfig(max_num_seqs=8, max_batched_tokens=100))
    running = [_dec(1, 10), _dec(2, 20)]
    waiting = [SeqState(3, prompt_len=500, arrival=1.0)]
    plan = pol.schedule(waiting, running, free_kv_blocks=100, block_size=16)
    assert plan.decode_ids == [1, 2]
    assert plan.prefill_chunks == [(3, 98)]
    assert plan.num_batched_tokens == 100
    assert plan.preempted == []


def test_partial_prefill_continues_before_new_admissions() -> None:
    pol = ContinuousBatchPolicy(BatchConfig(max_num_seqs=8, max_batched_tokens=64))
    part = SeqState(5, prompt_len=100, num_computed_tokens=60, arrival=0.0)
    new = SeqState(6, prompt_len=10, arrival=0.0, priority=9)
    plan = pol.schedule([new], [part], free_kv_blocks=100, block_size=16)
    assert plan.prefill_chunks == [(5, 40), (6, 10)]


def test_priority_orders_waiting_and_max_num_seqs_caps_admission() -> None:
    pol = ContinuousBatchPolicy(BatchConfig(max_num_seqs=2, max_batched_tokens=1000))
    waiting = [
        SeqState(1, prompt_len=10, arrival=0.0, priority=0),
        SeqState(2, prompt_len=10, arrival=5.0, priority=1),
        SeqState(3, prompt_len=10, arrival=1.0, priority=1),
    ]
    plan = pol.schedule(waiting, [], free_kv_blocks=100, block_size=16)
    assert plan.prefill_chunks == [(3, 10), (2, 10)]


def test_without_chunking_prompts_are_whole_or_alone() -> None:
    pol = ContinuousBatchPolicy(BatchConfig(max_batched_tokens=64, chunked_prefill=False))
    plan = pol.schedule(
        [SeqState(1, prompt_len=50), SeqState(2, prompt_len=50)],
        [],
        free_kv_blocks=100,
        block_size=16,
    )
    assert plan.prefill_chunks == [(1, 50)]
    # A prompt longer than the budget still runs, alone, so it cannot starve.
    plan = pol.schedule([SeqState(1, prompt_len=500)], [], free_kv_blocks=100, block_size=16)
    assert plan.prefill_chunks == [(1, 500)]
    plan = pol.schedule([SeqState(1, prompt_len=500)], [_dec(9, 16)], 100, 16)
    assert plan.prefill_chunks == [] and plan.decode_ids == [9]


def test_lookahead_slots_count_against_token_and_block_budget() -> None:
    pol = ContinuousBatchPolicy(BatchConfig(max_batched_tokens=12))
    # 15 tokens have KV: the decode token fills block 0, slots spill into further blocks.
    ahead = [
        SeqState(1, prompt_len=15, num_computed_tokens=15, max_tokens=99, num_lookahead=5),
        SeqState(2, prompt_len=15, num_computed_tokens=15, max_tokens=99, num_lookahead=5),
    ]
    plan = pol.schedule([SeqState(3, prompt_len=50)], ahead, free_kv_blocks=10, block_size=16)
    assert plan.lookahead == {1: 5, 2: 5}
    # Two decode tokens and ten drafts fill the 12-token budget: no room for the prompt.
    assert plan.prefill_chunks == [] and plan.num_batched_tokens == 12
    # One free block: the first decode's slots take it, the second gets none (no preemption).
    plan = pol.schedule([], ahead, free_kv_blocks=1, block_size=16)
    assert plan.lookahead == {1: 5} and plan.preempted == []
    # Token budget smaller than the asks: trimmed in decode order.
    tight = ContinuousBatchPolicy(BatchConfig(max_batched_tokens=5))
    assert tight.schedule([], ahead, 10, 16).lookahead == {1: 3}
    with pytest.raises(ValueError, match="num_lookahead"):
        SeqState(1, prompt_len=1, num_lookahead=-1)


def test_kv_exhaustion_preempts_lowest_priority_latest_arrival() -> None:
    pol = ContinuousBatchPolicy(BatchConfig())
    # Three decodes on a block boundary need 3 fresh blocks; only 1 is free.
    running = [_dec(1, 32, prio=1, arrival=0.0), _dec(2, 32, arrival=1.0), _dec(3, 32, arrival=2.0)]
    plan = pol.schedule([], running, free_kv_blocks=1, block_size=16)
    assert plan.preempted == [3]
    # Freed 2 blocks -> 3 free, 2 needed: no further preemption.
    assert plan.decode_ids == [1, 2]


def test_new_prefill_limited_by_free_blocks() -> None:
    pol = ContinuousBatchPolicy(BatchConfig(max_batched_tokens=1000))
    plan = pol.schedule([SeqState(1, prompt_len=100)], [], free_kv_blocks=2, block_size=16)
    assert plan.prefill_chunks == [(1, 32)]
    plan = pol.schedule([SeqState(1, prompt_len=100)], [], free_kv_blocks=0, block_size=16)
    assert plan.prefill_chunks == []


def test_invalid_inputs_raise() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        BatchConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_batched_tokens"):
        BatchConfig(max_batched_tokens=0)
    with pytest.raises(ValueError, match="prompt_len"):
        SeqState(1, prompt_len=0)
    with pytest.raises(ValueError, match="block_size"):
        ContinuousBatchPolicy().schedule([], [], 1, 0)
    with pytest.raises(ValueError, match="free_kv_blocks"):
        ContinuousBatchPolicy().schedule([], [], -1, 16)


seq_states = st.builds(
    SeqState,
    seq_id=st.integers(0, 10_000),
    prompt_len=st.integers(1, 300),
    num_computed_tokens=st.integers(0, 400),
    num_generated=st.integers(0, 5),
    max_tokens=st.integers(1, 50),
    priority=st.integers(0, 2),
    arrival=st.floats(0, 10),
    num_lookahead=st.integers(0, 6),
)


@given(
    running=st.lists(seq_states, max_size=12, unique_by=lambda s: s.seq_id),
    waiting=st.lists(
        seq_states.map(
            lambda s: SeqState(
                s.seq_id + 20_000, s.prompt_len, 0, 0, s.max_tokens, s.priority, s.arrival
            )
        ),
        max_size=12,
        unique_by=lambda s: s.seq_id,
    ),
    free=st.integers(0, 40),
    block_size=st.sampled_from([1, 4, 16]),
    max_seqs=st.integers(1, 16),
    budget=st.integers(1, 256),
    chunked=st.booleans(),
)
def test_plan_invariants(
    running: list[SeqState],
    waiting: list[SeqState],
    free: int,
    block_size: int,
    max_seqs: int,
    budget: int,
    chunked: bool,
) -> None:
    cfg = BatchConfig(max_num_seqs=max_seqs, max_batched_tokens=budget, chunked_prefill=chunked)
    plan: BatchPlan = ContinuousBatchPolicy(cfg).schedule(waiting, running, free, block_size)
    by_id = {s.seq_id: s for s in running + waiting}
    pre = set(plan.preempted)
    dec = set(plan.decode_ids)
    chunk_ids = [i for i, _ in plan.prefill_chunks]
    # Each sequence appears at most once and preempted ones do not run.
    assert len(chunk_ids) == len(set(chunk_ids))
    assert not (pre & dec) and not (pre & set(chunk_ids)) and not (dec & set(chunk_ids))
    assert pre <= {s.seq_id for s in running}
    assert all(not by_id[i].in_prefill for i in dec)
    # Every non-preempted decoding sequence decodes.
    assert dec == {s.seq_id for s in running if not s.in_prefill} - pre
    # Token budget holds whenever chunking is on (off: a lone oversized prompt may exceed).
    if chunked:
        assert plan.num_batched_tokens <= max(budget, len(dec))
    for i, n in plan.prefill_chunks:
        s = by_id[i]
        assert 0 < n <= s.prompt_len - s.num_computed_tokens
    # KV blocks: new blocks needed never exceed what is free plus what preemption freed.
    freed = sum(-(-by_id[i].num_computed_tokens // block_size) for i in pre)
    need = sum(1 for i in dec if by_id[i].num_computed_tokens % block_size == 0)
    # Look-ahead slots: only decodes get them, at most what they asked for, in their blocks.
    assert set(plan.lookahead) <= dec
    for i, slots in plan.lookahead.items():
        c = by_id[i].num_computed_tokens
        assert 0 < slots <= by_id[i].num_lookahead
        need += -(-(c + 1 + slots) // block_size) - -(-(c + 1) // block_size)
    for i, n in plan.prefill_chunks:
        c = by_id[i].num_computed_tokens
        need += -(-(c + n) // block_size) - -(-c // block_size)
    assert need <= free + freed
    # Admissions respect max_num_seqs.
    new = [i for i in chunk_ids if i >= 20_000]
    assert len(running) - len(pre) + len(new) <= max(max_seqs, len(running) - len(pre))
