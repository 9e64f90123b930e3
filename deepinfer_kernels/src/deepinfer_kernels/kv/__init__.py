"""KV page movement: writing new tokens into the paged cache, gathering and scattering pages."""

from deepinfer_kernels.kv.blocks import gather_blocks, scatter_blocks
from deepinfer_kernels.kv.write import write_kv
from deepinfer_kernels.kv.write_plan import WriteKVPlan, plan_write_kv

__all__ = ["WriteKVPlan", "gather_blocks", "plan_write_kv", "scatter_blocks", "write_kv"]
