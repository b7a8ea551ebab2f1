"""Stand-in for the external AI APIs, served over HTTP for tests and benchmarks.

Consumers call it exactly as they would a real endpoint, so the pipeline's timeouts, retries
and concurrency limits are exercised for real. It serves every endpoint the pipeline specs
(`pipelines/*.yaml`) declare, at the spec's path (`POST /v1/check`, `POST /v1/moderate`, ...),
with the spec's concurrency limit (429 with `Retry-After` beyond it), its latency (fixed, or
lognormal with the spec's median and p99) and its `stand_in` rules: the request fields that must
be non-empty strings and the answers, the first rule whose patterns match supplying the body. A
global time-scale factor shrinks every duration so a test can run a scenario at 0.1x or 0.02x.

Faults are injected per endpoint (`error_rate`: 500 after the latency; `hang_rate`: answer only
after `hang_s`, past any sane client timeout, as a stalled generation does that a provider
finishes, and bills, after its caller gave up; `fail_when`: 500 after the latency to every
request whose fields match all of its `{field: regex}` patterns, while the rest are served, as
an endpoint does that keeps failing some requests) and can be switched at run time through
`PUT /v1/config`, so a test can start an error burst and clear it. A request-rate limit
(`rate_limit_rps`, a token bucket of `rate_burst` requests, as real APIs meter requests per
minute) answers 429 with the time until the next token as `Retry-After`; switching it on for
a few seconds makes the 429 bursts a shared quota produces. A `limit_schedule` of
`[[at_s, limit], ...]` (real-scale seconds since the setting was applied) changes the
concurrency limit during a run, as a provider's does with its load, so a client that adapts
can be measured; `limit_in_force` in the stats says which holds.

Budgets meter like a provider (`consumers.stand_in.budgets`): `requests_per_minute` and
`tokens_per_minute` (of the `tokens` that count: input, output or total) are continuously
refilled buckets checked before the concurrency limit. A request is charged its prompt's tokens
plus `max_tokens` (else its answer's) and corrected to the actual tokens once answered; a
refusal is 429 with an OpenAI error of type `requests` or `tokens` (a concurrency refusal says
`concurrency`) and a `Retry-After` (none with `retry_after_on_budget: false`, as LiteLLM's proxy
answers). Every answer of a budgeted endpoint carries OpenAI's `x-ratelimit-*` headers. An
endpoint whose `stand_in` says `protocol: openai_chat` speaks OpenAI's chat completions
(`messages` in, `choices` and `usage` out) and takes a time to first token (the spec's latency)
plus `per_output_token_s` per token it writes.

OpenAI's Batch API is served for the chat endpoints (`consumers.stand_in.batches`): a JSONL
file uploaded to `/v1/files`, a batch created on `/v1/batches`, polled on `/v1/batches/<id>`,
answered in `/v1/files/<id>/content` by `custom_id`, with a drawn turnaround, a queue limit
and the ways a batch fails (`failed` at validation, `expired` half done, lines with errors, 500
on create), all set at run time under `batches` in `PUT /v1/config`. A batch's answers are its
endpoints' served calls: a request answered by a batch and again realtime counts in
`duplicate_served`. A chat request's `service_tier: flex` is OpenAI's flex tier: served
`flex_slowdown` times slower, refused at `flex_refuse_rate` with a 429 `resource_unavailable`
(counted as `flex_refused`, not as a concurrency refusal).

Accounts meter as providers do, per organization and model, not per path
(`consumers.stand_in.accounts`): the endpoints whose `account` (their spec's `quota`) names one
share its meter, `concurrency` calls at once across them and per-minute budgets as an endpoint's,
passed in the same step as each endpoint's own limits. The account's refusal is a 429 shaped as
the endpoint's own (`concurrency`, `requests`, `tokens`), counted as `over_quota`, and the
`x-ratelimit-*` headers show the account's buckets: what remains for all its endpoints. A
request's `X-Caller` header names its caller (`-` without one).

`GET /v1/stats` reports what was served per endpoint name, including the highest concurrency
seen (how tests verify that a consumer fleet never exceeds the API's limit), the refusals by
kind (`rejected_429`, `rate_limited`, `rate_limited_requests`, `rate_limited_tokens`), the
tokens served (`tokens_input`, `tokens_output`) and how many requests were served more than
once (`duplicate_served`: the calls a client paid for twice, counted on the service's side). A
request's identity is its endpoint's first required field (`request_id`, `message_id`, ...),
or a chat request's `user`. `POST /v1/stats/reset` starts a measurement afresh: the counters at
zero and the request-rate limit and per-minute budgets full, so a burst right after another
meets the budgets its figures assume (a budget left half spent by a warm-up is no limit of the
run being measured). Under `accounts`, the stats report each account's limits, its endpoints,
`over_quota`, its calls in flight, their peak and `busy_s` (calls in flight integrated over wall
time: over a measurement's seconds, the mean concurrency), and per caller (`callers`) the
requests that arrived, `served`, `refused` by kind, the tokens and the same concurrency figures.
`PUT /v1/config` with `{"accounts": {name: {...}}}` changes an account's limits.

The package: the configuration (`config`), one endpoint's state (`endpoint`), the accounts'
meters (`accounts`), requests and answers (`calls`), the behaviour (`service`), HTTP (`server`)
and the command (`cli`):

    python -m consumers.stand_in --pipelines all --time-scale 0.1 --port 8600
"""
