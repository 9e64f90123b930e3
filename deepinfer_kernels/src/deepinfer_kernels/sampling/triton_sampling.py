# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernel for ``sample``: top-k / top-p / min-p by rejection with a pivot, no sort and
no threshold search (FlashInfer's idea, kept exact for top-p over the top-k set).

With ``e_i = exp(x_i / T - max_j x_j / T)`` (so ``p_i = e_i / sum e``), the kept set is
``S = {e >= max(t_k, t_p, t_min)}``, an upper set of the weights. Each round draws a candidate
``x`` by inverse CDF from the tokens above the current pivot ``lo`` and counts, in one more
pass, how many tokens and how much mass lie strictly above ``e_x`` (and at or above it):

* min-p: ``x`` is kept iff ``e_x >= min_p`` (``e_max = 1``);
* top-k: iff fewer than ``k`` tokens are strictly above it;
* top-p: iff the mass strictly above it is below ``top_p`` times the top-k set's mass.

A kept candidate is returned. A rejected one is below the threshold, so every token with
``e <= e_x`` is too: the pivot rises to ``e_x`` and the next round draws from what is left.
Conditioned on acceptance the draw is exactly ``p`` restricted to ``S``, renormalised. Each
rejection removes at least half of the remaining mass in expectation, so rows finish in a few
rounds (two passes each) instead of two 32-step bisections (about 68 passes).

Top-p over top-k needs the top-k set's mass ``M_k``. Every counted token bounds it: one inside
the top-k set gives ``M_k >= mass(e >= e_y)``, one outside gives ``M_k <= mass(e > e_y)``, one
at the k-th value gives it exactly. When the bounds cannot yet decide a candidate, the next
round draws a pivot between them (from the tokens strictly between the largest known outside
value and the smallest known inside value) to narrow them; the candidate waits.

Round 0 uses the caller's uniform (an unfiltered row draws exactly the token the torch path
draws); later rounds use Philox numbers keyed by ``seed`` with a counter per row and round.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels.launch_configs import SAMPLING_MAX_ROUNDS, sampling_launch


@triton.jit
def _weights(x, inv_t, m):
    """``exp(x / T - m)``: one expression for every pass, so all passes see equal values."""
    return tl.exp(x * inv_t[:, None] - m[:, None])


