"""Class names: the shipped ImageNet-2012 list, ImageNet-21k names from a
file or a loopback download, `decode_predictions`."""

import importlib.resources
import logging
import os
import pathlib
import re

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import class_names
from tests.weights.test_weights import bucket  # noqa: F401  (a fixture)
from tests.helpers import ROOT


# Files, numpy and a loopback download: the Keras backend plays no part.
pytestmark = pytest.mark.one_backend


def test_imagenet2012_names_of_known_indices():
    ids, names = class_names.imagenet2012_classes()
    assert len(ids) == len(names) == 1000
    assert names[0] == "tench" and names[1] == "goldfish"
    assert names[207] == "golden retriever" and names[999] == "toilet tissue"
    assert (names[134], names[517]) == ("crane", "crane")  # the bird and the machine
    assert ids[0] == "n01440764" and ids[999] == "n15075141"
    # The order of the original heads: tfds imagenet2012 labels, sorted ids.
    assert ids == sorted(ids) and len(set(ids)) == 1000


def test_imagenet2012_order_is_tfds_and_names_are_first_wordnet_lemmas():
    tfds_root = pytest.importorskip("tensorflow_datasets")
    labels = pathlib.Path(tfds_root.__file__).parent / "datasets" / "imagenet2012" / "labels.txt"
    ids, names = class_names.imagenet2012_classes()
    assert ids == labels.read_text().split()
    timm = pytest.importorskip("timm")
    lemmas = pathlib.Path(timm.__file__).parent / "data" / "_info" / "imagenet_synset_to_lemma.txt"
    first = dict(line.split("\t") for line in lemmas.read_text().splitlines())
    assert names == [first[i].split(",")[0].strip() for i in ids]


def test_names_file_is_package_data():
    assert (importlib.resources.files("keras_vit") / "resources" / "imagenet2012_classes.txt").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"resources/*.txt"' in pyproject


def test_decode_predictions_top_k_order_and_ties():
    logits = np.zeros((2, 1000), "float32")
    logits[0, [207, 1, 999]] = [3.0, 2.0, 1.0]
    logits[1, 0] = -1.0  # the rest tie at 0 and keep the class order
    decoded = keras_vit.decode_predictions(keras.ops.convert_to_tensor(logits), top=3)
    assert decoded[0] == [(207, "golden retriever", 3.0), (1, "goldfish", 2.0), (999, "toilet tissue", 1.0)]
    assert decoded[1] == [(1, "goldfish", 0.0), (2, "great white shark", 0.0), (3, "tiger shark", 0.0)]
    probs = keras.ops.convert_to_numpy(keras.ops.softmax(logits))
    assert [c for c, _, _ in keras_vit.decode_predictions(probs)[0]] == [207, 1, 999, 0, 2]
    assert keras_vit.decode_predictions(probs)[0][0][2] == pytest.approx(float(probs[0, 207]))
    # A mixed_bfloat16 head's scores and a numpy `top` (both refused before).
    half = keras.ops.convert_to_numpy(keras.ops.cast(logits, "bfloat16"))
    assert keras_vit.decode_predictions(half, top=np.int64(3)) == decoded


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32", "int64", "uint64"])
def test_decode_predictions_ranks_integer_scores(dtype):
    # A quantized head's scores: negating uint8/int8 wraps around, so 0 (or
    # -128) used to rank first.
    info = np.iinfo(dtype)
    scores = np.array([[info.min, 7, info.max, 7]], dtype)
    decoded = keras_vit.decode_predictions(scores, top=4, class_names=["a", "b", "c", "d"])
    assert [c for c, _, _ in decoded[0]] == [2, 1, 3, 0]
    assert decoded[0][0][2] == float(info.max)


