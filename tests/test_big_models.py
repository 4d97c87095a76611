"""Big models on small accelerators (issue 23): gradient checkpointing
(`remat=`) gives the numbers without it, and LoRA trains adapters only,
saves them alone, and merges for export."""

import errno
import importlib.util
import os
import re
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from tests.helpers import ROOT
from tests.helpers import CopyCheckpointAfterEpoch0
from tests.helpers import gradients

BACKEND = keras.backend.backend()
TINY = dict(hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32, patch_size=4)
SHAPE = (8, 8, 3)


def _model(remat, seed=3, **overrides):
    """A tiny ViT whose weights are all random (the head included: a zero
    head passes no gradient to the rest)."""
    keras.utils.set_random_seed(seed)
    model = keras_vit.ViT(None, input_shape=SHAPE, num_classes=5, remat=remat, **{**TINY, **overrides})
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        variable.assign(rng.normal(0.0, 0.3, tuple(variable.shape)).astype("float32"))
    return model


def _batch(n=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, *SHAPE)).astype("float32")
    return x, np.eye(5, dtype="float32")[rng.integers(0, 5, n)]


@pytest.mark.parametrize("regularised", [False, True], ids=["plain", "dropout_and_drop_path"])
def test_remat_gives_the_same_logits_and_gradients(regularised):
    """Within 1e-6 of the model without remat, with dropout, attention
    dropout and drop-path drawing in training (the recomputation must draw
    the forward's masks: it did not on TensorFlow and PyTorch before the
    block restarted its seed generators)."""
    extra = dict(dropout_rate=0.2, attention_dropout_rate=0.1, drop_path_rate=0.3) if regularised else {}
    x, _ = _batch()
    plain, rematted = _model(False, **extra), _model(True, **extra)
    assert [b.remat for b in rematted.layers if hasattr(b, "remat")] == [True, True]
    for a, b in zip(plain.weights, rematted.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    logits = []
    for model in (rematted, plain):
        keras.utils.set_random_seed(7)
        logits.append(keras.ops.convert_to_numpy(model(x, training=True)))
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-6, atol=1e-6)
    grads = []
    for model in (plain, rematted):
        keras.utils.set_random_seed(11)  # unseeded dropout draws from PyTorch's own generator there
        grads.append(gradients(model, x))
    grads_a, grads_b = grads
    assert len(grads_a) == len(grads_b) == len(plain.trainable_weights)
    for weight, a, b in zip(plain.trainable_weights, grads_a, grads_b):
        assert np.abs(a).max() > 0, weight.path  # every weight gets a gradient
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6, err_msg=weight.path)


def test_remat_falls_back_when_the_flash_kernel_refuses_training_shapes():
    """JAX on a GPU: cuDNN's flash kernel refused 577 tokens for training
    (JAX 0.11, H200) where Keras had taken it for the shapes, and under remat
    the refusal came after Keras' own fallback, when the recomputed region
    was differentiated: bfloat16 training with remat crashed. The block
    retries the region on XLA's attention and leaves the layer's flash
    setting as it was. Simulated here as JAX does it: while flash is not
    switched off, the attention's output goes through a function whose
    forward rule for differentiation refuses."""
    x, _ = _batch()
    plain, rematted = _model(False), _model(True)
    refused = []
    if BACKEND == "jax":
        import jax

        @jax.custom_vjp
        def flash_kernel(y):
            return y

        def forward_rule(y):
            refused.append(y.shape)
            raise NotImplementedError("Unsupported sequence length Q 5, KV 5.")

        flash_kernel.defvjp(forward_rule, lambda residuals, g: (g,))
    else:  # only JAX's attention has a kernel to fall back from: the error surfaces
        def flash_kernel(y):
            raise NotImplementedError("Unsupported sequence length Q 5, KV 5.")

    for block in (b for b in rematted.layers if hasattr(b, "remat")):
        attention = block.attention
        compute = attention._compute_attention

        def kernel_or_not(*args, attention=attention, compute=compute, **kwargs):
            flash, attention._flash_attention = attention._flash_attention, False  # no cuDNN on a CPU
            try:
                out, scores = compute(*args, **kwargs)
            finally:
                attention._flash_attention = flash
            return (out if flash is False else flash_kernel(out)), scores

        attention._compute_attention = kernel_or_not
        attention._flash_attention = True  # as `keras.config.enable_flash_attention()` sets it
    if BACKEND != "jax":
        with pytest.raises(NotImplementedError, match="Unsupported sequence length"):
            rematted(x, training=True)
        return
    for a, b in zip(gradients(plain, x), gradients(rematted, x)):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert refused  # the refusal happened, and was recovered from
    assert all(b.attention._flash_attention is True for b in rematted.layers if hasattr(b, "remat"))


