"""Input pipelines (tf.data + tensorflow-datasets) and the VTAB-1k tasks.

This sub-package needs TensorFlow (and tensorflow-datasets for tfds sources);
the batches it yields feed `model.fit` under any `KERAS_BACKEND`.

- Sources: `from_tfds(name, split)`, `from_directory(path)`,
  `vtab.load_task(task, split)`.
- Pipelines: `pretrain_pipeline`, `finetune_pipeline`, `vtab.vtab_pipeline`.
- Image ops: `keras_vit.data.ops`; RandAugment and mixup as big_vision
  (AugReg): `keras_vit.data.augment`.

Modules: `sources` (tfds, image folders), `pipelines` (the batch builders),
`ops`, `augment`, `padding` (weighted fixed-size evaluation batches), `vtab`.
"""

import importlib.util

if importlib.util.find_spec("tensorflow") is None:  # before the modules below import it
    raise ImportError("keras_vit.data needs TensorFlow (tf.data): `pip install tensorflow-cpu` (the `tensorflow` "
                      "and `recipes` extras have it); the batches then feed any KERAS_BACKEND.")

from keras_vit.data import augment
from keras_vit.data import ops
from keras_vit.data import padding
from keras_vit.data import sources
from keras_vit.data import vtab
from keras_vit.data.pipelines import augmentation_layers
from keras_vit.data.pipelines import finetune_pipeline
from keras_vit.data.pipelines import pretrain_pipeline
from keras_vit.data.sources import DataSource
from keras_vit.data.sources import DatasetNotAvailableError
from keras_vit.data.sources import from_directory
from keras_vit.data.sources import from_tfds
from keras_vit.data.sources import tfds_builder
