"""The stand-in's cheaper tiers. The batch tier (OpenAI's Batch API shape) on a clock moved by
hand: a batch's life from upload to its answers, each way it fails, and its answers counted as
the endpoints' served calls, so that a request answered by a batch and again realtime is served
twice; then once over HTTP, as a client uploads and polls. The flex tier: slower, and refused
when its capacity is short."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests

from consumers.config.pipeline_spec import load
from consumers.stand_in.config import ServiceConfig
from consumers.stand_in.server import serve
from consumers.stand_in.service import StandIn
from tests.hand_clock import HandClock

FORM = "multipart/form-data; boundary=b0undary"
# a fixed turnaround (median = p99: no spread) of 100 s after 5 s of validation
FIXED = {"median_s": 100.0, "p99_s": 100.0, "validation_s": 5.0}



def form(jsonl: str, purpose: str = "batch") -> bytes:
    """A multipart upload as OpenAI's client sends it: the purpose, then the file."""
    return (f"--b0undary\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n"
            f"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"batch.jsonl\"\r\n"
            f"Content-Type: application/jsonl\r\n\r\n{jsonl}\r\n--b0undary--\r\n").encode()


def line(custom_id: str, model: str = "large-model", user: str | None = None) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": "Where is my invoice?"}],
                     "max_tokens": 200, "user": user or custom_id}}


def jsonl(*lines: dict[str, Any]) -> str:
    return "".join(json.dumps(x) + "\n" for x in lines)


def standin(clock: HandClock, **batches: float) -> StandIn:
    service = StandIn(ServiceConfig.from_specs([load("support_tickets")], seed=7), clock=clock)
    service.update({"batches": {**FIXED, **batches}})
    return service


