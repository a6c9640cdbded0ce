"""The checks of the exercises of notebook 09c_meshes_and_rules."""
from ._common import _exercise, _fail, _observe, _plain_rules

# --------------------------------------------------------------------------------------------
# 09b: Transformer and meshes

_LOGICAL = ("batch", "embed", "heads", "mlp", "vocab")



@_exercise("09c_meshes_and_rules", cases=["rules"],
           passed="batch over 'data'; heads and mlp over 'model'; embed whole")
def logical_rules(rules, case):
    """``rules``: a dict from each logical axis of the Transformer (batch, embed, heads, mlp,
    vocab) to a mesh axis of a ('data', 'model') mesh, or None, giving data parallelism over
    'data' and Megatron tensor parallelism over 'model'."""
    rules = _observe(lambda: _plain_rules(rules))
    missing = [a for a in _LOGICAL if a not in rules]
    if missing:
        _fail(f"name every logical axis, None meaning replicated: missing {missing}")
    unknown = [a for a in rules if a not in _LOGICAL]
    if unknown:
        _fail(f"{unknown} are not logical axes of the Transformer; use {list(_LOGICAL)}")

    def axes(v):
        return set(v) if isinstance(v, (tuple, list)) else ({v} if v is not None else set())
    for a, v in rules.items():
        if not axes(v) <= {"data", "model"}:
            _fail(f"'{a}' maps to {v!r}: the mesh's axes are 'data' and 'model' (or None)")
    if axes(rules["batch"]) != {"data"}:
        _fail("data parallelism splits the batch: map 'batch' to 'data'")
    if "model" in axes(rules["embed"]):
        _fail("mapping 'embed' to 'model' splits every activation's features, so each layer "
              "would need an all-gather: Megatron keeps 'embed' whole (None)")
    if "data" in axes(rules["embed"]):
        _fail("mapping 'embed' to 'data' shards the weights over 'data': that is FSDP, not "
              "this strategy")
    for a in ("heads", "mlp"):
        if axes(rules[a]) != {"model"}:
            _fail(f"tensor parallelism splits the '{a}' axis over 'model' (each device keeps "
                  f"some attention heads and some hidden units)")
    if "data" in axes(rules["vocab"]):
        _fail("'vocab' over 'data' would shard the embedding table over the data axis; use "
              "'model' or None")
