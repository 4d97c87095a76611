"""Self-supervised masked patch prediction (paper Sec. 4.6 and App. B.1.2).

BERT's masked language modelling carried over to patches: 50 % of the patch
embeddings are corrupted (of those, 80 % replaced by a learned [mask]
embedding, 10 % by another patch's embedding, 10 % left as they are), and the
model predicts, from the output token of every corrupted patch, the patch's
mean colour with 3 bits per channel (512 classes). The paper also tried a
4x4 downsized 3-bit patch (16 predictions of 512 classes) and L2 regression
of the full patch; all three worked, L2 slightly worse.

No code was released with the paper; where it is silent, the choices below
are ours and are arguments:

* Corruption: exactly `round(corruption_rate * N)` patches per image are
  corrupted (BERT's reference code also corrupts a fixed number per
  sequence); each corrupted patch independently becomes [mask] / another
  patch / itself with probabilities 0.8 / 0.1 / 0.1. "Another patch" is a
  uniformly drawn *other* position of the same image (its uncorrupted
  embedding), so no example depends on the rest of the batch (safe under
  data parallelism). Corruption acts on the patch embeddings, before the
  class token and the position embeddings are added, so a masked patch keeps
  its position embedding (as a masked word in BERT keeps its position).
* Colour quantisation: `quantization="uint8"` (default) maps the model's
  input range back to 0-255 and keeps the top `bits` bits of the mean, i.e.
  `level = floor(mean / 32)` for 3 bits: bins [0, 32), [32, 64), ...,
  [224, 255]. `"uniform"` splits the input range into `2**bits` equal bins.
  A tolerance of 1e-5 bin widths absorbs the float rounding of the [-1, 1]
  scaling, so a mean of exactly 32 lands in bin 1. Class index is
  `r * 2**(2 * bits) + g * 2**bits + b`.
* Head: one Dense layer (zero-initialised, like the classification head)
  on each output token after `encoder_norm`; `head_hidden_size` inserts
  BERT's transform (Dense -> GELU -> LayerNorm) before it.
* Class token: the sequence is the backbone's own, so with a class token
  pre-training sees the sequence that fine-tuning will see; it is not
  predicted from. To pre-train without one, build the backbone with
  `classifier="gap"`.
* Loss: softmax cross-entropy averaged over the corrupted patches (and over
  the 16 cells of `"downsampled"`); `"pixels"` uses the mean squared error
  of the patch's pixels in the model's input range, averaged the same way.

The MPP model is the backbone's own graph with one hook: the corruption is
called right after the `embedding` layer (`keras.models.clone_model` with a
`call_function`, sharing every layer). So the pre-trained encoder *is* the
backbone, with its class token, position embedding, dropout and blocks as
the builder made them: write it with
`export_encoder(path)` (the original `.npz` format) and fine-tune with
`keras_vit.ViT(variant, weights=path, num_classes=...)`.

Hybrid models are refused: their patch embeddings are computed from ResNet
features whose receptive fields span neighbouring patches, so corrupting one
embedding would not hide its pixels from the others.
"""

import keras
from keras import ops

from keras_vit.layers.encoder_block import LAYER_NORM_EPSILON
from keras_vit.layers.utils import head_dtype
from keras_vit.layers.utils import is_real
from keras_vit.layers.utils import named_seed_generator
from keras_vit.layers.utils import normalize_pair
from keras_vit.layers.utils import positive_int
from keras_vit.anatomy import anatomy
from keras_vit.distribute import draw_for_global_batch
from keras_vit.distribute import tf_replica_context
from keras_vit.models.vit_model import SurvivesFailedSteps
from keras_vit.preprocessing import check_image_dtype

TARGETS = ("mean_color", "downsampled", "pixels")
QUANTIZATIONS = ("uint8", "uniform")
# Corruption kinds returned by `PatchCorruption`.
CLEAN, MASKED, REPLACED, KEPT = 0, 1, 2, 3
# In bin widths: absorbs float rounding at exact bin boundaries.
_QUANTIZATION_TOLERANCE = 1e-5


def _check_bits(bits):
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 8:
        raise ValueError(f"`bits` must be an int in [1, 8]. Received: bits={bits!r}")
    return bits


def _check_value_range(value_range):
    try:
        low, high = (float(v) for v in value_range)
    except (TypeError, ValueError):
        low = high = 0.0
    if not high > low:
        raise ValueError(
            "`value_range` must be (low, high) with low < high. "
            f"Received: value_range={value_range!r}"
        )
    return low, high


