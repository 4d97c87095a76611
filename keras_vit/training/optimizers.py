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
  micro-step counts, and its accumulation (a `cond` around a cross-replica
  update) fails under `tf.distribute`.
* Under `tf.distribute`, Keras clips each replica's gradient before the
  cross-replica sum, which is not the global norm of the summed gradient.
* Excluding variables from weight decay by name pattern depends on the
  backend's variable names; here decayed variables are listed explicitly.

`MomentumSGD` and `DecoupledAdam` fix all of these; `finetuning_optimizer`
and `pretraining_optimizer` assemble the paper's set-ups.

Keras seams: everything goes through public `keras.optimizers.Optimizer`
methods (`apply`, `build`, `update_step`, `add_variable*`, `iterations`)
and `keras.distribution.distribution()`, except `_get_variable_index`, which every
built-in Keras optimizer uses to find a variable's slots (under
`tf.distribute`, `update_step` receives per-device copies that only Keras
can map back); `tests/training/test_training.py` fails loudly if it changes.
"""

import keras
import ml_dtypes
import numpy as np
from keras import ops

from keras_vit import distribute
from keras_vit.layers.utils import check_rate, is_int, is_real
from keras_vit.training.schedules import AccumulationSchedule, WarmupDecay


def _clip_by_global_norm(grads, max_norm):
    """optax.clip_by_global_norm: g if |g| < max_norm else g / |g| * max_norm."""
    norm = ops.sqrt(
        sum(ops.sum(ops.square(ops.cast(g, "float32"))) for g in grads if g is not None)
    )
    clipped = []
    for g in grads:
        if g is None:
            clipped.append(None)
            continue
        scaled = ops.multiply(ops.divide(g, ops.cast(norm, g.dtype)), max_norm)
        clipped.append(ops.where(norm < max_norm, g, scaled))
    return clipped


def _rounded(value, dtype):
    """`value` rounded to `dtype`, as a Python float.

    optax multiplies a low-precision buffer by a Python float, which JAX
    rounds to the buffer's dtype (bf16(0.9) = 0.8984375); the product itself
    is formed in float32 under `jit` (XLA keeps the excess precision).
    Rounding the factor here, on the host, keeps XLA from folding the
    rounding away.
    """
    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return float(np.asarray(value, np.float64).astype(dtype).astype(np.float64))


def kernel_variables(model):
    """The trainable kernels of `model`: the weights the original decays.

    big_vision decays the parameters whose name ends in `/kernel`: the
    kernels of the patch embedding, attention, MLP, pre-logits and head (and
    of convolutions in hybrids). Biases, LayerNorm/GroupNorm scales and
    offsets, the class token and the position embedding are left alone.
    Keras names every such weight `kernel` on all backends, so the same rule
    applies to `model.trainable_variables`.

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
    return [v for v in model.trainable_variables if v.name == "kernel"]


class _DecaySelection:
    """The variables to decay, as given (not tracked by Keras)."""

    def __init__(self, spec):
        self.spec = None if spec is None else tuple(spec)


