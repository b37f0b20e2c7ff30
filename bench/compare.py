"""``mmfeed compare BASE.json NEW.json``: noise-aware regression detection between two benchmark reports.

Reads the JSON of ``mmfeed bench --json`` (and of ``mmfeed bench packing --json``, ``python -m
mmfeed.bench.stall --json`` or ``python -m mmfeed.bench.loader --json``: any JSON object of figures). Every
numeric figure is found by its dotted path (``stage_s.decode``) and sorted into a kind by its name:

- **throughput**: a name ending in ``_per_s`` (or a ``rows`` entry whose unit ends in ``/s``); higher is better;
- **stall**: a name holding ``stall``; lower is better;
- **time**: a name ending in ``_s``, ``_ms`` or ``seconds``, or under such a key (``stage_s.decode``), or a
  ``rows`` entry in s/ms/us; lower is better;
- **info**: everything else (packing efficiency, ratios, counts), and every figure under ``baseline``,
  ``ceiling`` or ``ratios``: shown with its change, never a failure (a slower torch is not an mmfeed
  regression, but it does mean the machine changed: read the ratios).

Every figure also gets the **phase** of a training step it measures, from the words of its dotted path, the
innermost that names one: ``input`` (``wait``, ``stall``, ``input`` and the worker stages under ``stage_s`` or
``stages``: ``stage_s.decode``), ``copy`` (``copy``, ``h2d``), ``compute`` (``compute``: ``gpu_compute_s``) or
``comm`` (``comm``: ``comm_s``, ``comm_total_s``); a figure of the whole step (``step_s``, ``samples_per_s``) has
none. The verdict names the phases that regressed, each with its worst figure ("regressed: compute
(measured.w2.compute_s +21%)"), and :attr:`Comparison.regressed_phases` lists them, worst first.

Figures are the numbers of the report's objects, found by dotted path; a ``rows`` list holds either figures of
the packing benchmark (``{name, value, unit}``: one figure called ``name``, judged by its unit) or groups of
figures (``{name, <figures>...}`` without ``value``: the figures under ``<path>.<name>``, as ``mmfeed bench
scaling --measure`` writes one row per world size: ``measured.w2.compute_s``).

Only throughput, stall and time can regress. A figure regressed when it got worse by more than ``tolerance``
(relative to the base), AND by more than the noise both runs observed, AND by more than an absolute floor
(``min_stall`` points of stall fraction, ``min_time_s`` seconds), so that a stall going 0.3% -> 0.5% or a
20 us stage getting 5 us slower is not reported as a regression. The noise is half the range of the per-repeat
values of each side (``repeats``, which ``mmfeed bench --repeats N`` records), added; reports without repeats
(the packing benchmark keeps medians only) are judged by the tolerance alone. Medians of the repeats are
compared when present.

``settings`` that differ are listed, not refused; ``environment`` changes (git revision, versions, CPUs) are
listed too. Exit status (``mmfeed compare``): 0 nothing regressed, 1 something regressed, 2 a file could not be
read (missing, not JSON, not an object of figures).

    >>> base = {"samples_per_s": 100.0, "stall_fraction": 0.01}
    >>> new = {"samples_per_s": 70.0, "stall_fraction": 0.01}
    >>> compare(base, new).regressed
    ['samples_per_s']
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmfeed.bench.common import table

__all__ = ["Change", "Comparison", "PHASES", "ReportError", "compare", "figures", "format_comparison",
           "load_report", "phase_of"]

GATED = ("throughput", "stall", "time")
PHASES = ("input", "copy", "compute", "comm")
# a word of a path component (split at "_" and non-letters) -> the phase it names
_PHASE_WORDS = {"wait": "input", "stall": "input", "input": "input", "stage": "input", "stages": "input",
                "copy": "copy", "h2d": "copy", "compute": "compute", "comm": "comm"}
_SKIP = frozenset({"settings", "environment", "repeats", "details", "sweep", "bottleneck"})
_INFO_PARENTS = frozenset({"baseline", "ceiling", "ratios"})


class ReportError(ValueError):
    """A report that cannot be read or is not an object of figures."""


@dataclass(frozen=True)
class Figure:
    """One numeric figure: its value (the median of ``samples`` when given), kind and direction (+1 higher is
    better, -1 lower is better, 0 unknown)."""

    value: float
    kind: str
    direction: int
    samples: tuple[float, ...] = ()
    seconds: float = 1.0  # seconds per unit, for times (the absolute floor is in seconds)
    phase: str | None = None  # input, copy, compute, comm or None (see phase_of)

    @property
    def noise(self) -> float:
        """Half the range of the per-repeat values (0 without repeats)."""
        return (max(self.samples) - min(self.samples)) / 2 if len(self.samples) > 1 else 0.0


@dataclass(frozen=True)
class Change:
    """One figure in both reports and the verdict: ``status`` is "regressed", "improved", "ok" (within
    tolerance), "noise" (beyond tolerance but within the observed noise or the floor), "info", "only in base"
    or "only in new"; ``phase`` the step phase the figure measures (:func:`phase_of`)."""

    name: str
    kind: str
    base: float | None
    new: float | None
    relative: float | None
    noise: float
    status: str
    phase: str | None = None


@dataclass
class Comparison:
    """Every change, the settings and environment that differ, and the names that regressed."""

    changes: list[Change]
    settings: list[tuple[str, Any, Any]] = field(default_factory=list)
    environment: list[tuple[str, Any, Any]] = field(default_factory=list)
    tolerance: float = 0.1

    @property
    def regressed(self) -> list[str]:
        return [c.name for c in self.changes if c.status == "regressed"]

    @property
    def regressed_phases(self) -> list[str]:
        """The phases with a regressed figure, the worst relative change first (figures without a phase, like
        the whole step, name none)."""
        return list(self.worst_by_phase())

    def worst_by_phase(self) -> dict[str, Change]:
        """``{phase: its regressed figure that got relatively worst}``, the worst phase first."""
        worst: dict[str, Change] = {}
        for c in self.changes:
            if c.status == "regressed" and c.phase is not None:
                if c.phase not in worst or _badness(c) > _badness(worst[c.phase]):
                    worst[c.phase] = c
        return dict(sorted(worst.items(), key=lambda kv: -_badness(kv[1])))


def _badness(c: Change) -> float:
    """How much worse a change is, relative (a throughput that fell counts as much as a time that rose)."""
    return abs(c.relative) if c.relative is not None else 0.0


def load_report(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`ReportError` (a ValueError) naming the file and what is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (write one with `mmfeed bench --json {path}`)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ReportError(f"{path}: cannot read it ({err})") from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(report, dict):
        raise ReportError(f"{path}: a benchmark report is a JSON object, this holds a {type(report).__name__}")
    try:
        found = figures(report)
    except (TypeError, ValueError) as err:
        raise ReportError(f"{path}: {err}") from None
    if not found:
        raise ReportError(f"{path}: no numeric figures in it (is it a benchmark report from `mmfeed bench --json`?)")
    return report


_SECONDS = {"s": 1.0, "seconds": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _kind(path: tuple[str, ...], unit: str | None = None) -> tuple[str, int, float]:
    """(kind, direction, seconds per unit) of the figure at ``path`` (``unit``: a ``rows`` entry's unit)."""
    name = path[-1].lower()
    parents = {p.lower() for p in path[:-1]}
    kind, direction, seconds = "info", 0, 1.0
    if unit is not None:
        unit = unit.strip().lower()
        if unit.endswith("/s"):
            kind, direction = "throughput", 1
        elif unit in _SECONDS:
            kind, direction, seconds = "time", -1, _SECONDS[unit]
        elif unit == "%":
            direction = -1
        elif unit in ("ratio", "x"):
            direction = 1
    elif name.endswith("_per_s"):
        kind, direction = "throughput", 1
    elif "stall" in name:
        kind, direction = "stall", -1
    elif name.endswith(("_s", "_ms", "seconds")) or any(p.endswith("_s") for p in parents):
        kind, direction, seconds = "time", -1, 1e-3 if name.endswith("_ms") else 1.0
    elif "efficiency" in name or "ratio" in name or name.endswith("_vs_baseline"):
        direction = 1
    if kind != "info" and (parents & _INFO_PARENTS or "baseline" in name):
        kind = "info"
    return kind, direction, seconds


def phase_of(path: str | tuple[str, ...]) -> str | None:
    """The step phase a figure measures, from its dotted path (see the module docstring), or None.

        >>> [phase_of(p) for p in ("stage_s.decode", "measured.w2.comm_total_s", "ranks.max.compute_s.mean",
        ...                        "copy_s", "step_s", "samples_per_s")]
        ['input', 'comm', 'compute', 'copy', None, None]
    """
    parts = path.split(".") if isinstance(path, str) else path
    for part in reversed(parts):
        for word in re.split(r"[^a-z0-9]+", part.lower()):
            if word in _PHASE_WORDS:
                return _PHASE_WORDS[word]
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def figures(report: Mapping[str, Any]) -> dict[str, Figure]:
    """Every numeric figure of ``report`` by dotted path (see the module docstring for kinds and repeats)."""
    out: dict[str, Figure] = {}
    _walk(report, (), out)
    return out


def _rows(rows: list[Any], path: tuple[str, ...], out: dict[str, Figure]) -> None:
    """A ``rows`` list: packing-benchmark figures ``{name, value, unit}`` or groups ``{name, <figures>}``."""
    where = ".".join(path + ("rows",))
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "name" not in row:
            raise ValueError(f"{where}[{i}] is not a {{name, value, unit}} object nor a {{name, figures...}} "
                             f"group: {row!r:.80}")
        name = str(row["name"])
        if "value" not in row:  # a group of figures: <path>.<name>.<figure>
            _walk({k: v for k, v in row.items() if k != "name"}, path + (name,), out)
            continue
        if _number(row.get("value")) is None:
            raise ValueError(f"{where}[{i}] is not a {{name, value, unit}} object: {row!r:.80}")
        kind, direction, seconds = _kind((name,), str(row.get("unit", "")))
        out[".".join(path + (name,))] = Figure(_number(row["value"]), kind, direction, (), seconds,
                                               phase_of(path + (name,)))


def _walk(node: Mapping[str, Any], path: tuple[str, ...], out: dict[str, Figure]) -> None:
    repeats = node.get("repeats")
    if repeats is not None and not isinstance(repeats, dict):
        raise ValueError(f"{'.'.join(path + ('repeats',))} must map figure names to lists of numbers")
    for key, value in node.items():
        if key in _SKIP:
            continue
        here = path + (str(key),)
        if key == "rows":
            if isinstance(value, list):
                _rows(value, path, out)
            continue
        if isinstance(value, dict):
            _walk(value, here, out)
            continue
        number = _number(value)
        if number is None or not math.isfinite(number):
            continue
        samples = _samples(repeats, str(key), path)
        kind, direction, seconds = _kind(here)
        out[".".join(here)] = Figure(statistics.median(samples) if samples else number, kind, direction, samples,
                                     seconds, phase_of(here))
    for key, values in (repeats or {}).items():  # repeats of nested figures: "stage_s.decode"
        if "." in key:
            name = ".".join(path + (key,))
            if name in out:
                samples = _samples(repeats, key, path)
                old = out[name]
                out[name] = Figure(statistics.median(samples), old.kind, old.direction, samples, old.seconds,
                                   old.phase)


def _samples(repeats: Mapping[str, Any] | None, key: str, path: tuple[str, ...]) -> tuple[float, ...]:
    if not repeats or key not in repeats:
        return ()
    values = repeats[key]
    if not isinstance(values, list) or not values or any(_number(v) is None for v in values):
        raise ValueError(f"{'.'.join(path + ('repeats', key))} must be a non-empty list of numbers, got {values!r:.80}")
    return tuple(float(v) for v in values)


def _flat(node: Any, path: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{path}.{k}" if path else str(k)))
        return out
    return {path: node}


def _diff(a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    fa, fb = _flat(a if isinstance(a, dict) else {}), _flat(b if isinstance(b, dict) else {})
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def compare(base: Mapping[str, Any], new: Mapping[str, Any], *, tolerance: float = 0.1, min_stall: float = 0.01,
            min_time_s: float = 0.001) -> Comparison:
    """Compare two reports figure by figure (see the module docstring for the rule)."""
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0 (a fraction, 0.1 = 10%), got {tolerance!r}")
    fb, fn = figures(base), figures(new)
    changes = []
    for name in list(fb) + [n for n in fn if n not in fb]:
        b, n = fb.get(name), fn.get(name)
        if b is None or n is None:
            one = b or n
            changes.append(Change(name, one.kind, None if b is None else b.value, None if n is None else n.value,
                                  None, one.noise, "only in new" if b is None else "only in base", one.phase))
            continue
        changes.append(_judge(name, b, n, tolerance, min_stall, min_time_s))
    return Comparison(changes, _diff(base.get("settings"), new.get("settings")),
                      _diff(base.get("environment"), new.get("environment")), tolerance)


def _judge(name: str, b: Figure, n: Figure, tolerance: float, min_stall: float, min_time_s: float) -> Change:
    delta = n.value - b.value
    if b.value:
        relative = delta / abs(b.value)
    else:
        relative = 0.0 if delta == 0 else math.copysign(math.inf, delta)
    noise = b.noise + n.noise
    worse = -b.direction * delta  # > 0: got worse
    floor = {"stall": min_stall, "time": min_time_s / b.seconds}.get(b.kind, 0.0)  # in the figure's unit
    status = "ok"
    if b.kind not in GATED:
        status = "info"
    elif abs(relative) > tolerance:
        beyond = abs(delta) > noise and abs(delta) > floor
        if not beyond:
            status = "noise"
        else:
            status = "regressed" if worse > 0 else "improved"
    return Change(name, b.kind, b.value, n.value, relative, noise, status, b.phase)


def format_comparison(cmp: Comparison, *, all_figures: bool = True) -> str:
    """The table of changes, then the settings and environment that differ, then the verdict: the figures that
    regressed and, one line each, the phases they belong to with the worst figure of each."""
    def num(x: float | None) -> str:
        return "" if x is None else f"{x:.4g}"

    rows = []
    for c in cmp.changes:
        if not all_figures and c.status in ("ok", "info"):
            continue
        rel = "" if c.relative is None else ("inf" if math.isinf(c.relative) else f"{c.relative:+.1%}")
        rows.append({"figure": c.name, "kind": c.kind, "phase": c.phase or "", "base": num(c.base),
                     "new": num(c.new), "change": rel, "noise": f"±{c.noise:.3g}" if c.noise else "",
                     "status": c.status.upper() if c.status == "regressed" else c.status})
    lines = [table(rows, [("figure", "figure"), ("kind", "kind"), ("phase", "phase"), ("base", "base"),
                          ("new", "new"), ("change", "change"), ("noise", "noise"), ("status", "status")])]
    for title, diffs in (("settings that differ", cmp.settings), ("environment that differs", cmp.environment)):
        if diffs:
            lines.append(f"\n{title}:")
            lines += [f"  {k}: {a!r} -> {b!r}" for k, a, b in diffs]
    bad = cmp.regressed
    lines.append("")
    lines.append(f"REGRESSED beyond {cmp.tolerance:.0%} and the noise: {', '.join(bad)}" if bad
                 else f"no regression beyond {cmp.tolerance:.0%} (and the observed noise)")
    for phase, worst in cmp.worst_by_phase().items():
        lines.append(f"regressed: {phase} ({worst.name} {_relative(worst.relative)})")
    return "\n".join(lines)


def _relative(rel: float | None) -> str:
    return "" if rel is None else ("inf" if math.isinf(rel) else f"{rel:+.0%}")
