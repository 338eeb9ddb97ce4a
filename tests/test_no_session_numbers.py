"""No line of the project dates itself by a work session, a review round or a tracker issue.

Code, docs, benchmarks and deploy files say what is true now. A line that cites "the
twenty-fourth session", "round 3" or "issue #14" points at nothing a reader can open,
and goes stale the day it is written: that history is git log's. Every tracked text
file is read, README and docs included; a hit names the file, the line and the phrase.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_TEENS = "eleventh|twelfth|(?:thir|four|fif|six|seven|eigh|nine)teenth"
_TENS = "twentieth|thirtieth|fortieth|fiftieth"
_COMPOUND = rf"(?:twenty|thirty|forty|fifty)-(?:{_UNITS})"
_HIGH_ORDINAL = rf"(?:{_TEENS}|{_TENS}|{_COMPOUND})"
_ORDINAL = rf"(?:{_UNITS}|tenth|{_HIGH_ORDINAL}|\d+(?:st|nd|rd|th))"

NUMBERING = re.compile(
    "|".join(
        (
            # "the eighth and ninth sessions", "the 3rd round" (a first round trip is fine)
            rf"\b{_ORDINAL}(?:'s)?(?:\s+(?:and|or|to)\s+{_ORDINAL})?\s+(?:sessions?|rounds?)\b"
            r"(?![\s-]*trips?\b)",
            # "session 12", "round #3", "issue 14", "issues #8"
            r"\b(?:sessions?|rounds?|issues?)\s+#?\d+\b",
            # "in the twenty-ninth's", "(thirtieth)": ordinals this high number sessions here
            rf"\b{_HIGH_ORDINAL}\b",
            # "This round", "Earlier rounds": a diary's headings
            r"\b(?:this|previous|earlier)\s+rounds?\b",
        )
    ),
    re.IGNORECASE,
)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def numbering_in(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []  # a binary file: no prose in it
    return [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for number, line in enumerate(text.splitlines(), start=1)
        for match in NUMBERING.finditer(line)
    ]


def test_the_pattern_knows_numbering_from_ordinary_words() -> None:
    numbered = [
        "measured in the twenty-fourth session",
        "(docs/performance.md, eighth and ninth sessions)",
        "in the thirty-first's two runs",
        "**This round, thirtieth session**",
        "found by issue #14, round 3",
        "the 12th session",
    ]
    ordinary = [
        "the first round trip of a checkout",
        "a session of its own",
        "the next round retries",
        "forty-eight tokens",
        "SQLAlchemy's https://github.com/sqlalchemy/sqlalchemy/issues/10226",
    ]
    assert [text for text in numbered if not NUMBERING.search(text)] == []
    assert [text for text in ordinary if NUMBERING.search(text)] == []


def test_no_tracked_file_numbers_sessions_rounds_or_issues() -> None:
    # This file's own examples are the pattern's fixtures.
    files = [path for path in tracked_text_files() if path != Path(__file__).resolve()]
    hits = [hit for path in files for hit in numbering_in(path)]
    assert not hits, "say what is true now (history is in git log):\n" + "\n".join(hits)
