"""Slow, obvious references for every numba kernel; the tests compare the kernels to these on random inputs.

Each function here spells out the rule it implements as plainly as possible (lists, loops, no cleverness).
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np

# ---------------------------------------------------------------------------------------------------------------
# Offline bin packing (mmfeed.packing.bins)


def decreasing_order(lengths: list[int]) -> list[int]:
    """Item indices by decreasing length, ties by increasing index."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def next_fit(lengths: list[int], capacity: int, max_per_bin: int | None = None) -> list[int]:
    """One open row; an item that does not fit (or a full row count) opens the next row. Oversize -> -1."""
    k = max_per_bin or len(lengths) + 1
    bin_of, rows, free, count = [], 0, -1, 0
    for length in lengths:
        if length > capacity:
            bin_of.append(-1)
            continue
        if length > free or count >= k:
            rows, free, count = rows + 1, capacity, 0
        free -= length
        count += 1
        bin_of.append(rows - 1)
    return bin_of


def first_fit_decreasing(lengths: list[int], capacity: int, max_per_bin: int | None = None) -> list[int]:
    """Longest first, each into the lowest-numbered open row with room (rows with max_per_bin items are closed)."""
    k = max_per_bin or len(lengths) + 1
    bin_of = [-1] * len(lengths)
    space: list[int] = []
    count: list[int] = []
    for i in decreasing_order(lengths):
        if lengths[i] > capacity:
            continue
        for b in range(len(space)):
            if count[b] < k and space[b] >= lengths[i]:
                break
        else:
            b = len(space)
            space.append(capacity)
            count.append(0)
        space[b] -= lengths[i]
        count[b] += 1
        bin_of[i] = b
    return bin_of


def best_fit_decreasing(lengths: list[int], capacity: int, max_per_bin: int | None = None) -> list[int]:
    """Longest first, each into the open row with the least room that fits; ties: the row that got an item last."""
    k = max_per_bin or len(lengths) + 1
    bin_of = [-1] * len(lengths)
    space: list[int] = []
    count: list[int] = []
    last: list[int] = []  # time of the row's last placement
    for t, i in enumerate(decreasing_order(lengths)):
        if lengths[i] > capacity:
            continue
        fits = [b for b in range(len(space)) if count[b] < k and space[b] >= lengths[i]]
        if fits:
            b = min(fits, key=lambda r: (space[r], -last[r]))
        else:
            b = len(space)
            space.append(capacity)
            count.append(0)
            last.append(-1)
        space[b] -= lengths[i]
        count[b] += 1
        last[b] = t
        bin_of[i] = b
    return bin_of


def optimal_bins(lengths: list[int], capacity: int) -> int:
    """The fewest rows holding every item that fits (brute force over assignments; n <= ~10)."""
    items = sorted((x for x in lengths if x <= capacity), reverse=True)
    if not items:
        return 0
    best = len(items)

    def place(i: int, loads: list[int]) -> None:
        nonlocal best
        if len(loads) >= best:
            return
        if i == len(items):
            best = len(loads)
            return
        tried = set()
        for b in range(len(loads)):
            if loads[b] + items[i] <= capacity and loads[b] not in tried:
                tried.add(loads[b])
                loads[b] += items[i]
                place(i + 1, loads)
                loads[b] -= items[i]
        loads.append(items[i])
        place(i + 1, loads)
        loads.pop()

    place(0, [])
    return best


