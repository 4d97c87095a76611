"""Dynamic-size models (`input_shape=(None, None, 3)`): one model, any image
size, the same logits as a model built at that size from the same weights
(issue 25)."""

import functools
import json

import keras
import numpy as np
import pytest

import keras_vit
import keras_vit.inspect
from keras_vit.layers.position_embedding import interpolation_matrix, resample_position_embedding
from tests.helpers import TINY_WIDTHS, assert_close_rel, gradients, randomize_weights, torch_graphs

BACKEND = keras.backend.backend()

# Testing-size versions of Ti/16 (class token), B/16-gap and R+Ti/16 (a
# hybrid: ResNet root, stride 4, and one unit, x patch 2), each stored at
# `image_size`, and the sizes they are run at: the stored one, a larger, a
# smaller and a non-square one.
KINDS = {
    "Ti/16": (dict(patch_size=4, num_classes=5), (16, 16), [(16, 16), (24, 24), (8, 8), (12, 20)]),
    "B/16-gap": (dict(patch_size=4, classifier="gap", num_classes=4), (16, 20), [(16, 20), (32, 28), (8, 12), (20, 8)]),
    "R+Ti/16": (dict(patch_size=2, resnet=(1,), resnet_width_factor=0.5, num_classes=3), (32, 32),
                [(32, 32), (48, 40), (16, 16), (24, 40)]),
    # Position embeddings of the patches only, after two register tokens.
    "registers": (dict(patch_size=4, num_classes=3, num_register_tokens=2, no_embed_class=True), (16, 16),
                  [(16, 16), (20, 12)]),
}


def dynamic_model(kind, **kwargs):
    options, stored, _ = KINDS[kind]
    model = keras_vit.ViT(None, input_shape=(None, None, 3), image_size=stored, **TINY_WIDTHS, **options, **kwargs)
    return randomize_weights(model)


def static_twin(model, kind, size, interpolation="linear"):
    """The model built at `size` with `model`'s weights, its position
    embedding resampled as the loaders resample checkpoints."""
    options, _, _ = KINDS[kind]
    twin = keras_vit.ViT(None, input_shape=(*size, 3), **TINY_WIDTHS, **options)
    parts, posemb = keras_vit.models.anatomy(model), model.get_layer("posembed_input")
    target = keras_vit.models.anatomy(twin).grid
    for source, dest in zip(model.weights, twin.weights):
        value = keras.ops.convert_to_numpy(source)
        if source is posemb.pos_embedding:
            value = resample_position_embedding(value, target, parts.grid, parts.posemb_prefix_tokens, interpolation)
        dest.assign(value)
    return twin


def images(size, batch=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, *size, 3)).astype("float32")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_size_gives_the_static_models_logits_eager_and_compiled(kind):
    model = dynamic_model(kind)
    for size in KINDS[kind][2]:
        x = images(size)
        expected = static_twin(model, kind, size).predict_on_batch(x)
        assert_close_rel(keras.ops.convert_to_numpy(model(x)), expected, 1e-5, f"{kind} eager at {size}")
        # Compiled: jax.jit (one compilation per shape), tf.function (after a
        # few sizes retraced for unknown height and width), PyTorch eager.
        assert_close_rel(model.predict_on_batch(x), expected, 1e-5, f"{kind} compiled at {size}")


