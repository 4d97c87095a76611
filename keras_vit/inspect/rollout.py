"""Attention rollout: what the output token looks at (paper Fig. 6, App. D.8).

Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in
Transformers", 2020): in every block the attention of all heads is averaged,
the residual connection is accounted for by adding the identity, each row is
re-normalised to sum to 1, and the resulting matrices are multiplied from the
first block to the last. Row `i` of the product says how much each input
token contributes to output token `i`. The paper (App. D.8) applies it to
ViT-L/16 and reads the class token's row.
"""

import numpy as np

from keras_vit.inspect import plotting
from keras_vit.inspect.attention import attention_batches, check_images
from keras_vit.anatomy import anatomy

SOURCES = ("token", "mean")
HEAD_FUSIONS = ("mean", "max", "min")


def _as_attention_stack(attentions):
    attentions = np.asarray(attentions, dtype=np.float64)
    if attentions.ndim == 4:
        attentions = attentions[:, None]
    if attentions.ndim != 5 or attentions.shape[-1] != attentions.shape[-2]:
        raise ValueError(
            "`attentions` must have shape (layers, batch, heads, tokens, tokens) "
            f"or (layers, heads, tokens, tokens). Received: attentions.shape={attentions.shape}"
        )
    return attentions


def attention_rollout(attentions, head_fusion="mean", add_residual=True):
    """Rolls attention out through the layers.

    Args:
        attentions: array `(layers, batch, heads, T, T)` (or without the batch
            axis) of attention probabilities, first block first, as returned
            by `keras_vit.inspect.attention_weights`.
        head_fusion: how the heads are combined: `"mean"` (Abnar & Zuidema
            and the paper), `"max"` or `"min"`.
        add_residual: add the identity for the residual connection before
            re-normalising (True in the method; False multiplies the raw
            attention).

    Returns:
        float64 array `(batch, T, T)` (or `(T, T)` without a batch axis):
        `R = A_L ... A_2 A_1` with `A_l = normalise(fuse(heads_l) + I)`;
        `R[b, i, j]` is the share of input token `j` in output token `i`
        (rows sum to 1).
    """
    squeeze = np.ndim(attentions) == 4
    attentions = _as_attention_stack(attentions)
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(
            f"`head_fusion` must be one of {HEAD_FUSIONS}. Received: head_fusion={head_fusion!r}"
        )
    fuse = {"mean": np.mean, "max": np.max, "min": np.min}[head_fusion]
    tokens = attentions.shape[-1]
    rollout = np.broadcast_to(np.eye(tokens), attentions.shape[1:2] + (tokens, tokens))
    for layer in attentions:
        a = fuse(layer, axis=1)
        if add_residual:
            a = a + np.eye(tokens)
        a = a / a.sum(axis=-1, keepdims=True)
        # Later blocks act on the output of earlier ones: left-multiply.
        rollout = a @ rollout
    return rollout[0] if squeeze else rollout


def rollout_to_grid(rollout, grid, num_prefix_tokens=1, source=None, normalize=True, class_token=None):
    """The rolled-out attention from the output token to the patch grid.

    Args:
        rollout: `(batch, T, T)` from `attention_rollout`.
        grid: `(rows, cols)` of the patch grid.
        num_prefix_tokens: tokens before the grid (class and register tokens).
        source: `"token"` (the class token's row, token 0; the default when
            there is a class token) or `"mean"` (the mean of the patches'
            rows, the default for average-pooled models, whose output is
            the mean of the patch tokens).
        normalize: divide each map by its maximum, as the paper's figure.
        class_token: whether token 0 is a class token; None (default): when
            there is a prefix token (registers without a class token need
            False).

    Returns:
        float64 array `(batch, rows, cols)`.
    """
    rollout = np.asarray(rollout, dtype=np.float64)
    if rollout.ndim == 2:
        rollout = rollout[None]
    rows, cols = (int(g) for g in grid)
    if rollout.ndim != 3 or rollout.shape[-1] != num_prefix_tokens + rows * cols:
        raise ValueError(
            f"`rollout` must have shape (batch, T, T) with T = {num_prefix_tokens} "
            f"prefix token(s) + {rows}x{cols} patches. Received: rollout.shape={rollout.shape}"
        )
    if class_token is None:
        class_token = num_prefix_tokens > 0
    if source is None:
        source = "token" if class_token else "mean"
    if source not in SOURCES:
        raise ValueError(f"`source` must be one of {SOURCES}. Received: source={source!r}")
    if source == "token" and not class_token:
        raise ValueError(
            "`source='token'` needs a class token but the model has none (a "
            "global-average-pooled model); use source='mean'. Received: source='token'"
        )
    row = rollout[:, 0] if source == "token" else rollout[:, num_prefix_tokens:].mean(axis=1)
    maps = row[:, num_prefix_tokens:].reshape(-1, rows, cols)
    if normalize:
        peak = maps.max(axis=(1, 2), keepdims=True)
        maps = maps / np.where(peak > 0, peak, 1.0)
    return maps


