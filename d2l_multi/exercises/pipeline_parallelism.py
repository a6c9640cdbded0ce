"""The checks of the exercises of notebook 09d_pipeline_parallelism."""
import itertools

from ._common import _call, _exercise, _fail, _observe

# --------------------------------------------------------------------------------------------
# 09d: pipeline parallelism


def _slowest(costs, counts):
    """The cost of the slowest stage when stage s gets the next ``counts[s]`` blocks."""
    bounds = list(itertools.accumulate(counts, initial=0))
    return max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))


def _fastest_possible(costs, p):
    """The slowest stage of the best split, found by trying every split into p stages."""
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), p - 1):
        counts = [b - a for a, b in zip((0, *cuts), (*cuts, len(costs)))]
        slowest = _slowest(costs, counts)
        best = slowest if best is None else min(best, slowest)
    return best


def _counts(out):
    try:
        counts = list(out)
    except TypeError:
        _fail(f"`split_stages` should return a list of block counts, got {type(out).__name__}")
    if not all(isinstance(c, int) or (hasattr(c, "is_integer") and c.is_integer())
               for c in counts):
        _fail(f"`split_stages` returned {counts[:8]}: give each stage a whole number of blocks")
    return [int(c) for c in counts]


@_exercise("09d_pipeline_parallelism",
           cases=[((3, 1, 1, 1, 1, 1, 1, 4), 4), ((2, 2, 2, 2, 2, 2), 3)],
           passed="the slowest stage is as fast as any split into consecutive blocks allows")
def balanced_stages(split_stages, case):
    """``split_stages(costs, p)``: how many consecutive blocks each of the p stages runs
    (stage 0 first), ``costs`` being each block's time, so that the slowest stage, which
    paces every slot of the pipeline, is as fast as possible."""
    costs, p = case
    counts = _observe(lambda: _counts(_call(split_stages, "split_stages", list(costs), p)))
    L = len(costs)
    if len(counts) != p:
        _fail(f"for {p} stages return {p} block counts, one per stage; got {len(counts)}")
    if min(counts) < 1:
        _fail(f"your split {counts} leaves a stage without blocks: every stage gets at least "
              f"one")
    if sum(counts) != L:
        _fail(f"your split {counts} gives the stages {sum(counts)} blocks; the model has {L}")
    slowest, best = _slowest(costs, counts), _fastest_possible(costs, p)
    if slowest <= best:
        return
    if max(counts) - min(counts) <= 1:
        _fail(f"equal numbers of blocks are not equal work: with costs {list(costs)} your "
              f"slowest stage costs {slowest:g}, and a split whose slowest stage costs "
              f"{best:g} exists")
    _fail(f"with costs {list(costs)} on {p} stages your slowest stage costs {slowest:g}; a "
          f"split whose slowest stage costs {best:g} exists: move blocks off the slowest stage")
