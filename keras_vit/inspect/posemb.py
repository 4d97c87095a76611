"""Similarity of the learned position embeddings (paper Fig. 7 centre, App. D.4).

The paper shows, for every patch position, the cosine similarity of its
position embedding with the embeddings of all other positions: one small map
per position, laid out as the patch grid. Nearby positions end up with
similar embeddings, and row/column structure appears, although the model is
only given a 1-D sequence of learned embeddings.
"""

import keras
import numpy as np

from keras_vit.inspect import plotting
from keras_vit.anatomy import anatomy, get_layer


def posemb_similarity(posemb, grid, num_prefix_tokens=0):
    """Cosine similarity between the position embeddings of all grid cells.

    Args:
        posemb: array `(T, D)` or `(1, T, D)`: a position embedding, the
            prefix rows (class token) first, then the grid in row-major
            order.
        grid: `(rows, cols)` of the patch grid; square or not.
        num_prefix_tokens: rows before the grid, left out (the class token's
            row has no position on the grid).

    Returns:
        float64 array `(rows, cols, rows, cols)`: `sim[r, c]` is the map of
        the similarity between position `(r, c)` and every position.
    """
    posemb = np.asarray(posemb, dtype=np.float64)
    if posemb.ndim == 3 and posemb.shape[0] == 1:
        posemb = posemb[0]
    rows, cols = (int(g) for g in grid)
    if posemb.ndim != 2 or posemb.shape[0] != num_prefix_tokens + rows * cols:
        raise ValueError(
            f"`posemb` must have shape (T, D) or (1, T, D) with T = "
            f"{num_prefix_tokens} prefix row(s) + {rows}x{cols} grid rows. "
            f"Received: posemb.shape={np.shape(posemb)}"
        )
    cells = posemb[num_prefix_tokens:]
    norms = np.linalg.norm(cells, axis=-1, keepdims=True)
    unit = cells / np.where(norms > 0, norms, 1.0)
    similarity = np.clip(unit @ unit.T, -1.0, 1.0)
    return similarity.reshape(rows, cols, rows, cols)


def model_posemb_similarity(model):
    """`posemb_similarity` of a keras_vit model's `posembed_input` weights."""
    geo = anatomy(model)
    posemb = get_layer(model, "posembed_input").pos_embedding
    return posemb_similarity(
        keras.ops.convert_to_numpy(posemb), geo.grid, geo.posemb_prefix_tokens
    )


def similarity_mosaic(similarity, gap=1):
    """Lays `(rows, cols, rows, cols)` maps out as one image with NaN gaps."""
    similarity = np.asarray(similarity, dtype=np.float64)
    if similarity.ndim != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise ValueError(
            "`similarity` must have shape (rows, cols, rows, cols). "
            f"Received: similarity.shape={similarity.shape}"
        )
    rows, cols = similarity.shape[:2]
    tile_h, tile_w = rows + gap, cols + gap
    mosaic = np.full((rows * tile_h - gap, cols * tile_w - gap), np.nan)
    for r in range(rows):
        for c in range(cols):
            mosaic[r * tile_h:r * tile_h + rows, c * tile_w:c * tile_w + cols] = similarity[r, c]
    return mosaic


def plot_posemb_similarity(similarity, path=None, title="Position embedding similarity",
                           cmap="viridis"):
    """Draws the grid of similarity maps of the paper's Figure 7 (centre).

    The tile at row `r`, column `c` is the cosine similarity between the
    position embedding of patch `(r, c)` and those of all patches.

    Args:
        similarity: `(rows, cols, rows, cols)` from `posemb_similarity`.
        path: optional output file (`.png`, `.svg`, ...).
        title: figure title.
        cmap: colour map (values from -1 to 1).

    Returns:
        The `matplotlib.figure.Figure`.
    """
    similarity = np.asarray(similarity)
    mosaic = similarity_mosaic(similarity)
    rows, cols = similarity.shape[:2]
    scale = 5.0 / max(rows, cols)
    figure = plotting.new_figure(figsize=(cols * scale + 1.4, rows * scale + 0.8))
    ax = figure.subplots()
    image = ax.imshow(mosaic, cmap=cmap, vmin=-1.0, vmax=1.0, interpolation="nearest")
    # Ticks at the tile centres, numbered from 1 as in the paper.
    step = max(1, max(rows, cols) // 8)
    ax.set_xticks([c * (cols + 1) + (cols - 1) / 2 for c in range(0, cols, step)])
    ax.set_xticklabels([str(c + 1) for c in range(0, cols, step)])
    ax.set_yticks([r * (rows + 1) + (rows - 1) / 2 for r in range(0, rows, step)])
    ax.set_yticklabels([str(r + 1) for r in range(0, rows, step)])
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title(title, fontsize=10)
    colorbar = figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    colorbar.set_label("Cosine similarity")
    plotting.save(figure, path)
    return figure
