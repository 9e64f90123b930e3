"""The compiled CPU kernels called on numpy arrays: no torch in the process.

The same C entries the engine's torch wrappers call, through the same signature table and
loader (:mod:`~deepinfer_kernels.cpu.native`): a GGUF model's prefill and decode need

* :meth:`NumpyKernels.layer_qkv` / :meth:`NumpyKernels.layer_mlp`: a decoder layer's two
  halves over block-format weights (``quant_decoder_layer.c``);
* :meth:`NumpyKernels.attention`: paged attention over short query tiles
  (``paged_attention_tiles.c``);
* :meth:`NumpyKernels.linear`: ``x W^T`` on block-format rows, the LM head and a prefill's
  many-row products (``quant_gemv.c``; optionally on numpy's OpenBLAS sgemm, as the engine's
  ``quant_linear``);
* :meth:`NumpyKernels.dequantize` / :meth:`NumpyKernels.embed`: rows dequantised exactly as
  ``gguf.quants.dequantize`` does, the token embedding;
* :meth:`NumpyKernels.add_rms_norm`: the residual add and RMSNorm (``add_rms_norm.c``).

Same inputs give the same bits as the torch path (``tests/deepinfer_kernels/test_cpu_numpy_ops.py``
checks each against it). Every call checks its operands (dtype, C-contiguity, shape) and
raises ``ValueError`` naming the argument, since a foreign call trusts its pointers. In a process
without torch, call :func:`~deepinfer_kernels.cpu.openmp.load_openmp_runtime` first for
multi-threaded kernels.

Example::

    import numpy as np
    from deepinfer_kernels.cpu.numpy_ops import NumpyKernels

    kernels = NumpyKernels()
    summed, normed = kernels.add_rms_norm(np.ones((2, 64), np.float32), None,
                                          np.ones(64, np.float32), 1e-5)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deepinfer_kernels.cpu.abi import CSource
from deepinfer_kernels.cpu.native import NativeFunction
from deepinfer_kernels.cpu.numpy_blocks import BlockRows, LayerBlockRows, check_array
from deepinfer_kernels.cpu.sources import (
    ADD_RMS_NORM,
    CAUSAL_PREFILL_ATTENTION,
    PAGED_ATTENTION_TILES,
    QUANT_DECODER_LAYER,
    QUANT_GEMV,
)
from deepinfer_kernels.quant.formats import quant_type, row_bytes

F32, I64 = np.float32, np.int64
# Query rows a tile may hold (attention.MAX_TILE_Q: the kernel's short-tile design).
MAX_TILE_Q = 16
# Fewest rows a product runs on the in-region sgemm, as the engine's quant_linear decides
# (quant.ops.GEMV_MAX_ROWS + 1; a test keeps the two equal): fewer rows stay on the block
# kernels, which read each weight byte once for all of them.
SGEMM_MIN_ROWS = 17


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else int(a.ctypes.data)


class NumpyKernels:
    """Handles of the C entries above, each built and loaded on first use (``enabled=None``
    reads ``DEEPINFER_CPU_KERNELS``). Holds no per-call state: one per process is enough."""

    def __init__(self, cache_dir: Path | None = None, enabled: bool | None = None) -> None:
        def fn(source: CSource, symbol: str) -> NativeFunction:
            return NativeFunction(source, symbol, cache_dir=cache_dir, enabled=enabled)

        self.qkv_fn = fn(QUANT_DECODER_LAYER, "deepinfer_qdecoder_qkv")
        self.mlp_fn = fn(QUANT_DECODER_LAYER, "deepinfer_qdecoder_mlp")
        self.tiles_fn = fn(PAGED_ATTENTION_TILES, "deepinfer_paged_attention_tiles")
        self.linear_fn = fn(QUANT_GEMV, "deepinfer_quant_linear")
        self.sgemm_linear_fn = fn(QUANT_GEMV, "deepinfer_quant_linear_sgemm")
        self.dequantize_fn = fn(QUANT_GEMV, "deepinfer_quant_dequantize")
        self.norm_fn = fn(ADD_RMS_NORM, "deepinfer_add_rms_norm")
        # Checked by causal_attention's own callers (not in functions(): optional, sgemm-only).
        self.causal_fn = fn(CAUSAL_PREFILL_ATTENTION, "deepinfer_causal_prefill_attention")

    def functions(self) -> tuple[NativeFunction, ...]:
        return (self.qkv_fn, self.mlp_fn, self.tiles_fn, self.linear_fn,
                self.sgemm_linear_fn, self.dequantize_fn, self.norm_fn)  # fmt: skip

    def available(self) -> bool:
        """Whether every kernel runs here (builds them on the first call)."""
        return all(f.available() for f in self.functions())

    def unavailable_reason(self) -> str | None:
        """Why :meth:`available` is False (None when it is True)."""
        for f in self.functions():
            if not f.available():
                return f.error or f"{f.symbol} is turned off (DEEPINFER_CPU_KERNELS=0)"
        return None

    # ------------------------------------------------------------------ products
    def linear(
        self,
        x: np.ndarray,
        w: BlockRows,
        bias: np.ndarray | None = None,
        *,
        sgemm: int | None = None,
    ) -> np.ndarray:
        """``x [M, K] @ W^T (+ bias)`` -> fp32 ``[M, N]`` for block-format ``w`` (each
        segment one product, as ``QuantLinear.forward`` runs each run of one format).

        With ``sgemm`` (the address of a one-thread ILP64 ``cblas_sgemm``: hold
        ``blas_choice.default_blas_choice().in_region_sgemm().one_thread()`` around the call),
        the product runs as the engine's many-row ``quant_linear`` does
        (``deepinfer_quant_linear_sgemm``): each OpenMP thread dequantises its share of ``W``'s
        rows and multiplies all of ``x`` by it, bit for bit the torch wrapper's result.
        Without it, the block kernels (``deepinfer_quant_linear``)."""
        if not isinstance(w, BlockRows):
            raise ValueError(f"w: expected BlockRows, got {type(w).__name__}")
        check_array("x", x, F32, (None, w.cols))
        if bias is not None:
            check_array("bias", bias, F32, (w.rows,))
        if sgemm is not None and (not isinstance(sgemm, int) or isinstance(sgemm, bool)
                                  or sgemm <= 0):  # fmt: skip
            raise ValueError(f"sgemm: expected a function address (int > 0), got {sgemm!r}")
        outs, start = [], 0
        for data, qtype in w.parts():
            n = data.shape[0]
            y = np.empty((x.shape[0], n), dtype=F32)
            b = None if bias is None else bias[start : start + n]
            args = (
                _ptr(x), x.shape[0], w.cols, _ptr(data), n, w.cols, row_bytes(qtype, w.cols),
                int(qtype), _ptr(b), _ptr(y),
            )  # fmt: skip
            if sgemm is None:
                rc = self.linear_fn(*args)
            else:
                rc = self.sgemm_linear_fn(sgemm, *args)
            if rc != 0:
                raise RuntimeError(f"deepinfer_quant_linear failed with code {rc}")
            outs.append(y)
            start += n
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)

    def dequantize(self, data: np.ndarray, qtype: int, cols: int) -> np.ndarray:
        """fp32 ``[N, cols]`` of the raw rows ``data`` (uint8 ``[N, row_bytes]``)."""
        q = quant_type(qtype)
        check_array("data", data, np.uint8, (None, row_bytes(q, cols)))
        out = np.empty((data.shape[0], cols), dtype=F32)
        if data.shape[0]:
            rc = self.dequantize_fn(_ptr(data), data.shape[0], cols, int(q), _ptr(out))
            if rc != 0:
                raise RuntimeError(f"deepinfer_quant_dequantize failed with code {rc}")
        return out

    def embed(self, table: BlockRows, ids: np.ndarray) -> np.ndarray:
        """The fp32 rows ``ids`` (int ``[T]``) of a one-format token table ``[vocab, dim]``."""
        if len(table.layout) != 1:
            raise ValueError("table: expected a token table in one format")
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"ids: expected a 1-d integer array, got {ids.dtype} {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= table.rows):
            raise ValueError(f"ids: token ids must be in [0, {table.rows})")
        data, qtype = table.parts()[0]
        return self.dequantize(np.ascontiguousarray(data[ids]), qtype, table.cols)

    def add_rms_norm(
        self, residual: np.ndarray, delta: np.ndarray | None, weight: np.ndarray, eps: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(r, rmsnorm(r) * weight)`` with ``r = residual + delta`` (``residual`` itself
        when ``delta`` is None), new arrays but for that ``r``."""
        check_array("residual", residual, F32, (None, None))
        rows, size = residual.shape
        check_array("weight", weight, F32, (size,))
        if delta is not None:
            check_array("delta", delta, F32, (rows, size))
        summed = residual if delta is None else np.empty_like(residual)
        out = np.empty_like(residual)
        if rows and size:
            self.norm_fn(
                _ptr(residual), _ptr(delta), _ptr(weight),
                None if delta is None else _ptr(summed), _ptr(out), rows, size, float(eps),
            )  # fmt: skip
        return summed, out

    # ------------------------------------------------------------------ decoder layer
    def layer_qkv(
        self,
        x: np.ndarray,
        layer: LayerBlockRows,
        cos: np.ndarray,
        sin: np.ndarray,
        slots: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        out: np.ndarray,
    ) -> None:
        """``out = x Wqkv^T (+ b)``, RoPE on Q and K (``cos``/``sin`` ``[T, D]``, the
        engine's full-width tables), K/V written to the caches at ``slots`` (int64 ``[T]``)."""
        d = layer.dims
        t = check_array("x", x, F32, (None, d.hidden)).shape[0]
        self._check_caches(k_cache, v_cache, d.num_kv_heads, d.head_dim)
        check_array("cos", cos, F32, (t, d.head_dim))
        check_array("sin", sin, F32, (t, d.head_dim))
        check_array("out", out, F32, (t, d.qkv_width))
        check_array("slots", slots, I64, (t,))
        capacity = k_cache.shape[0] * k_cache.shape[1]
        if t and (slots.min() < 0 or slots.max() >= capacity):
            raise ValueError(f"slots: expected cache slots in [0, {capacity})")
        self.qkv_fn(*self.qkv_args(x, layer, cos, sin, slots, k_cache, v_cache, out))

    @staticmethod
    def qkv_args(
        x: np.ndarray, layer: LayerBlockRows, cos: np.ndarray, sin: np.ndarray,
        slots: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, out: np.ndarray,
    ) -> tuple[object, ...]:  # fmt: skip
        """The C call's arguments (operands already checked: for a caller that binds them once
        and calls ``qkv_fn(*args)`` at every step)."""
        d, w = layer.dims, layer.qkv
        return (
            _ptr(x), _ptr(w.data), _ptr(w.segments), _ptr(layer.qkv_bias), _ptr(out), _ptr(cos),
            _ptr(sin), _ptr(slots), _ptr(k_cache), _ptr(v_cache), x.shape[0], d.hidden,
            d.num_heads, d.num_kv_heads, d.head_dim,
        )  # fmt: skip

    def layer_mlp(
        self,
        attn: np.ndarray,
        layer: LayerBlockRows,
        residual: np.ndarray,
        normed: np.ndarray,
        post_norm: np.ndarray,
        next_norm: np.ndarray,
        eps: float,
        scratch: np.ndarray,
    ) -> None:
        """In place: ``residual += attn Wo^T``; ``n = rmsnorm(residual) * post_norm``;
        ``residual += (silu(n Wg^T) * (n Wu^T)) Wd^T``; ``normed = rmsnorm(residual) *
        next_norm`` (the next layer's input norm, or the final norm)."""
        d = layer.dims
        t = check_array("attn", attn, F32, (None, d.q_width)).shape[0]
        check_array("residual", residual, F32, (t, d.hidden))
        check_array("normed", normed, F32, (t, d.hidden))
        check_array("post_norm", post_norm, F32, (d.hidden,))
        check_array("next_norm", next_norm, F32, (d.hidden,))
        check_array("scratch", scratch, F32, (None,))
        if scratch.size < d.scratch_size(t):
            raise ValueError(f"scratch: expected at least {d.scratch_size(t)} floats")
        self.mlp_fn(*self.mlp_args(attn, layer, residual, normed, post_norm, next_norm, eps,
                                   scratch))  # fmt: skip

    @staticmethod
    def mlp_args(
        attn: np.ndarray, layer: LayerBlockRows, residual: np.ndarray, normed: np.ndarray,
        post_norm: np.ndarray, next_norm: np.ndarray, eps: float, scratch: np.ndarray,
    ) -> tuple[object, ...]:  # fmt: skip
        """The C call's arguments (operands already checked; see :meth:`qkv_args`)."""
        d, o, gu, down = layer.dims, layer.o, layer.gate_up, layer.down
        return (
            _ptr(attn), _ptr(o.data), _ptr(o.segments), _ptr(residual), _ptr(normed),
            _ptr(post_norm), _ptr(gu.data), _ptr(gu.segments), _ptr(down.data),
            _ptr(down.segments), _ptr(next_norm), float(eps), _ptr(scratch), attn.shape[0],
            d.hidden, d.q_width, d.intermediate,
        )  # fmt: skip

    # ------------------------------------------------------------------ attention
    def attention(
        self,
        qkv: np.ndarray,
        num_heads: int,
        head_dim: int,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        out: np.ndarray,
        *,
        page_ids: np.ndarray,
        keep: np.ndarray | None,
        num_tiles: int,
        max_q: int,
        num_pages: int,
        key_len: int,
        scale: float,
        soft_cap: float = 0.0,
    ) -> None:
        """Paged attention of ``num_tiles`` tiles of ``max_q`` query rows each (the rows of
        ``qkv`` ``[num_tiles * max_q, qkv_width]`` in order; its first ``num_heads * head_dim``
        columns are Q) over ``key_len`` keys in ``num_pages`` pages per tile (``page_ids``
        int64 ``[num_tiles * num_pages]``), masked by ``keep`` (bool ``[num_tiles, max_q,
        key_len]``, None: all kept), into ``out`` fp32 ``[num_tiles * max_q, num_heads,
        head_dim]``."""
        hkv = self._check_caches(k_cache, v_cache, None, head_dim)
        rows = num_tiles * max_q
        if not 1 <= max_q <= MAX_TILE_Q:
            raise ValueError(f"max_q: expected 1..{MAX_TILE_Q} query rows a tile, got {max_q}")
        if num_heads % hkv:
            raise ValueError(f"num_heads: {num_heads} is not a multiple of the caches' {hkv}")
        check_array("qkv", qkv, F32, (rows, None))
        if qkv.shape[1] < num_heads * head_dim:
            raise ValueError(f"qkv: expected at least {num_heads * head_dim} columns")
        check_array("out", out, F32, (rows, num_heads, head_dim))
        check_array("page_ids", page_ids, I64, (num_tiles * num_pages,))
        if key_len < 0 or num_pages * k_cache.shape[1] < key_len:
            raise ValueError(f"key_len: {key_len} keys do not fit {num_pages} pages")
        if page_ids.size and (page_ids.min() < 0 or page_ids.max() >= k_cache.shape[0]):
            raise ValueError(f"page_ids: expected block ids in [0, {k_cache.shape[0]})")
        if keep is not None:
            check_array("keep", keep, np.bool_, (num_tiles, max_q, key_len))
        if rows == 0:
            return
        rc = self.tiles_fn(
            _ptr(qkv), qkv.shape[1], None, 0, _ptr(k_cache), _ptr(v_cache), _ptr(page_ids),
            _ptr(keep), _ptr(out), None, num_tiles, max_q, num_pages, key_len, k_cache.shape[1],
            num_heads, hkv, head_dim, float(scale), float(soft_cap),
        )  # fmt: skip
        if rc:
            raise MemoryError("paged_attention_tiles could not allocate its score buffer")

    def causal_attention(
        self,
        qkv: np.ndarray,
        num_heads: int,
        head_dim: int,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        out: np.ndarray,
        *,
        start: int,
        scale: float,
        sgemm: int,
    ) -> None:
        """Causal attention of the ``T`` rows of ``qkv`` (``[T, qkv_width]``, Q in its first
        ``num_heads * head_dim`` columns) at positions ``start .. start + T - 1`` over keys
        ``0 .. start + T - 1`` in slots ``0 ..`` of the caches (one sequence, pages in order),
        into ``out`` fp32 ``[T, num_heads, head_dim]``, as two GEMMs a head and 64-row block on
        the one-thread ``sgemm`` (``causal_prefill_attention.c``). Within fp32 rounding of
        :meth:`attention` with a causal mask (another summation order)."""
        hkv = self._check_caches(k_cache, v_cache, None, head_dim)
        if num_heads < 1 or num_heads % hkv:
            raise ValueError(f"num_heads: {num_heads} is not a multiple of the caches' {hkv}")
        t = check_array("qkv", qkv, F32, (None, None)).shape[0]
        if qkv.shape[1] < num_heads * head_dim:
            raise ValueError(f"qkv: expected at least {num_heads * head_dim} columns")
        check_array("out", out, F32, (t, num_heads, head_dim))
        slots = k_cache.shape[0] * k_cache.shape[1]
        if not isinstance(start, int) or start < 0 or start + t > slots:
            raise ValueError(f"start: expected 0 <= start and start + {t} <= {slots} slots")
        if not isinstance(sgemm, int) or isinstance(sgemm, bool) or sgemm <= 0:
            raise ValueError(f"sgemm: expected a function address (int > 0), got {sgemm!r}")
        if t == 0:
            return
        rc = self.causal_fn(
            sgemm, _ptr(qkv), qkv.shape[1], _ptr(k_cache), _ptr(v_cache), _ptr(out), t, start,
            num_heads, hkv, head_dim, float(scale),
        )  # fmt: skip
        if rc:
            raise MemoryError("causal_prefill_attention could not allocate its score buffer")

    @staticmethod
    def _check_caches(
        k_cache: np.ndarray, v_cache: np.ndarray, num_kv_heads: int | None, head_dim: int
    ) -> int:
        check_array("k_cache", k_cache, F32, (None, None, num_kv_heads, head_dim))
        check_array("v_cache", v_cache, F32, k_cache.shape)
        return int(k_cache.shape[2])
