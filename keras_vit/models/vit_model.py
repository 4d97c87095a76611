"""The class of the models keras_vit builds: a functional model that
survives a failed step."""

import weakref

import keras

from keras_vit import interrupts
from keras_vit.distribute import check_built_in_scope
from keras_vit.distribute import check_scope
from keras_vit.layers.utils import track_torch_parameters
from keras_vit.preprocessing import check_image_dtype


class SurvivesFailedSteps:
    """Mixed into a `keras.Model`: a `fit`, `evaluate` or `predict` that
    raises (an image of a refused size, a bad batch, a loader's error,
    Ctrl-C) leaves the model as it was before the failed step, weights and
    all, and ready for the next call.

    Keras alone does not, in two ways:
    - JAX: the trainer takes the values out of the model's variables while
      a loop runs (it passes them through the compiled steps as state, to
      hold one copy in memory) and puts them back when the loop ends.
      `fit` does so in a `finally`, from its last completed step (none if
      the first step raised); `predict` and `evaluate` do not. The
      variables stayed empty and the weights were lost, every later call
      failing with `'NoneType' object is not callable`. Here each
      execution of `steps_per_execution` steps puts back the newest state
      none of its steps has consumed, and `predict` and `evaluate` put
      back the last completed step's state after an error between
      executions, as `fit` does. The state's layout is the one Keras
      documents for a JAX `train_step`, `test_step` and `predict_step`:
      trainable, non-trainable, optimizer and metrics variables, in that
      order, as far as the step takes them. A Ctrl-C while a step runs is
      held back until its new state is kept (`keras_vit.interrupts.
      held_back`: a second one stops it at once), and the newest state is
      kept past the execution, for a Ctrl-C while Keras' loop stores it.
    - TensorFlow: a `tf.function` whose first trace failed half-way cannot
      create the variables it needs (metrics, optimizer slots) when called
      again ("Creating variables on a non-first call to a function
      decorated with tf.function"): `fit` and `evaluate` failed for good.
      Here the failed call's functions are dropped, and the next call
      traces new ones.
    """

    def fit(self, *args, **kwargs):
        # `fit(x, y, batch_size, epochs, verbose, callbacks, ...)`
        callbacks = kwargs.get("callbacks", args[5] if len(args) > 5 else None)
        _check_rate_callbacks(getattr(self, "optimizer", None), callbacks)
        check_built_in_scope(self, "fit")
        try:
            return super().fit(*args, **kwargs)
        except BaseException:
            _recover(self, "train_function", "test_function")
            raise
        finally:
            _newest(self).clear()

    def evaluate(self, *args, **kwargs):
        check_built_in_scope(self, "evaluate")
        try:
            return super().evaluate(*args, **kwargs)
        except BaseException:
            _recover(self, "test_function")
            raise
        finally:
            _newest(self).clear()

    def predict(self, *args, **kwargs):
        check_built_in_scope(self, "predict")
        try:
            return super().predict(*args, **kwargs)
        except BaseException:
            _recover(self)  # (a tf.function of `predict` creates no variables)
            raise
        finally:
            _newest(self).clear()

    def _make_function(self, step_function, *args, **kwargs):
        # Private (pinned by tests/models/test_vit_model.py): JAX's loop of
        # `steps_per_execution` steps lives inside the function this builds
        # from the one-step `step_function`; only there is each step's
        # state at hand. (TensorFlow's trainer has a method of this name
        # too, left as it is.)
        if keras.backend.backend() != "jax":
            return super()._make_function(step_function, *args, **kwargs)
        newest = _newest(self)

        def step(state, data):
            # (The first call also compiles the step: a second Ctrl-C stops it.)
            with interrupts.held_back("this step"):
                outputs, state = step_function(state, data)
                newest[:] = [state]
            return outputs, state

        execution = super()._make_function(step, *args, **kwargs)

        def execution_keeping_weights(state, iterator):
            newest[:] = [state]
            try:
                return execution(state, iterator)
            except StopIteration:  # the data's end before this execution's first step
                raise
            except BaseException:
                # In a step (the state it was given), reading a batch or
                # joining the outputs (the last completed step's).
                _put_back(self, newest[-1])
                raise

        return execution_keeping_weights


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTModel(SurvivesFailedSteps, keras.Model):
    """The functional model every keras_vit builder returns: a `keras.Model`
    built as `ViTModel(inputs, outputs, name=...)` that survives a failed
    step (`SurvivesFailedSteps`), and whose config holds what
    `model.quantize(...)` did to the layers inside its layers.

    Keras writes a quantized layer's new dtype policy into the config of
    that layer alone: the projections inside the encoder blocks (which the
    blocks create) came back as float layers, and a quantized model's
    `.keras` file failed to load ("Layer 'key' expected 2 variables, but
    received 0"). The config lists them (`quantized_layers`: path ->
    mode), and `from_config` quantizes them again before any weights load.
    """

    def call(self, inputs, training=None, mask=None, **kwargs):
        # Before Keras casts them to the input's float32 (in `fit`,
        # `predict` and `model(x)` alike): 16-bit pixels became 469.6 in
        # [-1, 1] in a raw-image model, without an error. (`training` by
        # name: Keras passes it only to a `call` that names it.)
        for images in keras.tree.flatten(inputs):
            check_image_dtype(images)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def quantize(self, *args, **kwargs):
        """`keras.Model.quantize`, refused outside the `setup.scope()` of a
        distributed model (the new variables would live on one device, and
        `fit` would fail inside JAX), and on PyTorch with the parameter
        lists made again (Keras 3.10 left the float kernels there)."""
        check_scope(self, "quantize")
        super().quantize(*args, **kwargs)
        track_torch_parameters(self)

    def get_config(self):
        config = super().get_config()
        quantized = {layer.path: layer.quantization_mode for layer in _leaves(self) if layer.quantization_mode}
        if quantized:
            config["quantized_layers"] = quantized
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        quantized = config.pop("quantized_layers", {})
        for key in ("input_layers", "output_layers"):
            # Keras 3.10 wrote one input (output) as a list of one; built so
            # by Keras 3.15, the model warned at every call with one tensor
            # ("The structure of `inputs` doesn't match").
            layers = config.get(key)
            if isinstance(layers, list) and len(layers) == 1 and isinstance(layers[0], list):
                config[key] = layers[0]
        model = super().from_config(config, custom_objects=custom_objects)
        for layer in _leaves(model):
            # Top-level layers come back quantized from their own configs.
            if quantized.get(layer.path) and not layer.quantization_mode:
                layer.quantize(quantized[layer.path])
        if quantized:
            track_torch_parameters(model)
        return model


