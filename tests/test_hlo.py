"""The collectives of a program, read from HLO text in every form XLA prints them (d2l_multi/hlo.py,
and the schedule readers of notebook 09e).

tests/hlo/ holds one program written by hand three times: as XLA:CPU prints it (each collective one
instruction), as XLA:GPU prints it by default (all-reduce, all-gather and collective-permute as
``-start``/``-done`` pairs; reduce-scatter and all-to-all wrapped by ``async-start(...), calls=``),
and with XLA's syntax sugar for asynchronous operations (``reduce-scatter-start``). Each form must
give the same collectives, each counted once."""
from pathlib import Path

import pytest

import d2l_multi as d2l
from d2l_multi.hlo import COLLECTIVE_OP

HLO = Path(__file__).resolve().parent / "hlo"
FORMS = {"cpu": "cpu_sync.hlo", "gpu": "gpu_async.hlo", "gpu sugared": "gpu_async_sugared.hlo"}
TEXT = {form: (HLO / name).read_text() for form, name in FORMS.items()}

# kind: (arrays each device receives, devices per group)
EXPECTED = {
    "all-gather": ((("f32", (256, 256)),), 8),
    "all-reduce": ((("f32", ()), ("f32", (8, 256))), 8),
    "reduce-scatter": ((("f32", (32, 256)),), 8),
    "all-to-all": ((("f32", (8, 256)),), 4),
    "collective-permute": ((("f32", (8, 256)),), 8),
}


@pytest.mark.parametrize("form", FORMS)
def test_each_collective_is_read_once_in_every_form(form):
    ops = d2l.collective_ops(TEXT[form])
    assert sorted(op.kind for op in ops) == sorted(EXPECTED)
    assert {op.kind: (op.arrays, op.group_size) for op in ops} == EXPECTED
    assert all(op.asynchronous == form.startswith("gpu") for op in ops)


@pytest.mark.parametrize("form", FORMS)
def test_count_collectives_counts_each_once(form):
    assert d2l.count_collectives(TEXT[form]) == dict.fromkeys(d2l.COLLECTIVES, 1)


def test_bytes_of_the_arrays_each_collective_returns():
    nbytes = {op.kind: op.nbytes for op in d2l.collective_ops(TEXT["gpu"])}
    assert nbytes == {"all-gather": 256 * 256 * 4, "all-reduce": 4 + 8 * 256 * 4,
                      "reduce-scatter": 32 * 256 * 4, "all-to-all": 8 * 256 * 4,
                      "collective-permute": 8 * 256 * 4}


def test_allreduce_bytes_reads_the_asynchronous_form():
    want = {key: {"f32": 4 + 8 * 256 * 4} for key in FORMS}
    assert {form: d2l.allreduce_bytes(text) for form, text in TEXT.items()} == want


@pytest.mark.parametrize("line", [
    "  %d = f32[8]{0} all-reduce-done(f32[8]{0} %s)",                  # a done is not counted
    "  %r = f32[8]{0} ragged-all-to-all(%a, %b, %c, %d, %e, %f)",      # another collective
    "  %a = ((f32[8]{0}), f32[1]{0}) async-start(%x), calls=%wrapped",  # counted in %wrapped
    "  %n = f32[8]{0} add(%all-reduce-start, %all-gather)",            # names, not opcodes
])
def test_instructions_that_are_not_a_collective_to_count(line):
    assert COLLECTIVE_OP.match(line) is None
    assert d2l.collective_ops(line) == []


def test_group_sizes_in_every_spelling_of_replica_groups():
    lines = {
        "[2,4]<=[8]": 4, "[4,2]<=[2,4]T(1,0)": 2, "{{0,1},{2,3},{4,5},{6,7}}": 2,
        "{{0,1,2,3,4,5,6,7}}": 8, "{}": 8}
    for groups, k in lines.items():
        text = (f"HloModule m, num_partitions=8\n  %s = f32[8]{{0}} all-reduce(%x), "
                f"replica_groups={groups}, to_apply=%add")
        assert [op.group_size for op in d2l.collective_ops(text)] == [k], groups


def test_tuple_types_with_index_comments():
    text = ("  %a = (f32[1,32]{1,0}, f32[1,32]{1,0}, f32[1,32]{1,0}, f32[1,32]{1,0}, "
            "f32[1,32]{1,0}, /*index=5*/f32[1,32]{1,0}) all-to-all(%p0, %p1, %p2, %p3, %p4, "
            "/*index=5*/%p5), channel_id=1, replica_groups={{0,1,2,3,4,5}}")
    (op,) = d2l.collective_ops(text)
    assert op.arrays == (("f32", (1, 32)),) * 6 and op.group_size == 6


def test_collective_ops_refuses_a_compiled_program():
    with pytest.raises(TypeError, match="HLO text"):
        d2l.collective_ops(object())


# ----- the schedule readers of notebook 09e in the three forms -----

def test_hlo_schedule_names_a_wrapped_collective_after_what_it_wraps():
    opcodes = {form: [op for _, op, _ in d2l.hlo_schedule(text)] for form, text in TEXT.items()}
    assert opcodes["gpu"] == opcodes["gpu sugared"]
    assert "async-start" not in opcodes["gpu"] and "reduce-scatter-start" in opcodes["gpu"]
    assert opcodes["gpu"].index("reduce-scatter-update") < opcodes["gpu"].index(
        "reduce-scatter-done")


def test_async_pairs_in_both_gpu_forms_and_none_on_the_cpu():
    pairs = {form: d2l.async_pairs(d2l.hlo_schedule(text)) for form, text in TEXT.items()}
    assert pairs["cpu"] == [] and pairs["gpu"] == pairs["gpu sugared"]
    kinds = [kind for kind, *_ in pairs["gpu"]]
    assert sorted(kinds) == sorted(EXPECTED)
    schedule = d2l.hlo_schedule(TEXT["gpu"])
    for kind, start, done, between in pairs["gpu"]:
        assert schedule[start][1] == f"{kind}-start" and schedule[done][1] == f"{kind}-done"
        assert len(between) == done - start - 1
    (scatter,) = [p for p in pairs["gpu"] if p[0] == "reduce-scatter"]
    assert scatter[3] == ["reduce-scatter-update", "all-reduce-done"]  # followed back


def test_collective_slack_finds_every_kind_in_every_form():
    for form, text in TEXT.items():
        slack = d2l.collective_slack(d2l.hlo_schedule(text))
        kinds = sorted(opcode.removesuffix("-done") for opcode, _, _ in slack)
        assert kinds == sorted(EXPECTED), form
