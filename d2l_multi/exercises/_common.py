"""What every exercise check shares: the verdict (``CheckFailed``), the split of a check into
what it observes of the student's answer and how it judges that, calling the student's code
safely, comparing numbers, and small problems to test it on.

A check is written as a function of the student's answers and one *case* (a literal: sizes,
a seed, ...). Everything it does with the student's code happens inside one call of
``_observe(probe)``, which returns what the probe saw as plain data (numbers, strings,
NumPy arrays, lists, tuples, dicts); the rest of the function builds the case's inputs
before it and judges the observation after it, calling ``_fail(why)`` on a wrong answer.
That split lets the same code run three ways:

* **live** (``check.NAME(answer)`` in a notebook): observe and judge, case after case;
* **record** (the grader's copy, run in the student's kernel when grading): observe only, on
  the public and the hidden cases, writing each observation down (``_record``);
* **replay** (in the grader's own process, away from the student's code): judge the
  observations that were written down (``_replay``). A submission that replaces, wraps or
  monkeypatches the checks, or prints fake PASS lines, changes nothing there.
"""
import ast
import base64
import functools
import inspect
import json
import math

import numpy as np

CHECKS = {}  # check name: the notebook whose exercise it checks
MIME = "application/vnd.d2l-multi.observations+json"  # how the grader's copy reports


class CheckFailed(AssertionError):
    """A check's verdict against the student's answer: one line, shown without a traceback."""

    def _render_traceback_(self):  # IPython shows these lines instead of a traceback
        return [str(self)]


class _Problem(Exception):
    """Raised inside a check: the reason, completed with the check's name by the caller."""


class _Recorded(BaseException):
    """Raised by ``_observe`` when recording: the case's observation is written down, and the
    judging is the grader's (a BaseException, so no ``except Exception`` of a check stops
    it)."""


class _Tape:
    """The observations of one case: written in the kernel, read back by the grader."""

    def __init__(self, mode, entries=()):
        self.mode, self.entries, self.read = mode, list(entries), 0


_TAPES = []  # the tape of the case being recorded or replayed (none: live)


def _exercise(notebook, cases, passed):
    """Register a check of ``notebook``, written for one case (its last argument), with its
    public ``cases`` and the words its PASS line prints; it fails with
    ``CheckFailed('FAIL name: why')``."""
    def register(one):
        name = one.__name__
        CHECKS[name] = notebook
        params = list(inspect.signature(one).parameters.values())[:-1]

        @functools.wraps(one)
        def check(*answers):
            if len(answers) != len(params):
                raise TypeError(f"check.{name} takes {len(params)} answers "
                                f"({', '.join(p.name for p in params)}), got {len(answers)}")
            for case in cases:
                try:
                    one(*answers, case)
                except _Problem as e:
                    raise CheckFailed(f"FAIL {name}: {e}") from None
            print(f"PASS {name}: {passed}")
        check.__signature__ = inspect.Signature(params)
        check.cases, check.passed, check.one = tuple(cases), passed, one
        return check
    return register


def _observe(probe):
    """``probe()`` -- everything the case does with the student's code -- as plain data;
    a wrong answer found while probing fails here. Called once per case."""
    tape = _TAPES[-1] if _TAPES else None
    if tape is not None and tape.mode == "replay":
        if tape.read >= len(tape.entries):
            raise RuntimeError("the check observed more than it recorded")
        kind, data = tape.entries[tape.read]
        tape.read += 1
        if kind == "problem":
            raise _Problem(data)
        return _decode(data)
    try:
        data = _encode(probe())
    except _Problem as e:
        if tape is None:
            raise
        tape.entries.append(("problem", str(e)))
        raise _Recorded from None
    except Exception as e:  # an answer the check cannot read: the student's to fix
        why = f"checking your answer raised {type(e).__name__}: {_first_line(e)}"
        if tape is None:
            raise _Problem(why) from None
        tape.entries.append(("problem", why))
        raise _Recorded from None
    if tape is not None:
        tape.entries.append(("ok", data))
        raise _Recorded
    return _decode(data)


