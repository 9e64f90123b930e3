"""Memory (#24 item 2): a lazily committed KV pool sized from a budget or a context limit,
CLI flags for it, and ``LLM.close()`` releasing the model and the pool."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from model_helpers import random_hf_state, tiny_config, write_tiny_gguf

from deepinfer import LLM
from deepinfer.cli import _byte_size, build_parser, main
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.models.kv_pool import (
    KVPool,
    blocks_for_context,
    blocks_for_memory,
    bytes_per_block,
    lazy_zeros,
)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def test_pool_is_zero_and_committed_only_where_written() -> None:
    pool = KVPool(4, 8192, 16, 2, 64)  # 256 MiB
    before = _rss_bytes()
    k, v = pool.layer_caches(3)
    assert float(k[100].abs().sum()) == 0.0 and float(v[8191].abs().sum()) == 0.0
    k[5].fill_(1.0)
    grown = _rss_bytes() - before
    # Reading maps the zero page, one written block commits its pages (at most a 2 MiB page
    # per region on kernels that fault whole huge pages), never the 256 MiB.
    assert grown < 32 << 20, grown
    assert float(pool.k_cache(3)[5].sum()) == 16 * 2 * 64


def test_lazy_zeros_matches_torch_zeros_in_every_dtype() -> None:
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = lazy_zeros((3, 5, 7), dtype, "cpu")
        assert t.dtype == dtype and t.shape == (3, 5, 7) and t.is_contiguous()
        assert torch.equal(t, torch.zeros(3, 5, 7, dtype=dtype))


def test_pool_sizing_from_budget_and_context() -> None:
    cfg = tiny_config()
    per = bytes_per_block(cfg, 16, torch.float32)
    assert per == cfg.num_layers * 2 * 16 * cfg.num_kv_heads * cfg.head_dim * 4
    assert blocks_for_memory(cfg, 10 * per + per // 2) == 10
    with pytest.raises(ValueError, match="less than one block"):
        blocks_for_memory(cfg, per - 1)
    with pytest.raises(ValueError, match="kv memory"):
        blocks_for_memory(cfg, 0)
    assert blocks_for_context(4096, 8, 16) == 256 + 8
    assert blocks_for_context(17, 1, 16) == 3
    with pytest.raises(ValueError):
        blocks_for_context(0, 1)


def test_cli_parses_pool_flags() -> None:
    assert _byte_size("1.5GB") == 1_500_000_000
    assert _byte_size("512MiB") == 512 << 20
    assert _byte_size("4096") == 4096
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "hi", "--kv-memory", "lots"])
    args = parser.parse_args(
        ["generate", "hi", "--num-blocks", "64", "--max-model-len", "512", "--kv-memory", "1MiB"]
    )
    assert (args.num_blocks, args.max_model_len, args.kv_memory) == (64, 512, 1 << 20)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config(max_position_embeddings=512)
    path = tmp_path_factory.mktemp("mem-model") / "tiny.gguf"
    return write_tiny_gguf(path, cfg, random_hf_state(cfg, seed=5))


def test_llm_sizes_pool_from_kv_memory_and_close_frees_model_and_pool(
    gguf_path: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(max_position_embeddings=512)
    per = bytes_per_block(cfg, 16, torch.float32)
    llm = LLM(gguf_path, cache_dir=tmp_path, enable_prefix_caching=False, kv_memory=37 * per)
    assert llm.engine.config.num_blocks == 37
    out = llm.generate(["the cat"], SamplingParams(temperature=0, max_tokens=3))
    assert out[0].outputs[0].token_ids
    model = weakref.ref(llm.loaded.model)
    with llm:
        pass  # context-manager exit closes
    gc.collect()
    assert model() is None  # the weights (and the engine's pool with them) are gone
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(["again"], SamplingParams(max_tokens=1))


@pytest.mark.usefixtures("monkeypatch")
def test_cli_generate_with_context_sized_pool(
    gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path / "cache"))
    args = ["generate", "a hat", "--model", str(gguf_path), "--max-tokens", "3",
            "--max-model-len", "64", "--no-prefix-cache"]  # fmt: skip
    assert main(args) == 0
    assert capsys.readouterr().out.strip()
    assert main([*args, "--num-blocks", "8", "--kv-memory", "1MiB"]) != 0  # one or the other


def _resident_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s pages present in memory (``/proc/self/pagemap``: bit 63 of each
    page's entry, readable without privileges)."""
    import struct

    page = 4096
    first, last = t.data_ptr() // page, (t.data_ptr() + t.nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as fh:
        fh.seek(first * 8)
        entries = struct.unpack(f"<{last - first + 1}Q", fh.read((last - first + 1) * 8))
    return sum(page for e in entries if e >> 63)


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="Linux only")
def test_a_written_block_commits_its_own_pages_in_every_layer() -> None:
    """A model-shaped pool (30 layers x K/V: 60 regions) written one block: about a block's
    pages per region. With transparent huge pages each region committed 2-4 MB (the pool was
    advised MADV_HUGEPAGE by mistake: 238 MB after a 10-token prompt on SmolLM2)."""
    pool = KVPool(30, 1024, 16, 3, 64)  # 720 MiB, 12 KiB a block per region
    assert _resident_bytes(pool.tensor) <= 1 << 20
    for layer in range(30):
        k, v = pool.layer_caches(layer)
        k[0, :10].fill_(1.0)
        v[0, :10].fill_(1.0)
    # 60 regions x (12 KiB block, at most 2 pages more where it straddles them)
    assert _resident_bytes(pool.tensor) <= 60 * (12 + 8) * 1024 + (1 << 20)


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="Linux only")
def test_reused_blocks_keep_the_resident_pool_at_the_blocks_in_use() -> None:
    """Requests come and go (allocate, write, free) 200 times, 4 blocks at a time: the pool
    commits the pages of about 4 blocks, not of every block the allocator walked past."""
    pool = KVPool(2, 512, 16, 2, 64)  # 8 KiB a block per region, 4 regions
    for _ in range(200):
        blocks = pool.allocate(4)
        for layer in range(2):
            k, v = pool.layer_caches(layer)
            k[blocks].fill_(1.0)
            v[blocks].fill_(1.0)
        pool.free(blocks)
    # 4 regions x (4 blocks x 8 KiB + 2 straddled pages); a FIFO free list committed 12 MiB
    assert _resident_bytes(pool.tensor) <= 4 * (4 * 8 + 8) * 1024 + (1 << 20)
