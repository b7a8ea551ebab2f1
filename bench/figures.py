"""A scenario's figures, computed from what the pipeline recorded in PostgreSQL and Kafka.

Definitions (the same as spark/pipeline_analysis where both compute a figure):
- throughput_rps: requests whose final stage finished / (last final completion - first
  request produced).
- steady_throughput_rps: the slope of completions over time between the 20th and 80th
  percentile completion: the plateau, without ramp-up and tail.
- utilization: steady throughput / AI capacity (generative concurrency / latency).
- lost: requests produced (per the source) with no terminal status (completed, rejected,
  dead-lettered).
- duplicate_ai_calls: AI calls that may have produced a result ('ok', or 'started' and never
  ended: interrupted by a crash) beyond the first per (request, stage).
- rebalances: revoke/lost/max-poll-exceeded events between the first request produced and the
  last completion: rebalances after the initial assignment, before shutdown.
- skew over the style topic's partitions (requests per partition, from Kafka offsets):
  max/mean and coefficient of variation (population standard deviation / mean).
- latency p50/p95/p99 end to end: style choice (styled_at) -> result notification
  (notified_at), in ms; per stage from the 'ok' attempts; overhead p99: end-to-end latency
  minus the request's AI time (sum of its 'ok' attempts), i.e. what the platform added.
- busiest_partition, per AI stage: the partition whose 'ok' AI calls add up to the most seconds,
  with its request count and those seconds. A consumer with one request in flight per
  partition cannot finish before that partition's AI time has passed, so set beside span_s
  (first request produced -> last completion) it shows whether that partition bounded the run.
- refetch_amplification: bytes librdkafka received for the AI stages' topics (its statistics
  count re-fetched data) / bytes of distinct records on those topics.
"""

from __future__ import annotations

import statistics
from typing import Any

import psycopg2
from confluent_kafka import Consumer, TopicPartition

from consumers.events import Topics


def _rows(database_url: str, sql: str, params: tuple | dict = ()) -> list[tuple]:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def partition_counts(bootstrap: str, topic: str) -> list[int]:
    """Records per partition of a topic, from its low and high watermarks."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "figures"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        counts = []
        for pid in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, pid), timeout=10)
            counts.append(high - low)
        return counts
    finally:
        consumer.close()


def skew(counts: list[int]) -> tuple[float, float]:
    """(max/mean, coefficient of variation) of per-partition counts."""
    mean = statistics.fmean(counts)
    if mean == 0:
        return 0.0, 0.0
    return max(counts) / mean, statistics.pstdev(counts) / mean


LATENCY_SQL = """
WITH ai AS (
  SELECT request_id, sum(extract(epoch FROM ended_at - started_at)) AS ai_s
  FROM ai_attempts WHERE run_id = %(run)s AND outcome = 'ok' GROUP BY request_id),
e2e AS (
  SELECT r.request_id, extract(epoch FROM r.notified_at - r.styled_at) AS e2e_s, ai.ai_s
  FROM requests r JOIN ai USING (request_id)
  WHERE r.run_id = %(run)s AND r.status = 'completed' AND r.notified_at IS NOT NULL)
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY e2e_s),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY e2e_s),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY e2e_s),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY e2e_s - ai_s)
FROM e2e
"""

STAGE_LATENCY_SQL = """
SELECT stage, percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s)
FROM (SELECT stage, extract(epoch FROM ended_at - started_at) AS s FROM ai_attempts
      WHERE run_id = %(run)s AND outcome = 'ok') a GROUP BY stage
