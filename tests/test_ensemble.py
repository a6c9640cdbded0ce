"""Ensembles (notebook 08 and appendix A2): the pmap recipe, its jit(shard_map) twin and the
stacked (vmap + NamedSharding) ensemble train the same members to the same parameters; the
members really differ and train independently (only probabilities are shared); the ensemble's
accuracy is the accuracy of the members' averaged probabilities, also with several members per
device; map_members keeps every member on its device (one member's FLOPs per device, no
all-gather); the training loops of both notebooks agree; bad ensemble sizes and meshes fail with
the fix, while the functions the chapter shows carry no checks.

Tolerance: ``allclose(rtol=1e-5, atol=1e-6)`` on the whole train state (float32; the twin
computes every member's step with the same operations, batched differently).
Inputs are small random batches (8 images) so the slow jit(vmap) path stays fast.
"""
import functools
import inspect
import re

import jax
import numpy as np
import pytest
from flax import jax_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from recording import RecordingData
from trees import SGD_TOL, assert_trees_close, image_batches

import d2l_multi as d2l
from d2l_multi.ensemble import _check_ensemble_size
from d2l_multi.smoke_switch import SMOKE_ENV

K = 3                 # SGD steps, k >= 3
NUM_DEVICES = 8       # conftest simulates 8 CPU devices
BATCH = 8             # every member sees the whole batch
LR, MOMENTUM = 0.1, 0.9
TOL = SGD_TOL


def model_mesh(n=NUM_DEVICES):
    return d2l.device_mesh((n,), ("model",), devices=jax.devices()[:n])


@pytest.fixture(scope="module")
def keys():
    return jax.random.split(jax.random.key(0), NUM_DEVICES)


@pytest.fixture(scope="module")
def batches():
    return image_batches(BATCH, K)


@pytest.fixture(scope="module")
def pmap_run(keys, batches):
    """The Flax recipe: initial state, then K pmapped ensemble steps."""
    initial = state = d2l.create_ensemble_state(keys, LR, MOMENTUM)
    metrics = []
    for X, y in batches:
        state, loss, accuracy = d2l.ensemble_step(state, *jax_utils.replicate((X, y)))
        metrics.append((np.asarray(loss), np.asarray(accuracy)))
    return initial, state, metrics


@pytest.fixture(scope="module")
def stacked_initial(keys):
    """The twin's initial state: the same keys, vmapped, sharded P('model') over 8 devices."""
    return d2l.create_stacked_ensemble(keys, LR, MOMENTUM, model_mesh())


