"""What the mixed-precision (07c) and overlap (09e) notebooks can only expect on a CPU,
checked on a machine with one NVIDIA GPU. Run from the project root:

    python tools/gpu_overlap_check.py              # all parts, under two minutes
    python tools/gpu_overlap_check.py --parts a,b  # only some parts

(a) versions and devices.
(b) 09e's FSDP step and 07c's data-parallel LeNet step (float32 and mixed precision),
    compiled by XLA:GPU for 8 GPUs of the kind present: a compile-only topology made from
    the GPU's own target description, or else JAX's mock GPU topology in a subprocess.
    Printed for each: the asynchronous collective pairs with the instructions between start
    and done, with the latency hiding scheduler on, off, and with asynchronous collectives
    disabled; the dtype and bytes of the all-reduces of the LeNet steps.
(c) on the one real GPU: the time of a float32 and of a bfloat16 training step of LeNet and
    of d2l.TransformerLM.
(d) the same programs as (b) compiled by XLA:CPU for 8 CPU devices (what the notebooks
    assert on a CPU, for this JAX version).

Every part runs in its own try/except and prints its error; parts that need a GPU say so and
are skipped where there is none. Exit status 0 unless the arguments are wrong (2).
"""
import argparse
import collections
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BUDGET_S = 110                      # stop starting new work after this many seconds
START = time.perf_counter()
LENET_BATCHES = (256, 4096)
TRANSFORMER = {"d_model": 512, "num_heads": 8, "num_layers": 4}
VOCAB, SEQ_LEN, BATCH = 256, 256, 32
VARIANTS = {                        # compiler options of each GPU variant
    "default": {},
    "latency hiding scheduler on": {"xla_gpu_enable_latency_hiding_scheduler": True},
    "latency hiding scheduler off": {"xla_gpu_enable_latency_hiding_scheduler": False},
    "async collectives off": {"xla_gpu_disable_async_collectives":
                              "ALLGATHER,REDUCESCATTER,ALLREDUCE"},
    "scheduler on, command buffers off": {"xla_gpu_enable_latency_hiding_scheduler": True,
                                          "xla_gpu_enable_command_buffer": ""},
}


def elapsed():
    return time.perf_counter() - START


def section(title):
    print(f"\n=== {title} ({elapsed():.0f} s)", flush=True)


def guarded(title, fn, *args):
    """Run one part; print its error instead of stopping the script."""
    section(title)
    if elapsed() > BUDGET_S:
        print(f"skipped: {BUDGET_S} s budget used")
        return None
    try:
        return fn(*args)
    except Exception:
        print("FAILED:\n" + traceback.format_exc(limit=6), flush=True)
        return None


# ---------------------------------------------------------------- the programs
def fsdp_program(mesh):
    """09e's FSDP step: four 256x256 weights, rows split over 'data'."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def fsdp_loss(params, X, y):
        for W in params[:-1]:
            X = jax.nn.relu(X @ lax.all_gather(W, "data", tiled=True))
        out = X @ lax.all_gather(params[-1], "data", tiled=True)
        return lax.pmean(jnp.mean((out - y) ** 2), "data")

    step = jax.jit(jax.shard_map(jax.value_and_grad(fsdp_loss), mesh=mesh,
                                 in_specs=(P("data"), P("data"), P("data")),
                                 out_specs=(P(), P("data"))))
    split = NamedSharding(mesh, P("data"))
    spec = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=split)
    return step.lower([spec((256, 256))] * 4, spec((64, 256)), spec((64, 256)))


def lenet_programs(mesh):
    """07c's data-parallel LeNet steps, float32 and mixed precision, with Adam."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import d2l_multi as d2l
    adam = optax.adam(1e-3)
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    abstract = lambda tree, sharding: jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), tree)
    params = jax.eval_shape(d2l.init_lenet_params, jax.random.key(0))
    args = (abstract(params, replicated),
            abstract(jax.eval_shape(adam.init, params), replicated),
            jax.ShapeDtypeStruct((256, 28, 28, 1), jnp.float32, sharding=split),
            jax.ShapeDtypeStruct((256,), jnp.int32, sharding=split))
    return {"float32": d2l.make_train_step(adam, d2l.mixed_loss_fn).lower(*args),
            "mixed": d2l.make_mixed_precision_step(adam, d2l.mixed_loss_fn).lower(*args)}


