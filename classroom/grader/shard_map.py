"""Hidden cases of notebook 04b_shard_map's checks (d2l_multi/exercises/shard_map.py)."""
HIDDEN = {
    # shard_map_grad: (devices, batch)
    "shard_map_grad": [(4, 12)],
}
