"""Hidden cases of notebook 09c_meshes_and_rules's checks
(d2l_multi/exercises/meshes_and_rules.py)."""
HIDDEN = {
    # logical_rules: a value, checked whole by its public case; nothing hidden to add
    "logical_rules": [],
}
