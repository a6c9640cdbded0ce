"""What every exercise check shares: the verdict (``CheckFailed``), calling the student's
code safely, comparing numbers, and small problems to test it on."""
import functools
import math

import numpy as np

CHECKS = {}  # check name: the notebook whose exercise it checks


class CheckFailed(AssertionError):
    """A check's verdict against the student's answer: one line, shown without a traceback."""

    def _render_traceback_(self):  # IPython shows these lines instead of a traceback
        return [str(self)]


class _Problem(Exception):
    """Raised inside a check: the reason, completed with the check's name by ``_exercise``."""


def _exercise(notebook):
    """Register a check of ``notebook``; it fails with ``CheckFailed('FAIL name: why')``."""
    def register(check):
        CHECKS[check.__name__] = notebook
        exercise = check.__name__.removeprefix("verify_")

        @functools.wraps(check)
        def run(*answers, hidden=False):
            try:
                passed = check(*answers, hidden=hidden)
            except _Problem as e:
                raise CheckFailed(f"FAIL {exercise}: {e}") from None
            extra = " (and the hidden cases)" if hidden else ""
            print(f"PASS {exercise}: {passed}{extra}")
        return run
    return register


def _fail(why):
    raise _Problem(why)


def _first_line(error):
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 200 else line[:197] + "..."


def _shown_name(fn, name):
    """The name the student gave ``fn`` (``name`` if none; a lambda is "your function")."""
    name = getattr(fn, "__name__", name)
    return name if name.isidentifier() else "your function"


def _call(fn, name, *args, **kwargs):
    """``fn(*args)``, or fail saying why: not written yet, an exception, no result."""
    name = _shown_name(fn, name)
    if fn is Ellipsis:
        _fail(f"`{name}` is still `...`: write the function")
    if not callable(fn):
        _fail(f"`{name}` should be a function, got {type(fn).__name__}")
    try:
        out = fn(*args, **kwargs)
    except _Problem:
        raise
    except NotImplementedError:
        _fail(f"`{name}` is not written yet (it raises NotImplementedError): write its body")
    except Exception as e:  # the student's bug, reported in one line
        _fail(f"`{name}` raised {type(e).__name__}: {_first_line(e)}")
    if out is None:
        _fail(f"`{name}` returned None: write its body where it says `...`, and return the "
              f"result")
    return out


def _value(value, what):
    if value is Ellipsis:
        _fail(f"your {what} is still `...`: replace it with your answer")
    return value


def _run(program, *args, name="your function"):
    """Run a JAX program built around the student's code; a JAX error fails the check."""
    try:
        return program(*args)
    except _Problem:
        raise
    except Exception as e:
        _fail(f"running `{name}` failed with {type(e).__name__}: {_first_line(e)}")


def _number(x, name):
    try:
        x = float(x)
    except (TypeError, ValueError):
        _fail(f"`{name}` should return a number, got {type(x).__name__}")
    if not math.isfinite(x):
        _fail(f"`{name}` returned {x}")
    return x


def _close(a, b, rtol=1e-6, atol=0.0):
    return bool(np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol,
                            atol=atol))


def _times(got, want):
    """How many times ``want`` ``got`` is, for a message: '8x too large', '2x too small'."""
    r = got / want
    if r >= 1:
        return f"{r:.3g}\u00d7 too large"
    return f"{1 / r:.3g}\u00d7 too small" if r > 0 else f"{r:.3g}\u00d7 the right value"


def _scale(got, want):
    """The number r with got = r * want (flattened pytrees of arrays), or None if none fits."""
    import jax
    g = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(got)])
    w = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(want)])
    if g.shape != w.shape or not np.all(np.isfinite(g)):
        return None
    ww = float(w @ w)
    if ww == 0:
        return None
    r = float(g @ w) / ww
    return r if np.linalg.norm(g - r * w) <= 1e-4 * max(np.linalg.norm(w) * max(1, abs(r)),
                                                        1e-30) else None


def _near(r, value, rtol=1e-3):
    return r is not None and abs(r - value) <= rtol * abs(value)


def _same_structure(got, want, what):
    import jax
    gs = [np.shape(x) for x in jax.tree.leaves(got)]
    ws = [np.shape(x) for x in jax.tree.leaves(want)]
    if jax.tree.structure(got) != jax.tree.structure(want) or gs != ws:
        _fail(f"returned {len(gs)} arrays of shapes {gs}: return {what} with the structure "
              f"and shapes of the parameters ({ws})")


def _devices(k):
    import jax
    devices = jax.devices()
    if len(devices) < k:
        _fail(f"this check needs {k} devices but JAX sees {len(devices)}: run "
              f"d2l.simulate_devices(8) before anything else uses JAX (the notebook's first "
              f"cell), then restart the kernel")
    return devices[:k]


def _mesh(shape, names):
    from jax.sharding import Mesh
    return Mesh(np.array(_devices(math.prod(shape))).reshape(shape), names)


def _update_problem(got, params, want, k, what="update"):
    """Explain why the parameters ``got`` differ from ``want`` (both after one step)."""
    import jax
    delta_got = jax.tree.map(lambda a, p: np.asarray(a, np.float64) - p, got, params)
    delta_want = jax.tree.map(lambda a, p: np.asarray(a, np.float64) - p, want, params)
    r = _scale(delta_got, delta_want)
    if r is not None and abs(r) < 1e-6:
        _fail("the parameters did not change: apply the update to them and return the result")
    if _near(r, k):
        _fail(f"your {what} is {k}\u00d7 too large: did you psum instead of pmean? (the mean "
              f"gradient over the {k} devices is the whole batch's gradient)")
    if _near(r, 1 / k):
        _fail(f"your {what} is {k}\u00d7 too small: the gradients were averaged twice (pmean "
              f"already divides by the {k} devices)")
    if _near(r, -1):
        _fail(f"your {what} climbs the loss: subtract lr \u00d7 gradient")
    if r is not None:
        _fail(f"your {what} is {_times(r, 1)} (compared with one device's step on the whole "
              f"batch): check the learning rate and the averaging")
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(jax.tree.leaves(delta_got), jax.tree.leaves(delta_want)))
    _fail(f"your {what} differs from one device's step on the whole batch by up to {diff:.2g}")


def _softmax_problem(seed, n, features=4, classes=3):
    import jax
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(features, classes)).astype(np.float32),
              rng.normal(size=classes).astype(np.float32)]
    X = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int32)
    return jax.tree.map(np.asarray, params), X, y


def _softmax_loss(params, X, y):
    """Mean softmax cross-entropy of a linear model, the loss these checks train."""
    import jax
    import jax.numpy as jnp
    W, b = params
    logp = jax.nn.log_softmax(X @ W + b)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


@functools.cache
def _softmax_grad():
    import jax
    return jax.jit(jax.grad(_softmax_loss))


def _reference_step(params, X, y, lr):
    grads = _softmax_grad()(params, X, y)
    return [np.asarray(p, np.float64) - lr * np.asarray(g, np.float64)
            for p, g in zip(params, grads)]
