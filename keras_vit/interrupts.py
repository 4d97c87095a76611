"""Ctrl-C held back while keras_vit changes things that must change
together (a training step's state, a checkpoint's variables, two files)."""

import contextlib
import signal
import sys
import threading


@contextlib.contextmanager
def held_back(what):
    """Holds a Ctrl-C (SIGINT; a notebook's interrupt too) back until the
    block ends, then lets the handler in place run (Python's raises
    KeyboardInterrupt). The first one prints that it is held, until `what`
    ends; a second one in the block runs the handler at once: the way out
    of a block that takes long (a step's first call compiles it). Signals
    reach the main thread only; elsewhere nothing is changed, as inside a
    block that already holds them. A block that raises still lets a held
    Ctrl-C through (its KeyboardInterrupt then carries the error)."""
    handler = signal.getsignal(signal.SIGINT)
    if (not callable(handler) or getattr(handler, "keras_vit_holds", False)
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    received = []

    def hold(signum, frame):
        if received:
            handler(signum, frame)
        else:
            print(f"keras_vit: Ctrl-C held until {what} ends (press it again to interrupt now).", file=sys.stderr)
        received.append(frame)

    hold.keras_vit_holds = True
    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if received:
            handler(signal.SIGINT, received[0])
