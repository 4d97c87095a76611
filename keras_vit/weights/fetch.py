"""Downloads of auxiliary files (catalogue, class names) into the weights cache."""

import os

import keras

CACHE_SUBDIR = os.path.join("models", "keras_vit")


def fetch_file(origin, fname, force_download=False):
    """Downloads `origin` once (with a progress bar) and returns the cached path.

    The cache is the checkpoints' one: `~/.keras/models/keras_vit`, or
    `$KERAS_VIT_CACHE_DIR/models/keras_vit`.
    """
    cache_dir = os.environ.get("KERAS_VIT_CACHE_DIR")
    if cache_dir:
        # get_file silently falls back to /tmp/.keras for a missing dir.
        os.makedirs(cache_dir, exist_ok=True)
    return keras.utils.get_file(
        fname=fname,
        origin=origin,
        cache_subdir=CACHE_SUBDIR,
        cache_dir=cache_dir,  # None: the Keras home (~/.keras).
        force_download=force_download,
    )
