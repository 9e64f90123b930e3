"""GPU check section: speculative verification, sampling and KV page movement.

* ``speculative_verify`` at B=256, gamma=5, V=129280 (fp32 probabilities): time, and bandwidth
  two ways, as a fraction of the H200's 4.8 TB/s: (a) the bytes of ``target_probs`` the kernel
  must read (two scalars per draft plus two passes over the one row each request draws from;
  the draft row too for rejected requests), and (b) the whole ``target_probs`` tensor / time,
  the figure a kernel that streams all of it would have to reach.
* ``sample`` (Triton) vs ``torch.multinomial(torch.softmax(logits / T))`` at B=256, V=129280,
  unfiltered and with top-k 50 / top-p 0.9 (the filtered case also against our torch path).
* ``gather_blocks`` / ``scatter_blocks`` / ``write_kv`` bandwidth (bytes read + written / time)
  on a bf16 pool, with ``torch.index_select`` as the baseline.

GPU-only work happens inside ``run()``; importing this module is cheap and safe on CPU.
"""

from __future__ import annotations

PEAK_BYTES_PER_S = 4.8e12
B, G, V = 256, 5, 129280


def _bench(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    """Median seconds per call with CUDA events (after warm-up)."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def _pct(bytes_: float, seconds: float) -> str:
    return f"{bytes_ / seconds / 1e12:.2f} TB/s ({100 * bytes_ / seconds / PEAK_BYTES_PER_S:.0f}%)"


def _verify_rows(label: str, close: bool) -> list[str]:
    import torch

    import deepinfer_kernels as dk

    g = torch.Generator(device="cuda").manual_seed(0)
    p_t = torch.softmax(torch.randn(B, G + 1, V, device="cuda", generator=g), -1)
    noise = torch.randn(B, G, V, device="cuda", generator=g)
    # close: high acceptance, most requests take the bonus row; else mostly early rejections.
    p_d = torch.softmax(torch.log(p_t[:, :G]) + 0.05 * noise if close else noise, -1)
    ids = torch.multinomial(p_d.view(-1, V), 1, generator=g).view(B, G)
    n = torch.full((B,), G, device="cuda")
    res = dk.speculative_verify(ids, p_d, p_t, n, generator=g)
    rejected = int((res.num_accepted < n).sum())
    row_bytes = V * p_t.element_size()
    touched = B * 2 * G * 4 + 2 * B * row_bytes + 2 * rejected * row_bytes
    full = p_t.numel() * p_t.element_size()
    rows = []
    for checks in (True, False):
        t = _bench(
            lambda c=checks: dk.speculative_verify(ids, p_d, p_t, n, generator=g, check_values=c)
        )
        rows.append(
            f"| {label} | {checks} | {float(res.num_accepted.float().mean()):.2f} | "
            f"{t * 1e6:.0f} | {_pct(touched, t)} | {_pct(full, t)} |"
        )
    return rows


def verify_table() -> str:
    import torch

    rows = _verify_rows("independent draft", close=False)
    torch.cuda.empty_cache()
    rows += _verify_rows("draft close to target", close=True)
    head = (
        f"### speculative_verify, B={B}, gamma={G}, V={V}, fp32\n\n"
        "| drafts | check_values | mean accepted | time (us) | bytes read / time | "
        "whole target_probs / time |\n|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n"


def sample_table() -> str:
    import torch

    import deepinfer_kernels as dk

    g = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        logits = (3 * torch.randn(B, V, device="cuda", generator=g)).to(dtype)
        base = _bench(lambda x=logits: torch.multinomial(torch.softmax(x.float() / 0.8, -1), 1))
        ours = _bench(lambda x=logits: dk.sample(x, 0.8, 0, 1.0, generator=g))
        ours_unchecked = _bench(
            lambda x=logits: dk.sample(x, 0.8, 0, 1.0, generator=g, check_values=False)
        )
        filt = _bench(lambda x=logits: dk.sample(x, 0.8, 50, 0.9, generator=g))
        filt_torch = _bench(
            lambda x=logits: dk.sample(x, 0.8, 50, 0.9, generator=g, use_triton=False)
        )
        rows.append(
            f"| {str(dtype).removeprefix('torch.')} | {base * 1e6:.0f} | {ours * 1e6:.0f} "
            f"({base / ours:.2f}x) | {ours_unchecked * 1e6:.0f} ({base / ours_unchecked:.2f}x) | "
            f"{filt * 1e6:.0f} | {filt_torch * 1e6:.0f} ({filt_torch / filt:.2f}x) |"
        )
    head = (
        f"### sample, B={B}, V={V}\n\n"
        "| logits | softmax + multinomial (us) | ours, T=0.8 (speed-up) | ours, unchecked | "
        "ours, top-k 50 + top-p 0.9 (us) | torch path, same filters (Triton speed-up) |\n"
        "|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n"


def _pool_rows() -> list[str]:
    import torch

    import deepinfer_kernels as dk

    g = torch.Generator(device="cuda").manual_seed(2)
    # A 4k-block pool of [block 16, 8 KV heads, head_dim 128] bf16 pages (32 KiB each).
    pool = torch.randn(4096, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    ids = torch.randperm(4096, device="cuda", generator=g)[:1024]
    moved = 2 * ids.numel() * pool[0].numel() * pool.element_size()
    t = _bench(lambda: dk.gather_blocks(pool, ids))
    tb = _bench(lambda: torch.index_select(pool, 0, ids))
    rows = [
        f"| gather_blocks [4096,16,8,128], 1024 ids | {t * 1e6:.0f} | {_pct(moved, t)} | {_pct(moved, tb)} |"
    ]
    src = dk.gather_blocks(pool, ids)
    t = _bench(lambda: dk.scatter_blocks(pool, ids, src, check_values=False))
    tb = _bench(lambda: pool.index_copy_(0, ids, src))
    rows.append(f"| scatter_blocks, same | {t * 1e6:.0f} | {_pct(moved, t)} | {_pct(moved, tb)} |")
    return rows


def _layered_rows() -> list[str]:
    import torch

    import deepinfer_kernels as dk

    g = torch.Generator(device="cuda").manual_seed(3)
    # A layered pool [layers 16, k/v 2, blocks 1024, 16, 8, 128]: gather along block_dim=2.
    layered = torch.randn(16, 2, 1024, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    ids = torch.randperm(1024, device="cuda", generator=g)[:256]
    moved = 2 * layered[:, :, 0].numel() * ids.numel() * layered.element_size()
    t = _bench(lambda: dk.gather_blocks(layered, ids, block_dim=2))
    tb = _bench(lambda: torch.index_select(layered, 2, ids))
    return [
        f"| gather_blocks [16,2,1024,16,8,128] dim 2, 256 ids | {t * 1e6:.0f} | {_pct(moved, t)} | {_pct(moved, tb)} |"
    ]


def _write_rows() -> list[str]:
    import torch

    import deepinfer_kernels as dk

    g = torch.Generator(device="cuda").manual_seed(4)
    kc = torch.zeros(8192, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    k = torch.randn(8192, 8, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(8192 * 16, device="cuda", generator=g)[:8192]
    moved = 2 * 2 * k.numel() * k.element_size()
    t = _bench(lambda: dk.write_kv(k, k, kc, vc, slots, check_values=False))

    def baseline() -> None:
        kc.view(-1, 8, 128).index_copy_(0, slots, k)
        vc.view(-1, 8, 128).index_copy_(0, slots, k)

    tb = _bench(baseline)
    return [
        f"| write_kv 8192 tokens x 8 x 128 | {t * 1e6:.0f} | {_pct(moved, t)} | {_pct(moved, tb)} |"
    ]


def kv_table() -> str:
    import torch

    rows = []
    for part in (_pool_rows, _layered_rows, _write_rows):
        rows += part()
        torch.cuda.empty_cache()
    head = (
        "### KV page movement (bf16; bytes read + written / time)\n\n"
        "| op | time (us) | ours | torch index_select / index_copy_ |\n|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n"


def run() -> str:
    try:
        import torch
    except ImportError:
        return "## Verification, sampling and KV movement\n\nskipped: torch is not installed\n"
    if not torch.cuda.is_available():
        return "## Verification, sampling and KV movement\n\nskipped: no CUDA device\n"
    import traceback

    parts = ["## Verification, sampling and KV movement\n"]
    for table in (verify_table, sample_table, kv_table):
        try:  # one failing table must not hide the others
            parts.append(table())
        except Exception:
            parts.append(f"### {table.__name__}\n\nFAILED:\n```\n{traceback.format_exc()}\n```\n")
        torch.cuda.empty_cache()
    return "\n".join(parts)
