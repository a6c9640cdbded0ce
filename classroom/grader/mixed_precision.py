"""Hidden cases of notebook 07c_mixed_precision's checks
(d2l_multi/exercises/mixed_precision.py)."""
HIDDEN = {
    # master_weights: (learning rate, gradient, steps)
    "master_weights": [(0.01, 2e-3, 300)],
    # lost_updates: (seed of the weights and gradients, learning rate)
    "lost_updates": [(1, 0.05), (2, 1.0)],
}
