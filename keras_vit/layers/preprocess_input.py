"""The input normalisation as a layer, for models that take raw images."""

import keras

from keras_vit.preprocessing import preprocess_input


@keras.saving.register_keras_serializable(package="keras_vit")
class PreprocessInput(keras.layers.Layer):
    """Maps pixels in [0, 255] (uint8 or float) to float32 [-1, 1].

    Applies `keras_vit.preprocess_input` inside the graph, so a model built
    with `include_preprocessing=True` saves, exports and serves raw images.
    No weights.
    """

    def __init__(self, **kwargs):
        # float32 whatever the global policy: the scaling happens before any
        # rounding to a low-precision compute dtype (the next layer casts).
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)

    def call(self, images):
        return preprocess_input(images)

    def compute_output_shape(self, input_shape):
        return input_shape
