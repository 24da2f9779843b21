# posenc service image: slim, non-root, no torch, no compilers.
#
#   docker build -t posenc .
#   docker build --build-arg ONNXRUNTIME=onnxruntime-gpu -t posenc:gpu .   # CUDA hosts
#   docker run --rm -p 8000:8000 -p 8001:8001 posenc    # HTTP on 8000, gRPC on 8001
#
# BASE_IMAGE must provide python3 (>= 3.11) with the venv module; both stages use it, so the
# virtual environment copied from the build stage finds the same interpreter.
ARG BASE_IMAGE=python:3.12-slim

# ---- build stage: a virtual environment with the runtime dependencies and the posenc package ----
FROM ${BASE_IMAGE} AS build
# onnxruntime (CPU) or onnxruntime-gpu (CUDA execution provider): exactly one is installed.
ARG ONNXRUNTIME=onnxruntime
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/posenc
WORKDIR /src

# Dependency layer: the flavour's lock file (every package pinned, with its hashes: scripts/lock.py writes
# it from pyproject), so a rebuild installs the same stack; a source change reuses this layer.
COPY requirements/ requirements/
COPY scripts/runtime_requirements.py scripts/
RUN lock=$(python3 scripts/runtime_requirements.py --lock "${ONNXRUNTIME}") \
 && /opt/posenc/bin/pip install --require-hashes -r "$lock"

# Source layer: the package itself, without dependencies (they are all above).
COPY . .
RUN /opt/posenc/bin/pip install --no-deps . \
 && /opt/posenc/bin/pip uninstall --yes pip setuptools \
 && mkdir -p onnx
# The bytecode pip compiled stays: +30 MB, but the service is ready in 1.3 s instead of 1.9 s.

# ---- runtime stage: the interpreter, the virtual environment and the model repository ----
FROM ${BASE_IMAGE}
ARG ONNXRUNTIME=onnxruntime
LABEL org.opencontainers.image.title="posenc" \
      org.opencontainers.image.description="Positional-encoding tables and ONNX RoPE-attention inference over HTTP" \
      posenc.onnxruntime="${ONNXRUNTIME}"
RUN groupadd --system --gid 10001 posenc \
 && useradd --uid 10001 --gid posenc --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin posenc
COPY --from=build /opt/posenc /opt/posenc
COPY --from=build /src/onnx /srv/posenc/onnx
# matplotlib's font cache, built once here (format=png): the user has no home and the root filesystem may
# be read-only (Kubernetes), so without it every process would rebuild it on its first picture.
ENV MPLCONFIGDIR=/opt/matplotlib
RUN /opt/posenc/bin/python -c "import matplotlib.font_manager" && chmod -R a+rX /opt/matplotlib

# POSENC_HOST/PORT (not --host/--port in CMD) so that `-e POSENC_PORT=...` still moves the port.
# The CPU graphs' calibration is cached under /tmp (writable with a read-only root filesystem; in Kubernetes an
# emptyDir, kept across the container's restarts in its pod): a restart does not measure again.
ENV PATH=/opt/posenc/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    POSENC_HOST=0.0.0.0 \
    POSENC_PORT=8000 \
    POSENC_MODEL_REPOSITORY=/srv/posenc/onnx \
    POSENC_CALIBRATION_CACHE=/tmp/posenc/calibration.json
USER posenc
WORKDIR /srv/posenc
# HTTP, and the KServe v2 / Triton gRPC service (POSENC_GRPC_PORT)
EXPOSE 8000 8001

# Standard library only (slim images have no curl); 503 (not ready) and refused connections fail it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python3", "-c", "import os, sys, urllib.request as r\ntry:\n    r.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('POSENC_PORT', '8000'), timeout=4)\nexcept Exception as e:\n    sys.exit('unready: %s' % e)"]

CMD ["posenc", "serve"]
