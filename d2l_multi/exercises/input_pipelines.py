"""The checks of the exercises of notebook 10b_input_pipelines."""
import numpy as np

from ._common import _call, _exercise, _fail, _first_line, _observe

# --------------------------------------------------------------------------------------------
# 10b: input pipelines


def _make(seed=0):
    """A fresh iterator over 64 shuffled numbers in batches of 4."""
    import grain
    dataset = grain.MapDataset.range(64).shuffle(seed=seed).batch(4)
    return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=0)))


def _resume_probe(save_position, resume, taken):
    import pickle
    it = _make()
    for _ in range(taken):
        next(it)
    saved = _call(save_position, "save_position", it)
    if saved is it:
        return {"saved": "iterator"}
    try:
        saved = pickle.loads(pickle.dumps(saved))
    except Exception as e:
        return {"saved": f"unpicklable {type(e).__name__}"}
    resumed = _call(resume, "resume", _make, saved)
    try:
        got = [np.asarray(next(resumed)).tolist() for _ in range(2)]
    except Exception as e:
        return {"saved": "ok", "failed": f"{type(e).__name__}: {_first_line(e)}"}
    return {"saved": "ok", "batches": got}


@_exercise("10b_input_pipelines", cases=[3],
           passed="the same batches after restoring as without stopping")
def exact_resume(save_position, resume, taken):
    """``save_position(iterator)`` returns what goes into the checkpoint; ``resume(make_iterator,
    saved)`` returns an iterator that continues exactly where the saved one stood."""
    seen = _observe(lambda: _resume_probe(save_position, resume, taken))
    if seen["saved"] == "iterator":
        _fail("you saved the iterator itself: a checkpoint needs its state (get_state()), which "
              "can be written to disk")
    if seen["saved"] != "ok":
        _fail(f"what you save cannot be written to disk ({seen['saved'][12:]}): save the "
              f"iterator's state")
    if "failed" in seen:
        _fail(f"the resumed iterator failed: {seen['failed']}")
    it = _make()
    for _ in range(taken):
        next(it)
    expected = [np.asarray(next(it)).tolist() for _ in range(2)]
    got = seen["batches"]
    if got == expected:
        return
    fresh = _make()
    first = [np.asarray(next(fresh)).tolist() for _ in range(2)]
    if got == first and taken:
        _fail(f"your resumed iterator starts from the beginning: the run would see the first "
              f"{taken} batches twice; restore the saved state (set_state)")
    _fail("the batches after resuming differ from those the run would have seen next")
