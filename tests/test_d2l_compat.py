"""Code written for d2l's JAX API runs with ``import d2l_multi as d2l``."""
import inspect

import jax
import pytest

import d2l_multi as d2l

# d2l's names and the leading parameters d2l gives them (d2l.ai, JAX edition and the
# multi-GPU chapter); ours may add keyword parameters after these, never reorder them.
SIGNATURES = {
    "Timer": [], "Accumulator": ["n"],
    "Animator": ["xlabel", "ylabel", "legend", "xlim", "ylim", "xscale", "yscale", "fmts",
                 "nrows", "ncols", "figsize"],
    "FashionMNIST": ["batch_size", "resize"],
    "load_data_fashion_mnist": ["batch_size", "resize"],
    "show_images": ["imgs", "num_rows", "num_cols", "titles", "scale"],
    "set_axes": ["axes", "xlabel", "ylabel", "xlim", "ylim", "xscale", "yscale", "legend"],
    "use_svg_display": [], "try_gpu": ["i"], "try_all_gpus": [], "num_gpus": [],
    "split_batch": ["X", "y"], "train": ["num_devices", "batch_size", "lr"],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_d2l_names_take_d2l_arguments_in_d2l_order(name):
    params = list(inspect.signature(getattr(d2l, name)).parameters)
    assert params[:len(SIGNATURES[name])] == SIGNATURES[name]


def test_the_package_says_exactly_which_d2l_names_it_offers():
    """Every d2l name above is named as offered; d2l's classes it lacks are named as absent."""
    import d2l_multi
    doc = " ".join(d2l_multi.__doc__.split())
    offered, absent = doc.split("is not offered")[0].rsplit("d2l's class framework", 1)
    for name in SIGNATURES:
        assert f"``{name}``" in offered, name
    for name in ("Module", "Trainer", "DataModule", "HyperParameters"):
        assert f"``{name}``" in absent and not hasattr(d2l_multi, name), name


def test_device_helpers_answer_like_d2l():
    assert d2l.num_gpus() == len([d for d in jax.devices() if d.platform != "cpu"])
    assert d2l.try_all_gpus() == d2l.devices() and len(d2l.try_all_gpus()) >= 1
    assert d2l.try_gpu() == d2l.devices()[0]
    assert d2l.try_gpu(10_000).platform == "cpu"  # no such device: the CPU, as in d2l


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