def lower_bound_l2(lengths: list[int], capacity: int) -> int:
    """max(ceil(sum / C), Martello-Toth L2, 1 if any item fits) over the items that fit, straight from the formula."""
    items = [x for x in lengths if x <= capacity]
    if not items:
        return 0
    best = max(1, math.ceil(sum(items) / capacity))
    for k in range(0, capacity // 2 + 1):
        j1 = [x for x in items if x > capacity - k]
        j2 = [x for x in items if capacity - k >= x and 2 * x > capacity]
        j3 = [x for x in items if 2 * x <= capacity and x >= k]
        spare = len(j2) * capacity - sum(j2)
        best = max(best, len(j1) + len(j2) + max(0, math.ceil((sum(j3) - spare) / capacity)))
    return best


def rows_from_bin_of(bin_of: list[int] | np.ndarray) -> dict[int, list[int]]:
    """Row -> item indices (increasing index)."""
    rows: dict[int, list[int]] = {}
    for i, b in enumerate(list(map(int, bin_of))):
        if b >= 0:
            rows.setdefault(b, []).append(i)
    return rows


def subsets_fitting(lengths: list[int], capacity: int) -> list[tuple[int, ...]]:
    """All index subsets whose total fits one row (helper for tiny brute-force checks)."""
    n = len(lengths)
    return [c for r in range(1, n + 1) for c in combinations(range(n), r) if sum(lengths[i] for i in c) <= capacity]


# ---------------------------------------------------------------------------------------------------------------
# Online packing (mmfeed.packing.online): the same rule over a plain list buffer


def online_pack(
    items: list[tuple[int, int]], capacity: int, window: int, max_delay: int, pair_scan: int = 32
) -> tuple[list[list[int]], list[int], list[int]]:
    """Rows, oversize ids, and for each row the push count when it was emitted (0-based push index).

    Buffer entries are (seq, id, length). A row is built while the buffer holds `window` items or its oldest
    item has waited `max_delay` pushes: it starts with that overdue item, else the longest (ties: oldest), then
    repeatedly takes the longest buffered item that fits the room left (ties: oldest); when that item v would be
    the last and leave a gap, it takes the larger item a of the best pair a >= b, v < a + b <= room, instead
    (a among the `pair_scan` longest fitting lengths). At the end, flush.
    """
    buffer: list[tuple[int, int, int]] = []
    rows: list[list[int]] = []
    when: list[int] = []
    oversize: list[int] = []

    def build(overdue: bool) -> list[int]:
        room, row = capacity, []
        if overdue:
            pick = min(buffer)
        else:
            pick = min(buffer, key=lambda e: (-e[2], e[0]))
        while True:
            buffer.remove(pick)
            row.append(pick[1])
            room -= pick[2]
            fits = [e for e in buffer if e[2] <= room]
            if not fits:
                return row
            pick = min(fits, key=lambda e: (-e[2], e[0]))
            v = pick[2]
            others = [e for e in buffer if e is not pick and e[2] <= room - v]
            if v < room and not others:  # v would be last and leave a gap: try the best pair instead
                lens = sorted({e[2] for e in fits}, reverse=True)[:pair_scan]
                best, best_a = v, None
                for a in lens:
                    if 2 * a <= best or best == room:
                        break
                    partners = [e[2] for e in buffer if e[2] <= min(a, room - a)]
                    if a in partners:
                        partners.remove(a)  # the other item must be a different one
                    if partners and a + max(partners) > best:
                        best, best_a = a + max(partners), a
                if best_a is not None:
                    pick = min((e for e in fits if e[2] == best_a), key=lambda e: e[0])

    for seq, (item_id, length) in enumerate(items):
        if length > capacity:
            oversize.append(item_id)
        else:
            buffer.append((seq, item_id, length))
        while buffer:
            overdue = seq - min(buffer)[0] >= max_delay
            if not overdue and len(buffer) < window:
                break
            rows.append(build(overdue))
            when.append(seq)
    while buffer:
        rows.append(build(False))
        when.append(len(items))
    return rows, oversize, when


# ---------------------------------------------------------------------------------------------------------------
# Rank balance (mmfeed.packing.balance)


def row_costs(lengths: list[int], bin_of: list[int], capacity: int, alpha: float) -> list[float]:
    """tokens + alpha * sum(len^2) / capacity for each row, summed item by item."""
    rows = max(bin_of, default=-1) + 1
    cost = [0.0] * rows
    for length, b in zip(lengths, bin_of):
        if b >= 0:
            cost[b] += length + alpha * length * length / capacity
    return cost


def rank_step_costs(assignment: np.ndarray, costs: list[float]) -> list[list[float]]:
    """cost[r][s] = sum of the costs of the rows rank r runs in step s (-1 = nothing)."""
    ranks, steps, k = assignment.shape
    return [
        [sum(costs[int(assignment[r, s, m])] for m in range(k) if assignment[r, s, m] >= 0) for s in range(steps)]
        for r in range(ranks)
    ]


def lpt_max(costs: list[float], ranks: int, k: int) -> float:
    """Largest rank cost of plain LPT with at most k rows per rank (the bound a balanced deal must meet)."""
    load, fill = [0.0] * ranks, [0] * ranks
    for c in sorted(costs, reverse=True):
        r = min((r for r in range(ranks) if fill[r] < k), key=lambda r: (load[r], r))
        load[r] += c
        fill[r] += 1
    return max(load)


def lpt_deal(costs: list[float], ranks: int, k: int) -> list[list[int]]:
    """Positions dealt to each rank by LPT with at most k rows per rank: costliest first (ties by position), each
    to the least-loaded rank that has room (ties by rank id), every rank scanned."""
    load, slots = [0.0] * ranks, [[] for _ in range(ranks)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min((r for r in range(ranks) if len(slots[r]) < k), key=lambda r: (load[r], r))
        load[r] += costs[i]
        slots[r].append(i)
    return slots


# ---------------------------------------------------------------------------------------------------------------
# Bucketing (mmfeed.packing.bucketing)


def greedy_batches(order: list[int], lengths: list[int], bucket: list[int], max_tokens: int) -> list[list[int]]:
    """Walk `order`; start a new batch at a bucket change or when size * max(len, 1) would exceed the budget."""
    batches: list[list[int]] = []
    for i in order:
        if batches:
            last = batches[-1]
            longest = max(max(lengths[j], 1) for j in last + [i])
            if bucket[last[-1]] == bucket[i] and (len(last) + 1) * longest <= max_tokens:
                last.append(i)
                continue
        batches.append([i])
    return batches


# ---------------------------------------------------------------------------------------------------------------
# Attention metadata (mmfeed.packing.metadata): ids, dense mask and block tables written out token by token


def naive_metadata(rows: list[list[int]], capacity: int, step_sizes: list | None = None,
                   segments: list | None = None) -> tuple[list, list, list, list, list[int], int]:
    """(document_ids, position_ids, step_ids, modality_ids, cu_seqlens, max_seqlen) as nested Python lists.

    Token by token: the g-th document of the batch (row-major) fills its slots with g, positions 0..n-1, the
    index of the step each token falls in and the modality of its run; the rest of the row is padding.
    """
    doc, pos, step, mod = [], [], [], []
    cu, g = [0], 0
    for r, row in enumerate(rows):
        d_row, p_row, s_row, m_row = [], [], [], []
        for d, n in enumerate(row):
            sizes = [1] * n if step_sizes is None or step_sizes[r][d] is None else step_sizes[r][d]
            runs = [(0, n)] if segments is None else segments[r][d]
            step_of = [s for s, size in enumerate(sizes) for _ in range(size)]
            mod_of = [m for m, size in runs for _ in range(size)]
            for j in range(n):
                d_row.append(g)
                p_row.append(j)
                s_row.append(step_of[j])
                m_row.append(mod_of[j])
            cu.append(cu[-1] + n)
            g += 1
        while len(d_row) < capacity:
            d_row.append(-1)
            p_row.append(0)
            s_row.append(-1)
            m_row.append(-1)
        doc.append(d_row)
        pos.append(p_row)
        step.append(s_row)
        mod.append(m_row)
    max_seqlen = max((n for row in rows for n in row), default=0)
    return doc, pos, step, mod, cu, max_seqlen


def naive_attention_mask(document_ids: list[list[int]], step_ids: list[list[int]]) -> list[list[list[bool]]]:
    """allowed[r][q][k] by a double loop over the written-out rule: same document and step[k] <= step[q]
    for real tokens; a padding token (document -1) attends only to itself."""
    out = []
    for doc, step in zip(document_ids, step_ids):
        n = len(doc)
        rows = []
        for q in range(n):
            row = []
            for k in range(n):
                if doc[q] < 0:
                    row.append(q == k)
                else:
                    row.append(doc[k] == doc[q] and step[k] <= step[q])
            rows.append(row)
        out.append(rows)
    return out


def naive_block_tables(mask: list[list[list[bool]]], block_size: int) -> tuple[list, list, list, list]:
    """Block tables from a dense mask ``[R][C][C]``: a tile is full when every pair in it may attend (slots
    past C count as not attending, as torch's create_block_mask pads), empty when none may, else partial.

    Returns (kv_num [R][nb], kv_idx [R][nb][nb], full_num, full_idx) with the listed blocks first in ascending
    order, then the others ascending.
    """
    kv_num, kv_idx, full_num, full_idx = [], [], [], []
    for m in mask:
        c = len(m)
        nb = max(1, -(-c // block_size))
        rn, ri, fn, fi = [], [], [], []
        for qb in range(nb):
            kinds = []
            for kb in range(nb):
                vals = [m[q][k] if q < c and k < c else False
                        for q in range(qb * block_size, (qb + 1) * block_size)
                        for k in range(kb * block_size, (kb + 1) * block_size)]
                kinds.append("full" if all(vals) else "partial" if any(vals) else "empty")
            part = [k for k in range(nb) if kinds[k] == "partial"]
            full = [k for k in range(nb) if kinds[k] == "full"]
            rn.append(len(part))
            ri.append(part + [k for k in range(nb) if k not in part])
            fn.append(len(full))
            fi.append(full + [k for k in range(nb) if k not in full])
        kv_num.append(rn)
        kv_idx.append(ri)
        full_num.append(fn)
        full_idx.append(fi)
    return kv_num, kv_idx, full_num, full_idx


_MASK64 = (1 << 64) - 1


def splitmix64_finaliser(z: int) -> int:
    """splitmix64's output mix of a 64-bit integer, in Python integers."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def feistel_shuffle(position: int, n: int, keys: list[int]) -> int:
    """The id at ``position`` of a keyed Feistel permutation of ``[0, n)``: split into two halves of ``h`` bits
    (``4**h >= n``), one round per key (left, right = right, left ^ (mix(right ^ key) & mask)), repeated while
    the result falls outside ``[0, n)`` (cycle walking)."""
    if n <= 1:
        return position
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    x = position
    while True:
        left, right = x >> half, x & mask
        for key in keys:
            left, right = right, left ^ (splitmix64_finaliser(right ^ key) & mask)
        x = (left << half) | right
        if x < n:
            return x


def uniform_batches(order: list[int], per_row: int, ranks: int, k: int, remainder: str) -> list[list[list[list[int]]]]:
    """``batches[rank][step]`` = rows (lists of sample ids) when ``order`` is cut into rows of ``per_row`` samples,
    each step takes the next ``ranks * k`` rows and rank r the r-th k of them; the rows short of a whole last
    step are dropped ("drop"), completed with empty rows ("pad", left out here) or with rows from the start of
    the order ("replicate")."""
    rows = [order[i : i + per_row] for i in range(0, len(order), per_row)]
    per_step = ranks * k
    full, extra = divmod(len(rows), per_step)
    dealt = rows[: full * per_step]
    if extra and remainder != "drop":
        dealt = rows[:]
        if remainder == "replicate":
            need = per_step - extra
            dealt += [rows[j % len(rows)] for j in range(need)]
        else:
            dealt += [None] * (per_step - extra)
    steps = len(dealt) // per_step
    return [[[r for r in dealt[s * per_step + rank * k : s * per_step + (rank + 1) * k] if r is not None]
             for s in range(steps)] for rank in range(ranks)]


# ---------------------------------------------------------------------------------------------------------------
# The plan's sorted pack path (mmfeed.packing.plan._by_length, _rows_sorted, _shuffle_segments)

_MASK64 = (1 << 64) - 1


def xorshift64(state: int) -> int:
    """One xorshift64 step (13, 7, 17) on a Python int kept to 64 bits."""
    state ^= (state << 13) & _MASK64
    state ^= state >> 7
    state ^= (state << 17) & _MASK64
    return state


def shuffle_segments(ids: list[int], offsets: list[int], state: int) -> tuple[list[int], int]:
    """Fisher-Yates from the back of each segment; swap place i with (high 32 bits * (i + 1)) >> 32."""
    out = list(ids)
    for g in range(len(offsets) - 1):
        lo, hi = offsets[g], offsets[g + 1]
        for i in range(hi - lo - 1, 0, -1):
            state = xorshift64(state)
            j = lo + (((state >> 32) * (i + 1)) >> 32)
            out[lo + i], out[j] = out[j], out[lo + i]
    return out, state


def interleave(ordered: list[int], m: int, order: list[int]) -> list[list[int]]:
    """Steps with one row of every stratum: ``ordered`` cut into ``m`` strata of ``S = len(order)`` rows, step
    ``t`` the ``order[t]``-th row of each."""
    size = len(order)
    return [[ordered[i * size + order[t]] for i in range(m)] for t in range(size)]


def by_length(tokens: list[int], capacity: int) -> tuple[list[int], list[int], list[int]]:
    """Ids that fit by decreasing length, ties by id; counts per length 0..capacity; oversize ids."""
    fit = sorted((i for i, t in enumerate(tokens) if t <= capacity), key=lambda i: (-tokens[i], i))
    counts = [sum(1 for t in tokens if t == length) for length in range(capacity + 1)]
    return fit, counts, [i for i, t in enumerate(tokens) if t > capacity]


def rows_from_places(assigned: list[int], ids: list[int]) -> list[list[int]]:
    """Row b holds the ids of the places assigned to b, in place order."""
    rows: list[list[int]] = [[] for _ in range(max(assigned, default=-1) + 1)]
    for b, i in zip(assigned, ids):
        rows[b].append(i)
    return rows


def descending_by_cost(costs: list[float], rows: list[int], num_keys: int) -> list[list[int]]:
    """The groups of ``rows`` of one quantised cost (``num_keys`` keys over the rows' own cost range), costliest
    group first, each group's rows sorted (their order within a group is random)."""
    if not rows:
        return []
    mine = [costs[r] for r in rows]
    low, high = min(mine), max(mine)
    scale = (num_keys - 1) / (high - low) if high > low else 0.0
    groups: dict[int, list[int]] = {}
    for r in rows:
        groups.setdefault(min(int((costs[r] - low) * scale), num_keys - 1), []).append(r)
    return [sorted(groups[key]) for key in sorted(groups, reverse=True)]


# ---------------------------------------------------------------------------------------------------------------
# Windows in time (mmfeed.packing.windows), frame by frame


def implied_frames(length: int, fps: float, rate: float) -> int:
    """Frames the control clock implies for a stream at ``rate``: those ``j`` at ``j / rate`` no later than the
    episode's last step (``length`` of them at the clock's own rate)."""
    if length <= 0:
        return 0
    if math.isclose(rate, fps, rel_tol=1e-9, abs_tol=0.0):
        return length
    j = 0
    while j + 1 <= (length - 1) / fps * rate + 1e-6:
        j += 1
    return j + 1


def window_frame(anchor: int, delta: float, *, fps: float, length: int, rate: float, frames: int,
                 tol: float) -> tuple[int, bool]:
    """``(frame read, is_pad)`` of one asked time: the latest implied frame at or before it (the first before the
    episode, the last after it); padding outside the episode or where the stream lacks that frame, which then
    reads the stream's last frame."""
    tau = anchor / fps + delta
    at_or_before = [j for j in range(implied_frames(length, fps, rate)) if j <= (tau + tol) * rate]
    j = at_or_before[-1] if at_or_before else 0
    pad = tau < -tol or tau > (length - 1) / fps + tol or j >= frames
    return min(j, frames - 1), pad


def chunk_reads(start: int, stop: int, *, fps: float, length: int, rate: float, frames: int
                ) -> list[tuple[int, int, bool]]:
    """``(implied frame, frame read, is_pad)`` of every frame a chunk of steps ``[start, stop)`` owns: the implied
    frames at times in ``[start / fps, stop / fps)``, the episode's last chunk taking every one after its start."""
    out = []
    for j in range(implied_frames(length, fps, rate)):
        after_start = j >= start / fps * rate - 1e-6
        before_stop = stop >= length or j < stop / fps * rate - 1e-6
        if after_start and before_stop:
            out.append((j, min(j, frames - 1), j >= frames))
    return out


# ---------------------------------------------------------------------------------------------------------------
# The sample table (mmfeed.packing.samples) and the planner rule (mmfeed.packing.epoch), sample by sample


def naive_windows(lengths: list[int], stride: int) -> list[tuple[int, int]]:
    """``(episode, anchor)`` of every window, episode by episode, one every ``stride`` steps."""
    return [(e, t) for e, n in enumerate(lengths) for t in range(0, n, stride)]


def naive_task(tasks: list[int], step_tasks: dict[int, list[int]], episode: int, step: int) -> int:
    """A sample's task: its episode's, or its step's where the episode changes task (``tasks[e] < 0``)."""
    return tasks[episode] if tasks[episode] >= 0 else step_tasks[episode][step]


def naive_window_price(counts: dict[str, int], present: dict[str, list[bool]], episode: int,
                       tokens_per_frame: dict[str, int], text: int) -> int:
    """Frames of each feature the episode has, times its tokens, plus the text."""
    return text + sum(n * tokens_per_frame.get(f, 1) for f, n in counts.items() if present[f][episode])


def naive_chunk_price(start: int, length: int, episode: int, *, lengths: list[int], fps: list[float],
                      rates: dict[str, list[float]], present: dict[str, list[bool]],
                      tokens_per_frame: dict[str, int], text: int) -> int:
    """Every implied frame a chunk owns of each feature the episode has, times its tokens, plus the text."""
    total = text
    for f, rate in rates.items():
        if present[f][episode]:
            owned = chunk_reads(start, start + length, fps=fps[episode], length=lengths[episode], rate=rate[episode],
                                frames=10**9)
            total += len(owned) * tokens_per_frame.get(f, 1)
    return total


def naive_runs(prices: list[int], episodes: list[int]) -> tuple[list[int], list[int]]:
    """Consecutive samples of one episode and one price as runs ``(lengths, prices)``; an episode without
    samples is a run of length 0 at its episode price (``None`` here: the caller supplies it)."""
    lengths, values = [], []
    for i, (p, e) in enumerate(zip(prices, episodes)):
        if i and episodes[i - 1] == e and values[-1] == p:
            lengths[-1] += 1
        else:
            lengths.append(1)
            values.append(p)
    return lengths, values


def naive_planner(*, drawn: bool, mode: str, episode_block: int, uniform: int | None, capacity: int,
                  has_runs: bool, decreasing: bool) -> str:
    """The planner the rule picks: uniform, classes or samples."""
    if drawn or mode != "pack" or episode_block:
        return "samples"
    if uniform is not None and uniform <= capacity:
        return "uniform"
    return "classes" if has_runs and decreasing else "samples"


# ---------------------------------------------------------------------------------------------------------------
# Frame filters (mmfeed.packing.filters) and windows / chunks of kept segments


def naive_kept_steps(lengths: list[int], keep: list[tuple[int, int, int]], drop: list[tuple[int, int, int]]
                     ) -> list[list[bool]]:
    """Per episode, whether each step is kept: an episode named in ``keep`` keeps the steps its ranges cover,
    another keeps them all; then every step a ``drop`` range covers goes."""
    named = {e for e, _, _ in keep}
    kept = [[e not in named for _ in range(n)] for e, n in enumerate(lengths)]
    for e, a, b in keep:
        for t in range(max(a, 0), min(b, lengths[e])):
            kept[e][t] = True
    for e, a, b in drop:
        for t in range(max(a, 0), min(b, lengths[e])):
            kept[e][t] = False
    return kept


def naive_segments(kept: list[list[bool]]) -> list[tuple[int, int, int]]:
    """Maximal runs of kept steps ``(episode, start, end)``, in order."""
    out = []
    for e, steps in enumerate(kept):
        t = 0
        while t < len(steps):
            if steps[t]:
                start = t
                while t < len(steps) and steps[t]:
                    t += 1
                out.append((e, start, t))
            else:
                t += 1
    return out


def naive_segment_windows(segments: list[tuple[int, int, int]], stride: int) -> list[tuple[int, int]]:
    """``(episode, anchor)`` of every window: one every ``stride`` steps from each segment's start."""
    return [(e, t) for e, a, b in segments for t in range(a, b, stride)]


# ---------------------------------------------------------------------------------------------------------------
# Frame copies (mmfeed.codecs.nt_copy)


def naive_row_copy(src: np.ndarray) -> bytes:
    """The bytes a copy of ``src`` into a C-contiguous array writes: its rows (first axis) one after the other, each
    row's elements in C order."""
    out = bytearray()
    for row in src:
        out += np.ascontiguousarray(row).tobytes()
    return bytes(out)


# ---------------------------------------------------------------------------------------------------------------
# JPEG frame headers (mmfeed.loaders.formats.rlds.pictures.jpeg_frames)


def naive_jpeg_frame(blob: bytes) -> tuple[int, int, int]:
    """``(height, width, colour)`` of a JPEG as libjpeg reads its markers before the first scan (colour: 1 YCbCr,
    2 grey, 0 another space), or ``(-1, -1, -1)`` where no frame header is found before a scan."""
    none = (-1, -1, -1)
    if len(blob) < 4 or blob[:2] != b"\xff\xd8":
        return none
    frame, jfif, adobe, i = None, False, None, 2
    while i + 4 <= len(blob) and blob[i] == 0xFF:
        while i < len(blob) and blob[i] == 0xFF:
            i += 1
        if i + 3 > len(blob):
            return none
        marker = blob[i]
        if marker == 0xDA:
            if frame is None or frame[0] <= 0 or frame[1] <= 0:
                return none
            h, w, ids = frame
            if len(ids) == 1:
                return h, w, 2
            if len(ids) == 3:
                ycc = jfif or (adobe != 0 if adobe is not None else ids != [82, 71, 66])
                return h, w, int(ycc)
            return (h, w, 0) if ids else none
        if marker == 0xD9:
            return none
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            i += 1
            continue
        length = int.from_bytes(blob[i + 1:i + 3], "big")
        if length < 2 or i + 1 + length > len(blob):
            return none
        body = blob[i + 3:i + 1 + length]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if length < 8 or frame is not None or length < 8 + 3 * body[5]:
                return none
            frame = (int.from_bytes(body[1:3], "big"), int.from_bytes(body[3:5], "big"),
                     [body[6 + 3 * c] for c in range(body[5])])
        elif marker == 0xE0 and length >= 16 and body[:5] == b"JFIF\x00":
            jfif = True
        elif marker == 0xEE and length >= 14 and body[:5] == b"Adobe":
            adobe = body[11]
        i += 1 + length
    return none


# ---------------------------------------------------------------------------------------------------------------
# Reads of record ranges (mmfeed.loaders.formats.rlds.ranges.read_plan)


def naive_read_plan(pieces: list[list[int]], header: int, gap: int) -> tuple[list[list[int]], list[list[int]], int]:
    """Pieces (episode, shard, record offset, start, stop, crc) sorted by shard and byte; each joins the read
    before it where it starts at most ``gap`` bytes past that read's end. The reads (shard, first byte, end byte,
    the piece that began it), each piece's place in the reads laid back to back, and their bytes."""
    spans = [(p[1], p[2] + header + p[3], p[2] + header + p[4]) for p in pieces]
    order = sorted(range(len(pieces)), key=lambda k: (spans[k][0], spans[k][1], k))
    reads: list[list[int]] = []
    members: list[list[int]] = []
    for k in order:
        shard, low, high = spans[k]
        if reads and reads[-1][0] == shard and low - reads[-1][2] <= gap:
            reads[-1][2] = max(reads[-1][2], high)
            members[-1].append(k)
        else:
            reads.append([shard, low, high, k])
            members.append([k])
    where = [[0, 0] for _ in pieces]
    at = 0
    for read, ks in zip(reads, members):
        for k in ks:
            where[k] = [at + spans[k][1] - read[1], at + spans[k][2] - read[1]]
        at += read[2] - read[1]
    return reads, where, at


# ---------------------------------------------------------------------------------------------------------------
# Layout checks (mmfeed.packing.metadata._layout_valid)


def naive_layout_valid(lengths: list[int], row_offsets: list[int], capacity: int, steps: tuple | None,
                       segments: tuple | None, top: int) -> bool:
    """Whether a flat layout is one make_layout accepts: rows' offsets from 0 to the last document, never
    decreasing; documents of at least one token; rows within capacity; ``steps`` ``(sizes, offsets)`` and
    ``segments`` ``(modalities, lengths, offsets)`` runs of positive sizes covering each document exactly,
    modalities within ``[0, top]``."""
    def offsets_ok(offsets: list[int], end: int) -> bool:
        return bool(offsets) and offsets[0] == 0 and offsets[-1] == end and all(
            a <= b for a, b in zip(offsets, offsets[1:]))

    def runs_ok(sizes: list[int], offsets: list[int]) -> bool:
        return (offsets_ok(offsets, len(sizes)) and len(offsets) == len(lengths) + 1 and all(s >= 1 for s in sizes)
                and all(sum(sizes[offsets[d]:offsets[d + 1]]) == lengths[d] for d in range(len(lengths))))

    if not offsets_ok(row_offsets, len(lengths)) or any(n < 1 for n in lengths):
        return False
    if any(sum(lengths[a:b]) > capacity for a, b in zip(row_offsets, row_offsets[1:])):
        return False
    if steps is not None and not runs_ok(*steps):
        return False
    if segments is not None:
        modalities, sizes, offsets = segments
        if len(modalities) != len(sizes) or not runs_ok(sizes, offsets):
            return False
        if any(m < 0 or m > top for m in modalities):
            return False
    return True
