"""Hidden cases of notebook 09c_fsdp_and_tensor_parallelism's checks
(d2l_multi/exercises/fsdp_and_tensor_parallelism.py)."""
HIDDEN = {
    # fsdp_spec, megatron_specs: "forward" runs a forward pass with the layout on 8 devices
    "fsdp_spec": ["forward"],
    "megatron_specs": ["forward"],
}
