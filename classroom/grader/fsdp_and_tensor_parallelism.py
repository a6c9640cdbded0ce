"""Hidden cases of notebook 09d_fsdp_and_tensor_parallelism's checks
(d2l_multi/exercises/fsdp_and_tensor_parallelism.py)."""
HIDDEN = {
    # fsdp_spec, megatron_specs: "forward" runs a forward pass with the layout on 8 devices
    "fsdp_spec": ["forward"],
    "megatron_specs": ["forward"],
    # zero1_adam: (k devices, d, h): W1 is d x h, W2 h x d, both divisible by k
    "zero1_adam": [(8, 8, 24), (2, 8, 12)],
    # sp_mlp: (k devices, T tokens, d): T divisible by k
    "sp_mlp": [(8, 32, 16), (2, 6, 12)],
}
