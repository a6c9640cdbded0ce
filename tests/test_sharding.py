"""Sharding beyond data parallelism: DP, FSDP, TP and their mixes compute the same step; the
sharded layouts hold the expected bytes per device and compile to the expected collectives;
the memory calculator counts what the models really have; bad input is refused clearly."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import d2l_multi as d2l
from d2l_multi.memory import transformer_footprint
from d2l_multi.strategies import STRATEGIES
from d2l_multi.text import TINY_TEXT

LR = 0.5  # plain SGD: equal updated parameters <=> equal gradients
D_MODEL, NUM_HEADS, D_FF, SEQ_LEN, BATCH = 32, 8, 64, 16, 16
SHARDED = ("fsdp", "tp", "dp+tp", "fsdp+tp")


@pytest.fixture(scope="module")
def corpus():
    return d2l.CharCorpus(batch_size=BATCH, seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def model_fn(corpus):
    return lambda: d2l.TransformerLM(corpus.vocab_size, SEQ_LEN, D_MODEL, NUM_HEADS,
                                     num_layers=1, d_ff=D_FF, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def base_model(model_fn):
    shape, rules = d2l.sharding_rules("fsdp+tp")
    return d2l.create_sharded(model_fn, d2l.device_mesh(shape), rules)


@pytest.fixture(scope="module")
def steps(base_model, corpus):
    """One SGD step per strategy, from the same parameters on the same batch."""
    X, Y = corpus.batch(0)
    out = {}
    for name in STRATEGIES:
        shape, rules = d2l.sharding_rules(name)
        mesh = d2l.device_mesh(shape)
        model = d2l.reshard(base_model, mesh, rules)
        Xs, Ys = d2l.shard_tokens(X, Y, mesh, rules)
        with d2l.use_sharding(mesh, rules):
            optimizer = nnx.Optimizer(model, optax.sgd(LR), wrt=nnx.Param)
            compiled = d2l.lm_train_step.lower(model, optimizer, Xs, Ys).compile()
            loss = compiled(model, optimizer, Xs, Ys)
        params = nnx.state(model, nnx.Param)
        out[name] = dict(mesh=mesh, loss=float(loss), params=params,
                         host=jax.tree.map(np.asarray, params),
                         collectives=d2l.count_collectives(compiled.as_text()))
    return out


# --- every layout computes the same step ----------------------------------------------------

@pytest.mark.parametrize("name", SHARDED)
def test_every_layout_gives_the_loss_and_updated_params_of_data_parallelism(steps, name):
    ref, got = steps["dp"], steps[name]
    np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-6)
    ref_leaves, got_leaves = jax.tree.leaves(ref["host"]), jax.tree.leaves(got["host"])
    assert len(ref_leaves) == len(got_leaves) == 15  # 2 embeddings, 10 in the block, 3 after
    for a, b in zip(ref_leaves, got_leaves):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_the_step_really_changed_the_parameters(steps, base_model):
    before = jax.tree.leaves(jax.tree.map(np.asarray, nnx.state(base_model, nnx.Param)))
    after = jax.tree.leaves(steps["dp"]["host"])
    assert max(float(np.abs(a - b).max()) for a, b in zip(before, after)) > 1e-3


def test_the_updated_params_keep_the_layout_of_their_strategy(steps):
    for name, r in steps.items():
        kernel = r["params"]["blocks"][0]["mlp"]["up"]["kernel"][...]
        _, rules = d2l.sharding_rules(name)
        layout = jax.sharding.NamedSharding(r["mesh"], jax.sharding.PartitionSpec(
            rules["embed"], rules["mlp"]))  # P() and P(None, None) are the same layout
        assert kernel.sharding.is_equivalent_to(layout, kernel.ndim)
        norm = r["params"]["blocks"][0]["norm1"]["scale"][...]
        assert norm.sharding.is_fully_replicated  # under FSDP XLA would shard it if let


# --- bytes per device ------------------------------------------------------------------------

def _bytes(params, select):
    return sum(x.nbytes for path, x in jax.tree_util.tree_leaves_with_path(params)
               if select(jax.tree_util.keystr(path)))


def test_per_device_parameter_bytes_are_the_total_over_the_shards(steps):
    n = len(jax.devices())
    params = steps["dp"]["params"]
    total = _bytes(params, lambda p: True)
    norms = _bytes(params, lambda p: "norm" in p)         # LayerNorm: replicated everywhere
    position = _bytes(params, lambda p: "position" in p)  # (seq, embed): only 'embed' splits
    expected = {
        "dp": total,
        "fsdp": (total - norms) / n + norms,
        "tp": (total - norms - position) / n + norms + position,
        "dp+tp": (total - norms - position) / (n // 2) + norms + position,
        "fsdp+tp": (total - norms - position) / n + position / 2 + norms,
    }
    for name, r in steps.items():
        held = d2l.bytes_per_device(r["params"])
        assert len(held) == n, name
        assert set(held.values()) == {expected[name]}, name
    assert norms < total / 50  # the replicated part is small: the sharded layouts save memory
    for name in SHARDED:
        assert expected[name] < total / 2


def test_bytes_per_device_counts_replicated_and_split_arrays():
    mesh = d2l.device_mesh((2, -1))
    n = len(jax.devices())
    x = jax.device_put(np.zeros((8, 16), np.float32),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    r = jax.device_put(np.zeros(10, np.float32), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))
    held = d2l.bytes_per_device({"x": x, "r": r})
    assert set(held.values()) == {8 * 16 * 4 // 2 + 40} and len(held) == n


# --- the collectives the compiler inserted ---------------------------------------------------

def test_dp_needs_one_all_reduce_and_no_gathers(steps):
    c = steps["dp"]["collectives"]
    assert c["all-reduce"] >= 1 and c["all-gather"] == 0 and c["reduce-scatter"] == 0


def test_tp_all_reduces_partial_results(steps):
    c = steps["tp"]["collectives"]
    assert c["all-reduce"] >= 2  # at least one per row-split product, forward and backward


def test_fsdp_gathers_the_sharded_weights(steps):
    c = steps["fsdp"]["collectives"]
    assert c["all-gather"] + c["reduce-scatter"] >= 1
    assert steps["fsdp+tp"]["collectives"]["all-gather"] >= 1


# --- created sharded; restore target ---------------------------------------------------------

def test_created_model_is_sharded_and_no_device_holds_all_of_it(base_model):
    params = nnx.state(base_model, nnx.Param)
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    assert max(d2l.bytes_per_device(params).values()) < total / 4
    up = base_model.blocks[0].mlp.up.kernel[...]
    assert up.sharding.spec == jax.sharding.PartitionSpec("data", "model")
    assert {s.data.shape for s in up.addressable_shards} == {(D_MODEL // 2, D_FF // 4)}


def test_abstract_state_matches_the_created_model_without_arrays(model_fn, base_model):
    shape, rules = d2l.sharding_rules("fsdp+tp")
    target = d2l.abstract_state(model_fn, d2l.device_mesh(shape), rules)
    created = nnx.state(base_model)
    t_leaves, c_leaves = jax.tree.leaves(target), jax.tree.leaves(created)
    assert len(t_leaves) == len(c_leaves)
    for t, c in zip(t_leaves, c_leaves):
        assert isinstance(t, jax.ShapeDtypeStruct)
        assert (t.shape, t.dtype) == (c.shape, c.dtype)
        assert t.sharding.is_equivalent_to(c.sharding, len(c.shape))


def test_reshard_moves_the_values_to_another_layout(base_model):
    shape, rules = d2l.sharding_rules("dp")
    moved = d2l.reshard(base_model, d2l.device_mesh(shape), rules)
    a, b = nnx.state(base_model, nnx.Param), nnx.state(moved, nnx.Param)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert b["blocks"][0]["mlp"]["up"]["kernel"][...].sharding.is_fully_replicated


def test_training_the_mix_with_adam_lowers_the_loss(base_model, corpus):
    shape, rules = d2l.sharding_rules("fsdp+tp")
    mesh = d2l.device_mesh(shape)
    model = d2l.reshard(base_model, mesh, rules)
    with d2l.use_sharding(mesh, rules):
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        losses = [float(d2l.lm_train_step(model, optimizer,
                                          *d2l.shard_tokens(*corpus.batch(i), mesh, rules)))
                  for i in range(25)]
    assert losses[0] > np.log(len(corpus.vocab)) - 0.5  # starts near a uniform guess
    assert np.mean(losses[-5:]) < losses[0] - 1.0
    params = d2l.bytes_per_device(nnx.state(model, nnx.Param))
    adam = d2l.bytes_per_device(nnx.state(optimizer.opt_state))
    assert set(adam.values()) == {2 * max(params.values()) + 4}  # mu, nu; Adam's step counter


# --- the task --------------------------------------------------------------------------------

def test_char_corpus_batches_are_shifted_windows_of_the_text(corpus):
    X, Y = corpus.batch(3)
    assert X.shape == Y.shape == (BATCH, SEQ_LEN) and X.dtype == np.int32
    np.testing.assert_array_equal(X[:, 1:], Y[:, :-1])
    assert corpus.decode(X[0]) in TINY_TEXT
    np.testing.assert_array_equal(corpus.batch(3)[0], X)      # the same batch every time
    assert not np.array_equal(corpus.batch(4)[0], X)
    assert corpus.vocab_size % 8 == 0 and corpus.vocab_size >= len(corpus.vocab)
    assert corpus.decode(corpus.encode("Alice")) == "Alice"
    batches = list(corpus.batches(3))
    assert len(batches) == 3 and np.array_equal(batches[2][0], corpus.batch(2)[0])
    with pytest.raises(ValueError, match="num_batches"):
        next(corpus.batches(0))


# --- the memory calculator -------------------------------------------------------------------

def test_count_params_of_lenet():
    params = jax.eval_shape(d2l.init_lenet_params, jax.random.key(0))  # shapes only
    assert d2l.count_params(params) == (3 * 3 * 1 * 20 + 20 + 5 * 5 * 20 * 50 + 50
                                        + 800 * 128 + 128 + 128 * 10 + 10)


@pytest.mark.parametrize("layers,d,heads,T,V", [(2, 64, 8, 32, 48), (3, 40, 4, 7, 100)])
def test_transformer_footprint_counts_the_parameters_of_the_model(layers, d, heads, T, V):
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: d2l.TransformerLM(V, T, d, heads, layers,
                                                         rngs=nnx.Rngs(0)))
    n = d2l.count_params(nnx.state(model, nnx.Param))
    assert n == layers * (12 * d * d + 4 * d) + 2 * V * d + T * d + 2 * d  # the notebook's N
    assert transformer_footprint(layers, d, heads, T, 4, V)[0] == n


def test_saved_activation_bytes_counts_residuals_not_arguments():
    W, V, x = jnp.ones((3, 5)), jnp.ones((5, 2)), jnp.ones((4, 3))
    assert d2l.saved_activation_bytes(lambda W, x: jnp.sum(x @ W), W, x) == 0
    # sin keeps cos(x @ W) for its derivative: one 4 x 5 array
    assert d2l.saved_activation_bytes(lambda W, x: jnp.sum(jnp.sin(x @ W)), W, x) == 4 * 5 * 4
    # ... and sin(x @ W) too, the input of the second product
    two = lambda W, V, x: jnp.sum(jnp.sin(x @ W) @ V)
    assert d2l.saved_activation_bytes(two, W, V, x) == 2 * 4 * 5 * 4
    abstract = [jax.ShapeDtypeStruct(a.shape, jnp.bfloat16) for a in (W, V, x)]
    assert d2l.saved_activation_bytes(two, *abstract) == 2 * 4 * 5 * 2
    relu = lambda W, x: jnp.sum(jax.nn.relu(x @ W))  # keeps a boolean mask: 1 byte a value
    assert d2l.saved_activation_bytes(relu, W, x) >= 4 * 5


def _traced_activations(L, d, h, T, B, V, remat=False):
    with nnx.use_eager_sharding(False):
        graphdef, state = nnx.split(nnx.eval_shape(
            lambda: d2l.TransformerLM(V, T, d, h, L, remat=remat, rngs=nnx.Rngs(0))))
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    loss = lambda s, X: d2l.lm_loss(nnx.merge(graphdef, s), X, X)
    return d2l.saved_activation_bytes(loss, state, tokens)


def test_transformer_footprint_extrapolates_exactly():
    size = (4, 32, 4, 16, 4, 16)
    assert transformer_footprint(*size)[1] == _traced_activations(*size)


def test_rematerialisation_keeps_less_and_adds_one_block():
    size = (4, 32, 4, 64, 4, 16)
    plain = transformer_footprint(*size)[1]
    remat = transformer_footprint(*size, remat=True)[1]
    one_block = (_traced_activations(2, *size[1:]) - _traced_activations(1, *size[1:]))
    assert remat == _traced_activations(*size, remat=True) + one_block
    assert remat < plain / 2


def test_activations_grow_with_the_batch_and_faster_than_the_sequence():
    base = transformer_footprint(2, 64, 8, 32, 16, 48)[1]
    assert transformer_footprint(2, 64, 8, 32, 32, 48)[1] == pytest.approx(2 * base,
                                                                              rel=0.01)
    assert transformer_footprint(2, 64, 8, 64, 16, 48)[1] > 2.2 * base  # attention: T^2


def test_training_memory_adds_the_four_parts():
    m = d2l.training_memory(1000, activation_bytes=500)
    assert m == {"parameters": 4000, "gradients": 4000, "optimizer state": 8000,
                 "activations": 500, "total": 16500}
    assert d2l.training_memory(1000, 0, optimizer="sgd")["total"] == 8000
    assert d2l.training_memory(1000, 0, "momentum", bytes_per_value=2)["total"] == 6000
    sharded = d2l.training_memory(1000, 800, param_shards=8, batch_shards=4)
    assert sharded["total"] == 16000 / 8 + 800 / 4
    with pytest.raises(ValueError, match=r"unknown optimizer 'lion'.*'adam'"):
        d2l.training_memory(1000, optimizer="lion")
    with pytest.raises(ValueError, match="param_shards must be"):
        d2l.training_memory(1000, param_shards=0)
    with pytest.raises(ValueError, match="activation_bytes"):
        d2l.training_memory(1000, activation_bytes=-1)
    with pytest.raises(ValueError, match="num_layers must be a positive integer"):
        transformer_footprint(0, 64, 8, 32, 16, 48)


# --- the notebooks define the constants they use ----------------------------------------------

LIBRARY = sorted(f"d2l_multi.{p.stem}" for p in pathlib.Path(d2l.__file__).parent.glob("*.py")
                 if not p.stem.startswith("_") and p.stem != "mp_train")


def test_constants_in_the_notebooks_equal_the_library():
    import ast
    import importlib
    import json
    import pathlib
    chapters = pathlib.Path(__file__).resolve().parent.parent / "chapters"
    found = set()
    for nb in sorted(chapters.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or not src.startswith("#@save"):
                continue
            for node in ast.parse(src).body:
                if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                        and node.targets[0].id.isupper()):
                    name = node.targets[0].id
                    module = next(m for m in map(importlib.import_module, LIBRARY)
                                  if name in vars(m))
                    shown = eval(ast.unparse(node.value), vars(module))  # in the module's names
                    assert shown == getattr(module, name), (nb, name)
                    found.add(name)
    assert found >= {"OPTIMIZER_STATE_COPIES", "LOGICAL_AXES", "STRATEGIES", "COLLECTIVES"}


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["training_memory", "transformer_footprint",
                                  "use_sharding", "abstract_state", "create_sharded",
                                  "sharding_rules", "reshard", "shard_tokens"])
def test_the_public_name_checks_then_runs_the_shown_function(name):
    """The chapter shows these functions without argument checks; the library's public
    names check first (check.validated), so bad input still gets a clear message."""
    import inspect
    public = transformer_footprint if name == "transformer_footprint" else getattr(d2l, name)
    shown = inspect.unwrap(public)
    assert shown is not public and "check" not in inspect.getsource(shown)


def test_mesh_whose_sizes_do_not_multiply_to_the_device_count():
    n = len(jax.devices())
    assert list(d2l.device_mesh((3, 2)).devices.flat) == jax.devices()[:6]  # the first 6
    with pytest.raises(ValueError, match=f"asked for 16 devices but JAX sees only {n}"):
        d2l.device_mesh((4, 4))
    with pytest.raises(ValueError) as e:
        d2l.device_mesh((3, 2), devices=jax.devices())
    message = str(e.value)
    assert f"(3, 2) needs 6 devices but there are {n}" in message
    assert f"(2, {n // 2})" in message and "-1" in message
    with pytest.raises(ValueError, match="needs a multiple of 3"):
        d2l.device_mesh((3, -1))
    with pytest.raises(ValueError, match="one size per name"):
        d2l.device_mesh((2, 2, 2))
    assert d2l.device_mesh((2, -1)).shape == {"data": 2, "model": n // 2}


def test_rule_naming_a_mesh_axis_that_does_not_exist(model_fn):
    shape, rules = d2l.sharding_rules("tp")
    mesh = d2l.device_mesh(shape)
    with pytest.raises(ValueError) as e:
        d2l.create_sharded(model_fn, mesh, {**rules, "mlp": "tensor"})
    message = str(e.value)
    assert "'mlp': 'tensor'" in message and "('data', 'model')" in message
    assert "None to replicate" in message
    with pytest.raises(ValueError, match="'tensor'"):
        d2l.use_sharding(mesh, {**rules, "heads": ("model", "tensor")}).__enter__()


def test_logical_axis_without_a_rule(model_fn):
    shape, rules = d2l.sharding_rules("tp")
    del rules["mlp"]
    with pytest.raises(ValueError, match=r"\['mlp'\].*logical axis 'mlp'.*add 'mlp': None"):
        d2l.abstract_state(model_fn, d2l.device_mesh(shape), rules)


def test_dimension_not_divisible_by_its_mesh_axis(corpus):
    shape, rules = d2l.sharding_rules("fsdp")
    bad = lambda: d2l.TransformerLM(corpus.vocab_size, SEQ_LEN, 60, 6, 1, rngs=nnx.Rngs(0))
    n = len(jax.devices())
    with pytest.raises(ValueError, match=rf"parameter \[.*size 60.*multiple of {n}, e\.g\. "
                                         rf"{60 - 60 % n} or {60 - 60 % n + n}"):
        d2l.create_sharded(bad, d2l.device_mesh(shape), rules)


def test_batch_not_divisible_and_unknown_strategy(corpus):
    shape, rules = d2l.sharding_rules("dp")
    X, Y = corpus.batch(0)
    with pytest.raises(ValueError, match=r"size 12.*multiple of 8"):
        d2l.shard_tokens(X[:12], Y[:12], d2l.device_mesh(shape), rules)
    with pytest.raises(ValueError, match=r"unknown strategy 'zero3'.*'fsdp'"):
        d2l.sharding_rules("zero3")
    with pytest.raises(ValueError, match="too few"):
        d2l.CharCorpus(seq_len=5000)