def quantize_colors(colors, bits=3, quantization="uint8", value_range=(-1.0, 1.0)):
    """Quantises RGB colours to `2**(3 * bits)` classes.

    Args:
        colors: `(..., 3)` tensor or array of RGB values in `value_range`.
        bits: bits per channel (3 in the paper: 512 classes).
        quantization: `"uint8"`: the top `bits` bits of the colour on the
            0-255 scale (`floor(v255 / 2**(8 - bits))`, 255 in the top bin);
            `"uniform"`: `2**bits` equal bins over `value_range`.
        value_range: the range of `colors` (keras_vit models: [-1, 1]).

    Returns:
        int32 tensor `(...)`: `r * 4**bits + g * 2**bits + b` with the
        per-channel levels `r, g, b` in `[0, 2**bits)`.
    """
    bits = _check_bits(bits)
    low, high = _check_value_range(value_range)
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"`quantization` must be one of {QUANTIZATIONS}. Received: quantization={quantization!r}"
        )
    colors = ops.cast(colors, "float32")
    if colors.shape[-1] != 3:
        raise ValueError(f"`colors` must have 3 channels last. Received: shape={colors.shape}")
    unit = (colors - low) / (high - low)
    levels = 2**bits
    if quantization == "uint8":
        scaled = unit * 255.0 / 2 ** (8 - bits)
    else:
        scaled = unit * levels
    level = ops.clip(ops.floor(scaled + _QUANTIZATION_TOLERANCE), 0, levels - 1)
    level = ops.cast(level, "int32")
    return level[..., 0] * levels * levels + level[..., 1] * levels + level[..., 2]


def _to_patches(images, patch_size):
    """`(B, H, W, C)` -> `(B, N, ph, pw, C)`, patches in row-major order."""
    ph, pw = patch_size
    height, width, channels = images.shape[1], images.shape[2], images.shape[3]
    if height is None or width is None or height % ph or width % pw:
        raise ValueError(
            f"The image sides must be multiples of the patch size {ph}x{pw}. "
            f"Received: images.shape={images.shape}"
        )
    rows, cols = height // ph, width // pw
    x = ops.reshape(images, (-1, rows, ph, cols, pw, channels))
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
    return ops.reshape(x, (-1, rows * cols, ph, pw, channels))


