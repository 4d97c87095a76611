"""Raw-image models (`include_preprocessing=True`) and export, one test per
row of docs/export.md: .keras, SavedModel, LiteRT, ONNX. Tiny models; each
exported artefact is run and must give the Keras model's logits."""

import ast
import inspect
import pathlib
import re
import warnings

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.layers import PreprocessInput
from tests.helpers import assert_close_rel, lazy_build, randomize_weights

pytestmark = pytest.mark.main_env

BACKEND = keras.backend.backend()
TINY = dict(input_shape=(16, 16, 3), hidden_size=8, mlp_dim=16, num_heads=2, num_layers=1, patch_size=8, num_classes=5)


def raw_model(**kwargs):
    return randomize_weights(keras_vit.ViT(None, include_preprocessing=True, **{**TINY, **kwargs}))


def _version(module):
    """The (major, minor) version of an importable module."""
    import importlib

    return tuple(int(part) for part in importlib.import_module(module).__version__.split(".")[:2])


def to_numpy(tensor):
    return keras.ops.convert_to_numpy(tensor)


def raw_images(n=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 16, 16, 3)).astype("uint8")


@pytest.fixture(scope="module")
def served():
    """A raw-image model, a uint8 batch, and the model's logits on it."""
    model = raw_model()
    x = raw_images()
    return model, x, np.asarray(model.predict(x.astype("float32"), verbose=0))


# --- include_preprocessing ----------------------------------------------------


def test_every_constructor_takes_include_preprocessing():
    for info in keras_vit.list_models():
        if info.constructor:
            parameter = inspect.signature(getattr(keras_vit, info.constructor)).parameters["include_preprocessing"]
            assert parameter.default is False
    model = lazy_build(lambda: keras_vit.ViTB16(include_preprocessing=True))
    # Behind the size check, before anything else.
    assert [layer.name for layer in model.layers[1:4]] == ["image_size_check", "preprocess_input", "embedding"]
    assert isinstance(model.layers[2], PreprocessInput)
    hybrid = lazy_build(lambda: keras_vit.get_model("R26_S_32", include_preprocessing=True))
    assert isinstance(hybrid.layers[2], PreprocessInput)
    assert not any(isinstance(layer, PreprocessInput) for layer in lazy_build(keras_vit.ViTTi16).layers)
    with pytest.raises(ValueError, match="Received: include_preprocessing='yes'"):
        keras_vit.ViTTi16(num_layers=1, include_preprocessing="yes")


def test_raw_model_logits_equal_preprocess_input_then_model():
    raw = raw_model()
    plain = keras_vit.ViT(None, **TINY)
    plain.set_weights(raw.get_weights())  # PreprocessInput has no weights
    x = raw_images()
    expected = to_numpy(plain(keras_vit.preprocess_input(x)))
    assert_close_rel(to_numpy(raw(x)), expected, tol=1e-6, what="eager, uint8")
    assert_close_rel(raw.predict(x.astype("float32"), verbose=0), expected, tol=1e-6, what="compiled, float")
    # Without the layer, raw pixels give other logits: the mistake it prevents.
    assert np.max(np.abs(to_numpy(plain(x.astype("float32"))) - expected)) > 1e-2


def test_checkpoints_load_into_raw_models(tmp_path):
    source = keras_vit.ViT(None, **TINY)
    randomize_weights(source)
    path = keras_vit.export_npz(source, tmp_path / "ckpt.npz")
    raw = keras_vit.ViT(None, include_preprocessing=True, weights=str(path), **TINY)
    x = raw_images()
    assert_close_rel(to_numpy(raw(x)), to_numpy(source(keras_vit.preprocess_input(x))), tol=1e-6)


# --- Export: one test per row of docs/export.md -------------------------------


def test_keras_file_round_trip(served, tmp_path):
    model, x, expected = served
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(loaded.get_layer("preprocess_input"), PreprocessInput)
    np.testing.assert_allclose(loaded.predict(x.astype("float32"), verbose=0), expected, rtol=0, atol=1e-6)


