# The one image every Airflow service in docker-compose.yaml runs (and the one-shot `migrate`).
# Only the pinned Python dependencies are baked in: dags/, plugins/, consumers/, measure/, spark/,
# infra/ and host/ are bind-mounted by docker-compose.yaml, so code changes need no rebuild; a
# change to requirements.lock does (`docker compose build`).

# The Spark Kafka connector and JDBC driver, resolved by the same pom as `make jars`.
FROM maven:3.9-eclipse-temurin-17 AS spark-jars
COPY infra/maven-settings.xml infra/spark/pom.xml /build/
RUN mvn -q -B -s /build/maven-settings.xml -f /build/pom.xml dependency:copy-dependencies -Djars.dir=/jars

FROM apache/airflow:3.3.2-python3.11

USER root
# spark-submit, shipped in the pyspark wheel, needs a Java runtime; Spark 4 requires Java 17+.
# The man1 folder is missing on slim Debian images and the JRE's post-install step expects it.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*

USER airflow
# The same lock as the local virtualenv, so both paths run identical library versions
# (it pins apache-airflow itself to the base image's version).
COPY requirements.lock /tmp/requirements.lock
RUN pip install --no-cache-dir -r /tmp/requirements.lock

# Where spark/session.py and the DAGs' spark-submit look for the jars (the repository root is
# /opt/airflow in these containers).
COPY --from=spark-jars --chown=airflow:root /jars /opt/airflow/.local/jars/spark
