"""The CPU flash-attention kernel the torch path runs its tiles on, when this build has it."""

from __future__ import annotations

import torch

# CPU flash-attention kernel that also returns the natural-log LSE in fp32 (fp32 accumulation
# for fp16/bf16 inputs, strided K/V accepted). Absent on some builds: then the manual path runs.
CPU_FLASH_ATTENTION = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