class _OriginalOrderOptimizer(keras.optimizers.Optimizer):
    """Shared behaviour of the optimizers below (not exported).

    * Gradient accumulation without `cond`: every micro-batch runs the same
      program, and the update is selected with `where` (as Keras' own JAX
      accumulation does), so it works inside `tf.distribute` replicas,
      `TPUStrategy` and JAX distributions alike. The schedule and Adam's bias
      correction count real updates (`iterations`).
    * `global_clipnorm` clips the global norm of the gradient summed over
      replicas (sum first, then clip), also under `tf.distribute`.
    * Weight decay (decoupled, multiplied by the learning rate, as Keras
      `AdamW`) applies to `decay_variables` only.

    Keras' own clipping, decay and accumulation are left switched off (they
    would act at the wrong place: before the cross-replica sum, on every
    micro-batch): `clip_global_norm`, `decoupled_weight_decay` and
    `accumulation_steps` hold the values, `get_config` stores them under
    Keras' argument names.
    """

    def __init__(
        self,
        learning_rate,
        decay_variables=None,
        global_clipnorm=None,
        gradient_accumulation_steps=None,
        weight_decay=None,
        **kwargs,
    ):
        if gradient_accumulation_steps is not None and (
            not is_int(gradient_accumulation_steps) or gradient_accumulation_steps < 1
        ):
            raise ValueError(
                "`gradient_accumulation_steps` must be a positive int or None. "
                f"Received: gradient_accumulation_steps={gradient_accumulation_steps!r}"
            )
        if not callable(learning_rate) and (not is_real(learning_rate) or learning_rate < 0):  # schedules are callable
            raise ValueError("`learning_rate` must be a finite non-negative float or a LearningRateSchedule. "
                             f"Received: learning_rate={learning_rate!r}")
        steps = gradient_accumulation_steps if gradient_accumulation_steps != 1 else None
        if steps is not None:
            steps = gradient_accumulation_steps = int(steps)
        if steps and isinstance(
            learning_rate, keras.optimizers.schedules.LearningRateSchedule
        ):
            # Keras calls the schedule with its count of `apply` calls
            # (micro-batches); the original evaluates it once per update.
            if not isinstance(learning_rate, AccumulationSchedule):
                learning_rate = AccumulationSchedule(learning_rate, steps)
            elif learning_rate.accumulation_steps != steps:
                raise ValueError(
                    "The learning-rate schedule counts "
                    f"{learning_rate.accumulation_steps} micro-batches per update, "
                    "the optimizer accumulates "
                    f"{steps}. Received: gradient_accumulation_steps={steps}"
                )
        elif isinstance(learning_rate, AccumulationSchedule) and learning_rate.accumulation_steps > 1:
            # Without accumulation every call is an update: the schedule would run k times slower.
            raise ValueError(
                f"The learning-rate schedule counts {learning_rate.accumulation_steps} micro-batches per update, "
                "the optimizer accumulates none: pass its `schedule` instead, or the same "
                f"gradient_accumulation_steps. Received: gradient_accumulation_steps={gradient_accumulation_steps}")
        super().__init__(learning_rate=learning_rate, **kwargs)
        if steps and (self.clipnorm or self.clipvalue):
            # Keras would clip what is handed to it on every micro-batch (the running total).
            raise ValueError(
                "`clipnorm` and `clipvalue` do not combine with `gradient_accumulation_steps` here; "
                "`global_clipnorm` clips the accumulated gradient (the original's clipping). "
                f"Received: clipnorm={self.clipnorm}, clipvalue={self.clipvalue}, gradient_accumulation_steps={steps}")
        if global_clipnorm is not None and (
            not is_real(global_clipnorm) or global_clipnorm <= 0
        ):
            raise ValueError(
                "`global_clipnorm` must be a positive float or None. "
                f"Received: global_clipnorm={global_clipnorm!r}"
            )
        self.accumulation_steps = steps
        self.clip_global_norm = None if global_clipnorm is None else float(global_clipnorm)
        if weight_decay is not None and (
            not is_real(weight_decay) or weight_decay < 0
        ):
            raise ValueError(
                "`weight_decay` must be a non-negative float or None. "
                f"Received: weight_decay={weight_decay!r}"
            )
        self.decoupled_weight_decay = None if weight_decay is None else float(weight_decay)
        if weight_decay and decay_variables is None:
            raise ValueError(
                "With `weight_decay`, pass the variables to decay explicitly: "
                "`decay_variables=keras_vit.training.kernel_variables(model)` "
                "for the original's choice (kernels only), or "
                "`model.trainable_variables` to decay everything. "
                f"Received: weight_decay={weight_decay}, decay_variables=None"
            )
        if decay_variables is not None:
            if isinstance(decay_variables, (str, keras.Variable)):  # list() of a JAX variable never ended
                raise ValueError(
                    "`decay_variables` must be a list of `keras.Variable`s (or their `.path` strings), not one. "
                    f"Received: decay_variables={getattr(decay_variables, 'path', decay_variables)!r}"
                )
            decay_variables = list(decay_variables)
            for item in decay_variables:
                if not isinstance(item, (str, keras.Variable)):
                    raise ValueError(
                        "`decay_variables` must hold `keras.Variable`s (or "
                        "their exact `.path` strings, as in a saved config). "
                        f"Received an item {item!r} of type {type(item).__name__}"
                    )
        # Held in a plain object: model variables assigned to an optimizer
        # attribute (even in a tuple) would be tracked as optimizer state.
        self._decay = _DecaySelection(decay_variables)
        self._decayed = ()

    def _apply_calls(self):
        """Keras' count of `apply` calls (micro-batches). Read through the
        base class' property: `super().iterations` inside a compiled
        PyTorch step is a graph break (torch.compile reads the property
        object, not its value), and the step then falls back to eager."""
        return keras.optimizers.Optimizer.iterations.fget(self)

    @property
    def iterations(self):
        """The number of updates (micro-batches // `accumulation_steps`)."""
        calls = self._apply_calls()
        if self.accumulation_steps:
            return ops.floor_divide(calls, self.accumulation_steps)
        return calls

    def build(self, variables):
        if self.built:
            return
        variables = list(variables)
        if self.decoupled_weight_decay:
            self._decayed = self._select_decayed(variables)
        super().build(variables)
        self._accumulators = (
            [self.add_variable_from_reference(v, name="accumulator") for v in variables]
            if self.accumulation_steps
            else []
        )

    def _select_decayed(self, variables):
        by_path = {v.path: v for v in variables}
        known = {id(v) for v in variables}
        chosen, unknown = set(), []
        for item in self._decay.spec:
            variable = by_path.get(item) if isinstance(item, str) else item
            if variable is None or id(variable) not in known:
                unknown.append(item if isinstance(item, str) else item.path)
                continue
            chosen.add(id(variable))
        if unknown:
            raise ValueError(
                "`decay_variables` holds variables this optimizer does not "
                "train (frozen, or from another model). "
                f"Received: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}"
            )
        return tuple(id(v) in chosen for v in variables)

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        raise NotImplementedError(
            f"{type(self).__name__} selects decayed variables with "
            "`decay_variables=[...]` at construction, not by exclusion."
        )

    def apply(self, grads, trainable_variables=None):
        """Accumulates and clips, then hands the update to Keras.

        Under `tf.distribute` the micro-batch gradients are summed across
        replicas first (the state is then the same on every replica); the
        result is handed on from the first replica only, so that Keras'
        own cross-replica sum returns it unchanged.
        """
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            if not self.built:
                self.build(trainable_variables)
        if not self.accumulation_steps and not self.clip_global_norm:
            return super().apply(grads, trainable_variables)
        # Accumulated and clipped unscaled; Keras divides what it is handed
        # by `loss_scale_factor`, so the result goes back scaled.
        scale = self.loss_scale_factor
        if scale is not None:
            grads = [None if g is None else g / scale for g in grads]
        context = distribute.tf_replica_context()
        if context is not None:
            present = [i for i, g in enumerate(grads) if g is not None]
            summed = context.all_reduce("sum", [grads[i] for i in present])
            for i, g in zip(present, summed):
                grads[i] = g
        if self.accumulation_steps:
            if trainable_variables is None:
                indices = range(len(grads))
            else:
                indices = [self._get_variable_index(v) for v in trainable_variables]
            totals = [
                None if g is None else ops.add(self._accumulators[i], g)
                for i, g in zip(indices, grads)
            ]
            means = [None if t is None else t / self.accumulation_steps for t in totals]
            if self.clip_global_norm:
                means = _clip_by_global_norm(means, self.clip_global_norm)
            # On a micro-step update_step stores the running total; on an
            # update step it applies the (clipped) mean.
            is_update = self._is_update_step()
            grads = [
                None if t is None else ops.where(is_update, m, t)
                for m, t in zip(means, totals)
            ]
        else:
            grads = _clip_by_global_norm(grads, self.clip_global_norm)
        if context is not None:
            first = ops.equal(context.replica_id_in_sync_group, 0)
            grads = [
                None if g is None else ops.where(first, g, ops.zeros_like(g))
                for g in grads
            ]
        if scale is not None:
            grads = [None if g is None else g * scale for g in grads]
        return super().apply(grads, trainable_variables)

    def _is_update_step(self):
        """Whether the current `apply` call updates the weights (a boolean
        tensor), or None without accumulation."""
        if not self.accumulation_steps:
            return None
        return ops.equal(ops.mod(self._apply_calls() + 1, self.accumulation_steps), 0)

    def _prepare_update(self, gradient, variable):
        """`(index, gradient, is_update)` for `update_step`: stores the
        running total on accumulation micro-steps."""
        index = self._get_variable_index(variable)
        is_update = self._is_update_step()
        if is_update is not None:
            accumulator = self._accumulators[index]
            self.assign(
                accumulator,
                ops.where(is_update, ops.zeros_like(gradient), gradient),
            )
        return index, ops.cast(gradient, variable.dtype), is_update

    def _finish_update(self, index, variable, step, learning_rate, is_update):
        """`variable -= step` (plus the decoupled decay), on update steps."""
        dtype = variable.dtype
        learning_rate = ops.cast(learning_rate, dtype)
        new = variable
        if self._decayed and self._decayed[index]:
            # Keras AdamW's order: decay first, then the update.
            decay = ops.cast(self.decoupled_weight_decay, dtype)
            new = ops.subtract(new, ops.multiply(ops.multiply(new, decay), learning_rate))
        new = ops.subtract(new, step)
        self.assign(variable, _select(is_update, new, variable))

    def _slot(self, reference, name, dtype):
        """An optimizer variable shaped like `reference`, in `dtype`."""
        dtype = keras.backend.standardize_dtype(dtype or reference.dtype)
        if dtype == keras.backend.standardize_dtype(reference.dtype):
            return self.add_variable_from_reference(reference, name=name)
        # A JAX distribution shards the slot like its variable.
        distribution = keras.distribution.distribution()
        layout = None if distribution is None else distribution.get_variable_layout(reference)
        return self.add_variable(
            shape=reference.shape,
            dtype=dtype,
            name=f"{reference.path.replace('/', '_')}_{name}",
            layout=layout,
        )

    def get_config(self):
        config = super().get_config()
        spec = self._decay.spec
        config["decay_variables"] = (
            None if spec is None else [v if isinstance(v, str) else v.path for v in spec]
        )
        config["global_clipnorm"] = self.clip_global_norm
        config["weight_decay"] = self.decoupled_weight_decay
        config["gradient_accumulation_steps"] = self.accumulation_steps
        return config


