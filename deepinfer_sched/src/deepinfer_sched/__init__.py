"""deepinfer_sched: see docs/sched.md.

Example::

    import deepinfer_sched
    print(deepinfer_sched.__version__)
"""

from deepinfer_sched.costmodel import (
    CostModel,
    HardwareSpec,
    ModelSpec,
    RooflineCostModel,
    load_hardware,
    load_model,
)
from deepinfer_sched.report import SLO, Report, RequestRecord, build_report
from deepinfer_sched.traces import (
    SyntheticTraceConfig,
    Trace,
    TraceRequest,
    load_trace,
    save_jsonl,
    synthetic_trace,
)

__version__ = "0.1.0"

__all__ = [
    "SLO",
    "CostModel",
    "HardwareSpec",
    "ModelSpec",
    "Report",
    "RequestRecord",
    "RooflineCostModel",
    "SyntheticTraceConfig",
    "Trace",
    "TraceRequest",
    "__version__",
    "build_report",
    "load_hardware",
    "load_model",
    "load_trace",
    "save_jsonl",
    "synthetic_trace",
]
