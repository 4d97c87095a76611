"""Optimizers that update weights exactly as the original ViT code does.

Stock Keras optimizers differ from the original optax/Flax chains in ways
that matter for a faithful reproduction (measured differences are listed in
`docs/training.md`):

* Keras `SGD` folds the learning rate into its momentum buffer
  (`v = m * v - lr * g`), so under warmup the gradients seen at lr(0) = 0
  are lost; optax keeps them (`trace = g + m * trace; param -= lr * trace`).
* Keras `Adam`/`AdamW` add epsilon to the un-corrected `sqrt(v)`; optax and
  Flax add it to the bias-corrected one.
* With `gradient_accumulation_steps=k` Keras evaluates the schedule at
  micro-step counts; the original evaluates it once per real update.
* Under `tf.distribute`, Keras clips each replica's gradient before the
  cross-replica sum, which is not the global norm of the summed gradient.
* Excluding variables from weight decay by name pattern depends on the
  backend's variable names; here decayed variables are listed explicitly.

`MomentumSGD` and `DecoupledAdam` fix all of these; `finetuning_optimizer`
and `pretraining_optimizer` assemble the paper's set-ups.
"""

import contextlib

import keras
from keras import ops

from keras_vit import distribute
from keras_vit.training.schedules import WarmupDecay


def _clip_by_global_norm(grads, max_norm):
    """optax.clip_by_global_norm: g if |g| < max_norm else g / |g| * max_norm."""
    norm = ops.sqrt(sum(ops.sum(ops.square(ops.cast(g, "float32"))) for g in grads))
    clipped = []
    for g in grads:
        scaled = ops.multiply(ops.divide(g, ops.cast(norm, g.dtype)), max_norm)
        clipped.append(ops.where(norm < max_norm, g, scaled))
    return clipped


def kernel_variables(model):
    """The trainable kernels of `model`: the weights the original decays.

    big_vision decays the parameters whose name ends in `/kernel`: the
    kernels of the patch embedding, attention, MLP, pre-logits and head (and
    of convolutions in hybrids). Biases, LayerNorm/GroupNorm scales and
    offsets, the class token and the position embedding are left alone.
    The kernels are found as the `kernel` attribute of each layer, i.e. by
    variable object, which does not depend on the backend's variable names.

    Args:
        model: a built `keras.Model` (or layer).

    Returns:
        A list of `keras.Variable`.
    """
    if not getattr(model, "built", False):
        raise ValueError(
            "`kernel_variables` needs a built model (its variables must exist). "
            f"Received: model={model!r} with built=False"
        )
    found, seen = [], set()
    for layer in model._flatten_layers(include_self=True, recursive=True):
        kernel = getattr(layer, "_kernel", None)
        if not isinstance(kernel, keras.Variable):
            kernel = getattr(layer, "kernel", None)
        if isinstance(kernel, keras.Variable) and kernel.trainable:
            if id(kernel) not in seen:
                seen.add(id(kernel))
                found.append(kernel)
    return found


class _DecaySelection:
    """The variables to decay (as given) and their keys once built."""

    def __init__(self, spec):
        self.spec = spec
        self.keys = None


