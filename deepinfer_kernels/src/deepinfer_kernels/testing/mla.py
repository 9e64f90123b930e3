"""Hypothesis strategies for MLA attention: ragged batches (decode, verify, extend) over a
shuffled paged latent cache.

Example::

    from hypothesis import given
    from deepinfer_kernels.testing.mla import mla_cases

    @given(mla_cases())
    def test_mla(case):
        out = mla_paged_attention(*case.tensors(), scale=case.scale)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

# (atol, rtol) against the fp32 reference; half types round the probabilities and the cache.
MLA_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 3e-2),
}


@dataclass(frozen=True)
class MlaCase:
    q_nope: torch.Tensor
    q_rope: torch.Tensor
    latent_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    scale: float
    causal: bool

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (
            self.q_nope, self.q_rope, self.latent_cache,
            self.block_table, self.seq_lens, self.cu_seqlens_q,
        )  # fmt: skip


def build_mla_case(
    q_lens: list[int],
    seq_lens: list[int],
    *,
    heads: int,
    rank: int,
    rope: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    causal: bool = True,
) -> MlaCase:
    """A case whose sequences own disjoint, shuffled blocks of one pool (plus a spare block)."""
    gen = torch.Generator().manual_seed(seed)
    used = [(n + block_size - 1) // block_size for n in seq_lens]
    max_blocks = max([1, *used])
    num_blocks = sum(used) + 1
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    i = 0
    for b, u in enumerate(used):
        table[b, :u] = torch.tensor(perm[i : i + u], dtype=torch.int32)
        i += u
    total_q = sum(q_lens)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cache = torch.randn(num_blocks, block_size, rank + rope, generator=gen)
    q_nope = torch.randn(total_q, heads, rank, generator=gen)
    q_rope = torch.randn(total_q, heads, rope, generator=gen)

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    return MlaCase(
        put(q_nope.to(dtype)), put(q_rope.to(dtype)), put(cache.to(dtype)), put(table),
        put(torch.tensor(seq_lens, dtype=torch.int32)), put(cu),
        (rank + rope) ** -0.5 * 0.5, causal,
    )  # fmt: skip


@st.composite
def mla_cases(
    draw: st.DrawFn,
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16),
    device: str = "cpu",
    max_batch: int = 3,
    max_seq_len: int = 70,
    allow_non_causal: bool = False,
) -> MlaCase:
    """Mixed decode (q_len 1), verify (a few) and extend (q_len = seq_len) rows, sequences that
    end mid-block, empty-query sequences, head counts and widths off the kernel tiles."""
    batch = draw(st.integers(1, max_batch))
    seq_lens, q_lens = [], []
    for _ in range(batch):
        n = draw(st.integers(0, max_seq_len))
        kind = draw(st.sampled_from(["decode", "verify", "extend"]))
        m = {"decode": min(1, n), "verify": min(n, draw(st.integers(0, 5))), "extend": n}[kind]
        seq_lens.append(n)
        q_lens.append(m)
    return build_mla_case(
        q_lens,
        seq_lens,
        heads=draw(st.sampled_from([1, 3, 16, 20])),
        rank=draw(st.sampled_from([16, 40, 64])),
        rope=draw(st.sampled_from([8, 16])),
        block_size=draw(st.sampled_from([1, 4, 16])),
        dtype=draw(st.sampled_from(dtypes)),
        device=device,
        seed=draw(st.integers(0, 2**31 - 1)),
        causal=draw(st.booleans()) if allow_non_causal else True,
    )