def _record(check, answers, cases):
    """The grader's side in the student's kernel: each case's observation, as JSON-ready
    entries ``[[kind, data], ...]``; nothing is judged here."""
    out = []
    for case in cases:
        tape = _Tape("record")
        _TAPES.append(tape)
        try:
            check.one(*answers, case)
        except _Recorded:
            pass
        except _Problem as e:  # before the probe: e.g. too few devices
            tape.entries.append(("problem", str(e)))
        finally:
            _TAPES.pop()
        out.append([list(e) for e in tape.entries])
    return out


class _Named:
    """A stand-in for a student's function when replaying: only its name, for messages."""

    def __init__(self, name):
        self.__name__ = name


def _replay(check, recorded, cases, names=()):
    """Judge recorded observations (``_record``'s output) of ``cases``: ``(True, PASS line)``
    or ``(False, FAIL line)``. Runs in the grader's process, never with the student's code."""
    if len(recorded) != len(cases):
        return False, (f"FAIL {check.__name__}: the grader recorded {len(recorded)} of "
                       f"{len(cases)} cases")
    answers = [_Named(n) for n in names] or [None] * len(inspect.signature(check).parameters)
    for case, entries in zip(cases, recorded):
        if not isinstance(entries, list) or not all(
                isinstance(e, list) and len(e) == 2 and e[0] in ("ok", "problem")
                and (e[0] == "ok" or isinstance(e[1], str)) for e in entries):
            return False, f"FAIL {check.__name__}: the grader's record is damaged"
        tape = _Tape("replay", entries)
        _TAPES.append(tape)
        try:
            check.one(*answers, case)
        except _Problem as e:
            return False, f"FAIL {check.__name__}: {e}"
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as e:
            return False, (f"FAIL {check.__name__}: the grader's record does not fit the check "
                           f"({type(e).__name__}: {_first_line(e)})")
        finally:
            _TAPES.pop()
        if tape.read != len(entries):
            return False, f"FAIL {check.__name__}: the grader's record does not fit the check"
    return True, f"PASS {check.__name__}: {check.passed}"


# ----- observations as JSON ----------------------------------------------------------------

_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128", "bfloat16"}
_MAX_BYTES = 16 * 2**20


def _encode(value, depth=0):
    """``value`` as JSON-ready data: arrays (NumPy or JAX) keep their dtype and shape, tuples
    stay tuples; anything else is refused."""
    if depth > 20:
        raise ValueError("an answer nested more than 20 levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else {"big": str(value)}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, depth + 1) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {"dict": [[_encode(k, depth + 1), _encode(v, depth + 1)]
                         for k, v in value.items()]}
    if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__array__"):
        a = np.asarray(value)
        if a.dtype.name not in _DTYPES:
            raise TypeError(f"an array of dtype {a.dtype}")
        if a.nbytes > _MAX_BYTES:
            raise ValueError(f"an array of {a.nbytes} bytes")
        return {"array": a.dtype.name, "shape": list(a.shape),
                "data": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()}
    raise TypeError(f"cannot record a {type(value).__name__}")