class _OriginalOrderOptimizer(keras.optimizers.Optimizer):
    """Shared behaviour of the optimizers below (not exported).

    * The schedule is evaluated at the number of real updates
      (`iterations // gradient_accumulation_steps`).
    * `global_clipnorm` clips the global norm of the gradient summed over
      replicas (sum first, then clip), also under `tf.distribute`.
    * Weight decay (decoupled, multiplied by the learning rate, as Keras
      `AdamW`) applies to `decay_variables` only.
    """

    def __init__(self, learning_rate, decay_variables=None, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        if self.weight_decay and decay_variables is None:
            raise ValueError(
                "With `weight_decay`, pass the variables to decay explicitly: "
                "`decay_variables=keras_vit.training.kernel_variables(model)` "
                "for the original's choice (kernels only), or "
                "`model.trainable_variables` to decay everything. "
                f"Received: weight_decay={self.weight_decay}, decay_variables=None"
            )
        if decay_variables is not None:
            decay_variables = list(decay_variables)
            for item in decay_variables:
                if not isinstance(item, (str, keras.Variable)):
                    raise ValueError(
                        "`decay_variables` must hold `keras.Variable`s (or "
                        "their exact `.path` strings, as in a saved config). "
                        f"Received an item {item!r} of type {type(item).__name__}"
                    )
        # Held in a plain object: a list of model variables assigned to an
        # optimizer attribute would be tracked as optimizer state.
        self._decay = _DecaySelection(decay_variables)

    def build(self, variables):
        super().build(variables)
        if self._decay.spec is None:
            return
        by_path = {v.path: v for v in variables}
        known = {self._var_key(v) for v in variables}
        keys, unknown = set(), []
        for item in self._decay.spec:
            if isinstance(item, str):
                variable = by_path.get(item)
                if variable is None:
                    unknown.append(item)
                    continue
            else:
                variable = item
            key = self._var_key(variable)
            if key not in known:
                unknown.append(variable.path)
            keys.add(key)
        if unknown:
            raise ValueError(
                "`decay_variables` holds variables this optimizer does not "
                "train (frozen, or from another model). "
                f"Received: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}"
            )
        self._decay.keys = keys

    def _use_weight_decay(self, variable):
        if self._decay.keys is None:
            return self._decay.spec is None
        return self._var_key(variable) in self._decay.keys

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        raise NotImplementedError(
            f"{type(self).__name__} selects decayed variables with "
            "`decay_variables=[...]` at construction, not by exclusion."
        )

    def apply(self, grads, trainable_variables=None):
        if self.gradient_accumulation_steps and distribute._tf_replica_context():
            # Keras accumulates inside a `cond` whose update branch has a
            # cross-replica `merge_call`, which tf.distribute refuses.
            raise ValueError(
                "`gradient_accumulation_steps` does not work under a "
                "tf.distribute strategy with several replicas in Keras 3 "
                "(the TensorFlow backend cannot synchronise replicas inside "
                "the accumulation's `cond`). Use a global batch that fits the "
                "replicas, or the JAX backend. Received: "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}"
            )
        return super().apply(grads, trainable_variables)

    def _get_current_learning_rate(self):
        if isinstance(
            self._learning_rate, keras.optimizers.schedules.LearningRateSchedule
        ):
            # `iterations` is the number of real updates (micro-steps // k).
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def _clip_gradients(self, grads):
        if not self.global_clipnorm or self.global_clipnorm <= 0:
            return super()._clip_gradients(grads)
        context = distribute._tf_replica_context()
        if context is None:
            return _clip_by_global_norm(grads, self.global_clipnorm)
        # tf.distribute: each replica holds a share of the gradient and the
        # update step sums them afterwards. Clip the sum, then hand each
        # replica 1/n of it so that the later sum is the clipped sum.
        replicas = context.num_replicas_in_sync
        summed = context.all_reduce("sum", list(grads))
        clipped = _clip_by_global_norm(summed, self.global_clipnorm)
        return [g / replicas for g in clipped]

    def _slot(self, reference, name, dtype):
        """An optimizer variable shaped like `reference`, in `dtype`."""
        dtype = keras.backend.standardize_dtype(dtype or reference.dtype)
        if dtype == reference.dtype:
            return self.add_variable_from_reference(reference, name=name)
        strategy = getattr(self, "_distribution_strategy", None)  # TF only
        colocate = (
            strategy.extended.colocate_vars_with(reference.value)
            if strategy is not None
            else contextlib.nullcontext()
        )
        with colocate:
            return self.add_variable(
                shape=reference.shape,
                dtype=dtype,
                name=f"{reference.path.replace('/', '_')}_{name}",
                layout=getattr(reference, "_layout", None),
            )

    def get_config(self):
        config = super().get_config()
        spec = self._decay.spec
        config["decay_variables"] = (
            None if spec is None else [v if isinstance(v, str) else v.path for v in spec]
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class MomentumSGD(_OriginalOrderOptimizer):
    """SGD with momentum in optax's order: the original fine-tuning optimizer.

    ```
    trace = g + momentum * trace
    param = param - learning_rate * trace
    ```

    This is `optax.sgd(lr, momentum, nesterov=False)`, which the original
    fine-tuning code chains after `clip_by_global_norm(1.0)`
    (google-research/vision_transformer, `vit_jax/train.py`). Unlike Keras
    `SGD` (`v = m * v - lr * g`), the learning rate multiplies the trace, so
    gradients taken while the warmup learning rate is still 0 stay in the
    momentum; under warmup + cosine the two differ noticeably.

    Args:
        learning_rate: float or `LearningRateSchedule` (e.g. `WarmupDecay`).
        momentum: float. Defaults to 0.9.
        accumulator_dtype: dtype of the momentum buffer. Defaults to
            `"float32"`. The original stores it in `"bfloat16"`
            (`accumulator_dtype=bfloat16`), which also rounds the 0.9 factor
            to 0.8984375; `finetuning_optimizer` uses that by default. The
            update itself is computed in the variable's dtype before the
            buffer is rounded, as in optax.
        global_clipnorm: float or None. Clip the global gradient norm first
            (1.0 in the paper). Correct across replicas.
        weight_decay: float or None. Decoupled decay times the learning rate
            (the paper fine-tunes without it).
        decay_variables: variables decayed when `weight_decay` is set.
        gradient_accumulation_steps: int >= 2 or None. Average this many
            micro-batch gradients per update; the schedule counts updates.
        **kwargs: other `keras.optimizers.Optimizer` arguments (`name`,
            `use_ema`, `loss_scale_factor`, ...).
    """

    def __init__(
        self,
        learning_rate=0.01,
        momentum=0.9,
        accumulator_dtype="float32",
        global_clipnorm=None,
        weight_decay=None,
        decay_variables=None,
        gradient_accumulation_steps=None,
        name="momentum_sgd",
        **kwargs,
    ):
        super().__init__(
            learning_rate=learning_rate,
            decay_variables=decay_variables,
            global_clipnorm=global_clipnorm,
            weight_decay=weight_decay,
            gradient_accumulation_steps=gradient_accumulation_steps,
            name=name,
            **kwargs,
        )
        if not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
            raise ValueError(
                f"`momentum` must be a float in [0, 1). Received: momentum={momentum!r}"
            )
        self.momentum = float(momentum)
        self.accumulator_dtype = keras.backend.standardize_dtype(accumulator_dtype)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._traces = [
            self._slot(v, "trace", self.accumulator_dtype) for v in variables
        ]

    def update_step(self, gradient, variable, learning_rate):
        trace = self._traces[self._get_variable_index(variable)]
        dtype = variable.dtype
        gradient = ops.cast(gradient, dtype)
        # As optax.trace: the factor multiplies the buffer in the buffer's
        # dtype; the new trace is formed (and used) in the gradient's dtype
        # and only then rounded for storage.
        decayed = ops.multiply(trace, ops.cast(self.momentum, trace.dtype))
        new_trace = ops.add(gradient, ops.cast(decayed, dtype))
        self.assign(trace, ops.cast(new_trace, trace.dtype))
        self.assign_sub(variable, ops.multiply(ops.cast(learning_rate, dtype), new_trace))

    def get_config(self):
        config = super().get_config()
        config.update(
            {"momentum": self.momentum, "accumulator_dtype": self.accumulator_dtype}
        )
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class DecoupledAdam(_OriginalOrderOptimizer):
    """Adam with decoupled weight decay: the original pre-training optimizer.

    ```
    m = (1 - beta_1) * g + beta_1 * m
    v = (1 - beta_2) * g**2 + beta_2 * v
    update = (m / (1 - beta_1**t)) / (sqrt(v / (1 - beta_2**t)) + epsilon)
    param = param - lr_t * weight_decay * param - lr_t * update
    ```

    Epsilon is added to the bias-corrected `sqrt(v)` as in `optax.scale_by_adam`
    and Flax's Adam (Keras' `Adam` adds it to the un-corrected one). The decay
    is multiplied by the current learning rate, as in Flax's `optim.Adam` used
    for the paper and big_vision's `wd * lr` (AugReg, Sec. 3.3), so the
    paper's "weight decay 0.1" is `weight_decay=0.1` here, applied to
    `decay_variables` only (see `kernel_variables`).

    Args:
        learning_rate: float or `LearningRateSchedule`.
        beta_1: float. Defaults to 0.9.
        beta_2: float. Defaults to 0.999.
        epsilon: float. Defaults to 1e-8 (optax's; Keras' is 1e-7).
        weight_decay: float or None. Decoupled decay, times the learning rate.
        decay_variables: the variables to decay; required with
            `weight_decay`. `kernel_variables(model)` gives the original's
            choice.
        first_moment_dtype: dtype of `m`. Defaults to `"float32"`;
            big_vision stores it in `"bfloat16"` (`mu_dtype`) to save memory.
        global_clipnorm: float or None. 1.0 in the paper's ImageNet runs and
            in AugReg. Correct across replicas.
        gradient_accumulation_steps: int >= 2 or None. The schedule and the
            bias correction count real updates.
        **kwargs: other `keras.optimizers.Optimizer` arguments.
    """

    def __init__(
        self,
        learning_rate=1e-3,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        weight_decay=None,
        decay_variables=None,
        first_moment_dtype="float32",
        global_clipnorm=None,
        gradient_accumulation_steps=None,
        name="decoupled_adam",
        **kwargs,
    ):
        super().__init__(
            learning_rate=learning_rate,
            decay_variables=decay_variables,
            global_clipnorm=global_clipnorm,
            weight_decay=weight_decay,
            gradient_accumulation_steps=gradient_accumulation_steps,
            name=name,
            **kwargs,
        )
        for arg, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(
                    f"`{arg}` must be a float in [0, 1). Received: {arg}={value!r}"
                )
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.first_moment_dtype = keras.backend.standardize_dtype(first_moment_dtype)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._mu = [self._slot(v, "mu", self.first_moment_dtype) for v in variables]
        self._nu = [self._slot(v, "nu", None) for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        mu, nu = self._mu[index], self._nu[index]
        dtype = variable.dtype
        gradient = ops.cast(gradient, dtype)
        count = ops.cast(self.iterations + 1, dtype)
        b1, b2 = self.beta_1, self.beta_2
        decayed_mu = ops.multiply(mu, ops.cast(b1, mu.dtype))
        new_mu = ops.add(ops.multiply(1.0 - b1, gradient), ops.cast(decayed_mu, dtype))
        new_nu = ops.add(
            ops.multiply(1.0 - b2, ops.square(gradient)), ops.multiply(b2, nu)
        )
        mu_hat = ops.divide(new_mu, 1.0 - ops.power(ops.cast(b1, dtype), count))
        nu_hat = ops.divide(new_nu, 1.0 - ops.power(ops.cast(b2, dtype), count))
        update = ops.divide(mu_hat, ops.add(ops.sqrt(nu_hat), self.epsilon))
        self.assign(mu, ops.cast(new_mu, mu.dtype))
        self.assign(nu, new_nu)
        self.assign_sub(variable, ops.multiply(ops.cast(learning_rate, dtype), update))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "first_moment_dtype": self.first_moment_dtype,
            }
        )
        return config


