"""The checks of the exercises of notebook 09e_pipeline_parallelism."""
import itertools

from ._common import _call, _exercise, _fail, _observe

# --------------------------------------------------------------------------------------------
# 09e: pipeline parallelism


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


@_exercise("09e_pipeline_parallelism",
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


# --------------------------------------------------------------------------------------------
# 09e: interleaved 1F1B

def _passes(out, p, m, v):
    """The student's schedule as p lists of (kind, micro-batch, chunk), or fail."""
    try:
        devices = [list(ops) for ops in out]
    except TypeError:
        _fail(f"`interleaved_1f1b` should return a list of p lists of passes, got "
              f"{type(out).__name__}")
    if len(devices) != p:
        _fail(f"for p={p} return {p} lists of passes, one per device; got {len(devices)}")
    clean = []
    for ops in devices:
        row = []
        for op in ops:
            try:
                kind, j, c = op
                j, c = int(j), int(c)
            except (TypeError, ValueError):
                _fail(f"a pass should be a tuple ('F' or 'B', micro-batch, chunk), got {op!r}"[
                    :200])
            if kind not in ("F", "B") or not 0 <= j < m or not 0 <= c < v * p:
                _fail(f"the pass {(kind, j, c)} is not ('F' or 'B', micro-batch 0..{m - 1}, "
                      f"chunk 0..{v * p - 1})")
            row.append((kind, j, c))
        clean.append(row)
    return clean


def _needs(kind, j, c, chunks):
    """The passes a pass waits for: the forward of the chunk before; the backward of the
    chunk after and the chunk's own forward."""
    if kind == "F":
        return [("F", j, c - 1)] if c > 0 else []
    return [("F", j, c)] + ([("B", j, c + 1)] if c < chunks - 1 else [])


def _play_chunks(orders, chunks, t_f=1.0, t_b=2.0):
    """Run each device's passes in its order, each when its device is free and the passes
    it needs are done (no time to communicate). Returns (finish time of each pass, the
    stuck passes: each device's next pass when no device can go on)."""
    finish, at, free = {}, [0] * len(orders), [0.0] * len(orders)
    progress = True
    while progress:
        progress = False
        for s, ops in enumerate(orders):
            while at[s] < len(ops) and all(n in finish for n in _needs(*ops[at[s]], chunks)):
                kind, j, c = ops[at[s]]
                start = max([free[s]] + [finish[n] for n in _needs(kind, j, c, chunks)])
                free[s] = finish[(kind, j, c)] = start + (t_f if kind == "F" else t_b)
                at[s] += 1
                progress = True
    return finish, [(s, ops[at[s]]) for s, ops in enumerate(orders) if at[s] < len(ops)]


def _held(orders, finish, t_f=1.0):
    """The most chunk activations each device holds at once: from the start of a chunk's
    forward to the end of its backward."""
    peaks = []
    for ops in orders:
        events = sorted([(finish[op] - t_f, 1) for op in ops if op[0] == "F"]
                        + [(finish[op], -1) for op in ops if op[0] == "B"])
        held = peak = 0
        for _, change in events:
            held += change
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def _name(op):
    kind, j, c = op
    return f"{'forward' if kind == 'F' else 'backward'} of micro-batch {j} on chunk {c}"


@_exercise("09e_pipeline_parallelism", cases=[(4, 8, 2), (2, 4, 3), (2, 6, 1)],
           passed="every pass once on its device, no deadlock, the bubble of v m "
                  "micro-batches and 1F1B's memory")
def interleaved(interleaved_1f1b, case):
    """``interleaved_1f1b(p, m, v)``: each device's passes in order, ``('F' or 'B',
    micro-batch, chunk)``, the model cut into v p chunks, device s holding chunks s, s + p,
    ...; played with forwards of 1 and backwards of 2 time units per chunk, its bubble is
    (p - 1)/(v m + p - 1) of the time, as 1F1B's with v m micro-batches (Megatron-LM's
    (p - 1)/(v m) counts the same idle time against the busy time), and no device holds
    more than (v + 1) p chunk activations at once, each held from the start of its
    forward to the end of its backward: 1F1B's p micro-batches of v chunks, plus p (v = 1
    included, where GPipe's order would hold all m)."""
    p, m, v = case
    orders = _observe(lambda: _passes(_call(interleaved_1f1b, "interleaved_1f1b", p, m, v),
                                      p, m, v))
    for s, ops in enumerate(orders):
        wrong = sorted({c for _, _, c in ops if c % p != s})
        if wrong:
            _fail(f"device {s} runs chunk {wrong[0]}: with p={p}, device s holds chunks s, "
                  f"s+p, s+2p, ... (chunk c on device c mod p)")
    for s, ops in enumerate(orders):
        want = {(kind, j, c * p + s) for kind in "FB" for j in range(m) for c in range(v)}
        if set(ops) <= {op for op in want if op[2] == s} and v > 1:
            _fail(f"device {s} runs only chunk {s}: interleaving gives each device v={v} "
                  f"chunks, {', '.join(str(c * p + s) for c in range(v))}")
        twice = sorted({op for op in ops if ops.count(op) > 1})
        if twice:
            _fail(f"device {s} runs the {_name(twice[0])} twice: every pass runs once")
        missing = sorted(want - set(ops))
        if missing:
            _fail(f"device {s} never runs the {_name(missing[0])}")
    finish, stuck = _play_chunks(orders, v * p)
    for s, op in stuck:
        if op[0] == "B" and ("F", op[1], op[2]) not in finish:
            _fail(f"device {s} schedules the {_name(op)} before its forward: a backward "
                  f"needs its own forward's activations")
    if stuck:
        s, op = stuck[0]
        waits = next(n for n in _needs(*op, v * p) if n not in finish)
        _fail(f"your schedule deadlocks: device {s} waits at the {_name(op)} for the "
              f"{_name(waits)}, which device {waits[2] % p} runs only after passes that wait "
              f"in turn; order each device's passes so that someone can always go on")
    held, bound = _held(orders, finish), (v + 1) * p
    if max(held) > bound:
        s = held.index(max(held))
        all_forwards = all(op[0] == "F" for op in orders[s][:v * m])
        _fail(f"device {s} holds {max(held)} chunk activations at once, more than "
              f"(v+1)p = {bound}"
              + (": all forwards first (GPipe order) holds every one until the backward "
                 "passes; start the backward passes as early as 1F1B does"
                 if all_forwards else ": run each backward pass as early as you can"))
    T = max(finish.values())
    bubble = 1 - v * m * 3.0 / T
    want, plain = (p - 1) / (v * m + p - 1), (p - 1) / (m + p - 1)
    if bubble <= want + 0.01:
        return
    if bubble >= plain - 1e-9:
        _fail(f"your bubble is {bubble:.3f}, no smaller than plain 1F1B's (p-1)/(m+p-1) = "
              f"{plain:.3f}: a device should start a chunk's forward while its other "
              f"chunks' micro-batches travel through the other devices")
    _fail(f"your bubble is {bubble:.3f}; interleaving v={v} chunks allows "
          f"(p-1)/(vm+p-1) = {want:.3f}: after the warm-up, alternate one forward and one "
          f"backward, taking the chunks in rounds of p micro-batches")
