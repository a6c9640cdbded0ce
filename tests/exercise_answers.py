"""Answers to the self-checking exercises (d2l_multi/exercises/): a reference solution of each
check, as a notebook's ``## Solutions`` would show it, and plausible wrong answers, each with
the words of the hint it must get. tests/test_exercises.py runs them; they stay with the tests,
out of the package students install."""
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


# ----- 00 -----
def place(x, mesh):
    return jax.device_put(x, NamedSharding(mesh, P("x", "y")))


# ----- 01 -----
def cross_entropy(logits, y):
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def sgd(params, grads, lr):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


# ----- 02 -----
def broadcast(x, axis_name):
    return lax.psum(jnp.where(lax.axis_index(axis_name) == 0, x, 0.0), axis_name)


def reduce_scatter(x, axis_name):
    k, i = lax.axis_size(axis_name), lax.axis_index(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    chunks = x.reshape(k, -1)
    for s in range(1, k):  # step s: send the running sum of chunk i - s, add the one received
        received = lax.ppermute(chunks[(i - s) % k], axis_name, right)
        chunks = chunks.at[(i - s - 1) % k].add(received)
    return chunks[i]


def all_gather(x, axis_name):
    k, i = lax.axis_size(axis_name), lax.axis_index(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    chunks = jnp.zeros((k, *x.shape), x.dtype).at[i].set(x)
    for s in range(k - 1):  # step s: pass on the chunk of device i - s
        received = lax.ppermute(chunks[(i - s) % k], axis_name, right)
        chunks = chunks.at[(i - s - 1) % k].set(received)
    return chunks.reshape(-1)


def ring_allreduce(x, axis_name):
    k = lax.axis_size(axis_name)
    padded = jnp.pad(x.reshape(-1), (0, -x.size % k))
    total = all_gather(reduce_scatter(padded, axis_name), axis_name)
    return total[:x.size].reshape(x.shape)


def few_step_allreduce(x, axis_name):
    k = lax.axis_size(axis_name)
    step = 1
    while step < k:  # exchange everything summed so far with the partner i XOR step
        x = x + lax.ppermute(x, axis_name, [(j, j ^ step) for j in range(k)])
        step *= 2
    return x


# ----- 03 -----
def split_batch(X, y, num_devices):
    if len(X) % num_devices:
        raise ValueError(f"batch size {len(X)} does not divide over {num_devices} devices")
    return (X.reshape(num_devices, -1, *X.shape[1:]),
            y.reshape(num_devices, -1, *y.shape[1:]))


def data_parallel_step(params, X, y, loss_fn, lr):
    grads = lax.pmean(jax.grad(loss_fn)(params, X, y), axis_name="devices")
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def accumulated_step(params, X, y, loss_fn, lr, num_micro):
    grads = jax.tree.map(jnp.zeros_like, params)
    for Xm, ym in zip(jnp.split(X, num_micro), jnp.split(y, num_micro)):
        grads = jax.tree.map(jnp.add, grads, jax.grad(loss_fn)(params, Xm, ym))
    return jax.tree.map(lambda p, g: p - lr * g / num_micro, params, grads)


# ----- 04a, 04b -----
def place_for_jit(params, X, y, mesh):
    return (jax.device_put(params, NamedSharding(mesh, P())),
            *jax.device_put((X, y), NamedSharding(mesh, P("data"))))


def global_grad(params, X, y, loss_fn):
    return jax.grad(lambda p: lax.pmean(loss_fn(p, X, y), "data"))(params)


# ----- 05a, 05b, 05c -----
def accumulated_nnx_step(model, optimizer, X, y, m):
    from flax import nnx

    def loss_fn(model, X, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(X), y).mean()
    loss, grads = 0.0, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    for i in range(m):  # micro-batch i: rows i, i + m, ..., some on every device
        loss_i, grads_i = nnx.value_and_grad(loss_fn)(model, X[i::m], y[i::m])
        loss, grads = loss + loss_i / m, jax.tree.map(lambda a, b: a + b / m, grads, grads_i)
    optimizer.update(model, grads)
    return loss


def batch_stats(x, axis_name):
    mean = lax.pmean(x.mean(axis=0), axis_name)
    var = lax.pmean(((x - mean) ** 2).mean(axis=0), axis_name)
    return mean, var


def flops_per_gradient_byte(layers, batch_per_device):
    flops = sum(6 * batch_per_device * params * uses for params, uses in layers)
    return flops / (4 * sum(params for params, _ in layers))


# ----- 06 -----
def layout_map(device_mesh):
    import keras
    layouts = keras.distribution.LayoutMap(device_mesh)
    layouts["up/kernel"] = (None, "model")  # columns: each device its own hidden units
    layouts["up/bias"] = ("model",)
    layouts["down/kernel"] = ("model", None)  # rows: partial sums, one all-reduce
    return layouts


def _layout_map_wrong(device_mesh, specs):
    import keras
    layouts = keras.distribution.LayoutMap(device_mesh)
    for key, spec in specs.items():
        layouts[key] = spec
    return layouts


# ----- 07a, 07b, 07c -----
def allreduce_time(n, k, alpha, beta):
    return 2 * (k - 1) * alpha + 2 * (k - 1) / k * n * beta


def bus_bandwidth(collective, k, n, seconds):
    factor = {"psum": 2 * (k - 1) / k, "all_gather": (k - 1) / k,
              "psum_scatter": (k - 1) / k}[collective]
    return n / seconds * factor


def predict_step_time(compute_time, k, grad_bytes, alpha, beta):
    return compute_time / k + allreduce_time(grad_bytes, k, alpha, beta)


def mixed_step(master, grads, lr):
    master = master - lr * grads.astype(jnp.float32)
    return master, master.astype(jnp.bfloat16)


def count_lost(params, grads, lr, dtype):
    from jax.flatten_util import ravel_pytree
    p = ravel_pytree(params)[0].astype(dtype)
    g = ravel_pytree(grads)[0]
    u = (-lr * g).astype(dtype)  # may underflow to 0: lost too
    return int(jnp.sum((p + u == p) & (g != 0)))


def _count_lost_wrong(params, grads, lr, dtype, mistake):
    from jax.flatten_util import ravel_pytree
    p, g = ravel_pytree(params)[0], ravel_pytree(grads)[0]
    u = -lr * g
    if mistake != "float32":
        p, u = p.astype(dtype), u.astype(dtype)
    nonzero = {"float32": g != 0, "zeros": True, "underflow": u != 0,
               "gradient cast": g.astype(dtype) != 0}[mistake]
    return int(jnp.sum((p + u == p) & nonzero))


# ----- 07d -----
def ring_sum(parts):
    total = parts[0]
    for p in parts[1:]:  # one hop: add in float32, send the running sum in bfloat16
        total = (total.astype(jnp.float32) + p).astype(jnp.bfloat16)
    return total


def allreduce_bf16_gather(x, axis_name):
    chunk = lax.psum_scatter(x.astype(jnp.float32), axis_name, tiled=True)
    return lax.all_gather(chunk.astype(jnp.bfloat16), axis_name, tiled=True)


# ----- 08 -----
def ensemble_probs(logits):
    return jax.nn.softmax(logits, axis=-1).mean(axis=0)


# ----- 09a -----
def bytes_per_device(num_params, activation_bytes, k, strategy):
    state = 16 * num_params  # float32 parameter, gradient and Adam's two moments
    param_shards, batch_shards = {"dp": (1, k), "fsdp": (k, k), "tp": (k, 1)}[strategy]
    return state / param_shards + activation_bytes / batch_shards


def activation_bytes(num_layers, input_bytes, inside_bytes, remat):
    if remat:
        return num_layers * input_bytes + inside_bytes
    return num_layers * (input_bytes + inside_bytes)


# ----- 09b, 09c -----
rules = {"batch": "data", "embed": None, "heads": "model", "mlp": "model", "vocab": "model"}
fsdp_spec = P("data", None)
megatron_specs = (P(None, "model"), P("model", None))


# ----- 09d: ZeRO-1 with Adam, sequence parallelism -----
def zero1_adam(params, state, X, Y, loss_fn):
    k, i = lax.axis_size("data"), lax.axis_index("data")
    grads = [lax.psum_scatter(g, "data", tiled=True) / k
             for g in jax.grad(loss_fn)(params, X, Y)]
    rows = [lax.dynamic_slice_in_dim(w, i * len(g), len(g)) for w, g in zip(params, grads)]
    updates, state = optax.adam(0.01).update(grads, state)
    return [lax.all_gather(w + u, "data", tiled=True) for w, u in zip(rows, updates)], state


def sp_mlp(x, W1, W2):
    x = lax.all_gather(x, "model", tiled=True)
    return lax.psum_scatter(jax.nn.gelu(x @ W1) @ W2, "model", tiled=True)


# ----- 09d, 09e -----
def split_stages(costs, p):
    @functools.cache
    def best(i, stages):  # (slowest stage, counts) for blocks i, ... on that many stages
        if stages == 1:
            return sum(costs[i:]), (len(costs) - i,)
        splits = []
        for j in range(i + 1, len(costs) - stages + 2):  # the first stage runs blocks i..j-1
            slowest, counts = best(j, stages - 1)
            splits.append((max(sum(costs[i:j]), slowest), (j - i, *counts)))
        return min(splits)
    return list(best(0, p)[1])


def overlapped_step_time(backward, comm, num_buckets):
    if comm <= backward:
        return backward + comm / num_buckets
    return backward / num_buckets + comm


# ----- 10a, 10b -----
def fsdp_target(shapes, mesh):
    k = mesh.shape["data"]

    def place(x):  # split the last axis that k divides, else replicate
        axes = [i for i, n in enumerate(x.shape) if n % k == 0]
        spec = P(*[None] * axes[-1], "data") if axes else P()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))
    return jax.tree.map(place, shapes)


