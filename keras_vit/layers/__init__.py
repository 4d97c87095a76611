"""Keras layers that compose into ViT models; only `keras.ops` inside."""

from keras_vit.layers.attention_pooling import AttentionPooling
from keras_vit.layers.class_token import ClassToken
from keras_vit.layers.encoder_block import MlpBlock, QKNormAttention, TransformerEncoderBlock
from keras_vit.layers.patch_embedding import ImageSizeCheck, PatchEmbedding
from keras_vit.layers.pooling import SequencePooling
from keras_vit.layers.preprocess_input import PreprocessInput
from keras_vit.layers.std_conv import StdConv2D
from keras_vit.layers.position_embedding import (
    AddPositionEmbedding,
    resample_position_embedding,
)

__all__ = [
    "AddPositionEmbedding",
    "AttentionPooling",
    "ClassToken",
    "ImageSizeCheck",
    "MlpBlock",
    "PatchEmbedding",
    "PreprocessInput",
    "QKNormAttention",
    "SequencePooling",
    "StdConv2D",
    "TransformerEncoderBlock",
    "resample_position_embedding",
]