"""

BUSIEST_PARTITION_SQL = """
SELECT DISTINCT ON (stage) stage, kafka_partition, count(*), sum(extract(epoch FROM ended_at - started_at))
FROM ai_attempts WHERE run_id = %(run)s AND outcome = 'ok'
GROUP BY stage, kafka_partition ORDER BY stage, 4 DESC
"""

COMPLETIONS_SQL = """
SELECT extract(epoch FROM completed_at) FROM stage_results
WHERE run_id = %(run)s AND stage = 'generate' ORDER BY completed_at
"""


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def completion_times(database_url: str, run_id: str) -> list[float]:
    return [float(r[0]) for r in _rows(database_url, COMPLETIONS_SQL, {"run": run_id})]


def steady_rate(times: list[float]) -> float:
    """Completions per second on the plateau: the least-squares slope of the completion count
    against time, over the completions between the 20th and 80th percentile.

    A slope rather than count / span: completions come in waves (slots that started together
    finish together), and a span whose ends fall inside waves is off by up to a wave.
    """
    if len(times) < 10:
        return 0.0
    lo, hi = round(0.2 * (len(times) - 1)), round(0.8 * (len(times) - 1))
    window = sorted(times)[lo:hi + 1]
    if window[-1] <= window[0]:
        return 0.0
    return statistics.linear_regression(window, range(lo, hi + 1)).slope


def refetch_amplification(database_url: str, bootstrap: str, run_id: str, topics: Topics) -> float | None:
    """Fetched bytes (last statistics of each member) / bytes of the AI topics' records."""
    rows = _rows(database_url, "SELECT DISTINCT ON (member) stats FROM client_stats WHERE run_id = %s "
                 "AND member NOT LIKE 'intake%%' ORDER BY member, at DESC", (run_id,))
    fetched = sum(r[0]["rxbytes"] for r in rows)
    unique = sum(topic_bytes(bootstrap, t) for t in (topics.style, topics.generate))
    return round(fetched / unique, 4) if unique and fetched else None


def topic_bytes(bootstrap: str, topic: str) -> int:
    """Key + value bytes of every record of a topic (read once, from the beginning)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "figures-bytes",
                         "enable.auto.commit": False})
    counts = partition_counts(bootstrap, topic)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(len(counts))])
    total, seen, want = 0, 0, sum(counts)
    try:
        while seen < want:
            batch = consumer.consume(num_messages=10_000, timeout=5)
            if not batch:
                break
            for msg in batch:
                if msg.error() is None:
                    seen += 1
                    total += len(msg.value() or b"") + len(msg.key() or b"")
    finally:
        consumer.close()
    return total


def scenario_figures(database_url: str, bootstrap: str, run_id: str, topics: Topics, produced: int,
                     load_started: float, capacity_rps: float) -> dict[str, Any]:
    """Every figure of one scenario run (see the module docstring)."""
    run = {"run": run_id}
    status = dict(_rows(database_url, "SELECT status, count(*) FROM requests WHERE run_id = %s "
                        "GROUP BY status", (run_id,)))
    terminal = sum(status.get(s, 0) for s in ("completed", "rejected", "dead_lettered"))
    times = completion_times(database_url, run_id)
    span = (times[-1] - load_started) if times else 0.0
    duplicates = _rows(database_url, "SELECT count(*) - count(DISTINCT (request_id, stage)) FROM "
                       "ai_attempts WHERE run_id = %s AND outcome IN ('ok', 'started')",
                       (run_id,))[0][0]
    rebalances = _rows(database_url, "SELECT count(*) FROM rebalance_events WHERE run_id = %s AND "
                       "event IN ('revoke', 'lost', 'max_poll_exceeded') AND at BETWEEN "
                       "to_timestamp(%s) AND to_timestamp(%s)",
                       (run_id, load_started, times[-1] if times else load_started))[0][0]
    p50, p95, p99, overhead = _rows(database_url, LATENCY_SQL, run)[0]
    stages = {stage: {"p50_ms": _ms(a), "p99_ms": _ms(b)}
              for stage, a, b in _rows(database_url, STAGE_LATENCY_SQL, run)}
    busiest = {stage: {"partition": p, "requests": n, "ai_s": round(float(ai_s), 3)}
               for stage, p, n, ai_s in _rows(database_url, BUSIEST_PARTITION_SQL, run)}
    per_partition = partition_counts(bootstrap, topics.style)
    max_over_mean, cv = skew(per_partition)
    steady = steady_rate(times)
    return {
        "run_id": run_id,
        "produced": produced,
        "completed": status.get("completed", 0),
        "status": status,
        "span_s": round(span, 1),
        "throughput_rps": round(len(times) / span, 2) if span > 0 else 0.0,
        "steady_throughput_rps": round(steady, 2),
        "utilization": round(steady / capacity_rps, 4),
        "lost": produced - terminal,
        "duplicate_ai_calls": duplicates,
        "rebalances": rebalances,
        "requests_per_partition": per_partition,
        "skew_max_over_mean": round(max_over_mean, 3),
        "skew_cv": round(cv, 3),
        "p50_ms": _ms(p50), "p95_ms": _ms(p95), "p99_ms": _ms(p99),
        "overhead_p99_ms": _ms(overhead),
        "stage_latency": stages,
        "busiest_partition": busiest,
        "refetch_amplification": refetch_amplification(database_url, bootstrap, run_id, topics),
        "completion_times": times,
    }
