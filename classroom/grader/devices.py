"""Hidden cases of notebook 00_devices's checks (d2l_multi/exercises/devices.py)."""
HIDDEN = {
    # mesh_layout: (mesh shape (rows, columns), array shape); each divides, at most 8 devices
    "mesh_layout": [((4, 2), (8, 6)), ((2, 2), (4, 10))],
}