def submitted(service: StandIn, *lines: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, uploaded = service.batches.upload(FORM, form(jsonl(*lines)))
    assert status == 200, uploaded
    return service.batches.create({"input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions",
                                   "completion_window": "24h"})


def content(service: StandIn, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    found = service.batches.content(file_id)
    assert found is not None
    return [json.loads(x) for x in found.decode().splitlines()]


def test_a_batch_validates_runs_and_answers_each_line_by_its_custom_id() -> None:
    clock = HandClock()
    service = standin(clock)
    status, batch = submitted(service, line("t-1"), line("t-2"), line("t-3", model="small-model"))
    assert (status, batch["status"], batch["request_counts"]["total"]) == (200, "validating", 3)
    clock.now = 5.0
    assert service.batches.retrieve(batch["id"])[1]["status"] == "in_progress"
    clock.now = 104.9  # 5 s of validation and 100 s of turnaround
    assert service.batches.retrieve(batch["id"])[1]["status"] == "in_progress"
    clock.now = 105.0
    done = service.batches.retrieve(batch["id"])[1]
    assert (done["status"], done["request_counts"], done["error_file_id"]) == (
        "completed", {"total": 3, "completed": 3, "failed": 0}, None)
    answers = {a["custom_id"]: a["response"] for a in content(service, done["output_file_id"])}
    assert set(answers) == {"t-1", "t-2", "t-3"} and {a["status_code"] for a in answers.values()} == {200}
    assert answers["t-3"]["body"]["choices"][0]["message"]["content"] == "billing"  # small model's rule
    assert answers["t-1"]["body"]["model"] == "large-model"
    stats = service.stats()
    assert (stats["large_model"]["served"], stats["small_model"]["served"]) == (2, 1)
    assert stats["batches"]["completed"] == 1 and stats["batches"]["lines_served"] == 3


def test_a_request_answered_by_a_batch_and_again_realtime_is_served_twice() -> None:
    clock = HandClock()
    service = standin(clock)
    _, batch = submitted(service, line("t-1", user="ticket-1"))
    clock.now = 105.0
    service.batches.retrieve(batch["id"])
    # the fallback: the same ticket called realtime (latency at a tiny scale: the call sleeps)
    service.update({"time_scale": 1e-6})
    body = json.dumps(line("t-1", user="ticket-1")["body"]).encode()
    assert service.call("large_model", None, body).status == 200
    assert service.stats()["large_model"]["duplicate_served"] == 1


def test_an_expired_batch_answers_half_its_lines_and_lists_the_rest_as_expired() -> None:
    clock = HandClock()
    service = standin(clock, expire_rate=1.0, window_s=3600.0)
    _, batch = submitted(service, *(line(f"t-{i}") for i in range(4)))
    clock.now = 3599.0
    assert service.batches.retrieve(batch["id"])[1]["status"] == "in_progress"  # past its turnaround
    clock.now = 3600.0
    done = service.batches.retrieve(batch["id"])[1]
    assert (done["status"], done["request_counts"]) == ("expired", {"total": 4, "completed": 2, "failed": 2})
    assert [a["custom_id"] for a in content(service, done["output_file_id"])] == ["t-0", "t-1"]
    errors = content(service, done["error_file_id"])
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("t-2", "batch_expired"),
                                                                      ("t-3", "batch_expired")]
    assert service.stats()["large_model"]["served"] == 2


def test_a_batch_failed_at_validation_answers_nothing() -> None:
    clock = HandClock()
    service = standin(clock, fail_validation_rate=1.0)
    _, batch = submitted(service, line("t-1"))
    clock.now = 5.0
    done = service.batches.retrieve(batch["id"])[1]
    assert (done["status"], done["output_file_id"], done["errors"]["data"][0]["code"]) == (
        "failed", None, "invalid_batch")
    assert service.stats()["large_model"]["served"] == 0


def test_lines_that_fail_are_in_the_error_file_and_not_served() -> None:
    clock = HandClock()
    service = standin(clock, line_error_rate=1.0)
    _, batch = submitted(service, line("t-1"), line("t-2", model="no-such-model"))
    clock.now = 105.0
    done = service.batches.retrieve(batch["id"])[1]
    assert (done["status"], done["output_file_id"]) == ("completed", None)
    assert [e["error"]["code"] for e in content(service, done["error_file_id"])] == ["server_error"] * 2


def test_creates_are_refused_with_a_500_and_past_the_queue_limit_with_a_429() -> None:
    clock = HandClock()
    failing = standin(clock, create_error_rate=1.0)
    assert submitted(failing, line("t-1"))[0] == 500
    full = standin(clock, queue_limit=1)
    assert submitted(full, line("t-1"))[0] == 200
    assert submitted(full, line("t-2"))[0] == 429
    clock.now = 105.0  # the first has ended: room again
    assert submitted(full, line("t-3"))[0] == 200
    assert full.stats()["batches"]["batches_refused"] == 1


@pytest.mark.parametrize(("request_body", "status"), [
    ({"input_file_id": "file-none", "endpoint": "/v1/chat/completions", "completion_window": "24h"}, 404),
    ({"endpoint": "/v1/embeddings", "completion_window": "24h"}, 400),
])
def test_a_create_of_no_upload_or_for_another_endpoint_is_refused(request_body: dict[str, Any],
                                                                   status: int) -> None:
    service = standin(HandClock())
    _, uploaded = service.batches.upload(FORM, form(jsonl(line("t-1"))))
    request_body.setdefault("input_file_id", uploaded["id"])
    assert service.batches.create(request_body)[0] == status
    assert service.batches.upload(FORM, form(jsonl(line("t-1")), purpose="fine-tune"))[0] == 400


def test_over_http_a_client_uploads_creates_polls_and_reads_the_answers() -> None:
    config = ServiceConfig.from_specs([load("support_tickets")], time_scale=0.001, seed=7)
    server = serve(config, host="127.0.0.1", port=0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        # 5 s + 100 s at time scale 0.001: about 0.1 s
        assert requests.put(f"{base}/v1/config", json={"batches": FIXED}, timeout=5).status_code == 200
        uploaded = requests.post(f"{base}/v1/files", data={"purpose": "batch"},
                                 files={"file": ("batch.jsonl", jsonl(line("t-1"), line("t-2")))}, timeout=5)
        assert uploaded.status_code == 200, uploaded.text
        created = requests.post(f"{base}/v1/batches", json={"input_file_id": uploaded.json()["id"],
                                                            "endpoint": "/v1/chat/completions",
                                                            "completion_window": "24h"}, timeout=5).json()
        deadline = time.monotonic() + 10
        while (batch := requests.get(f"{base}/v1/batches/{created['id']}", timeout=5).json())["status"] \
                != "completed":
            assert time.monotonic() < deadline, batch
            time.sleep(0.02)
        answers = requests.get(f"{base}/v1/files/{batch['output_file_id']}/content", timeout=5)
        assert sorted(json.loads(x)["custom_id"] for x in answers.text.splitlines()) == ["t-1", "t-2"]
        assert requests.get(f"{base}/v1/batches/batch_none", timeout=5).status_code == 404
        cancelled = requests.post(f"{base}/v1/batches/{created['id']}/cancel", timeout=5).json()
        assert cancelled["status"] == "completed"  # it had ended: nothing left to cancel
    finally:
        server.shutdown()
        server.server_close()


def flex_call(service: StandIn, tier: str = "flex") -> tuple[int, dict[str, Any], float]:
    body = json.dumps({**line("t-1")["body"], "service_tier": tier}).encode()
    began = time.monotonic()
    reply = service.call("large_model", None, body)
    return reply.status, reply.body, time.monotonic() - began


def test_a_flex_call_is_served_slower_and_counted_as_flex() -> None:
    service = StandIn(ServiceConfig.from_specs([load("support_tickets")], time_scale=0.05, seed=1))
    # a fixed 1 s, four times as long on flex: at least 0.2 s at time scale 0.05
    service.update({"large_model": {"distribution": "fixed", "latency_s": 1.0, "per_output_token_s": 0.0,
                                    "flex_slowdown": 4.0}})
    status, _, took = flex_call(service)
    assert status == 200 and took >= 0.2
    assert flex_call(service, tier="default")[0] == 200
    stats = service.stats()["large_model"]
    assert (stats["served"], stats["flex_served"], stats["flex_refused"]) == (2, 1, 0)


def test_a_flex_call_is_refused_when_capacity_is_short_and_nothing_is_served() -> None:
    service = StandIn(ServiceConfig.from_specs([load("support_tickets")], time_scale=0.001, seed=1))
    service.update({"large_model": {"flex_refuse_rate": 1.0}})
    status, body, _ = flex_call(service)
    assert (status, body["error"]["type"]) == (429, "resource_unavailable")
    stats = service.stats()["large_model"]
    assert (stats["served"], stats["flex_refused"], stats["rejected_429"]) == (0, 1, 0)
