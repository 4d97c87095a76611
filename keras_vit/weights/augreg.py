"""The AugReg catalogue: `augreg/index.csv`, one row per fine-tuned checkpoint.

The AugReg release (Steiner et al., "How to train your ViT?", 2021) indexes
its ~50k checkpoints in `index.csv` next to them in the `vit_models` bucket.
Columns as documented by the original's `vit_jax/checkpoint.py`
(`get_augreg_df`); its AugReg notebook picks checkpoints by filtering this
table. Read with the csv module: no pandas needed.
"""

import csv
import functools
import math
import os

from keras_vit import variants

COLUMNS = (
    "name", "ds", "epochs", "lr", "aug", "wd", "do", "sd", "best_val",
    "final_val", "final_test", "adapt_ds", "adapt_lr", "adapt_steps",
    "adapt_resolution", "adapt_final_val", "adapt_final_test", "params",
    "infer_samples_per_sec", "filename", "adapt_filename",
)
INTS = {"epochs", "adapt_steps", "adapt_resolution", "params"}
FLOATS = {
    "lr", "wd", "do", "sd", "best_val", "final_val", "final_test", "adapt_lr",
    "adapt_final_val", "adapt_final_test", "infer_samples_per_sec",
}
# Metrics `best` and `sort` rank by (higher is better).
METRICS = (
    "best_val", "final_val", "final_test", "adapt_final_val", "adapt_final_test",
    "infer_samples_per_sec",
)
# Metrics of the fine-tuned checkpoint (the speed is at `adapt_resolution`).
FINETUNE_METRICS = ("adapt_final_val", "adapt_final_test", "infer_samples_per_sec")
BUCKET_PATH = "augreg/index.csv"


def _download(refresh=False):
    """The catalogue, downloaded once through the checkpoints' mirror
    (KERAS_VIT_WEIGHTS_URL) and verified cache (KERAS_VIT_CACHE_DIR): a file
    that does not parse as the index (an error page, a partial download)
    never enters the cache, nor one whose length the server does not state.
    Parsed once, as the cache's validator."""
    from keras_vit.weights import cache

    parsed = []
    # Plain CSV: a download cut at a line boundary parses as a shorter index,
    # so the server must state its length (`needs_length`).
    cache.fetch(BUCKET_PATH, validate=lambda path: parsed.append(read_index(path)), refresh=refresh,
                needs_length=True)
    return parsed[-1]


@functools.lru_cache(maxsize=None)
def _model_key(name):
    # "B/16", "B_16", "ViT-B_16", "R50+L/32" -> the original config name.
    try:
        return variants.resolve_variant(name)[0]
    except ValueError:
        return None


def _parse(value, column, where):
    if value == "" or value.lower() == "nan":
        return None
    if column not in INTS and column not in FLOATS:
        return value
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{where}: column {column!r} is not a number. Received: {value!r}") from None
    if math.isnan(number):  # "-nan", "NaN", ...: no value, as "nan"
        return None
    if math.isinf(number):
        raise ValueError(f"{where}: column {column!r} is not a finite number. Received: {value!r}")
    if column in INTS and number.is_integer():
        return int(number)
    return number


def read_index(path):
    """Parses an `index.csv` file into an `AugRegIndex`; a file that is not
    one (a byte that is not UTF-8, a field beyond the csv module's limit,
    a missing column, a short row, a cell that is not a number) is a
    ValueError naming the file."""
    try:
        return _read_index(path)
    except (csv.Error, UnicodeDecodeError) as error:
        raise ValueError(f"{os.fspath(path)!r} is not an AugReg index: {error}. Received: path={path!r}") from None