def patch_targets(images, patch_size, target="mean_color", bits=3,
                  quantization="uint8", value_range=(-1.0, 1.0), downsample_grid=4):
    """The prediction targets of every patch of `images`.

    Args:
        images: `(B, H, W, 3)` tensor or array in `value_range`.
        patch_size: `(ph, pw)` in pixels, or an int for square patches.
        target: `"mean_color"`: the patch's mean colour, quantised
            (`(B, N)` int32, `2**(3 * bits)` classes);
            `"downsampled"`: the patch average-pooled to
            `downsample_grid x downsample_grid` cells, each quantised
            (`(B, N, grid**2)` int32, cells row-major); `"pixels"`: the raw
            patch (`(B, N, ph * pw * 3)` float32, row-major, channels last).
        bits, quantization, value_range: see `quantize_colors`.
        downsample_grid: cells per side for `"downsampled"` (4 in the paper);
            must divide the patch size.

    Returns:
        The targets, as described for `target`.
    """
    if target not in TARGETS:
        raise ValueError(f"`target` must be one of {TARGETS}. Received: target={target!r}")
    ph, pw = normalize_pair(patch_size, "patch_size")
    images = ops.cast(images, "float32")
    if len(images.shape) != 4 or images.shape[-1] != 3:
        raise ValueError(f"`images` must be (B, H, W, 3). Received: images of shape {tuple(images.shape)}")
    patches = _to_patches(images, (ph, pw))
    num = patches.shape[1]
    if target == "pixels":
        return ops.reshape(patches, (-1, num, ph * pw * 3))
    if target == "mean_color":
        return quantize_colors(ops.mean(patches, axis=(2, 3)), bits, quantization, value_range)
    g = downsample_grid
    if not isinstance(g, int) or g <= 0 or ph % g or pw % g:
        raise ValueError(
            f"`downsample_grid` must be a positive int dividing the patch size "
            f"{ph}x{pw}. Received: downsample_grid={downsample_grid!r}"
        )
    cells = ops.reshape(patches, (-1, num, g, ph // g, g, pw // g, 3))
    cells = ops.reshape(ops.mean(cells, axis=(3, 5)), (-1, num, g * g, 3))
    return quantize_colors(cells, bits, quantization, value_range)


def _check_probability(value, name, low_open=False):
    ok = is_real(value) and (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0)
    if not ok:
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"`{name}` must be a float in {interval}. Received: {name}={value!r}")
    return float(value)


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchCorruption(keras.layers.Layer):
    """BERT-style corruption of patch embeddings (paper Sec. 4.6).

    Corrupts exactly `round(corruption_rate * N)` of the N patch embeddings
    of each image, chosen uniformly; each corrupted one independently is
    replaced by the learned mask embedding (probability `mask_fraction`), by
    the embedding of a uniformly drawn other patch of the same image
    (`random_fraction`), or left unchanged (the rest). Corrupts at every call
    (the task needs it for evaluation too).

    Args:
        corruption_rate: fraction of patches to corrupt. Defaults to 0.5.
        mask_fraction: share of corrupted patches given the mask embedding.
            Defaults to 0.8.
        random_fraction: share given another patch's embedding. Defaults to
            0.1.
        mask_initializer: initializer of the `(D,)` mask embedding. Defaults
            to `RandomNormal(stddev=0.02)` (BERT's embedding init).
        seed: optional int.

    Call arguments:
        tokens: `(B, N, D)` patch embeddings.

    Returns:
        A tuple: the corrupted `(B, N, D)` embeddings and int32 `(B, N)` kinds,
        `0` untouched, `1` masked, `2` replaced, `3` corrupted but kept
        (predicted all the same).
    """

    def __init__(self, corruption_rate=0.5, mask_fraction=0.8, random_fraction=0.1,
                 mask_initializer=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.corruption_rate = _check_probability(corruption_rate, "corruption_rate", True)
        self.mask_fraction = _check_probability(mask_fraction, "mask_fraction")
        self.random_fraction = _check_probability(random_fraction, "random_fraction")
        if self.mask_fraction + self.random_fraction > 1.0 + 1e-9:
            raise ValueError(
                "`mask_fraction + random_fraction` must be at most 1. Received: "
                f"mask_fraction={mask_fraction!r}, random_fraction={random_fraction!r}"
            )
        if mask_initializer is None:
            mask_initializer = keras.initializers.RandomNormal(stddev=0.02)
        self.mask_initializer = keras.initializers.get(mask_initializer)
        self.seed = seed
        self.seed_generator = named_seed_generator(self, seed)

    def num_corrupted(self, num_patches):
        """Patches corrupted per image out of `num_patches`."""
        count = int(round(self.corruption_rate * num_patches))
        if count < 1:
            raise ValueError(
                f"corruption_rate={self.corruption_rate} corrupts no patch out of "
                f"{num_patches}. Received: corruption_rate={self.corruption_rate}"
            )
        return count

    def build(self, input_shape):
        if input_shape[1] is None:
            raise ValueError(
                f"PatchCorruption needs a known number of patches. Received: input_shape={input_shape}"
            )
        self.num_corrupted(input_shape[1])
        if self.random_fraction > 0 and input_shape[1] < 2:
            raise ValueError(
                "Replacing a patch by another one needs at least 2 patches. "
                f"Received: input_shape={input_shape}"
            )
        self.mask_embedding = self.add_weight(
            name="mask_embedding", shape=(input_shape[-1],), initializer=self.mask_initializer
        )

    def call(self, tokens):
        num = tokens.shape[1]
        batch = ops.shape(tokens)[0]
        count = self.num_corrupted(num)
        def draw(sample, *args, **kwargs):  # each replica its rows of one draw (`draw_for_global_batch`)
            return draw_for_global_batch(sample, (batch, num), *args, seed=self.seed_generator, **kwargs)

        # Exactly `count` corrupted patches per image: the ranks of uniform
        # scores below `count`.
        scores = draw(keras.random.uniform)
        ranks = ops.argsort(ops.argsort(scores, axis=-1), axis=-1)
        corrupted = ranks < count
        u = draw(keras.random.uniform)
        kind = ops.where(
            u < self.mask_fraction,
            MASKED,
            ops.where(u < self.mask_fraction + self.random_fraction, REPLACED, KEPT),
        )
        kind = ops.cast(ops.where(corrupted, kind, CLEAN), "int32")
        out = tokens
        if self.random_fraction > 0:
            # Another position of the same image: i + offset (mod N), offset
            # uniform in [1, N).
            offset = draw(keras.random.randint, 1, num, dtype="int32")
            source = (ops.arange(num, dtype="int32")[None] + offset) % num
            picks = ops.one_hot(source, num, dtype=tokens.dtype)
            others = ops.einsum("bij,bjd->bid", picks, tokens)
            out = ops.where((kind == REPLACED)[..., None], others, out)
        mask = ops.cast(self.mask_embedding, tokens.dtype)
        out = ops.where((kind == MASKED)[..., None], mask[None, None], out)
        return out, kind

    def compute_output_spec(self, tokens):
        return (
            keras.KerasTensor(tokens.shape, dtype=self.compute_dtype),
            keras.KerasTensor(tokens.shape[:2], dtype="int32"),
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "corruption_rate": self.corruption_rate,
                "mask_fraction": self.mask_fraction,
                "random_fraction": self.random_fraction,
                "mask_initializer": keras.initializers.serialize(self.mask_initializer),
                "seed": self.seed,
            }
        )
        return config


def corrupted_encoder(backbone, corruption):
    """The backbone's graph with `corruption` called after its `embedding`.

    Returns a functional model sharing every layer (so every weight) with
    `backbone`, whose outputs are the backbone's output, the corruption
    kinds and the images as the patch embedding sees them, in [-1, 1] (the
    targets' pixels: after whatever the backbone does to its input first,
    a crop, a resize or its `preprocess_input`). The hook after the patch
    embedding is the only change: the class token, position embedding,
    dropout, blocks and norm run as the builder wired them.
    """
    kinds, seen = [], []

    def call(layer, *args, **kwargs):
        if layer.name == "preprocess_input" and not seen:
            seen.append(ops.cast(args[0], "float32") / 127.5 - 1.0)  # its input: pixels in [0, 255]
        elif layer.name == "embedding" and not seen:
            seen.append(args[0])
        out = layer(*args, **kwargs)
        if layer.name == "embedding":
            out, kind = corruption(out)
            kinds.append(kind)
        return out

    clone = keras.models.clone_model(
        backbone, clone_function=lambda layer: layer, call_function=call
    )
    return keras.Model(clone.inputs[0], [clone.outputs[0], kinds[0], seen[0]], name=f"{backbone.name}_corrupted")


@keras.saving.register_keras_serializable(package="keras_vit")
class MaskedPatchPrediction(SurvivesFailedSteps, keras.Model):
    """Masked patch prediction around a keras_vit encoder (paper Sec. 4.6).

    Train it with `compile(optimizer)` (no loss: the model computes its own)
    and `fit(images)`, no labels: images in [-1, 1], or the 0-255 pixels of a
    backbone built with `include_preprocessing=True` (the targets are the
    colours its patch embedding reads). Its outputs (also from
    `predict`) are a dict: `"predictions"` (logits `(B, N, classes)`, or
    `(B, N, grid**2, classes)` for `"downsampled"`, or `(B, N, ph*pw*3)`
    pixels), `"targets"` and `"corruption"` (the kinds of `PatchCorruption`;
    the loss covers the kinds other than 0).

    ```python
    backbone = keras_vit.ViT("ViT-B_16", include_top=False)
    mpp = keras_vit.pretraining.MaskedPatchPrediction(backbone)
    mpp.compile(optimizer=keras_vit.training.pretraining_optimizer(
        mpp, 2e-4, total_steps, decay_type="cosine"))
    mpp.fit(images_dataset, steps_per_epoch=..., epochs=...)
    mpp.export_encoder("mpp_b16.npz")
    model = keras_vit.ViT("ViT-B_16", weights="mpp_b16.npz", num_classes=10)
    ```

    Args:
        backbone: a plain keras_vit model built with `include_top=False,
            pooling=None` (its output is the token sequence). Its layers are
            used as they are: training the MPP model trains the backbone.
        target: `"mean_color"` (the paper's choice), `"downsampled"` or
            `"pixels"` (L2); see `patch_targets`.
        bits: bits per colour channel. Defaults to 3 (512 classes).
        quantization: `"uint8"` (default) or `"uniform"`; see
            `quantize_colors`.
        downsample_grid: cells per side for `"downsampled"`. Defaults to 4.
        corruption_rate, mask_fraction, random_fraction: see
            `PatchCorruption` (defaults 0.5, 0.8, 0.1).
        head_hidden_size: None (default) for a linear head; an int adds
            BERT's transform (Dense -> GELU -> LayerNorm) of that width.
        seed: optional int for the corruption.
    """

    def __init__(self, backbone, target="mean_color", bits=3, quantization="uint8",
                 downsample_grid=4, corruption_rate=0.5, mask_fraction=0.8,
                 random_fraction=0.1, head_hidden_size=None,
                 seed=None, **kwargs):
        if isinstance(backbone, dict):
            backbone = keras.saving.deserialize_keras_object(backbone)
        kwargs.setdefault("name", "masked_patch_prediction")
        # The targets are computed from the images as given: under a
        # mixed policy, Keras would round them to bfloat16 first (pixel 32
        # becomes 31.9, another colour bin); the backbone casts its own input.
        kwargs["autocast"] = False
        super().__init__(**kwargs)
        if not isinstance(backbone, keras.Model):
            raise ValueError(f"`backbone` must be a keras_vit model. Received: backbone={backbone!r}")
        if target not in TARGETS:
            raise ValueError(f"`target` must be one of {TARGETS}. Received: target={target!r}")
        if quantization not in QUANTIZATIONS:
            raise ValueError(
                f"`quantization` must be one of {QUANTIZATIONS}. Received: quantization={quantization!r}"
            )
        self.bits = _check_bits(bits)
        if head_hidden_size is not None:
            head_hidden_size = positive_int(head_hidden_size, "head_hidden_size")
        self.backbone = backbone
        self.target = target
        self.quantization = quantization
        self.downsample_grid = downsample_grid
        self.head_hidden_size = head_hidden_size
        self.seed = seed

        parts = anatomy(backbone)
        if not parts.outputs_tokens:
            raise ValueError(
                "The backbone must output the token sequence after `encoder_norm`: "
                "build it with `include_top=False, pooling=None`. "
                f"Received: backbone={backbone.name!r} with outputs {backbone.outputs}"
            )
        if parts.hybrid or parts.channels != 3:
            raise ValueError(
                "Masked patch prediction needs a plain ViT whose patch embedding "
                "reads the RGB image. In a hybrid, the ResNet's receptive fields "
                "let neighbouring tokens see a corrupted patch's pixels. "
                f"Received: backbone={backbone.name!r} (hybrid={parts.hybrid}, "
                f"{parts.channels} input channels)"
            )
        if parts.dynamic:
            raise ValueError(
                "Masked patch prediction needs a backbone of fixed image size (it corrupts a fixed "
                f"number of patches): build it with `input_shape=(height, width, 3)`. Received: "
                f"backbone={backbone.name!r}, a dynamic-size model"
            )
        self.patch_size = parts.patch_size
        self.image_shape = (*parts.image_size, parts.channels)
        self.num_patches = parts.num_patches
        self._num_prefix_tokens = parts.num_prefix_tokens
        self._hidden_size = parts.hidden_size
        if target == "downsampled":
            g = downsample_grid
            if not isinstance(g, int) or g <= 0 or self.patch_size[0] % g or self.patch_size[1] % g:
                raise ValueError(
                    f"`downsample_grid` must be a positive int dividing the patch size "
                    f"{self.patch_size}. Received: downsample_grid={downsample_grid!r}"
                )
        self.corruption = PatchCorruption(
            corruption_rate, mask_fraction, random_fraction, seed=seed, name="corruption"
        )
        self.encoder = corrupted_encoder(backbone, self.corruption)
        self.num_classes = 2 ** (3 * self.bits)
        if target == "mean_color":
            outputs = self.num_classes
        elif target == "downsampled":
            outputs = downsample_grid ** 2 * self.num_classes
        else:
            outputs = self.patch_size[0] * self.patch_size[1] * 3
        self.transform = self.transform_norm = None
        # The head computes in float32 under mixed precision, as the
        # classifier's does (`keras_vit.ViT`), and in float64 on a float64 backbone.
        dtype = head_dtype(backbone.output.dtype)
        if head_hidden_size is not None:
            self.transform = keras.layers.Dense(
                head_hidden_size, kernel_initializer="glorot_uniform", dtype=dtype, name="mpp_transform"
            )
            self.transform_norm = keras.layers.LayerNormalization(
                epsilon=LAYER_NORM_EPSILON, dtype=dtype, name="mpp_transform_norm"
            )
        # Zero-initialised like the classification head of the original.
        self.head = keras.layers.Dense(outputs, kernel_initializer="zeros", dtype=dtype, name="mpp_head")
        # Accuracy for the classification targets (`"pixels"` has none).
        self.accuracy_tracker = None if target == "pixels" else keras.metrics.Mean(name="accuracy")
        self.build((None, *self.image_shape))

    def build(self, input_shape):
        tokens = (None, self.num_patches, self._hidden_size)
        width = self._hidden_size
        if self.transform is not None:
            self.transform.build(tokens)
            width = self.head_hidden_size
            self.transform_norm.build((None, self.num_patches, width))
        self.head.build((None, self.num_patches, width))
        self.built = True

    def call(self, images, training=None):
        check_image_dtype(images)  # before the encoder casts them: 16-bit pixels trained silently
        x, kind, seen = self.encoder(images, training=training)
        # Predictions come from the patch tokens only, never the class token.
        x = x[:, self._num_prefix_tokens:]
        if self.transform is not None:
            x = self.transform_norm(ops.gelu(self.transform(x), approximate=True))
        predictions = self.head(x)
        if self.target == "downsampled":
            grid = self.downsample_grid**2
            predictions = ops.reshape(predictions, (-1, self.num_patches, grid, self.num_classes))
        targets = patch_targets(
            seen, self.patch_size, self.target, self.bits, self.quantization,
            downsample_grid=self.downsample_grid,
        )
        return {"predictions": predictions, "targets": targets, "corruption": kind}

    def mpp_loss(self, outputs):
        """Loss and accuracy of a dict of outputs, averaged over corrupted patches.

        Returns:
            `(loss, per_patch_correct, weights)`: the scalar float32 loss, and
            for classification targets the `(B, N)` fraction of correct
            predictions per patch (None for `"pixels"`) with the `(B, N)`
            float32 weights (1 for corrupted patches).
        """
        predictions = ops.cast(outputs["predictions"], "float32")
        weights = ops.cast(outputs["corruption"] > 0, "float32")
        count = ops.maximum(ops.sum(weights), 1.0)
        targets = outputs["targets"]
        if self.target == "pixels":
            per_patch = ops.mean(ops.square(predictions - ops.cast(targets, "float32")), axis=-1)
            return ops.sum(per_patch * weights) / count, None, weights
        per_item = keras.losses.sparse_categorical_crossentropy(
            targets, predictions, from_logits=True
        )
        correct = ops.cast(ops.argmax(predictions, axis=-1) == ops.cast(targets, "int32"), "float32")
        if self.target == "downsampled":
            per_item = ops.mean(per_item, axis=-1)
            correct = ops.mean(correct, axis=-1)
        return ops.sum(per_item * weights) / count, correct, weights

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        del x, y, sample_weight, training  # The targets come from the images.
        loss, correct, weights = self.mpp_loss(y_pred)
        if self.accuracy_tracker is not None:
            self.accuracy_tracker.update_state(correct, sample_weight=weights)
        if self.losses:
            loss = loss + ops.sum(ops.stack([ops.cast(v, "float32") for v in self.losses]))
        # Under tf.distribute each replica's loss is its share of the sum, as
        # Keras scales a compiled loss (its trainer sums the gradients and
        # un-scales the loss it reports): unscaled, both came out times the
        # number of replicas.
        context = tf_replica_context()
        if context is not None:
            loss = loss / context.num_replicas_in_sync
        return loss

    def export_encoder(self, path):
        """Writes the pre-trained backbone as an original-format `.npz`.

        Load it with `keras_vit.ViT(variant, weights=path, ...)` (a new head is
        initialised for fine-tuning) or `keras_vit.load_weights`. The mask
        embedding and the MPP head are not part of it.
        """
        from keras_vit.weights import export_npz

        return export_npz(self.backbone, path)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "target": self.target,
            "bits": self.bits,
            "quantization": self.quantization,
            "downsample_grid": self.downsample_grid,
            "corruption_rate": self.corruption.corruption_rate,
            "mask_fraction": self.corruption.mask_fraction,
            "random_fraction": self.corruption.random_fraction,
            "head_hidden_size": self.head_hidden_size,
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)
