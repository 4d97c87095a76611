"""All inspection figures of one model in one call (used by `recipes/inspect_vit.py`)."""

import json
import os
import warnings

import keras
import numpy as np

from keras_vit.anatomy import anatomy
from keras_vit.layers.utils import is_int, normalize_pair
from keras_vit.preprocessing import IMAGE_EXTENSIONS
from keras_vit.inspect.distance import model_attention_distance, plot_attention_distance
from keras_vit.inspect.filters import (
    embedding_filter_components,
    max_components,
    plot_filters,
)
from keras_vit.inspect import plotting
from keras_vit.inspect.posemb import model_posemb_similarity, plot_posemb_similarity
from keras_vit.inspect.rollout import plot_rollout, rollout_maps


def load_image_folder(directory, size, max_images=None, extensions=IMAGE_EXTENSIONS):
    """Reads the images of a folder for inspection (no TensorFlow needed),
    as the fine-tuning evaluation pipeline reads them.

    Each image is decoded to RGB (grey-scale repeated, alpha dropped, 16-bit
    pixels to their high byte, EXIF orientation ignored: as
    `tf.io.decode_image` does) and resized to `size`, aspect ratio not kept,
    bilinear without antialiasing, to float32 (as `tf.image.resize`): the
    numbers `keras_vit.data.finetune_pipeline(..., training=False)` gives
    the model, up to the JPEG decoder (PIL's and TensorFlow's differ by
    about one level on average).

    Args:
        directory: a folder of image files (sub-folders are searched too);
            files are taken in sorted path order.
        size: `(height, width)` of the model input.
        max_images: optional cap on the number of images.
        extensions: file name endings that count as images.

    Returns:
        A tuple `(pixels, names)`: a float32 array `(B, height, width, 3)` of
        pixels in [0, 255] (apply `keras_vit.preprocess_input` before the
        model) and the file names relative to `directory`.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"`directory` is not a folder. Received: directory={directory!r}")
    height, width = normalize_pair(size, "size")
    if max_images is not None and (not is_int(max_images) or max_images <= 0):
        raise ValueError(f"`max_images` must be None or a positive int. Received: max_images={max_images!r}")
    if isinstance(extensions, str):
        extensions = (extensions,)
    paths = sorted(
        os.path.join(root, name)
        for root, _, files in os.walk(directory)
        for name in files
        if name.lower().endswith(tuple(e.lower() for e in extensions)) and not name.startswith(".")
    )
    if max_images is not None:
        paths = paths[:max_images]
    if not paths:
        raise ValueError(
            f"No image files ({', '.join(extensions)}) in the folder. Received: directory={directory!r}"
        )
    pixels = [_resize_bilinear(_load_rgb(path), height, width) for path in paths]
    return np.stack(pixels), [os.path.relpath(p, directory) for p in paths]


def _load_rgb(path):
    """An image file as a uint8 `(H, W, 3)` array, decoded as
    `tf.io.decode_image(..., channels=3)` decodes it; a file that is not an
    image, or a decompression bomb (more pixels than PIL's
    `MAX_IMAGE_PIXELS`, about 89 million: far beyond any inspection image),
    is a ValueError naming it, before its pixels are allocated."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("Reading image files needs pillow: `pip install pillow` (the "
                          "`recipes` extra has it).") from None

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as image:
                if image.mode.startswith("I"):
                    # 16-bit grey: PIL's RGB conversion clips it to 255 (a
                    # white image); libpng, in TensorFlow, keeps the high byte.
                    grey = (np.clip(np.asarray(image), 0, 65535).astype(np.uint32) >> 8).astype(np.uint8)
                    return np.repeat(grey[..., None], 3, axis=-1)
                return np.asarray(image.convert("RGB"), dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError,
                Image.DecompressionBombWarning) as error:
            raise ValueError(
                f"{path} cannot be read as an image ({type(error).__name__}: {error}). "
                f"Received: {path!r}"
            ) from None


def _resize_bilinear(image, height, width):
    """`tf.image.resize(image, (height, width))` in numpy: bilinear, half-pixel
    centres, no antialiasing, float32 (the original's evaluation resize)."""

    def taps(out_size, in_size):
        # TensorFlow's `ResizeBilinear(half_pixel_centers=True)`, in float32.
        x = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * np.float32(in_size / out_size)
        x = x - np.float32(0.5)
        first = np.floor(x)
        return np.maximum(first, 0).astype(int), np.minimum(np.ceil(x), in_size - 1).astype(int), x - first

    image = image.astype(np.float32)
    top, bottom, y = taps(height, image.shape[0])
    left, right, x = taps(width, image.shape[1])
    x = x[:, None]  # per column, over the channels

    def row(rows):
        return rows[:, left] + (rows[:, right] - rows[:, left]) * x

    upper, lower = row(image[top]), row(image[bottom])
    return upper + (lower - upper) * y[:, None, None]


def takes_pixels(model):
    """Whether `model` takes pixels in [0, 255] (it was built with
    `include_preprocessing=True`) rather than images in [-1, 1]."""
    from keras_vit.layers import PreprocessInput

    return any(isinstance(layer, PreprocessInput) for layer in model.layers)


