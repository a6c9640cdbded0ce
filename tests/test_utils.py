"""d2l's helpers: Timer, Accumulator, Animator (headless PNG), image grids, the smoke switch."""
import inspect
import re
import time
import warnings

import numpy as np
import pytest

import d2l_multi as d2l
from d2l_multi import _checks as checks
from d2l_multi.smoke_switch import SMOKE_ENV, pick, shrink, smoke

PNG = b"\x89PNG\r\n\x1a\n"


def test_timer():
    timer = d2l.Timer()
    time.sleep(0.01)
    first = timer.stop()
    timer.start()
    time.sleep(0.02)
    second = timer.stop()
    assert first >= 0.009 and second >= 0.019  # sleep waits at least that long
    assert timer.sum() == pytest.approx(first + second)
    assert timer.avg() == pytest.approx((first + second) / 2)
    assert timer.cumsum() == pytest.approx([first, first + second])


def test_accumulator():
    acc = d2l.Accumulator(3)
    acc.add(1, 2, 3)
    acc.add(np.float32(0.5), 1, 1)
    assert acc.data == [1.5, 3.0, 4.0] and acc[1] == 3.0
    acc.reset()
    assert acc.data == [0.0, 0.0, 0.0]


def test_animator_collects_points_and_saves_png(tmp_path):
    animator = d2l.Animator(xlabel="epoch", xlim=[1, 3], legend=["train", "test"],
                            ylim=[0, 1], fmts=("-", "m--"), figsize=(3, 2))
    for epoch in range(1, 4):
        animator.add(epoch, (0.1 * epoch, None if epoch == 1 else 0.2 * epoch))
    assert animator.X == [[1.0, 2.0, 3.0], [2.0, 3.0]]
    assert [pytest.approx([0.1, 0.2, 0.3]), pytest.approx([0.4, 0.6])] == animator.Y
    path = animator.save(tmp_path / "curve.png")
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 2000
    assert [t.get_text() for t in animator.axes[0].get_legend().get_texts()] == ["train", "test"]


def test_animator_of_one_epoch_plots_without_a_warning(tmp_path):
    animator = d2l.Animator(xlabel="epoch", xlim=[1, 1], ylim=[0, 1])  # train(..., 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        animator.add(1, 0.5)
        animator.save(tmp_path / "one.png")
    assert animator.axes[0].get_xlim() == (0.5, 1.5)


def test_animator_many_axes_and_scales(tmp_path):
    animator = d2l.Animator(nrows=1, ncols=2, xscale="log", yscale="log")
    animator.add([10, 100], [1.0, 2.0])
    assert len(animator.axes) == 2
    assert animator.save(tmp_path / "a.png").read_bytes()[:8] == PNG


def test_show_images_grid():
    axes = d2l.show_images(np.random.rand(6, 28, 28), 2, 3, titles=list("abcdef"))
    assert len(axes) == 6 and axes[5].get_title() == "f"


def test_smoke_switch(monkeypatch):
    for on in ("1", "true", "YES", "on"):
        monkeypatch.setenv(SMOKE_ENV, on)
        assert smoke() and pick(10, 1) == 1
    for off in ("", "0", "no"):
        monkeypatch.setenv(SMOKE_ENV, off)
        assert not smoke() and pick(10, 1) == 10
    monkeypatch.delenv(SMOKE_ENV)
    assert pick(10, 1) == 10  # unset: the real, full run


def test_shrink_caps_only_in_smoke_mode(monkeypatch):
    monkeypatch.setenv(SMOKE_ENV, "1")
    assert shrink(None, 100) == 100 and shrink(50, 100) == 50
    assert shrink(500, 100) == 100
    monkeypatch.delenv(SMOKE_ENV)
    assert shrink(None, 100) is None and shrink(500, 100) == 500