def test_remat_fit_with_accumulation_and_save_load(tmp_path):
    """`fit` (compiled: XLA on JAX and TensorFlow) with 2 accumulated
    micro-batches ends with the weights of the run without remat, and the
    flag survives `.keras` save and load."""
    x, y = _batch(8, seed=1)
    models = []
    for remat in (False, True):
        model = _model(remat, dropout_rate=0.1, drop_path_rate=0.2, num_layers=1)
        model.compile(optimizer=training.finetuning_optimizer(0.1, 4, warmup_steps=1, gradient_accumulation_steps=2),
                      loss=training.SoftmaxCrossEntropy())
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
        assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2
        models.append(model)
    for a, b in zip(*(m.weights for m in models)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(b), keras.ops.convert_to_numpy(a), rtol=1e-5,
                                   atol=1e-6, err_msg=a.path)
    path = str(tmp_path / "remat.keras")
    models[1].save(path)
    loaded = keras.saving.load_model(path, compile=False)
    assert all(layer.remat for layer in loaded.layers if isinstance(layer, keras_vit.layers.TransformerEncoderBlock))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(models[1](x)),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="`remat` must be a bool. Received: remat='yes'"):
        _model("yes")


# --- LoRA ---------------------------------------------------------------------


def _fit(model, x, y, steps=2):
    model.compile(optimizer=training.finetuning_optimizer(0.5, steps, warmup_steps=0),
                  loss=training.SoftmaxCrossEntropy())
    model.fit(x, y, batch_size=len(x) // steps, epochs=1, shuffle=False, verbose=0)
    return model


def _numpy(model):
    return {v.path: keras.ops.convert_to_numpy(v).copy() for v in model.weights}


def test_lora_trains_the_adapters_and_the_head_only(tmp_path):
    """`enable_lora`: adapters on query and value by default (Keras'
    `enable_lora`), everything else frozen but the head; after `fit`, only
    the adapters and the head changed. Merged == adapted; the adapter file
    round-trips onto the base model, and is small; `export_npz` writes the
    merged model."""
    x, y = _batch(8, seed=2)
    model = _model(False)
    base = _numpy(model)
    keras_vit.enable_lora(model, rank=2)
    trainable = sorted(v.path for v in model.trainable_weights)
    adapters = [p for p in trainable if "lora_kernel" in p]
    assert len(adapters) == 2 * 2 * 2  # 2 blocks x (query, value) x (A, B)
    assert all("/query/" in p or "/value/" in p for p in adapters)
    assert sorted(set(trainable) - set(adapters)) == ["head/bias", "head/kernel"]
    # B starts at zero: the adapted model is the base model.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), _forward(base, x), rtol=1e-6, atol=1e-6)
    _fit(model, x, y)
    after = _numpy(model)
    for path, value in base.items():
        if path.startswith("head/") or "seed_generator" in path:
            continue
        np.testing.assert_array_equal(after[path], value, err_msg=path)  # the frozen base, kernels included
    assert not np.array_equal(after["head/kernel"], base["head/kernel"])
    assert any(np.abs(after[p]).max() > 0 for p in adapters if p.endswith("lora_kernel_b"))
    adapted = keras.ops.convert_to_numpy(model(x))
    # Merge for export: no adapter variables, the same logits.
    merged = keras_vit.merge_lora(model)
    assert not any("lora" in v.path for v in merged.weights) and len(merged.weights) == len(base)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(merged(x)), adapted, rtol=1e-5, atol=1e-6)
    assert len(merged.trainable_weights) == len([v for v in merged.weights if "seed_generator" not in v.path])
    # The original format holds the adapted model as it computes, merged; a
    # checkpoint is refused by the adapted model, which stays as it was.
    with np.load(keras_vit.export_npz(model, str(tmp_path / "adapted.npz"))) as adapted_npz, \
            np.load(keras_vit.export_npz(merged, str(tmp_path / "merged.npz"))) as merged_npz:
        assert adapted_npz.files == merged_npz.files
        for key in merged_npz.files:
            np.testing.assert_array_equal(adapted_npz[key], merged_npz[key], err_msg=key)
    with pytest.raises(ValueError, match="has LoRA adapters: load the checkpoint before `enable_lora`"):
        keras_vit.load_weights(model, str(tmp_path / "merged.npz"))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)), adapted)
    # The adapters and the head alone, onto a fresh base model.
    path = keras_vit.save_lora(model, str(tmp_path / "adapters.npz"))
    assert os.path.getsize(path) < 0.5 * sum(v.nbytes for v in base.values())
    fresh = keras_vit.enable_lora(_model(False), rank=2)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras_vit.load_lora(fresh, path)(x)), adapted,
                               rtol=1e-6, atol=1e-6)
    # The same file whatever is trainable: a backbone frozen after training
    # (docs/training.md) or the whole model (the adapters were left out, and
    # a frozen target refused a sound file).
    keras_vit.freeze_backbone(model)
    model.trainable = False
    with np.load(path) as trained, np.load(keras_vit.save_lora(model, str(tmp_path / "frozen.npz"))) as frozen:
        assert sorted(frozen.files) == sorted(trained.files) and len(frozen.files) == len(adapters) + 3
        for key in trained.files:
            np.testing.assert_array_equal(frozen[key], trained[key], err_msg=key)
    fresh = keras_vit.enable_lora(_model(False), rank=2)
    fresh.trainable = False
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras_vit.load_lora(fresh, path)(x)), adapted,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's own parameter list and optimizers")
def test_a_torch_optimizer_trains_the_lora_adapters():
    """A plain PyTorch loop over `model.parameters()` after `enable_lora`
    changes every trainable weight (the adapters and the head) and nothing
    else, and `load_state_dict` (strict) gives a second model built alike in
    the same process the same logits. Keras lists a torch model's
    parameters once, when built: without `enable_lora` listing them again,
    the adapters stayed out and only the head trained."""
    import torch

    x, y = _batch(8, seed=2)
    model = keras_vit.enable_lora(_model(False, drop_path_rate=0.1), rank=2, targets=("query", "value", "mlp"))
    parameters = {id(p) for p in model.parameters()}
    assert [v.path for v in model.trainable_weights if id(v.value) not in parameters] == []
    base = _numpy(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(3):  # B moves at the second step, A at the third (B starts at zero)
        loss = torch.nn.functional.cross_entropy(model(x, training=True), torch.as_tensor(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = _numpy(model)
    changed = sorted(path for path in base if not np.array_equal(after[path], base[path]))
    assert changed == sorted([v.path for v in model.trainable_weights] + [
        v.path for v in model.non_trainable_weights if "seed_generator" in v.path and "encoderblock_1" in v.path])
    twin = keras_vit.enable_lora(_model(False, drop_path_rate=0.1, seed=4), rank=2, targets=("query", "value", "mlp"))
    twin.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(twin(x)), keras.ops.convert_to_numpy(model(x)))


def _forward(weights, x):
    model = _model(False)
    for variable in model.weights:
        variable.assign(weights[variable.path])
    return keras.ops.convert_to_numpy(model(x))


def test_lora_targets_and_errors(tmp_path, monkeypatch):
    model = keras_vit.enable_lora(_model(False), rank=3, targets=("key", "output", "mlp"), alpha=6)
    layers = keras_vit.lora.lora_layers(model)
    assert [layer.path.split("/")[-1] for layer in layers[:4]] == ["key", "attention_output", "Dense_0", "Dense_1"]
    assert all(layer.lora_rank == 3 and layer.lora_alpha == 6 for layer in layers) and len(layers) == 8
    for rank in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"`rank` must be a positive int. Received: rank={rank!r}"):
            keras_vit.enable_lora(_model(False), rank=rank)
    with pytest.raises(ValueError, match="`targets` must be names from"):
        keras_vit.enable_lora(_model(False), rank=2, targets=("query", "qkv"))
    # A rank past what the kernels' updates can hold (rank 10**6 wrote a
    # 640 MB adapter file for a width-32 model): per head for query, key and value.
    block = _model(False).get_layer("encoderblock_0")
    width, head_dim = block.mlp.dense_1.units, block.attention.key_dim
    assert head_dim < width
    for rank, targets, largest in ((head_dim + 1, ("query", "value"), head_dim), (width + 1, ("mlp",), width)):
        with pytest.raises(ValueError, match=rf"`rank` must be at most {largest}, .* Received: rank={rank}$"):
            keras_vit.enable_lora(_model(False), rank=rank, targets=targets)
    adapted = keras_vit.enable_lora(_model(False), rank=head_dim)
    assert adapted.get_layer("encoderblock_0").attention.query_dense.lora_rank == head_dim
    # Numpy numbers (values from a grid): a numpy rank was refused, and a
    # numpy alpha was taken but then refused by `save_lora`'s JSON.
    from_grid = keras_vit.enable_lora(_model(False), rank=np.int64(2), alpha=np.float32(4.0))
    saved = keras_vit.save_lora(from_grid, str(tmp_path.parent / f"{tmp_path.name}_from_grid.npz"))
    keras_vit.load_lora(keras_vit.enable_lora(_model(False), rank=2, alpha=4), saved)
    # 0 trained nothing (B's gradient is scaled by it), NaN gave NaN losses,
    # a string failed in fit naming neither.
    for alpha in (0, -8, float("nan"), "8", True):
        with pytest.raises(ValueError, match=re.escape(f"Received: alpha={alpha!r}")):
            keras_vit.enable_lora(_model(False), rank=2, alpha=alpha)
    # After `freeze_backbone` too, the adapters and the head train: on
    # TensorFlow the frozen blocks (and their new adapters) stayed frozen,
    # so only the head trained.
    frozen = keras_vit.enable_lora(keras_vit.freeze_backbone(_model(False)), rank=2)
    assert sorted(v.path.split("/")[-1] for v in frozen.trainable_weights) == ["bias", "kernel"] + [
        "lora_kernel_a"] * 4 + ["lora_kernel_b"] * 4
    features = keras.Model(*(lambda i: (i, keras.layers.Dense(3, name="head")(i)))(keras.Input((4,))))
    with pytest.raises(ValueError, match="match no layer of model"):
        keras_vit.enable_lora(features, rank=2)
    with pytest.raises(ValueError, match="LoRA is already enabled on model .* \\(rank 3, alpha 6, 8 layers\\)"):
        keras_vit.enable_lora(model, rank=2)
    # A model that predicted before: Keras' compiled `predict` was traced
    # without the adapters, and TensorFlow's ignored them.
    used = keras_vit.ViT(None, input_shape=SHAPE, include_top=False, **TINY)
    images = _batch()[0]
    used.predict(images, verbose=0)
    keras_vit.enable_lora(used, rank=2)
    for layer in keras_vit.lora.lora_layers(used):
        layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.5, "float32"))
    np.testing.assert_allclose(used.predict(images, verbose=0), keras.ops.convert_to_numpy(used(images)), atol=1e-5)
    # Stopped half-way (Ctrl-C in a notebook): the same call again completes
    # it, as one call would have; other arguments are refused.
    stopped, whole = _model(False), keras_vit.enable_lora(_model(False), rank=2, targets=("key", "mlp"))
    third = keras_vit.lora._target_layers(stopped.get_layer("encoderblock_1"), "key")[0]
    with monkeypatch.context() as patch:
        patch.setattr(third, "enable_lora", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            keras_vit.enable_lora(stopped, rank=2, targets=("key", "mlp"))
    assert len(keras_vit.lora.lora_layers(stopped)) == 3
    # A real SIGINT between a layer's two adapters comes after the layer:
    # a stray adapter variable was left, then added again.
    import signal

    fourth = keras_vit.lora._target_layers(stopped.get_layer("encoderblock_1"), "mlp")[0]
    add_weight = fourth.add_weight

    def interrupted(*args, **kwargs):
        if kwargs.get("name") == "lora_kernel_b":
            signal.raise_signal(signal.SIGINT)
        return add_weight(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(fourth, "add_weight", interrupted)
        with pytest.raises(KeyboardInterrupt):
            keras_vit.enable_lora(stopped, rank=2, targets=("key", "mlp"))
    assert len(keras_vit.lora.lora_layers(stopped)) == 5  # block 1's key, then its first MLP layer whole
    with pytest.raises(ValueError, match="already enabled .* \\(rank 2, alpha 2, 5 layers\\)"):
        keras_vit.enable_lora(stopped, rank=4, targets=("key", "mlp"))
    keras_vit.enable_lora(stopped, rank=2, targets=("key", "mlp"))
    assert [v.path for v in stopped.weights] == [v.path for v in whole.weights]
    assert [v.path for v in stopped.trainable_weights] == [v.path for v in whole.trainable_weights]
    assert [layer.path for layer in keras_vit.lora.lora_layers(stopped)] == [
        layer.path for layer in keras_vit.lora.lora_layers(whole)]
    with pytest.raises(ValueError, match="has no LoRA adapters"):
        keras_vit.merge_lora(_model(False))
    # A file of other adapters, or no file of ours, is refused: nothing changes.
    path = keras_vit.save_lora(model, str(tmp_path / "a.npz"))
    # Written as `export_npz` writes: a directory is refused untouched, and a
    # write that fails (a full disk) leaves the old file whole, no temporary.
    saved = open(path, "rb").read()
    with pytest.raises(ValueError, match="is a directory; nothing was written"):
        keras_vit.save_lora(model, str(tmp_path))

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(np, "savez", full_disk)
        with pytest.raises(OSError, match="No space left"):
            keras_vit.save_lora(model, path)
    assert os.listdir(tmp_path) == ["a.npz"] and open(path, "rb").read() == saved
    other = keras_vit.enable_lora(_model(False), rank=2)
    before = _numpy(other)
    with pytest.raises(ValueError, match="holds adapters with rank=3; this model has rank=2"):
        keras_vit.load_lora(other, path)
    np.save(tmp_path / "b.npy", np.zeros(3))
    with pytest.raises(ValueError, match="Cannot read the LoRA file"):
        keras_vit.load_lora(other, str(tmp_path / "b.npy"))
    with open(tmp_path / "c.npz", "wb") as f:
        f.write(open(path, "rb").read()[:200])
    with pytest.raises(ValueError, match="Cannot read the LoRA file"):
        keras_vit.load_lora(other, str(tmp_path / "c.npz"))
    for key, value in _numpy(other).items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


def test_quantized_models_save_load_and_train_adapters(tmp_path):
    """`model.quantize("int8")` (Keras' own) turns every projection into an
    int8 layer: the `.keras` file loads as the same model (the blocks'
    projections were float again, and the file failed to load); LoRA on the
    int8 weights with a float head (QLoRA) trains the adapters and the head
    alone, and its adapter file, merge and reload hold. A quantized head,
    which cannot train, and float8 layers, which take no adapters, are
    refused before anything changes."""
    x, y = _batch(8, seed=2)
    model = _model(False, num_layers=1)
    float_logits = keras.ops.convert_to_numpy(model(x))
    model.quantize("int8")
    if keras.backend.backend() == "torch":  # what a torch optimizer and `state_dict` see (Keras 3.10: the float kernels)
        assert {id(p) for p in model.parameters()} == {id(v.value) for v in model.variables}
    quantized = [layer.path for layer in model._flatten_layers() if layer.quantization_mode == "int8"]
    assert len(quantized) == 4 + 2 + 1  # the block's q, k, v, out and the MLP's two; the head
    logits = keras.ops.convert_to_numpy(model(x))
    assert np.abs(logits - float_logits).max() < 0.05 * np.abs(float_logits).max()
    model.save(str(tmp_path / "int8.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "int8.keras"))
    assert type(loaded) is keras_vit.models.ViTModel
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x)), logits)
    if keras.backend.backend() == "torch":  # what a torch optimizer and `state_dict` see
        assert {id(p) for p in loaded.parameters()} == {id(v.value) for v in loaded.variables}
    trainable = [v.path for v in model.trainable_weights]  # biases, norms, embeddings: int8 kernels do not train
    for refused in (keras_vit.enable_lora, keras_vit.freeze_backbone):
        with pytest.raises(ValueError, match=r"The head of model .* is quantized \(int8\).*Received: head "
                                             r"quantization_mode='int8'"):
            refused(model, **({"rank": 2} if refused is keras_vit.enable_lora else {}))
        assert [v.path for v in model.trainable_weights] == trainable and not keras_vit.lora.lora_layers(model)
    # QLoRA: a new float head on the int8 blocks.
    qlora = keras_vit.enable_lora(keras_vit.reset_head(model, 5, bias=0.1), rank=2)
    assert sorted(v.path for v in qlora.trainable_weights if "lora" not in v.path) == ["head/bias", "head/kernel"]
    before = _numpy(qlora)
    _fit(qlora, x, y, steps=2)
    after = _numpy(qlora)
    changed = {path for path in before if not np.array_equal(after[path], before[path])}
    assert {"head/kernel", "head/bias"} <= changed <= {v.path for v in qlora.trainable_weights}
    assert any(p.endswith("lora_kernel_b") for p in changed)
    adapted = keras.ops.convert_to_numpy(qlora(x))
    path = keras_vit.save_lora(qlora, str(tmp_path / "qlora.npz"))
    fresh = keras_vit.enable_lora(keras_vit.reset_head(keras.saving.load_model(str(tmp_path / "int8.keras")), 5),
                                  rank=2)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras_vit.load_lora(fresh, path)(x)), adapted,
                               rtol=1e-6, atol=1e-6)
    merged = keras_vit.merge_lora(qlora)  # folded into the int8 kernels: requantized
    assert type(merged) is keras_vit.models.ViTModel and not any("lora" in v.path for v in merged.weights)
    assert np.abs(keras.ops.convert_to_numpy(merged(x)) - adapted).max() < 0.05 * np.abs(adapted).max()
    # Float checkpoints of integer codes are refused (written as the
    # weights, a reloaded int8 model was 160 times off) ...
    for export, extra in ((keras_vit.export_npz, ()), (keras_vit.export_timm, ("safetensors",))):
        if all(importlib.util.find_spec(name) for name in extra):
            with pytest.raises(ValueError, match=r"integer-quantized kernels, which `export_.*` cannot write.*"
                                                 r"Received: layers encoderblock_0/"):
                export(merged, tmp_path / "export")
            assert not (tmp_path / "export").exists()
    # ... and the advice holds: the adapters onto the float model, merged, exported.
    base = keras_vit.enable_lora(keras_vit.reset_head(_model(False, num_layers=1), 5), rank=2)
    exported = keras_vit.export_npz(keras_vit.merge_lora(keras_vit.load_lora(base, path)), tmp_path / "float.npz")
    reloaded = keras_vit.ViT(None, input_shape=SHAPE, num_classes=5, **{**TINY, "num_layers": 1}, weights=exported)
    assert np.abs(keras.ops.convert_to_numpy(reloaded(x)) - adapted).max() < 0.05 * np.abs(adapted).max()
    float8 = _model(False, num_layers=1)
    float8.quantize("float8")
    with pytest.raises(ValueError, match="Keras' float8 layers take no LoRA adapters.*Received: "
                                         "encoderblock_0/.*query quantized to float8"):
        keras_vit.enable_lora(keras_vit.reset_head(float8, 5), rank=2)