def write_figures(model, images, directory, image_format="png", rollout_images=4,
                  num_components=28, titles=None, batch_size=32):
    """Writes the paper's inspection figures for `model` into `directory`.

    Files: `rollout.<fmt>` (Figure 6, for the first `rollout_images`
    images), `posemb_similarity.<fmt>` (Figure 7 centre),
    `embedding_filters.<fmt>` (Figure 7 left; plain ViTs only, skipped for
    hybrids), `attention_distance.<fmt>` (Figure 7 right, over all images),
    `inspect.npz` with the arrays behind the figures, and `summary.json`.

    Args:
        model: a keras_vit model (plain or hybrid).
        images: `(B, H, W, 3)` in the model's input range ([-1, 1]; pixels
            in [0, 255] for a model with `include_preprocessing=True`, see
            `takes_pixels`), at the model's input size.
        directory: output folder (created if needed).
        image_format: `"png"`, `"svg"` or `"pdf"`.
        rollout_images: how many images the rollout figure shows.
        num_components: principal components of the embedding filters
            (capped by the kernel's size).
        titles: optional names of the images (e.g. file names).
        batch_size: images per forward pass.

    Returns:
        A dict: figure name -> path written (hybrids have no
        `embedding_filters`), plus `"arrays"` and `"summary"`.
    """
    if image_format not in plotting.FORMATS:
        raise ValueError(f"`image_format` must be one of {plotting.FORMATS}. Received: image_format={image_format!r}")
    if not is_int(rollout_images) or rollout_images <= 0:
        raise ValueError(
            f"`rollout_images` must be a positive int. Received: rollout_images={rollout_images!r}"
        )
    directory = os.fspath(directory)
    images = np.asarray(keras.ops.convert_to_numpy(images), dtype=np.float32)
    if titles is not None and len(titles) != len(images):
        raise ValueError(f"`titles` must name each of the {len(images)} images. Received: {len(titles)} titles")
    os.makedirs(directory, exist_ok=True)
    geo = anatomy(model)
    written, arrays = {}, {}

    def path(name):
        return os.path.join(directory, f"{name}.{image_format}")

    shown = slice(0, rollout_images)
    grid_maps, image_maps = rollout_maps(model, images[shown], batch_size=batch_size)
    # The figure shows images in [-1, 1]; a model that preprocesses inside
    # (`include_preprocessing=True`) takes pixels in [0, 255].
    shown_images = images[shown] / 127.5 - 1.0 if takes_pixels(model) else images[shown]
    if shown_images.shape[-1] != 3:  # grey (or other) channels, shown as grey
        shown_images = np.repeat(shown_images.mean(axis=-1, keepdims=True), 3, axis=-1)
    plot_rollout(shown_images, image_maps, path("rollout"),
                 titles=None if titles is None else list(titles)[shown])
    written["rollout"] = path("rollout")
    arrays["rollout_grid_maps"] = grid_maps

    similarity = model_posemb_similarity(model)
    plot_posemb_similarity(similarity, path("posemb_similarity"))
    written["posemb_similarity"] = path("posemb_similarity")
    arrays["posemb_similarity"] = similarity

    summary = {
        "model": model.name,
        # The images' own (a dynamic-size model takes any size); the
        # position embeddings' stored grid is `posemb_grid`.
        "image_size": list(images.shape[1:3]),
        "grid": list(geo.grid_of(*images.shape[1:3])),
        "posemb_grid": list(geo.grid),
        "patch_size_pixels": list(geo.patch_size),
        "num_prefix_tokens": geo.num_prefix_tokens,
        "hybrid": geo.hybrid,
        "num_images": int(len(images)),
    }
    if geo.hybrid:
        summary["embedding_filters"] = "skipped: a hybrid's embedding reads a ResNet feature map, not RGB"
    elif geo.channels != 3:
        summary["embedding_filters"] = f"skipped: the embedding reads {geo.channels}-channel images, not RGB"
    else:
        limit = max_components(tuple(model.get_layer("embedding").kernel.shape))
        components, explained = embedding_filter_components(model, min(num_components, limit))
        plot_filters(components, path("embedding_filters"), explained=explained)
        written["embedding_filters"] = path("embedding_filters")
        arrays["filter_components"] = components
        arrays["filter_explained_variance"] = explained

    # Batch by batch: all images' attention at once can take gigabytes.
    distances = model_attention_distance(model, images, batch_size=batch_size)
    plot_attention_distance(distances, path("attention_distance"))
    written["attention_distance"] = path("attention_distance")
    arrays["mean_attention_distance"] = distances
    summary["mean_attention_distance_per_layer"] = [
        round(float(d), 3) for d in distances.mean(axis=1)
    ]

    arrays_path = os.path.join(directory, "inspect.npz")
    np.savez(arrays_path, **arrays)
    written["arrays"] = arrays_path
    summary_path = os.path.join(directory, "summary.json")
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=2)
    written["summary"] = summary_path
    return written
