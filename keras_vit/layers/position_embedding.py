"""Learned 1-D position embeddings and their resampling to a new patch grid."""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.layers.utils import non_negative_int, normalize_pair, patch_grid

# "linear": the original's; "bicubic": PyTorch's bicubic; "bicubic_antialias":
# PyTorch's with `antialias=True`, what timm resamples checkpoints with.
INTERPOLATIONS = ("linear", "bicubic", "bicubic_antialias")


def check_interpolation(interpolation, name="interpolation"):
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"`{name}` must be one of {INTERPOLATIONS}. Received: {name}={interpolation!r}")


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbedding(keras.layers.Layer):
    """Adds a learned `(1, T, D)` position embedding to a `(B, T, D)` sequence.

    As in the original ViT, the embedding is added *after* the class token is
    prepended, so a token model's embedding has a row for the class token
    (google-research/vision_transformer, `models_vit.py`, `AddPositionEmbs`).
    Initialised from normal(stddev=0.02) ("from BERT" in the original).

    To use checkpoints trained at another resolution, the loaders resample
    the embedding with `resample_position_embedding` below.

    Dynamic-size models (`stride` set) store the embedding for one patch
    `grid` and take the images as a second input: at every call the grid
    rows are resampled to the images' patch grid inside the graph, with the
    numbers of `resample_position_embedding` (the original's
    `interpolate_posembed` for `"linear"`), the prefix rows kept as they
    are; at the stored grid they are used as stored.

    Args:
        initializer: Initializer for the embedding. Defaults to
            `RandomNormal(stddev=0.02)`.
        grid: `(rows, cols)` of the stored embedding (dynamic models only).
        stride: `(height, width)` in image pixels of one token (the patch
            size; for a hybrid the ResNet stem's stride times it). Setting it
            makes the layer dynamic.
        num_prefix_tokens: rows before the grid (1 for a class token).
        interpolation: `"linear"`, `"bicubic"` or `"bicubic_antialias"`.

    Call arguments:
        tokens: `(B, T, D)` tensor.
        images: the model's `(B, H, W, C)` input (dynamic models only).

    Returns:
        `(B, T, D)` tensor.
    """

    def __init__(self, initializer=None, grid=None, stride=None, num_prefix_tokens=0,
                 interpolation="linear", **kwargs):
        super().__init__(**kwargs)
        if initializer is None:
            initializer = keras.initializers.RandomNormal(stddev=0.02)
        self.initializer = keras.initializers.get(initializer)
        if (grid is None) != (stride is None):
            raise ValueError(
                "A dynamic position embedding needs both `grid` and `stride`. "
                f"Received: grid={grid!r}, stride={stride!r}"
            )
        check_interpolation(interpolation)
        self.grid = None if grid is None else normalize_pair(grid, "grid")
        self.stride = None if stride is None else normalize_pair(stride, "stride")
        self.num_prefix_tokens = non_negative_int(num_prefix_tokens, "num_prefix_tokens")
        self.interpolation = interpolation

    def build(self, input_shape):
        if self.grid is not None:
            tokens = self.num_prefix_tokens + self.grid[0] * self.grid[1]
        elif input_shape[1] is None:
            raise ValueError(
                "AddPositionEmbedding needs a known number of tokens, so the "
                f"model needs a fixed input size. Received: input_shape={input_shape}"
            )
        else:
            tokens = input_shape[1]
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, tokens, input_shape[2]),
            initializer=self.initializer,
            # Read in float32 under mixed precision: a dynamic model resamples
            # it at every call, and the result is cast to the compute dtype
            # once, after the resampling (as timm resamples under AMP).
            autocast=False,
        )

    def call(self, tokens, images=None):
        posemb = self.pos_embedding
        if self.stride is not None:
            posemb = self._resampled(posemb, *self._target_grid(images))
        return tokens + ops.cast(posemb, self.compute_dtype)

    def _target_grid(self, images):
        # The sides are multiples of the stride: `ImageSizeCheck` at the
        # model's input refuses others.
        if images is None:
            raise ValueError(
                f"The dynamic position embedding {self.name!r} reads the patch grid from the images: "
                "call it as `layer(tokens, images)`. Received: images=None"
            )
        return patch_grid(images, self.stride)

    def _resampled(self, posemb, rows, cols):
        # On PyTorch every size is resampled, the stored one too (exactly,
        # the matrices are then the identity): torch.compile's symbolic
        # sizes pass for ints, and comparing them with the grid gave the
        # stored size a graph of its own.
        static = isinstance(rows, int) and isinstance(cols, int) and keras.backend.backend() != "torch"
        if static and (rows, cols) == self.grid:
            return posemb
        prefix = posemb[:, : self.num_prefix_tokens]
        grid = ops.reshape(posemb[0, self.num_prefix_tokens:], (*self.grid, -1))
        # Static sizes: the matrices in float64 as the loaders resample, at
        # trace time under jax.jit and tf.function. Symbolic sizes, and every
        # size on PyTorch: float32 tensor ops (equal within float32 rounding),
        # which torch.compile traces into the model's graph; numpy there
        # would split it at each conversion.
        xp = np if static else ops
        row_matrix, col_matrix = (
            ops.cast(interpolation_matrix(size, target, self.interpolation, xp), posemb.dtype)
            for size, target in zip(self.grid, (rows, cols)))
        # Two products, not one three-operand einsum: PyTorch plans that
        # with opt_einsum on the sizes, fixing them in torch.compile's graph.
        grid = ops.einsum("cj,rjd->rcd", col_matrix, ops.einsum("ri,ijd->rjd", row_matrix, grid))
        return ops.concatenate([prefix, ops.reshape(grid, (1, -1, ops.shape(posemb)[-1]))], axis=1)

    def compute_output_shape(self, tokens_shape, images_shape=None):
        return tokens_shape

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        if self.stride is not None:
            config.update(grid=self.grid, stride=self.stride, num_prefix_tokens=self.num_prefix_tokens,
                          interpolation=self.interpolation)
        return config