def _select(is_update, new, old):
    """`new` on update steps, `old` on accumulation micro-steps."""
    if is_update is None:
        return new
    return ops.where(is_update, new, ops.convert_to_tensor(old))


def _float_dtype(dtype, name):
    """A floating dtype's name (an int32 buffer would truncate the moment)."""
    try:
        standard = keras.backend.standardize_dtype(dtype)
    except (ValueError, TypeError):
        standard = None
    if standard is None or "float" not in standard:
        raise ValueError(f"`{name}` must be a floating dtype (e.g. 'float32', 'bfloat16'). Received: {name}={dtype!r}")
    return standard


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
        self.momentum = check_rate(momentum, "momentum")
        self.accumulator_dtype = _float_dtype(accumulator_dtype, "accumulator_dtype")

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._traces = [
            self._slot(v, "trace", self.accumulator_dtype) for v in variables
        ]
        self._trace_factor = _rounded(self.momentum, self.accumulator_dtype)

    def update_step(self, gradient, variable, learning_rate):
        index, gradient, is_update = self._prepare_update(gradient, variable)
        trace = self._traces[index]
        # optax.trace: `trace = g + momentum * trace`, the product formed in
        # float32 (as XLA runs the original under jit) from the stored
        # buffer and the factor rounded to the buffer's dtype; the new trace
        # is used unrounded and only rounded for storage.
        decayed = ops.multiply(ops.cast(trace, gradient.dtype), self._trace_factor)
        new_trace = ops.add(gradient, decayed)
        self.assign(trace, _select(is_update, ops.cast(new_trace, trace.dtype), trace))
        step = ops.multiply(ops.cast(learning_rate, gradient.dtype), new_trace)
        self._finish_update(index, variable, step, learning_rate, is_update)

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
        self.beta_1 = check_rate(beta_1, "beta_1")
        self.beta_2 = check_rate(beta_2, "beta_2")
        if not is_real(epsilon) or epsilon <= 0:
            raise ValueError(f"`epsilon` must be a finite positive float. Received: epsilon={epsilon!r}")
        self.epsilon = float(epsilon)
        self.first_moment_dtype = _float_dtype(first_moment_dtype, "first_moment_dtype")

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._mu = [self._slot(v, "mu", self.first_moment_dtype) for v in variables]
        self._nu = [self._slot(v, "nu", None) for v in variables]
        self._mu_factor = _rounded(self.beta_1, self.first_moment_dtype)

    def update_step(self, gradient, variable, learning_rate):
        index, gradient, is_update = self._prepare_update(gradient, variable)
        mu, nu = self._mu[index], self._nu[index]
        dtype = gradient.dtype
        count = ops.cast(self.iterations + 1, dtype)
        b1, b2 = self.beta_1, self.beta_2
        # optax.scale_by_adam: `(1 - b1) * g + b1 * mu`, the product in
        # float32 from the stored moment (see MomentumSGD.update_step).
        decayed_mu = ops.multiply(ops.cast(mu, dtype), self._mu_factor)
        new_mu = ops.add(ops.multiply(1.0 - b1, gradient), decayed_mu)
        new_nu = ops.add(
            ops.multiply(1.0 - b2, ops.square(gradient)), ops.multiply(b2, nu)
        )
        mu_hat = ops.divide(new_mu, 1.0 - ops.power(ops.cast(b1, dtype), count))
        nu_hat = ops.divide(new_nu, 1.0 - ops.power(ops.cast(b2, dtype), count))
        update = ops.divide(mu_hat, ops.add(ops.sqrt(nu_hat), self.epsilon))
        self.assign(mu, _select(is_update, ops.cast(new_mu, mu.dtype), mu))
        self.assign(nu, _select(is_update, new_nu, nu))
        step = ops.multiply(ops.cast(learning_rate, dtype), update)
        self._finish_update(index, variable, step, learning_rate, is_update)

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
        warmup_steps: int. Defaults to 500 (the original code's default);
            shorter runs need their own (the paper: 100 for Pets/Flowers'
            500 updates, 200 for VTAB's 2,500).
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