def test_a_keras_3_10_config_is_called_without_a_structure_warning(served):
    """Keras 3.10 writes one input and one output as lists of one; a file of
    it loaded by Keras 3.15 warned at every call with one tensor ("The
    structure of `inputs` doesn't match")."""
    model, x, expected = served
    config = model.get_config()
    if not isinstance(config["input_layers"][0], list):  # Keras 3.15's form: written as 3.10 does
        config["input_layers"], config["output_layers"] = [config["input_layers"]], [config["output_layers"]]
    rebuilt = type(model).from_config(config)
    rebuilt.set_weights(model.get_weights())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        logits = to_numpy(rebuilt(x.astype("float32")))
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)  # eager against predict's compiled call


def test_saved_model(served, tmp_path):
    model, x, expected = served
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "saved_model")
    if BACKEND == "torch":
        # docs/export.md: not on PyTorch. Keras' torch path calls
        # torch.export.export with `dynamic_shapes` that do not match the
        # structure of its sample inputs (torch._dynamo's UserError), before
        # it would need torch_xla.
        with pytest.raises(RuntimeError, match="mismatch between the structure of `inputs` and `dynamic_shapes`") as info:
            model.export(path, format="tf_saved_model", verbose=False)
        assert type(info.value).__name__ == "UserError"
        return
    model.export(path, format="tf_saved_model", verbose=False)
    reloaded = tf.saved_model.load(path)  # keep a reference: it owns the variables
    if BACKEND == "jax" and _version("jax") >= (0, 11) and _version("tensorflow") < (2, 22):
        # docs/export.md: JAX 0.11+ serialises StableHLO newer than the one
        # TensorFlow 2.21's XlaCallModule reads (no public option selects an
        # older target); the SavedModel is written but does not run.
        with pytest.raises(tf.errors.InvalidArgumentError, match="failed to deserialize portable artifact"):
            reloaded.serve(tf.constant(x, tf.float32))
        return
    served_logits = reloaded.serve(tf.constant(x, tf.float32))
    assert_close_rel(served_logits.numpy(), expected, tol=1e-5, what="SavedModel")


def test_litert(served, tmp_path):
    model, x, expected = served
    path = str(tmp_path / "model.tflite")
    if BACKEND == "jax":
        with pytest.raises(ValueError, match="LiteRT export requires TensorFlow or PyTorch"):
            model.export(path, format="litert", verbose=False)
        return
    if BACKEND == "torch":
        pytest.importorskip("litert_torch", reason="LiteRT on PyTorch needs the litert-torch package")
    model.export(path, format="litert", verbose=False)
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = pytest.importorskip("tensorflow").lite.Interpreter
    interpreter = Interpreter(model_path=path)
    inp = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(inp["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(inp["index"], x.astype("float32"))
    interpreter.invoke()
    logits = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    assert_close_rel(logits, expected, tol=1e-5, what="LiteRT")


def test_onnx(served, tmp_path):
    model, x, expected = served
    path = str(tmp_path / "model.onnx")
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    if BACKEND == "torch":
        # docs/export.md: torch.onnx fails inside Keras' layer normalisation
        # (a shape read from `x.shape` that the exporter cannot make constant).
        import torch

        with pytest.raises(torch.onnx.errors.SymbolicValueError, match="Failed to export a node") as info:
            model.export(path, format="onnx", verbose=False)
        message = str(info.value)
        assert "because it is not constant" in message
        where = re.search(r"# (\S+nn\.py):(\d+)", message)
        assert where, message[:500]
        source, line = pathlib.Path(where.group(1)), int(where.group(2))
        assert source.parts[-3:] == ("src", "ops", "nn.py"), source
        enclosing = [
            node.name for node in ast.walk(ast.parse(source.read_text()))
            if isinstance(node, ast.FunctionDef) and node.lineno <= line <= node.end_lineno
        ]
        assert any("layer_norm" in name for name in enclosing), enclosing
        return
    pytest.importorskip({"tensorflow": "tf2onnx", "jax": "jax2onnx"}[BACKEND])
    model.export(path, format="onnx", verbose=False)
    session = ort.InferenceSession(path)
    logits = session.run(None, {session.get_inputs()[0].name: x.astype("float32")})[0]
    assert_close_rel(logits, expected, tol=1e-5, what="ONNX")
