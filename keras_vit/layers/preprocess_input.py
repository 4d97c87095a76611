"""The input normalisation as a layer, for models that take raw images."""

import keras

from keras_vit.preprocessing import check_pixel_stats, preprocess_input


@keras.saving.register_keras_serializable(package="keras_vit")
class PreprocessInput(keras.layers.Layer):
    """Maps pixels in [0, 255] (uint8 or float) to float32 [-1, 1], or with a
    checkpoint's `pixel_mean` and `pixel_std`, to `(x / 255 - mean) / std`.

    Applies `keras_vit.preprocess_input` inside the graph, so a model built
    with `include_preprocessing=True` saves, exports and serves raw images.
    No weights.
    """

    def __init__(self, pixel_mean=None, pixel_std=None, **kwargs):
        # float32 whatever the global policy: the scaling happens before any
        # rounding to a low-precision compute dtype (the next layer casts).
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.pixel_mean, self.pixel_std = check_pixel_stats(pixel_mean, pixel_std)

    def call(self, images):
        return preprocess_input(images, self.pixel_mean, self.pixel_std)

    def get_config(self):
        config = super().get_config()
        config.update(pixel_mean=self.pixel_mean, pixel_std=self.pixel_std)
        return config

    def compute_output_shape(self, input_shape):
        return input_shape
