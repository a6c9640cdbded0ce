"""Hidden cases of notebook 09a_memory_and_remat's checks
(d2l_multi/exercises/memory_and_remat.py)."""
HIDDEN = {
    # training_memory: (parameters, activation bytes, devices; dividing both)
    "training_memory": [(3 * 10**8, 0, 16), (5000, 100, 2)],
    # remat_memory: (layers, input bytes, intermediate bytes per layer)
    "remat_memory": [(1, 8, 16), (96, 2**20, 2**23)],
}
