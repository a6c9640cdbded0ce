"""Hidden cases of notebook 06_keras's checks (d2l_multi/exercises/keras.py)."""
HIDDEN = {
    # model_parallel: (seed of the weights and batch, the ('batch', 'model') mesh of 8 devices)
    "model_parallel": [(1, (2, 4)), (2, (4, 2))],
}
