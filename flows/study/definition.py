"""A study's definition (`studies/<name>/study.yaml`): its rows, each the plan step that makes it
and the config whose plan holds that step, in priority order."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tasks.config import PROJECT_ROOT
from tasks.stage_refs import is_config_reference, split_config_reference

STUDIES = PROJECT_ROOT / "studies"
SEED_SUFFIX = re.compile(r"-s(\d+)\b")   # a training row's seed in its name: gold-s2, adapt-dpr-s2


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, description="unique within the study; the record's file name")
    stage: str = Field(min_length=1, description="the plan step whose artifact is the row (`pforge run --upto`)")
    kind: Literal["runs", "classifier", "generation"] = "runs"
    system: Optional[str] = Field(None, description="the system in the step's runs (default: the row's name)")
    config: Optional[str] = Field(None, description="the config planning the step, relative to the repository "
                                                   "(default: the study's default_config)")
    priority: int = Field(ge=1)

    @property
    def system_name(self) -> str:
        return self.system or self.name


class Claim(BaseModel):
    """A paper's claim as "row a beats row b at top-k" (nDCG@k on qrels corpora), or, with `row`,
    a classifier row's table 2 (its F1 and AUC against the dual encoder's)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    paper: str
    claim: str
    a: Optional[str] = None
    b: Optional[str] = None
    k: Optional[int] = Field(None, ge=1)
    row: Optional[str] = None
    setting: Optional[str] = Field(None, description="where the rows differ from the paper's setting (the CPU's size, "
                                                     "another model), with the paper's in brackets")


def seed_of(claim: Claim) -> int:
    """The seed a claim's rows were trained at: the highest `-sN` in their names, 1 where none says."""
    return max([int(n) for name in (claim.a, claim.b) if name for n in SEED_SUFFIX.findall(name)], default=1)


def seed_groups(claims: list[Claim]) -> list[dict[int, Claim]]:
    """The claims that differ only in their rows' seeds (`silver-s1 vs gold-s1` and `silver-s2 vs
    gold-s2` at the same k in the same paper), each group as seed -> claim, in the order the
    first of each appears; a classifier's claim and a claim of unseeded rows stand alone."""
    groups: dict[tuple, dict[int, Claim]] = {}
    for index, claim in enumerate(claims):
        key = ((claim.paper, SEED_SUFFIX.sub("", claim.a), SEED_SUFFIX.sub("", claim.b or ""), claim.k)
               if claim.a else (index,))
        groups.setdefault(key, {}).setdefault(seed_of(claim), claim)
    return list(groups.values())


class Bar(BaseModel):
    """A quality bar: the best of `rows` (or `row`) reaches `at_least` points at top-k; or, with
    `beats`, in every pair row A beats row B at top-k (the paired interval of A - B above 0)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    bar: str
    row: Optional[str] = None
    rows: list[str] = Field(default_factory=list)
    beats: list[tuple[str, str]] = Field(default_factory=list, description="pairs [A, B]: each A must beat its B")
    k: int = Field(ge=1)
    at_least: Optional[float] = None

    @model_validator(mode="after")
    def _one_kind(self) -> "Bar":
        if self.beats and (self.row or self.rows or self.at_least is not None):
            raise ValueError(f"bar {self.bar!r}: `beats` takes no row, rows or at_least")
        if not self.beats and (self.at_least is None or not self.candidates):
            raise ValueError(f"bar {self.bar!r}: give `beats`, or `row` or `rows` with `at_least`")
        return self

    @property
    def candidates(self) -> list[str]:
        return [self.row] if self.row else list(self.rows)

    @property
    def names(self) -> list[str]:
        """Every row the bar reads."""
        return [name for pair in self.beats for name in pair] + self.candidates


class Study(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    default_config: str
    root: str = Field("~/pforge-runs/study", description="the local artifact root (outside the work tree)")
    tables_file: Optional[str] = Field(None, description="where the tables are kept, relative to the repository: "
                                                          "rewritten and committed with every record")
    rows: list[Row] = Field(min_length=1)
    shared: list[str] = Field(default_factory=list, description=(
        "steps whose artifacts are costly to make and small to keep: exported into shared/ (checksummed) once "
        "built, and imported into the root before rows are built; a step of the default config, or of another "
        "as CONFIG.yaml:STEP (relative to the repository)"))
    claims: list[Claim] = Field(default_factory=list)
    bars: list[Bar] = Field(default_factory=list)
    folder: Path = Field(default=Path("."), exclude=True)

    def config_of(self, row: Row) -> Path:
        return PROJECT_ROOT / (row.config or self.default_config)

    def shared_steps(self) -> list[tuple[Path, str]]:
        """Each shared step as (its config's file, the step)."""
        return [(PROJECT_ROOT / split_config_reference(entry)[0], split_config_reference(entry)[1])
                if is_config_reference(entry) else (PROJECT_ROOT / self.default_config, entry) for entry in self.shared]

    @property
    def records_dir(self) -> Path:
        return self.folder / "records"

    @property
    def shared_dir(self) -> Path:
        return self.folder / "shared"

    def ordered(self) -> list[Row]:
        """Rows by priority, then in file order."""
        return sorted(self.rows, key=lambda r: r.priority)  # sorted() is stable: file order within a priority

    def row(self, name: str) -> Row:
        for row in self.rows:
            if row.name == name:
                return row
        raise ValueError(f"study {self.name!r} has no row {name!r}; rows: {', '.join(r.name for r in self.rows)}")


def load_study(name_or_path: str | Path = "squad-open") -> Study:
    """A study by name (a folder under studies/) or by the path of its study.yaml."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = STUDIES / str(name_or_path) / "study.yaml"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        known = sorted(p.name for p in STUDIES.iterdir() if (p / "study.yaml").is_file()) if STUDIES.is_dir() else []
        raise ValueError(f"{path}: no such study (studies: {', '.join(known) or 'none'})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    try:
        study = Study.model_validate({**(raw or {}), "folder": path.parent})
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: {where}") from None
    names = [r.name for r in study.rows]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"{path}: rows named twice: {', '.join(duplicated)}")
    named = {n for c in study.claims for n in (c.a, c.b, c.row) if n} | {n for b in study.bars for n in b.names}
    unknown = sorted(named - set(names))
    if unknown:
        raise ValueError(f"{path}: claims or bars name rows the study lacks: {', '.join(unknown)}")
    return study