def _leaves(model):
    """The layers without sub-layers, at every depth: the ones Keras'
    `Model.quantize` quantizes (private: `_flatten_layers`, as there;
    pinned by the quantized round trip in tests/test_big_models.py)."""
    return [layer for layer in model._flatten_layers(include_self=False) if len(list(layer._flatten_layers())) == 1]


def _check_rate_callbacks(optimizer, callbacks):
    """Refuses, before any step, a callback that sets the learning rate of
    an optimizer that follows a schedule (`finetuning_optimizer`'s and
    `pretraining_optimizer`'s `WarmupDecay`): Keras fails at the first
    change ("its learning rate is not settable"), for
    `ReduceLROnPlateau` maybe hours into the run."""
    setters = [c for c in _flat_callbacks(callbacks) if isinstance(
        c, (keras.callbacks.LearningRateScheduler, keras.callbacks.ReduceLROnPlateau))]
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
    if setters and optimizer is not None and isinstance(optimizer.get_config().get("learning_rate"), dict):
        raise ValueError(
            f"{type(setters[0]).__name__} sets the optimizer's learning rate, but this optimizer follows a "
            "schedule, whose rate Keras cannot set (it would fail at the first change). Drop the callback, or "
            "compile with a constant rate (e.g. keras_vit.training.MomentumSGD(0.01)). Received: "
            f"callbacks=[..., {type(setters[0]).__name__}, ...] with a scheduled learning rate")


def _flat_callbacks(callbacks):
    """The callbacks of `fit`'s argument: a list (nested too), a
    `CallbackList`, or one callback."""
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return list(callbacks.callbacks)
    if isinstance(callbacks, keras.callbacks.Callback):
        return [callbacks]
    return [c for item in callbacks for c in _flat_callbacks(item)]


# model -> [the newest state of its JAX steps no step has consumed yet]
_STATES = weakref.WeakKeyDictionary()


def _newest(model):
    return _STATES.setdefault(model, [])


def _alive(state):
    """Whether no array of a JAX state was consumed (donated) by a step."""
    return not any(getattr(value, "is_deleted", lambda: False)() for value in keras.tree.flatten(state))


def _recover(model, *functions):
    """After a failed call: on JAX, the newest state a step made is put
    back, else the last completed execution's, the trainer's to put back
    (an error between executions: in a callback, Ctrl-C while the progress
    bar prints), as `fit` does in its `finally` (where a Ctrl-C while
    Keras stored the newest state left it a consumed one), and the
    trainer's copy goes (private: `_jax_state`, see `_put_back`); on
    TensorFlow, the call's traced functions go."""
    backend = keras.backend.backend()
    if backend == "jax":
        newest = _newest(model)
        if newest and _alive(newest[-1]):
            _put_back(model, newest[-1])
        elif _alive(getattr(model, "_jax_state", None) or {}):
            model.jax_state_sync()
        model._jax_state = None
    elif backend == "tensorflow":
        for name in functions:
            setattr(model, name, None)


def _put_back(model, state):
    """Assigns a step's `state` to the model's variables, and drops the
    trainer's copy of the last completed step's state: it is synced back
    later (`jax_state_sync`, which a callback's `self.model` calls), and
    after a failed `predict` or `evaluate` it would write stale weights over
    any set since (private; pinned by tests/models/test_vit_model.py)."""
    model._jax_state = None
    # The state of a train step has 4 lists, of a test step 3 (no optimizer
    # variables), of a predict step 2.
    variable_lists = [model.trainable_variables, model.non_trainable_variables]
    if len(state) == 4:
        variable_lists.append(model.optimizer.variables)
    if len(state) >= 3:
        variable_lists.append(model.metrics_variables)
    pairs = [
        (variable, value)
        for variables, values in zip(variable_lists, state)
        for variable, value in zip(variables, values)
    ]
    # A step that failed after it ran has consumed (donated) the arrays it
    # was given: there is nothing left to put back.
    if any(value.is_deleted() for _, value in pairs if hasattr(value, "is_deleted")):
        return
    for variable, value in pairs:
        variable.assign(value)
