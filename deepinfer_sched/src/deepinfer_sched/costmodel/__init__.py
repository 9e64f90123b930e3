"""Roofline cost models and the hardware/model data files they read.

Example::

    from deepinfer_sched.costmodel import RooflineCostModel, load_hardware, load_model

    cm = RooflineCostModel(load_hardware("h800"), load_model("dense-8b"))
    print(cm.prefill_time(4096, cached_tokens=60_000), cm.decode_step_time(64, 64 * 8000))
"""

from deepinfer_sched.costmodel.base import CostModel, WorkParts
from deepinfer_sched.costmodel.engine_profiler import SteppableEngine, profile_engine
from deepinfer_sched.costmodel.fitted import (
    PROFILE_FORMAT,
    FittedCostModel,
    fit_profile,
    load_profile,
    merge_profiles,
)
from deepinfer_sched.costmodel.profile_grid import (
    EngineLimits,
    ProfileGrid,
    decode_row,
    prefill_row,
)
from deepinfer_sched.costmodel.roofline import RooflineCostModel
from deepinfer_sched.costmodel.specs import (
    HardwareSpec,
    ModelSpec,
    available_hardware,
    available_models,
    load_hardware,
    load_model,
)
from deepinfer_sched.costmodel.step_log import (
    PROFILE_VERSION,
    StepLog,
    profile_header,
    write_profile,
)

__all__ = [
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "StepLog",
    "profile_header",
    "write_profile",
    "EngineLimits",
    "ProfileGrid",
    "SteppableEngine",
    "profile_engine",
    "decode_row",
    "prefill_row",
    "FittedCostModel",
    "fit_profile",
    "load_profile",
    "merge_profiles",
    "CostModel",
    "HardwareSpec",
    "ModelSpec",
    "RooflineCostModel",
    "WorkParts",
    "available_hardware",
    "available_models",
    "load_hardware",
    "load_model",
]
