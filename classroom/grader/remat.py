"""Hidden cases of notebook 09b_remat's checks
(d2l_multi/exercises/remat.py)."""
HIDDEN = {
    # remat_memory: (layers, input bytes, intermediate bytes per layer)
    "remat_memory": [(1, 8, 16), (96, 2**20, 2**23)],
}
