"""The work-raises fault's pipeline: the reference one with a team's own Python stage in front
of the checking AI, whose work raises on 1 % of the requests.

The shipped pipelines have no `kind: python` stage, and one added to `pipelines/` would enter
every test that runs each shipped spec; so the harness writes this one, with copies of the
shipped specs beside it, into a pipelines folder of its own (`PIPELINES_DIR`). It is derived
from the reference spec rather than copied, so the two cannot drift apart: `screen`, reading
the style topic, forwards each style choice to a `screened` topic that `check` reads instead.

Which requests raise is decided by their key alone (`raises`), so the harness knows the
expected dead letters from the keys it reads back, whatever order or retries the run took.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from consumers.config import pipeline_spec

NAME = "genai_image_screened"
STAGE = "screen"
RAISING_PER = 100  # one key in a hundred makes the work raise


def raises(request_id: str) -> bool:
    """Whether the work raises on this request: its key hashes to the 1 %."""
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % RAISING_PER == 0


def message(request_id: str) -> str:
    return f"screening cannot place request {request_id}"


def dead_letter_reason(request_id: str) -> str:
    """The reason its dead letter must carry: `work_failed`, the exception's class and message."""
    return f"work_failed: builtins.ValueError: {message(request_id)}"


def screen(event: dict[str, Any]) -> dict[str, Any]:
    """The team's work: nothing to add to a style choice, except that it raises on the 1 %."""
    if raises(event["request_id"]):
        raise ValueError(message(event["request_id"]))
    return {}


def spec_document() -> dict[str, Any]:
    """The reference spec with `screen` in front of `check` (see the module docstring)."""
    reference = pipeline_spec.PIPELINES_DIR / f"{pipeline_spec.REFERENCE}.yaml"
    document = yaml.safe_load(reference.read_text())
    stages = document["stages"]
    document["name"] = NAME
    document["description"] = (f"{pipeline_spec.REFERENCE} with a team's Python stage before the check, "
                               "raising on 1 % of the requests (make faults: work-raises).")
    document["topics"]["screened"] = {"key": document["key"]}
    screen_stage = {"source": stages["check"]["source"], "schema": stages["check"]["schema"],
                    "work": {"kind": "python", "callable": f"{__name__}:screen"},
                    "routes": [{"to": "screened", "forward": True}]}
    document["stages"] = {"intake": stages["intake"], STAGE: screen_stage,
                          "check": {**stages["check"], "source": "screened"},
                          **{n: s for n, s in stages.items() if n not in ("intake", "check")}}
    return document


def write_folder(folder: Path) -> Path:
    """A pipelines folder holding the shipped specs and this one; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for shipped in pipeline_spec.PIPELINES_DIR.glob("*.yaml"):
        (folder / shipped.name).write_text(shipped.read_text())
    (folder / f"{NAME}.yaml").write_text(yaml.safe_dump(spec_document(), sort_keys=False))
    return folder
