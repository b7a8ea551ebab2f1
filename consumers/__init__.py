"""The platform's Python side, by role.

runtime        what a fleet process runs: the stage fleet, its members, stages, outbox, storage
kafka_clients  Kafka clients and administration: producer, records, topic provisioning, ACLs
ai             the AI client and what paces it: retries, circuit, adaptive limit, rate budget
config         a pipeline declared (spec, events) and configured (candidate, presets, profiles,
               the Kafka connection)
runs           drivers over a deployment: a whole run, the capacity search, run figures, redrive
stand_in       the AI stand-in served over HTTP, for tests and benchmarks (not in the runtime)
loadgen        the load generator: a spec's requests, as a burst or a steady rate (not in the runtime)

The fleet image holds runtime, kafka_clients, ai and config, which import no Airflow, PySpark,
stand-in or load generator (pyproject.toml's import contracts).
"""
