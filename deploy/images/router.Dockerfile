# KCoral router image: kcoral[router] on a slim Python base, run as an unprivileged user.
# The router forwards requests and runs no uploaded code, so it needs no sandbox and no GPU.
#
# Build from the repository root (the tag is the name deploy/kubernetes/ uses):
#   docker build -f deploy/images/router.Dockerfile -t kcoral-router:0.1.0 .

# The wheel is built from the source tree in a stage of its own, so no source file, build
# directory or compiler cache reaches the final image.
FROM python:3.12-slim-trixie AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim-trixie
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=wheel /wheels /wheels
# The wheel built above from this tree (its dependencies are pyproject.toml's ranges); its
# file name carries the version, and the glob keeps this line release-independent.
# hadolint ignore=DL3013
RUN wheel="$(echo /wheels/kcoral-*.whl)" \
    && pip install --no-cache-dir "${wheel}[router]" \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/kcoral --create-home \
        --shell /usr/sbin/nologin kcoral
USER 10001:10001
WORKDIR /var/lib/kcoral
EXPOSE 9000
# Clients (HTTP/1.1) and nodes (gRPC) share the port. Off loopback the router needs client
# tokens and a node token (KCORAL_NODE_TOKEN) or it refuses to start: mount the token file
# and set the variable (deploy/kubernetes/router.yaml does both).
ENTRYPOINT ["kcoral"]
CMD ["router", "--host", "0.0.0.0", "--port", "9000", "--auth-token-file", "/etc/kcoral/clients/tokens"]
