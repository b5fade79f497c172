"""The price table: USD per instance-hour, from a user-editable JSON file (shipped defaults: prices.json)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from torch_neuronx.estimate._errors import EstimateError

DEFAULT = os.path.join(os.path.dirname(__file__), "prices.json")


@dataclass(frozen=True)
class Price:
    instance: str
    usd_per_hour: float
    source: str
    date: str
    verified: bool

    def describe(self) -> str:
        return (f"${self.usd_per_hour:.2f}/h for {self.instance} ({self.source}, {self.date}"
                f"{'' if self.verified else ', unverified'})")


class Prices:
    def __init__(self, entries: dict[str, Price], path: str):
        self.entries, self.path = entries, path

    def lookup(self, platform: str, instance: str) -> Price | None:
        return self.entries.get(instance) or self.entries.get(platform)


def load(path: str | None = None) -> Prices:
    """The price table at ``path`` (default: the shipped one). A malformed file is an EstimateError
    naming the file, the entry and the expected form."""
    path = path or DEFAULT
    form = ('expected {"instances": {"trn2.48xlarge": {"usd_per_hour": 35.76, "source": "...", "date": "2025", '
            '"verified": false}, ...}}')
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise EstimateError(f"price file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EstimateError(f"price file {path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise EstimateError(f"price file {path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                            f"{form}") from None
    if not isinstance(data, dict) or not isinstance(data.get("instances"), dict):
        raise EstimateError(f"price file {path}: no \"instances\" object; {form}")
    entries = {}
    for name, e in data["instances"].items():
        if not isinstance(e, dict):
            raise EstimateError(f"price file {path}: entry {name!r} is not an object; {form}")
        usd = e.get("usd_per_hour")
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not usd > 0:
            raise EstimateError(f"price file {path}: entry {name!r} needs \"usd_per_hour\" as a positive number, "
                                f"not {usd!r}")
        for key in ("source", "date"):
            if not isinstance(e.get(key), str) or not e.get(key):
                raise EstimateError(f"price file {path}: entry {name!r} needs \"{key}\" (a string): every price "
                                    "says where it comes from and when")
        verified = e.get("verified", False)
        if not isinstance(verified, bool):
            raise EstimateError(f"price file {path}: entry {name!r}: \"verified\" must be true or false")
        entries[name] = Price(name, float(usd), e["source"], e["date"], verified)
    return Prices(entries, path)
