"""Principal components of the patch-embedding filters (paper Fig. 7 left).

The patch embedding is a linear map from a flattened `P x P x 3` RGB patch to
D dimensions, i.e. D filters of `P x P x 3` pixels. The paper shows the top
principal components of these filters; they resemble plausible basis
functions for a low-dimensional representation of each patch.
"""

import keras
import numpy as np

from keras_vit.inspect import plotting
from keras_vit.anatomy import anatomy, get_layer
from keras_vit.layers.utils import is_int


def filter_components(kernel, num_components=28, center=True):
    """Top principal components of the filters of a patch-embedding kernel.

    Each of the D output channels is one sample, a filter of `ph * pw * C`
    pixels. The components are the right singular vectors of the (centred)
    `(D, ph * pw * C)` matrix, ordered by variance. The sign of a component is
    arbitrary; it is fixed so that its largest-magnitude entry is positive.

    Args:
        kernel: array `(ph, pw, C, D)` (the `embedding` kernel's layout).
        num_components: how many components to return (at most
            `min(D, ph * pw * C)`). The paper shows 28.
        center: subtract the mean filter first (standard PCA). With False the
            components are those of the uncentred second-moment matrix.

    Returns:
        A tuple `(components, explained)`: float64 `(k, ph, pw, C)` and the
        fraction of the total variance each explains, `(k,)`.
    """
    kernel = np.asarray(kernel, dtype=np.float64)
    if kernel.ndim != 4:
        raise ValueError(
            "`kernel` must have shape (patch_height, patch_width, channels, "
            f"hidden_size). Received: kernel.shape={kernel.shape}"
        )
    ph, pw, channels, hidden = kernel.shape
    samples = kernel.reshape(ph * pw * channels, hidden).T
    limit = max_components(kernel.shape, center)
    if not is_int(num_components) or not 1 <= num_components <= limit:
        raise ValueError(
            f"`num_components` must be an int in [1, {limit}] for this kernel "
            f"({hidden} filters{', centred' if center else ''}, "
            f"{ph * pw * channels} pixels). Received: num_components={num_components!r}"
        )
    if center:
        samples = samples - samples.mean(axis=0, keepdims=True)
    _, singular, vt = np.linalg.svd(samples, full_matrices=False)
    variance = singular ** 2
    total = variance.sum()
    components = vt[:num_components]
    peaks = np.argmax(np.abs(components), axis=1)
    signs = np.sign(components[np.arange(num_components), peaks])
    components = components * np.where(signs == 0, 1.0, signs)[:, None]
    explained = variance[:num_components] / (total if total > 0 else 1.0)
    return components.reshape(num_components, ph, pw, channels), explained


def max_components(kernel_shape, center=True):
    """How many principal components a `(ph, pw, C, D)` kernel has: the
    rank bound of its `(D, ph * pw * C)` filter matrix (one less with
    centring, which removes a dimension)."""
    ph, pw, channels, hidden = kernel_shape
    return max(1, min(hidden - 1 if center else hidden, ph * pw * channels))


def embedding_filter_components(model, num_components=28, center=True):
    """`filter_components` of a plain keras_vit model's RGB `embedding`.

    Raises:
        ValueError: for hybrid models, whose patch embedding reads a ResNet
            feature map rather than RGB pixels (its filters are not images).
    """
    geo = anatomy(model)
    embedding = get_layer(model, "embedding")
    kernel = keras.ops.convert_to_numpy(embedding.kernel)
    if geo.hybrid or kernel.shape[2] != 3:
        reads = (f"a feature map of {kernel.shape[2]} channels (a hybrid ResNet+ViT)" if geo.hybrid else
                 f"images of {kernel.shape[2]} channel(s), not RGB")
        raise ValueError(
            "Patch-embedding filters can be drawn only when the embedding reads "
            f"RGB patches of the image. This model's embedding reads {reads}, so its "
            f"filters are not RGB images. Received: model={model.name!r}"
        )
    return filter_components(kernel, num_components, center)


def plot_filters(components, path=None, columns=7, explained=None,
                 title="RGB embedding filters (first principal components)"):
    """Draws principal components as RGB tiles (paper Figure 7, left).

    Each component is scaled to [0, 1] on its own (min to max), so colours
    show the relative pattern, not the magnitude.

    Args:
        components: `(k, ph, pw, 3)` from `filter_components`.
        path: optional output file (`.png`, `.svg`, ...).
        columns: tiles per row (the paper uses 7 for 28 components).
        explained: optional `(k,)` variance fractions written under each tile.
        title: figure title.

    Returns:
        The `matplotlib.figure.Figure`.
    """
    components = np.asarray(components, dtype=np.float64)
    if components.ndim != 4 or components.shape[-1] != 3:
        raise ValueError(
            "`components` must have shape (k, height, width, 3). "
            f"Received: components.shape={components.shape}"
        )
    if not is_int(columns) or columns <= 0:
        raise ValueError(f"`columns` must be a positive int. Received: columns={columns!r}")
    count = len(components)
    columns = min(columns, count)
    rows = -(-count // columns)
    figure = plotting.new_figure(figsize=(1.1 * columns, 1.25 * rows + 0.4))
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if index >= count:
            continue
        tile = components[index]
        low, high = tile.min(), tile.max()
        tile = (tile - low) / (high - low) if high > low else np.full_like(tile, 0.5)
        ax.imshow(tile, interpolation="nearest")
        if explained is not None:
            ax.set_title(f"{100 * explained[index]:.1f}%", fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    plotting.save(figure, path)
    return figure
