"""Every table of a study from its committed records alone (no artifact root): each system's test
metrics with where it was measured, the reproduction table with paired bootstrap intervals, the
bars, and the stage build times per CPU. `pforge study tables` prints them as Markdown."""
from __future__ import annotations

import re

from flows.study.definition import Bar, Claim, Study, seed_groups
from flows.study.machine import auto_precision
from flows.study.records import RANK, outcomes_by_split, read_records, read_replaced, step_label

SPLIT = "test"
TOP_KS = (1, 5, 20, 100)
MODEL_STEPS = ("train", "encode", "pretrain", "cross_encoder", "rerank")   # the steps `auto` precision runs


def hit_at(value, k: int) -> float:
    return 1.0 if value is not None and value <= k else 0.0


def score_of(measure: str, value, k: int) -> float:
    """One question's score: top-k hit (answer-match corpora) or its nDCG@10 (qrels corpora)."""
    return hit_at(value, k) if measure == RANK else float(value or 0.0)


class Results:
    """The records of a study, with each runs row's test outcomes joined to its question ids."""

    def __init__(self, study: Study, records: dict[str, dict] | None = None):
        self.study = study
        self.records = read_records(study.folder) if records is None else records
        # the records `--again` replaced, by (row, version); none where `records` are given
        self.replaced = read_replaced(study.folder) if records is None else {}
        self.outcomes = {name: outcomes_by_split(r, study.folder) for name, r in self.records.items()
                         if r.get("kind", "runs") == "runs"}
        # (a, b, k, samples, seed) -> compare's result: a claim in two papers' tables and a bar
        # naming a claim's pair show one bootstrap, computed once
        self.compared: dict[tuple, dict] = {}

    def measure(self, row: str) -> str:
        return self.records[row]["outcomes"]["measure"]

    def test(self, row: str) -> dict | None:
        return self.outcomes.get(row, {}).get(SPLIT)

    def score(self, row: str, k: int) -> float | None:
        """Top-k accuracy (or mean nDCG@10) in points on the test split; None: not measured."""
        values = self.test(row)
        if not values:
            return None
        return 100 * sum(score_of(self.measure(row), v, k) for v in values.values()) / len(values)


def precision_of(record: dict) -> str | None:
    """The precision a record's model steps ran at under `auto` (its machine's: bf16 with bf16
    units, else fp32); None for a row without a model (BM25)."""
    if not any(step_label(s).split(":")[0] in MODEL_STEPS for s in record.get("stages", [])):
        return None
    return auto_precision(record.get("machine") or {})


def precisions_differ(results: Results, a: str, b: str) -> str:
    """", bf16 vs fp32" where A's and B's models ran at different precisions (records of CPUs with
    and without bf16 units): the difference of A and B then holds that of the precisions too."""
    pa, pb = (precision_of(results.records[n]) for n in (a, b))
    return f", {pa} vs {pb}" if pa and pb and pa != pb else ""


def where(record: dict) -> str:
    """The CPU, threads, the precision its models ran at (none for BM25) and the commit."""
    machine, precision = record.get("machine") or {}, precision_of(record)
    commit = f"commit {record['commit'][:10]}" if record.get("commit") else "commit not recorded"
    return f"{machine.get('key', '?')}, {machine.get('threads', '?')} threads{', ' + precision if precision else ''}; {commit}"


def systems_table(results: Results) -> list[str]:
    lines = [f"| row | questions | {' | '.join(f'top-{k}' for k in TOP_KS)} | nDCG@10 | measured on |",
             "|---|---:|" + "---:|" * (len(TOP_KS) + 1) + "---|"]
    for row in results.study.ordered():
        values = results.test(row.name)
        if values is None:
            continue
        if results.measure(row.name) == RANK:
            cells = [f"{results.score(row.name, k):.1f}" for k in TOP_KS] + ["-"]
        else:
            cells = ["-"] * len(TOP_KS) + [f"{results.score(row.name, 10):.1f}"]
        lines.append(f"| {row.name} | {len(values):,} | {' | '.join(cells)} | {where(results.records[row.name])} |")
    return lines


def compare(results: Results, a: str, b: str, k: int, samples: int, seed: int = 0) -> dict:
    """A minus B in points over the test questions both were measured on, with its paired
    bootstrap interval (tasks.evaluation.bootstrap, the evaluate stage's), computed once per
    `results`."""
    key = (a, b, k, samples, seed)
    if key not in results.compared:
        results.compared[key] = _bootstrap(results, a, b, k, samples, seed)
    return dict(results.compared[key])


def _bootstrap(results: Results, a: str, b: str, k: int, samples: int, seed: int) -> dict:
    return paired_outcomes((results.test(a), results.measure(a)), (results.test(b), results.measure(b)), k,
                           samples, seed, f"rows {a!r} and {b!r}")


