"""Input pipelines with Grain: an array data source, a shuffled, batched, per-process sharded
loader whose position (the iterator state) can be saved and restored with a checkpoint."""
import grain


class ArraySource:
    """A Grain data source over two arrays: record ``i`` is ``(X[i], y[i])``."""

    def __init__(self, X, y):
        if len(X) != len(y):
            raise ValueError(f"X has {len(X)} examples but y has {len(y)} labels; pass arrays "
                             f"with one label per example (the same first dimension)")
        self.X, self.y = X, y

    def __len__(self):
        return len(self.X)

    def __getitem__(self, index):
        return self.X[index], self.y[index]

    def __repr__(self):  # Grain stores it in the iterator state and checks it on restore
        return (f"ArraySource(X={self.X.dtype}{list(self.X.shape)}, "
                f"y={self.y.dtype}{list(self.y.shape)})")


def grain_loader(source, batch_size, seed=0, num_epochs=None, shard_options=None,
                 worker_count=0):
    """A Grain DataLoader over ``source``: reshuffled with ``seed`` every epoch, batches of
    ``batch_size`` records for this process, which reads only the share of the records that
    ``shard_options`` gives it (default: ``ShardByJaxProcess``). ``num_epochs=None``: forever."""
    if shard_options is None:
        shard_options = grain.sharding.ShardByJaxProcess(drop_remainder=True)
    per_shard = len(source) // shard_options.shard_count
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not (
            1 <= batch_size <= per_shard):
        raise ValueError(
            f"batch_size={batch_size!r}, but this process's shard holds {per_shard} records "
            f"({len(source)} records / {shard_options.shard_count} shards); pass an integer "
            f"batch size from 1 to {per_shard}")
    sampler = grain.samplers.IndexSampler(len(source), shuffle=True, seed=seed,
                                          num_epochs=num_epochs)
    return grain.DataLoader(data_source=source, sampler=sampler,
                            operations=[grain.transforms.Batch(batch_size, drop_remainder=True)],
                            shard_options=shard_options, worker_count=worker_count)