# ---------------------------------------------------------------- reading them
def summarize(name, hlo):
    """Print the collectives of a compiled program and its asynchronous pairs."""
    import d2l_multi as d2l
    schedule = d2l.hlo_schedule(hlo)
    pairs = d2l.async_pairs(schedule)
    kinds = collections.Counter(op for _, op, _ in schedule
                                if op.removesuffix("-start").removesuffix("-done")
                                in d2l.COLLECTIVES)
    everywhere = collections.Counter(  # each collective once, in any form
        op.kind + (" (asynchronous)" if op.asynchronous else "")
        for op in d2l.collective_ops(hlo))
    print(f"  [{name}] ENTRY: {len(schedule)} instructions, collectives {dict(kinds)}, "
          f"{len(pairs)} async pairs; whole module: {dict(everywhere)}; "
          f"all-reduce bytes {d2l.allreduce_bytes(hlo)}")
    for kind, start, done, between in pairs:
        work = collections.Counter(op for op in between if op not in d2l.PLUMBING)
        print(f"    {kind:16} start {start:4} done {done:4}: {len(between)} instructions "
              f"between, computing: {dict(work) or 'none'}")
    if not pairs:
        for opcode, at, use in d2l.collective_slack(schedule):
            print(f"    {opcode:16} at {at:4}, first used at {use:4}")
    return pairs


def compile_and_summarize(lowered, variants, label):
    for variant, options in variants.items():
        if elapsed() > BUDGET_S:
            print(f"  [{label} / {variant}] skipped: time budget used")
            continue
        t = time.perf_counter()
        try:
            text = lowered.compile(compiler_options=options).as_text()
        except Exception as e:
            print(f"  [{label} / {variant}] compile failed: {type(e).__name__}: "
                  f"{str(e)[:300]}")
            continue
        summarize(f"{label} / {variant}, compiled in {time.perf_counter() - t:.1f} s",
                  text)


def schedules_on(mesh, platform, variants):
    import d2l_multi as d2l
    compile_and_summarize(fsdp_program(mesh), variants, f"{platform} FSDP step")
    lenet = lenet_programs(mesh)
    for name, lowered in lenet.items():
        asked = d2l.allreduce_bytes(d2l.partitioned_hlo(lowered))
        print(f"  [{platform} LeNet {name}] partitioned all-reduce bytes: {asked}")
        compile_and_summarize(lowered, {"default": {}}, f"{platform} LeNet {name}")


# ---------------------------------------------------------------- the parts
def part_a():
    import platform

    import jax
    import jaxlib
    print(f"python {platform.python_version()}, jax {jax.__version__}, "
          f"jaxlib {jaxlib.__version__}")
    for module in ("flax", "optax", "orbax.checkpoint", "numpy"):
        try:
            mod = __import__(module, fromlist=["__version__"])
            print(f"{module} {getattr(mod, '__version__', '?')}")
        except Exception as e:
            print(f"{module}: {type(e).__name__}: {e}")
    print("default backend:", jax.default_backend())
    for device in jax.devices():
        print(" ", device.platform, device.id, getattr(device, "device_kind", ""))
    print("cpu devices:", len(jax.devices("cpu")))
    print("XLA_FLAGS =", os.environ.get("XLA_FLAGS", "(unset)"))


def gpus():
    import jax
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def part_d():
    import jax
    cpu_mesh = jax.sharding.Mesh(jax.devices("cpu")[:8], ("data",))
    schedules_on(cpu_mesh, "cpu", {"default": {}})


def part_b():
    if not gpus():
        print("skipped: no GPU here")
        return
    try:
        mesh = compile_only_mesh()
    except Exception as e:
        print(f"compile-only topology failed ({type(e).__name__}: {str(e)[:300]}); "
              f"trying jax_mock_gpu_topology in a subprocess")
        mock_subprocess()
        return
    schedules_on(mesh, "gpu", VARIANTS)


def compile_only_mesh():
    """8 compile-only devices of the present GPU's kind (jax.experimental.topologies)."""
    from jax._src.lib import xla_client as xc
    from jax.experimental import topologies
    gpu = gpus()[0]
    target = xc.get_topology_for_devices([gpu]).target_config
    errors = []
    for name in ("1x1x8", "1x8x1"):
        try:
            topology = topologies.get_topology_desc(platform=gpu.platform,
                                                    target_config=target, topology=name)
            print(f"compile-only topology {name}: {len(topology.devices)} devices, "
                  f"{topology.devices[0]}")
            return topologies.make_mesh(topology, (8,), ("data",))
        except Exception as e:
            errors.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
    raise RuntimeError("; ".join(errors))


