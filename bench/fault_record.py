"""What a fault run finds, typed: one record per phase and the run around them, each written to
faults.json in the shape docs/faults.md#what-is-measured describes and bench/fault_report.py
draws."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

InjectedRecord = tuple[str, int, int]  # (topic, partition, offset)


@dataclass(frozen=True)
class Injection:
    """When a fault was in force (epoch seconds), what it hit, and the records it put on the
    input topics itself."""

    start: float
    end: float
    detail: dict[str, Any] = field(default_factory=dict)
    records: tuple[InjectedRecord, ...] = ()

    @property
    def lasted_s(self) -> float:
        return round(self.end - self.start, 1)

    def on(self, topic: str) -> int:
        """How many of the fault's own records went to `topic`."""
        return sum(1 for name, _, _ in self.records if name == topic)

    def to_json(self) -> dict[str, Any]:
        records = {"records": [list(r) for r in self.records]} if self.records else {}
        return {"fault_start": self.start, "fault_end": self.end, "detail": {**records, **self.detail},
                "fault_s": self.lasted_s}


@dataclass(frozen=True)
class Load:
    """The steady load as its source ran: its schedule's start and end, what the source says it
    sent (None when it did not exit cleanly, and `source_error` says why) and the requests Kafka
    holds on the measured topic, the fault's own records left out (what the figures count)."""

    started: float
    ended: float
    produced: int
    source_acked: int | None = None
    source_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        error = {} if self.source_error is None else {"source_error": self.source_error}
        return {"load_started": self.started, "load_ended": self.ended, "source_acked": self.source_acked,
                **error, "produced": self.produced}


@dataclass(frozen=True)
class PoisonOutcomes:
    """How the requests a phase's pipeline fails by design ended (bench/fault_figures.py)."""

    expected: int
    dead_lettered_once: int
    missing: int
    twice: int
    wrong_reason: int
    unexpected: int
    good_not_completed: int

    def breaches(self) -> list[str]:
        """Each way they did not end as designed, with how many."""
        counted = ((self.missing, "expected dead letters missing"),
                   (self.twice, "requests dead-lettered more than once"),
                   (self.wrong_reason, "dead letters without the work's exception"),
                   (self.unexpected, "requests dead-lettered that the work does not fail"),
                   (self.good_not_completed, "requests the work does not fail left uncompleted"))
        return [f"{n} {what}" for n, what in counted if n > 0]


@dataclass(frozen=True)
class PhaseFigures:
    """Every figure of one phase (bench/fault_figures.py defines them)."""

    completed: int
    status: dict[str, int]
    dead_letters: dict[str, dict[str, int]]  # per reason, in the table and on the topic
    unexpected_dead_letters: int
    lost: int
    injected_lost: list[InjectedRecord]
    intake_unrecorded: int
    duplicate_results: int
    resent_notifications: int
    outputs_read_committed: dict[str, dict[str, int]]
    duplicate_outputs: int
    duplicate_ai_calls: int
    service: dict[str, dict[str, int]]
    service_duplicates: int
    service_hangs: int
    uncommitted: dict[str, int]
    pre_fault_rps: float
    fault_rps: float | None
    longest_stall_s: float
    recovery_s: int | None
    steady_throughput_rps: float | None
    rebalances: int
    p99_ms: float | None
    completions_per_second: list[int]
    poison: PoisonOutcomes | None = None  # only for a pipeline that fails requests by design

    def to_json(self) -> dict[str, Any]:
        figures = asdict(self)
        if self.poison is None:
            del figures["poison"]
        return figures


@dataclass
class PhaseRecord:
    """One fault's phase: the bounds its fault set, then what the harness got to before it ended
    (a part left None was not reached: `error` says why) and why the phase failed."""

    fault: str
    summary: str
    allowed_dead_letters: dict[str, int | None]  # None: any number
    max_recovery_s: float | None
    fleets_stay_up: bool
    pipeline: str
    run_id: str
    allowed_service_duplicates: int
    exactly_once: bool
    injection: Injection | None = None
    load: Load | None = None
    fleet_pids: dict[str, dict[str, int]] | None = None  # per stage, at the start and the end
    figures: PhaseFigures | None = None
    error: str | None = None
    failures: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        reached = {**(self.injection.to_json() if self.injection else {}),
                   **(self.load.to_json() if self.load else {}),
                   **({} if self.fleet_pids is None else {"fleet_pids": self.fleet_pids}),
                   **(self.figures.to_json() if self.figures else {}),
                   **({} if self.error is None else {"error": self.error})}
        return {"fault": self.fault, "summary": self.summary,
                "allowed_dead_letters": self.allowed_dead_letters, "max_recovery_s": self.max_recovery_s,
                "fleets_stay_up": self.fleets_stay_up,
                "pipeline": self.pipeline, "run_id": self.run_id,
                "allowed_service_duplicates": self.allowed_service_duplicates,
                "exactly_once": self.exactly_once, **reached, "failures": self.failures}


@dataclass(frozen=True)
class FaultRun:
    """A whole fault run: its shape and every phase."""

    run_id: str
    time_scale: float
    capacity_rps: float
    load_rps: float
    settings: dict[str, Any]
    config: dict[str, Any]
    phases: list[PhaseRecord]

    @property
    def passed(self) -> bool:
        return all(not phase.failures for phase in self.phases)

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "time_scale": self.time_scale, "capacity_rps": self.capacity_rps,
                "load_rps": self.load_rps, "settings": self.settings, "config": self.config,
                "passed": self.passed, "phases": [phase.to_json() for phase in self.phases]}