def test_lora_training_resumes_exactly(tmp_path):
    """Keras writes an adapted kernel merged and leaves the adapters out of
    the weights file; `BackupAndResume` keeps the adapted layers' own
    variables beside it, so a run resumed after epoch 0 ends bit for bit
    as the uninterrupted one (base kernels untouched, adapters trained)."""
    x, y = _batch(8, seed=4)
    directory, copy = tmp_path / "backup", tmp_path / "after_epoch_0"

    def run(backup_dir, callbacks=()):
        model = keras_vit.enable_lora(_model(False), rank=2, targets=("query", "value", "mlp"))
        model.compile(optimizer=training.finetuning_optimizer(0.5, 4, warmup_steps=0),
                      loss=training.SoftmaxCrossEntropy())
        backup = training.BackupAndResume(backup_dir, save_freq="epoch")
        initial_epoch = backup.restore(model, epochs=2, steps_per_epoch=2)
        model.fit(x, y, batch_size=4, epochs=2, initial_epoch=initial_epoch, shuffle=False, verbose=0,
                  callbacks=[backup, *callbacks])
        return model, backup

    reference, _ = run(directory, [CopyCheckpointAfterEpoch0(directory, copy)])
    assert sorted(os.listdir(copy)) == ["checkpoint.json", "step-000000000002.lora.npz",
                                        "step-000000000002.weights.h5"]
    resumed, backup = run(copy)
    assert backup.resumed_from["step"] == 2 and backup.resumed_from["lora"] == "step-000000000002.lora.npz"
    for a, b in zip(reference.weights, resumed.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(b), keras.ops.convert_to_numpy(a), err_msg=a.path)
    assert sorted(os.listdir(copy)) == ["backup.lock", "checkpoint.json", "step-000000000004.lora.npz",
                                        "step-000000000004.weights.h5"]


