"""A step-time model fitted online: ``seconds = overhead + per_token * forward_tokens``.

Each replica fits it to its own measured engine steps (weighted least squares that forgets
old steps) and reports it; the front's routers and admission read the fits through
`deepinfer_sched`'s ``CostModelLike`` seam (`deepinfer.serve.routing.LiveCostModel`), so TTFT
estimates follow the machine actually serving.
"""

from __future__ import annotations


class StepTimeFit:
    """Exponentially weighted least squares of step seconds on forward tokens."""

    def __init__(self, decay: float = 0.98, prior: tuple[float, float] = (0.005, 0.0005)) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.prior = prior
        self._s = [0.0] * 5  # weights, sum x, sum y, sum xx, sum xy

    def add(self, tokens: int, seconds: float) -> None:
        d = self.decay
        x, y = float(tokens), float(seconds)
        s = self._s
        s[0] = s[0] * d + 1.0
        s[1] = s[1] * d + x
        s[2] = s[2] * d + y
        s[3] = s[3] * d + x * x
        s[4] = s[4] * d + x * y

    def coefficients(self) -> tuple[float, float]:
        """``(overhead_s, per_token_s)``, both >= 0; the prior until steps vary in size."""
        w, sx, sy, sxx, sxy = self._s
        if w < 2.0:
            return self.prior
        var = sxx - sx * sx / w
        if var <= 1e-9 * max(1.0, sxx):
            # Every step had the same size: attribute it all to the tokens.
            per = sy / max(sx, 1.0)
            return 0.0, per
        b = (sxy - sx * sy / w) / var
        a = (sy - b * sx) / w
        if b < 0.0:
            b, a = 0.0, sy / w
        return max(a, 0.0), b