def finetuning_optimizer(
    learning_rate,
    total_steps,
    warmup_steps=500,
    decay_type="cosine",
    momentum=0.9,
    global_clipnorm=1.0,
    accumulator_dtype="bfloat16",
    gradient_accumulation_steps=None,
):
    """The paper's fine-tuning optimizer (App. B.1.1) as the original runs it.

    `MomentumSGD` (momentum 0.9, not Nesterov, buffer in bfloat16), global
    gradient clipping at 1.0 before the momentum, no weight decay, and
    `WarmupDecay` (linear warmup, cosine decay, first update at lr = 0), as
    in google-research/vision_transformer `vit_jax/train.py` and
    `configs/common.py`.

    Args:
        learning_rate: float. Base learning rate (the paper's grids:
            {0.001, 0.003, 0.01, 0.03}; the original code's default is 0.03).
        total_steps: int. Number of updates (e.g. 10_000 for CIFAR, 20_000 for
            ImageNet, 500 for Pets/Flowers, 2_500 for VTAB).
        warmup_steps: int. Defaults to 500 (the original code's default).
        decay_type: `"cosine"` (default) or `"linear"`.
        momentum: float. Defaults to 0.9.
        global_clipnorm: float or None. Defaults to 1.0.
        accumulator_dtype: momentum buffer dtype. Defaults to `"bfloat16"`
            as in the original; `"float32"` gives slightly larger steps.
        gradient_accumulation_steps: int or None. The original accumulates 8
            micro-batches of 64 for its batch of 512; here, `fit` then runs
            `total_steps * gradient_accumulation_steps` batches.

    Returns:
        A `MomentumSGD`.
    """
    schedule = WarmupDecay(
        learning_rate, total_steps, warmup_steps=warmup_steps, decay_type=decay_type
    )
    return MomentumSGD(
        schedule,
        momentum=momentum,
        accumulator_dtype=accumulator_dtype,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )


