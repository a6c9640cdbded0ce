"""Hidden cases of notebook 03_data_parallel_from_scratch's checks
(d2l_multi/exercises/data_parallel_from_scratch.py)."""
HIDDEN = {
    # split_batch: ("split", batch, devices, feature shape) with a batch that divides, or
    # ("refuse", batch, devices) with one that does not (a ValueError naming the batch)
    "split_batch": [("split", 12, 4, (2, 2)), ("split", 6, 1, ()), ("refuse", 10, 4),
                    ("refuse", 7, 2)],
    # pmean_step: (devices, batch, learning rate)
    "pmean_step": [(4, 12, 0.5)],
    # grad_accumulation: (batch, micro-batches, learning rate)
    "grad_accumulation": [(24, 3, 0.3), (8, 1, 0.1)],
}