@pytest.mark.parametrize("kwargs,message", [
    ({"lr": 0}, "lr must be a finite positive number, got 0"),
    ({"lr": float("nan")}, "lr must be a finite positive number, got nan"),
    ({"lr": float("inf")}, "got inf"),
    ({"lr": "0.1"}, "got '0.1'"),
    ({"num_epochs": 2.5}, "num_epochs must be a positive integer, got 2.5"),
    ({"num_epochs": 0}, "num_epochs must be a positive integer, got 0"),
    ({"batch_size": True}, "batch_size must be a positive integer, got True"),
])
def test_check_positive_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        checks.positive(**kwargs)
    checks.positive(lr=0.1, num_epochs=3, batch_size=256)  # fine: no error


def test_validated_class_checks_first_and_unwraps_to_the_shown_class():
    class Point:
        """A point."""

        def __init__(self, x, y=0):
            self.x, self.y = x, y

    def check(x, y=0):
        if x < 0:
            raise ValueError(f"x must be >= 0, got {x}")

    Checked = checks.validated(Point, check)
    assert Checked.__wrapped__ is Point  # inspect.unwrap stops at classes from Python 3.12 on
    assert inspect.getsource(Checked) == inspect.getsource(Point)
    assert (Checked.__name__, Checked.__doc__) == ("Point", "A point.")
    assert list(inspect.signature(Checked).parameters) == ["x", "y"]
    point = Checked(1, y=2)
    assert isinstance(point, Point) and isinstance(point, Checked)
    assert (point.x, point.y) == (1, 2)
    with pytest.raises(ValueError, match="x must be >= 0, got -1"):
        Checked(-1)


def test_max_difference_over_pytrees():
    a = {"w": np.ones((2, 2)), "b": [np.zeros(3), np.float32(1.0)]}
    b = {"w": np.ones((2, 2)) + 1e-3, "b": [np.full(3, -0.5), np.float32(1.25)]}
    assert d2l.max_difference(a, b) == pytest.approx(0.5)
    assert d2l.max_difference(a, a) == 0.0
    assert d2l.max_difference({"e": np.zeros(0)}, {"e": np.zeros(0)}) == 0.0


def test_max_difference_compares_every_copy_and_refuses_other_shapes():
    """A stack of copies (one per device) is compared copy by copy with one copy; any other
    shape mismatch is refused with the shapes, where they differ and what to compare."""
    one = {"w": np.zeros((3, 2))}
    copies = {"w": np.zeros((8, 3, 2))}
    copies["w"][5, 1, 0] = 0.25
    assert d2l.max_difference(copies, one) == d2l.max_difference(one, copies) == 0.25
    for wrong in (np.zeros((2, 3)), np.zeros((3, 1)), np.zeros((8, 2, 3))):
        with pytest.raises(ValueError, match=r"shapes \(3, 2\) and .* differ at \['w'\]; "
                                             r"compare arrays of one shape"):
            d2l.max_difference(one, {"w": wrong})


def test_time_call_returns_the_median_and_waits(monkeypatch):
    """On a clock that each call advances by 1 s (the first timed call by 5 s), the median
    is 1 s: one slow call does not move it; the warm-up calls are not timed."""
    from d2l_multi import utils
    monkeypatch.delenv("D2L_MULTI_SMOKE", raising=False)  # the smoke switch times 2 calls
    clock, calls = [0.0], []
    monkeypatch.setattr(utils.time, "perf_counter", lambda: clock[0])

    def f(x):
        calls.append(x)
        clock[0] += 5.0 if len(calls) == 3 else 1.0
        return x
    assert d2l.time_call(f, 1, repeat=5, warmup=2) == 1.0
    assert len(calls) == 7
    monkeypatch.setenv("D2L_MULTI_SMOKE", "1")
    calls.clear()
    d2l.time_call(f, 1, repeat=5, warmup=2)
    assert len(calls) == 4


def test_the_tests_cannot_reach_the_network():
    import socket
    import urllib.request
    with pytest.raises(OSError, match="tests must not use the network"):
        urllib.request.urlopen("http://93.184.215.14/", timeout=5)
    with pytest.raises(OSError, match="tests must not use the network"):
        socket.create_connection(("8.8.8.8", 53), timeout=5)
    with socket.socket() as server:  # loopback stays open: the multi-process tests need it
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).close()
