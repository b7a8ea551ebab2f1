"""The peer beside the platform: chat requests sent through LiteLLM's own Router client, held to
the gateway's limits, straight to the model's endpoint: what a team gets without the platform.

Runs in the gateway's environment, with the repository on PYTHONPATH (`bench/peer.py` does both):

    .local/litellm-venv/bin/python -m bench.router_peer --requests r.json --models m.json --out o.json

That environment has LiteLLM and none of the project's dependencies, so this imports only the
standard library and litellm. `--requests`: a JSON list of rendered chat requests ({model,
messages, max_tokens, temperature, user}); `--models`: the Router's model list, one deployment
per model with its `rpm` and `tpm` (the gateway's, `infra.ai_gateway.config`). It writes per
request when a worker took it and when it ended, its outcome (ok, rate_limited, error), its tries
and refusals, its last call's seconds and tokens, and the totals; stdout gets one progress line
a second. The figures are bench/peer.py's, from measure/. `--at-minute` holds the requests until
a clock minute turns, so that the first minute's limit is met whole (the tests' runs).

How Router holds the limits (litellm 1.108). `routing_strategy="usage-based-routing-v2"` picks
among deployments by their usage: it passes over a deployment once rpm - 1 calls of the minute
are counted and counts tokens only as answers come back, so it steers more than it holds. The
`enforce_model_rate_limits` pre-call check counts each call before it is made (incremented first,
so calls at once cannot overshoot) and refuses with RateLimitError past the rpm or the tpm: it
holds the limits, and it is what the gateway's proxy runs, so both sides are held by the same
code. Its counts are per UTC clock minute, refusals included.

Its refusal asks not to be retried and says `retry-after: 60`. A team that wants every request
answered gives Router a retry policy for rate-limit errors, and Router waits out those 60 s (the
worker with it) before trying again: `--retries` tries, 3 by default. Nothing else is retried
(`num_retries=0`, as the gateway), and the OpenAI client under Router retries nothing itself
(`max_retries=0`), so a 429 from the endpoint reaches Router too. A retry follows a refusal, so a
request's refusals are its retries, plus one when it ended rate_limited.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# litellm's import fetches the model cost map from the internet unless told to read its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from litellm.types.router import RetryPolicy

OUTCOMES = ("ok", "rate_limited", "error")
MINUTE_TURNED_S = 0.5  # past a minute's turn, so that a clock a little behind is in the new one too


def router(model_list: list[dict[str, Any]], retries: int) -> litellm.Router:
    """One deployment per model, its limits enforced before each call, rate-limit refusals tried
    again `retries` times and nothing else (see the module docstring)."""
    return litellm.Router(model_list=model_list, optional_pre_call_checks=["enforce_model_rate_limits"],
                          num_retries=0, retry_policy=RetryPolicy(RateLimitErrorRetries=retries))


def _retries(exc: Exception) -> int:
    """The retries Router made before giving up (it sets them on the error it raises)."""
    value = getattr(exc, "num_retries", None)
    return value if isinstance(value, int) else 0


async def send(peer: litellm.Router, request: dict[str, Any]) -> dict[str, Any]:
    """One request through Router: its record (see the module docstring)."""
    started = time.time()
    try:
        answer = await peer.acompletion(**request, max_retries=0)
    except litellm.RateLimitError as exc:
        retried = _retries(exc)
        return {"started": started, "ended": time.time(), "outcome": "rate_limited", "tries": retried + 1,
                "refused": retried + 1, "error": str(exc).splitlines()[0][:200]}
    except Exception as exc:  # noqa: BLE001 - any other failure is the request's outcome, recorded
        retried = _retries(exc)
        return {"started": started, "ended": time.time(), "outcome": "error", "tries": retried + 1,
                "refused": retried, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    headers = answer._hidden_params.get("additional_headers") or {}
    retried = int(headers.get("x-litellm-attempted-retries") or 0)
    return {"started": started, "ended": time.time(), "outcome": "ok", "tries": retried + 1,
            "refused": retried, "call_s": (answer._response_ms or 0.0) / 1000,
            "tokens_input": answer.usage.prompt_tokens, "tokens_output": answer.usage.completion_tokens}


async def run(peer: litellm.Router, requests: list[dict[str, Any]], workers: int,
              progress_s: float = 1.0) -> dict[str, Any]:
    """Every request through `peer` by `workers` workers, in order; a progress line on stdout."""
    records: list[dict[str, Any] | None] = [None] * len(requests)
    pending = iter(range(len(requests)))
    started = time.time()

    async def worker() -> None:
        for index in pending:
            records[index] = await send(peer, requests[index])

    def report() -> None:
        done = [r for r in records if r is not None]
        print(json.dumps({"done": len(done), "total": len(requests),
                          "ok": sum(r["outcome"] == "ok" for r in done),
                          "refused": sum(r["refused"] for r in done)}), flush=True)

    tasks = [asyncio.create_task(worker()) for _ in range(min(workers, len(requests)))]
    while not all(task.done() for task in tasks):
        await asyncio.wait(tasks, timeout=progress_s)
        report()
    for task in tasks:
        task.result()
    done = [r for r in records if r is not None]
    return {"started": started, "workers": workers, "requests": done,
            "totals": {"requests": len(done), "calls": sum(r["tries"] for r in done),
                       **{outcome: sum(r["outcome"] == outcome for r in done) for outcome in OUTCOMES},
                       "refused_429": sum(r["refused"] for r in done),
                       "span_s": max((r["ended"] for r in done), default=started) - started}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--requests", type=Path, required=True, help="JSON list of chat requests")
    p.add_argument("--models", type=Path, required=True, help="JSON: Router's model list")
    p.add_argument("--out", type=Path, required=True, help="where the result goes (JSON)")
    p.add_argument("--workers", type=int, default=64, help="requests in flight at once")
    p.add_argument("--retries", type=int, default=3, help="tries again after a rate-limit refusal")
    p.add_argument("--at-minute", action="store_true",
                   help="start sending when the next UTC clock minute turns (Router counts per minute)")
    args = p.parse_args(argv)
    peer = router(json.loads(args.models.read_text()), args.retries)
    if args.at_minute:  # once LiteLLM is imported and Router built, which take seconds
        time.sleep(60 - time.time() % 60 + MINUTE_TURNED_S)
    result = asyncio.run(run(peer, json.loads(args.requests.read_text()), args.workers))
    args.out.write_text(json.dumps({**result, "retries": args.retries}))
    print(json.dumps(result["totals"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
