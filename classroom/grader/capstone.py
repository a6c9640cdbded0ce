"""Hidden cases of notebook 12_capstone's checks
(d2l_multi/exercises/capstone.py)."""
HIDDEN = {
    # rules_2d: ("2x4", seed); seed 1 is a wider model of 2 blocks and 24 tokens
    "rules_2d": [("2x4", 1)],
    # memory_prediction: (model, layouts); "other" is the wider model
    "memory_prediction": [("other", ("dp", "tp", "dp+tp", "fsdp+tp"))],
    # sharded_training: the seed of the token batches
    "sharded_training": [1],
}