def member_probs(state, X):
    """Every member's softmax probabilities, shape (members, images, classes), via NumPy."""
    host = jax.device_get(state)
    forward = jax.jit(lambda params, X: d2l.LinenCNN().apply({"params": params}, X))
    logits = np.stack([np.asarray(forward(jax.tree.map(lambda a: a[m], host.params), X))
                       for m in range(len(host.step))]).astype(np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_members_differ_after_init(pmap_run):
    initial, _, _ = pmap_run
    for path, p in jax.tree_util.tree_leaves_with_path(initial.params):
        p = np.asarray(p)
        assert p.shape[0] == NUM_DEVICES
        if "kernel" in jax.tree_util.keystr(path):  # biases start at zero in every member
            for i in range(NUM_DEVICES):
                for j in range(i):
                    assert np.abs(p[i] - p[j]).max() > 1e-3, (path, i, j)
    assert (np.asarray(initial.step) == 0).all()


def test_stacked_init_equals_pmap_init_and_is_sharded(stacked_initial, pmap_run):
    stacked = stacked_initial
    assert_trees_close(stacked, pmap_run[0], dict(rtol=0, atol=0))
    kernel = stacked.params["Dense_0"]["kernel"]
    assert kernel.sharding.spec == P("model")
    assert kernel.addressable_shards[0].data.shape == (1, *kernel.shape[1:])


@pytest.mark.parametrize("twin", ["jit(vmap)", "shard_map(vmap)"])
def test_stacked_twin_equals_pmap_after_k_steps(twin, stacked_initial, batches, pmap_run):
    mesh = model_mesh()
    step = d2l.stacked_train_step if twin == "jit(vmap)" else d2l.map_members(d2l.member_step,
                                                                               mesh)
    state = stacked_initial
    _, pmapped, pmap_metrics = pmap_run
    for (X, y), (loss_p, acc_p) in zip(batches, pmap_metrics):
        state, loss, accuracy = step(state, *d2l.shard((X, y), mesh))
        np.testing.assert_allclose(np.asarray(loss), loss_p, **TOL)
        np.testing.assert_allclose(np.asarray(accuracy), acc_p, **TOL)
    assert int(state.step[0]) == K
    assert_trees_close(state, pmapped)
    # the members moved: the test compares trained states, not two copies of the initial one
    assert np.abs(np.asarray(state.params["Dense_1"]["kernel"])
                  - np.asarray(pmap_run[0].params["Dense_1"]["kernel"])).max() > 1e-3


@pytest.fixture(scope="module")
def sixteen_initial(keys):
    """16 members on the 8-device 'model' mesh, two per device; the first 8 from ``keys``."""
    keys16 = jax.numpy.concatenate([keys, jax.random.split(jax.random.key(1), NUM_DEVICES)])
    return d2l.create_stacked_ensemble(keys16, LR, MOMENTUM, model_mesh())


def test_two_members_per_device_train_like_one(sixteen_initial, batches, pmap_run):
    """16 members on 8 devices: each member's trajectory is its own, so the 8 members created
    from the pmap run's keys end where the pmap run's members ended."""
    mesh = model_mesh()
    state = sixteen_initial
    assert state.params["Conv_0"]["kernel"].addressable_shards[0].data.shape[0] == 2
    step = d2l.map_members(d2l.member_step, mesh)
    for X, y in batches:
        state, loss, accuracy = step(state, *d2l.shard((X, y), mesh))
    assert_trees_close(jax.tree.map(lambda a: np.asarray(a)[:NUM_DEVICES], state), pmap_run[1])
    assert loss.shape == accuracy.shape == (2 * NUM_DEVICES,)


def numpy_accuracies(probs, labels):
    return ((probs.argmax(-1) == labels).mean(1), (probs.mean(0).argmax(-1) == labels).mean())


def test_shard_map_twin_of_pmap_gives_the_same_steps(pmap_run, batches):
    """Notebook 08's twin: jit(shard_map) over a mesh axis 'ensemble', each device squeezing
    its block to one member, as pmap does inside."""
    mesh = d2l.device_mesh((NUM_DEVICES,), ("ensemble",))

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("ensemble"), P(), P()),
                       out_specs=P("ensemble"))
    def twin_step(state, images, labels):
        member = jax.tree.map(lambda a: a[0], state)
        out = d2l.member_step(member, images, labels, axis_name="ensemble")
        return jax.tree.map(lambda a: a[None], out)

    initial, pmapped, metrics = pmap_run
    state = jax.device_put(initial, NamedSharding(mesh, P("ensemble")))
    for (X, y), (loss_p, acc_p) in zip(batches, metrics):
        state, loss, accuracy = twin_step(state, X, y)
        np.testing.assert_allclose(np.asarray(loss), loss_p, **TOL)
        np.testing.assert_allclose(np.asarray(accuracy), acc_p, **TOL)
    assert_trees_close(state, pmapped)


