"""`ViTModel`: a step that raises in `fit`, `evaluate` or `predict` leaves
the model with its weights, on every backend (Keras' JAX trainer empties the
variables while its loops run and, in `predict` and `evaluate`, does not put
them back: the model then failed every later call)."""

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


def _raises(error=ValueError):
    """A refused size: ValueError, or TensorFlow's InvalidArgumentError in a
    graph traced for unknown sizes; either names the size."""
    if error is KeyboardInterrupt:
        return pytest.raises(KeyboardInterrupt)
    return pytest.raises(Exception, match=rf"\b{BAD_SIZE}\b")


def _batches(good, labels=True):
    """`good` good batches of two, then images of a refused size."""
    for i in range(good):
        images = IMAGES[2 * (i % 2):2 * (i % 2) + 2]
        yield (images, LABELS[:2]) if labels else (images,)
    bad = np.zeros((2, BAD_SIZE, BAD_SIZE, 3), "float32")
    yield (bad, LABELS[:2]) if labels else (bad,)


class CtrlC(keras.callbacks.Callback):
    """Ctrl-C while the progress bar prints: between steps, the model's
    variables emptied for the loop."""

    def on_predict_batch_end(self, batch, logs=None):
        if batch == 1:
            raise KeyboardInterrupt

    on_test_batch_end = on_predict_batch_end


def _weights(model):
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


def _assert_weights(model, expected):
    for actual, wanted, variable in zip(_weights(model), expected, model.weights):
        np.testing.assert_array_equal(actual, wanted, err_msg=variable.path)


# (call, good batches before the failure, error): the first batch refused,
# a later one, Ctrl-C between steps.
FAILURES = [(call, good, error) for call in ("predict", "evaluate")
            for good, error in ((0, ValueError), (1, ValueError), (1, KeyboardInterrupt))]


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_a_failed_predict_or_evaluate_keeps_the_weights(run_eagerly):
    # One model through every failure in turn: each must leave it as it was.
    model = _compiled(_model(dynamic=True), run_eagerly=run_eagerly)
    before = _weights(model)
    logits = model.predict(IMAGES, verbose=0)
    for call, good, error in FAILURES:
        with _raises(error):
            if error is KeyboardInterrupt:
                getattr(model, call)(*((IMAGES,) if call == "predict" else (IMAGES, LABELS)),
                                     batch_size=1, verbose=0, callbacks=[CtrlC()])
            elif call == "predict":
                model.predict(_batches(good, labels=False), verbose=0)
            else:
                model.evaluate(_batches(good), verbose=0)
        _assert_weights(model, before)
        np.testing.assert_array_equal(model.predict(IMAGES, verbose=0), logits, err_msg=f"after {call}, {error}")


def test_a_refused_size_keeps_a_fixed_size_models_weights():
    model = _model()
    logits = model.predict(IMAGES, verbose=0)
    with _raises():
        model.predict(np.zeros((2, BAD_SIZE, BAD_SIZE, 3), "float32"), verbose=0)
    np.testing.assert_array_equal(model.predict(IMAGES, verbose=0), logits)


@pytest.mark.parametrize("steps_per_execution", [1, pytest.param(2, marks=pytest.mark.skipif(
    keras.backend.backend() == "torch", reason="Keras' PyTorch trainer has no steps_per_execution"))])
def test_a_failed_fit_keeps_the_last_completed_step(steps_per_execution):
    # With two steps per execution the fourth step fails inside the second
    # execution, whose first step has consumed (donated) the state the
    # execution was given: only the step's own state is left to put back.
    model = _compiled(_model(dynamic=True), steps_per_execution=steps_per_execution)
    reference = _compiled(_model(dynamic=True))  # the same weights (same seed)
    with _raises():
        model.fit(_batches(3), steps_per_epoch=4, shuffle=False, verbose=0)
    reference.fit(_batches(3), steps_per_epoch=3, shuffle=False, verbose=0)  # the good steps only
    _assert_weights(model, _weights(reference))


def test_no_stale_state_is_written_back_after_a_failure():
    # Keras' JAX trainer keeps the last completed step's state to sync back
    # later. After a failed predict (second batch) and weights set since, a
    # second failure (first batch) and a callback reading `self.model` in
    # the next `fit` wrote those old values back, silently.
    model = _compiled(_model(dynamic=True), learning_rate=0.0)
    with _raises():
        model.predict(_batches(1, labels=False), verbose=0)
    new = [w + 1.0 for w in _weights(model)]
    model.set_weights(new)
    with _raises():
        model.predict(_batches(0, labels=False), verbose=0)

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
        before = _weights(built)
        with _raises():
            built.predict(np.zeros((1, BAD_SIZE, BAD_SIZE, 3), "float32"), verbose=0)
        _assert_weights(built, before)
        built.predict(IMAGES, verbose=0)


def test_masked_patch_prediction_keeps_the_backbones_weights():
    backbone = keras_vit.ViT(None, patch_size=4, input_shape=(SIZE, SIZE, 3), include_top=False, **TINY_WIDTHS)
    model = MaskedPatchPrediction(backbone, seed=0)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    model.fit(IMAGES, batch_size=2, verbose=0)
    before = _weights(backbone)
    with _raises():
        model.evaluate(_batches(1, labels=False), verbose=0)
    _assert_weights(backbone, before)
    backbone.predict(IMAGES, verbose=0)