def test_resampling_under_mixed_bfloat16_is_one_rounding_of_the_float32_result():
    """The stored embedding is read in float32 and resampled in float32,
    then cast once (as timm resamples under AMP); it was autocast first and
    resampled in bfloat16 (errors of 2.6e-2 against 7.8e-3 for one
    rounding, on N(0, 1) values)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        layer = keras_vit.layers.AddPositionEmbedding(grid=(6, 6), stride=(4, 4), num_prefix_tokens=1)
        layer.build((None, 37, 8))
    finally:
        keras.config.set_dtype_policy(previous)
    stored = np.random.default_rng(0).normal(size=(1, 37, 8)).astype("float32")
    layer.pos_embedding.assign(stored)
    tokens = keras.ops.zeros((1, 1 + 24 * 24, 8), "bfloat16")
    got = keras.ops.convert_to_numpy(keras.ops.cast(layer(tokens, keras.ops.zeros((1, 96, 96, 3))), "float32"))
    exact = resample_position_embedding(stored.astype("float64"), (24, 24), (6, 6))
    # One rounding to bfloat16 (8 significant bits), plus float32's error.
    assert np.all(np.abs(got - exact) <= 2.0**-8 * np.abs(exact) + 1e-6)


def test_training_gradients_flow_back_through_the_resampling():
    """At a size off the stored grid, every gradient equals the static
    twin's, and the stored embedding's is the twin's pulled back through the
    (linear) resampling: R^T dL/dP C for P = R G C^T."""
    model = dynamic_model("Ti/16")
    size, prefix = (12, 20), 1
    twin = static_twin(model, "Ti/16", size)
    x = images(size)
    stored, target = keras_vit.models.anatomy(model).grid, keras_vit.models.anatomy(twin).grid
    for variable, got, want in zip(model.trainable_variables, gradients(model, x), gradients(twin, x)):
        if variable.path.endswith("key/bias"):
            continue  # Zero in exact arithmetic (a shift of every key's logit), rounding noise here.
        if variable is model.get_layer("posembed_input").pos_embedding:
            rows, cols = (interpolation_matrix(s, t, "linear") for s, t in zip(stored, target))
            grid = np.einsum("ri,rcd,cj->ijd", rows, want[0, prefix:].reshape(*target, -1), cols)
            want = np.concatenate([want[:, :prefix], grid.reshape(1, -1, grid.shape[-1])], axis=1)
        assert_close_rel(got, want, 1e-4, f"gradient of {variable.path}")


@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile; jax.jit and tf.function run in the test above")
def test_torch_compile_resamples_inside_the_compiled_graph():
    # One size off the stored grid: each further size is another
    # compilation (tens of seconds on two cores).
    model = dynamic_model("Ti/16")
    model.compile(jit_compile=True)
    x = images((12, 20))
    expected = keras.ops.convert_to_numpy(static_twin(model, "Ti/16", (12, 20))(x))
    assert_close_rel(model.predict(x, verbose=0), expected, 1e-5, "torch.compile at (12, 20)")


@functools.cache  # (a second count would find the graphs compiled)
def keras_ops_break_torch_graphs():
    return torch_graphs(lambda x: keras.ops.maximum(x, 1.0), keras.ops.zeros((2,))) > 1  # Keras 3.10, the lowest


def skip_where_keras_ops_break_torch_graphs():
    if keras_ops_break_torch_graphs():
        pytest.skip("this Keras' ops on Python numbers break torch.compile's graph themselves")


@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile")
def test_torch_compile_traces_the_resampling_without_a_break():
    # On PyTorch the interpolation matrices are tensor ops at every size:
    # built in numpy (as on JAX and TensorFlow, at trace time), each
    # conversion split the compiled graph, and a dynamic-size Ti/16 compiled
    # to 15 graphs instead of 1 (twice inductor's compile time).
    tokens, pixels = keras.ops.zeros((2, 1 + 3 * 5, 8)), keras.ops.zeros((2, 12, 20, 3))
    skip_where_keras_ops_break_torch_graphs()
    for interpolation in ("linear", "bicubic", "bicubic_antialias"):
        layer = keras_vit.layers.AddPositionEmbedding(
            grid=(4, 4), stride=(4, 4), num_prefix_tokens=1, interpolation=interpolation)
        layer(tokens, pixels)  # built outside the compiled call
        assert torch_graphs(lambda t, i: layer(t, i), tokens, pixels) == 1, interpolation


@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile")
def test_torch_compile_traces_one_graph_for_every_further_size():
    # torch.compile (as Keras' `jit_compile=True` calls it) traces once at
    # the first size, then once with the sides symbolic, and that graph
    # serves every size after. Keras' ops on the symbolic sizes broke it,
    # and a Ti/16's `predict` compiled again at sizes it had seen (16 s each).
    skip_where_keras_ops_break_torch_graphs()
    sizes = [(12, 20), (16, 24), (20, 8), (16, 16), (12, 20), (28, 12)]  # (16, 16): the stored grid
    inputs = [(keras.ops.zeros((2, 1 + (h // 4) * (w // 4), 8)), keras.ops.zeros((2, h, w, 3))) for h, w in sizes]
    layers = {}
    for interpolation in ("linear", "bicubic", "bicubic_antialias"):
        layers[interpolation] = keras_vit.layers.AddPositionEmbedding(
            grid=(4, 4), stride=(4, 4), num_prefix_tokens=1, interpolation=interpolation)
        layers[interpolation](*inputs[0])
    # One function each: torch.compile keeps its graphs, and which sizes it
    # has seen vary, per function (per code object).
    functions = {"linear": lambda t, i: layers["linear"](t, i),
                 "bicubic": lambda t, i: layers["bicubic"](t, i),
                 "bicubic_antialias": lambda t, i: layers["bicubic_antialias"](t, i)}
    for interpolation, function in functions.items():
        assert torch_graphs(function, *inputs[0], then=inputs[1:]) == 2, interpolation
        # At the stored grid the resampling is the identity, exactly.
        stored = layers[interpolation](*inputs[3]) - inputs[3][0]
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(stored)[0],
                                      keras.ops.convert_to_numpy(layers[interpolation].pos_embedding)[0])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a TensorFlow graph of unknown height and width")
def test_a_tf_function_of_unknown_size_resamples_in_the_graph_and_refuses_other_sides():
    import tensorflow as tf

    model = dynamic_model("B/16-gap")
    serve = tf.function(lambda x: model(x), input_signature=[tf.TensorSpec((None, None, None, 3), tf.float32)])
    for size in [(16, 20), (8, 12), (20, 8)]:
        x = images(size)
        expected = keras.ops.convert_to_numpy(static_twin(model, "B/16-gap", size)(x))
        assert_close_rel(serve(x).numpy(), expected, 1e-5, f"unknown-size graph at {size}")
    # keras.ops has no assertion: the graph's check is a reshape that names
    # the side and the patch.
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor with 18 values, but the requested shape requires a multiple of 4"):
        serve(images((18, 16)))
    # 0 is a multiple of every patch: the graph returned zeros (and NaN for
    # gap) for a batch of as many rows as the image had columns.
    for size in [(0, 16), (16, 0)]:
        with pytest.raises(tf.errors.InvalidArgumentError, match="tensor with 0 values, but the requested shape has 4"):
            serve(images(size))


def test_a_side_that_is_not_a_multiple_is_refused_naming_the_size():
    model = dynamic_model("R+Ti/16")
    with pytest.raises(ValueError, match=r"width must be a positive multiple of 8.*\(1, 32, 36, 3\)"):
        model(images((32, 36), batch=1))
    with pytest.raises(ValueError, match=r"height must be a positive multiple of 8.*\(1, 4, 32, 3\)"):
        model.predict_on_batch(images((4, 32), batch=1))


@pytest.mark.one_backend
def test_builder_checks_of_dynamic_sizes():
    with pytest.raises(ValueError, match=r"image_size. must be a multiple of 4x4.*image_size=\(18, 16\)"):
        keras_vit.ViT(None, input_shape=(None, None, 3), image_size=(18, 16), patch_size=4, **TINY_WIDTHS)
    with pytest.raises(ValueError, match=r"fixed side.*image_size=32, input_shape=\(16, None, 3\)"):
        keras_vit.ViT(None, input_shape=(16, None, 3), image_size=32, patch_size=4, **TINY_WIDTHS)
    with pytest.raises(ValueError, match=r"this model's input is fixed.*image_size=32"):
        keras_vit.ViT(None, input_shape=(16, 16, 3), image_size=32, patch_size=4, **TINY_WIDTHS)
    with pytest.raises(ValueError, match=r"channels.*input_shape=\(None, None, None\)"):
        keras_vit.ViT(None, input_shape=(None, None, None), patch_size=4, **TINY_WIDTHS)
    # One side open: the fixed side is stored as it is, the open one at 224.
    model = keras_vit.ViT(None, input_shape=(32, None, 3), patch_size=16, **TINY_WIDTHS)
    parts = keras_vit.models.anatomy(model)
    assert (parts.image_size, parts.grid, parts.dynamic) == ((32, 224), (2, 14), True)
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 1 + 2 * 14, TINY_WIDTHS["hidden_size"])


def test_saving_export_npz_and_the_practitioner_api(tmp_path):
    model = dynamic_model("Ti/16")
    sizes = [(16, 16), (12, 20)]
    # .keras keeps the model dynamic.
    path = tmp_path / "dynamic.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert tuple(restored.input_shape) == (None, None, None, 3)
    for size in sizes:
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(restored(images(size))),
                                      keras.ops.convert_to_numpy(model(images(size))))
    # export_npz writes the stored embeddings, unresampled; they load into a
    # static model at the stored size and give the same logits.
    keras_vit.export_npz(model, tmp_path / "dynamic.npz")
    with np.load(tmp_path / "dynamic.npz") as stored:
        np.testing.assert_array_equal(stored["Transformer/posembed_input/pos_embedding"],
                                      keras.ops.convert_to_numpy(model.get_layer("posembed_input").pos_embedding))
    static = keras_vit.ViT(None, input_shape=(16, 16, 3), weights=str(tmp_path / "dynamic.npz"), **TINY_WIDTHS,
                           **KINDS["Ti/16"][0])
    assert_close_rel(keras.ops.convert_to_numpy(static(images((16, 16)))),
                     keras.ops.convert_to_numpy(model(images((16, 16)))), 1e-6)
    # And a checkpoint loads into a dynamic model (stored at its grid here).
    again = keras_vit.ViT(None, input_shape=(None, None, 3), image_size=16, weights=str(tmp_path / "dynamic.npz"),
                          **TINY_WIDTHS, **KINDS["Ti/16"][0])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(images((12, 20)))),
                                  keras.ops.convert_to_numpy(model(images((12, 20)))))
    # A new head, a frozen backbone and raw-pixel preprocessing stay dynamic.
    tuned = keras_vit.reset_head(model, 7)
    keras_vit.freeze_backbone(tuned)
    assert [w.path for w in tuned.trainable_weights] == ["head/kernel", "head/bias"]
    assert keras.ops.convert_to_numpy(tuned(images((12, 20)))).shape == (2, 7)
    raw = keras_vit.ViT(None, input_shape=(None, None, 3), image_size=16, include_preprocessing=True, **TINY_WIDTHS,
                        **KINDS["Ti/16"][0])
    raw.set_weights(model.get_weights())
    pixels = (images((12, 20)) + 1) * 127.5
    assert_close_rel(keras.ops.convert_to_numpy(raw(pixels)), keras.ops.convert_to_numpy(model(images((12, 20)))), 1e-5)


def test_attention_maps_rollout_and_feature_maps_at_any_size():
    model = dynamic_model("Ti/16")
    features = keras_vit.ViT(None, input_shape=(None, None, 3), image_size=16, include_top=False, **TINY_WIDTHS,
                             **KINDS["Ti/16"][0])
    features.set_weights(model.get_weights()[:-2])
    for size in [(24, 24), (12, 20)]:
        x = images(size)
        twin = static_twin(model, "Ti/16", size)
        assert_close_rel(keras_vit.inspect.attention_weights(model, x),
                         keras_vit.inspect.attention_weights(twin, x), 1e-5, f"attention at {size}")
        grid_maps, image_maps = keras_vit.inspect.rollout_maps(model, x)
        assert grid_maps.shape == (2, size[0] // 4, size[1] // 4) and image_maps.shape == (2, *size)
        np.testing.assert_allclose(grid_maps, keras_vit.inspect.rollout_maps(twin, x)[0], atol=1e-5)
        maps = keras.ops.convert_to_numpy(keras_vit.feature_maps(features)(x))
        tokens = keras.ops.convert_to_numpy(features(x))
        assert maps.shape == (2, size[0] // 4, size[1] // 4, TINY_WIDTHS["hidden_size"])
        np.testing.assert_array_equal(maps.reshape(2, -1, maps.shape[-1]), tokens[:, 1:])


def test_the_inspection_report_at_the_images_grid(tmp_path):
    pytest.importorskip("matplotlib")  # not in the lowest environment
    model = dynamic_model("Ti/16")
    # The paper's figures at the images' grid; the embeddings' own grid apart.
    written = keras_vit.inspect.write_figures(model, images((12, 20)), tmp_path, rollout_images=1)
    with open(written["summary"]) as f:
        summary = json.load(f)
    assert (summary["image_size"], summary["grid"], summary["posemb_grid"]) == ([12, 20], [3, 5], [4, 4])


@pytest.mark.main_env  # ONNX: onnxruntime and tf2onnx are the main environment's
@pytest.mark.skipif(BACKEND != "tensorflow", reason="exports from TensorFlow (docs/export.md: what works where)")
@pytest.mark.skipif(tuple(int(p) for p in keras.version().split(".")[:2]) < (3, 15),
                    reason="the export formats of docs/export.md (Keras 3.15; older Keras has no LiteRT format)")
def test_exports_keep_height_and_width_open(tmp_path):
    import tensorflow as tf

    model = dynamic_model("Ti/16")
    sizes = [(16, 16), (12, 20)]
    expected = {size: keras.ops.convert_to_numpy(model(images(size))) for size in sizes}
    model.export(str(tmp_path / "saved"), format="tf_saved_model", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "saved"))
    for size in sizes:
        assert_close_rel(served.serve(images(size)).numpy(), expected[size], 1e-5, f"SavedModel at {size}")
    with pytest.raises(tf.errors.InvalidArgumentError, match="requires a multiple of 4"):
        served.serve(images((18, 16)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor with 0 values"):
        served.serve(images((16, 0)))
    model.export(str(tmp_path / "model.tflite"), format="litert", verbose=False)
    interpreter = tf.lite.Interpreter(model_path=str(tmp_path / "model.tflite"))
    entry = interpreter.get_input_details()[0]
    assert list(entry["shape_signature"]) == [-1, -1, -1, 3]
    for size in sizes:
        interpreter.resize_tensor_input(entry["index"], (2, *size, 3))
        interpreter.allocate_tensors()
        interpreter.set_tensor(entry["index"], images(size))
        interpreter.invoke()
        logits = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        assert_close_rel(logits, expected[size], 1e-5, f"LiteRT at {size}")
    ort = pytest.importorskip("onnxruntime")
    model.export(str(tmp_path / "model.onnx"), format="onnx", verbose=False)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    for size in sizes:
        logits = session.run(None, {session.get_inputs()[0].name: images(size)})[0]
        assert_close_rel(logits, expected[size], 1e-5, f"ONNX at {size}")
