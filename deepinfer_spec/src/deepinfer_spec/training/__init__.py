"""Training and evaluating DSpark drafters against a frozen target.

Example::

    from deepinfer_spec import DSparkConfig
    from deepinfer_spec.training import TrainConfig, evaluate, train_drafter

    result = train_drafter(target, sequences, DSparkConfig(target_layer_ids=(0, 1)),
                           TrainConfig(steps=200, out_dir="drafter-ckpt"))
    print(evaluate(result.drafter, target, prompts).format())
"""

from deepinfer_spec.training.checkpoint import (
    load_checkpoint,
    load_drafter,
    load_sts,
    save_drafter,
)
from deepinfer_spec.training.data import frequent_tokens, read_jsonl, sample_from_target
from deepinfer_spec.training.evaluate import EvalReport, evaluate
from deepinfer_spec.training.loss import LossTerms, LossWeights, dspark_loss, position_weights
from deepinfer_spec.training.teacher import DraftVocabTeacher
from deepinfer_spec.training.trainer import TrainConfig, TrainResult, train_drafter

__all__ = [
    "DraftVocabTeacher",
    "EvalReport",
    "LossTerms",
    "LossWeights",
    "TrainConfig",
    "TrainResult",
    "dspark_loss",
    "evaluate",
    "frequent_tokens",
    "load_checkpoint",
    "load_drafter",
    "load_sts",
    "position_weights",
    "read_jsonl",
    "sample_from_target",
    "save_drafter",
    "train_drafter",
]
