"""deepinfer_spec: see docs/spec.md.

Example (``target`` is any ``TargetAdapter``, e.g. ``RecomputeTarget(model)``)::

    import deepinfer_spec
    from deepinfer_spec import DSparkConfig, DSparkDrafter, FixedGammaScheduler, SpecDecoder

    print(deepinfer_spec.__version__)
    drafter = DSparkDrafter(DSparkConfig(target_layer_ids=(0, 1)), target)
    decoder = SpecDecoder(drafter, target, FixedGammaScheduler(5), temperature=0.7)
    print(decoder.generate([[1, 2, 3]], max_new_tokens=16))
"""

from deepinfer_spec.adapter import (
    ScoringTarget,
    SupportsLayerWeights,
    SupportsLmHeadRows,
    TargetAdapter,
    TargetOutput,
)
from deepinfer_spec.batch_step import BatchSpeculator, RowResult, SpecStats, StepPlan, StepRow
from deepinfer_spec.calibration import (
    apply_temperatures,
    auc,
    calibrate_sts,
    calibration_report,
    expected_calibration_error,
    reliability_diagram,
)
from deepinfer_spec.config import DSparkConfig
from deepinfer_spec.decoder import RequestState, SpecDecoder, StepOutput
from deepinfer_spec.draft_mask import DraftConstraints, DraftGrammar, DraftMask
from deepinfer_spec.drafter import DSparkDrafter, NativeDraft
from deepinfer_spec.lazy_context import LazyContext
from deepinfer_spec.linear import LinearFn, module_linear
from deepinfer_spec.native_draft import native_draft_kernel
from deepinfer_spec.policy import TargetProfiler, choose_policy
from deepinfer_spec.propose import Draft, propose
from deepinfer_spec.recompute_target import RecomputeTarget
from deepinfer_spec.scheduling import (
    BoundedScheduler,
    DraftGate,
    FixedGammaScheduler,
    PrefixScheduler,
    SchedulePlan,
    SPSCurve,
    ThresholdScheduler,
    VerifyScheduler,
    draft_bound,
    evaluate_schedule,
    profile_sps,
)
from deepinfer_spec.speculator_config import SpeculativeConfig, load_speculator
from deepinfer_spec.state import ContextRing
from deepinfer_spec.step import DraftBlock, Verdict, draft_block, verify_block
from deepinfer_spec.target_profile import profile_target
from deepinfer_spec.timing import fastest_linear, priced_gate, time_draft

__version__ = "0.12.0"

__all__ = [
    "__version__",
    # drafter, state, decoding (spec-A)
    "BatchSpeculator",
    "ContextRing",
    "DSparkConfig",
    "DSparkDrafter",
    "Draft",
    "DraftBlock",
    "DraftConstraints",
    "DraftGrammar",
    "DraftMask",
    "LazyContext",
    "LinearFn",
    "NativeDraft",
    "RecomputeTarget",
    "RequestState",
    "RowResult",
    "ScoringTarget",
    "SpecDecoder",
    "SpeculativeConfig",
    "SpecStats",
    "StepOutput",
    "StepPlan",
    "StepRow",
    "TargetProfiler",
    "SupportsLayerWeights",
    "SupportsLmHeadRows",
    "TargetAdapter",
    "TargetOutput",
    "Verdict",
    "draft_block",
    "fastest_linear",
    "load_speculator",
    "module_linear",
    "native_draft_kernel",
    "profile_target",
    "propose",
    "priced_gate",
    "time_draft",
    "verify_block",
    # calibration and verification scheduling (spec-B)
    "BoundedScheduler",
    "DraftGate",
    "FixedGammaScheduler",
    "PrefixScheduler",
    "SPSCurve",
    "SchedulePlan",
    "ThresholdScheduler",
    "VerifyScheduler",
    "apply_temperatures",
    "auc",
    "calibrate_sts",
    "calibration_report",
    "choose_policy",
    "draft_bound",
    "evaluate_schedule",
    "expected_calibration_error",
    "profile_sps",
    "reliability_diagram",
]
