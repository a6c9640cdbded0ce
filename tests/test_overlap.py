"""Reading a compiled program's schedule (notebook 09e): instructions in order, asynchronous
collective pairs with what lies between start and done, each collective's distance to its first
user; the hand-written FSDP step equals one device; what XLA:CPU does with it; the GPU check
script runs where there is no GPU."""
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l

ROOT = Path(__file__).resolve().parent.parent

# An XLA:GPU-style schedule: a computation before ENTRY, long operand forms with types, an
# asynchronous all-gather with two instructions between its start and its done, a tuple
# all-reduce read through get-tuple-element, and attributes that name computations.
GPU_HLO = """HloModule jit_step, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main.7 (p0: f32[32,256], x: f32[8,256]) -> (f32[8,256], f32[]) {
  %p0 = f32[32,256]{1,0} parameter(0)
  %x = f32[8,256]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}
  %all-gather-start = (f32[32,256]{1,0}, f32[256,256]{1,0}) all-gather-start(f32[32,256]{1,0} %p0), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, backend_config={"collective_backend_config":{"is_sync":false}}
  %fusion = f32[8,256]{1,0} fusion(f32[8,256]{1,0} %x), kind=kLoop, calls=%fused_computation
  %gemm = f32[8,256]{1,0} custom-call(f32[8,256]{1,0} %fusion, f32[8,256]{1,0} %x), custom_call_target="__cublas$gemm"
  %all-gather-done = f32[256,256]{1,0} all-gather-done((f32[32,256]{1,0}, f32[256,256]{1,0}) %all-gather-start)
  %sums = (f32[], f32[8,256]{1,0}) all-reduce(f32[] %p0, f32[8,256]{1,0} %gemm), channel_id=2, to_apply=%add
  %out = f32[8,256]{1,0} custom-call(f32[8,256]{1,0} %gemm, f32[256,256]{1,0} %all-gather-done), custom_call_target="__cublas$gemm"
  %gte = f32[] get-tuple-element((f32[], f32[8,256]{1,0}) %sums), index=0
  ROOT %tuple = (f32[8,256]{1,0}, f32[]) tuple(f32[8,256]{1,0} %out, f32[] %gte)
}
"""


def test_hlo_schedule_reads_the_entry_computation_in_order():
    schedule = d2l.hlo_schedule(GPU_HLO)
    assert [op for _, op, _ in schedule] == [
        "parameter", "parameter", "all-gather-start", "fusion", "custom-call",
        "all-gather-done", "all-reduce", "custom-call", "get-tuple-element", "tuple"]
    names = {name: operands for name, _, operands in schedule}
    assert names["all-gather-done"] == ["all-gather-start"]   # nested parentheses
    assert names["fusion"] == ["x"]                             # not calls=%fused_computation
    assert names["sums"] == ["p0", "gemm"]                      # not to_apply=%add


def test_async_pairs_and_what_lies_between_start_and_done():
    pairs = d2l.async_pairs(d2l.hlo_schedule(GPU_HLO))
    assert pairs == [("all-gather", 2, 5, ["fusion", "custom-call"])]


def test_collective_slack_finds_first_users_through_get_tuple_element():
    slack = d2l.collective_slack(d2l.hlo_schedule(GPU_HLO))
    assert slack == [("all-gather-done", 5, 7), ("all-reduce", 6, 8 + 1)]


def test_plot_schedule_draws_one_row_per_collective_and_one_for_compute():
    import matplotlib
    matplotlib.use("Agg")
    ax = d2l.plot_schedule(d2l.hlo_schedule(GPU_HLO))
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "compute", "all-gather-done", "all-reduce"]


@pytest.fixture(scope="module")
def fsdp():
    """Notebook 09e's FSDP step: 4 weights of 256 x 256, rows split over 8 devices."""
    def fsdp_loss(params, X, y):
        for W in params[:-1]:
            X = jax.nn.relu(X @ lax.all_gather(W, "data", tiled=True))
        out = X @ lax.all_gather(params[-1], "data", tiled=True)
        return lax.pmean(jnp.mean((out - y) ** 2), "data")

    mesh = d2l.device_mesh()
    step = jax.jit(jax.shard_map(jax.value_and_grad(fsdp_loss), mesh=mesh,
                                 in_specs=(P("data"), P("data"), P("data")),
                                 out_specs=(P(), P("data"))))
    keys = jax.random.split(jax.random.key(0), 5)
    params = [jax.random.normal(k, (256, 256)) / 16 for k in keys[:4]]
    X, y = jax.random.normal(keys[4], (64, 256)), jnp.zeros((64, 256))
    return step, (params, X, y), jax.device_put((params, X, y), NamedSharding(mesh, P("data")))


def test_fsdp_gradient_equals_one_device(fsdp):
    step, (params, X, y), sharded = fsdp

    def loss(params, X, y):
        for W in params[:-1]:
            X = jax.nn.relu(X @ W)
        return jnp.mean((X @ params[-1] - y) ** 2)

    (l8, g8), (l1, g1) = step(*sharded), jax.value_and_grad(loss)(params, X, y)
    assert d2l.max_difference(g8, g1) < 1e-8 and abs(float(l8 - l1)) < 1e-6


def test_xla_cpu_schedules_synchronous_collectives_early(fsdp):
    """What the notebook says of XLA:CPU: no start/done pairs, all gathers before the first
    layer, each reduce-scatter while the backward pass of earlier layers is still to come;
    the GPU scheduler's options change nothing on a CPU."""
    step, _, sharded = fsdp
    lowered = step.lower(*sharded)
    hlo = lowered.compile().as_text()
    schedule = d2l.hlo_schedule(hlo)
    slack = d2l.collective_slack(schedule)
    gathers = [(at, use) for op, at, use in slack if op == "all-gather"]
    scatters = [at for op, at, _ in slack if op == "reduce-scatter"]
    dots = [i for i, (_, op, _) in enumerate(schedule) if op == "dot"]
    assert not d2l.async_pairs(schedule) and len(gathers) == len(scatters) == 4
    assert max(at for at, _ in gathers) < min(use for _, use in gathers)
    assert min(scatters) < max(dots)
    options = {"xla_gpu_enable_latency_hiding_scheduler": True,
               "xla_gpu_disable_async_collectives": "ALLGATHER,REDUCESCATTER"}
    assert lowered.compile(compiler_options=options).as_text() == hlo


@pytest.mark.parametrize("text, error, message", [
    (123, TypeError, "hlo_schedule reads HLO text"),
    ("HloModule m\n%f (a: f32[]) -> f32[] {\n}\n", ValueError, "no ENTRY computation"),
])
def test_bad_input_is_refused_with_the_fix(text, error, message):
    with pytest.raises(error, match=message):
        d2l.hlo_schedule(text)


def test_gpu_check_script_runs_without_a_gpu_and_refuses_bad_parts():
    script = ROOT / "tools" / "gpu_overlap_check.py"
    bad = subprocess.run([sys.executable, str(script), "--parts", "a,x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "subset of a,b,c,d" in bad.stderr
    done = subprocess.run([sys.executable, str(script), "--parts", "a,b,c"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "jax " in done.stdout and done.stdout.count("skipped: no GPU here") == 2
    assert "FAILED" not in done.stdout
