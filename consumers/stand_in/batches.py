"""OpenAI's Batch API as the stand-in serves it: a JSONL file uploaded to `/v1/files`
(`purpose=batch`), a batch created on `/v1/batches` from it, polled on `/v1/batches/<id>` until
it ends, its answers and errors read from `/v1/files/<id>/content`, each line keyed by the
request's `custom_id`.

Each line is answered by the endpoint its `body.model` names at its `url`, with the endpoint's
answer rules, and counted as that endpoint's served call once its batch completes: a request
answered by a batch and again by a realtime call (a fallback) is served twice, and
`duplicate_served` says so. A batch's turnaround is drawn from a lognormal (median and p99 at
real scale, the time scale applied); it stays `validating` for `validation_s`, then
`in_progress` until its turnaround, then ends:

- `completed`: every line answered, except a share `line_error_rate` answered with an error;
- `failed` (a share `fail_validation_rate`): at validation, nothing answered;
- `expired` (a share `expire_rate`): at its window, half its lines answered, the rest in the
  error file as `batch_expired`, as OpenAI does.

A create is refused with a 500 at `create_error_rate`, and with a 429 while `queue_limit`
batches are pending. The state lives in this process, as a provider's lives in its own."""

from __future__ import annotations

import email.parser
import email.policy
import json
import math
import random
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from consumers.stand_in.calls import BadRequest, prepare
from consumers.stand_in.endpoint import SimulatedEndpoint

Z99 = 2.3263478740408408
CHAT_URL = "/v1/chat/completions"
INVALID = "invalid_request_error"
STATUSES = ("validating", "in_progress", "completed", "failed", "expired", "cancelled")


@dataclass(frozen=True)
class BatchConfig:
    """How the batch tier behaves; durations are real-scale seconds (the time scale applies)."""

    median_s: float = 420.0  # a batch's turnaround: OpenRouter reports a median of 7 minutes
    p99_s: float = 3600.0  # and 90 % within the hour
    validation_s: float = 5.0
    window_s: float = 86400.0  # `completion_window: 24h`: an expired batch ends here
    queue_limit: int = 100  # batches pending at once
    fail_validation_rate: float = 0.0
    expire_rate: float = 0.0
    create_error_rate: float = 0.0
    line_error_rate: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.median_s <= self.p99_s:
            raise ValueError("a batch's turnaround needs 0 < median_s <= p99_s")
        for name in ("fail_validation_rate", "expire_rate", "create_error_rate", "line_error_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a share in [0, 1]")


@dataclass
class Batch:
    """One batch and what it will be: its lines, its outcome and when it ends (monotonic s)."""

    id: str
    input_file_id: str
    lines: list[dict[str, Any]]
    created_at: float  # epoch, as the API shows it
    validated_at: float
    ends_at: float
    outcome: str  # completed | failed | expired
    status: str = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"total": 0, "completed": 0, "failed": 0})