def test_decode_predictions_with_own_names(tmp_path):
    preds = np.array([[0.1, 0.7, 0.2]])
    assert keras_vit.decode_predictions(preds, top=2, class_names=["cat", "dog", "fish"]) == [
        [(1, "dog", 0.7), (2, "fish", 0.2)]
    ]
    # A file: one class per line, the whole line (issue 21: it was cut at
    # the first comma, "1,000 yen note" became "1").
    path = tmp_path / "names.txt"
    path.write_text("cat\n1,000 yen note\n\nfish, a fish\n")
    assert keras_vit.decode_predictions(preds, top=2, class_names=str(path)) == [
        [(1, "1,000 yen note", 0.7), (2, "fish, a fish", 0.2)]
    ]
    # The default top=5 returns every class of a smaller head.
    assert [c for c, _, _ in keras_vit.decode_predictions(preds, class_names=path)[0]] == [1, 2, 0]
    # Index -> name (Hugging Face's `id2label`): the keys were the names.
    id2label = {2: "fish", np.int64(0): "cat", 1: "dog"}
    assert keras_vit.decode_predictions(preds, top=1, class_names=id2label) == [[(1, "dog", 0.7)]]
    assert keras_vit.decode_predictions(preds, top=1, class_names=np.array(["cat", "dog", "fish"])) == [
        [(1, "dog", 0.7)]]


def test_decode_predictions_errors_name_the_value():
    with pytest.raises(ValueError, match=r"No class names are known for a head of 10 classes"):
        keras_vit.decode_predictions(np.zeros((1, 10)))
    with pytest.raises(ValueError, match=r"`class_names` has 2 names for predictions of 3 classes"):
        keras_vit.decode_predictions(np.zeros((1, 3)), class_names=["a", "b"])
    # A string that is no file was a bare FileNotFoundError: 'abc'.
    with pytest.raises(ValueError, match=r"no such file. Received: class_names='abc'"):
        keras_vit.decode_predictions(np.zeros((1, 3)), class_names="abc")
    with pytest.raises(ValueError, match=r"Received: predictions with shape \(1000,\)"):
        keras_vit.decode_predictions(np.zeros(1000))
    with pytest.raises(ValueError, match=r"Received: top=0"):
        keras_vit.decode_predictions(np.zeros((1, 1000)), top=0)
    # A mapping of other keys, names that are no strings ('None', '0').
    for names, received in (({"0": "a", "1": "b", "2": "c"}, "with the keys ['0', '1', '2']"),
                            ({0: "a", 2: "c"}, "with the keys [0, 2]"), ([None] * 3, "holding None"),
                            ([0, 1, 2], "holding 0")):
        with pytest.raises(ValueError, match=re.escape(f"Received: class_names {received}")):
            keras_vit.decode_predictions(np.zeros((1, 3)), class_names=names)
    with pytest.raises(ValueError, match=r"Received: predictions of dtype bool"):
        keras_vit.decode_predictions(np.zeros((1, 1000), bool))


def _lemma_file(path, count=class_names.IMAGENET21K_CLASSES):
    path.write_text("".join(f"class{i}, lemma{i}\n" for i in range(count)))
    return path


def test_imagenet21k_names_downloaded_once(local_bucket, monkeypatch):
    _lemma_file(local_bucket / "lemmas.txt")
    url = f"{keras_vit.weights.registry.base_url()}/lemmas.txt"
    monkeypatch.setattr(class_names, "IMAGENET21K_NAMES_URL", url)
    logits = np.zeros((1, class_names.IMAGENET21K_CLASSES), "float32")
    logits[0, 21842] = 5.0
    assert keras_vit.decode_predictions(logits, top=1) == [[(21842, "class21842", 5.0)]]
    (local_bucket / "lemmas.txt").unlink()  # cached
    assert class_names.imagenet21k_class_names()[:2] == ["class0", "class1"]