def paired_outcomes(a: tuple[dict, str], b: tuple[dict, str], k: int, samples: int, seed: int, what: str) -> dict:
    """A minus B over the test questions both hold, each given as (qid -> outcome, its measure)."""
    from tasks.evaluation.bootstrap import paired_bootstrap

    (va, ma), (vb, mb) = a, b
    qids = sorted(va.keys() & vb.keys())
    if not qids:
        raise ValueError(f"{what} share no {SPLIT} question")
    return paired_bootstrap([score_of(ma, va[q], k) for q in qids], [score_of(mb, vb[q], k) for q in qids],
                            samples=samples, seed=seed)


def measured_again_table(results: Results, samples: int) -> list[str]:
    """Each row measured again (`--again`): where its replaced record and its record now were
    measured, their test figures and the paired interval of now minus before (top-1 and top-20,
    or nDCG@10): the difference holds the precision's, the code's and the run's own."""
    lines = ["| row | before | now | before -> now | now - before |", "|---|---|---|---|---|"]
    for row in results.study.ordered():
        record = results.records.get(row.name) or {}
        replaces = record.get("replaces")
        if not replaces:
            continue
        before = results.replaced.get((row.name, replaces.get("version")))
        if before is None:
            commit = (replaces.get("commit") or "?")[:10]
            lines.append(f"| {row.name} | {replaces.get('machine', '?')}; commit {commit} (its record is not kept "
                         f"under records/replaced/) | {where(record)} | - | - |")
            continue
        now = results.test(row.name)
        then = outcomes_by_split(before, results.study.folder).get(SPLIT) if before.get("kind", "runs") == "runs" else None
        if now is None or then is None:   # a record without test outcomes (the classifier's)
            lines.append(f"| {row.name} | {where(before)} | {where(record)} | - | - |")
            continue
        measure = results.measure(row.name)
        figures, intervals = [], []
        for k in ((1, 20) if measure == RANK else (10,)):
            r = paired_outcomes((now, measure), (then, before["outcomes"]["measure"]), k, samples, 0,
                                f"{row.name}'s two records")
            name = _metric(results, row.name, k)
            figures.append(f"{name} {100 * r['b']:.1f} -> {100 * r['a']:.1f}")
            intervals.append(f"{name} {100 * r['difference']:+.1f} [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]")
        lines.append(f"| {row.name} | {where(before)} | {where(record)} | {'; '.join(figures)} | {'; '.join(intervals)} |")
    return lines


def claim_line(results: Results, claim: Claim, samples: int) -> str:
    """The claim's row: what was measured, the interval, the verdict and the setting it ran at."""
    return claim_cells(results, claim, samples) + f" {claim.setting or '-'} |"


def claim_cells(results: Results, claim: Claim, samples: int) -> str:
    from tasks.evaluation.bootstrap import verdict

    if claim.row is not None:
        return _classifier_line(claim, results.records.get(claim.row))
    if results.test(claim.a) is None or results.test(claim.b) is None:
        missing = [n for n in (claim.a, claim.b) if results.test(n) is None]
        return f"| {claim.paper} | {claim.claim} | not measured: {', '.join(missing)} | - | - |"
    r = compare(results, claim.a, claim.b, claim.k, samples)
    what = _metric(results, claim.a, claim.k)
    return (f"| {claim.paper} | {claim.claim} | {what} {100 * r['a']:.1f} vs {100 * r['b']:.1f} ({claim.a} vs "
            f"{claim.b}{precisions_differ(results, claim.a, claim.b)}) | [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}] | "
            f"{_reproduced(verdict(r))} |")


def _metric(results: Results, row: str, k: int) -> str:
    return f"top-{k}" if results.measure(row) == RANK else "nDCG@10"


def _reproduced(verdict: str) -> str:
    return {"yes": "yes", "no, B is": "no: B is better", "not shown": "not reproduced (the interval holds 0)"}[verdict]


def _classifier_line(claim: Claim, record: dict | None) -> str:
    measured = classifier_outcome(record)
    if measured is None:
        return f"| {claim.paper} | {claim.claim} | not measured: {claim.row} | - | - |"
    here, reproduced = measured
    return f"| {claim.paper} | {claim.claim} | {here} | - | {'yes' if reproduced else 'no'} |"


def classifier_outcome(record: dict | None) -> tuple[str, bool] | None:
    """A classifier record's table 2 against the dual encoder's, and whether it beats it on both
    F1 and AUC; None: not measured."""
    rows = ((record or {}).get("details") or {}).get("report") or []
    by = {r["model"].split(" ")[0]: r for r in rows}
    if "cross-attention" not in by or "dual" not in by:
        return None
    ce, de = by["cross-attention"], by["dual"]
    here = f"F1 {100 * ce['f1']:.1f} vs {100 * de['f1']:.1f}; AUC {100 * ce['auc']:.1f} vs {100 * de['auc']:.1f}"
    return here, ce["f1"] > de["f1"] and ce["auc"] > de["auc"]


