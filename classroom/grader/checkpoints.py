"""Hidden cases of notebook 10a_checkpoints's checks (d2l_multi/exercises/checkpoints.py)."""
HIDDEN = {
    # fsdp_restore: (the ('data', 'model') mesh restored onto, at most 8 devices; the seed of
    # the parameters and batches)
    "fsdp_restore": [((4, 2), 1), ((8, 1), 2)],
}
