"""Hidden cases of notebook 07a_collectives's checks (d2l_multi/exercises/collectives.py)."""
HIDDEN = {
    # alpha_beta: (devices, alpha seconds per step, beta seconds per byte)
    "alpha_beta": [(2, 1e-4, 1e-9), (16, 3e-6, 2e-11)],
    # bus_bandwidth: (collective: "psum", "all_gather" or "psum_scatter", devices, bytes,
    # seconds)
    "bus_bandwidth": [("psum", 2, 10**6, 1e-4), ("all_gather", 16, 3 * 2**20, 5e-3)],
}