class Batches:
    """The files and batches of one stand-in; `endpoints` are its endpoints by (path, model)."""

    def __init__(self, endpoints: Callable[[], Mapping[tuple[str, str | None], SimulatedEndpoint]],
                 time_scale: Callable[[], float], clock: Callable[[], float], wall: Callable[[], float],
                 seed: int | None = None) -> None:
        self._endpoints, self._time_scale, self._clock, self._wall = endpoints, time_scale, clock, wall
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.config = BatchConfig()
        self._files: dict[str, bytes] = {}
        self._batches: dict[str, Batch] = {}
        self.counts = {"batches_created": 0, "batches_refused": 0, "lines_served": 0, "lines_failed": 0}

    def reset(self) -> None:
        """Zero the counters (the files and batches stay, as a provider keeps them)."""
        with self._lock:
            self.counts = dict.fromkeys(self.counts, 0)

    def upload(self, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """POST /v1/files: a multipart form with `purpose=batch` and the JSONL `file`."""
        parts = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
        form = {part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
                for part in parts.iter_parts()} if parts.is_multipart() else {}
        content = form.get("file")
        if form.get("purpose") != b"batch" or not isinstance(content, bytes) or not content:
            return 400, error_body(INVALID, "a batch file is uploaded with purpose=batch and a file")
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        with self._lock:
            self._files[file_id] = content
        return 200, {"id": file_id, "object": "file", "bytes": len(content), "purpose": "batch",
                     "created_at": int(self._wall())}

    def create(self, request: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST /v1/batches: a batch of an uploaded file's lines."""
        c = self.config
        with self._lock:
            content = self._files.get(str(request.get("input_file_id")))
            if content is None:
                return 404, error_body(INVALID, "no such input_file_id")
            if request.get("completion_window") != "24h" or request.get("endpoint") != CHAT_URL:
                return 400, error_body(INVALID, f"a batch is for {CHAT_URL} within 24h")
            pending = sum(b.status in ("validating", "in_progress") for b in self._refreshed())
            if pending >= c.queue_limit or self._rng.random() < c.create_error_rate:
                self.counts["batches_refused"] += 1
                return (429, error_body("rate_limit_exceeded", "batch queue limit reached")) \
                    if pending >= c.queue_limit else (500, error_body("server_error", "batch not created"))
            try:
                lines = [json.loads(line) for line in content.decode().splitlines() if line.strip()]
            except ValueError:
                lines = []
            scale, now, draw = self._time_scale(), self._clock(), self._rng.random()
            outcome = ("failed" if draw < c.fail_validation_rate or not lines
                       else "expired" if draw < c.fail_validation_rate + c.expire_rate else "completed")
            sigma = math.log(c.p99_s / c.median_s) / Z99
            turnaround = c.median_s * math.exp(sigma * self._rng.gauss(0.0, 1.0))
            after = c.validation_s if outcome == "failed" else c.window_s if outcome == "expired" \
                else c.validation_s + turnaround
            batch = Batch(f"batch_{uuid.uuid4().hex[:24]}", str(request["input_file_id"]), lines,
                          self._wall(), now + c.validation_s * scale, now + after * scale, outcome)
            batch.counts["total"] = len(lines)
            self._batches[batch.id] = batch
            self.counts["batches_created"] += 1
            return 200, self._shown(batch)

    def retrieve(self, batch_id: str) -> tuple[int, dict[str, Any]]:
        """GET /v1/batches/<id>: where the batch is now."""
        with self._lock:
            self._refreshed()
            batch = self._batches.get(batch_id)
            return (200, self._shown(batch)) if batch else (404, error_body(INVALID, "no such batch"))

    def listed(self, limit: int) -> tuple[int, dict[str, Any]]:
        """GET /v1/batches: the newest `limit` batches (1 to 100, as OpenAI's page)."""
        with self._lock:
            newest = sorted(self._refreshed(), key=lambda b: b.created_at, reverse=True)
            return 200, {"object": "list", "data": [self._shown(b) for b in newest[:max(1, min(100, limit))]],
                         "has_more": len(newest) > limit}

    def cancel(self, batch_id: str) -> tuple[int, dict[str, Any]]:
        """POST /v1/batches/<id>/cancel: a pending batch ends `cancelled`, nothing answered."""
        with self._lock:
            self._refreshed()
            batch = self._batches.get(batch_id)
            if batch is None:
                return 404, error_body(INVALID, "no such batch")
            if batch.status in ("validating", "in_progress"):
                batch.status = "cancelled"
            return 200, self._shown(batch)

    def content(self, file_id: str) -> bytes | None:
        """GET /v1/files/<id>/content: an output or error file (None: no such file)."""
        with self._lock:
            return self._files.get(file_id)

    def _refreshed(self) -> list[Batch]:
        """Every batch, each moved on to where its clock says it is (under the lock)."""
        now = self._clock()
        for batch in self._batches.values():
            if batch.status == "validating" and now >= batch.validated_at and batch.outcome != "failed":
                batch.status = "in_progress"
            if batch.status in ("validating", "in_progress") and now >= batch.ends_at:
                self._end(batch)
        return list(self._batches.values())

    def _end(self, batch: Batch) -> None:
        """The batch's answers and errors written to its files, each answer counted as served."""
        batch.status = batch.outcome
        if batch.outcome == "failed":
            return
        answered = len(batch.lines) if batch.outcome == "completed" else len(batch.lines) // 2
        out: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for i, line in enumerate(batch.lines):
            if i >= answered:
                errors.append(_error_line(line, "batch_expired", "the batch expired before this request ran"))
                continue
            if self._rng.random() < self.config.line_error_rate:
                errors.append(_error_line(line, "server_error", "this request failed"))
                continue
            found = self._answer(line)
            (out if "response" in found else errors).append(found)
        for lines, attribute in ((out, "output_file_id"), (errors, "error_file_id")):
            if lines:
                file_id = f"file-{uuid.uuid4().hex[:24]}"
                self._files[file_id] = "".join(json.dumps(x) + "\n" for x in lines).encode()
                setattr(batch, attribute, file_id)
        batch.counts.update(completed=len(out), failed=len(errors))
        self.counts["lines_served"] += len(out)
        self.counts["lines_failed"] += len(errors)

    def _answer(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """One line answered by its endpoint's rules, and counted as that endpoint's served call."""
        body = line.get("body") or {}
        endpoint = self._endpoints().get((str(line.get("url")), body.get("model")))
        if endpoint is None:
            return _error_line(line, "model_not_found", f"model {body.get('model')!r} is not served here")
        try:
            call = prepare(endpoint.config, json.dumps(body).encode())
        except BadRequest as exc:
            return _error_line(line, "invalid_request", str(exc))
        identity = call.payload.get(endpoint.config.identity) if endpoint.config.identity else None
        endpoint.served(identity, call.input_tokens, call.output_tokens)
        return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": line.get("custom_id"),
                "response": {"status_code": 200, "body": call.body}, "error": None}

    def _shown(self, batch: Batch) -> dict[str, Any]:
        return {"id": batch.id, "object": "batch", "endpoint": CHAT_URL, "input_file_id": batch.input_file_id,
                "completion_window": "24h", "status": batch.status, "created_at": int(batch.created_at),
                "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
                "request_counts": dict(batch.counts),
                "errors": {"data": [{"code": "invalid_batch", "message": "the batch failed validation"}]}
                if batch.status == "failed" else None}

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            statuses = [b.status for b in self._refreshed()]
            return {**self.counts, **{s: statuses.count(s) for s in STATUSES}, "config": asdict(self.config)}


def error_body(kind: str, message: str) -> dict[str, Any]:
    """An error as OpenAI's API words it."""
    return {"error": {"type": kind, "message": message}}


def _error_line(line: Mapping[str, Any], code: str, message: str) -> dict[str, Any]:
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": line.get("custom_id"), "response": None,
            "error": {"code": code, "message": message}}
