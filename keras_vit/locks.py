"""One process at a time: exclusive OS locks on files.

`BackupAndResume` locks its backup directory while `fit` runs; the recipes
lock their run directory for the whole run; one process prepares a tfds
dataset while others wait (`keras_vit.data.sources.tfds_builder`). The lock
is `flock` on a file: the OS releases it when the process ends, even by
SIGKILL, so a killed run leaves no stale lock. The file holds its holder (`pid N on HOST`) for the
error message of the process that is refused. Where `fcntl` is missing
(Windows), or the file system has no `flock` (some network and FUSE
mounts), there is no lock.
"""

import contextlib
import errno
import os
import socket

# Locks this process holds, by real path: a run of this process that raised
# before releasing its lock, and a new run in the same process, take it over.
_HELD = {}


def acquire(path):
    """Locks the file `path` (created if missing) for this process.

    Returns None, or the holder's description (`"pid N on HOST"`) when
    another process holds the lock. A lock this process holds already is
    taken over."""
    try:
        import fcntl
    except ImportError:
        return None
    key = os.path.realpath(path)
    held = _HELD.pop(key, None)
    if held is not None:
        held.close()
    for attempt in range(100):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            handle = open(path, "a+", encoding="utf-8")
        except FileNotFoundError:  # its folder removed meanwhile (`delete_on_finish`)
            if attempt == 99:
                raise
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                # A file system without `flock` (some network and FUSE mounts):
                # no lock, as where `fcntl` is missing.
                handle.close()
                return None
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            return holder
        if _is_at(handle, path):
            break
        # The holder deleted the file between our open and our lock (a
        # finished run removing its files): a lock on it would shut out no
        # one, as the next process creates a new file. Lock the one there now.
        handle.close()
    else:
        return "unknown (the lock file kept being replaced)"
    _write_holder(handle)
    _HELD[key] = handle
    return None


def _is_at(handle, path):
    """Whether the open file `handle` is the file at `path` now."""
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    return os.path.samestat(os.fstat(handle.fileno()), there)


def _write_holder(handle):
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()


def release(path):
    """Releases a lock this process holds on `path` (nothing if none). To
    remove the file, remove it first, then release (`acquire` checks that
    the file it locked is still the one at `path`)."""
    handle = _HELD.pop(os.path.realpath(path), None)
    if handle is not None:
        handle.close()


def holder(path):
    """The description of another live process holding `path`'s lock, or
    None (no such file, no lock, or this process holds it)."""
    try:
        import fcntl
    except ImportError:
        return None
    if os.path.realpath(path) in _HELD:
        return None
    try:
        handle = open(path, encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except PermissionError:  # another user's: it cannot be told free
        return f"unknown (cannot read {path})"
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None  # no `flock` on this file system
            return handle.read().strip() or "unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


@contextlib.contextmanager
def waiting(path, on_wait=None, record_holder=False):
    """Holds an exclusive lock on the file `path` (created if missing, mode
    0o600) for the block, first waiting for another process to release it;
    the OS releases it when the holder exits, even when killed. The file
    itself stays (removing it would let two processes lock two different
    files). `on_wait(holder)` is called once before a wait, with the
    holder's line where holders record one (`record_holder`). On Windows,
    `msvcrt`'s lock; on a file system without `flock`, none."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            import fcntl
        except ImportError:  # Windows
            import msvcrt

            while True:
                try:
                    msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
                    break
                except OSError:  # LK_LOCK gives up after 10 s.
                    continue
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    if on_wait is not None:
                        on_wait(os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process")
                    fcntl.flock(fd, fcntl.LOCK_EX)
                # else a file system without `flock`: no lock
        if record_holder:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
