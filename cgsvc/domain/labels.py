"""Labels: the caller's own names for a launch or an experiment, checked when given and changed
by an Update call (AIP-134) whose update_mask names `labels` (replace them all) or `labels.KEY`
(AIP-161 map keys: set KEY to the value given, or remove it where none is)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cgsvc.audit.filters import label_problem, labels_cell, labels_of, labels_text
from cgsvc.errors import FieldViolation, ServiceError

MAX_LABELS = 64
MASK_FORM = "labels (replace them all) or labels.KEY (set or remove one), comma-separated"


def label_problems(labels: Mapping[str, str], path: str = "labels") -> list[FieldViolation]:
    """What is wrong with some labels, each on its own field (`path`.KEY)."""
    problems = [FieldViolation(f"{path}.{key}" if key else path, problem)
                for key, value in sorted(labels.items()) if (problem := label_problem(key, value))]
    if len(labels) > MAX_LABELS:
        problems.append(FieldViolation(path, f"at most {MAX_LABELS} labels, got {len(labels)}"))
    return problems


@dataclass(frozen=True)
class LabelChange:
    """What an Update call does to a resource's labels."""

    replace: bool  # the mask named `labels`: `set` becomes the whole of them
    set: dict[str, str] = field(default_factory=dict)
    remove: tuple[str, ...] = ()

    def apply(self, current: Mapping[str, str]) -> dict[str, str]:
        out = {} if self.replace else {k: v for k, v in current.items() if k not in self.remove}
        out.update(self.set)
        return dict(sorted(out.items()))

    @staticmethod
    def describe(before: Mapping[str, str], after: Mapping[str, str]) -> str:
        """The change as the audit record says it: "env=prod added, team=infra (was ml),
        ticket=inc-42 removed", or "unchanged"."""
        said = []
        for key in sorted({*before, *after}):
            if key not in before:
                said.append(f"{key}={after[key]} added")
            elif key not in after:
                said.append(f"{key}={before[key]} removed")
            elif before[key] != after[key]:
                said.append(f"{key}={after[key]} (was {before[key]})")
        return ", ".join(said) or "unchanged"


def read_change(given: Mapping[str, str], mask: Sequence[str], resource: str) -> LabelChange:
    """An Update request's labels (`given`, its `resource` message's) and update_mask paths as a
    change; INVALID_ARGUMENT naming update_mask, or `resource`.labels.KEY, for what cannot be
    read. An empty mask stands for the fields the message populates (AIP-134): its labels."""
    paths = list(mask) or (["labels"] if given else [])
    if not paths:
        raise ServiceError.invalid([FieldViolation("update_mask", f"nothing to update: name {MASK_FORM} (an empty mask "
                                                                  "stands for the labels given, and none were)")])
    problems = label_problems(given, f"{resource}.labels")
    keys: list[str] = []
    for path in paths:
        if path == "labels":
            continue
        key = path.removeprefix("labels.") if path.startswith("labels.") else None
        why = f"only labels can be updated: {MASK_FORM}" if key is None else label_problem(key, "")
        if why:
            problems.append(FieldViolation("update_mask", f"{why} (in {path[:80]!r})"))
        else:
            keys.append(str(key))
    mask_read = not problems
    if "labels" in paths and len(paths) > 1:
        problems.append(FieldViolation("update_mask", "labels replaces them all: name it alone, or labels.KEY for each"))
    elif "labels" not in paths and mask_read:
        problems += [FieldViolation(f"{resource}.labels.{key}", f"given but not in update_mask: add labels.{key} to "
                                                                 "it, or leave the label out")
                     for key in sorted(set(given) - set(keys))]
    if problems:
        raise ServiceError.invalid(problems)
    if "labels" in paths:
        return LabelChange(replace=True, set=dict(sorted(given.items())))
    named = sorted(set(keys))
    return LabelChange(replace=False, set={k: given[k] for k in named if k in given},
                       remove=tuple(k for k in named if k not in given))


def created_with(cell: str) -> str:
    """What a creation record says of the labels it was made with (", labels team=infra"), so
    that the log holds every label a resource has had: these, then each change."""
    return f", labels {labels_text(labels_of(cell))}" if cell else ""


async def change_labels(name: str, cell: str, change: LabelChange, path: str,
                        record: Callable[[str, str], Awaitable[object]], write: Callable[[str, str], bool]) -> None:
    """Change the labels of resource `name`, stored as `cell`: checked (the labels it leaves,
    on field `path`), recorded (`record(code, message)`, "labels: team=infra added", before
    anything is stored; the record names the resource), then
    stored if they are still `cell` (`write(before, after)`, a blocking call). ABORTED, recorded
    as not applied, where a call on another replica changed them in between."""
    before = labels_of(cell)
    after = change.apply(before)
    if len(after) > MAX_LABELS:
        raise ServiceError.invalid([FieldViolation(path, f"at most {MAX_LABELS} labels; this change would leave "
                                                         f"{len(after)} on {name}")])
    said = LabelChange.describe(before, after)
    await record("OK", f"labels: {said}")
    if after != before and not await asyncio.to_thread(write, cell, labels_cell(after)):
        await record("ABORTED", f"not applied: labels: {said} (they changed meanwhile, on another replica)")
        raise ServiceError("ABORTED", f"the labels of {name} changed while this call read them (on another "
                                      "replica); read them again and ask again")