def _read_index(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        missing = [c for c in COLUMNS if c not in (header or [])]
        if missing:
            raise ValueError(
                f"{path!r} is not an AugReg index: columns {missing} are missing. "
                f"Received: header {header!r}"
            )
        rows = []
        for line, values in enumerate(reader, start=2):
            if not values:
                continue
            if len(values) != len(header):
                raise ValueError(
                    f"{path!r} line {line} has {len(values)} fields, the header "
                    f"{len(header)}. Received: {values!r}"
                )
            row = {
                c: _parse(v, c, f"{path!r} line {line}")
                for c, v in zip(header, values)
                if c in COLUMNS
            }
            rows.append(row)
    return AugRegIndex(rows)


def augreg_index(path=None, refresh=False):
    """The AugReg checkpoint catalogue (`augreg/index.csv`).

    Example:

    ```python
    index = keras_vit.weights.augreg_index()
    name = index.best(model="B/16", adapt_ds="imagenet2012", adapt_resolution=384)
    model = keras_vit.ViTB16(input_shape=(384, 384, 3), weights=name)
    ```

    Args:
        path: a local copy of `index.csv`; None downloads it once (with a
            progress bar) from the `vit_models` bucket or the mirror in
            `$KERAS_VIT_WEIGHTS_URL`, into the checkpoints' cache.
        refresh: download again even if a cached copy exists; a failed
            download raises and keeps the cached copy.

    Returns:
        An `AugRegIndex`.
    """
    if path is None:
        return _download(refresh=refresh)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No AugReg index at {os.fspath(path)!r}. Received: path={path!r}")
    return read_index(path)


class AugRegIndex:
    """Rows of the AugReg catalogue: filter, sort, pick a checkpoint name.

    Each row is a dict with the columns of `COLUMNS` (numbers parsed, empty
    cells None). Every row is a fine-tuning run (`adapt_filename`) of a
    pre-training run (`filename`); both names are accepted by `weights=`.
    """

    def __init__(self, rows):
        self.rows = list(rows)

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    def __repr__(self):
        return f"AugRegIndex({len(self.rows)} rows)"

    def filter(self, model=None, ds=None, aug=None, adapt_ds=None, adapt_resolution=None, **columns):
        """Rows that match every given value.

        Args:
            model: `"B/16"` (the `name` column), `"B_16"`, `"ViT-B_16"`,
                `"R50+L/32"`, ...
            ds: upstream dataset: `"i1k"`, `"i21k"` (300 epochs) or
                `"i21k_30"` (30 epochs).
            aug: upstream augmentation (`"none"`, `"light1"`, `"medium2"`,
                `"strong1"`, ...).
            adapt_ds: fine-tuning dataset (`"imagenet2012"`, `"cifar100"`,
                `"oxford_iiit_pet"`, `"resisc45"`, `"kitti"`).
            adapt_resolution: fine-tuning resolution (224 or 384).
            **columns: any other column, e.g. `wd=0.1`, `adapt_lr=0.03`.
        """
        wanted = dict(columns, ds=ds, aug=aug, adapt_ds=adapt_ds, adapt_resolution=adapt_resolution)
        wanted = {c: v for c, v in wanted.items() if v is not None}
        unknown = sorted(set(wanted) - set(COLUMNS))
        if unknown:
            raise ValueError(
                f"Unknown AugReg index column(s) {unknown}. Columns: {list(COLUMNS)}. "
                f"Received: {', '.join(f'{c}={wanted[c]!r}' for c in unknown)}"
            )
        rows = self.rows
        if model is not None:
            key = _model_key(model)
            if key is None:
                raise ValueError(
                    f"Unknown model. AugReg models: {sorted(set(r['name'] for r in rows))}. "
                    f"Received: model={model!r}"
                )
            rows = [r for r in rows if _model_key(r["name"]) == key]
        for column, value in wanted.items():
            rows = [r for r in rows if _equal(r[column], value)]
        return AugRegIndex(rows)

    def sort(self, metric="adapt_final_val", descending=True):
        """Rows ordered by `metric`; rows without a value come last."""
        _check_metric(metric)
        known = [r for r in self.rows if r[metric] is not None]
        unknown = [r for r in self.rows if r[metric] is None]
        known.sort(key=lambda r: r[metric], reverse=descending)
        return AugRegIndex(known + unknown)

    def pretrained(self):
        """One row per pre-training checkpoint (the first of each `filename`)."""
        seen, rows = set(), []
        for row in self.rows:
            if row["filename"] not in seen:
                seen.add(row["filename"])
                rows.append(row)
        return AugRegIndex(rows)

    def best(self, metric=None, **filters):
        """The checkpoint name (for `weights=`) with the highest `metric`.

        With a fine-tuning filter (`adapt_ds`, `adapt_resolution`, ...) or a
        metric of `FINETUNE_METRICS`, the fine-tuned file (`adapt_filename`),
        ranked by `adapt_final_val` by default; otherwise the pre-trained file
        (`filename`) with the best upstream `final_val`, the selection the
        AugReg paper recommends (Sec. 4.5).

        Args:
            metric: a column of `METRICS`, or None for the default above.
            **filters: as `filter`.
        """
        if metric is not None:
            _check_metric(metric)
        adapt = metric in FINETUNE_METRICS or any(
            c.startswith("adapt_") for c in filters
        )
        metric = metric or ("adapt_final_val" if adapt else "final_val")
        rows = self.filter(**filters).sort(metric)
        if not len(rows) or rows[0][metric] is None:
            shown = ", ".join(f"{c}={v!r}" for c, v in filters.items())
            raise ValueError(f"No AugReg checkpoint with a {metric} matches. Received: {shown}")
        return rows[0]["adapt_filename" if adapt else "filename"]

    def column(self, name):
        """The values of one column, in row order."""
        if name not in COLUMNS:
            raise ValueError(f"Unknown column. Columns: {list(COLUMNS)}. Received: name={name!r}")
        return [r[name] for r in self.rows]

    def to_pandas(self):
        """A pandas DataFrame of the rows (needs pandas)."""
        import pandas

        return pandas.DataFrame(self.rows, columns=list(COLUMNS))


def _equal(value, wanted):
    if isinstance(value, float) or isinstance(wanted, float):
        try:
            return value is not None and math.isclose(float(value), float(wanted), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return value == wanted


def _check_metric(metric):
    if metric not in METRICS:
        raise ValueError(f"`metric` must be one of {METRICS}. Received: metric={metric!r}")
