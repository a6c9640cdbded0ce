"""Code written for d2l's JAX API runs with ``import d2l_multi as d2l``."""
import os

import pytest

import d2l_multi as d2l

NAMES = ["Timer", "Accumulator", "Animator", "FashionMNIST", "try_all_gpus", "try_gpu",
         "num_gpus", "split_batch", "train_batch", "load_data_fashion_mnist", "show_images",
         "set_axes", "use_svg_display", "evaluate_accuracy", "train", "allreduce"]


@pytest.mark.parametrize("name", NAMES)
def test_d2l_names_exist(name):
    assert callable(getattr(d2l, name))


@pytest.mark.skipif(not os.environ.get("D2L_MULTI_DATA"), reason="needs D2L_MULTI_DATA")
def test_d2l_style_training_script_runs(tmp_path):
    # As written for `from d2l import jax as d2l`, only the import changed.
    import jax
    import jax.numpy as jnp
    data = d2l.FashionMNIST(batch_size=256)
    animator = d2l.Animator(xlabel="epoch", xlim=[1, 3], legend=["train loss", "test acc"])
    params = d2l.init_lenet_params(jax.random.key(0))
    step = jax.jit(lambda p, X, y: [a - 0.1 * g for a, g in
                                    zip(p, jax.grad(d2l.loss_fn)(p, X, y))])
    timer = d2l.Timer()
    for epoch in range(3):
        timer.start()
        for i, (X, y) in enumerate(data.get_dataloader(train=True)):
            params = step(params, jnp.asarray(X), jnp.asarray(y))
            if i == 3:
                break
        timer.stop()
        X, y = next(iter(data.get_dataloader(train=False)))
        animator.add(epoch + 1, (float(jax.jit(d2l.loss_fn)(params, X, y)),
                                 d2l.evaluate_accuracy(params, [(X, y)])))
    assert len(timer.times) == 3 and len(animator.X[0]) == 3
    assert animator.save(tmp_path / "curve.png").stat().st_size > 1000
