"""`keras_vit.interrupts.held_back`: a Ctrl-C (a real SIGINT) in the block
comes after it, a second one at once, and the handler in place is kept."""

import contextlib
import signal

import pytest

from keras_vit import interrupts

pytestmark = pytest.mark.one_backend  # signals only


def test_a_ctrl_c_comes_after_the_block(capsys):
    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held_back("this test's block"):
            signal.raise_signal(signal.SIGINT)
            done.append("the rest of the block")
    assert done == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is before
    assert capsys.readouterr().err == ("keras_vit: Ctrl-C held until this test's block ends (press it again to "
                                       "interrupt now).\n")


@pytest.mark.parametrize("blocks", [1, 2])
def test_a_second_ctrl_c_interrupts_at_once(blocks, capsys):
    """Nested blocks hold once: an inner block took the outer one's holder
    for the user's handler, so a second Ctrl-C was held again, and the
    message came twice."""
    done = []
    with pytest.raises(KeyboardInterrupt):
        with contextlib.ExitStack() as stack:
            for i in range(blocks):
                stack.enter_context(interrupts.held_back(f"block {i}"))
            signal.raise_signal(signal.SIGINT)
            done.append("after the first")
            signal.raise_signal(signal.SIGINT)
            done.append("after the second")
    assert done == ["after the first"]
    assert capsys.readouterr().err.count("Ctrl-C held") == 1


def test_the_users_handler_runs_for_each_ctrl_c():
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with interrupts.held_back("a block"):
            signal.raise_signal(signal.SIGINT)
            assert calls == []
            signal.raise_signal(signal.SIGINT)
            assert calls == [signal.SIGINT]
        assert calls == [signal.SIGINT] * 2
        with interrupts.held_back("nothing"):
            pass
        assert calls == [signal.SIGINT] * 2
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_block_that_raises_still_lets_the_ctrl_c_through():
    """The held Ctrl-C was lost when the block raised (a refused batch in a
    step that was compiling)."""
    with pytest.raises(KeyboardInterrupt) as raised:
        with interrupts.held_back("a failing block"):
            signal.raise_signal(signal.SIGINT)
            raise ValueError("a refused batch")
    assert isinstance(raised.value.__context__, ValueError)
