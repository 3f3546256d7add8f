"""The `refresh:` config section: where the newer dump comes from and when the refresh runs."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RefreshConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dump: Optional[str] = Field(
        None, description="the newer Wikipedia dump: a path, a glob (the newest match: the latest YYYYMMDD date in "
                          "its name, else the latest modified), both relative to data.data_root, or an http(s) URL, "
                          "where {date} (or {date:%Y-%m-%d}) is tried from today back lookback_days days; "
                          "empty: the config's data.wikipedia dumps, read again")
    cron: Optional[str] = Field(None, description="schedule of the NAME--corpus-refresh deployment (`pforge serve`), "
                                                  "e.g. '0 4 1,21 * *'; empty: run on demand only")
    lookback_days: int = Field(60, ge=1, le=3660, description="days a {date} URL is tried back from today")
    timeout_s: float = Field(60.0, gt=0, description="network timeout of a download, in seconds")
    dense: bool = Field(True, description="re-encode changed passages with the promoted encoder and update its FAISS "
                                          "index; false: documents, passages and BM25 only")
    examples: int = Field(5, ge=0, description="examples of each kind of change in the report")

    @field_validator("cron")
    @classmethod
    def _cron_fields(cls, value: Optional[str]) -> Optional[str]:
        # Prefect validates the expression itself when the deployment is built; this catches the
        # commonest slip (a missing or extra field) when the config loads.
        if value is not None and len(value.split()) not in (5, 6):
            raise ValueError(f"cron {value!r}: expected 5 fields (minute hour day month weekday)")
        return value or None
