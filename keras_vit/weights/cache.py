"""The download cache of registered files (checkpoints and other bucket files).

What the cache trusts, and why:
- Only its own directory: `$KERAS_VIT_CACHE_DIR/models/keras_vit`, else
  `$KERAS_HOME/models/keras_vit`, else `~/.keras/models/keras_vit`. Keras'
  `get_file` falls back to a shared folder in the system temporary directory
  when that is not writable, where another local user could plant a file;
  here an unusable directory is an error that names it.
- Only files owned by the current user and writable by no one else: a
  cached file (or its hash record) that its group or every user may write
  is refused with an error naming it and the `chmod g-w,o-w` fix (POSIX).
  Files this module writes are created `0o644` at most, whatever the umask.
  The directory may be group-writable (a umask of 002 makes it so) but not
  world-writable: a file another user puts there is refused as not ours.
- A file enters the cache only after it was downloaded completely (to a
  temporary name in the cache directory) and passed its validator, by an
  atomic rename. A per-file lock makes concurrent processes wait for one
  download instead of reading a partial file.
- The vit_models bucket publishes no checksums, so the sha256 of each file is
  recorded after its first verified download and checked on every later use
  (trust on first use): a cached file that changed, or that fails its
  validator, is reported, deleted and downloaded again, once.
- A file with no structure that would show a cut-off end (the AugReg
  `index.csv`, plain CSV: `needs_length=True`) is cached only when the
  server states its length (`Content-Length` of a HEAD request) and the
  download has that many bytes: a transfer that ends early without one,
  cut at a line boundary, would otherwise look whole.
- `refresh=True` replaces a cached file only once the new download passed
  its validator: a failed refresh raises and keeps the old file.
- The temporary directory of a download killed mid-way
  (`.NAME.partial-*`) is deleted by the next fetch of that file.
"""

import contextlib
import hashlib
import logging
import os
import shlex
import shutil
import socket
import stat
import tempfile

import keras

from keras_vit import locks
from keras_vit.weights import registry

logger = logging.getLogger("keras_vit")

CACHE_SUBDIR = os.path.join("models", "keras_vit")
# Seconds a download may go without data: `keras.utils.get_file` (urllib)
# has no timeout of its own and waited forever on a server that stopped
# sending.
STALL_TIMEOUT_S = 60


class InvalidFileError(ValueError):
    """A downloaded or cached file that is not what its name promises."""


def cache_dir():
    """The directory of cached files (see the module docstring)."""
    base = (
        os.environ.get("KERAS_VIT_CACHE_DIR")
        or os.environ.get("KERAS_HOME")
        or os.path.join(os.path.expanduser("~"), ".keras")
    )
    return os.path.join(os.path.expanduser(base), CACHE_SUBDIR)


def fetch(bucket_path, validate=None, origin=None, refresh=False, needs_length=False):
    """Returns the local path of `bucket_path` in the vit_models bucket.

    Downloads it once (from `registry.url(bucket_path)`, which honours
    `KERAS_VIT_WEIGHTS_URL`) into the cache; see the module docstring for the
    guarantees.

    Args:
        bucket_path: the file's path in the bucket, e.g.
            `"imagenet21k/ViT-B_16.npz"`.
        validate: optional callable `validate(path)` that raises `ValueError`
            when the file is not usable. It runs on a fresh download before it
            enters the cache, and on a cached copy before it is returned, while
            the file's lock is held (so a validator that reads the file may
            keep what it read).
        origin: the URL to download from, for files outside the bucket
            (e.g. BiT's ImageNet-21k class names). Defaults to
            `registry.url(bucket_path)`.
        refresh: download again even when a valid copy is cached (for files
            that change upstream, such as the AugReg index). The cached copy
            is replaced only by a download that passed `validate`; when the
            download fails, the error is raised and the old copy stays.
        needs_length: the file's format cannot show that a download is
            complete: cache it only when the server states its length and
            the download has it.

    Returns:
        The path of the cached file.
    """
    directory = _own_directory(cache_dir())
    name = bucket_path.replace("/", "__")
    path = os.path.join(directory, name)
    origin = origin or registry.url(bucket_path)
    with _locked(path + ".lock"):
        for entry in os.scandir(directory):  # Left by a killed download.
            if entry.name.startswith(f".{name}.partial-"):
                shutil.rmtree(entry.path, ignore_errors=True)
        # With `refresh`, the cached copy stays until `_download` replaces it
        # with a validated one (by an atomic rename).
        if not refresh and os.path.exists(path):
            try:
                _check_cached(path, validate)
                return path
            except InvalidFileError as e:
                logger.warning("%s It was deleted; downloading it again from %s.", e, origin)
                for stale in (path, _record_path(path)):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(stale)
        _download(origin, directory, name, validate, needs_length)
    return path


