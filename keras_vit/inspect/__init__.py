"""Looking inside a ViT: the analysis figures of the paper (Fig. 6 and 7).

- `attention_model` / `attention_weights`: the attention probabilities of any
  blocks of any keras_vit model (plain or hybrid), from a second model that
  shares the weights, so the model itself keeps the fused attention path.
- `attention_rollout`, `rollout_maps`, `plot_rollout`: attention rollout from
  the output token to the image (Figure 6).
- `posemb_similarity`, `plot_posemb_similarity`: cosine similarity of the
  position embeddings (Figure 7, centre).
- `filter_components`, `plot_filters`: principal components of the RGB
  patch-embedding filters (Figure 7, left).
- `mean_attention_distance`, `plot_attention_distance`: attention distance
  in pixels per head and depth (Figure 7, right).
- `write_figures`: all of them into a folder (see `recipes/inspect_vit.py`).

Every computation returns numpy arrays; every plot function takes those
arrays, returns a matplotlib `Figure` and optionally writes it (PNG, SVG,
PDF). See `docs/inspect.md`.
"""

from keras_vit.inspect.attention import (
    AttentionProbe,
    attention_model,
    attention_weights,
    block_names,
)
from keras_vit.inspect.distance import (
    mean_attention_distance,
    model_attention_distance,
    patch_distances,
    plot_attention_distance,
)
from keras_vit.inspect.filters import (
    embedding_filter_components,
    filter_components,
    plot_filters,
)
from keras_vit.inspect.posemb import (
    model_posemb_similarity,
    plot_posemb_similarity,
    posemb_similarity,
)
from keras_vit.inspect.report import load_image_folder, takes_pixels, write_figures
# Where the tokens sit on the image: the model's anatomy, under the name the
# analyses use.
from keras_vit.anatomy import ModelAnatomy as Geometry
from keras_vit.anatomy import anatomy as geometry
from keras_vit.inspect.rollout import (
    attention_rollout,
    plot_rollout,
    rollout_maps,
    rollout_to_grid,
    upsample_maps,
)

__all__ = [
    "AttentionProbe",
    "Geometry",
    "attention_model",
    "attention_rollout",
    "attention_weights",
    "block_names",
    "embedding_filter_components",
    "filter_components",
    "geometry",
    "load_image_folder",
    "mean_attention_distance",
    "model_attention_distance",
    "model_posemb_similarity",
    "patch_distances",
    "plot_attention_distance",
    "plot_filters",
    "plot_posemb_similarity",
    "plot_rollout",
    "posemb_similarity",
    "rollout_maps",
    "rollout_to_grid",
    "takes_pixels",
    "upsample_maps",
    "write_figures",
]
