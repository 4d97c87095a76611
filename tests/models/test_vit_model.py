"""`ViTModel`: a step that raises in `fit`, `evaluate` or `predict` leaves
the model with its weights, on every backend (Keras' JAX trainer empties the
variables while its loops run and, in `predict` and `evaluate`, does not put
them back: the model then failed every later call)."""

import itertools

import keras
import numpy as np
import pytest

import keras_vit
import keras_vit.inspect
from keras_vit.models import ViTModel
from keras_vit.pretraining import MaskedPatchPrediction
from tests.helpers import TINY_WIDTHS, randomize_weights

SIZE = 16
BAD_SIZE = 18  # not a multiple of the patch, nor a fixed-size model's size


def _model(dynamic=False, seed=0):
    model = keras_vit.ViT(None, patch_size=4, input_shape=(None, None, 3) if dynamic else (SIZE, SIZE, 3),
                          num_classes=3, **TINY_WIDTHS)
    randomize_weights(model, seed=seed, scale=0.1)
    return model


def _compiled(model, run_eagerly=False, learning_rate=0.1, steps_per_execution=1):
    model.compile(optimizer=keras.optimizers.SGD(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], run_eagerly=run_eagerly, steps_per_execution=steps_per_execution)
    return model


IMAGES = np.random.default_rng(0).uniform(-1, 1, (4, SIZE, SIZE, 3)).astype("float32")
LABELS = np.array([0, 1, 2, 1], "int32")


class CorruptFile(OSError):
    """A loader failing (or Ctrl-C while a batch loads): outside any step."""


def _raises(error="size"):
    if error == "ctrl_c":
        return pytest.raises(KeyboardInterrupt)
    if error == "load":
        return pytest.raises(Exception, match="a corrupt file")
    # A refused size: ValueError, or TensorFlow's InvalidArgumentError in a
    # graph traced for unknown sizes; either names the size.
    return pytest.raises(Exception, match=rf"\b{BAD_SIZE}\b")


def _batches(good, labels=True, error="size"):
    """`good` good batches of two, then images of a refused size or a
    loader's error."""
    for i in range(good):
        images = IMAGES[2 * (i % 2):2 * (i % 2) + 2]
        yield (images, LABELS[:2]) if labels else (images,)
    if error == "load":
        raise CorruptFile("a corrupt file")
    bad = np.zeros((2, BAD_SIZE, BAD_SIZE, 3), "float32")
    yield (bad, LABELS[:2]) if labels else (bad,)


def _failing_pipeline(labels=True):
    """A tf.data pipeline whose first batch fails to load (a generator's
    first batch is read before the loop starts)."""
    import tensorflow as tf

    def load(index):
        raise CorruptFile("a corrupt file")

    images = tf.data.Dataset.range(4).map(
        lambda i: tf.ensure_shape(tf.py_function(load, [i], tf.float32), (SIZE, SIZE, 3)))
    data = tf.data.Dataset.zip((images, tf.data.Dataset.from_tensor_slices(LABELS))) if labels else images
    return data.batch(2)


class CtrlC(keras.callbacks.Callback):
    """Ctrl-C while the progress bar prints: between executions, the
    model's variables emptied for the loop."""

    def on_predict_batch_end(self, batch, logs=None):
        if batch >= 1:  # Keras 3.10 gives an execution's first batch
            raise KeyboardInterrupt

    on_test_batch_end = on_predict_batch_end


def _equal(model, expected):
    return all(np.array_equal(a, b) for a, b in zip(model.get_weights(), expected))


def _assert_weights(model, expected, atol=0.0):
    for actual, wanted, variable in zip(model.get_weights(), expected, model.weights):
        np.testing.assert_allclose(actual, wanted, rtol=0, atol=atol, err_msg=variable.path)


# (good batches before the failure, error): a refused size in the first and
# the fourth batch (inside a step: with two steps per execution, after the
# execution's first step has consumed the state it was given), a loader's
# error at the same places (outside the steps), Ctrl-C between executions.
FAILURES = [(0, "size"), (3, "size"), (0, "load"), (3, "load"), (None, "ctrl_c")]
# Several steps per execution matter on JAX, where an execution's first step
# consumes the state it was given (Keras' PyTorch trainer has none;
# TensorFlow's keeps its variables in place).
JAX_ONLY = pytest.mark.skipif(keras.backend.backend() != "jax", reason="an execution of two steps: JAX's case")


