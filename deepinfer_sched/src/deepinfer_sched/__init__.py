"""deepinfer_sched: see docs/sched.md.

Example::

    import deepinfer_sched
    print(deepinfer_sched.__version__)

    from deepinfer_sched import SchedulerConfig, SimConfig, SyntheticTraceConfig
    from deepinfer_sched import simulate, synthetic_trace

    trace = synthetic_trace(SyntheticTraceConfig(num_requests=500, request_rate=0.5))
    report = simulate(trace, SimConfig(scheduler=SchedulerConfig(router="cost")), seed=0)
    print(report.goodput_rps, report.hit_rate)
"""

from deepinfer_sched.costmodel import (
    CostModel,
    HardwareSpec,
    ModelSpec,
    RooflineCostModel,
    load_hardware,
    load_model,
)
from deepinfer_sched.policies import (
    BatchConfig,
    BatchPlan,
    ContinuousBatchPolicy,
    SchedulerConfig,
    SeqState,
)
from deepinfer_sched.report import SLO, Report, RequestRecord, build_report
from deepinfer_sched.sim import Fault, SimConfig, SpecDecodeConfig, run_simulation, simulate
from deepinfer_sched.traces import (
    SyntheticTraceConfig,
    Trace,
    TraceRequest,
    load_trace,
    save_jsonl,
    synthetic_trace,
)

__version__ = "0.6.1"

__all__ = [
    "SLO",
    "BatchConfig",
    "BatchPlan",
    "ContinuousBatchPolicy",
    "Fault",
    "SchedulerConfig",
    "SeqState",
    "SimConfig",
    "SpecDecodeConfig",
    "run_simulation",
    "simulate",
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