def _own_directory(directory):
    """Creates `directory` if needed; refuses one we cannot use or trust."""
    named_by = next((name for name in ("KERAS_VIT_CACHE_DIR", "KERAS_HOME") if os.environ.get(name)), None)
    hint = "Set KERAS_VIT_CACHE_DIR to a directory of yours."
    if named_by:  # the variable that chose it, which may be the mistake
        hint = f"It comes from {named_by}={os.environ[named_by]!r}: point {named_by} at a directory of yours."
    try:
        # Created writable by its owner only, whatever the umask.
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as e:
        raise PermissionError(
            f"Cannot create the keras_vit cache directory {directory!r} ({e}). {hint}"
        ) from e
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(
            f"The keras_vit cache directory {directory!r} is not writable. {hint}"
        )
    _check_owner(directory, "cache directory", hint)
    return directory


def _check_owner(path, what, hint, group=False):
    """Refuses a file or directory of another user, or one others can write
    (with `group`, its group too: whether the group has other members
    cannot be checked portably)."""
    if os.name != "posix":
        return
    info = os.stat(path)
    mode = stat.filemode(info.st_mode)
    if info.st_uid != os.getuid():
        problem = f"is owned by another user (uid {info.st_uid})"
    elif info.st_mode & stat.S_IWOTH:
        problem = f"is writable by every user (mode {mode})"
    elif group and info.st_mode & stat.S_IWGRP:
        problem = f"is writable by its group (mode {mode})"
    else:
        return
    if info.st_uid == os.getuid() and group:
        hint = f"Run `chmod g-w,o-w {shlex.quote(path)}`, or delete it."
    raise PermissionError(f"The keras_vit {what} {path!r} {problem}, so it is not trusted. {hint}")


def _record_path(path):
    return path + ".sha256"


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_cached(path, validate):
    hint = "Delete it, or set KERAS_VIT_CACHE_DIR to a directory of yours."
    _check_owner(path, "cached file", hint, group=True)
    record = _record_path(path)
    actual = _sha256(path)
    if os.path.exists(record):
        _check_owner(record, "hash record", hint, group=True)
        with open(record) as f:
            recorded = f.read().split(" ")[0].strip()
        if actual != recorded:
            raise InvalidFileError(
                f"The cached file {path!r} changed since its first verified download "
                f"(sha256 {actual}, recorded {recorded})."
            )
    _validate(path, validate, f"The cached file {path!r} is invalid")
    if not os.path.exists(record):
        # A copy from an older keras_vit or put there by the user: trusted from now on.
        logger.info("%s: no recorded sha256; recording %s.", path, actual)
        _write_record(path, actual)


def _validate(path, validate, what, shown=None):
    """`validate(path)`; its ValueError as an InvalidFileError saying `what`,
    the path in its words replaced by `shown` (a download's temporary file,
    deleted by the time anyone reads the message, by its URL)."""
    if validate is None:
        return
    try:
        validate(path)
    except InvalidFileError:
        raise
    except ValueError as e:
        raise InvalidFileError(f"{what}: {str(e) if shown is None else str(e).replace(path, shown)}") from e


