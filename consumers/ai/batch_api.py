"""OpenAI's Batch API as a client calls it: the requests uploaded as a JSONL file to `/v1/files`
(`purpose=batch`), a batch created from the file on `/v1/batches` with a 24-hour window, polled
on `/v1/batches/<id>`, its answers and errors read as JSONL files keyed by `custom_id`.

The base URL is the endpoint's URL without its path: a provider (or a gateway) that serves
`/v1/chat/completions` serves `/v1/files` and `/v1/batches` beside it. Every failure raises
`BatchCallFailed` with the HTTP status (None: no answer came), so the caller tells a refusal
(4xx) from a failure of the provider's (5xx, a connection) that is waited out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import urllib3

WINDOW = "24h"
ENDED = ("completed", "failed", "expired", "cancelled")  # a batch's final statuses
LISTED = 100  # batches read when looking for the one a file was created as


class BatchCallFailed(RuntimeError):
    """A call of the batch protocol got no 2xx answer."""

    def __init__(self, what: str, status: int | None, detail: str) -> None:
        super().__init__(f"{what}: {status or 'no answer'} {detail[:300]}")
        self.status = status

    @property
    def refused(self) -> bool:
        """A 4xx: the provider will not do it (a queue limit's 429 included)."""
        return self.status is not None and 400 <= self.status < 500


class BatchAPI:
    """One provider's batch protocol, at `base_url` (no trailing /v1), with the endpoint's key."""

    def __init__(self, base_url: str, auth_header: str | None = None,
                 headers: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {**(headers or {}), **({"Authorization": auth_header} if auth_header else {})}
        self._http = urllib3.PoolManager(num_pools=1, maxsize=2, retries=False,
                                         timeout=urllib3.Timeout(total=timeout_s))

    @classmethod
    def beside(cls, endpoint_url: str, path: str, auth_header: str | None = None,
               headers: Mapping[str, str] | None = None) -> BatchAPI:
        """The batch protocol of the provider that serves `endpoint_url` (which ends in `path`)."""
        if not endpoint_url.endswith(path):
            raise ValueError(f"{endpoint_url} does not end in its path {path}")
        return cls(endpoint_url[: len(endpoint_url) - len(path)], auth_header, headers)

    def _call(self, what: str, method: str, path: str, **kwargs: Any) -> bytes:
        try:
            reply = self._http.request(method, self.base_url + path,
                                       headers={**self._headers, **kwargs.pop("headers", {})}, **kwargs)
        except urllib3.exceptions.HTTPError as exc:
            raise BatchCallFailed(what, None, repr(exc)) from exc
        if not 200 <= reply.status < 300:
            raise BatchCallFailed(what, reply.status, reply.data.decode(errors="replace"))
        return reply.data

    def _json(self, what: str, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return json.loads(self._call(what, method, path, **kwargs))
        except ValueError as exc:
            raise BatchCallFailed(what, None, f"an answer that is not JSON: {exc}") from exc

    def upload(self, lines: Sequence[Mapping[str, Any]]) -> str:
        """The file of `lines` (each a `custom_id`, `method`, `url` and `body`); its id."""
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
        found = self._json("upload", "POST", "/v1/files",
                           fields={"purpose": "batch", "file": ("batch.jsonl", data, "application/jsonl")})
        return str(found["id"])

    def create(self, input_file_id: str, endpoint: str) -> dict[str, Any]:
        """A batch of the uploaded file's lines, for the work path `endpoint`."""
        return self._json("create", "POST", "/v1/batches", headers={"Content-Type": "application/json"},
                          body=json.dumps({"input_file_id": input_file_id, "endpoint": endpoint,
                                           "completion_window": WINDOW}))

    def created_from(self, input_file_id: str) -> dict[str, Any] | None:
        """The batch created from `input_file_id`, among the newest LISTED: a create whose answer
        was lost may still have made one, and a second create would pay for every line twice."""
        listed = self._json("list", "GET", f"/v1/batches?limit={LISTED}")
        return next((b for b in listed.get("data", []) if b.get("input_file_id") == input_file_id), None)

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        return self._json("retrieve", "GET", f"/v1/batches/{batch_id}")

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._json("cancel", "POST", f"/v1/batches/{batch_id}/cancel")

    def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        """An output or error file's lines (none without a file)."""
        if not file_id:
            return []
        data = self._call("content", "GET", f"/v1/files/{file_id}/content")
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()]

    def close(self) -> None:
        self._http.clear()
