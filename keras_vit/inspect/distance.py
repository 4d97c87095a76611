"""Mean attention distance per head and depth (paper Fig. 7 right, App. D.7).

For one head, the attention distance of a query patch is the distance in
pixels between its centre and the centres of all other patches, weighted by
its attention weights; the paper averages it over queries and 128 images and
plots one point per head against depth. It plays the role of the receptive
field size in CNNs: some heads attend globally already in the lowest layers,
others stay local.

The class token has no position on the image, so it is left out on both
sides: it is not used as a query, and the weight a patch puts on it is
removed. By default the remaining weights of each query are re-normalised to
sum to 1, i.e. the distance is the expected distance *given* that the query
attends to a patch (`renormalize=False` keeps the raw weights, which counts
attention to the class token as distance 0).
"""

import numpy as np

from keras_vit.inspect import plotting
from keras_vit.inspect.attention import attention_batches, check_images
from keras_vit.anatomy import anatomy
from keras_vit.layers.utils import normalize_pair


def patch_distances(grid, patch_size):
    """Pixel distances between patch centres, `(rows * cols, rows * cols)`.

    Patch `(r, c)` has its centre at `((r + 0.5) * ph, (c + 0.5) * pw)`;
    tokens are in row-major order.
    """
    rows, cols = normalize_pair(grid, "grid")
    ph, pw = normalize_pair(patch_size, "patch_size")
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    centres = np.stack([(r.ravel() + 0.5) * ph, (c.ravel() + 0.5) * pw], axis=-1)
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def _check_attentions(attentions, grid, num_prefix_tokens):
    attentions = np.asarray(attentions, dtype=np.float64)
    rows, cols = normalize_pair(grid, "grid")
    tokens = num_prefix_tokens + rows * cols
    if attentions.ndim != 5 or attentions.shape[-2:] != (tokens, tokens):
        raise ValueError(
            "`attentions` must have shape (layers, batch, heads, T, T) with "
            f"T = {num_prefix_tokens} prefix token(s) + {rows}x{cols} patches = "
            f"{tokens}. Received: attentions.shape={attentions.shape}"
        )
    return attentions


def _distance_sums(attentions, distances, num_prefix_tokens, renormalize):
    """Per (layer, head): the sum of per-query distances and the query count."""
    weights = attentions[..., num_prefix_tokens:, num_prefix_tokens:]
    mass = weights.sum(axis=-1)
    per_query = np.einsum("lbhqk,qk->lbhq", weights, distances)
    valid = ~(mass <= 0)  # NaN counts, and propagates: non-finite attention is not silently 0
    if renormalize:
        per_query = np.divide(per_query, mass, out=np.zeros_like(per_query), where=valid)
    return np.where(valid, per_query, 0.0).sum(axis=(1, 3)), valid.sum(axis=(1, 3))


def mean_attention_distance(attentions, grid, patch_size, num_prefix_tokens=0,
                            renormalize=True):
    """Mean attention distance in pixels, per block and head.

    Args:
        attentions: array `(layers, batch, heads, T, T)` of attention
            probabilities (query axis before key axis), e.g. from
            `keras_vit.inspect.attention_weights`.
        grid: `(rows, cols)` of the patch grid.
        patch_size: `(height, width)` of a patch in input pixels (for hybrids
            the stem stride times the patch size).
        num_prefix_tokens: tokens before the grid (1 for a class token); left
            out as queries and as keys.
        renormalize: re-normalise each query's weights over the patches after
            dropping the class token (default); False keeps them as they are.

    Returns:
        float64 array `(layers, heads)`: the attention distance averaged over
        query patches and images. Queries that put no weight at all on
        patches are skipped.
    """
    attentions = _check_attentions(attentions, grid, num_prefix_tokens)
    totals, counts = _distance_sums(
        attentions, patch_distances(grid, patch_size), num_prefix_tokens, renormalize
    )
    return totals / np.maximum(counts, 1)


def model_attention_distance(model, images, renormalize=True, batch_size=32):
    """`mean_attention_distance` of a keras_vit model on `images`.

    Runs batch by batch, so the attention of all images is never held at
    once (for ViT-L/16 at 224 px it is ~60 MB per image).

    Args:
        model: a keras_vit model (plain or hybrid).
        images: `(B, H, W, 3)` array in [-1, 1] (the paper uses 128 images).
        renormalize: see `mean_attention_distance`.
        batch_size: images per forward pass.

    Returns:
        float64 array `(layers, heads)` in input pixels.
    """
    geo = anatomy(model)
    images = check_images(model, images)
    distances = patch_distances(geo.grid_of(*images.shape[1:3]), geo.patch_size)
    totals = counts = 0
    for attentions in attention_batches(model, images, batch_size):
        batch_totals, batch_counts = _distance_sums(
            attentions, distances, geo.num_prefix_tokens, renormalize
        )
        totals, counts = totals + batch_totals, counts + batch_counts
    return totals / np.maximum(counts, 1)


def plot_attention_distance(distances, path=None, image_size=None,
                            title="Mean attention distance"):
    """Scatter of mean attention distance per head against depth (Fig. 7 right).

    Args:
        distances: `(layers, heads)` from `mean_attention_distance`.
        path: optional output file (`.png`, `.svg`, ...).
        image_size: optional `(height, width)`; if given, the y axis runs up
            to the largest possible distance (the image diagonal).
        title: figure title.

    Returns:
        The `matplotlib.figure.Figure`.
    """
    distances = np.asarray(distances, dtype=np.float64)
    if distances.ndim != 2:
        raise ValueError(
            "`distances` must have shape (layers, heads). "
            f"Received: distances.shape={distances.shape}"
        )
    layers, heads = distances.shape
    figure = plotting.new_figure(figsize=(5.0, 4.0))
    ax = figure.subplots()
    depth = np.arange(1, layers + 1)
    for head in range(heads):
        ax.scatter(depth, distances[:, head], s=14, label=f"Head {head + 1}")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(depth if layers <= 16 else depth[:: max(1, layers // 8)])
    finite = distances[np.isfinite(distances)]
    top = 1.1 * float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    if image_size is not None:
        top = float(np.hypot(*image_size))
    ax.set_ylim(0, top)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right")
    ax.set_title(title, fontsize=10)
    figure.tight_layout()
    plotting.save(figure, path)
    return figure