def _declared_length(origin):
    """The length the server states for `origin` (a HEAD request), or None."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(origin, method="HEAD"), timeout=60) as response:
            length = response.headers.get("Content-Length")
    except urllib.error.HTTPError as error:
        if error.code in (405, 501):  # HEAD not supported: no length stated
            return None
        raise OSError(f"The server of {origin} answered {error.code} ({error.reason}); nothing was cached. "
                      f"Received: origin={origin!r}") from None
    except OSError as error:  # URLError, a timeout: no network, or no such host
        raise OSError(
            f"Cannot reach {origin} ({getattr(error, 'reason', error)}): offline, or a mirror that does not answer "
            f"(KERAS_VIT_WEIGHTS_URL={registry.base_url()!r}); nothing was cached. Received: origin={origin!r}"
        ) from None
    return int(length) if length is not None and length.strip().isdigit() else None


def _download(origin, directory, name, validate, needs_length=False):
    expected = _declared_length(origin) if needs_length else None
    if needs_length and expected is None:
        raise InvalidFileError(
            f"The server of {origin} states no length for it (no Content-Length): a download cut "
            "short could not be told from the whole file, which has no structure that would show "
            "it. Nothing was cached. Download it yourself and pass its path instead."
        )
    partial = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=directory)
    try:
        # Into a fresh directory of ours, so `get_file` neither reuses nor
        # falls back to anything else.
        fresh = _get_file_or_stall(name, origin, partial)
        if expected is not None and os.path.getsize(fresh) != expected:
            raise InvalidFileError(
                f"The file downloaded from {origin} has {os.path.getsize(fresh):,} bytes, the server "
                f"stated {expected:,}: the download was cut short. Nothing was cached."
            )
        try:
            _validate(fresh, validate, f"The file downloaded from {origin} is invalid", shown=origin)
        except InvalidFileError as e:
            raise InvalidFileError(f"{e} Nothing was cached.") from e
        # `get_file` created it under the umask; drop group/other write bits
        # on top (reading the umask itself is not thread-safe).
        os.chmod(fresh, stat.S_IMODE(os.stat(fresh).st_mode) & 0o644)
        path = os.path.join(directory, name)
        _write_record(path, _sha256(fresh))
        os.replace(fresh, path)
    except OSError as error:
        if error.errno is None:  # ours (a stall), saying so already
            raise
        # A full disk: the system's words alone named no file.
        raise type(error)(error.errno, f"{error.strerror}: caching {origin} in {directory} failed. Nothing was "
                          "cached (a file cached before is unchanged).") from error
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _get_file_or_stall(name, origin, directory):
    """`keras.utils.get_file` into `directory`, with `STALL_TIMEOUT_S` on
    every socket operation (urllib's only hook is the process-wide default,
    set for the download unless the program set its own)."""
    import urllib.error

    previous = socket.getdefaulttimeout()
    if previous is None:
        socket.setdefaulttimeout(STALL_TIMEOUT_S)
    try:
        return keras.utils.get_file(fname=name, origin=origin, cache_dir=directory, cache_subdir="")
    except Exception as error:
        # Mid-transfer urllib raises TimeoutError; before the answer,
        # `get_file` turns urllib's URLError into a bare Exception.
        cause = error.__context__ if isinstance(error.__context__, urllib.error.URLError) else error
        if isinstance(cause, TimeoutError) or isinstance(getattr(cause, "reason", None), TimeoutError):
            raise OSError(
                f"The download of {origin} stalled: no data for {socket.getdefaulttimeout():g} s. Nothing was "
                "cached; call again to retry."
            ) from None
        if type(error) is Exception:  # `get_file`'s wrapping of urllib's errors (a 404, a transfer cut short)
            raise OSError(f"The download of {origin} failed ({error}). Nothing was cached; call again to retry.") \
                from error.__context__
        raise
    finally:
        if previous is None:
            socket.setdefaulttimeout(None)


def _write_record(path, digest):
    handle, tmp = tempfile.mkstemp(prefix=".sha256-", dir=os.path.dirname(path))
    try:
        with os.fdopen(handle, "w") as f:
            f.write(f"{digest}  {os.path.basename(path)}\n")
        os.replace(tmp, _record_path(path))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def _locked(lock_path):
    """An exclusive lock on `lock_path` between processes (`keras_vit.locks`)."""
    return locks.waiting(
        lock_path, lambda holder: logger.info("Waiting for another process to finish with %s.", lock_path))
