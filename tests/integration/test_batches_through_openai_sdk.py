"""The stand-in's batch tier as OpenAI's own Python client uses it (from the gateway's
environment, where the `openai` package is installed): upload, create, poll, read the answers.
What the client accepts is what the real API's shape is held to."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from consumers.config.pipeline_spec import load
from consumers.stand_in.config import ServiceConfig
from consumers.stand_in.server import serve
from infra import ai_gateway

CLIENT = """
import io, json, sys, time
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
lines = [{"custom_id": f"t-{i}", "method": "POST", "url": "/v1/chat/completions",
          "body": {"model": "large-model", "max_tokens": 200, "user": f"ticket-{i}",
                   "messages": [{"role": "user", "content": "Where is my invoice?"}]}} for i in range(3)]
jsonl = "".join(json.dumps(x) + "\\n" for x in lines).encode()
upload = client.files.create(file=("batch.jsonl", io.BytesIO(jsonl)), purpose="batch")
batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
deadline = time.monotonic() + 30
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    assert time.monotonic() < deadline, batch.status
    time.sleep(0.05)
    batch = client.batches.retrieve(batch.id)
answers = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
print(json.dumps({"status": batch.status, "counts": batch.request_counts.model_dump(),
                  "answers": {a["custom_id"]: a["response"]["body"]["choices"][0]["message"]["content"][:5]
                              for a in answers}}))
"""


@pytest.fixture
def base_url() -> Iterator[str]:
    config = ServiceConfig.from_specs([load("support_tickets")], time_scale=0.001, seed=3)
    server = serve(config, host="127.0.0.1", port=0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_openai_s_client_uploads_creates_polls_and_reads_a_batch(base_url: str) -> None:
    python = ai_gateway.VENV / "bin" / "python"
    done = subprocess.run([str(python), "-c", CLIENT, base_url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["status"] == "completed"
    assert (found["counts"]["total"], found["counts"]["completed"], found["counts"]["failed"]) == (3, 3, 0)
    assert found["answers"] == {"t-0": "Hello", "t-1": "Hello", "t-2": "Hello"}  # the large model's rule