@pytest.mark.parametrize("run_eagerly, steps_per_execution", [
    (False, 1), (True, 1), pytest.param(False, 2, marks=JAX_ONLY)], ids=["compiled", "eager", "two_per_call"])
def test_a_failed_predict_or_evaluate_keeps_the_weights(run_eagerly, steps_per_execution):
    # One model through every failure in turn: each must leave it as it was.
    model = _compiled(_model(dynamic=True), run_eagerly=run_eagerly, steps_per_execution=steps_per_execution)
    before = model.get_weights()
    logits = model.predict(IMAGES, verbose=0)
    # From a twin: this model's first `evaluate` is a failure (TensorFlow's
    # first trace failing half-way).
    metrics = _compiled(_model(dynamic=True)).evaluate(IMAGES, LABELS, verbose=0)
    for call in ("evaluate", "predict"):
        labels = call == "evaluate"
        for good, error in FAILURES:
            if error == "ctrl_c":
                data, kwargs = (IMAGES, LABELS) if labels else (IMAGES,), dict(batch_size=1, callbacks=[CtrlC()])
            elif error == "load" and good == 0:
                data, kwargs = (_failing_pipeline(labels),), {}
            else:
                data, kwargs = (_batches(good, labels, error),), {}
            with _raises(error):
                getattr(model, call)(*data, verbose=0, **kwargs)
            what = f"after {call} with {error} after {good} batches"
            _assert_weights(model, before)
            np.testing.assert_array_equal(model.predict(IMAGES, verbose=0), logits, err_msg=what)
            if call == "evaluate":
                np.testing.assert_allclose(model.evaluate(IMAGES, LABELS, verbose=0), metrics, rtol=1e-6,
                                           err_msg=what)


@JAX_ONLY
def test_outputs_that_cannot_be_joined_keep_the_weights():
    # Two sizes in one execution of two steps: the token sequences differ in
    # length, and joining them fails after both steps ran.
    model = keras_vit.ViT(None, patch_size=4, input_shape=(None, None, 3), include_top=False, **TINY_WIDTHS)
    model.compile(steps_per_execution=2)
    before = model.get_weights()
    with pytest.raises(Exception):
        model.predict(iter([(IMAGES[:2],), (np.zeros((2, 20, 20, 3), "float32"),)]), verbose=0)
    _assert_weights(model, before)
    model.predict(IMAGES, verbose=0)


def test_a_refused_size_keeps_a_fixed_size_models_weights():
    model = _model()
    logits = model.predict(IMAGES, verbose=0)
    with _raises():
        model.predict(np.zeros((2, BAD_SIZE, BAD_SIZE, 3), "float32"), verbose=0)
    np.testing.assert_array_equal(model.predict(IMAGES, verbose=0), logits)


def test_a_callback_that_sets_a_scheduled_rate_is_refused_before_any_step():
    """`ReduceLROnPlateau` with `finetuning_optimizer`'s `WarmupDecay`
    failed at its first reduction ("not settable"), maybe hours in."""
    model = _model()
    model.compile(keras_vit.training.finetuning_optimizer(0.1, 10, warmup_steps=1),
                  keras_vit.training.SoftmaxCrossEntropy(sparse=True))
    before = [keras.ops.convert_to_numpy(v) for v in model.variables]
    for callback in (keras.callbacks.ReduceLROnPlateau(monitor="loss"),
                     keras.callbacks.LearningRateScheduler(lambda epoch: 0.1)):
        # In a list, alone, in a CallbackList, or positionally.
        for fit in (lambda: model.fit(IMAGES, LABELS, callbacks=[callback], verbose=0),
                    lambda: model.fit(IMAGES, LABELS, callbacks=callback, verbose=0),
                    lambda: model.fit(IMAGES, LABELS, callbacks=keras.callbacks.CallbackList([callback]), verbose=0),
                    lambda: model.fit(IMAGES, LABELS, 4, 1, 0, [callback])):
            with pytest.raises(ValueError, match=f"{type(callback).__name__} sets the optimizer's learning rate, "
                                                 "but this optimizer follows a schedule"):
                fit()
    for a, b in zip(before, model.variables):
        np.testing.assert_array_equal(a, keras.ops.convert_to_numpy(b))
    model.fit(IMAGES, LABELS, callbacks=keras.callbacks.EarlyStopping(monitor="loss"), verbose=0)  # others train
    model.compile(keras_vit.training.MomentumSGD(0.1), keras_vit.training.SoftmaxCrossEntropy(sparse=True))
    model.fit(IMAGES, LABELS, epochs=2, callbacks=[keras.callbacks.LearningRateScheduler(lambda e: 0.1 / (e + 1))],
              verbose=0)
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(0.05)


