"""The learning-rate schedule of the original ViT code."""

import math

import keras
from keras import ops

DECAY_TYPES = ("cosine", "linear")


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then cosine or linear decay: the original's schedule.

    A transcription of `create_learning_rate_schedule` in
    google-research/vision_transformer (`vit_jax/utils.py`):

    ```
    progress = clip((step - warmup_steps) / (total_steps - warmup_steps), 0, 1)
    cosine:  lr = base * 0.5 * (1 + cos(pi * progress))
    linear:  lr = linear_end + (base - linear_end) * (1 - progress)
    if warmup_steps > 0:  lr = lr * min(1, step / warmup_steps)
    ```

    The optimizer calls it with its update counter, which starts at 0, so the
    first update uses `lr(0) = 0` when there is a warmup (as optax does with
    the original schedule) and the last of `total_steps` updates uses
    `lr(total_steps - 1)`. Computed in float32, like the original.

    Args:
        base_learning_rate: float. Peak learning rate, reached at the end of
            the warmup.
        total_steps: int. Number of optimizer updates of the whole run.
        warmup_steps: int. Length of the linear warmup. Defaults to 0.
        decay_type: `"cosine"` (fine-tuning, ImageNet-1k pre-training) or
            `"linear"` (ImageNet-21k / JFT pre-training). Defaults to
            `"cosine"`.
        linear_end: float. Final learning rate of the linear decay (unused
            by cosine). Defaults to 1e-5, the original's value.
        name: optional name.
    """

    def __init__(
        self,
        base_learning_rate,
        total_steps,
        warmup_steps=0,
        decay_type="cosine",
        linear_end=1e-5,
        name=None,
    ):
        super().__init__()
        if not isinstance(base_learning_rate, (int, float)) or base_learning_rate < 0:
            raise ValueError(
                "`base_learning_rate` must be a non-negative float. "
                f"Received: base_learning_rate={base_learning_rate!r}"
            )
        for arg, value in (("total_steps", total_steps), ("warmup_steps", warmup_steps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"`{arg}` must be a non-negative int. Received: {arg}={value!r}"
                )
        if total_steps <= warmup_steps:
            raise ValueError(
                "`total_steps` must be larger than `warmup_steps` (the decay "
                f"phase would be empty). Received: total_steps={total_steps}, "
                f"warmup_steps={warmup_steps}"
            )
        if decay_type not in DECAY_TYPES:
            raise ValueError(
                f"`decay_type` must be one of {DECAY_TYPES}. "
                f"Received: decay_type={decay_type!r}"
            )
        self.base_learning_rate = float(base_learning_rate)
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.decay_type = decay_type
        self.linear_end = float(linear_end)
        self.name = name

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = float(self.warmup_steps)
        progress = (step - warmup) / float(self.total_steps - self.warmup_steps)
        progress = ops.clip(progress, 0.0, 1.0)
        # Python-float constants folded as in the original (float64 on the
        # host, then float32).
        if self.decay_type == "cosine":
            lr = (self.base_learning_rate * 0.5) * (1.0 + ops.cos(math.pi * progress))
        else:
            span = self.base_learning_rate - self.linear_end
            lr = self.linear_end + span * (1.0 - progress)
        if self.warmup_steps:
            lr = lr * ops.minimum(1.0, step / warmup)
        return lr

    def get_config(self):
        return {
            "base_learning_rate": self.base_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay_type": self.decay_type,
            "linear_end": self.linear_end,
            "name": self.name,
        }
