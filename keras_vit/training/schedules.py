"""The learning-rate schedule of the original ViT code."""

import math

import keras
from keras import ops

from keras_vit.layers.utils import is_int, is_real

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
        # Any real number, numpy's included; a NaN, infinite or negative rate
        # would train to NaN or climb the loss.
        for arg, value in (("base_learning_rate", base_learning_rate), ("linear_end", linear_end)):
            if not is_real(value) or value < 0:
                raise ValueError(f"`{arg}` must be a finite non-negative float. Received: {arg}={value!r}")
        for arg, value in (("total_steps", total_steps), ("warmup_steps", warmup_steps)):
            if not is_int(value) or value < 0:
                raise ValueError(
                    f"`{arg}` must be a non-negative int. Received: {arg}={value!r}"
                )
        total_steps, warmup_steps = int(total_steps), int(warmup_steps)
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


@keras.saving.register_keras_serializable(package="keras_vit")
class AccumulationSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule evaluated once per update under gradient accumulation.

    Keras calls an optimizer's schedule with its number of `apply` calls,
    i.e. of micro-batches. With `accumulation_steps=k` micro-batches per
    update, the original (vit_jax's `accumulate_gradient`) evaluates its
    schedule at the update count: this calls `schedule(step // k)`. The
    update at micro-batch `(u + 1) * k - 1` thus uses `schedule(u)`.
    `MomentumSGD`/`DecoupledAdam` wrap their schedule in it themselves when
    given `gradient_accumulation_steps=k`.

    Args:
        schedule: a `LearningRateSchedule` written in updates (e.g.
            `WarmupDecay`).
        accumulation_steps: int >= 1. Micro-batches per update.
    """

    def __init__(self, schedule, accumulation_steps):
        super().__init__()
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                "`schedule` must be a `keras.optimizers.schedules.LearningRateSchedule`. "
                f"Received: schedule={schedule!r}"
            )
        if (
            not is_int(accumulation_steps) or accumulation_steps < 1
        ):
            raise ValueError(
                "`accumulation_steps` must be a positive int. "
                f"Received: accumulation_steps={accumulation_steps!r}"
            )
        self.schedule = schedule
        self.accumulation_steps = accumulation_steps

    def __call__(self, step):
        return self.schedule(ops.floor_divide(step, self.accumulation_steps))

    def get_config(self):
        return {
            "schedule": keras.optimizers.schedules.serialize(self.schedule),
            "accumulation_steps": self.accumulation_steps,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["schedule"] = keras.optimizers.schedules.deserialize(config["schedule"])
        return cls(**config)