@pytest.mark.parametrize("steps_per_execution", [1, pytest.param(2, marks=JAX_ONLY)])
def test_a_failed_fit_keeps_the_last_completed_step_and_trains_on(steps_per_execution):
    # One model through three failed fits, a twin trained on their good
    # batches alone: the first step refused (TensorFlow: inside the first
    # trace, which must not stop the next `fit`), the fourth (with two steps
    # per execution: after the execution's first step consumed the state it
    # was given), a loader's error after the third.
    model = _compiled(_model(dynamic=True), steps_per_execution=steps_per_execution)
    reference = _compiled(_model(dynamic=True))  # the same weights (same seed)
    for good, error in [(0, "size"), (3, "size"), (3, "load")]:
        with _raises(error):
            model.fit(_batches(good, error=error), steps_per_epoch=good + 1, shuffle=False, verbose=0)
        after_steps = [reference.get_weights()]
        for images, labels in itertools.islice(_batches(good), good):
            reference.fit(images, labels, shuffle=False, verbose=0)
            after_steps.append(reference.get_weights())
        # All the good steps; one fewer where Keras (3.10, JAX) reads a
        # batch ahead of the step and meets a loader's error early.
        completed = good if error != "load" or _equal(model, after_steps[good]) else good - 1
        _assert_weights(model, after_steps[completed])
        reference.set_weights(after_steps[completed])
    for trained in (model, reference):
        trained.fit(IMAGES, LABELS, batch_size=2, shuffle=False, verbose=0)
    # (TensorFlow traces `model`'s step anew: float32 rounding may differ.)
    _assert_weights(model, reference.get_weights(), atol=1e-6)


@JAX_ONLY
@pytest.mark.parametrize("call", ["fit", "predict"])
def test_ctrl_c_while_a_compiled_step_runs_keeps_its_new_state(call):
    # A real SIGINT (a notebook's interrupt), delivered while the step runs:
    # Python raises it as the call returns, after JAX consumed (donated) the
    # state the step was given and before its new state was kept. Every
    # weight was lost, every later call failing.
    import signal

    class Interrupted(ViTModel):
        def _make_function(self, step_function, *args, **kwargs):
            steps = []

            def step(state, data):
                result = step_function(state, data)
                steps.append(1)
                if len(steps) == 3:
                    signal.raise_signal(signal.SIGINT)
                return result

            return super()._make_function(step, *args, **kwargs)

    model = _compiled(_model())
    reference = _compiled(_model())  # the same weights (same seed)
    model.__class__ = Interrupted
    images, labels = np.concatenate([IMAGES] * 2), np.concatenate([LABELS] * 2)
    before = model.get_weights()
    with pytest.raises(KeyboardInterrupt):
        if call == "fit":
            model.fit(images, labels, batch_size=2, shuffle=False, verbose=0)
        else:
            model.predict(images, batch_size=2, verbose=0)
    if call == "fit":  # the third step's weights
        reference.fit(images[:6], labels[:6], batch_size=2, shuffle=False, verbose=0)
        _assert_weights(model, reference.get_weights())
    else:
        _assert_weights(model, before)
    model.__class__ = ViTModel
    np.testing.assert_array_equal(model.predict(IMAGES, verbose=0), reference.predict(IMAGES, verbose=0))