def reproduction_table(results: Results, samples: int, claims: list[Claim] | None = None) -> list[str]:
    return (["| paper | claim | here (A vs B, test split) | 95% interval of A - B | reproduced? | setting here (the paper's) |",
             "|---|---|---|---|---|---|"] + [claim_line(results, c, samples)
                                         for c in (results.study.claims if claims is None else claims)])


def verdicts_table(results: Results, samples: int, claims: list[Claim] | None = None) -> list[str]:
    """One line per claim with its seeds side by side: each seed's A - B and interval (the
    reproduction table's), and what they say together: reproduced at every seed, at some, at
    neither, or B better at every seed; "-" while a seed is not measured. A claim the study makes
    at one seed (a reranking, a fusion) says so."""
    groups = seed_groups(results.study.claims if claims is None else claims)
    seeds = sorted({seed for group in groups for seed in group})
    lines = [f"| paper | claim | {' | '.join(f'seed {s}' for s in seeds)} | across seeds |",
             "|---|---|" + "---|" * (len(seeds) + 1)]
    for group in groups:
        first = group[min(group)]
        outcomes = {seed: _seed_outcome(results, claim, samples) for seed, claim in group.items()}
        cells = [outcomes[s][0] if s in group else "(one seed)" for s in seeds]
        lines.append(f"| {first.paper} | {first.claim} | {' | '.join(cells)} | {_across(outcomes)} |")
    return lines


def _seed_outcome(results: Results, claim: Claim, samples: int) -> tuple[str, str | None]:
    """(the cell, the verdict: "yes", "no, B is", "not shown"; None: not measured)."""
    from tasks.evaluation.bootstrap import verdict

    if claim.row is not None:
        measured = classifier_outcome(results.records.get(claim.row))
        return ("not measured", None) if measured is None else (measured[0], "yes" if measured[1] else "not shown")
    missing = [n for n in (claim.a, claim.b) if results.test(n) is None]
    if missing:
        return f"not measured: {', '.join(missing)}", None
    r = compare(results, claim.a, claim.b, claim.k, samples)
    return (f"{_metric(results, claim.a, claim.k)} {100 * r['difference']:+.1f} "
            f"[{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]{precisions_differ(results, claim.a, claim.b)}", verdict(r))


def _across(outcomes: dict[int, tuple[str, str | None]]) -> str:
    verdicts = [v for _, v in outcomes.values()]
    if None in verdicts:
        return "-"
    n, shown, against = len(verdicts), verdicts.count("yes"), verdicts.count("no, B is")
    if n == 1:
        return {"yes": "reproduced", "no, B is": "no: B is better", "not shown": "not reproduced"}[verdicts[0]] + " (one seed)"
    every = "both seeds" if n == 2 else f"all {n} seeds"
    if shown == n:
        return f"reproduced at {every}"
    if against == n:
        return f"no: B is better at {every}"
    if not shown and not against:
        return "reproduced at neither seed" if n == 2 else f"reproduced at none of {n} seeds"
    said = [f"reproduced at {shown} of {n} seeds"] if shown else []
    return "; ".join(said + ([f"B better at {against} of {n}"] if against else []))


def papers_of(claim: Claim) -> list[str]:
    """The papers a claim names ("001 + 002 (NFCorpus)" belongs to both), for each paper's page."""
    return re.findall(r"\b(\d{3})\b", claim.paper)


def paper_tables(results: Results, samples: int) -> list[str]:
    """The reproduction table once per paper, and its claims across seeds, each between the
    markers its paper page includes (`study_cpu.md:paper-003`, `study_cpu.md:paper-003-seeds`)."""
    papers = sorted({paper for claim in results.study.claims for paper in papers_of(claim)})
    out = []
    for paper in papers:
        claims = [c for c in results.study.claims if paper in papers_of(c)]
        out += [f"### Paper {paper}", "", *included(f"paper-{paper}", reproduction_table(results, samples, claims)), "",
                *included(f"paper-{paper}-seeds", verdicts_table(results, samples, claims)), ""]
    return out


def bar_line(results: Results, bar: Bar, samples: int) -> str:
    if bar.beats:
        return _beats_line(results, bar, samples)
    scored = {n: results.score(n, bar.k) for n in bar.candidates if results.test(n) is not None}
    if not scored:
        return f"| {bar.bar} | not measured | - |"
    best = max(scored, key=scored.get)
    share = f" (best of {len(scored)} of {len(bar.candidates)} rows measured)" if len(bar.candidates) > 1 else ""
    met = "met" if scored[best] >= bar.at_least else "not met"
    return f"| {bar.bar} | {best}: top-{bar.k} {scored[best]:.1f}{share} | {met} |"


