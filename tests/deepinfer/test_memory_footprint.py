"""Memory footprint guards (#24 item 2), without RSS thresholds (those are machine dependent and
live in ``benchmarks/engine_memory.py``): a GGUF model's weights are held once, as the memory
map of the block cache file (no anonymous copy beside it); `deepinfer generate` imports no heavy
optional dependency; the KV pool is committed only where written even after loading a model;
``LLM.close()`` unmaps the weights and frees the pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from quant_helpers import quant_config, write_quant_gguf

from deepinfer.models.gguf_model import BLOCKS_FILE
from deepinfer.models.loader import load_model
from deepinfer.models.quant_layers import QuantLinear

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)"
)

# Optional dependencies a plain generate must not import: each costs 2-143 MB of RSS on import
# (torch._dynamo 143, triton 71, ray 35, transformers 19, fastapi 14; measured with
# benchmarks/engine_memory.py's counters). benchmarks/engine_memory.py prints the same check.
HEAVY = ("triton", "transformers", "xgrammar", "llguidance", "fastapi", "uvicorn", "starlette",
         "ray", "gguf", "matplotlib", "scipy", "pandas", "sympy", "prometheus_client", "openai",
         "huggingface_hub", "torch._dynamo", "torch._inductor")  # fmt: skip


def file_ranges(name: str) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of files named ``name``."""
    out = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 6 and fields[5].endswith("/" + name):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi))
    return out


def weight_footprint(model: torch.nn.Module) -> tuple[int, int]:
    """``(bytes held by the model's tensors counted once per storage, of which in a mapping of
    the block cache file)``."""
    ranges = file_ranges(BLOCKS_FILE)
    seen: dict[int, int] = {}
    for t in model.state_dict().values():
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    mapped = sum(n for p, n in seen.items() if any(lo <= p and p + n <= hi for lo, hi in ranges))
    return sum(seen.values()), mapped


def file_tensor_bytes(path: Path) -> int:
    """Bytes of the tensors stored in a safetensors file."""
    from safetensors import safe_open

    sizes = {"U8": 1, "F32": 4, "F16": 2, "BF16": 2}
    total = 0
    with safe_open(os.fspath(path), framework="pt") as fh:
        for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
            part = fh.get_slice(name)
            count = 1
            for d in part.get_shape():
                count *= d
            total += count * sizes[part.get_dtype()]
    return total


