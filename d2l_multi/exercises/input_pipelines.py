"""The checks of the exercises of notebook 10b_input_pipelines."""
import numpy as np

from ._common import _call, _exercise, _fail, _first_line

# --------------------------------------------------------------------------------------------
# 10b: input pipelines

@_exercise("10b_input_pipelines")
def exact_resume(save_position, resume, hidden=False):
    """``save_position(iterator)`` returns what goes into the checkpoint; ``resume(make_iterator,
    saved)`` returns an iterator that continues exactly where the saved one stood."""
    import pickle

    import grain

    def make(seed=0):
        dataset = grain.MapDataset.range(64).shuffle(seed=seed).batch(4)
        return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    for taken in [3] + ([0, 11] if hidden else []):
        it = make()
        for _ in range(taken):
            next(it)
        saved = _call(save_position, "save_position", it)
        if saved is it:
            _fail("you saved the iterator itself: a checkpoint needs its state "
                  "(get_state()), which can be written to disk")
        try:
            saved = pickle.loads(pickle.dumps(saved))
        except Exception as e:
            _fail(f"what you save cannot be written to disk ({type(e).__name__}): save the "
                  f"iterator's state")
        expected = [np.asarray(next(it)).tolist() for _ in range(2)]
        resumed = _call(resume, "resume", make, saved)
        try:
            got = [np.asarray(next(resumed)).tolist() for _ in range(2)]
        except Exception as e:
            _fail(f"the resumed iterator failed: {type(e).__name__}: {_first_line(e)}")
        if got == expected:
            continue
        fresh = make()
        first = [np.asarray(next(fresh)).tolist() for _ in range(2)]
        if got == first and taken:
            _fail(f"your resumed iterator starts from the beginning: the run would see the "
                  f"first {taken} batches twice; restore the saved state (set_state)")
        _fail("the batches after resuming differ from those the run would have seen next")
    return "the same batches after restoring as without stopping"
