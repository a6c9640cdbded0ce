"""Grain pipelines (the dataset API): shuffled epochs, per-process shards that together form the
global batch, and an iterator state that brings a fresh pipeline (directly or through a
checkpoint) to exactly the batches the interrupted one would have served next, and that a
pipeline built differently refuses."""
import functools
import operator

import grain
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l

N, BATCH = 48, 8  # 6 batches per epoch


@pytest.fixture(scope="module")
def source():
    rng = np.random.default_rng(0)
    return d2l.ArraySource(np.arange(N), rng.integers(0, 10, N).astype(np.int32))


def records(loader, n):
    it = iter(loader)
    return [next(it)[0].tolist() for _ in range(n)]


def test_array_source_is_random_access_with_a_stable_repr(source):
    assert len(source) == N and source[5][0] == 5
    assert repr(source) == "ArraySource(X=int64[48], y=int32[48])"
    with pytest.raises(ValueError, match=r"X has 3 examples but y has 2 labels"):
        d2l.ArraySource(np.zeros(3), np.zeros(2))


def test_every_epoch_serves_every_record_once_in_a_new_order(source):
    batches = records(d2l.grain_loader(source, BATCH, seed=0), 2 * N // BATCH)
    epoch_1 = functools.reduce(operator.iadd, batches[:N // BATCH], [])
    epoch_2 = functools.reduce(operator.iadd, batches[N // BATCH:], [])
    assert sorted(epoch_1) == list(range(N)) and sorted(epoch_2) == list(range(N))
    assert epoch_1 != epoch_2 and epoch_1 != list(range(N))  # shuffled, and reshuffled
    assert records(d2l.grain_loader(source, BATCH, seed=0), 3) == batches[:3]
    assert records(d2l.grain_loader(source, BATCH, seed=1), 3) != batches[:3]


def test_num_epochs_stops_the_loader(source):
    assert len(list(d2l.grain_loader(source, BATCH, num_epochs=1))) == N // BATCH


def test_shards_split_every_global_batch_between_processes(source):
    whole = records(d2l.grain_loader(source, 2 * BATCH, seed=0,
                                     shard_options=grain.sharding.NoSharding()), 3)
    shards = [records(d2l.grain_loader(source, BATCH, seed=0,
                                       shard_options=grain.sharding.ShardOptions(i, 2, True)), 3)
              for i in range(2)]
    for b in range(3):
        assert not set(shards[0][b]) & set(shards[1][b])
        assert sorted(shards[0][b] + shards[1][b]) == sorted(whole[b])
        assert shards[0][b] == whole[b][0::2] and shards[1][b] == whole[b][1::2]


def test_default_shard_options_follow_the_jax_processes(source):
    assert jax.process_count() == 1
    assert records(d2l.grain_loader(source, BATCH), 4) == records(
        d2l.grain_loader(source, BATCH, shard_options=grain.sharding.NoSharding()), 4)


@pytest.mark.parametrize("consumed", [0, 3, 5, 7])  # 5, 7: across the epoch boundary
def test_set_state_resumes_with_the_same_batches(source, consumed):
    it = iter(d2l.grain_loader(source, BATCH, seed=3))
    for _ in range(consumed):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    resumed = iter(d2l.grain_loader(source, BATCH, seed=3))
    resumed.set_state(state)
    for (X, y), (X2, y2) in zip(expected, [next(resumed) for _ in range(3)]):
        assert np.array_equal(X, X2) and np.array_equal(y, y2)


@pytest.mark.parametrize("api", ["grain_loader", "MapDataset"])
def test_iterator_saved_with_the_checkpoint_resumes_exactly(source, tmp_path, api):
    def fresh():
        if api == "grain_loader":
            return iter(d2l.grain_loader(source, BATCH, seed=0))
        return iter(grain.MapDataset.source(source).shuffle(seed=0).repeat()
                    .to_iter_dataset().batch(BATCH, drop_remainder=True))
    mesh = d2l.device_mesh((4, 2))
    state = {"w": d2l.shard(np.arange(16.0), mesh, P("model"))}
    it = fresh()
    for _ in range(4):
        next(it)
    with d2l.checkpoint_manager(tmp_path) as manager:
        d2l.save_checkpoint(manager, 4, state, it)
    expected = [next(it) for _ in range(3)]  # what the run would have seen next
    resumed = fresh()
    restored = d2l.restore_checkpoint(tmp_path, d2l.abstract_like(state, mesh, {"w": P("model")}),
                                      data_iter=resumed)
    assert np.array_equal(restored["w"], np.arange(16.0))
    got = [next(resumed) for _ in range(3)]
    for (X, y), (X2, y2) in zip(expected, got):
        assert np.array_equal(X, X2) and np.array_equal(y, y2)
    unrestored = next(fresh())
    assert not np.array_equal(unrestored[0], expected[0][0])  # the test can tell them apart


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, N + 1])
def test_bad_batch_sizes_say_what_fits(source, bad):
    with pytest.raises(ValueError, match=rf"batch_size={bad!r}, .* holds {N} records .* "
                                         rf"from 1 to {N}"):
        d2l.grain_loader(source, bad)


def test_batch_larger_than_a_shard(source):
    with pytest.raises(ValueError, match=r"holds 24 records \(48 records / 2 shards\)"):
        d2l.grain_loader(source, 25, shard_options=grain.sharding.ShardOptions(0, 2, True))


def test_a_loader_built_differently_rejects_the_state(source):
    it = iter(d2l.grain_loader(source, BATCH, seed=0))
    next(it)
    state = it.get_state()
    for pipeline in [d2l.grain_loader(source, BATCH, seed=1), d2l.grain_loader(source, BATCH // 2),
                     d2l.grain_loader(source, BATCH, shard_options=grain.sharding.ShardOptions(
                         1, 2, True)),
                     d2l.grain_loader(d2l.ArraySource(np.arange(N + 1), np.zeros(N + 1, np.int32)),
                                      BATCH)]:
        other = iter(pipeline)
        with pytest.raises(ValueError, match=r"saved by the pipeline ArraySource\(X=int64\[48\]"
                                             r".*seed=0, shard 0 of 1, batch_size=8, not by "
                                             r"this one \(ArraySource"):
            other.set_state(state)
        assert next(other)[0].tolist() == next(iter(pipeline))[0].tolist()  # not moved


def test_uneven_shards_drop_the_remainder(source):
    odd = d2l.ArraySource(np.arange(N + 1), np.zeros(N + 1, np.int32))
    def shard(i):
        options = grain.sharding.ShardOptions(i, 2, drop_remainder=True)
        return functools.reduce(operator.iadd, records(
            d2l.grain_loader(odd, BATCH, shard_options=options), 3), [])
    shards = [shard(i) for i in range(2)]
    assert len(shards[0]) == len(shards[1]) == 24 and not set(shards[0]) & set(shards[1])


@pytest.mark.parametrize("kwargs,message", [
    (dict(seed=-1), "seed must be an integer from 0 to 4294967295, got -1"),
    (dict(seed=1.5), "seed must be an integer from 0 to 4294967295, got 1.5"),
    (dict(num_epochs=0), "num_epochs must be a positive integer or None, got 0"),
    (dict(num_epochs=True), "num_epochs must be a positive integer or None, got True"),
])
def test_bad_seeds_and_epochs(source, kwargs, message):
    with pytest.raises(ValueError) as e:
        d2l.grain_loader(source, BATCH, **kwargs)
    assert message in str(e.value)
