"""Learned 1-D position embeddings and their resampling to a new patch grid."""

import math

import keras
import numpy as np
from keras import ops

# "linear": the original's; "bicubic": PyTorch's bicubic; "bicubic_antialias":
# PyTorch's with `antialias=True`, what timm resamples checkpoints with.
INTERPOLATIONS = ("linear", "bicubic", "bicubic_antialias")


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbedding(keras.layers.Layer):
    """Adds a learned `(1, T, D)` position embedding to a `(B, T, D)` sequence.

    As in the original ViT, the embedding is added *after* the class token is
    prepended, so a token model's embedding has a row for the class token
    (google-research/vision_transformer, `models_vit.py`, `AddPositionEmbs`).
    Initialised from normal(stddev=0.02) ("from BERT" in the original).

    To use checkpoints trained at another resolution, the loaders resample
    the embedding with `resample_position_embedding` below.

    Args:
        initializer: Initializer for the embedding. Defaults to
            `RandomNormal(stddev=0.02)`.

    Returns:
        `(B, T, D)` tensor.
    """

    def __init__(self, initializer=None, **kwargs):
        super().__init__(**kwargs)
        if initializer is None:
            initializer = keras.initializers.RandomNormal(stddev=0.02)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        if input_shape[1] is None:
            raise ValueError(
                "AddPositionEmbedding needs a known number of tokens, so the "
                f"model needs a fixed input size. Received: input_shape={input_shape}"
            )
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, input_shape[1], input_shape[2]),
            initializer=self.initializer,
        )

    def call(self, tokens):
        return tokens + ops.cast(self.pos_embedding, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
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


def _linear_weights(in_size, out_size):
    """Interpolation matrix (out, in) of scipy.ndimage.zoom(order=1).

    With scipy's default `grid_mode=False` the corner pixel centres of the
    input and output grids coincide: output index o samples the input at
    o * (in - 1) / (out - 1) (bilinear with align_corners=True).
    """
    if in_size == 1 or out_size == 1:
        matrix = np.zeros((out_size, in_size), np.float64)
        matrix[:, 0] = 1.0
        return matrix
    return linear_matrix(np.arange(out_size) * (in_size - 1) / (out_size - 1), in_size)


def linear_matrix(coords, in_size):
    """Interpolation matrix (len(coords), in) of linear interpolation at the
    input positions `coords` (each in [0, in - 1])."""
    matrix = np.zeros((len(coords), in_size), np.float64)
    lower = np.clip(np.floor(coords).astype(int), 0, in_size - 1)
    upper = np.minimum(lower + 1, in_size - 1)
    frac = coords - lower
    rows = np.arange(len(coords))
    np.add.at(matrix, (rows, lower), 1.0 - frac)
    np.add.at(matrix, (rows, upper), frac)
    return matrix


def _cubic_weights(in_size, out_size, a=-0.75):
    """Interpolation matrix (out, in) of bicubic resizing with half-pixel
    centres and Keys' kernel (a = -0.75), borders replicated; this is
    `torch.nn.functional.interpolate(mode="bicubic", align_corners=False)`,
    the resampling timm applies to position embeddings (without antialias).
    """

    def kernel(x):
        x = np.abs(x)
        return np.where(
            x <= 1,
            ((a + 2) * x - (a + 3)) * x * x + 1,
            np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0),
        )

    matrix = np.zeros((out_size, in_size), np.float64)
    coords = (np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5
    base = np.floor(coords).astype(int)
    rows = np.arange(out_size)
    for tap in range(-1, 3):
        index = base + tap
        weight = kernel(coords - index)
        np.add.at(matrix, (rows, np.clip(index, 0, in_size - 1)), weight)
    return matrix


def _cubic_antialias_weights(in_size, out_size, a=-0.5):
    """Interpolation matrix (out, in) of PyTorch's `interpolate(mode="bicubic",
    antialias=True, align_corners=False)`, PIL's resampling: Keys' kernel
    with a = -0.5, widened by the scale when shrinking, each row normalised.
    timm resamples position embeddings with it (`resample_abs_pos_embed`)."""
    scale = in_size / out_size
    widen = max(scale, 1.0)
    support = 2.0 * widen
    matrix = np.zeros((out_size, in_size), np.float64)
    for row in range(out_size):
        center = (row + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        x = np.abs((np.arange(lo, hi) - center + 0.5) / widen)
        weight = np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                          np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))
        matrix[row, lo:hi] = weight / weight.sum()
    return matrix


def resample_grid(grid, new_shape, interpolation="linear"):
    """Resamples a `(rows, cols, D)` array to `(*new_shape, D)`.

    `"linear"` reproduces `scipy.ndimage.zoom(grid, (r, c, 1), order=1)`, the
    original's `interpolate_posembed`; `"bicubic"` PyTorch's bicubic, and
    `"bicubic_antialias"` its antialiased form, with which timm resamples.
    Computed in float64 and returned in the input's dtype.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(
            f"`interpolation` must be one of {INTERPOLATIONS}. "
            f"Received: interpolation={interpolation!r}"
        )
    weights = {"linear": _linear_weights, "bicubic": _cubic_weights,
               "bicubic_antialias": _cubic_antialias_weights}[interpolation]
    rows = weights(grid.shape[0], new_shape[0])
    cols = weights(grid.shape[1], new_shape[1])
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
        interpolation: `"linear"` (the original) or `"bicubic"`.

    Returns:
        numpy array `(1, prefix + target_rows * target_cols, D)`.
    """
    posemb = np.asarray(posemb)
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    if source_grid is None:
        source_grid = infer_square_grid(grid.shape[0])
    source_grid = tuple(int(s) for s in source_grid)
    if source_grid[0] * source_grid[1] != grid.shape[0]:
        raise ValueError(
            f"`source_grid`={source_grid} does not hold the {grid.shape[0]} "
            "grid tokens of the position embedding. "
            f"Received: source_grid={source_grid}"
        )
    grid = grid.reshape(*source_grid, -1)
    grid = resample_grid(grid, tuple(target_grid), interpolation)
    grid = grid.reshape(1, -1, grid.shape[-1])
    return np.concatenate([prefix, grid], axis=1)
