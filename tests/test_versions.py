"""constraints.txt pins the tested stack: every dependency of the package and of its extras,
exactly, at a version pyproject.toml admits."""
import pathlib
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pins():
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line!r} is not an exact pin"
            out[canonicalize_name(req.name)] = spec.version
    return out


def test_every_dependency_is_pinned_within_the_bounds_of_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = pins()
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values()
                                      for r in extra]
    for req in map(Requirement, reqs):
        name = canonicalize_name(req.name)
        if name == canonicalize_name(project["name"]):
            continue                                  # d2l-multi[book]: the project itself
        assert name in pinned, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(pinned[name]), (
            f"constraints.txt pins {req.name}=={pinned[name]}, outside {req}")


def test_the_libraries_whose_next_release_is_untried_have_an_upper_bound():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {canonicalize_name(r.name): r.specifier for r in map(Requirement,
                                                                   project["dependencies"])}
    assert not bounds["jax"].contains("0.12.0") and bounds["jax"].contains("0.11.2")
    assert not bounds["orbax-checkpoint"].contains("1.0.0")
