"""Hidden cases of notebook 09b_transformer_and_meshes's checks
(d2l_multi/exercises/transformer_and_meshes.py)."""
HIDDEN = {
    # logical_rules: a value, checked whole by its public case; nothing hidden to add
    "logical_rules": [],
}