def _interpolation_matrix(in_size, out_size):
    """(out, in) bilinear weights with half-pixel centres, edges clamped
    (as image resizers such as `cv2.resize` or `jax.image.resize` use)."""
    coords = np.clip((np.arange(out_size) + 0.5) * in_size / out_size - 0.5, 0, in_size - 1)
    lower = np.floor(coords).astype(int)
    upper = np.minimum(lower + 1, in_size - 1)
    frac = coords - lower
    matrix = np.zeros((out_size, in_size))
    rows = np.arange(out_size)
    np.add.at(matrix, (rows, lower), 1 - frac)
    np.add.at(matrix, (rows, upper), frac)
    return matrix


def upsample_maps(maps, size):
    """Bilinear resize of `(batch, rows, cols)` maps to `(batch, *size)`."""
    maps = np.asarray(maps, dtype=np.float64)
    if maps.ndim != 3:
        raise ValueError(f"`maps` must have shape (batch, rows, cols). Received: maps.shape={maps.shape}")
    rows = _interpolation_matrix(maps.shape[1], int(size[0]))
    cols = _interpolation_matrix(maps.shape[2], int(size[1]))
    return np.einsum("hr,brc,wc->bhw", rows, maps, cols)


def rollout_maps(model, images, source=None, head_fusion="mean", batch_size=32):
    """Attention-rollout maps of `model` on `images` (paper Figure 6).

    Args:
        model: a keras_vit model (plain or hybrid).
        images: `(B, H, W, 3)` array in [-1, 1].
        source: `"token"` or `"mean"`; defaults to what the head reads: the
            class token for token models, the mean over tokens for gap
            models (with a class token or without) and MAP pooling. A
            model built without head and pooling (its token sequence) has
            no record of its classifier: the class token when it has one.
        head_fusion: `"mean"` (the method), `"max"` or `"min"`.
        batch_size: images per forward pass.

    Returns:
        A tuple `(grid_maps, image_maps)`: float64 `(B, rows, cols)` on the
        patch grid and `(B, H, W)` upsampled to the image, both scaled to a
        maximum of 1 per image.
    """
    geo = anatomy(model)
    images = check_images(model, images)
    grid = geo.grid_of(*images.shape[1:3])
    if source is None:  # what the model's head reads
        source = "token" if _pools_class_token(model, geo) else "mean"
    grid_maps = []
    for attentions in attention_batches(model, images, batch_size):
        rollout = attention_rollout(attentions, head_fusion=head_fusion)
        grid_maps.append(rollout_to_grid(rollout, grid, geo.num_prefix_tokens, source,
                                         class_token=geo.has_class_token))
    grid_maps = np.concatenate(grid_maps)
    image_maps = np.clip(upsample_maps(grid_maps, images.shape[1:3]), 0.0, 1.0)
    return grid_maps, image_maps


def _pools_class_token(model, geo):
    """Whether the head reads the class token: not for a gap model that
    has one (MAE's, timm's `global_pool="avg"`) nor for MAP pooling."""
    layers = {layer.name: layer for layer in model.layers}
    if "pool" in layers:
        return getattr(layers["pool"], "method", None) == "token"
    return geo.has_class_token and "map_head" not in layers


def plot_rollout(images, maps, path=None, titles=None, cmap="jet", alpha=0.5):
    """Draws each image, the map over it, and the image times the map.

    The third column is what the paper's Figure 6 shows (the input multiplied
    by the normalised rollout map).

    Args:
        images: `(B, H, W, 3)` in [-1, 1].
        maps: `(B, H, W)` in [0, 1], e.g. the `image_maps` of `rollout_maps`.
        path: optional file to write (the suffix picks the format: `.png`,
            `.svg`, `.pdf`).
        titles: optional list of B strings.
        cmap: colour map of the overlay.
        alpha: opacity of the overlay.

    Returns:
        The `matplotlib.figure.Figure`.
    """
    images = plotting.to_display(images)
    maps = np.asarray(maps, dtype=np.float64)
    if maps.shape != images.shape[:3]:
        raise ValueError(
            f"`maps` must have shape {images.shape[:3]} (one map per image, at the "
            f"image's size). Received: maps.shape={maps.shape}"
        )
    count = len(images)
    if titles is not None and len(titles) != count:
        raise ValueError(f"`titles` must name each of the {count} images. Received: {len(titles)} titles")
    figure = plotting.new_figure(figsize=(7.5, 2.6 * count))
    axes = figure.subplots(count, 3, squeeze=False)
    for i in range(count):
        label = f"{titles[i]}: " if titles is not None else ""
        axes[i, 0].imshow(images[i])
        axes[i, 0].set_title(f"{label}input", fontsize=9)
        axes[i, 1].imshow(images[i])
        axes[i, 1].imshow(maps[i], cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0)
        axes[i, 1].set_title("attention rollout", fontsize=9)
        axes[i, 2].imshow(images[i] * maps[i][..., None])
        axes[i, 2].set_title("input x attention", fontsize=9)
        for ax in axes[i]:
            ax.set_axis_off()
    figure.tight_layout()
    plotting.save(figure, path)
    return figure
