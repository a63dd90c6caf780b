# One image for every gpuprov process: the worker (default), the control-plane API
# (`gpuprov api`) and the one-shot cluster preparation (`gpuprov setup`).
#
# Dependencies come from the lock file (constraints.txt), so the image runs the versions CI
# tested. Nothing secret is baked in: database password, cloud keys and gpuprov.toml reach the
# container at run time through the environment or mounted files (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only what the distribution needs (pyproject's packages, worker.py and its README); never the
# working tree, which may hold a gpuprov.toml with credentials (.dockerignore guards it too).
COPY pyproject.toml constraints.txt README.md worker.py ./
COPY gpuprov ./gpuprov
COPY workflows ./workflows
COPY activities ./activities
COPY providers ./providers
RUN pip install --no-cache-dir -c constraints.txt .

# A fixed, unprivileged user; /app/.data is the data dir: the SQLite database (unused with
# PostgreSQL) and an SSH client key the worker generates when [ssh] configures none. Named in the
# environment: a config file's relative data_dir would be relative to the file (a secret mount).
RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home gpuprov \
    && mkdir /app/.data && chown gpuprov:gpuprov /app/.data
ENV GPUPROV_TEMPORAL__DATA_DIR=/app/.data
USER gpuprov

# 8080: the control-plane API (gpuprov api). 9464: the worker's Prometheus metrics.
EXPOSE 8080 9464

CMD ["python", "worker.py"]
