"""The tuning run's report: capacity (with the limit that binds it), throughput and utilization
with their intervals, what the AI calls cost (measure.cost), the gate's checks and each trial's
figures, as text and JSON, and plots of the trials.

Files go to `results/<run id>/` (or $PIPELINE_RESULTS_DIR): gate.json, gate.txt,
completions.png (cumulative completions of the pipeline's completing stage in each trial against
its AI capacity: the slope is the throughput) and requests_per_partition.png (the spec's measured
topic, each trial).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.postgres.hooks.postgres import PostgresHook

from consumers.config import pipeline_spec
from consumers.config.events import Topics
from consumers.config.pipeline_spec import PipelineSpec
from measure import cost
from pipeline_ops.gate import COST_DIGITS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RESULTS = Path(os.environ.get("PIPELINE_RESULTS_DIR",
                              Path(__file__).resolve().parents[2] / "results"))
TRIAL_COLUMNS = (("steady_throughput_rps", "steady rps"), ("throughput_rps", "span rps"),
                 ("capacity_rps", "capacity"), ("binding_limit", "binding"), ("utilization", "utilization"),
                 ("lost", "lost"),
                 ("duplicate_ai_calls", "dup calls"), ("skew_max_over_mean", "skew"), ("p99_ms", "p99 ms"))


def _pyplot() -> Any:
    """matplotlib's pyplot, imported when a plot is drawn: parsing the DAGs imports this module,
    and matplotlib would add a second to every parse."""
    import matplotlib.pyplot as plt

    return plt


def interval(bounds: dict[str, Any] | None, digits: int = 3) -> str:
    """`mean [low, high]`: each end a one-sided 95% bound (the gate checks the low one)."""
    if not bounds:
        return "-"
    return (f"{bounds['estimate']:.{digits}f} [{bounds['low']:.{digits}f}, {bounds['high']:.{digits}f}]")


def headline(figures: dict[str, Any], spec: PipelineSpec | None = None) -> list[str]:
    """Capacity, throughput and utilization over the trials, with their intervals, the cost (with
    `spec`, a cost nothing priced says which endpoints to declare prices for, and where), and the
    goodput and share within the latency objective of a spec that declares one."""
    summary, trials = figures["summary"], figures["trials"]
    first = trials[0]
    binding = ", ".join(summary.get("binding_limits") or []) or first.get("binding_limit") or "-"
    service = first["service_s"].get(first["bottleneck_stage"]) if first["bottleneck_stage"] else None
    lines = [
        f"  capacity     {interval(summary['capacity_rps'], 1)} rps  (binding limit {binding}; "
        f"{first['ai_limit']} concurrent calls, {service if service is not None else '-'} s mean "
        f"{first['bottleneck_stage'] or '-'} call)",
        f"  throughput   {interval(summary['steady_throughput_rps'], 1)} rps steady, "
        f"{interval(summary['throughput_rps'], 1)} rps over the span",
        f"  utilization  {interval(summary['utilization'])}  (mean [95% lower, 95% upper bound], "
        f"{summary['trials']} trials)",
    ]
    spent = summary.get("cost")
    if spent is not None and spent["cost_per_1k_requests"] is None and spec is not None:
        lines.append(unpriced(spec))
    elif spent is not None:
        lines.append(f"  cost         {cost.shown(spent['cost_per_1k_requests'])} per 1,000 completed "
                     f"requests, {interval(summary.get('cost_per_request'), COST_DIGITS)} per request; "
                     f"failed calls {cost.shown(spent['failed_cost'])}, paid twice "
                     f"{cost.shown(spent['paid_twice_cost'])} (tries: {spent['paid_twice']} paid twice, "
                     f"{spent.get('abandoned', '-')} abandoned); tokens per request "
                     f"{cost.shown(spent['tokens_input_per_request'])} in, "
                     f"{cost.shown(spent['tokens_output_per_request'])} out")
    objective = summary.get("objective")
    if objective:
        within, goodput = summary.get("share_within_objective"), summary.get("goodput_rps")
        lines.append(f"  objective    {interval(within)} of requests within {objective['objective_s']:g} s "
                     f"end to end (declared: {objective['objective_share']:g}), goodput "
                     f"{interval(goodput, 1)} rps")
    reference = figures.get("reference")
    if reference:
        rps = reference["steady_throughput_rps"]
        lines.append(f"  reference    v{reference['version']}: {sum(rps) / len(rps):.1f} rps steady "
                     f"over {len(rps)} trials")
    return lines


def unpriced(spec: PipelineSpec) -> str:
    """The cost line of a run no reported cost nor declared price could price: what is missing
    and where to declare it."""
    missing = ", ".join(sorted(name for name, endpoint in spec.endpoints.items() if endpoint.price is None))
    return (f"  cost         unknown: no gateway reported the calls' cost and endpoints {missing} declare "
            f"no price; declare `price: {{input_per_1k: ..., output_per_1k: ...}}` (what 1,000 input and "
            f"output tokens cost) under each in {pipeline_spec.path_of(spec.name)} (docs/cost.md)")


def text(candidate: dict[str, Any], decision: dict[str, Any]) -> str:
    figures = decision["figures"]
    spec = pipeline_spec.load(candidate["pipeline"])
    lines = [f"gate report for version {candidate['version']} ({candidate['name']}) of "
             f"{candidate['pipeline']}, run {candidate['run_id']}", *headline(figures, spec),
             "  " + decision["summary"]]
    if decision.get("alarm"):
        lines.append(f"  REGRESSION ALARM {decision['alarm']}: the active version no longer passes the gate")
    for check in decision["reasons"]:
        mark = "ok  " if check["passed"] else "FAIL"
        lines.append(f"  [{mark}] {check['name']:<20} measured {check['measured']}  "
                     f"required {check['required']}")
    lines.append("  trials: " + "  ".join(label for _, label in TRIAL_COLUMNS))
    for trial in figures["trials"]:
        shown = (f"{trial.get(key, '-')}" for key, _ in TRIAL_COLUMNS)  # older trials name no binding limit
        lines.append(f"    {trial['run_id']}: " + "  ".join(shown))
    if all("cost" in trial for trial in figures["trials"]):
        lines.append("  cost per trial (measure/cost.py): per 1,000 completed requests, failed calls, "
                     "paid twice")
        for trial in figures["trials"]:
            spent = trial["cost"]
            lines.append(f"    {trial['run_id']}: {cost.shown(spent['cost_per_1k_requests'])}  "
                         f"{cost.shown(spent['failed_cost'])}  {cost.shown(spent['paid_twice_cost'])}")
    lines.append("  skew per trial: max/mean, diagnosis (spark/partition_load.py, measure/skew.py)")
    for trial in figures["trials"]:
        lines.append(f"    {trial['run_id']}: {skew_line(trial)}")
    return "\n".join(lines)


def skew_line(trial: dict[str, Any]) -> str:
    """A trial's skew and why: `max/mean  diagnosis: recommendation` (decisions recorded before
    the diagnosis existed have none)."""
    diagnosis = trial.get("skew_diagnosis")
    why = f"{diagnosis}: {trial.get('skew_recommendation')}" if diagnosis else "no diagnosis"
    return f"{trial['skew_max_over_mean']}  {why}"


def write(hook: PostgresHook, candidate: dict[str, Any], decision: dict[str, Any]) -> Path:
    out = RESULTS / candidate["run_id"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "gate.json").write_text(json.dumps({"candidate": candidate, "decision": decision}, indent=2,
                                              default=str))
    (out / "gate.txt").write_text(text(candidate, decision) + "\n")
    spec = pipeline_spec.load(candidate["pipeline"])
    _save(completions_figure(decision["figures"], spec, hook), out / "completions.png")
    _save(partitions_figure(decision["figures"], spec, hook), out / "requests_per_partition.png")
    return out


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


def completions_figure(figures: dict[str, Any], spec: PipelineSpec, hook: PostgresHook) -> Figure:
    """Each trial's completions of the completing stage, cumulative, against the AI capacity."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    longest = 0.0
    for trial in figures["trials"]:
        rows = hook.get_records(
            "SELECT extract(epoch FROM s.completed_at - (SELECT min(produced_at) FROM requests "
            "WHERE run_id = %(run)s)) FROM stage_results s WHERE s.run_id = %(run)s "
            "AND s.stage = %(stage)s ORDER BY 1", parameters={"run": trial["run_id"],
                                                               "stage": spec.completing_stage})
        seconds = [float(r[0]) for r in rows]
        if seconds:
            longest = max(longest, seconds[-1])
            ax.plot(seconds, range(1, len(seconds) + 1), linewidth=1.4,
                    label=f"{trial['run_id'].rsplit('-', 1)[-1]}: utilization {trial['utilization']}")
    capacity = figures["summary"]["capacity_rps"]
    if capacity and longest:
        ax.plot([0, longest], [0, capacity["estimate"] * longest], color="grey", linestyle="--",
                linewidth=1, label=f"AI capacity ({capacity['estimate']:.1f} rps)")
    utilization = figures["summary"]["utilization"]
    ax.set(xlabel="seconds since the trial's first request",
           ylabel=f"completed requests ({spec.completing_stage} results)",
           title=f"utilization {interval(utilization)} over {figures['summary']['trials']} trials")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def partitions_figure(figures: dict[str, Any], spec: PipelineSpec, hook: PostgresHook) -> Figure:
    """Each trial's records per partition of the measured topic, as Spark counted them."""
    trials = figures["trials"]
    plt = _pyplot()
    fig, axes = plt.subplots(len(trials), 1, figsize=(8, 1.6 * len(trials) + 0.8), sharex=True,
                             squeeze=False)
    for ax, trial in zip(axes[:, 0], trials, strict=True):
        rows = hook.get_records("SELECT kafka_partition, records FROM analysis_partition_load WHERE "
                                "topic = %s ORDER BY 1",
                                parameters=(Topics(trial["run_id"], spec).name(spec.load.measure),))
        ax.bar([p for p, _ in rows], [n for _, n in rows], width=0.9)
        ax.set_ylabel("requests")
        ax.set_title(f"{trial['run_id']}: max/mean {trial['skew_max_over_mean']}, "
                     f"{trial.get('skew_diagnosis') or 'no diagnosis'}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("partition")
    fig.suptitle(f"requests per partition ({spec.load.measure} topic)")
    fig.tight_layout()
    return fig


def capacity_text(result: dict[str, Any]) -> str:
    """The capacity search as text: the result against the AI capacity, then every step."""
    best, objective = result["max_sustainable_rps"], result["objective"]
    share = f" = {result['share_of_capacity']:.1%} of the AI capacity" if best else ""
    lines = [f"capacity search for version {result['version']} ({result['name']}) of {result['pipeline']}, "
             f"run {result['run_id']}",
             f"  AI capacity (calibration burst) {result['ai_capacity_rps']:.2f} rps",
             f"  max sustainable rate {best:.2f} rps{share}" if best else "  no step was sustained",
             f"  objective: p99 <= {objective['p99_s']:.3f} s, lag trend <= {objective['lag_growth']:.0%} "
             f"of the rate, {objective['step_s']:.0f} s steps",
             "  steps:     rate  sustained  lag trend/s  lag max   p99 s  steady rps  utilization"]
    for s in result["steps"]:
        p99 = "-" if s["p99_s"] is None else f"{s['p99_s']:.3f}"
        lines.append(f"    {s['rate']:10.2f}  {'yes' if s['sustained'] else 'no':>9}  "
                     f"{s['lag_trend']:11.2f}  {s['lag_max']!s:>7}  {p99:>6}  "
                     f"{s['steady_throughput_rps']!s:>10}  {s['utilization']}")
    return "\n".join(lines)


def write_capacity(result: dict[str, Any], steps: list[Any]) -> Path:
    """capacity.json, capacity.txt and capacity.png (lag over each step; p99 per step rate)."""
    out = RESULTS / result["run_id"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "capacity.json").write_text(json.dumps(
        {**result, "lag": {str(s.rate): s.lag for s in steps}}, indent=2, default=str))
    (out / "capacity.txt").write_text(capacity_text(result) + "\n")
    _save(capacity_figure(result, steps), out / "capacity.png")
    return out


def capacity_figure(result: dict[str, Any], steps: list[Any]) -> Figure:
    """Lag over each step (dotted: not sustained), and the end-to-end p99 per step rate."""
    plt = _pyplot()
    fig, (lag_ax, p99_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for n, step in enumerate(steps, start=1):
        style = "-" if step.sustained else ":"
        lag_ax.plot([t for t, _ in step.lag], [lag for _, lag in step.lag], style, linewidth=1.3,
                    label=f"{n}: {step.rate:.1f} rps {'held' if step.sustained else 'failed'}")
    lag_ax.set(xlabel="seconds into the step", ylabel="consumer lag (records, all stages)",
               title="lag per step (dotted: not sustained)")
    lag_ax.legend(fontsize=7)
    p99_ax.scatter([s.rate for s in steps], [s.p99_s or 0 for s in steps],
                   c=["tab:green" if s.sustained else "tab:red" for s in steps])
    p99_ax.axhline(result["objective"]["p99_s"], color="grey", linestyle="--", label="p99 objective")
    p99_ax.axvline(result["ai_capacity_rps"], color="tab:blue", linestyle=":", label="AI capacity")
    p99_ax.set(xlabel="step rate (requests/s)", ylabel="end-to-end p99 (s)",
               title=f"max sustainable {result['max_sustainable_rps'] or 0:.1f} rps")
    p99_ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