def test_imagenet21k_names_missing_is_a_clear_error(local_bucket, monkeypatch, tmp_path):
    url = f"{keras_vit.weights.registry.base_url()}/missing.txt"
    monkeypatch.setattr(class_names, "IMAGENET21K_NAMES_URL", url)
    logits = np.zeros((1, class_names.IMAGENET21K_CLASSES), "float32")
    with pytest.raises(ValueError, match="No ImageNet-21k class names: the download of .*missing.txt failed"):
        keras_vit.decode_predictions(logits)
    # A local copy of the lemma file works without any download (its first
    # lemmas through imagenet21k_class_names; as `class_names=` a file is
    # one name per line, whole); a wrong one is refused.
    lemmas = _lemma_file(tmp_path / "l.txt")
    names = class_names.imagenet21k_class_names(lemmas)
    assert keras_vit.decode_predictions(logits, top=1, class_names=names)[0][0][1] == "class0"
    assert keras_vit.decode_predictions(logits, top=1, class_names=lemmas)[0][0][1] == "class0, lemma0"
    short = _lemma_file(tmp_path / "short.txt", 5)
    with pytest.raises(ValueError, match="has 5"):
        class_names.imagenet21k_class_names(short)


# The download through the weights cache, with a server's faults (the
# loopback `bucket` fixture of tests/weights/test_weights.py).
LEMMAS = "bit_models/imagenet21k_wordnet_lemmas.txt"


def _lemma_bytes(count=class_names.IMAGENET21K_CLASSES):
    return "".join(f"class{i}, lemma{i}\n" for i in range(count)).encode()


def _served(bucket, monkeypatch, data, fault=None):
    bucket.files["lemmas.txt"] = data
    if fault:
        bucket.faults["lemmas.txt"] = fault
    monkeypatch.setattr(class_names, "IMAGENET21K_NAMES_URL", f"{bucket.url}/lemmas.txt")
    return pathlib.Path(os.environ["KERAS_VIT_CACHE_DIR"]) / "models" / "keras_vit"


@pytest.mark.parametrize("fault, match", [
    ("html", r"is an HTML page"),
    ("truncated", r"has 21843 lines; .* has 11405\."),
])
def test_imagenet21k_bad_download_is_never_cached(bucket, monkeypatch, fault, match):
    # Before: no validator, the page or half file was cached and every later
    # call failed with "has N" until the file was deleted by hand.
    cache_dir = _served(bucket, monkeypatch, _lemma_bytes(), fault)
    with pytest.raises(ValueError, match=rf"(?s)No ImageNet-21k class names: .*is invalid.*{match}.*Nothing was cached"):
        class_names.imagenet21k_class_names()
    assert sorted(p.name for p in cache_dir.iterdir()) == [f"{LEMMAS.replace('/', '__')}.lock"]
    del bucket.faults["lemmas.txt"]
    names = class_names.imagenet21k_class_names()
    assert (len(names), names[0], names[-1]) == (21843, "class0", "class21842")
    assert bucket.requests == ["lemmas.txt", "lemmas.txt"]


@pytest.mark.parametrize("cached", ["partial", "html"])
def test_imagenet21k_bad_cached_copy_is_reported_deleted_and_downloaded_once(
    bucket, monkeypatch, caplog, cached
):
    good = _lemma_bytes()
    bad = good[:5000] if cached == "partial" else b"<!DOCTYPE html>\n<html>Quota exceeded</html>\n"
    cache_dir = _served(bucket, monkeypatch, good)
    path = cache_dir / LEMMAS.replace("/", "__")
    cache_dir.mkdir(parents=True)
    path.write_bytes(bad)
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        assert class_names.imagenet21k_class_names()[21842] == "class21842"
    assert f"The cached file {str(path)!r} is invalid" in caplog.text
    assert "downloading it again" in caplog.text
    assert path.read_bytes() == good and bucket.requests == ["lemmas.txt"]
    # A server that serves a bad file too: one more download, then an error.
    path.write_bytes(bad)
    pathlib.Path(f"{path}.sha256").unlink()
    bucket.files["lemmas.txt"] = bad
    with pytest.raises(ValueError, match="(?s)downloaded from .* is invalid.* Nothing was cached"):
        class_names.imagenet21k_class_names()
    assert len(bucket.requests) == 2 and not path.exists()