def test_ensemble_step_accuracy_is_that_of_averaged_probabilities(pmap_run):
    _, state, _ = pmap_run
    X = np.random.default_rng(2).random((32, 28, 28, 1), dtype=np.float32)
    probs = member_probs(state, X)
    ensemble_pred = probs.mean(0).argmax(-1)
    # labels the ensemble gets right on exactly 24 of 32 images
    labels = np.where(np.arange(32) < 24, ensemble_pred, (ensemble_pred + 1) % 10)
    labels = labels.astype(np.int32)
    members, ensemble = numpy_accuracies(probs, labels)
    assert ensemble == 0.75
    assert not np.all(members == 0.75)  # the members predict otherwise: the test can tell
    _, _, accuracy = d2l.ensemble_step(state, *jax_utils.replicate((X, labels)))
    np.testing.assert_allclose(np.asarray(accuracy), np.full(NUM_DEVICES, ensemble))
    # the same members stacked, one step of map_members (shard_map)
    mesh = model_mesh()
    _, _, accuracy = d2l.map_members(d2l.member_step, mesh)(
        d2l.shard(state, mesh, P("model")), *d2l.shard((X, labels), mesh))
    np.testing.assert_allclose(np.asarray(accuracy), np.full(NUM_DEVICES, ensemble))


# ----- bad input: the error names the value and the fix -----

def test_pmap_needs_one_key_per_device():
    for n in (4, 16):
        with pytest.raises(ValueError) as e:
            d2l.create_ensemble_state(jax.random.split(jax.random.key(0), n), LR, MOMENTUM)
        message = str(e.value)
        assert f"got {n} keys for {NUM_DEVICES} devices" in message
        assert f"jax.random.split(rng, {NUM_DEVICES})" in message
        assert "create_stacked_ensemble" in message


def test_stacked_size_must_divide_over_the_model_axis():
    with pytest.raises(ValueError) as e:
        d2l.create_stacked_ensemble(jax.random.split(jax.random.key(0), 12), LR, MOMENTUM,
                                    model_mesh())
    message = str(e.value)
    assert "ensemble of 12 does not divide evenly over 8 devices" in message
    assert "e.g. 8 or 16 models" in message
    assert "'model' axis of 4 devices" in message and "(4, 2) mesh" in message


@pytest.mark.parametrize("members,devices,fix", [
    (3, 8, "e.g. 8 models, or a 'model' axis of 1 device (a divisor of 3)"),
    (6, 4, "e.g. 4 or 8 models, or a 'model' axis of 2 devices"),
])
def test_check_ensemble_size_suggestions(members, devices, fix):
    with pytest.raises(ValueError, match=f"ensemble of {members} does not divide"):
        _check_ensemble_size(members, devices)
    with pytest.raises(ValueError) as e:
        _check_ensemble_size(members, devices)
    assert fix in str(e.value)
    _check_ensemble_size(2 * devices, devices)  # several per device: fine
    _check_ensemble_size(devices, devices, one_per_device=True)


@pytest.mark.parametrize("bad", [0, -8, 2.0, True])
def test_ensemble_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="positive number of models"):
        _check_ensemble_size(bad, NUM_DEVICES)


def test_stacked_ensemble_needs_a_model_axis():
    with pytest.raises(ValueError) as e:
        d2l.create_stacked_ensemble(jax.random.split(jax.random.key(0), 8), LR, MOMENTUM,
                                    d2l.device_mesh())
    assert "'model'" in str(e.value) and "('data',)" in str(e.value)


def test_members_train_independently(keys, batches, pmap_run):
    """Only the probabilities cross between devices: member m after K steps of the ensemble is
    member m after K steps of one model trained alone on one device (d2l.jit_train_step)."""
    initial, pmapped, metrics = pmap_run
    host = jax.device_get(initial)
    for m in (0, NUM_DEVICES - 1):
        alone = jax.tree.map(lambda a: a[m], host)
        for (X, y), (loss, _) in zip(batches, metrics):
            alone, alone_loss, _ = d2l.jit_train_step(alone, X, y)
            np.testing.assert_allclose(float(alone_loss), loss[m], **TOL)
        assert_trees_close(alone.params, jax.tree.map(lambda a: np.asarray(a)[m],
                                                      pmapped.params))