@triton.jit
def _sample_kernel(
    lg_ptr, t_ptr, k_ptr, p_ptr, mp_ptr, u_ptr, seed_ptr, out_ptr, rounds_ptr,
    B, V, s_lg_b, s_lg_v,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, MAX_ROUNDS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    rmask = rows < B
    row_ptr = lg_ptr + rows.to(tl.int64) * s_lg_b
    temp = tl.load(t_ptr + rows, mask=rmask, other=1.0)
    greedy = temp == 0.0
    inv_t = 1.0 / tl.where(greedy, 1.0, temp)
    top_k = tl.load(k_ptr + rows, mask=rmask, other=0)
    top_p = tl.load(p_ptr + rows, mask=rmask, other=1.0)
    min_p = tl.load(mp_ptr + rows, mask=rmask, other=0.0)
    seed = tl.load(seed_ptr)

    # Pass 1: row max (of x / T), argmax of x (lowest id on ties), online sum of e.
    m = tl.full([BLOCK_B], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK_B], dtype=tl.float32)
    best = tl.full([BLOCK_B], float("-inf"), dtype=tl.float32)
    best_idx = tl.zeros([BLOCK_B], dtype=tl.int64)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        m2 = rmask[:, None] & (cols < V)[None, :]
        x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
        x = x.to(tl.float32)
        cmax = tl.max(x, axis=1)
        cidx = tl.min(tl.where(x == cmax[:, None], cols.to(tl.int64)[None, :], V), axis=1)
        better = cmax > best
        best_idx = tl.where(better, cidx, best_idx)
        best = tl.where(better, cmax, best)
        # A row that is -inf so far keeps a finite reference, so no inf - inf appears.
        m_new = tl.maximum(m, cmax * inv_t)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.exp(x * inv_t[:, None] - m_ref[:, None])
        s = s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - m_ref))
        s += tl.sum(tl.where(m2, e, 0.0), axis=1)
        m = m_new
    m = tl.where(m == float("-inf"), 0.0, m)

    need_k = (top_k > 0) & (top_k < V)
    need_p = top_p < 1.0
    # Rows whose decision (or whose next candidate set, after a min-p rejection) needs counts.
    counted = need_k | need_p | (min_p > 0.0)
    done = ~rmask | greedy
    token = tl.where(greedy, best_idx, -1)
    # Rejection state: candidates are e > lo, of mass `total`.
    lo = tl.full([BLOCK_B], -1.0, dtype=tl.float32)
    total = s
    # Top-k mass bounds: M_k in [k_lo_mass, k_hi_mass]; tokens strictly between k_lo_e (largest
    # value known outside the top-k set) and k_hi_e (smallest known inside) are unresolved.
    k_lo_e = tl.zeros([BLOCK_B], dtype=tl.float32)
    k_hi_e = tl.full([BLOCK_B], 2.0, dtype=tl.float32)
    k_lo_mass = tl.where(need_k, 0.0, s)
    k_hi_mass = s
    # A candidate waiting for the bounds: its token, weight and the mass strictly above it.
    waiting = tl.zeros([BLOCK_B], dtype=tl.int1)
    x_tok = tl.full([BLOCK_B], -1, dtype=tl.int64)
    x_e = tl.zeros([BLOCK_B], dtype=tl.float32)
    x_above = tl.zeros([BLOCK_B], dtype=tl.float32)

    rnd = 0
    while (tl.max((~done).to(tl.int32), axis=0) > 0) & (rnd < MAX_ROUNDS):
        live = ~done
        # Draw z from the candidates (e > lo), or a pivot from the unresolved top-k range.
        a = tl.where(waiting, k_lo_e, lo)
        b = tl.where(waiting, k_hi_e, 3.0)
        mass = tl.where(waiting, k_hi_mass - k_lo_mass, total)
        if rnd == 0:
            u = tl.load(u_ptr + rows, mask=rmask, other=0.0)
        else:
            u = tl.rand(seed, (rnd * B + rows).to(tl.int32))
        target = u * mass
        acc = tl.zeros([BLOCK_B], dtype=tl.float32)
        z = tl.full([BLOCK_B], -1, dtype=tl.int64)
        e_z = tl.zeros([BLOCK_B], dtype=tl.float32)
        last = tl.full([BLOCK_B], -1, dtype=tl.int64)
        e_last = tl.zeros([BLOCK_B], dtype=tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            cols64 = cols.to(tl.int64)[None, :]
            m2 = live[:, None] & (cols < V)[None, :]
            x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
            e = _weights(x.to(tl.float32), inv_t, m)
            w = tl.where(m2 & (e > a[:, None]) & (e < b[:, None]), e, 0.0)
            cdf = tl.cumsum(w, axis=1) + acc[:, None]
            hit = tl.min(tl.where((cdf > target[:, None]) & (w > 0), cols64, V), axis=1)
            new = (z < 0) & (hit < V)
            z = tl.where(new, hit, z)
            e_z = tl.where(new, tl.sum(tl.where(cols64 == hit[:, None], e, 0.0), axis=1), e_z)
            c_last = tl.max(tl.where(w > 0, cols64, -1), axis=1)
            has = c_last >= 0
            last = tl.where(has, c_last, last)
            e_last = tl.where(
                has, tl.sum(tl.where(cols64 == c_last[:, None], e, 0.0), axis=1), e_last
            )
            acc += tl.sum(w, axis=1)
        # Rounding can leave the target above the last cumulative value: take the last token.
        e_z = tl.where(z < 0, e_last, e_z)
        z = tl.where(z < 0, last, z)
        empty = z < 0

        n_gt = tl.zeros([BLOCK_B], dtype=tl.int64)
        n_ge = tl.zeros([BLOCK_B], dtype=tl.int64)
        w_gt = tl.zeros([BLOCK_B], dtype=tl.float32)
        w_ge = tl.zeros([BLOCK_B], dtype=tl.float32)
        count = live & counted & ~empty
        if tl.max(count.to(tl.int32), axis=0) > 0:
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + tl.arange(0, BLOCK_V)
                m2 = count[:, None] & (cols < V)[None, :]
                x = tl.load(row_ptr[:, None] + cols[None, :] * s_lg_v, mask=m2, other=float("-inf"))
                e = _weights(x.to(tl.float32), inv_t, m)
                gt = m2 & (e > e_z[:, None])
                ge = m2 & (e >= e_z[:, None])
                n_gt += tl.sum(gt.to(tl.int64), axis=1)
                n_ge += tl.sum(ge.to(tl.int64), axis=1)
                w_gt += tl.sum(tl.where(gt, e, 0.0), axis=1)
                w_ge += tl.sum(tl.where(ge, e, 0.0), axis=1)

        # What z says about the top-k set (a fact whatever z was drawn for).
        learn = live & need_k & ~empty
        outside = learn & (n_gt >= top_k)
        kth = learn & ~outside & (n_ge >= top_k)  # z is the k-th largest value: M_k exact
        inside = learn & ~outside & ~kth
        k_hi_mass = tl.where(outside, tl.minimum(k_hi_mass, w_gt), k_hi_mass)
        k_lo_e = tl.where(outside, tl.maximum(k_lo_e, e_z), k_lo_e)
        k_lo_mass = tl.where(inside, tl.maximum(k_lo_mass, w_ge), k_lo_mass)
        k_hi_e = tl.where(inside, tl.minimum(k_hi_e, e_z), k_hi_e)
        k_lo_mass = tl.where(kth, w_ge, k_lo_mass)
        k_hi_mass = tl.where(kth, w_ge, k_hi_mass)
        # An empty unresolved range means no positive weight sits there: the bounds meet.
        k_lo_mass = tl.where(live & waiting & empty, k_hi_mass, k_lo_mass)

        # A fresh draw becomes the candidate; a waiting candidate stays.
        fresh = live & ~waiting
        x_tok = tl.where(fresh, z, x_tok)
        x_e = tl.where(fresh, e_z, x_e)
        x_above = tl.where(fresh, w_gt, x_above)
        fail = fresh & ((e_z < min_p) | outside)
        p_keep = ~need_p | (x_above < top_p * k_lo_mass)
        p_drop = need_p & (x_above >= top_p * k_hi_mass)
        accept = live & ~fail & p_keep
        reject = live & (fail | (~p_keep & p_drop))
        # A draw from a non-empty candidate set is never empty; the argmax is always kept.
        broken = fresh & empty
        token = tl.where(accept, x_tok, token)
        token = tl.where(broken, best_idx, token)
        lo = tl.where(reject, x_e, lo)
        total = tl.where(reject, x_above, total)
        waiting = live & ~accept & ~reject & ~broken
        done = done | accept | broken
        tl.store(rounds_ptr + rows, (rnd + 1) + rows * 0, mask=rmask & live)
        rnd += 1

    token = tl.where(done, token, best_idx)
    tl.store(out_ptr + rows, token, mask=rmask)


def sample_triton(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    uniforms: torch.Tensor,
    seed: torch.Tensor,
    rounds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the rejection sampler on validated inputs. ``seed`` (int64 ``[1]``) keys the
    Philox numbers of rounds after the first; ``rounds`` (int32 ``[B]``, optional) receives how
    many rounds each row took (0 for greedy rows)."""
    batch, vocab = logits.shape
    out = torch.empty((batch,), dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    if rounds is None:
        rounds = torch.empty((batch,), dtype=torch.int32, device=logits.device)
    rounds.zero_()
    launch = sampling_launch(batch, vocab, logits.device.type == "cuda")
    block_b, block_v = launch["BLOCK_B"], launch["BLOCK_V"]
    _sample_kernel[(triton.cdiv(batch, block_b),)](
        logits,
        temperature.to(torch.float32).contiguous(),
        top_k.to(torch.int64).contiguous(),
        top_p.to(torch.float32).contiguous(),
        min_p.to(torch.float32).contiguous(),
        uniforms.to(torch.float32).contiguous(),
        seed.to(torch.int64).contiguous(),
        out, rounds, batch, vocab, logits.stride(0), logits.stride(1),
        BLOCK_B=block_b, BLOCK_V=block_v, MAX_ROUNDS=SAMPLING_MAX_ROUNDS,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    return out
