"""Hidden cases of notebook 02_allreduce's checks (d2l_multi/exercises/allreduce.py)."""
HIDDEN = {
    # broadcast: the number of devices k (at most 8)
    "broadcast": [4],
    # reduce_scatter, all_gather: (k devices, values per chunk)
    "reduce_scatter": [(4, 3)],
    "all_gather": [(4, 3)],
    # ring_allreduce: (k devices, length of x; need not divide by k)
    "ring_allreduce": [(4, 10), (8, 3)],
    # few_steps: (k devices, a power of two; length of x)
    "few_steps": [(4, 5), (2, 3)],
}
