# KCoral GPU node image: the CUDA 13 toolkit (nvcc, ncu and compute-sanitizer for uploaded
# builds and `kcoral run`), Python 3.12, a CUDA 13 build of torch, bubblewrap for the worker
# sandbox and kcoral[router,gpu] (the node supervisor speaks gRPC; the gpu extra brings
# library uploads and the CUPTI clock, whose CUDA major matches this torch). GPU mode by
# default, with every GPU it is given.
#
# Build from the repository root (the tag is the name deploy/kubernetes/ uses):
#   docker build -f deploy/images/node.Dockerfile -t kcoral-node:0.1.0 .
# Another torch: --build-arg TORCH_VERSION=... --build-arg TORCH_INDEX_URL=... (keep CUDA 13).

FROM python:3.12-slim-trixie AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# The devel flavour: programs build CUDA code (nvcc, torch extensions) and `kcoral run`
# offers ncu and compute-sanitizer. Ubuntu 24.04's Python is 3.12, like the wheel stage.
FROM nvidia/cuda:13.0.2-devel-ubuntu24.04
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/kcoral \
    PATH=/opt/kcoral/bin:$PATH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# bubblewrap: --sandbox auto/bubblewrap runs each worker in it (SERVER §14); it is not setuid
# here, so it needs unprivileged user namespaces (docs/scaling.md, "The node pod's sandbox").
# Versions come from the base image's Ubuntu release: exact pins break whenever the archive
# moves on, and the CUDA tag above already fixes the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv bubblewrap \
    && rm -rf /var/lib/apt/lists/*
# A virtual environment: Ubuntu's own Python refuses system-wide pip installs (PEP 668).
RUN python3 -m venv /opt/kcoral \
    && pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /wheels
# The wheel built above from this tree (its dependencies are pyproject.toml's ranges).
# hadolint ignore=DL3013
RUN wheel="$(echo /wheels/kcoral-*.whl)" \
    && pip install --no-cache-dir "${wheel}[router,gpu]" \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/kcoral --create-home \
        --shell /usr/sbin/nologin kcoral
# Not root: bubblewrap builds its sandbox in a user namespace of its own, so the server
# needs no privilege (the pod's securityContext says what the runtime must allow).
USER 10001:10001
WORKDIR /var/lib/kcoral
# GPU mode on every GPU the container sees (auto picks GPU mode wherever CUDA finds one; the
# Kubernetes manifest pins --device gpu and the GPU list instead). As a node it also gets
# --router and --node-id and opens its streams to the router: it listens only on loopback,
# so there is nothing to expose.
ENTRYPOINT ["kcoral"]
CMD ["server", "--device", "auto", "--sandbox", "bubblewrap"]