@pytest.fixture(autouse=True, scope="module")
def _benchmarks_on_path():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    yield
    sys.path.remove(str(ROOT / "benchmarks"))


def _jax_version():
    import jax

    return tuple(int(part) for part in jax.__version__.split(".")[:2])


@pytest.mark.skipif(BACKEND != "jax" or _jax_version() < (0, 11),
                    reason="XLA's memory accounting, read through JAX; with JAX 0.10 XLA:CPU's shows no saving from "
                    "remat (docs/performance.md), with 0.6 Keras 3.10's train_step needs fit's set-up")
def test_memory_benchmark_reads_the_compilers_accounting():
    """`benchmarks/memory.py`: the peak of one compiled training step grows
    linearly with the batch (checked at a third batch); remat and LoRA
    lower it; the largest batch under a budget follows from the line."""
    import memory  # benchmarks/memory.py

    model = memory.SMOKE_MODEL  # `--smoke`'s: its heads had no room for LoRA's rank

    rows = []
    for mode, remat, batches in (("full", False, (2, 4, 8)), ("full", True, (2, 4)), ("lora", False, (2, 4))):
        parts = {b: memory.step_bytes(None, 32, b, mode=mode, remat=remat, num_classes=10, overrides=model)
                 for b in batches}
        base, per_example = memory.fit_line({b: p["peak"] for b, p in parts.items()})
        assert parts[2]["argument"] > 4 * parts[2]["parameters"]  # weights, optimizer state and the batch
        rows.append((per_example, parts[2]["trainable"]))
        if len(batches) == 3:  # the line through 2 and 4 holds at 8
            assert abs(base + 8 * per_example - parts[8]["peak"]) < 0.05 * parts[8]["peak"], parts
    (full, trainable), (rematted, _), (lora, lora_trainable) = rows
    assert rematted < 0.7 * full and lora < full, rows
    assert lora_trainable < 0.2 * trainable
    # 15 GiB left for images of 1 MiB plus the 15 % margin the docs' tables state (it was left out).
    assert memory.largest_batch(2**30, 2**20, 16) == 13356 and memory.largest_batch(17 * 2**30, 1, 16) == 0
    # `--check` runs the same compiled step for real (the head starts at zero: the loss is log(10)).
    row = memory.check(None, 32, 4, steps=2, num_classes=10, overrides=model)
    assert row["measured"].startswith("growth of the process's peak RSS") and row["compiler_gib"] > 0, row
    assert abs(row["loss"] - np.log(10)) < 0.05 and row["step_ms"] > 0, row
