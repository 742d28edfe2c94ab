# A training image for jobs whose pods run Unbroken's agents (a job with its own control plane:
# README, "On Kubernetes"): the package, torch's CPU wheels and the examples under
# /opt/unbroken/examples (examples/kubernetes/recover.yaml trains examples/train_mlp.py).
#
#   docker build -f deploy/train.Dockerfile -t unbroken-train:0.1.0 .
#   kind load docker-image unbroken-train:0.1.0
#
# Its containers run as root: the job's token is mounted read-only for its owner (0400).
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        'torch==2.13.0' . \
    && rm -rf /src
COPY examples /opt/unbroken/examples
WORKDIR /opt/unbroken
