"""Input pipelines (tf.data + tensorflow-datasets) and the VTAB-1k tasks.

This sub-package needs TensorFlow (and tensorflow-datasets for tfds sources);
the batches it yields feed `model.fit` under any `KERAS_BACKEND`.

- Sources: `from_tfds(name, split)`, `from_directory(path)`,
  `vtab.load_task(task, split)`.
- Pipelines: `pretrain_pipeline`, `finetune_pipeline`, `vtab.vtab_pipeline`.
- Ops and AugReg presets: `keras_vit.data.ops`.
"""

from keras_vit.data import ops
from keras_vit.data import vtab
from keras_vit.data.pipelines import DataSource
from keras_vit.data.pipelines import DatasetNotAvailableError
from keras_vit.data.pipelines import finetune_pipeline
from keras_vit.data.pipelines import from_directory
from keras_vit.data.pipelines import from_tfds
from keras_vit.data.pipelines import pretrain_pipeline
from keras_vit.data.pipelines import tfds_builder