def mock_subprocess():
    try:
        done = subprocess.run([sys.executable, __file__, "--mock"], timeout=max(
            10, BUDGET_S - elapsed()), capture_output=True, text=True)
        print(done.stdout + done.stderr[-3000:])
    except subprocess.TimeoutExpired as e:
        print(f"mock topology subprocess timed out after {e.timeout:.0f} s:\n"
              f"{(e.stdout or b'')[-3000:]}")


def mock_main():
    """Child process: JAX's mock GPU topology, 8 GPUs of which one is real."""
    import jax
    jax.config.update("jax_mock_gpu_topology", "1x8x1")
    jax.config.update("jax_cuda_visible_devices", "0")
    print(f"mock topology: {jax.device_count()} devices, {jax.local_device_count()} local")
    mesh = jax.sharding.Mesh(jax.devices()[:8], ("data",))
    schedules_on(mesh, "gpu (mock)", VARIANTS)


def time_step(step, *args, repeat=20):
    import d2l_multi as d2l
    return d2l.time_call(step, *args, repeat=repeat, warmup=2) * 1e3


def part_c():
    if not gpus():
        print("skipped: no GPU here")
        return
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import d2l_multi as d2l
    gpu = gpus()[0]
    print("device:", gpu.device_kind, "| jax_default_matmul_precision:",
          jax.config.jax_default_matmul_precision)
    adam = optax.adam(1e-3)
    with jax.default_device(gpu):
        params = d2l.init_lenet_params(jax.random.key(0))
        for batch in LENET_BATCHES:
            X = jax.random.uniform(jax.random.key(1), (batch, 28, 28, 1))
            y = jnp.arange(batch) % 10
            times = {}
            for name, make in (("float32", d2l.make_train_step),
                               ("mixed bfloat16", d2l.make_mixed_precision_step)):
                step = make(adam, d2l.mixed_loss_fn)
                times[name] = time_step(step, params, adam.init(params), X, y)
            print(f"LeNet, batch {batch}: " + ", ".join(
                f"{k} {v:.3f} ms" for k, v in times.items()))
    mesh = d2l.device_mesh((1, 1), devices=[gpu])
    rules = d2l.sharding_rules("dp")[1]
    X = jax.device_put(jax.random.randint(jax.random.key(2), (BATCH, SEQ_LEN), 0, VOCAB),
                       gpu)
    for dtype, precision in (("float32", "default"), ("bfloat16", "default"),
                             ("float32", "highest")):
        if elapsed() > BUDGET_S:
            print("Transformer timing skipped: time budget used")
            break
        model = d2l.create_sharded(lambda: d2l.TransformerLM(
            VOCAB, SEQ_LEN, **TRANSFORMER, dtype=dtype, rngs=nnx.Rngs(0)), mesh, rules)
        graphdef, p = nnx.split(model)
        loss = lambda p, X, Y: d2l.lm_loss(nnx.merge(graphdef, p), X, Y)
        step = d2l.make_train_step(adam, loss)
        with jax.default_matmul_precision(precision):
            ms = time_step(step, p, adam.init(p), X, X, repeat=10)
        print(f"TransformerLM {TRANSFORMER}, {BATCH}x{SEQ_LEN} tokens, {dtype} compute "
              f"(matmul precision {precision}): {ms:.2f} ms per step")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="a,b,c,d",
                        help="comma-separated parts to run (a, b, c, d); default all")
    parser.add_argument("--mock", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in "abcd" or len(p) != 1]
    if unknown or not parts:
        parser.error(f"--parts {args.parts!r}: use a comma-separated subset of a,b,c,d")
    import jax
    jax.config.update("jax_num_cpu_devices", 8)   # before any backend starts
    if args.mock:
        guarded("mock GPU topology", mock_main)
        return 0
    titles = {"a": "a: versions and devices",
              "b": "b: XLA:GPU schedules for 8 GPUs, one present",
              "c": "c: float32 vs bfloat16 steps on the GPU",
              "d": "d: XLA:CPU schedules for 8 CPU devices"}
    run = {"a": part_a, "b": part_b, "c": part_c, "d": part_d}
    for part in parts:
        guarded(titles[part], run[part])
    section("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