def test_map_members_averages_all_members_with_two_per_device(sixteen_initial):
    """16 members on 8 devices: the ensemble averages over ('model', 'member'), all 16."""
    mesh, state = model_mesh(), sixteen_initial
    X = np.random.default_rng(4).random((24, 28, 28, 1), dtype=np.float32)
    probs = member_probs(state, X)
    labels = probs.mean(0).argmax(-1).astype(np.int32)   # the ensemble is always right
    _, _, accuracy = d2l.map_members(d2l.member_step, mesh)(
        state, *d2l.shard((X, labels), mesh))
    np.testing.assert_allclose(np.asarray(accuracy), np.ones(2 * NUM_DEVICES))
    # the test can tell: averaging over 'model' alone would give each member the average of
    # the even or of the odd members (one per device), which disagrees with all 16 somewhere
    assert not np.all(probs[::2].mean(0).argmax(-1) == labels) or not np.all(
        probs[1::2].mean(0).argmax(-1) == labels)


def test_map_members_keeps_every_member_on_its_device(stacked_initial, batches):
    """The compiled shard_map(vmap) step computes one member's FLOPs per device and gathers
    nothing; whatever the compiler does with jit(vmap), this placement is explicit."""
    mesh = model_mesh()
    X, y = batches[0]
    compiled = d2l.map_members(d2l.member_step, mesh).lower(
        stacked_initial, *d2l.shard((X, y), mesh)).compile()
    one = jax.tree.map(lambda a: np.asarray(a)[0], jax.device_get(stacked_initial))
    one_flops = d2l.jit_train_step.lower(one, X, y).compile().cost_analysis()["flops"]
    ratio = compiled.cost_analysis()["flops"] / one_flops
    assert 0.9 < ratio < 1.1, ratio
    counts = d2l.count_collectives(compiled.as_text())
    assert counts["all-gather"] == 0 and counts["all-reduce"] >= 1, counts


class TinyData:
    """Two training batches of random images, like d2l.FashionMNIST's training loader."""

    def __init__(self, batches):
        self.train_batches = batches[:2]

    def get_dataloader(self, train, batch_size=None, drop_last=False):
        return list(self.train_batches)


def test_train_ensemble_takes_one_ensemble_step_per_batch(monkeypatch, batches, pmap_run,
                                                          capsys):
    """Notebook 08's loop: 2 epochs of 2 batches are 4 ensemble steps, the smoke switch or
    not, and it prints one line per epoch."""
    monkeypatch.setenv(SMOKE_ENV, "1")
    data = TinyData(batches)
    trained = d2l.train_ensemble(pmap_run[0], data, num_epochs=2)
    state = pmap_run[0]
    for X, y in batches[:2] * 2:
        state, _, _ = d2l.ensemble_step(state, *jax_utils.replicate((X, y)))
    assert int(np.asarray(trained.step)[0]) == 4
    assert_trees_close(trained, state, dict(rtol=0, atol=0))
    assert capsys.readouterr().out.count("epoch") == 2


def test_the_ensemble_loop_reshuffles_every_epoch(pmap_run):
    data = RecordingData()
    d2l.train_ensemble(pmap_run[0], data, num_epochs=2)
    d2l.train_ensemble(pmap_run[0], data, num_epochs=2)   # a rerun sees the same batches
    assert data.epochs == [0, 1, 0, 1]


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_training_loop_needs_a_positive_number_of_epochs(bad, pmap_run):
    with pytest.raises(ValueError, match="num_epochs"):
        d2l.train_ensemble(pmap_run[0], TinyData([None, None]), num_epochs=bad)


def test_map_members_needs_a_model_axis():
    with pytest.raises(ValueError) as e:
        d2l.map_members(d2l.member_step, d2l.device_mesh())
    assert "'model'" in str(e.value) and "('data',)" in str(e.value)


@pytest.mark.parametrize("name", ["create_ensemble_state", "train_ensemble",
                                  "create_stacked_ensemble", "map_members"])
def test_the_public_name_checks_then_runs_the_shown_function(name):
    """The chapter shows these functions without argument checks; the library's public
    names check first (check.validated), so bad input still gets a clear message."""
    public = getattr(d2l, name)
    shown = inspect.unwrap(public)
    assert shown is not public
    assert not re.search(r"\bcheck_\w+\(|\bisinstance\(", inspect.getsource(shown))
