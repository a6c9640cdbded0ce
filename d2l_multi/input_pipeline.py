"""Input pipelines with Grain's dataset API: an array data source, a shuffled, batched,
per-process sharded pipeline whose position (the iterator state) can be saved and restored with
a checkpoint, and whose state says which pipeline it belongs to. The public names check their
arguments first (``check.validated``)."""
import grain

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


def _check_source(self, X, y):
    check.labels(X, y)


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
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not (
            1 <= batch_size <= per_shard):
        raise InputError(f"batch_size={batch_size!r}, but this process's shard holds {per_shard} "
                         f"records ({num_records} records / {count} shards); pass an integer "
                         f"from 1 to {per_shard}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise InputError(f"seed must be an integer from 0 to 2**32 - 1, got {seed!r}")
    if num_epochs is not None:
        check.positive(num_epochs=num_epochs)


def grain_loader(source, batch_size, seed=0, num_epochs=None,
                 shard_options=None):
    """This process's batches of ``source``, reshuffled every epoch."""
    if shard_options is None:  # process q of P reads records q, q + P, ...
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


def _check_grain_loader(source, batch_size, seed=0, num_epochs=None,
                        shard_options=None):
    """Raise a ValueError unless the arguments make a pipeline."""
    if shard_options is None:
        shard_options = grain.sharding.ShardByJaxProcess(drop_remainder=True)
    _check_loader_inputs(len(source), shard_options.shard_count, batch_size,
                         seed, num_epochs)


grain_loader = check.validated(grain_loader, _check_grain_loader)
