"""Kafka's own command-line tools, run from the project's jar cache.

    python -m infra.kafka_tools topics --bootstrap-server 127.0.0.1:9092 --list
    python -m infra.kafka_tools consumer-groups --bootstrap-server ... --describe --all-groups
    python -m infra.kafka_tools producer-perf --topic t --num-records 100000 --record-size 512 \\
        --throughput -1 --producer-props bootstrap.servers=127.0.0.1:9092
    python -m infra.kafka_tools consumer-perf --bootstrap-server ... --topic t --messages 100000

Arguments after the tool name go to the tool unchanged; `--help` after it shows the tool's own.
With the stack's environment set (`source .local/<stack>/stack.env`) the tools connect as its
default principal: `--bootstrap-server` is added unless the arguments name the servers, and on
a secured cluster `--command-config` with the connection's Java client settings, in an
owner-only file that exists only while the tool runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator

from consumers.config.kafka_connection import KafkaConnection
from infra.kafka_cluster import java_command, properties
from infra.layout import LOCAL

TOOLS = {
    "topics": "org.apache.kafka.tools.TopicCommand",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "producer-perf": "org.apache.kafka.tools.ProducerPerformance",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "consumer-perf": "org.apache.kafka.tools.ConsumerPerformance",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
}


def command(tool: str, *args: str) -> list[str]:
    """The java command line for one of the TOOLS."""
    if tool not in TOOLS:
        raise ValueError(f"unknown Kafka tool {tool!r}; known: {', '.join(TOOLS)}")
    return java_command(TOOLS[tool], *args, logs_dir=LOCAL / "logs")


def run(tool: str, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a tool to completion as the environment's Kafka connection; with `capture`, return its
    output instead of printing it."""
    with connection_args(KafkaConnection.from_environment(), args) as extra:
        return subprocess.run(command(tool, *args, *extra), capture_output=capture, text=True,
                              env={**os.environ}, check=False)


@contextlib.contextmanager
def connection_args(connection: KafkaConnection | None, args: tuple[str, ...]) -> Iterator[list[str]]:
    """The arguments that make a tool connect as `connection`, beside what `args` already say."""
    extra: list[str] = []
    if connection is not None and not any("bootstrap" in arg for arg in args):
        extra += ["--bootstrap-server", connection.bootstrap]
    secured = connection is not None and set(connection.settings) != {"bootstrap.servers"}
    if not secured or "--command-config" in args:
        yield extra
        return
    # The Java client's names for the connection: Spark's Kafka options without their prefix.
    java = {name.removeprefix("kafka."): value for name, value in connection.spark_options().items()}
    with tempfile.NamedTemporaryFile("w", prefix="kafka-client-", suffix=".properties") as file:
        file.write(properties(java))
        file.flush()
        yield [*extra, "--command-config", file.name]


def topic_values(connection: KafkaConnection, topics: list[str],
                 idle_ms: int = 10_000) -> dict[str, list[str]]:
    """Every value of each topic as Kafka's own console consumer reads it `read_committed` (what
    a downstream service sees: never the records of an aborted transaction), one consumer per
    topic, all at once; each stops after `idle_ms` without a record. Values are UTF-8 text, one
    per line (the pipelines' events are one-line JSON)."""
    with contextlib.ExitStack() as cleanup:
        processes: dict[str, subprocess.Popen[str]] = {}
        for topic in topics:
            args = ("--topic", topic, "--from-beginning", "--isolation-level", "read_committed",
                    "--timeout-ms", str(idle_ms), "--group", f"read-committed-{uuid.uuid4().hex[:8]}")
            extra = cleanup.enter_context(connection_args(connection, args))
            processes[topic] = cleanup.enter_context(subprocess.Popen(
                command("console-consumer", *args, *extra), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True))
        values = {}
        for topic, process in processes.items():
            out, err = process.communicate(timeout=idle_ms / 1000 + 120)
            if process.returncode != 0 or "Processed a total of" not in err:
                raise RuntimeError(f"console consumer of {topic} exited {process.returncode}: {err[-2000:]}")
            values[topic] = out.splitlines()
        return values


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        print("tools:", ", ".join(TOOLS))
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    sys.exit(run(sys.argv[1], *sys.argv[2:]).returncode)


if __name__ == "__main__":
    main()
