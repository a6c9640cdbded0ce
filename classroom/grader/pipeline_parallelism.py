"""Hidden cases of notebook 09e_pipeline_parallelism's checks
(d2l_multi/exercises/pipeline_parallelism.py)."""
HIDDEN = {
    # balanced_stages: (each block's cost, stages)
    "balanced_stages": [((1, 2, 3, 4, 5, 6, 7, 8), 4), ((5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5), 3),
                        ((1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 10), 2), ((4, 4, 4), 3)],
    # interleaved: (p devices, m micro-batches, a multiple of p; v chunks per device)
    "interleaved": [(3, 6, 2), (4, 12, 3), (8, 16, 2), (2, 2, 2), (3, 9, 1), (4, 12, 1)],
}
