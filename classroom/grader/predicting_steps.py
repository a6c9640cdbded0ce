"""Hidden cases of notebook 07b_predicting_steps's checks
(d2l_multi/exercises/predicting_steps.py)."""
HIDDEN = {
    # step_time: (compute seconds for the whole batch on one device, devices, gradient bytes,
    # alpha, beta)
    "step_time": [(1.0, 16, 1e9, 2e-6, 4e-11), (0.3, 4, 0.0, 1e-5, 1e-9)],
}
