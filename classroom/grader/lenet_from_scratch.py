"""Hidden cases of notebook 01_lenet_from_scratch's checks
(d2l_multi/exercises/lenet_from_scratch.py)."""
HIDDEN = {
    # cross_entropy: (batch, classes, logit scale; negative: the first class very unlikely)
    "cross_entropy": [(5, 3, 1.0), (16, 4, -800.0)],
    # sgd_update: the parameters' pytree, "list" or "dict"
    "sgd_update": ["dict"],
}
