"""Hidden cases of notebook 09a_memory's checks
(d2l_multi/exercises/memory.py)."""
HIDDEN = {
    # training_memory: (parameters, activation bytes, devices; dividing both)
    "training_memory": [(3 * 10**8, 0, 16), (5000, 100, 2)],
}
