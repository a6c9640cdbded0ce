"""Hidden cases of notebook 07d_low_precision_communication's checks
(d2l_multi/exercises/low_precision_communication.py)."""
HIDDEN = {
    # ring_sum: (seed of the parts, k devices; at least 16, where one rounding and k - 1
    # differ clearly)
    "ring_sum": [(1, 24), (2, 32)],
    # bf16_gather: (seed of the parts, k devices of the mesh, length of x, a multiple of k)
    "bf16_gather": [(1, 4, 1000), (2, 8, 4096)],
}
