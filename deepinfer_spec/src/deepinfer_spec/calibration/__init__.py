"""Confidence-head calibration: sequential temperature scaling, ECE/AUC, reliability diagrams.

Example::

    import torch
    from deepinfer_spec.calibration import apply_temperatures, calibrate_sts, calibration_report

    z = torch.randn(2000, 5) + 1.0
    accepted = torch.rand(2000, 5) < torch.sigmoid(z)  # true acceptance sigmoid(z)
    conf = torch.sigmoid(2 * z)  # an over-confident head
    temps = calibrate_sts(conf, accepted)
    report = calibration_report(conf, accepted, temps)
    print(report["mean_survival_ece"], report["calibrated_mean_survival_ece"])
"""

from deepinfer_spec.calibration.metrics import auc, expected_calibration_error
from deepinfer_spec.calibration.report import calibration_report, reliability_diagram
from deepinfer_spec.calibration.sts import (
    apply_temperatures,
    calibrate_sts,
    default_grid,
    survival_targets,
)

__all__ = [
    "apply_temperatures",
    "auc",
    "calibrate_sts",
    "calibration_report",
    "default_grid",
    "expected_calibration_error",
    "reliability_diagram",
    "survival_targets",
]
