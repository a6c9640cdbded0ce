"""Answers to the self-checking exercises (d2l_multi/exercises/): a reference solution of each
check, as a notebook's ``## Solutions`` would show it, and plausible wrong answers, each with
the words of the hint it must get. tests/test_exercises.py runs them; they stay with the tests,
out of the package students install."""
import functools
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
    "pipeline_parallelism.balanced_stages": (split_stages,),
    "overlapping_communication.overlapped_step": (overlapped_step_time,),
    "checkpoints.fsdp_restore": (fsdp_target,),
    "input_pipelines.exact_resume": (save_position, resume),
    "multi_process.process_rows": (process_rows,),
    "failures.checkpoint_interval": (checkpoint_interval,),
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


# Right answers of another design than the reference's: each passes, public and hidden cases.
ALSO_RIGHT = {}


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
