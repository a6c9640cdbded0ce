"""Hidden cases of notebook 05a_flax's checks (d2l_multi/exercises/flax.py)."""
HIDDEN = {
    # nnx_accumulation: (seed of the model and batch, m micro-batches, global batch B; B a
    # multiple of 8 m)
    "nnx_accumulation": [(2, 2, 48), (3, 8, 64)],
}
