"""Input pipelines with Grain's dataset API: an array data source, a shuffled, batched,
per-process sharded pipeline whose position (the iterator state) can be saved and restored with
a checkpoint, and whose state says which pipeline it belongs to. The public names check their
arguments first (``check.validated``)."""
from typing import Any

import grain
from jax.typing import ArrayLike

from . import _checks as check
from .errors import InputError


class ArraySource:
    """A Grain data source over two arrays: record ``i`` is ``(X[i], y[i])``."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.X)

    def __getitem__(self, index):
        return self.X[index], self.y[index]

    def __repr__(self):  # part of the pipeline's description, in its states
        return (f"ArraySource(X={self.X.dtype}{list(self.X.shape)}, "
                f"y={self.y.dtype}{list(self.y.shape)})")


def _check_source(self: ArraySource, X: ArrayLike, y: ArrayLike) -> None:
    check.examples(X, y)
    check.labels(y)


ArraySource.__init__ = check.validated(ArraySource.__init__, _check_source)


class CheckedIterator(grain.DatasetIterator):
    """An iterator whose state names its pipeline; refuses other states."""

    def __init__(self, parent, description):
        super().__init__(parent)
        self.description = description

    def __next__(self):
        return next(self._parent)

    def get_state(self):
        return {"pipeline": self.description, **self._parent.get_state()}

    def set_state(self, state):
        if state.get("pipeline") != self.description:
            raise ValueError(f"the iterator state was saved by the pipeline "
                             f"{state.get('pipeline')}, not by this one "
                             f"({self.description})")
        self._parent.set_state(
            {k: v for k, v in state.items() if k != "pipeline"})


class CheckedPipeline(grain.IterDataset):
    """``parent`` (an IterDataset) whose iterators are ``CheckedIterator``s."""

    def __init__(self, parent, description):
        super().__init__(parent)
        self.description = description

    def __iter__(self):
        return CheckedIterator(self._parent.__iter__(), self.description)


def _check_loader_inputs(num_records, count, batch_size, seed, num_epochs):
    """Raise a ValueError unless ``batch_size``, ``seed`` and ``num_epochs`` suit a shard."""
    per_shard = num_records // count
    try:
        check.integer(1, per_shard, batch_size=batch_size)
    except InputError:
        raise InputError(f"batch_size={batch_size!r}, but this process's shard holds {per_shard} "
                         f"records ({num_records} records / {count} shards); pass an integer "
                         f"from 1 to {per_shard}") from None
    check.integer(0, 2**32 - 1, seed=seed)
    check.integer(1, none=True, num_epochs=num_epochs)


def grain_loader(source, batch_size, seed=0, num_epochs=None,
                 shard_options=None):
    """This process's batches of ``source``, reshuffled every epoch."""
    if shard_options is None:  # process p of P reads records p, p + P, ...
        shard_options = grain.sharding.ShardByJaxProcess(drop_remainder=True)
    count, index = shard_options.shard_count, shard_options.shard_index
    stop = (len(source) - len(source) % count  # equal shards: drop the rest
            if shard_options.drop_remainder else None)
    dataset = (grain.MapDataset.source(source)
               .shuffle(seed=seed)       # a new order every epoch
               [index:stop:count]        # this process's shard of that order
               .repeat(num_epochs)       # None: forever
               .batch(batch_size, drop_remainder=True))
    iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0))
    return CheckedPipeline(iterable, f"{source!r}, seed={seed}, shard {index} "
                                     f"of {count}, batch_size={batch_size}")


def _check_grain_loader(source: Any, batch_size: int, seed: int = 0,
                        num_epochs: int | None = None,
                        shard_options: grain.sharding.ShardOptions | None = None) -> None:
    """Raise a ValueError unless the arguments make a pipeline."""
    check.nonempty(source=source)
    if shard_options is None:
        shard_options = grain.sharding.ShardByJaxProcess(drop_remainder=True)
    _check_loader_inputs(len(source), shard_options.shard_count, batch_size,
                         seed, num_epochs)


def _check_description(self: Any, parent: Any, description: str) -> None:
    if not isinstance(description, str):
        raise InputError(f"description must be a string naming the pipeline, got "
                         f"{description!r}")


grain_loader = check.validated(grain_loader, _check_grain_loader)
CheckedIterator.__init__ = check.validated(CheckedIterator.__init__, _check_description)
CheckedPipeline.__init__ = check.validated(CheckedPipeline.__init__, _check_description)