@JAX_ONLY
@pytest.mark.parametrize("call", ["fit", "evaluate"])
def test_ctrl_c_while_keras_stores_the_new_state_keeps_it(call):
    # Between an execution's return and Keras' loop storing its state
    # (`_jax_state`, whose tracking is a fair amount of Python) the state
    # Keras holds was consumed by the step: its `finally` wrote deleted
    # arrays into the variables (3 of 150 real interrupts, re-probe).
    class Interrupted(ViTModel):
        stores = 0

        def __setattr__(self, name, value):
            if name == "_jax_state" and value is not None:
                type(self).stores += 1
                if type(self).stores == 3:
                    raise KeyboardInterrupt
            super().__setattr__(name, value)

    model = _compiled(_model())
    reference = _compiled(_model())  # the same weights (same seed)
    model.__class__ = Interrupted
    images, labels = np.concatenate([IMAGES] * 2), np.concatenate([LABELS] * 2)
    with pytest.raises(KeyboardInterrupt):
        getattr(model, call)(images, labels, batch_size=2, verbose=0, **({"shuffle": False} if call == "fit" else {}))
    model.__class__ = ViTModel
    if call == "fit":  # the third step's weights
        reference.fit(images[:6], labels[:6], batch_size=2, shuffle=False, verbose=0)
    _assert_weights(model, reference.get_weights())
    np.testing.assert_array_equal(model.predict(IMAGES, verbose=0), reference.predict(IMAGES, verbose=0))


@pytest.mark.parametrize("first", ["size", "ctrl_c"])
def test_no_stale_state_is_written_back_after_a_failure(first):
    # Keras' JAX trainer keeps the last completed step's state to sync back
    # later. After a failed predict (in the second step, or Ctrl-C between
    # steps) and weights set since, a second failure before any step and a
    # callback reading `self.model` in the next `fit` wrote those old values
    # back, silently.
    model = _compiled(_model(dynamic=True), learning_rate=0.0)
    with _raises(first):
        if first == "ctrl_c":
            model.predict(IMAGES, batch_size=1, verbose=0, callbacks=[CtrlC()])
        else:
            model.predict(_batches(1, labels=False), verbose=0)
    new = [w + 1.0 for w in model.get_weights()]
    model.set_weights(new)
    with _raises("load"):
        model.predict(_failing_pipeline(labels=False), verbose=0)
    _assert_weights(model, new)

    class ReadsTheModel(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            assert self.model is not None

    model.fit(IMAGES, LABELS, verbose=0, callbacks=[ReadsTheModel()])  # learning rate 0
    _assert_weights(model, new)


def test_every_model_the_library_builds_keeps_its_weights(tmp_path):
    model = _model(dynamic=True)
    derived = {
        "new head": keras_vit.reset_head(model, 2),
        "feature maps": keras_vit.feature_maps(keras_vit.ViT(None, patch_size=4, input_shape=(None, None, 3),
                                                             include_top=False, **TINY_WIDTHS)),
        "attention": keras_vit.inspect.attention_model(model),
        "clone": keras.models.clone_model(model),
    }
    model.save(tmp_path / "model.keras")
    derived["reloaded"] = keras.saving.load_model(tmp_path / "model.keras")
    for name, built in derived.items():
        assert isinstance(built, ViTModel), name
        before = built.get_weights()
        with _raises():
            built.predict(np.zeros((1, BAD_SIZE, BAD_SIZE, 3), "float32"), verbose=0)
        _assert_weights(built, before)
        built.predict(IMAGES, verbose=0)


def test_masked_patch_prediction_keeps_the_backbones_weights():
    backbone = keras_vit.ViT(None, patch_size=4, input_shape=(SIZE, SIZE, 3), include_top=False, **TINY_WIDTHS)
    model = MaskedPatchPrediction(backbone, seed=0)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    model.fit(IMAGES, batch_size=2, verbose=0)
    before = backbone.get_weights()
    with _raises():
        model.evaluate(_batches(1, labels=False), verbose=0)
    _assert_weights(backbone, before)
    backbone.predict(IMAGES, verbose=0)