def _beats_line(results: Results, bar: Bar, samples: int) -> str:
    """Each pair's interval, as the reproduction table computes it: met when every one lies above
    0, not met as soon as a measured one does not, undecided while a pair is not measured."""
    from tasks.evaluation.bootstrap import verdict

    cells, shown, missing = [], [], []
    for a, b in bar.beats:
        unmeasured = [n for n in (a, b) if results.test(n) is None]
        if unmeasured:
            missing += unmeasured
            continue
        r = compare(results, a, b, bar.k, samples)
        shown.append(verdict(r) == "yes")
        cells.append(f"{a} vs {b}: {_metric(results, a, bar.k)} {100 * r['a']:.1f} vs {100 * r['b']:.1f}, "
                     f"[{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]{precisions_differ(results, a, b)}")
    if missing:
        cells.append(f"not measured: {', '.join(dict.fromkeys(missing))}")
    met = "not met" if not all(shown) else ("-" if missing else "met")
    return f"| {bar.bar} | {'; '.join(cells)} | {met} |"


def bars_table(results: Results, samples: int) -> list[str]:
    return ["| bar | measured | |", "|---|---|---|"] + [bar_line(results, b, samples) for b in results.study.bars]


def stage_times_table(results: Results, min_s: float = 30.0) -> list[str]:
    """Each step built in `min_s` or more, per CPU (the first record that carries it)."""
    seen, lines = set(), ["| step | CPU | build | rows | in the record of |", "|---|---|---:|---:|---|"]
    for name, record in sorted(results.records.items(), key=lambda kv: kv[1].get("recorded_at", "")):
        key = (record.get("machine") or {}).get("key", "?")
        for stage in record.get("stages", []):
            step = step_label(stage)
            if (step, stage["version"], key) in seen or (stage.get("build_s") or 0) < min_s:
                continue
            seen.add((step, stage["version"], key))
            lines.append(f"| {step} | {key} | {stage['build_s'] / 60:.1f} min | {stage.get('rows') or 0:,} | "
                         f"{name} |")
    return lines


def count_or_ratio(value: float) -> str:
    """A count in full with thousands separators (13,886, not 1.389e+04), a ratio to 4 digits."""
    if float(value).is_integer() or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def other_rows(results: Results) -> list[str]:
    """What the classifier and generation records report beside the runs."""
    lines = []
    for name, record in results.records.items():
        if record.get("kind") == "generation":
            stats = record.get("details") or {}
            shown = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
            lines.append(f"- {name}: " + ", ".join(f"{k} {count_or_ratio(v)}" for k, v in sorted(shown.items())) +
                         f" ({where(record)})")
        elif record.get("kind") == "classifier":
            details = record.get("details") or {}
            auc = f"dev AUC {details['dev_auc']:.3f}; " if details.get("dev_auc") is not None else ""
            origin = f"; from {record['backfilled_from']}" if record.get("backfilled_from") else ""
            lines.append(f"- {name} ({record.get('version', '?')}): {auc}table 2 on the test split above; "
                         f"{where(record)}{origin}")
    return lines


def included(name: str, body: list[str]) -> list[str]:
    """`body` between the markers the site includes it by (pymdownx.snippets sections, e.g.
    `--8<-- "benchmarks/results/study_cpu.md:systems"` on Results): a page that includes the
    committed tables is current with every record, and the markers are comments elsewhere."""
    return [f"<!-- --8<-- [start:{name}] -->", *body, f"<!-- --8<-- [end:{name}] -->"]


def study_tables(study: Study, samples: int = 10_000, records: dict[str, dict] | None = None) -> str:
    results = Results(study, records)
    measured = len(results.records)
    summary = (f"{measured} of {len(study.rows)} rows measured (records: studies/{study.name}/records/). "
               f"Regenerate: `pforge study tables {study.name}`.")
    extra = other_rows(results) or ["- none measured yet"]
    out = [f"# Study {study.name}: every table from its records", "", *included("summary", [summary]), "",
           "## Claims across seeds", "", *included("verdicts", verdicts_table(results, samples)), "",
           "## Reproduction", "", *included("reproduction", reproduction_table(results, samples)), "",
           "## Reproduction by paper", "", *paper_tables(results, samples),
           "## Bars", "", *included("bars", bars_table(results, samples)), "",
           f"## Systems ({SPLIT} split)", "", *included("systems", systems_table(results)), "",
           "## Rows measured again", "", *included("measured-again", measured_again_table(results, samples)), "",
           "## Classifier and generation", "", *included("classifier-and-generation", extra), "",
           "## Stage build times (30 s or more), per CPU", "", *included("stage-build-times", stage_times_table(results)), ""]
    return "\n".join(out)