def infer_square_grid(num_tokens, what="position embedding"):
    """The side of a square grid of `num_tokens`; raises if not a square."""
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise ValueError(
            f"Cannot infer the patch grid of a {what} with {num_tokens} grid "
            "tokens: it is not a square number, so the grid is not square. Pass "
            "the grid explicitly (`source_grid=(rows, cols)`) or load a file "
            "exported by keras_vit, which records it. "
            f"Received: num_tokens={num_tokens}"
        )
    return side, side


def _float(x, xp):
    """`x` as floats: float64 for numpy, float32 in a graph."""
    return np.asarray(x, np.float64) if xp is np else ops.cast(x, "float32")


def _keys(x, a, xp):
    """Keys' cubic convolution kernel at `x` (zero from |x| = 2 on)."""
    x = xp.abs(x)
    return xp.where(
        x <= 1,
        ((a + 2) * x - (a + 3)) * x * x + 1,
        xp.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0 * x),
    )


def linear_matrix(coords, in_size, xp=np):
    """`(len(coords), in_size)` weights of linear interpolation at the input
    positions `coords` (each in [0, in - 1]): the tent kernel."""
    source = _float(xp.arange(in_size), xp)
    return xp.maximum(1 - xp.abs(coords[:, None] - source[None, :]), 0.0 * source[None, :])


def interpolation_matrix(in_size, out_size, interpolation, xp=np):
    """The `(out_size, in_size)` matrix that resamples one axis.

    One definition for both uses: with `xp=np` (float64) the loaders resample
    checkpoints; with `xp=keras.ops` (float32) a dynamic-size model resamples
    inside its graph, where `out_size` may be a symbolic tensor (TensorFlow
    graphs of unknown image size). `in_size` is a Python int. Each matrix is
    written densely over the input positions, which equals the usual
    few-taps form because the kernels vanish outside their support.

    - `"linear"`: `scipy.ndimage.zoom(order=1)` (the original's
      `interpolate_posembed`): with scipy's default `grid_mode=False` the
      corner pixel centres coincide, output o samples the input at
      o * (in - 1) / (out - 1) (bilinear with align_corners=True).
    - `"bicubic"`: `torch.nn.functional.interpolate(mode="bicubic",
      align_corners=False)`: half-pixel centres, Keys' kernel with
      a = -0.75, borders replicated.
    - `"bicubic_antialias"`: the same with `antialias=True` (PIL's
      resampling, timm's `resample_abs_pos_embed`): a = -0.5, the kernel
      widened by the scale when shrinking, each row normalised.
    """
    # Under `torch.compile` with dynamic shapes `out_size` is a symbolic
    # int, and Keras' ops on it (a dtype asked for, a scalar maximum) break
    # the graph, which then recompiled at every size. So `arange` gets its
    # dtype and the size is counted from it, as a tensor (a graph of
    # unknown size computes it also for a side of 0, which `ImageSizeCheck`
    # refuses).
    out = _float(xp.arange(out_size, dtype="int32"), xp)
    size = xp.sum(xp.ones_like(out))
    if interpolation == "linear":
        return linear_matrix(out * ((in_size - 1) / xp.maximum(size - 1, 1.0)), in_size, xp)
    scale = in_size / size
    if interpolation == "bicubic":
        coords = (out + 0.5) * scale - 0.5
        # Taps reach two positions past either border; each one is folded
        # onto the border position it replicates.
        taps = xp.arange(-2, in_size + 2)
        weights = _keys(coords[:, None] - _float(taps, xp)[None, :], -0.75, xp)
        fold = _float(xp.clip(taps, 0, in_size - 1)[:, None] == xp.arange(in_size)[None, :], xp)
        return xp.matmul(weights, fold)
    widen = xp.maximum(scale, 1.0)
    center = (out + 0.5) * scale
    source = _float(xp.arange(in_size), xp)
    weights = _keys((source[None, :] - center[:, None] + 0.5) / widen, -0.5, xp)
    return weights / xp.sum(weights, axis=1, keepdims=True)


