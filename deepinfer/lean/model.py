"""The lean runtime's forward: a GGUF Llama on the engine's C kernels, numpy arrays, no torch.

Per layer, as the engine's compiled decode step runs it (``LlamaModel._forward_fused``): one
call for QKV + RoPE + the K/V write, one for the attention, one for the output projection +
residual + norm + SwiGLU MLP + residual + the next norm; the token embedding and the LM head are
the engine's C entries too (``deepinfer_kernels.cpu.numpy_ops``). A decode step binds its calls
once (:class:`DecodeStep`) and rewrites only what changes: the RoPE row, the slot, the key
length. A prompt runs in chunks of up to :data:`PREFILL_CHUNK` rows, its attention as causal
tiles of 16 queries. A chunk of more than 16 rows runs its four products per layer as the
engine's ``quant_linear`` does, on numpy's OpenBLAS sgemm inside the kernels' OpenMP region
(``deepinfer_quant_linear_sgemm``), where the engine's rule picks OpenBLAS
(``deepinfer_kernels.quant.blas_choice``: a non-Intel CPU with threadpoolctl installed), and
its attention as two GEMMs a head and 64-row block on the same sgemm
(``NumpyKernels.causal_attention``); elsewhere, and for short chunks, the fused block-kernel
layer calls and the 16-query tiles.

Example::

    model = LeanModel(load_weights(files.blocks), max_tokens=2048)
    logits = model.prefill(prompt_ids)  # [vocab] of the last prompt token
    logits = model.decode(next_id)
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from deepinfer.lean.kv_cache import BLOCK_SIZE, KVCache
from deepinfer.lean.rope import Rope, rotate_and_write_kv
from deepinfer.lean.weights import LeanWeights
from deepinfer_kernels.cpu.numpy_blocks import LayerBlockRows
from deepinfer_kernels.cpu.numpy_ops import MAX_TILE_Q, SGEMM_MIN_ROWS, NumpyKernels
from deepinfer_kernels.quant.blas_choice import SingleThreadSgemm, default_blas_choice

PREFILL_CHUNK = 256
F32 = np.float32
# Positions in the attention call's arguments that a decode step changes.
_NUM_PAGES, _KEY_LEN = 12, 13


class KernelsUnavailable(RuntimeError):
    """The compiled CPU kernels cannot run here (no C compiler, or turned off): the lean
    runtime needs them; the engine has torch paths."""


class LeanModel:
    """One sequence at a time over ``weights``, context ``max_tokens`` (see the module doc).
    ``reset()`` starts a new sequence; :attr:`length` is the number of positions cached."""

    def __init__(
        self,
        weights: LeanWeights,
        max_tokens: int,
        kernels: NumpyKernels | None = None,
        sgemm: SingleThreadSgemm | str | None = "auto",
    ) -> None:
        """``sgemm``: the many-row products' BLAS (``"auto"``: the engine's rule,
        ``default_blas_choice().in_region_sgemm()``; None: the block kernels only)."""
        if not (sgemm is None or sgemm == "auto" or isinstance(sgemm, SingleThreadSgemm)):
            raise ValueError(f"sgemm: expected 'auto', None or a SingleThreadSgemm, got {sgemm!r}")
        cfg = weights.config
        if not isinstance(max_tokens, int) or max_tokens < 2:
            raise ValueError(f"max_tokens: expected an int >= 2, got {max_tokens!r}")
        self.weights, self.config, self.dims = weights, cfg, weights.dims
        self.kernels = kernels or NumpyKernels()
        if not self.kernels.available():
            reason = self.kernels.unavailable_reason()
            raise KernelsUnavailable(f"the lean runtime needs the compiled CPU kernels: {reason}")
        self.max_tokens = max_tokens
        self.cache = KVCache(cfg.num_layers, max_tokens, cfg.num_kv_heads, cfg.head_dim)
        self.rope = Rope(cfg.head_dim, cfg.rope_theta)
        self.scale = float(cfg.head_dim**-0.5)
        self.eps = float(cfg.rms_norm_eps)
        self.length = 0
        self.sgemm: SingleThreadSgemm | None = (
            default_blas_choice().in_region_sgemm() if isinstance(sgemm, str) else sgemm
        )
        self._step = DecodeStep(self)

    def reset(self) -> None:
        """Forget the sequence (its cache pages are overwritten by the next one)."""
        self.length = 0

    def _check_room(self, count: int) -> None:
        if self.length + count > self.max_tokens:
            raise ValueError(
                f"the context holds {self.max_tokens} tokens; {self.length} are used and "
                f"{count} more were given"
            )

    def prefill(self, ids: list[int] | np.ndarray, all_logits: bool = False) -> np.ndarray:
        """Append ``ids`` (a prompt, or its rest) and return the logits of the last one
        (``[vocab]``), or of every one (``[len(ids), vocab]``) with ``all_logits``."""
        tokens = np.asarray(ids, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("ids: expected at least one token")
        self._check_room(int(tokens.size))
        rows = []
        # OpenBLAS held to one thread while the OpenMP threads each run a share on it.
        with self.sgemm.one_thread() if self.sgemm is not None else nullcontext(0) as address:
            for start in range(0, tokens.size, PREFILL_CHUNK):
                normed = self._chunk(tokens[start : start + PREFILL_CHUNK], address)
                rows.append(normed if all_logits else normed[-1:])
        hidden = np.ascontiguousarray(np.concatenate(rows) if all_logits else rows[-1])
        logits = self.kernels.linear(hidden, self.weights.head)
        return logits if all_logits else logits[0]

    def decode(self, token: int) -> np.ndarray:
        """Append one token and return its logits ``[vocab]`` (the bound step)."""
        self._check_room(1)
        return self._step.run(int(token))

    def _chunk(self, tokens: np.ndarray, sgemm: int) -> np.ndarray:
        """Run ``tokens`` at the next positions; returns their final-norm hidden ``[T, H]``.
        ``sgemm``: the one-thread sgemm's address for many-row products (0: none)."""
        w, d, k = self.weights, self.dims, self.kernels
        t, start = int(tokens.size), self.length
        tiles = -(-t // MAX_TILE_Q)
        padded = tiles * MAX_TILE_Q if t > 1 else 1
        max_q = MAX_TILE_Q if t > 1 else 1
        positions = np.arange(start, start + t, dtype=np.int64)
        cos, sin = self.rope.tables(positions)
        residual, normed = k.add_rms_norm(
            k.embed(w.embed, tokens), None, w.input_norms[0], self.eps
        )
        # Padded rows (past t) stay zero and attend to nothing: the kernel writes them zeros.
        qkv = np.zeros((padded, d.qkv_width), dtype=F32)
        attn = np.zeros((padded, d.num_heads, d.head_dim), dtype=F32)
        scratch = np.empty(d.scratch_size(t), dtype=F32)
        key_len = start + t
        query = start + np.arange(padded)
        keep = (np.arange(key_len)[None, :] <= query[:, None]) & (np.arange(padded) < t)[:, None]
        keep = np.ascontiguousarray(keep.reshape(tiles if t > 1 else 1, max_q, key_len))
        num_pages = -(-key_len // BLOCK_SIZE)
        pages = np.ascontiguousarray(np.tile(self.cache.page_ids[:num_pages], keep.shape[0]))
        many = bool(sgemm) and t >= SGEMM_MIN_ROWS
        for i, layer in enumerate(w.layers):
            k_cache, v_cache = self.cache.layer(i)
            if many:
                qkv[:t] = k.linear(normed, layer.qkv, layer.qkv_bias, sgemm=sgemm)
                rotate_and_write_kv(qkv[:t], cos, sin, positions, k_cache, v_cache,
                                    d.num_heads, d.num_kv_heads)  # fmt: skip
            else:
                k.layer_qkv(normed, layer, cos, sin, positions, k_cache, v_cache, qkv[:t])
            if many:  # the cache's pages are in order: slot j holds position j
                k.causal_attention(qkv[:t], d.num_heads, d.head_dim, k_cache, v_cache,
                                   attn[:t], start=start, scale=self.scale, sgemm=sgemm)  # fmt: skip
            else:
                k.attention(
                    qkv, d.num_heads, d.head_dim, k_cache, v_cache, attn, page_ids=pages,
                    keep=keep, num_tiles=keep.shape[0], max_q=max_q, num_pages=num_pages,
                    key_len=key_len, scale=self.scale,
                )  # fmt: skip
            attn_rows = attn.reshape(padded, -1)[:t]
            if many:
                residual, normed = self._mlp_sgemm(attn_rows, layer, residual, i, sgemm)
            else:
                k.layer_mlp(attn_rows, layer, residual, normed, w.post_norms[i],
                            w.next_norm(i), self.eps, scratch)  # fmt: skip
        self.length += t
        return normed

    def _mlp_sgemm(
        self, attn: np.ndarray, layer: LayerBlockRows, residual: np.ndarray, i: int, sgemm: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``deepinfer_qdecoder_mlp``'s computation with its three products on the sgemm:
        returns the new ``(residual, normed)``."""
        k, w, inter = self.kernels, self.weights, self.dims.intermediate
        delta = k.linear(attn, layer.o, sgemm=sgemm)
        residual, normed = k.add_rms_norm(residual, delta, w.post_norms[i], self.eps)
        gate_up = k.linear(normed, layer.gate_up, sgemm=sgemm)
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
        # silu(g) u = g / (1 + e^-g) u, in fp32 as the C layer computes it.
        act = np.negative(gate)
        np.exp(act, out=act)
        act += F32(1.0)
        np.divide(gate, act, out=act)
        act *= up
        down = k.linear(act, layer.down, sgemm=sgemm)
        return k.add_rms_norm(residual, down, w.next_norm(i), self.eps)


class DecodeStep:
    """A one-token step's calls bound over buffers it owns (as the engine's ``BoundStep``):
    each step copies the token's embedding and RoPE row in, sets its slot and key length, and
    runs 3 calls per layer with prepared arguments, then the LM head."""

    def __init__(self, model: LeanModel) -> None:
        w, d, k, cache = model.weights, model.dims, model.kernels, model.cache
        self.model = model
        self.residual = np.zeros((1, d.hidden), dtype=F32)
        self.normed = np.zeros((1, d.hidden), dtype=F32)
        self.qkv = np.zeros((1, d.qkv_width), dtype=F32)
        self.attn = np.zeros((1, d.num_heads, d.head_dim), dtype=F32)
        self.cos = np.zeros((1, d.head_dim), dtype=F32)
        self.sin = np.zeros((1, d.head_dim), dtype=F32)
        self.slot = np.zeros(1, dtype=np.int64)
        # Attributes, not locals: the bound calls hold raw addresses, so every buffer they
        # point at must live as long as this object.
        self.scratch = np.zeros(d.scratch_size(1), dtype=F32)
        self.attn_rows = self.attn.reshape(1, -1)
        self.calls: list[tuple[tuple[object, ...], list[object], tuple[object, ...]]] = []
        for i, layer in enumerate(w.layers):
            k_cache, v_cache = cache.layer(i)
            qkv = k.qkv_args(self.normed, layer, self.cos, self.sin, self.slot, k_cache, v_cache,
                             self.qkv)  # fmt: skip
            attention: list[object] = [
                self.qkv.ctypes.data, d.qkv_width, None, 0, k_cache.ctypes.data,
                v_cache.ctypes.data, cache.page_ids.ctypes.data, None, self.attn.ctypes.data,
                None, 1, 1, 1, 1, BLOCK_SIZE, d.num_heads, d.num_kv_heads, d.head_dim,
                model.scale, 0.0,
            ]  # fmt: skip
            mlp = k.mlp_args(self.attn_rows, layer, self.residual, self.normed,
                             w.post_norms[i], w.next_norm(i), model.eps, self.scratch)  # fmt: skip
            self.calls.append((qkv, attention, mlp))

    def run(self, token: int) -> np.ndarray:
        m = self.model
        k, w = m.kernels, m.weights
        if not 0 <= token < w.embed.rows:
            raise ValueError(f"token: expected an id in [0, {w.embed.rows}), got {token}")
        position = m.length
        self.residual[:] = k.embed(w.embed, np.array([token]))
        _, first = k.add_rms_norm(self.residual, None, w.input_norms[0], m.eps)
        self.normed[:] = first
        cos, sin = m.rope.tables(np.array([position]))
        self.cos[:], self.sin[:] = cos, sin
        self.slot[0] = position
        key_len = position + 1
        num_pages = -(-key_len // BLOCK_SIZE)
        qkv_fn, tiles_fn, mlp_fn = k.qkv_fn, k.tiles_fn, k.mlp_fn
        for qkv, attention, mlp in self.calls:
            qkv_fn(*qkv)
            attention[_NUM_PAGES], attention[_KEY_LEN] = num_pages, key_len
            if tiles_fn(*attention):
                raise MemoryError("paged_attention_tiles could not allocate its score buffer")
            mlp_fn(*mlp)
        m.length += 1
        logits: np.ndarray = k.linear(self.normed, w.head)[0]
        return logits