def _decode(data, depth=0):
    """The value ``_encode`` wrote: plain data only, whatever the JSON holds."""
    if depth > 22:
        raise ValueError("recorded data nested too deep")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [_decode(v, depth + 1) for v in data]
    if not isinstance(data, dict) or len(data) not in (1, 3):
        raise ValueError("recorded data of an unknown form")
    if "tuple" in data:
        return tuple(_decode(v, depth + 1) for v in data["tuple"])
    if "dict" in data:
        return {_hashable(_decode(k, depth + 1)): _decode(v, depth + 1) for k, v in data["dict"]}
    if "float" in data:
        return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[data["float"]])
    if "big" in data:
        return int(str(data["big"])[:400])
    dtype, shape, raw = data.get("array"), data.get("shape"), data.get("data")
    if dtype not in _DTYPES or not isinstance(shape, list) or not isinstance(raw, str) or \
            not all(isinstance(n, int) and n >= 0 for n in shape) or len(shape) > 32:
        raise ValueError("a recorded array of an unknown form")
    if dtype == "bfloat16":
        import ml_dtypes
        dt = np.dtype(ml_dtypes.bfloat16)
    else:
        dt = np.dtype(dtype)
    raw = base64.b64decode(raw, validate=True)
    if len(raw) > _MAX_BYTES or len(raw) != math.prod(shape) * dt.itemsize:
        raise ValueError("a recorded array of the wrong size")
    return np.frombuffer(raw, dt).reshape(shape).copy()


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def _dumps(value):
    """``_encode``'s JSON text (what the grader's copy publishes)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def _grade_cell(namespace, check, module, answer_names, hidden, alias, token):
    """Run in the student's kernel by the grader's copy of the checks (the hidden part of a
    test cell): record ``check`` on its public cases and on ``hidden`` (a literal), publish
    the records for the grader to judge, and silence the cell's visible call."""
    from IPython.display import publish_display_data
    answers = [namespace[n] if n in namespace else _Missing(n) for n in answer_names]
    names = [_shown_name(a, n) for a, n in zip(answers, answer_names)]
    record = {"token": token, "module": module, "check": check.__name__, "names": names,
              "public": _record(check, answers, check.cases),
              "hidden": _record(check, answers, ast.literal_eval(hidden))}
    publish_display_data({MIME: json.loads(_dumps(record))})
    namespace[alias] = _Silent()


class _Silent:
    """Stands for the checks module while grading: the cell's visible call does nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Missing:
    """An answer the submission never defined."""

    def __init__(self, name):
        self.__name__ = name


def _plain_rules(rules):
    """``rules`` (logical axis -> mesh axis name, tuple of names or None) as a plain dict;
    shared by the checks of 09c and 12."""
    rules = _value(rules, "rules")
    if not isinstance(rules, dict):
        _fail(f"`rules` should be a dict from logical axis to mesh axis, got "
              f"{type(rules).__name__}")
    out = {}
    for axis, value in rules.items():
        names = value if isinstance(value, (tuple, list)) else [value]
        if not all(v is None or isinstance(v, str) for v in names):
            _fail(f"'{axis}' maps to {value!r}: map each logical axis to a mesh axis name, a "
                  f"tuple of names, or None")
        out[str(axis)] = tuple(value) if isinstance(value, (tuple, list)) else value
    return out


# ----- running the student's code ----------------------------------------------------------

def _sub_jaxprs(eqn):
    """The jaxprs nested in ``eqn``: a scan's or a cond's body, a jitted call's, ..."""
    found = []
    for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def _equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs nested in it, in program order."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _sub_jaxprs(eqn):
            yield from _equations(sub)


def _fail(why):
    raise _Problem(why)


def _first_line(error):
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 200 else line[:197] + "..."


def _shown_name(fn, name):
    """The name the student gave ``fn`` (``name`` if none; a lambda is "your function")."""
    name = getattr(fn, "__name__", name)
    return name if isinstance(name, str) and name.isidentifier() else "your function"


def _call(fn, name, *args, **kwargs):
    """``fn(*args)``, or fail saying why: not written yet, an exception, no result."""
    name = _shown_name(fn, name)
    if isinstance(fn, _Missing):
        _fail(f"`{name}` is not defined: run the cell that defines it")
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
    if isinstance(value, _Missing):
        _fail(f"`{value.__name__}` is not defined: run the cell that defines it")
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


