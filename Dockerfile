# A container with the README's setup: Python 3.11 and .venv from the pinned lock.
#   docker build --platform linux/amd64 -t tff-clustered .
#   docker run --rm tff-clustered make test       # the check: the whole suite
#   docker run --rm -v "$PWD/runs:/tff-clustered/runs" tff-clustered make run
# TFF 0.87 exists for Linux x86-64 only, hence linux/amd64 (emulated, and slow, on ARM hosts).
FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install --yes --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /tff-clustered
COPY . .
# The same setup as `make run` / `make test` on a machine: scripts/bootstrap.sh, once.
RUN make .venv/.installed
CMD ["make", "run"]
