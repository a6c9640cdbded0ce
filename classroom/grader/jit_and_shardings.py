"""Hidden cases of notebook 04a_jit_and_shardings's checks
(d2l_multi/exercises/jit_and_shardings.py)."""
HIDDEN = {
    # jit_data_parallel: (devices, batch)
    "jit_data_parallel": [(4, 8)],
}
