"""Training the paper's way with `model.fit`: schedules, optimizers, losses,
metrics for padded evaluation batches, fault-tolerant checkpoints, progress in
optimizer updates. See `docs/training.md`."""

from keras_vit.training.callbacks import BackupAndResume
from keras_vit.training.callbacks import CheckpointWriteError
from keras_vit.training.metrics import ExampleCount, LossMean, padded_batch_metrics
from keras_vit.training.losses import (
    SIGMOID_HEAD_BIAS_INIT,
    SigmoidCrossEntropy,
    SoftmaxCrossEntropy,
)
from keras_vit.training.optimizers import (
    DecoupledAdam,
    MomentumSGD,
    finetuning_optimizer,
    kernel_variables,
    pretraining_optimizer,
)
from keras_vit.training.progress import ThroughputTimer, UpdateProgress
from keras_vit.training.schedules import AccumulationSchedule, WarmupDecay

__all__ = [
    "AccumulationSchedule",
    "BackupAndResume",
    "CheckpointWriteError",
    "DecoupledAdam",
    "ExampleCount",
    "LossMean",
    "MomentumSGD",
    "SIGMOID_HEAD_BIAS_INIT",
    "SigmoidCrossEntropy",
    "SoftmaxCrossEntropy",
    "ThroughputTimer",
    "UpdateProgress",
    "WarmupDecay",
    "finetuning_optimizer",
    "kernel_variables",
    "padded_batch_metrics",
    "pretraining_optimizer",
]
