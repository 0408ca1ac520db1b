"""Prompt sets in MT-bench's format (question_id, category, turns), as the EAGLE and Spec-Bench
evaluations read them: used by bench, the auto budget's calibration and the scripts."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..resources import resource_path

DATASETS = {"mt_bench": resource_path("mt_bench.jsonl")}


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]


def _parse_question(line: str) -> Question:
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    qid, turns = obj.get("question_id"), obj.get("turns")
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or qid == "":
        raise ValueError("question_id must be an int or a non-empty string")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise ValueError("turns must be a non-empty list of non-empty strings")
    category = obj.get("category", "uncategorized")
    return Question(qid, category if isinstance(category, str) else str(category), tuple(turns))


def load_questions(name_or_path: str | Path) -> tuple[list[Question], int]:
    """Questions in MT-bench format; returns them and the number of bad (or duplicate) records."""
    path = DATASETS.get(str(name_or_path), Path(name_or_path))
    if not path.is_file():
        raise FileNotFoundError(f"No dataset {name_or_path!r}: give {', '.join(DATASETS)} or a JSONL file "
                                "with question_id, category and turns per line.")
    questions, seen, bad = [], set(), 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                q = _parse_question(line)
            except ValueError:  # json.JSONDecodeError is a ValueError too
                bad += 1
                continue
            if q.question_id in seen:  # resume keys on the id, so a duplicate would be ambiguous
                bad += 1
                continue
            seen.add(q.question_id)
            questions.append(q)
    return questions, bad


def select_questions(questions: list[Question], limit: int | None = None,
                     per_category: int | None = None) -> list[Question]:
    """The first `per_category` questions of each category (file order kept), then the first `limit`.

    MT-bench lists its 80 questions category by category, so `--limit 10` alone is ten writing
    prompts: the category EAGLE accepts least. `--per-category 2` gives a sample of every category."""
    if per_category is not None:
        if per_category < 1:
            raise ValueError(f"per_category must be >= 1, got {per_category}")
        taken: dict[str, int] = {}
        kept = []
        for q in questions:
            if taken.get(q.category, 0) < per_category:
                taken[q.category] = taken.get(q.category, 0) + 1
                kept.append(q)
        questions = kept
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        questions = questions[:limit]
    return questions
