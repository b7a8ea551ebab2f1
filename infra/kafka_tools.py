"""Kafka's own command-line tools, run from the project's jar cache.

    python -m infra.kafka_tools topics --bootstrap-server 127.0.0.1:9092 --list
    python -m infra.kafka_tools consumer-groups --bootstrap-server ... --describe --all-groups
    python -m infra.kafka_tools producer-perf --topic t --num-records 100000 --record-size 512 \\
        --throughput -1 --producer-props bootstrap.servers=127.0.0.1:9092
    python -m infra.kafka_tools consumer-perf --bootstrap-server ... --topic t --messages 100000

Arguments after the tool name go to the tool unchanged; `--help` after it shows the tool's own.
"""

from __future__ import annotations

import os
import subprocess
import sys

from infra.kafka_cluster import java_command
from infra.layout import LOCAL

TOOLS = {
    "topics": "org.apache.kafka.tools.TopicCommand",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "producer-perf": "org.apache.kafka.tools.ProducerPerformance",
    "consumer-perf": "org.apache.kafka.tools.ConsumerPerformance",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
}


def command(tool: str, *args: str) -> list[str]:
    """The java command line for one of the TOOLS."""
    if tool not in TOOLS:
        raise ValueError(f"unknown Kafka tool {tool!r}; known: {', '.join(TOOLS)}")
    return java_command(TOOLS[tool], *args, logs_dir=LOCAL / "logs")


def run(tool: str, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a tool to completion; with `capture`, return its output instead of printing it."""
    return subprocess.run(command(tool, *args), capture_output=capture, text=True,
                          env={**os.environ}, check=False)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        print("tools:", ", ".join(TOOLS))
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    sys.exit(run(sys.argv[1], *sys.argv[2:]).returncode)


if __name__ == "__main__":
    main()