def _tree(tree):
    """A pytree of arrays as plain data: lists, tuples and dicts of NumPy arrays."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_tree(t) for t in tree) if isinstance(tree, tuple) else [
            _tree(t) for t in tree]
    if isinstance(tree, dict):
        return {k: _tree(v) for k, v in tree.items()}
    return np.asarray(tree)


# ----- comparing ---------------------------------------------------------------------------

def _close(a, b, rtol=1e-6, atol=0.0):
    try:
        return bool(np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                rtol=rtol, atol=atol))
    except (TypeError, ValueError):
        return False


def _times(got, want):
    """How many times ``want`` ``got`` is, for a message: '8x too large', '2x too small'."""
    r = got / want
    if r >= 1:
        return f"{r:.3g}\u00d7 too large"
    return f"{1 / r:.3g}\u00d7 too small" if r > 0 else f"{r:.3g}\u00d7 the right value"


def _leaves(tree):
    import jax
    return jax.tree.leaves(tree)


def _scale(got, want):
    """The number r with got = r * want (flattened pytrees of arrays), or None if none fits."""
    try:
        g = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in _leaves(got)])
        w = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in _leaves(want)])
    except (TypeError, ValueError):
        return None
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


# ----- devices and small problems ----------------------------------------------------------

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
    delta_got = [np.asarray(a, np.float64) - p for a, p in zip(got, params)]
    delta_want = [np.asarray(a, np.float64) - p for a, p in zip(want, params)]
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
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(delta_got, delta_want))
    _fail(f"your {what} differs from one device's step on the whole batch by up to {diff:.2g}")


def _softmax_problem(seed, n, features=4, classes=3):
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(features, classes)).astype(np.float32),
              rng.normal(size=classes).astype(np.float32)]
    X = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int32)
    return params, X, y


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
    """One SGD step on the whole batch, on one device, with optax: what every data-parallel
    variant must reproduce."""
    import optax
    grads = _softmax_grad()(params, X, y)
    updates, _ = optax.sgd(lr).update(grads, optax.sgd(lr).init(params))
    return [np.asarray(p, np.float64) + np.asarray(u, np.float64)
            for p, u in zip(params, updates)]


# ----- a ring, played step by step -----------------------------------------------------------

def _play_ring(k, n, phases=("reduce-scatter", "all-gather")):
    """Play a ring collective on k devices whose data are n bytes in k chunks of n/k: each
    step, every device sends one chunk to its right-hand neighbour. Returns the steps, each a
    list of (sender, bytes sent); the play checks that the collective is complete."""
    chunk = n / k
    if phases[0] == "all-gather":   # device i starts with its own, finished, chunk i
        holds = [[set(range(k)) if j == i else set() for j in range(k)] for i in range(k)]
    else:                           # device i starts with its own share of every chunk
        holds = [[{i} for _ in range(k)] for i in range(k)]
    steps = []
    for phase in phases:
        for s in range(k - 1):
            sends = []
            for i in range(k):  # which chunk device i passes on in this step
                j = (i - s) % k if phase == "reduce-scatter" else (i + 1 - s) % k
                if phase == "all-gather" and phases[0] == "all-gather":
                    j = (i - s) % k
                sends.append((i, (i + 1) % k, j, set(holds[i][j])))
            for i, right, j, sent in sends:
                if phase == "reduce-scatter":
                    holds[right][j] |= sent
                else:
                    holds[right][j] = sent
            steps.append([(i, chunk) for i, _, _, _ in sends])
    everyone = set(range(k))
    if phases[-1] == "all-gather":
        assert all(h == everyone for device in holds for h in device), "ring incomplete"
    else:
        assert all(holds[i][(i + 1) % k] == everyone for i in range(k)), "ring incomplete"
    return steps


def _ring_bytes_per_device(k, n, phases=("reduce-scatter", "all-gather")):
    """The bytes device 0 sends in the played ring (every device sends as many)."""
    return sum(size for step in _play_ring(k, n, phases) for sender, size in step
               if sender == 0)


def _ring_seconds(k, n, alpha, beta, phases=("reduce-scatter", "all-gather")):
    """The played ring's time: every step costs a start-up ``alpha`` plus its largest message
    at ``beta`` seconds per byte."""
    return sum(alpha + max(size for _, size in step) * beta
               for step in _play_ring(k, n, phases))
