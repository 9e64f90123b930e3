"""Request traces: a synthetic chat/agent generator, loaders for public traces, a writer.

Example::

    from deepinfer_sched.traces import SyntheticTraceConfig, synthetic_trace

    trace = synthetic_trace(SyntheticTraceConfig(num_requests=2000, seed=0))
    stats = trace.stats()
    print(len(trace), stats.mean_input_len, stats.reusable_fraction)
"""

from deepinfer_sched.traces.arrivals import ARRIVAL_PROCESSES, arrival_times, daily_swing
from deepinfer_sched.traces.azure import load_azure
from deepinfer_sched.traces.burstgpt import load_burstgpt
from deepinfer_sched.traces.load import TRACE_FORMATS, load_trace
from deepinfer_sched.traces.mooncake import load_mooncake, save_jsonl
from deepinfer_sched.traces.synthetic import SyntheticTraceConfig, synthetic_trace
from deepinfer_sched.traces.types import (
    Trace,
    TraceRequest,
    TraceStats,
    check_chained,
    rechain,
    rechain_ids,
    reusable_prefix_blocks,
)

__all__ = [
    "check_chained",
    "daily_swing",
    "rechain",
    "rechain_ids",
    "ARRIVAL_PROCESSES",
    "TRACE_FORMATS",
    "SyntheticTraceConfig",
    "Trace",
    "TraceRequest",
    "TraceStats",
    "arrival_times",
    "load_azure",
    "load_burstgpt",
    "load_mooncake",
    "load_trace",
    "reusable_prefix_blocks",
    "save_jsonl",
    "synthetic_trace",
]
