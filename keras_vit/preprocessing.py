"""Input scaling shared by every checkpoint of the original release."""

from keras import ops


def preprocess_input(images):
    """Maps uint8-range pixels [0, 255] to float32 [-1, 1]: x / 127.5 - 1.

    The original input pipelines normalise this way
    (google-research/vision_transformer, `input_pipeline.py`); every
    released checkpoint expects it. Accepts numpy arrays or tensors, NHWC.
    """
    return ops.cast(images, "float32") / 127.5 - 1.0
