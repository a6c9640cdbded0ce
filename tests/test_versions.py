"""constraints.txt pins the tested stack, constraints-min.txt the oldest one: every dependency
of the package and of its extras, exactly, at a version pyproject.toml admits; the lower bounds
of pyproject.toml are the versions constraints-min.txt pins (docs/versions.md)."""
import pathlib
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(name="constraints.txt"):
    out = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{name}: {line!r} is not an exact pin"
            assert canonicalize_name(req.name) not in out, f"{name} pins {req.name} twice"
            out[canonicalize_name(req.name)] = spec.version
    return out


def requirements():
    """Every requirement of the package and of its extras, but the project's own extras."""
    reqs = PROJECT["dependencies"] + [r for extra in PROJECT["optional-dependencies"].values()
                                      for r in extra]
    return [req for req in map(Requirement, reqs)
            if canonicalize_name(req.name) != canonicalize_name(PROJECT["name"])]


def lower_bound(req):
    (bound,) = [spec.version for spec in req.specifier if spec.operator == ">="]
    return bound


@pytest.mark.parametrize("name", ["constraints.txt", "constraints-min.txt"])
def test_every_dependency_is_pinned_within_the_bounds_of_pyproject(name):
    pinned = pins(name)
    for req in requirements():
        key = canonicalize_name(req.name)
        assert key in pinned, f"{name} does not pin {req.name}"
        assert req.specifier.contains(pinned[key]), (
            f"{name} pins {req.name}=={pinned[key]}, outside {req}")


@pytest.mark.parametrize("name", ["constraints.txt", "constraints-min.txt"])
def test_jax_and_jaxlib_are_pinned_together(name):
    pinned = pins(name)
    assert pinned["jax"] == pinned["jaxlib"], name


def test_every_lower_bound_is_the_version_constraints_min_pins():
    """A lower bound is a version the whole suite passed with: raising one means raising its
    pin in constraints-min.txt (and running the suite on it, docs/testing.md)."""
    pinned = pins("constraints-min.txt")
    for req in requirements():
        assert pinned[canonicalize_name(req.name)] == lower_bound(req), (
            f"{req} has lower bound {lower_bound(req)}, constraints-min.txt pins "
            f"{pinned[canonicalize_name(req.name)]}")


def test_the_libraries_whose_next_release_is_untried_have_an_upper_bound():
    bounds = {canonicalize_name(r.name): r.specifier for r in map(Requirement,
                                                                   PROJECT["dependencies"])}
    assert not bounds["jax"].contains("0.12.0") and bounds["jax"].contains("0.11.2")
    assert not bounds["orbax-checkpoint"].contains("1.0.0")


def test_the_versions_the_readme_names_are_the_pinned_ones():
    """README names the tested stack; a new pin that leaves the README behind fails here."""
    text = (ROOT / "README.md").read_text()
    start = text.index("`constraints.txt` pins")
    named = dict(re.findall(r"(JAX|Flax|Optax|Orbax|Grain|Keras|NumPy) (\d+(?:\.\d+)+)",
                            text[start:start + 300]))
    package = {"JAX": "jax", "Flax": "flax", "Optax": "optax", "Orbax": "orbax-checkpoint",
               "Grain": "grain", "Keras": "keras", "NumPy": "numpy"}
    pinned = pins()
    assert set(named) == set(package), f"README names {sorted(named)}"
    for name, version in named.items():
        assert pinned[package[name]] == version, (name, version, pinned[package[name]])