def test_gguf_weights_are_the_block_file_mapping_once(tmp_path: Path) -> None:
    """Fused QKV/gate-up of mixed formats, a quantised table: every tensor the model holds is
    a view of the block cache's memory map (first load, which writes the cache, and later
    loads), and the bytes add up to the file's tensors, nothing more."""
    cfg = quant_config()
    types = {"attn_q": "Q4_1", "attn_k": "Q4_1", "attn_v": "Q8_0", "attn_output": "Q4_0",
             "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q8_0"}  # fmt: skip
    gguf_path = write_quant_gguf(tmp_path / "m.gguf", cfg, types, seed=3)
    first = load_model(gguf_path, cache_dir=tmp_path / "cache")
    blocks_file = first.path / BLOCKS_FILE
    assert blocks_file.is_file()
    second = load_model(gguf_path, cache_dir=tmp_path / "cache")
    x = torch.randn(3, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    for loaded in (first, second):
        total, mapped = weight_footprint(loaded.model)
        assert total == mapped, f"{total - mapped} bytes of weights outside the file's mapping"
        assert total == file_tensor_bytes(blocks_file)
        fused = [m for m in loaded.model.modules() if isinstance(m, QuantLinear)]
        assert any(len(m.layout) == 3 for m in fused)  # QKV joined across Q4_1/Q8_0
        for module in fused:  # the joined view computes what its parts do
            expect = torch.cat([p.data.reshape(-1) for p in module.parts()])
            assert torch.equal(module.weight.detach(), expect)
    layer = second.model.decoder_layers()[0]
    ref = layer.self_attn.qkv_proj.dequantized()
    torch.testing.assert_close(layer.self_attn.qkv_proj(x), x @ ref.T, rtol=1e-5, atol=1e-5)


def test_blocks_file_of_the_old_format_is_rebuilt(tmp_path: Path) -> None:
    """A format-1 cache (parts stored apart) is a miss: rewritten joined, same model."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    cfg = quant_config()
    roles = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    gguf_path = write_quant_gguf(tmp_path / "m.gguf", cfg, dict.fromkeys(roles, "Q8_0"), seed=1)
    first = load_model(gguf_path, cache_dir=tmp_path / "cache")
    path = first.path / BLOCKS_FILE
    with safe_open(os.fspath(path), framework="pt") as fh:
        meta = dict(fh.metadata())
        tensors = {n: fh.get_tensor(n).clone() for n in fh.keys()}  # noqa: SIM118
    del first
    save_file(tensors, os.fspath(path), metadata={**meta, "format": "1"})
    again = load_model(gguf_path, cache_dir=tmp_path / "cache")
    with safe_open(os.fspath(path), framework="pt") as fh:
        assert (fh.metadata() or {})["format"] != "1"
    total, mapped = weight_footprint(again.model)
    assert total == mapped


_GENERATE_CHECK = textwrap.dedent(
    """
    import contextlib, gc, io, json, sys, weakref
    sys.path.insert(0, {tests!r})
    from test_memory_footprint import HEAVY, file_ranges, weight_footprint
    from deepinfer.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["generate", "Hello", "--max-tokens", "4", "--temperature", "0",
                   "--max-model-len", "256", "--no-prefix-cache"])
    heavy = [m for m in HEAVY if m in sys.modules]

    from deepinfer import LLM, EngineConfig, SamplingParams
    from deepinfer.models.gguf_model import BLOCKS_FILE

    def resident(t):  # bytes of t's pages present in memory
        import struct
        first, last = t.data_ptr() // 4096, (t.data_ptr() + t.nbytes - 1) // 4096
        with open("/proc/self/pagemap", "rb") as fh:
            fh.seek(first * 8)
            raw = fh.read((last - first + 1) * 8)
        return 4096 * sum(e >> 63 for e in struct.unpack(f"<{{len(raw) // 8}}Q", raw))

    llm = LLM(engine_config=EngineConfig(max_model_len=2176, num_blocks=137),
              enable_prefix_caching=False)
    total, mapped = weight_footprint(llm.loaded.model)
    pool = llm.engine.pool
    pool_bytes, before = pool.tensor.nbytes, resident(pool.tensor)
    with llm:
        llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))
        after = resident(pool.tensor)
        model = weakref.ref(llm.loaded.model)
        pool_ref = weakref.ref(pool)
        del pool
    gc.collect()
    print(json.dumps(dict(rc=rc, text=out.getvalue(), heavy=heavy, total=total, mapped=mapped,
                          pool_bytes=pool_bytes, before=before, after=after,
                          model_alive=model() is not None, pool_alive=pool_ref() is not None,
                          mapped_after_close=len(file_ranges(BLOCKS_FILE)))))
    """
)


def test_generate_on_the_embedded_model_stays_lean() -> None:
    """In a fresh process: `deepinfer generate` imports no heavy optional module; the embedded
    model's weights are held once, as the file mapping; a 101 MB pool built after loading the
    weights (a heap-allocated pool was once zero-filled whole there; with huge pages a written
    block committed 2 MB per layer) commits only what a short request writes; and closing the
    LLM frees the model and the pool and unmaps the weights."""
    code = _GENERATE_CHECK.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    # The first load of a GGUF file parses it with `gguf` and writes the block cache; later
    # loads (what this checks) read the cache. Warm it in another process, as a fresh cache
    # directory (CI) would otherwise make this the first load.
    warm = "from deepinfer.models import load_model; load_model(None)"
    subprocess.run([sys.executable, "-c", warm], check=True, timeout=600, env=env)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0 and got["text"].strip(), got
    assert got["heavy"] == [], f"plain generate imported {got['heavy']}"
    assert got["total"] == got["mapped"] > 80 << 20, got  # the Q4_1 file's ~92 MB, once
    assert got["pool_bytes"] == 137 * 30 * 2 * 16 * 3 * 64 * 4
    assert got["before"] <= 1 << 20, got
    # a 5-10 token sequence: one block per (layer, K/V) region, a few pages each
    assert got["after"] <= 60 * 16 * 1024 + (1 << 20), got
    assert not got["model_alive"] and not got["pool_alive"], got
    assert got["mapped_after_close"] == 0, got