def resample_grid(grid, new_shape, interpolation="linear"):
    """Resamples a `(rows, cols, D)` array to `(*new_shape, D)`.

    `"linear"` reproduces `scipy.ndimage.zoom(grid, (r, c, 1), order=1)`, the
    original's `interpolate_posembed`; `"bicubic"` PyTorch's bicubic, and
    `"bicubic_antialias"` its antialiased form, with which timm resamples.
    Computed in float64 and returned in the input's dtype.
    """
    check_interpolation(interpolation)
    grid = np.asarray(grid)
    if grid.ndim != 3 or 0 in grid.shape:
        raise ValueError(f"`grid` must be a non-empty (rows, cols, width) array. Received: grid of shape {grid.shape}")
    new_shape = normalize_pair(new_shape, "new_shape")
    rows = interpolation_matrix(grid.shape[0], new_shape[0], interpolation)
    cols = interpolation_matrix(grid.shape[1], new_shape[1], interpolation)
    out = np.einsum("ri,ijd,cj->rcd", rows, grid.astype(np.float64), cols)
    return out.astype(grid.dtype)


def resample_position_embedding(
    posemb,
    target_grid,
    source_grid=None,
    num_prefix_tokens=1,
    interpolation="linear",
):
    """Resamples a `(1, prefix + rows * cols, D)` position embedding.

    The prefix rows (the class token's) are kept as they are and the grid rows
    are resampled in 2-D, as the original `interpolate_posembed`
    (google-research/vision_transformer, `checkpoint.py`; paper Sec. 3.2).

    Args:
        posemb: numpy array `(1, T, D)`.
        target_grid: `(rows, cols)` of the target patch grid.
        source_grid: `(rows, cols)` of `posemb`'s grid; inferred when the grid
            is square, required otherwise.
        num_prefix_tokens: rows before the grid (1 for a class token).
        interpolation: one of `INTERPOLATIONS`: `"linear"` (the original),
            `"bicubic"` (PyTorch's) or `"bicubic_antialias"` (timm's).

    Returns:
        numpy array `(1, prefix + target_rows * target_cols, D)`.
    """
    posemb = np.asarray(posemb)
    num_prefix_tokens = non_negative_int(num_prefix_tokens, "num_prefix_tokens")
    if posemb.ndim != 3 or posemb.shape[0] != 1 or posemb.shape[1] <= num_prefix_tokens:
        raise ValueError(f"`posemb` must be (1, num_prefix_tokens + grid tokens, width), with "
                         f"num_prefix_tokens={num_prefix_tokens}. Received: posemb of shape {posemb.shape}")
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    if source_grid is None:
        source_grid = infer_square_grid(grid.shape[0])
    source_grid = normalize_pair(source_grid, "source_grid")
    if source_grid[0] * source_grid[1] != grid.shape[0]:
        raise ValueError(
            f"`source_grid`={source_grid} does not hold the {grid.shape[0]} "
            "grid tokens of the position embedding. "
            f"Received: source_grid={source_grid}"
        )
    grid = grid.reshape(*source_grid, -1)
    grid = resample_grid(grid, normalize_pair(target_grid, "target_grid"), interpolation)
    grid = grid.reshape(1, -1, grid.shape[-1])
    return np.concatenate([prefix, grid], axis=1)