def _fsdp_target_wrong(shapes, mesh, mistake):
    def place(x):
        sharding = {"saved specs": NamedSharding(mesh, x.sharding.spec),
                    "axis 0": NamedSharding(mesh, P("data") if x.ndim else P()),
                    "replicated": NamedSharding(mesh, P()),
                    "saved mesh": x.sharding,
                    "own mesh": NamedSharding(jax.sharding.Mesh(mesh.devices.reshape(-1),
                                                                ("data",)), P())}[mistake]
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    return jax.tree.map(place, shapes)


def save_position(iterator):
    return iterator.get_state()


def resume(make_iterator, saved):
    iterator = make_iterator()
    iterator.set_state(saved)
    return iterator


# ----- 11a, 11b -----
def process_rows(batch_size, num_processes, process_index):
    local = batch_size // num_processes
    return range(process_index * local, (process_index + 1) * local)


def checkpoint_interval(save_seconds, device_mtbf_seconds, num_devices):
    return math.sqrt(2 * save_seconds * device_mtbf_seconds / num_devices)


# ----- 12_capstone -----
capstone_rules = {"batch": "data", "embed": "data",
                  "heads": "model", "mlp": "model", "vocab": "model"}


def _capstone_bytes(config, mesh_shape, rules, norms=True):
    size = dict(zip(("data", "model"), mesh_shape))
    V, T, d = (config[k] for k in ("vocab_size", "seq_len", "d_model"))
    h, L = config["num_heads"], config["num_layers"]
    arrays = [[(V, "vocab"), (d, "embed")], [(T, None), (d, "embed")],
              [(d, "embed"), (V, "vocab")]] + [[(d, None)]] * (2 + 4 * L) * norms
    for _ in range(L):
        arrays += [[(d, "embed"), (h, "heads"), (d // h, None)]] * 3 + [
            [(h, "heads"), (d // h, None), (d, "embed")],
            [(d, "embed"), (4 * d, "mlp")], [(4 * d, "mlp"), (d, "embed")]]

    def tile(n, name):
        axes = rules.get(name) if name else None
        axes = (axes,) if isinstance(axes, str) else axes or ()
        return n // math.prod(size[a] for a in axes)
    return 4 * 4 * sum(math.prod(tile(*dim) for dim in a) for a in arrays)


def predict_bytes(config, mesh_shape, rules):
    return _capstone_bytes(config, mesh_shape, rules)


def capstone_train(model_fn, mesh, rules, batches, optimizer=None, text="compiled"):
    from flax import nnx

    import d2l_multi as d2l
    model = d2l.create_sharded(model_fn, mesh, rules)
    with d2l.use_sharding(mesh, rules):
        opt = nnx.Optimizer(model, optimizer or optax.adam(1e-3), wrt=nnx.Param)
        batches = [d2l.shard_tokens(X, Y, mesh, rules) for X, Y in batches]
        lowered = d2l.lm_train_step.lower(model, opt, *batches[0])
        step = lowered.compile()
        losses = [float(step(model, opt, X, Y)) for X, Y in batches]
    hlo = step.as_text() if text == "compiled" else lowered.as_text()
    return losses, nnx.state(model, nnx.Param), hlo


def uses_all_gather(rules):
    return rules.get("embed") is not None


REFERENCE = {
    "devices.mesh_layout": (place,),
    "lenet_from_scratch.cross_entropy": (cross_entropy,),
    "lenet_from_scratch.sgd_update": (sgd,),
    "allreduce.broadcast": (broadcast,),
    "allreduce.reduce_scatter": (reduce_scatter,),
    "allreduce.all_gather": (all_gather,),
    "allreduce.ring_allreduce": (ring_allreduce,),
    "allreduce.few_steps": (few_step_allreduce,),
    "data_parallel_from_scratch.split_batch": (split_batch,),
    "data_parallel_from_scratch.pmean_step": (data_parallel_step,),
    "data_parallel_from_scratch.grad_accumulation": (accumulated_step,),
    "jit_and_shardings.jit_data_parallel": (place_for_jit,),
    "shard_map.shard_map_grad": (global_grad,),
    "flax.nnx_accumulation": (accumulated_nnx_step,),
    "batchnorm.batch_stats": (batch_stats,),
    "resnet.flops_per_byte": (flops_per_gradient_byte,),
    "keras.model_parallel": (layout_map,),
    "collectives.alpha_beta": (allreduce_time,),
    "collectives.bus_bandwidth": (bus_bandwidth,),
    "predicting_steps.step_time": (predict_step_time,),
    "mixed_precision.master_weights": (mixed_step,),
    "mixed_precision.lost_updates": (count_lost,),
    "low_precision_communication.ring_sum": (ring_sum,),
    "low_precision_communication.bf16_gather": (allreduce_bf16_gather,),
    "ensembles.ensemble_average": (ensemble_probs,),
    "memory.training_memory": (bytes_per_device,),
    "remat.remat_memory": (activation_bytes,),
    "meshes_and_rules.logical_rules": (rules,),
    "fsdp_and_tensor_parallelism.fsdp_spec": (fsdp_spec,),
    "fsdp_and_tensor_parallelism.megatron_specs": (megatron_specs,),
    "fsdp_and_tensor_parallelism.zero1_adam": (zero1_adam,),  # 09d
    "fsdp_and_tensor_parallelism.sp_mlp": (sp_mlp,),  # 09d
    "pipeline_parallelism.balanced_stages": (split_stages,),
    "overlapping_communication.overlapped_step": (overlapped_step_time,),
    "checkpoints.fsdp_restore": (fsdp_target,),
    "input_pipelines.exact_resume": (save_position, resume),
    "multi_process.process_rows": (process_rows,),
    "failures.checkpoint_interval": (checkpoint_interval,),
    # 12_capstone
    "capstone.rules_2d": (capstone_rules,),
    "capstone.memory_prediction": (predict_bytes,),
    "capstone.sharded_training": (capstone_train, uses_all_gather),
}


# ----- other right answers: designs other than the reference's that must pass too -----

def _zero1_adam_all_to_all(params, state, X, Y, loss_fn):
    """Sums the gradients' row blocks with an all-to-all and a local sum: a reduce-scatter's
    values and bytes."""
    k, i = lax.axis_size("data"), lax.axis_index("data")
    grads = [lax.all_to_all(g.reshape(k, len(g) // k, -1), "data", 0, 0).sum(0) / k
             for g in jax.grad(loss_fn)(params, X, Y)]
    rows = [lax.dynamic_slice_in_dim(w, i * len(g), len(g)) for w, g in zip(params, grads)]
    updates, state = optax.adam(0.01).update(grads, state)
    return [lax.all_gather(w + u, "data", tiled=True) for w, u in zip(rows, updates)], state


def _zero1_adam_counting_devices(params, state, X, Y, loss_fn):
    """k counted at run time: a scalar allreduce of 4 bytes."""
    k, i = lax.psum(jnp.ones(()), "data"), lax.axis_index("data")
    grads = [lax.psum_scatter(g, "data", tiled=True) / k
             for g in jax.grad(loss_fn)(params, X, Y)]
    rows = [lax.dynamic_slice_in_dim(w, i * len(g), len(g)) for w, g in zip(params, grads)]
    updates, state = optax.adam(0.01).update(grads, state)
    return [lax.all_gather(w + u, "data", tiled=True) for w, u in zip(rows, updates)], state


def _sp_mlp_all_to_all(x, W1, W2):
    k = lax.axis_size("model")
    partial = jax.nn.gelu(lax.all_gather(x, "model", tiled=True) @ W1) @ W2
    return lax.all_to_all(partial.reshape(k, -1, partial.shape[1]), "model", 0, 0).sum(0)


def _sp_mlp_counting_devices(x, W1, W2):
    k = lax.psum(jnp.ones(()), "model")  # a scalar allreduce
    y = lax.psum_scatter(jax.nn.gelu(lax.all_gather(x, "model", tiled=True) @ W1) @ W2,
                         "model", tiled=True)
    return y / k * lax.axis_size("model")


ALSO_RIGHT = {
    "fsdp_and_tensor_parallelism.zero1_adam": [(_zero1_adam_all_to_all,),
                                               (_zero1_adam_counting_devices,)],
    "fsdp_and_tensor_parallelism.sp_mlp": [(_sp_mlp_all_to_all,), (_sp_mlp_counting_devices,)],
}


# ----- wrong answers: (answers, words of the hint) -----

def _naive_cross_entropy(logits, y):
    probs = jnp.exp(logits) / jnp.exp(logits).sum(axis=1, keepdims=True)
    return -jnp.mean(jnp.log(probs[jnp.arange(len(y)), y]))


def _psum_step(params, X, y, loss_fn, lr):
    grads = lax.psum(jax.grad(loss_fn)(params, X, y), axis_name="devices")
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def _local_step(params, X, y, loss_fn, lr):
    grads = jax.grad(loss_fn)(params, X, y)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def _summed_accumulation(params, X, y, loss_fn, lr, num_micro):
    grads = jax.tree.map(jnp.zeros_like, params)
    for Xm, ym in zip(jnp.split(X, num_micro), jnp.split(y, num_micro)):
        grads = jax.tree.map(jnp.add, grads, jax.grad(loss_fn)(params, Xm, ym))
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def _stepwise_accumulation(params, X, y, loss_fn, lr, num_micro):
    for Xm, ym in zip(jnp.split(X, num_micro), jnp.split(y, num_micro)):
        params = jax.tree.map(lambda p, g: p - lr * g, params,
                              jax.grad(loss_fn)(params, Xm, ym))
    return params


def _reduce_scatter_one_ahead(x, axis_name):  # the library's ring: device i owns chunk i + 1
    k, i = lax.axis_size(axis_name), lax.axis_index(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    chunks = x.reshape(k, -1)
    for s in range(k - 1):
        received = lax.ppermute(chunks[(i - s) % k], axis_name, right)
        chunks = chunks.at[(i - s - 1) % k].add(received)
    return chunks[(i + 1) % k]


def _reduce_scatter_short(x, axis_name):  # one step too few
    k, i = lax.axis_size(axis_name), lax.axis_index(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    chunks = x.reshape(k, -1)
    for s in range(1, k - 1):
        received = lax.ppermute(chunks[(i - s) % k], axis_name, right)
        chunks = chunks.at[(i - s - 1) % k].add(received)
    return chunks[i]


def _reduce_scatter_wrong_chunk(x, axis_name):  # k - 1 steps, but returns a partial sum
    k, i = lax.axis_size(axis_name), lax.axis_index(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    chunks = x.reshape(k, -1)
    for s in range(k - 1):
        received = lax.ppermute(chunks[(i - s) % k], axis_name, right)
        chunks = chunks.at[(i - s - 1) % k].add(received)
    return chunks[i]


def _butterfly_same_partner(x, axis_name):  # always the same partner: 2 devices' values
    k = lax.axis_size(axis_name)
    for _ in range(3):
        x = x + lax.ppermute(x, axis_name, [(j, j ^ 1) for j in range(k)])
    return x / 4


def _butterfly_averaged(x, axis_name):
    return few_step_allreduce(x, axis_name) / lax.axis_size(axis_name)


def _all_gather_by_receiver(x, axis_name):  # places chunks by step, not by origin
    k = lax.axis_size(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    parts, current = [x], x
    for _ in range(k - 1):
        current = lax.ppermute(current, axis_name, right)
        parts.append(current)
    return jnp.concatenate(parts)


def _allreduce_reduce_scatter_only(x, axis_name):
    k, i = lax.axis_size(axis_name), lax.axis_index(axis_name)
    chunks = x.reshape(k, -1)
    return chunks.at[i].set(reduce_scatter(x, axis_name)).reshape(x.shape)


def _allreduce_no_pad(x, axis_name):
    return all_gather(reduce_scatter(x, axis_name), axis_name)


# ----- 09d: ZeRO-1 with Adam, sequence parallelism -----
def _zero1_adam_with(mistake):
    """zero1_adam with one plausible mistake."""
    def step(params, state, X, Y, loss_fn):
        k, i = lax.axis_size("data"), lax.axis_index("data")
        grads = []
        for w, g in zip(params, jax.grad(loss_fn)(params, X, Y)):
            r = len(w) // k
            if mistake == "psum":  # the whole gradient, then its rows
                g = lax.dynamic_slice_in_dim(lax.psum(g, "data") / k, i * r, r)
            elif mistake == "whole":  # every device updates the whole parameter
                g = lax.psum(g, "data") / k
            elif mistake == "gathered grads":  # all gradients to every device, then rows
                g = lax.dynamic_slice_in_dim(lax.all_gather(g, "data").sum(0) / k, i * r, r)
            else:
                g = lax.psum_scatter(g, "data", tiled=mistake != "untiled")
                g = g / {"sum": 1, "by 8": 8}.get(mistake, k)
            grads.append(g)
        rows = [w if mistake == "whole" else w[:len(w) // k] if mistake == "first rows"
                else lax.dynamic_slice_in_dim(w, i * (len(w) // k), len(w) // k)
                for w in params]
        if mistake == "W2 first rows":
            rows[1] = params[1][:len(params[1]) // k]
        if mistake == "state split again":  # as if each device had the whole moments
            state = jax.tree.map(lambda a: lax.dynamic_slice_in_dim(
                a, i * (len(a) // k), len(a) // k) if a.ndim else a, state)
        updates, new_state = optax.adam(0.01).update(grads, state)
        if mistake == "gathered state":
            new_state = jax.tree.map(
                lambda a: lax.all_gather(a, "data", tiled=True) if a.ndim else a, new_state)
        new = [w + u for w, u in zip(rows, updates)]
        if mistake != "no gather":
            new = [lax.all_gather(w, "data", tiled=True) for w in new]
        return new, (state if mistake == "old state" else new_state)
    return step


def _sp_mlp_with(mistake):
    """sp_mlp with one plausible mistake."""
    def mlp(x, W1, W2):
        k, i = lax.axis_size("model"), lax.axis_index("model")
        if mistake == "by 8":  # the number of devices of the notebook's mesh
            x = lax.all_gather(x, "model").reshape(8 * x.shape[0], x.shape[1])
            return lax.psum_scatter(jax.nn.gelu(x @ W1) @ W2, "model", tiled=True)
        if mistake == "exact gelu":
            x = lax.all_gather(x, "model", tiled=True)
            hidden = jax.nn.gelu(x @ W1, approximate=False)
            return lax.psum_scatter(hidden @ W2, "model", tiled=True)
        if mistake == "gathered weights":
            W1 = lax.all_gather(W1, "model", axis=1, tiled=True)
            return jax.nn.gelu(x @ W1) @ lax.all_gather(W2, "model", tiled=True)
        if mistake not in ("no gather", "scatter without gather"):
            x = lax.all_gather(x, "model", tiled=mistake != "untiled gather")
        partial = jax.nn.gelu(x @ W1) @ W2
        if mistake in ("psum", "no gather"):
            return lax.psum(partial, "model")
        mine = len(partial) // k
        if mistake == "psum then slice":
            return lax.dynamic_slice_in_dim(lax.psum(partial, "model"), i * mine, mine)
        if mistake == "gathered partials":  # an allreduce by another route
            total = lax.all_gather(partial, "model").sum(0)
            return lax.dynamic_slice_in_dim(total, i * mine, mine)
        if mistake == "no sum":  # its own tokens of its own partial sums
            return lax.dynamic_slice_in_dim(partial, i * mine, mine)
        return lax.psum_scatter(partial, "model", tiled=True)
    return mlp


def _loop_forever(*args):
    while True:
        pass


WRONG = {
    "devices.mesh_layout": [
        (((lambda x, mesh: jax.device_put(x, NamedSharding(mesh, P()))),), "replicated"),
        (((lambda x, mesh: jax.device_put(x, NamedSharding(mesh, P("x")))),), "not the columns"),
        (((lambda x, mesh: jax.device_put(x, jax.devices()[0])),), "lives on one device"),
        (((lambda x, mesh: np.asarray(x)),), "jax.device_put"),
    ],
    "lenet_from_scratch.cross_entropy": [
        ((_naive_cross_entropy,), "exp overflows"),
        (((lambda logits, y: -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits),
                                                         y[:, None], 1))),), "average over"),
        (((lambda logits, y: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, axis=0),
                                                          y[:, None], 1))),), "batch axis"),
    ],
    "lenet_from_scratch.sgd_update": [
        (((lambda params, grads, lr: jax.tree.map(lambda p, g: p + lr * g, params, grads)),),
         "climbs the loss"),
        (((lambda params, grads, lr: jax.tree.map(lambda p, g: p - g, params, grads)),),
         "ignores the learning rate"),
    ],
    "allreduce.broadcast": [
        (((lambda x, axis_name: lax.psum(x, axis_name)),), "sum of all 8"),
        (((lambda x, axis_name: lax.pmean(jnp.where(lax.axis_index(axis_name) == 0, x, 0.0),
                                         axis_name)),), "1/8 of device 0"),
        (((lambda x, axis_name: x),), "nothing was communicated"),
    ],
    "allreduce.reduce_scatter": [
        (((lambda x, axis_name: lax.psum_scatter(x, axis_name, tiled=True)),),
         "lax.ppermute alone"),
        ((_reduce_scatter_one_ahead,), "chunk i+1"),
        ((_reduce_scatter_short,), "takes 6 steps"),
        ((_reduce_scatter_wrong_chunk,), "the one it added last"),
        (((lambda x, axis_name: x),), "all 8 chunks"),
    ],
    "allreduce.all_gather": [
        (((lambda x, axis_name: lax.all_gather(x, axis_name, tiled=True)),), "lax.ppermute alone"),
        ((_all_gather_by_receiver,), "out of order"),
        (((lambda x, axis_name: jnp.zeros(x.size * lax.axis_size(axis_name), x.dtype).at[
            lax.axis_index(axis_name) * x.size + jnp.arange(x.size)].set(x)),), "zeros"),
    ],
    "allreduce.ring_allreduce": [
        (((lambda x, axis_name: lax.psum(x, axis_name)),), "lax.ppermute alone"),
        (((lambda x, axis_name: ring_allreduce(x, axis_name) / lax.axis_size(axis_name)),),
         "averaging is pmean"),
        ((_allreduce_reduce_scatter_only,), "the all-gather"),
    ],
    "allreduce.few_steps": [
        (((lambda x, axis_name: lax.psum(x, axis_name)),), "lax.ppermute alone"),
        ((ring_allreduce,), "runs 14 ppermutes"),
        ((_butterfly_same_partner,), "only 2 of the 8"),
        ((_butterfly_averaged,), "8\u00d7 too small"),
    ],
    "data_parallel_from_scratch.split_batch": [
        (((lambda X, y, k: (X.reshape(k, -1, *X.shape[1:]), y.reshape(k, -1))),),
         "fails inside a reshape"),
        (((lambda X, y, k: (X[:len(X) - len(X) % k].reshape(k, -1, *X.shape[1:]),
                           y[:len(y) - len(y) % k].reshape(k, -1))),), "silently lost 4"),
        (((lambda X, y, k: (np.stack([X[i::k] for i in range(k)]),
                           np.stack([y[i::k] for i in range(k)]))),), "consecutive blocks"),
        (((lambda X, y, k: (X.reshape(k, -1, *X.shape[1:]), y.reshape(k, -1)[::-1])
          if len(X) % k == 0 else split_batch(X, y, k)),), "labels no longer match"),
    ],
    "data_parallel_from_scratch.pmean_step": [
        ((_psum_step,), "8\u00d7 too large: did you psum instead of pmean?"),
        ((_local_step,), "devices disagree"),
        (((lambda params, X, y, loss_fn, lr: _psum_step(params, X, y, loss_fn, lr / 64)),),
         "8\u00d7 too small"),
    ],
    "data_parallel_from_scratch.grad_accumulation": [
        ((_summed_accumulation,), "4\u00d7 too large: you summed"),
        ((_stepwise_accumulation,), "updated after every micro-batch"),
    ],
    "jit_and_shardings.jit_data_parallel": [
        (((lambda params, X, y, mesh: jax.device_put((params, X, y),
                                                    NamedSharding(mesh, P()))),),
         "whole batch"),
        (((lambda params, X, y, mesh: (
            jax.device_put(params, NamedSharding(mesh, P("data"))),
            *jax.device_put((X, y), NamedSharding(mesh, P("data"))))),), "parameters are split"),
        (((lambda params, X, y, mesh: (
            jax.device_put(params, NamedSharding(mesh, P())),
            jax.device_put(X, NamedSharding(mesh, P(None, "data"))),
            jax.device_put(y, NamedSharding(mesh, P("data"))))),), "axis 1"),
        (((lambda params, X, y, mesh: (params, X, y)),), "host arrays"),
    ],
    "shard_map.shard_map_grad": [
        (((lambda params, X, y, loss_fn: jax.grad(
            lambda p: lax.psum(loss_fn(p, X, y), "data"))(params)),), "8\u00d7 too large"),
        (((lambda params, X, y, loss_fn: jax.grad(loss_fn)(params, X, y)),), "8\u00d7 too large"),
    ],
    "flax.nnx_accumulation": [
        (((lambda model, optimizer, X, y, m: _nnx_accumulation(model, optimizer, X, y, m,
                                                               "sum")),), "4\u00d7 too large"),
        (((lambda model, optimizer, X, y, m: _nnx_accumulation(model, optimizer, X, y, m,
                                                               "update each")),),
         "after each micro-batch"),
        (((lambda model, optimizer, X, y, m: _nnx_accumulation(model, optimizer, X, y, m,
                                                               "whole batch")),),
         "activations at once"),
        (((lambda model, optimizer, X, y, m: _nnx_accumulation(model, optimizer, X, y, m,
                                                               "consecutive")),),
         "moves examples between devices"),
        (((lambda model, optimizer, X, y, m: _nnx_accumulation(model, optimizer, X, y, m,
                                                               "no optimizer")),),
         "update through `optimizer.update(model, grads)`"),
        (((lambda model, optimizer, X, y, m: _nnx_accumulation(model, optimizer, X, y, m,
                                                               "no return")),),
         "returned None: return the mean loss of the batch"),
    ],
    "batchnorm.batch_stats": [
        (((lambda x, axis_name: (x.mean(0), x.var(0))),), "its own 4 examples"),
        (((lambda x, axis_name: (lax.pmean(x.mean(0), axis_name),
                                lax.pmean(x.var(0), axis_name))),), "spread between"),
        (((lambda x, axis_name: (lax.psum(x.mean(0), axis_name),
                                lax.pmean(x.var(0), axis_name))),), "psum adds"),
    ],
    "resnet.flops_per_byte": [
        (((lambda layers, b: flops_per_gradient_byte(layers, b) / 3),), "forward pass only"),
        (((lambda layers, b: flops_per_gradient_byte(layers, b) * 4),), "4 bytes"),
        (((lambda layers, b: 6 * b / 4),), "reuse"),
    ],
    "keras.model_parallel": [
        (((lambda mesh: _layout_map_wrong(mesh, {"up/kernel": (None, "model"),
                                                 "down/kernel": (None, "model")})),),
         "gathers the hidden layer"),
        (((lambda mesh: _layout_map_wrong(mesh, {"up/kernel": ("model", None),
                                                 "down/kernel": ("model", None)})),),
         "gathers the hidden layer"),
        (((lambda mesh: _layout_map_wrong(mesh, {"dense.*kernel": (None, "model")})),),
         "regular expressions of variable paths"),
        (((lambda mesh: _layout_map_wrong(mesh, {"up/kernel": ("batch", "model"),
                                                 "down/kernel": ("model", None)})),),
         "that axis splits the examples"),
        (((lambda mesh: {"up/kernel": (None, "model")}),), "build a keras.distribution"),
    ],
    "collectives.alpha_beta": [
        (((lambda n, k, alpha, beta: alpha + 2 * (k - 1) / k * n * beta),), "start-up alpha"),
        (((lambda n, k, alpha, beta: 2 * (k - 1) * alpha + 2 * (k - 1) * n * beta),),
         "8\u00d7 too large"),
        (((lambda n, k, alpha, beta: 2 * (k - 1) * alpha + (k - 1) / k * n * beta),),
         "twice"),
    ],
    "collectives.bus_bandwidth": [
        (((lambda collective, k, n, seconds: n / seconds),), "algorithm bandwidth"),
        (((lambda collective, k, n, seconds: n / seconds * 2 * (k - 1) / k),), "one phase"),
    ],
    "predicting_steps.step_time": [
        (((lambda t, k, g, alpha, beta: t + allreduce_time(g, k, alpha, beta)),),
         "divide the compute time by k"),
        (((lambda t, k, g, alpha, beta: t / k),), "no communication"),
    ],
    "mixed_precision.master_weights": [
        (((lambda master, grads, lr: (master.astype(jnp.bfloat16) - lr * grads,) * 2),),
         "keep them float32"),
        (((lambda master, grads, lr: ((master.astype(jnp.bfloat16) - lr * grads)
                                     .astype(jnp.float32), master.astype(jnp.bfloat16))),),
         "lost updates"),
    ],
    "mixed_precision.lost_updates": [
        (((lambda params, grads, lr, dtype: _count_lost_wrong(params, grads, lr, dtype,
                                                              "float32")),), "float32's"),
        (((lambda params, grads, lr, dtype: _count_lost_wrong(params, grads, lr, dtype,
                                                              "zeros")),),
         "counted zero gradients"),
        (((lambda params, grads, lr, dtype: _count_lost_wrong(params, grads, lr, dtype,
                                                              "underflow")),),
         "missed the updates that underflow"),
        (((lambda params, grads, lr, dtype: _count_lost_wrong(params, grads, lr, dtype,
                                                              "gradient cast")),),
         "test the float32 gradient for zero"),
    ],
    "low_precision_communication.ring_sum": [
        (((lambda parts: sum(p.astype(jnp.float32) for p in parts)),), "float32's"),
        (((lambda parts: sum(p.astype(jnp.float32) for p in parts).astype(jnp.bfloat16)),),
         "one rounding at the end"),
        (((lambda parts: ring_sum(parts) / len(parts)),), "too small"),
        (((lambda parts: ring_sum(parts[1:])),), "add each device's part once"),
        (((lambda parts: _ring_sum_every_other_hop(parts)),),
         "differ from a ring's by more than one bfloat16 rounding"),
    ],
    "low_precision_communication.bf16_gather": [
        (((lambda x, axis_name: lax.psum(x, axis_name)),), "you psum in bfloat16"),
        (((lambda x, axis_name: lax.psum(x.astype(jnp.float32), axis_name)
           .astype(jnp.bfloat16)),), "full bytes"),
        (((lambda x, axis_name: lax.all_gather(
            lax.psum_scatter(x, axis_name, tiled=True).astype(jnp.float32), axis_name,
            tiled=True)),), "the wrong way round"),
        (((lambda x, axis_name: lax.psum_scatter(x.astype(jnp.float32), axis_name,
                                                 tiled=True)),), "one lax.all_gather"),
        (((lambda x, axis_name: all_gather(reduce_scatter(x, axis_name), axis_name)),),
         "your reduce-scatter sends bfloat16"),
        (((lambda x, axis_name: all_gather(reduce_scatter(x.astype(jnp.float32), axis_name),
                                           axis_name)),), "your all-gather sends float32"),
    ],
    "ensembles.ensemble_average": [
        (((lambda logits: jax.nn.softmax(logits.mean(axis=0))),), "softmax first"),
        (((lambda logits: jax.nn.softmax(logits).mean(axis=1)),), "axis 1"),
        (((lambda logits: logits.mean(axis=0)),), "averaged the logits"),
    ],
    "memory.training_memory": [
        (((lambda P_, A, k, s: bytes_per_device(P_, A, k, s)
           - 8 * P_ / (1 if s == "dp" else k)),), "Adam's two moments"),
        (((lambda P_, A, k, s: 16 * P_ + A / k if s != "tp" else 16 * P_ / k + A),),
         "FSDP splits"),
        (((lambda P_, A, k, s: 16 * P_ / (1 if s == "dp" else k) + A / k),),
         "does not split the batch"),
    ],
    "remat.remat_memory": [
        (((lambda L, a, b, remat: L * a if remat else L * (a + b)),), "add one layer"),
        (((lambda L, a, b, remat: L * (a + b)),), "only each layer's input"),
    ],
    "meshes_and_rules.logical_rules": [
        ((dict(rules, embed="model"),), "Megatron keeps 'embed' whole"),
        ((dict(rules, batch=None),), "map 'batch' to 'data'"),
        (({k: v for k, v in rules.items() if k != "vocab"},), "missing ['vocab']"),
        ((dict(rules, mlp=None),), "'mlp' axis over 'model'"),
    ],
    "fsdp_and_tensor_parallelism.fsdp_spec": [
        ((P(),), "that is data parallelism"),
        ((P("model", None),), "one axis, 'data'"),
        ((P("data", "data"),), "names a mesh axis twice"),
        (("data",), "should be a jax.sharding.PartitionSpec"),
    ],
    "fsdp_and_tensor_parallelism.megatron_specs": [
        (((P("model", None), P(None, "model")),), "wrong way round"),
        (((P(None, "model"), P(None, "model")),), "all-gather between the layers"),
        (((P("model", None), P("model", None)),), "gelu(a + b)"),
        (((P(None, "model"), P()),), "W2 is replicated"),
    ],
    # 09d: ZeRO-1 with Adam, sequence parallelism
    "fsdp_and_tensor_parallelism.zero1_adam": [
        ((_zero1_adam_with("psum"),), "allreduces (lax.psum) the gradients"),
        ((_zero1_adam_with("sum"),), "first moment is 4\u00d7 too large"),
        ((_zero1_adam_with("by 8"),), "divide by k = lax.axis_size('data'), not a number"),
        ((_zero1_adam_with("gathered grads"),), "all-gathers whole gradients"),
        ((_zero1_adam_with("first rows"),), "holds old row block 0"),
        ((_zero1_adam_with("W2 first rows"),), "rows i\u00b75 to (i+1)\u00b75 of W2"),
        ((_zero1_adam_with("state split again"),), "already split by rows"),
        ((_zero1_adam_with("whole"),), "mixes whole parameters with the moments' rows"),
        ((_zero1_adam_with("gathered state"),), "a whole parameter's"),
        ((_zero1_adam_with("old state"),), "your state did not change"),
        ((_zero1_adam_with("no gather"),), "returned only its 3 rows of W1"),
        ((_zero1_adam_with("untiled"),), "psum_scatter cannot split a gradient"),
    ],
    "fsdp_and_tensor_parallelism.sp_mlp": [
        ((_sp_mlp_with("psum"),), "every device holds all 24 tokens"),
        ((_sp_mlp_with("psum then slice"),), "your program allreduces (lax.psum)"),
        ((_sp_mlp_with("no gather"),), "has no all-gather"),
        ((_sp_mlp_with("scatter without gather"),), "psum_scatter cannot split"),
        ((_sp_mlp_with("untiled gather"),), "tiled=False"),
        ((_sp_mlp_with("gathered weights"),), "gathering the weights is FSDP"),
        ((_sp_mlp_with("gathered partials"),), "an allreduce's bytes by another route"),
        ((_sp_mlp_with("no sum"),), "one all-gather and one reduce-scatter are needed"),
        ((_sp_mlp_with("by 8"),), "not a number"),
        ((_sp_mlp_with("exact gelu"),), "default tanh approximation"),
    ],
    "pipeline_parallelism.balanced_stages": [
        (((lambda costs, p: [len(costs) // p] * p),), "equal numbers of blocks"),
        (((lambda costs, p: [1] * (p - 1) + [len(costs) - p + 1]),), "move blocks off"),
        (((lambda costs, p: [len(costs) // p] * (p - 1)),), "return 4 block counts"),
        (((lambda costs, p: [0] + [len(costs) // (p - 1)] * (p - 1)),), "without blocks"),
    ],
    "overlapping_communication.overlapped_step": [
        (((lambda backward, comm, b: max(backward, comm)),), "perfect overlap is impossible"),
        (((lambda backward, comm, b: backward + comm),), "no overlap at all"),
        (((lambda backward, comm, b: backward + comm / b),), "the link is the bottleneck"),
    ],
    "checkpoints.fsdp_restore": [
        (((lambda shapes, mesh: _fsdp_target_wrong(shapes, mesh, "saved specs")),),
         "splits little or nothing"),
        (((lambda shapes, mesh: _fsdp_target_wrong(shapes, mesh, "axis 0")),),
         "does not divide into 8 blocks"),
        (((lambda shapes, mesh: _fsdp_target_wrong(shapes, mesh, "replicated")),),
         "split an axis of it that 8 divides"),
        (((lambda shapes, mesh: _fsdp_target_wrong(shapes, mesh, "saved mesh")),),
         "the mesh it was saved from"),
        (((lambda shapes, mesh: _fsdp_target_wrong(shapes, mesh, "own mesh")),),
         "a mesh {'data': 8} of 8 devices, not on the one you restore onto, "
         "{'data': 8, 'model': 1}: build"),
        (((lambda shapes, mesh: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)),),
         "you returned arrays"),
    ],
    "input_pipelines.exact_resume": [
        ((save_position, lambda make_iterator, saved: make_iterator()),
         "starts from the beginning"),
        ((lambda iterator: iterator, resume), "saved the iterator itself"),
    ],
    "multi_process.process_rows": [
        (((lambda b, n, p: range(p, b, n)),), "interleaved"),
        (((lambda b, n, p: range((p + 1) * (b // n), (p + 2) * (b // n))),), "off by one"),
        (((lambda b, n, p: range(b)),), "each loads"),
    ],
    "failures.checkpoint_interval": [
        (((lambda c, mtbf, n: math.sqrt(2 * c * mtbf)),), "fails 1000 times as often"),
        (((lambda c, mtbf, n: math.sqrt(c * mtbf / n)),), "\u221a2 too small"),
    ],
    # 12_capstone
    "capstone.rules_2d": [
        ((dict(capstone_rules, embed=None),), "split only over 'model'"),
        ((dict(capstone_rules, heads=None, mlp=None, vocab=None),), "not over 'model'"),
        (({"batch": "data", "embed": "model", "heads": "data", "mlp": "data",
           "vocab": "data"},), "the axes are swapped"),
        (({"batch": "data", "embed": ("data", "model"), "heads": None, "mlp": None,
           "vocab": None},), "FSDP over all 8 devices"),
        ((dict(capstone_rules, embed="model"),), "two of them to one mesh axis"),
    ],
    "capstone.memory_prediction": [
        (((lambda c, m, r: predict_bytes(c, m, r) // 2),), "Adam's two moments"),
        (((lambda c, m, r: predict_bytes(c, (1, 1), r) // 8),), "divided everything by"),
        (((lambda c, m, r: _capstone_bytes(c, m, r, norms=False)),), "LayerNorms"),
        (((lambda c, m, r: predict_bytes(c, m, r) // 4),), "count the gradients"),
    ],
    "capstone.sharded_training": [
        ((functools.partial(capstone_train, optimizer=optax.sgd(1e-3)), uses_all_gather),
         "later ones differ"),
        ((capstone_train, lambda rules: False), "you predicted it would not"),
        ((functools.partial(capstone_train, text="lowered"), uses_all_gather),
         "compiled step's HLO text"),
    ],
}


def _nnx_accumulation(model, optimizer, X, y, m, mistake):
    from flax import nnx

    def loss_fn(model, X, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(X), y).mean()
    if mistake == "whole batch":
        loss, grads = nnx.value_and_grad(loss_fn)(model, X, y)
        optimizer.update(model, grads)
        return loss
    loss, grads = 0.0, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    for i in range(m):
        rows = slice(i * len(X) // m, (i + 1) * len(X) // m) if mistake == "consecutive" \
            else slice(i, None, m)
        loss_i, grads_i = nnx.value_and_grad(loss_fn)(model, X[rows], y[rows])
        if mistake == "update each":
            optimizer.update(model, jax.tree.map(lambda g: g / m, grads_i))
        scale = 1 if mistake == "sum" else m
        loss, grads = loss + loss_i / m, jax.tree.map(lambda a, b: a + b / scale, grads,
                                                      grads_i)
    if mistake == "no optimizer":  # SGD by hand: the momentum and step count stay put
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g,
                                       nnx.state(model, nnx.Param), grads))
    elif mistake != "update each":
        optimizer.update(model, grads)
    return None if mistake == "no return" else loss




def _bf16_gather_by_ring(x, axis_name):  # 02's rings of lax.ppermute: float32, then bfloat16
    chunk = reduce_scatter(x.astype(jnp.float32), axis_name)
    return all_gather(chunk.astype(jnp.bfloat16), axis_name)


def _bf16_gather_by_all_to_all(x, axis_name):  # the reduce-scatter: all_to_all, a local sum
    k = lax.axis_size(axis_name)
    blocks = lax.all_to_all(x.astype(jnp.float32).reshape(k, -1), axis_name, 0, 0)
    return lax.all_gather(blocks.sum(0).astype(jnp.bfloat16), axis_name, tiled=True)


ALSO_RIGHT["low_precision_communication.bf16_gather"] = [
    (_bf16_gather_by_ring,), (_bf16_gather_by_all_to_all,)]



def _ring_sum_every_other_hop(parts):  # the running sum rounded at every second hop only
    total = parts[0].astype(jnp.float32)
    for i, p in enumerate(parts[1:]):
        total = total + p
        if i % 2:
            total = total.astype(jnp.bfloat16).astype(jnp.float32)
    return total.astype(jnp.bfloat16)


def _ring_sum_unrounded_last_hop(parts):  # the finished sum is not sent: kept float32
    return ring_sum(parts[:-1]).astype(jnp.float32) + parts[-1]


ALSO_RIGHT["low_precision_communication.ring_sum"] = [
    ((lambda parts: ring_sum(parts[::-1])),), (_ring_sum_unrounded_last_hop,)]

# A starter as the student edition has it, for a function and for a value.
def starter_function(*args, **kwargs):
    ...  # YOUR CODE HERE


def starter_raises(*args, **kwargs):
    raise NotImplementedError()


STARTER_VALUE = ...
LOOPS_FOREVER = _loop_forever


# ----- 09f_overlapping_communication: a bucketed allreduce during the backward pass -----
def bucketed_grads(layer, params, X, Y, num_buckets):
    vjps = []
    for W in params:  # the forward pass, keeping each layer's vjp
        X, vjp = jax.vjp(layer, W, X)
        vjps.append(vjp)
    dy = jax.grad(lambda out: jnp.mean((out - Y) ** 2))(X)
    L = len(params)
    starts = [L * i // num_buckets for i in range(num_buckets)]
    grads, bucket = [None] * L, []
    for i in reversed(range(L)):  # the backward pass, last layer first
        dW, dy = vjps[i](dy)
        bucket.insert(0, dW)
        if i in starts:  # the bucket of layers i, i + 1, ... is complete
            grads[i:i + len(bucket)] = lax.pmean(bucket, "data")
            bucket = []
    return grads


def _grad_then_pmean(layer, params, X, Y, num_buckets):
    def loss(params):
        out = X
        for W in params:
            out = layer(W, out)
        return jnp.mean((out - Y) ** 2)
    return lax.pmean(jax.grad(loss)(params), "data")


def _pmean_per_layer(layer, params, X, Y, num_buckets):
    return bucketed_grads(layer, params, X, Y, len(params))


def _buckets_in_forward_order(layer, params, X, Y, num_buckets):
    vjps = []
    for W in params:
        X, vjp = jax.vjp(layer, W, X)
        vjps.append(vjp)
    dy = jax.grad(lambda out: jnp.mean((out - Y) ** 2))(X)
    grads = [None] * len(params)
    for i in reversed(range(len(params))):
        grads[i], dy = vjps[i](dy)
    size = len(params) // num_buckets
    return [g for start in range(0, len(params), size)
            for g in lax.pmean(grads[start:start + size], "data")]


def _bucketed_psum(layer, params, X, Y, num_buckets):
    k = lax.axis_size("data")
    return [g * k for g in bucketed_grads(layer, params, X, Y, num_buckets)]


def _buckets_after_grad(layer, params, X, Y, num_buckets):
    grads = jax.grad(lambda p: _one_loss(layer, p, X, Y))(params)
    size = len(params) // num_buckets
    out = [None] * len(params)
    for start in reversed(range(0, len(params), size)):
        out[start:start + size] = lax.pmean(grads[start:start + size], "data")
    return out


def _one_loss(layer, params, X, Y):
    for W in params:
        X = layer(W, X)
    return jnp.mean((X - Y) ** 2)


def _forward_vjps(layer, params, X, Y):
    vjps = []
    for W in params:
        X, vjp = jax.vjp(layer, W, X)
        vjps.append(vjp)
    return vjps, jax.grad(lambda out: jnp.mean((out - Y) ** 2))(X)


def _dummy_pmeans_then_grad(layer, params, X, Y, num_buckets):
    for _ in range(num_buckets - 1):  # allreduces of nothing the answer uses
        lax.pmean(jnp.zeros(()), "data")
    return _grad_then_pmean(layer, params, X, Y, num_buckets)


def _last_bucket_early(layer, params, X, Y, num_buckets, rest=reversed):
    vjps, dy = _forward_vjps(layer, params, X, Y)
    L = len(params)
    bounds = [L * i // num_buckets for i in range(num_buckets)] + [L]
    grads = [None] * L
    for i in reversed(range(L)):
        grads[i], dy = vjps[i](dy)
        if i == bounds[-2]:  # only the last layers' bucket during the backward pass
            grads[i:] = lax.pmean(grads[i:], "data")
    for a, b in rest(list(itertools.pairwise(bounds[:-1]))):  # the others after it
        grads[a:b] = lax.pmean(grads[a:b], "data")
    return grads


def _last_bucket_early_rest_ascending(layer, params, X, Y, num_buckets):
    return _last_bucket_early(layer, params, X, Y, num_buckets, rest=list)


def _round_robin_buckets(layer, params, X, Y, num_buckets):
    vjps, dy = _forward_vjps(layer, params, X, Y)
    L = len(params)
    grads = [None] * L
    for i in reversed(range(L)):
        grads[i], dy = vjps[i](dy)
        if i < num_buckets:  # bucket i: layers i, i + num_buckets, ...
            picked = list(range(i, L, num_buckets))
            for j, g in zip(picked, lax.pmean([grads[j] for j in picked], "data")):
                grads[j] = g
    return grads


def _stacked_grads(layer, params, X, Y, num_buckets):
    return jnp.stack(bucketed_grads(layer, params, X, Y, num_buckets))


def _last_layer_first(layer, params, X, Y, num_buckets):
    return bucketed_grads(layer, params, X, Y, num_buckets)[::-1]


REFERENCE["overlapping_communication.bucketed_allreduce"] = (bucketed_grads,)
WRONG["overlapping_communication.bucketed_allreduce"] = [
    ((_grad_then_pmean,), "one allreduce of all the gradients, at the end"),
    ((_pmean_per_layer,), "one allreduce per layer"),
    ((_buckets_in_forward_order,), "buckets in forward order"),
    ((_bucketed_psum,), "8\u00d7 too large"),
    ((_buckets_after_grad,), "comes after the first layer's backward pass"),
    ((_dummy_pmeans_then_grad,), "feeds none of the gradients you return"),
    ((_last_bucket_early,), "allreduce of layers 3-4 comes after the first layer's backward"),
    ((_last_bucket_early_rest_ascending,), "last layers first, each bucket just below"),
    ((_round_robin_buckets,), "layers that are not consecutive"),
    ((_stacked_grads,), "got an array of shape (4, 6, 6)"),
    ((_last_layer_first,), "return them in the order of `params`"),
]


# Other right answers: each passes the public and the hidden cases.
def _flat_buckets(layer, params, X, Y, num_buckets):  # one flat vector per bucket
    vjps, dy = _forward_vjps(layer, params, X, Y)
    L = len(params)
    starts = [L * i // num_buckets for i in range(num_buckets)]
    grads, bucket = [None] * L, []
    for i in reversed(range(L)):
        dW, dy = vjps[i](dy)
        bucket.insert(0, dW)
        if i in starts:
            flat = lax.pmean(jnp.concatenate([g.ravel() for g in bucket]), "data")
            for n, g in enumerate(bucket):
                grads[i + n] = flat[n * g.size:(n + 1) * g.size].reshape(g.shape)
            bucket = []
    return grads


def _vjp_per_bucket(layer, params, X, Y, num_buckets):  # one jax.vjp per bucket
    L = len(params)
    bounds = [L * i // num_buckets for i in range(num_buckets)] + [L]

    def block(Ws, x):
        for W in Ws:
            x = layer(W, x)
        return x
    vjps = []
    for a, b in itertools.pairwise(bounds):
        X, vjp = jax.vjp(block, params[a:b], X)
        vjps.append((a, b, vjp))
    dy = jax.grad(lambda out: jnp.mean((out - Y) ** 2))(X)
    grads = [None] * L
    for a, b, vjp in reversed(vjps):
        dWs, dy = vjp(dy)
        grads[a:b] = lax.pmean(list(dWs), "data")
    return grads


def _psum_then_divide(layer, params, X, Y, num_buckets):
    k = lax.axis_size("data")
    vjps, dy = _forward_vjps(layer, params, X, Y)
    L = len(params)
    starts = [L * i // num_buckets for i in range(num_buckets)]
    grads, bucket = [None] * L, []
    for i in reversed(range(L)):
        dW, dy = vjps[i](dy)
        bucket.insert(0, dW)
        if i in starts:
            grads[i:i + len(bucket)] = [g / k for g in lax.psum(bucket, "data")]
            bucket = []
    return grads


def _jitted_layer(layer, params, X, Y, num_buckets):
    return bucketed_grads(jax.jit(layer), params, X, Y, num_buckets)


def _rematerialized_layer(layer, params, X, Y, num_buckets):
    return bucketed_grads(jax.checkpoint(layer), params, X, Y, num_buckets)


def _unequal_buckets(layer, params, X, Y, num_buckets):  # the last layers one by one
    vjps, dy = _forward_vjps(layer, params, X, Y)
    L = len(params)
    starts = [0, *range(L - num_buckets + 1, L)]
    grads, bucket = [None] * L, []
    for i in reversed(range(L)):
        dW, dy = vjps[i](dy)
        bucket.insert(0, dW)
        if i in starts:
            grads[i:i + len(bucket)] = lax.pmean(bucket, "data")
            bucket = []
    return grads


ALSO_RIGHT["overlapping_communication.bucketed_allreduce"] = [
    (_flat_buckets,), (_vjp_per_bucket,), (_psum_then_divide,), (_jitted_layer,),
    (_rematerialized_layer,), (_unequal_buckets,)]


# ----- 09e_pipeline_parallelism: interleaved 1F1B -----
def interleaved_1f1b(p, m, v):
    orders = []
    for s in range(p):
        def nth(kind, k):  # the k-th forward or backward of device s
            c = (k // p) % v if kind == "F" else v - 1 - (k // p) % v
            return (kind, k // (p * v) * p + k % p, c * p + s)
        warmup = min(v * m, 2 * (p - s - 1) + (v - 1) * p)
        order = [nth("F", k) for k in range(warmup)]
        for k in range(v * m - warmup):  # one forward, one backward
            order += [nth("F", warmup + k), nth("B", k)]
        orders.append(order + [nth("B", k) for k in range(v * m - warmup, v * m)])
    return orders


def _interleaved_gpipe(p, m, v):
    return [[("F", j, c * p + s) for c in range(v) for j in range(m)]
            + [("B", j, c * p + s) for c in reversed(range(v)) for j in range(m)]
            for s in range(p)]


def _chunks_in_blocks(p, m, v):  # device s holds chunks s v, ..., s v + v - 1
    return [[(kind, j, s * v + c // p) for kind, j, c in ops]
            for s, ops in enumerate(interleaved_1f1b(p, m, v))]


def _plain_1f1b(p, m, v):  # v ignored: device s runs chunk s alone
    return [[(kind, j, s) for kind, j in sorted(
        [(kind, j) for kind in "FB" for j in range(m)],
        key=lambda op: op[1] + (p - s - 0.5) * (op[0] == "B"))] for s in range(p)]


def _backward_first(p, m, v):
    orders = interleaved_1f1b(p, m, v)
    last = orders[-1]
    i = last.index(("B", 0, v * p - 1))
    last.insert(0, last.pop(i))
    return orders


def _deep_1f1b(p, m, v):  # 1F1B over v p stages, each device given its chunks' passes
    table, done = [], {}
    todo = [sorted([(kind, j) for kind in "FB" for j in range(m)],
                   key=lambda op, c=c: op[1] + (v * p - c - 0.5) * (op[0] == "B"))
            for c in range(v * p)]
    while any(todo):
        t = len(table)
        row = []
        for c, passes in enumerate(todo):
            kind, j = passes[0] if passes else (None, None)
            need = (c - 1, "F", j) if kind == "F" else (c + 1, "B", j)
            if kind == "B" and c == v * p - 1:
                need = (c, "F", j)
            ready = need[0] < 0 or done.get(need, t + 1) <= t
            row.append(passes.pop(0) if passes and ready else None)
            if row[-1]:
                done[(c, kind, j)] = t + 1
        table.append(row)
    orders = [[] for _ in range(p)]
    for row in table:
        for c, op in enumerate(row):
            if op:
                orders[c % p].append((op[0], op[1], c))
    return orders


def _gpipe_when_one_chunk(p, m, v):
    return (_interleaved_gpipe if v == 1 else interleaved_1f1b)(p, m, v)


REFERENCE["pipeline_parallelism.interleaved"] = (interleaved_1f1b,)
WRONG["pipeline_parallelism.interleaved"] = [
    ((_interleaved_gpipe,), "all forwards first (GPipe order)"),
    ((_chunks_in_blocks,), "device 0 runs chunk 1"),
    ((_plain_1f1b,), "runs only chunk 0"),
    ((_backward_first,), "before its forward"),
    ((_deep_1f1b,), "interleaving v=2 chunks allows"),
    ((_gpipe_when_one_chunk,), "all forwards first (GPipe order)"),
]
