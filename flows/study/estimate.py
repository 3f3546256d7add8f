"""A row's price on this machine, from the stage times the committed records measured: for every
step the local root lacks, the newest time of the same step over the same passages (a step's name
means other work on another corpus) on this CPU, else on another CPU
scaled by the two machines' fp32 matrix-product probes (this machine's: the best its records and
this run measured, `with_best_probe`; unscaled where a record has no probe), else the time of its first-seed twin
(`train:gold-s2` is priced as `train:gold-s1`, `train:adapt-dpr-s2` as a recipe's own
`train:adapt-dpr`); what is left of a part-built training at the rate
its own checkpoints measured. A step of another config's run that a row needs first (a model it
reads) is priced by that very build (its version), else by that config's step. A step nobody has
measured is unknown, not guessed."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional

from flows.study.definition import SEED_SUFFIX
from flows.study.records import step_label

if TYPE_CHECKING:
    from tasks.training.checkpoints import TrainingProgress


@dataclass(frozen=True)
class StepPrice:
    step: str
    seconds: float | None      # None: nobody has measured it or a twin
    basis: str                 # "this CPU", "scaled from CPU KEY", "as STEP", "unknown"
    work: str | None = None    # the artifact and version it builds: rows that share it build it once


Measured = dict[tuple[Optional[str], str], list[tuple[dict, dict]]]
WORK = "work"   # measured_steps' key for an exact build: (WORK, "artifact@version")


def measured_steps(records: dict[str, dict], passages_of: Callable[[dict], str | None] = lambda record: None
                   ) -> Measured:
    """(passages, step name) -> [(stage time, machine)] over every record, newest record first;
    `passages_of(record)` names the passages the record's steps read (None: not told apart). A
    step of another config's run is named `CONFIG.yaml:STEP` (its config fixes its corpus); every
    build is also found by its work, (WORK, "artifact@version")."""
    out: Measured = {}
    for record in sorted(records.values(), key=lambda r: r.get("recorded_at", ""), reverse=True):
        passages, machine = passages_of(record), record.get("machine") or {}
        for stage in record.get("stages", []):
            if stage.get("build_s") is None:
                continue
            out.setdefault((None if stage.get("config") else passages, step_label(stage)), []).append((stage, machine))
            if stage.get("artifact") and stage.get("version"):
                out.setdefault((WORK, f"{stage['artifact']}@{stage['version']}"), []).append((stage, machine))
    return out


def with_best_probe(machine: dict, records: dict[str, dict]) -> dict:
    """`machine` with the best fp32 probe measured on its CPU at its thread count, by this run or a
    record's: other work on the cores (the study training beside `pforge study status`) only lowers
    a probe, and a lowered probe would inflate every price scaled from another CPU. The probe this
    run measured stays in `sgemm_gflops_now` when it is not the best."""
    now = machine.get("sgemm_gflops")
    seen = [m.get("sgemm_gflops") for m in (r.get("machine") or {} for r in records.values())
            if m.get("key") == machine.get("key") and m.get("threads") == machine.get("threads")]
    best = max([p for p in [now, *seen] if p], default=None)
    if best is None or best == now:
        return machine
    return {**machine, "sgemm_gflops": best, "sgemm_gflops_now": now}


def seed_twins(step: str) -> list[str]:
    """The names a later seed's step is priced as: its first seed's, then its recipe's own (no
    suffix); a first-seed or unseeded step has none."""
    seeds = [int(n) for n in SEED_SUFFIX.findall(step)]
    if not seeds or max(seeds) < 2:
        return []
    return list(dict.fromkeys((SEED_SUFFIX.sub("-s1", step), SEED_SUFFIX.sub("", step))))


def price_step(step: str, measured: Measured, machine: dict, passages: str | None = None,
               elsewhere: tuple[str, str] | None = None) -> StepPrice:
    """`step` of the row's own config over `passages`, or with `elsewhere` (the config file's name,
    "artifact@version"), a step of another config's run: priced by that very build, else by that
    config's step in a record that ran it, never by a step of the same name in another config (the
    study's generator fine-tunes on every train pair, squad-open.yaml's on 160)."""
    if elsewhere is not None:
        config, work = elsewhere
        keys = [((WORK, work), None), ((None, f"{config}:{step}"), None)]
    else:
        keys = [((passages, step), None), *(((passages, twin), f"as {twin}") for twin in seed_twins(step))]
    for key, basis in keys:
        times = measured.get(key) or []
        here = [t for t, m in times if m.get("key") == machine.get("key")]
        if here:
            return StepPrice(step, float(here[0]["build_s"]), basis or "this CPU")
        scalable = [(t, m) for t, m in times if m.get("sgemm_gflops") and machine.get("sgemm_gflops")]
        if scalable:
            t, m = scalable[0]
            seconds = float(t["build_s"]) * m["sgemm_gflops"] / machine["sgemm_gflops"]
            return StepPrice(step, seconds, (basis + ", " if basis else "") + f"scaled from {m.get('key', '?')}")
        if times:   # a record without the probe (backfilled): its own time, said to be another CPU's
            t, m = times[0]
            return StepPrice(step, float(t["build_s"]), (basis + ", " if basis else "") + f"unscaled, {m.get('key', '?')}")
    return StepPrice(step, None, "unknown")


def remaining(price: StepPrice, progress: TrainingProgress | None) -> StepPrice:
    """What is left of a part-built step (a resumed build continues from its latest checkpoint):
    the steps it has not reached at the rate it ran here so far, or where its checkpoint does not
    say its time, that share of its price; the whole price where no checkpoint says how far it is."""
    if not progress:
        return price
    left = max(0, progress.total - progress.step)
    where = f"from step {progress.step} of {progress.total}"
    if progress.seconds and progress.step > 0:
        rate = progress.seconds / progress.step
        return replace(price, seconds=rate * left, basis=f"its own {rate:.1f} s a step here, {where}")
    if price.seconds is None:
        return price
    return replace(price, seconds=price.seconds * left / progress.total, basis=f"{price.basis}; {where}")


def total_seconds(prices: list[StepPrice]) -> float | None:
    """The sum, or None when any step is unknown."""
    if any(p.seconds is None for p in prices):
        return None
    return sum(p.seconds for p in prices)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"