def pretraining_optimizer(
    model,
    learning_rate,
    total_steps,
    warmup_steps=10_000,
    decay_type="linear",
    weight_decay=0.1,
    decay_variables=None,
    beta_1=0.9,
    beta_2=0.999,
    epsilon=1e-8,
    global_clipnorm=1.0,
    linear_end=1e-5,
    first_moment_dtype="float32",
    gradient_accumulation_steps=None,
):
    """The paper's pre-training optimizer (Sec. 4.1, Table 3, App. B.1).

    `DecoupledAdam` (beta 0.9 / 0.999), decoupled weight decay times the
    learning rate on the kernels only, 10k warmup steps then linear (JFT,
    ImageNet-21k) or cosine (ImageNet-1k) decay, global clipping at 1.0.

    Args:
        model: the built model to train; its kernels are decayed unless
            `decay_variables` is given.
        learning_rate: float. Base learning rate (Table 3: 8e-4 for B/16 on
            JFT, 1e-3 on ImageNet-21k, 3e-3 on ImageNet).
        total_steps: int. Number of updates.
        warmup_steps: int. Defaults to 10_000.
        decay_type: `"linear"` (default) or `"cosine"`.
        weight_decay: float. Defaults to 0.1 (JFT; 0.03 for ImageNet-21k and
            0.3 for ImageNet in Table 3).
        decay_variables: list of variables to decay. Defaults to
            `kernel_variables(model)`.
        beta_1, beta_2, epsilon: Adam constants (optax's defaults).
        global_clipnorm: float or None. Defaults to 1.0.
        linear_end: final learning rate of the linear decay. Defaults to 1e-5.
        first_moment_dtype: `"float32"` (default) or `"bfloat16"` (big_vision).
        gradient_accumulation_steps: int or None.

    Returns:
        A `DecoupledAdam`.
    """
    if decay_variables is None:
        decay_variables = kernel_variables(model)
    schedule = WarmupDecay(
        learning_rate,
        total_steps,
        warmup_steps=warmup_steps,
        decay_type=decay_type,
        linear_end=linear_end,
    )
    return DecoupledAdam(
        schedule,
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=epsilon,
        weight_decay=weight_decay,
        decay_variables=decay_variables,
        first_moment_dtype=first_moment_dtype,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )
