# The training image, built from uv.lock exactly:
#   docker build -t kiln .
#   docker run --gpus all --shm-size 8g -v "$PWD/runs:/app/runs" -v "$PWD/data:/app/data" kiln fit -c configs/trainer/gpu.yaml
# The CUDA base image is named once, in BASE_IMAGE (torch's wheels bring their CUDA libraries; the base gives the
# runtime that meets the host's driver). Stages: build (uv, Python, the locked environment), runtime (what runs,
# as a user without root), dev (the dev container: the whole dev group, make and git), serve (`kiln serve` on
# onnxruntime without torch: docker build --target serve -t kiln-serve . ;
# docker run -p 8000:8000 -v "$PWD/runs/digits/<run>/export:/app/export:ro" kiln-serve).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ARG PYTHON_VERSION=3.12

FROM ghcr.io/astral-sh/uv:0.13.9 AS uv

FROM ${BASE_IMAGE} AS build
ARG PYTHON_VERSION
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON_INSTALL_DIR=/opt/python UV_PROJECT_ENVIRONMENT=/opt/venv UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1 \
    UV_PYTHON=${PYTHON_VERSION}
WORKDIR /app
RUN uv python install "${PYTHON_VERSION}"
# the dependencies first: a layer that changes only with uv.lock
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --locked --no-dev --all-extras --no-install-project
COPY src ./src
COPY configs ./configs
RUN uv sync --locked --no-dev --all-extras --no-editable

FROM ${BASE_IMAGE} AS runtime
RUN groupadd --system --gid 10001 kiln && useradd --system --uid 10001 --gid kiln --create-home --home-dir /home/kiln kiln
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=10001:10001 /app/configs /app/configs
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 WANDB_MODE=offline
WORKDIR /app
RUN mkdir -p /app/runs /app/data && chown 10001:10001 /app/runs /app/data
USER 10001:10001
ENTRYPOINT ["kiln"]
CMD ["fit", "--help"]

FROM build AS dev
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends make git && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 1000 dev && useradd --uid 1000 --gid dev --create-home --home-dir /home/dev --shell /bin/bash dev \
    && chown -R 1000:1000 /app
ENV UV_PROJECT_ENVIRONMENT=.venv
USER 1000:1000

FROM python:${PYTHON_VERSION}-slim AS serve
# What the serve extra needs at uv.lock's versions, the training dependencies pruned (serve imports none of them),
# then kiln without its own dependencies
COPY --from=uv /uv /usr/local/bin/uv
WORKDIR /app
COPY pyproject.toml uv.lock README.md ./
COPY src ./src
RUN uv export --locked --no-dev --extra serve --no-emit-project --no-hashes --quiet --output-file /tmp/serve.txt \
        --prune torch --prune torchvision --prune lightning --prune torchmetrics --prune wandb --prune tensorboard \
        --prune optuna --prune timm --prune matplotlib --prune pandas --prune rich \
    && uv pip install --system --no-cache -r /tmp/serve.txt && uv pip install --system --no-cache --no-deps . \
    && rm -rf /tmp/serve.txt /usr/local/bin/uv \
    && groupadd --system --gid 10001 kiln && useradd --system --uid 10001 --gid kiln kiln
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["kiln", "serve", "--host", "0.0.0.0"]
CMD ["--model", "/app/export/model.onnx"]
